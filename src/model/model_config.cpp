// read_model_config(): config.json -> ModelConfig, with Boost.JSON, one
// reader per family (see model_config.hpp for the keys each reads).
#include "model/model_config.hpp"

#include <boost/json.hpp>
#include <fstream>
#include <sstream>

#include "common/decimal.hpp"

namespace vg {
namespace json = boost::json;

namespace {

Error config_error(const std::filesystem::path& path, const std::string& what) {
  return Error{ErrorCode::kModelLoad, path.string() + ": " + what};
}

/// Reads typed keys of one config.json object; the first problem is kept in
/// `error` and later reads return their fallback.
class Keys {
 public:
  Keys(const std::filesystem::path& path, const json::object& obj) : path_(path), obj_(obj) {}

  /// The integer at `key`, in [min, 2^30]; `fallback` when absent or null.
  int integer(std::string_view key, int min, std::optional<int> fallback = std::nullopt) {
    const json::value* v = obj_.if_contains(key);
    if (v == nullptr || v->is_null()) {
      if (!fallback) fail("missing integer '" + std::string(key) + "'");
      return fallback.value_or(0);
    }
    std::int64_t n = 0;
    if (v->is_int64()) {
      n = v->get_int64();
    } else if (v->is_uint64() && v->get_uint64() <= 1u << 30) {
      n = static_cast<std::int64_t>(v->get_uint64());
    } else {
      fail("'" + std::string(key) + "' must be an integer");
      return 0;
    }
    if (n < min || n > (1 << 30)) {
      fail("'" + std::string(key) + "' = " + std::to_string(n) + " is out of range [" + std::to_string(min) +
           ", 2^30]");
      return 0;
    }
    return static_cast<int>(n);
  }

  /// The number at `key`, in (low, high); `fallback` when absent or null.
  double number(std::string_view key, double fallback, double low, double high) {
    const json::value* v = obj_.if_contains(key);
    if (v == nullptr || v->is_null()) return fallback;
    if (!v->is_number()) {
      fail("'" + std::string(key) + "' must be a number");
      return fallback;
    }
    const double x = v->to_number<double>();
    if (!(x > low && x < high)) {
      fail("'" + std::string(key) + "' = " + format_decimal(x) + " is out of range (" + format_decimal(low) + ", " +
           format_decimal(high) + ")");
      return fallback;
    }
    return x;
  }

  bool boolean(std::string_view key, bool fallback) {
    const json::value* v = obj_.if_contains(key);
    if (v == nullptr || v->is_null()) return fallback;
    if (!v->is_bool()) {
      fail("'" + std::string(key) + "' must be true or false");
      return fallback;
    }
    return v->get_bool();
  }

  /// Fails unless `key` is absent, null, false or one of `allowed` strings.
  void only(std::string_view key, std::initializer_list<std::string_view> allowed, const std::string& supported) {
    const json::value* v = obj_.if_contains(key);
    if (v == nullptr || v->is_null() || (v->is_bool() && !v->get_bool())) return;
    if (v->is_string()) {
      for (std::string_view a : allowed) {
        if (v->get_string() == a) return;
      }
    }
    fail("'" + std::string(key) + "' " + json::serialize(*v) + " is not supported (supported: " + supported + ")");
  }

  /// eos_token_id: an integer, a non-empty list of integers (the first is
  /// used) or null / absent (-1).
  int eos() {
    const json::value* v = obj_.if_contains("eos_token_id");
    if (v != nullptr && v->is_array()) {
      const json::array& a = v->get_array();
      if (a.empty() || !a[0].is_int64() || a[0].get_int64() < 0) {
        fail("'eos_token_id' must be an integer or a list of integers");
        return -1;
      }
      return static_cast<int>(std::min<std::int64_t>(a[0].get_int64(), 1 << 30));
    }
    return integer("eos_token_id", 0, -1);
  }

  void fail(const std::string& what) {
    if (!error) error = config_error(path_, what);
  }

  std::optional<Error> error;

 private:
  const std::filesystem::path& path_;
  const json::object& obj_;
};

void read_gpt2(Keys& k, ModelConfig& c) {
  c.n_layer = k.integer("n_layer", 1);
  c.n_head = k.integer("n_head", 1);
  c.n_embd = k.integer("n_embd", 1);
  c.vocab_size = k.integer("vocab_size", 1);
  c.n_positions = k.integer("n_positions", 1, k.integer("n_ctx", 1, 0));
  if (c.n_positions == 0) k.fail("missing integer 'n_positions' (or 'n_ctx')");
  c.n_kv_head = c.n_head;  // GPT-2 has no grouped-query attention
  if (c.n_head > 0) c.head_dim = c.n_embd / c.n_head;
  if (c.n_head > 0 && c.n_embd % c.n_head != 0) {
    k.fail("n_embd " + std::to_string(c.n_embd) + " is not a multiple of n_head " + std::to_string(c.n_head));
  }
  c.intermediate_size = k.integer("n_inner", 1, 4 * c.n_embd);
  c.layer_norm_epsilon = k.number("layer_norm_epsilon", 1e-5, 0, 1);
  // The forward pass implements GPT-2's tanh-approximated GELU only.
  k.only("activation_function", {"gelu_new", "gelu_pytorch_tanh"}, "gelu_new");
  c.tie_word_embeddings = true;
}

void read_llama(Keys& k, ModelConfig& c) {
  c.n_layer = k.integer("num_hidden_layers", 1);
  c.n_head = k.integer("num_attention_heads", 1);
  c.n_kv_head = k.integer("num_key_value_heads", 1, c.n_head);
  c.n_embd = k.integer("hidden_size", 1);
  c.head_dim = k.integer("head_dim", 1, c.n_head > 0 ? c.n_embd / c.n_head : 0);
  c.intermediate_size = k.integer("intermediate_size", 1);
  c.n_positions = k.integer("max_position_embeddings", 1);
  c.vocab_size = k.integer("vocab_size", 1);
  c.layer_norm_epsilon = k.number("rms_norm_eps", 1e-6, 0, 1);
  c.rope_theta = k.number("rope_theta", 10000.0, 1, 1e12);
  c.tie_word_embeddings = k.boolean("tie_word_embeddings", false);
  if (c.n_head > 0 && c.head_dim == 0) {
    k.fail("hidden_size " + std::to_string(c.n_embd) + " is smaller than num_attention_heads " +
           std::to_string(c.n_head));
  }
  if (c.head_dim % 2 != 0) k.fail("head_dim " + std::to_string(c.head_dim) + " is odd (rotary embeddings need pairs)");
  if (c.n_kv_head > 0 && c.n_head % c.n_kv_head != 0) {
    k.fail("num_attention_heads " + std::to_string(c.n_head) + " is not a multiple of num_key_value_heads " +
           std::to_string(c.n_kv_head));
  }
  k.only("hidden_act", {"silu"}, "silu");
  k.only("rope_scaling", {}, "none");
  k.only("attention_bias", {}, "false");
  k.only("mlp_bias", {}, "false");
}

}  // namespace

Result<ModelConfig> read_model_config(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) return config_error(path, "cannot open file");
  std::stringstream text;
  text << in.rdbuf();
  json::error_code ec;
  const json::value root = json::parse(text.str(), ec);
  if (ec) return config_error(path, "not valid JSON: " + ec.message());
  const json::object* obj = root.if_object();
  if (obj == nullptr) return config_error(path, "not a JSON object");

  ModelConfig c;
  const json::value* type = obj->if_contains("model_type");
  if (type == nullptr || !type->is_string()) return config_error(path, "missing string 'model_type'");
  c.family = std::string(type->get_string());
  Keys keys(path, *obj);
  if (c.family == "gpt2") {
    read_gpt2(keys, c);
  } else if (c.family == "llama") {
    read_llama(keys, c);
  } else {
    return config_error(path, "model_type '" + c.family + "' is not supported (supported: " + kSupportedFamilies + ")");
  }
  c.eos_token_id = keys.eos();
  if (keys.error) return *keys.error;
  if (c.eos_token_id >= c.vocab_size) {
    return config_error(path, "eos_token_id " + std::to_string(c.eos_token_id) + " is not below vocab_size " +
                                  std::to_string(c.vocab_size));
  }
  c.dtype = "float32";  // Model::load sets the compute dtype from its options
  return c;
}

}  // namespace vg
