// read_model_config(): config.json -> ModelConfig, with Boost.JSON.
#include "model/model_config.hpp"

#include <boost/json.hpp>
#include <fstream>
#include <sstream>

namespace vg {
namespace json = boost::json;

namespace {

Error config_error(const std::filesystem::path& path, const std::string& what) {
  return Error{ErrorCode::kModelLoad, path.string() + ": " + what};
}

/// The integer at `key` (must be >= min), or an error naming the key.
Result<int> int_field(const std::filesystem::path& path, const json::object& obj, std::string_view key, int min,
                      std::optional<int> fallback = std::nullopt) {
  const json::value* v = obj.if_contains(key);
  if (v == nullptr || v->is_null()) {
    if (fallback) return *fallback;
    return config_error(path, "missing integer '" + std::string(key) + "'");
  }
  std::int64_t n = 0;
  if (v->is_int64()) {
    n = v->get_int64();
  } else if (v->is_uint64() && v->get_uint64() <= 1u << 30) {
    n = static_cast<std::int64_t>(v->get_uint64());
  } else {
    return config_error(path, "'" + std::string(key) + "' must be an integer");
  }
  if (n < min || n > (1 << 30)) {
    return config_error(path, "'" + std::string(key) + "' = " + std::to_string(n) + " is out of range [" +
                                  std::to_string(min) + ", 2^30]");
  }
  return static_cast<int>(n);
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
  if (c.family != "gpt2") {
    return config_error(path, "model_type '" + c.family + "' is not supported (supported: " + kSupportedFamilies + ")");
  }

  struct IntKey {
    int* out;
    const char* key;
    int min;
  };
  for (const IntKey& k : {IntKey{&c.n_layer, "n_layer", 1}, IntKey{&c.n_head, "n_head", 1},
                          IntKey{&c.n_embd, "n_embd", 1}, IntKey{&c.vocab_size, "vocab_size", 1}}) {
    Result<int> v = int_field(path, *obj, k.key, k.min);
    if (!v.ok()) return std::move(v).error();
    *k.out = *v;
  }
  Result<int> positions = obj->contains("n_positions") ? int_field(path, *obj, "n_positions", 1)
                                                        : int_field(path, *obj, "n_ctx", 1);
  if (!positions.ok()) return std::move(positions).error();
  c.n_positions = *positions;
  Result<int> eos = int_field(path, *obj, "eos_token_id", 0, -1);
  if (!eos.ok()) return std::move(eos).error();
  c.eos_token_id = *eos;
  if (c.eos_token_id >= c.vocab_size) {
    return config_error(path, "eos_token_id " + std::to_string(c.eos_token_id) + " is not below vocab_size " +
                                  std::to_string(c.vocab_size));
  }
  c.n_kv_head = c.n_head;  // GPT-2 has no grouped-query attention
  if (c.n_embd % c.n_head != 0) {
    return config_error(path, "n_embd " + std::to_string(c.n_embd) + " is not a multiple of n_head " +
                                  std::to_string(c.n_head));
  }
  if (const json::value* eps = obj->if_contains("layer_norm_epsilon"); eps != nullptr && !eps->is_null()) {
    if (!eps->is_number()) return config_error(path, "'layer_norm_epsilon' must be a number");
    c.layer_norm_epsilon = eps->to_number<double>();
    if (!(c.layer_norm_epsilon > 0 && c.layer_norm_epsilon < 1)) {
      return config_error(path, "'layer_norm_epsilon' must be in (0, 1)");
    }
  }
  if (const json::value* act = obj->if_contains("activation_function"); act != nullptr && !act->is_null()) {
    // The forward pass implements GPT-2's tanh-approximated GELU only.
    if (!act->is_string() || (act->get_string() != "gelu_new" && act->get_string() != "gelu_pytorch_tanh")) {
      return config_error(path, "'activation_function' " + json::serialize(*act) +
                                    " is not supported (supported: gelu_new)");
    }
  }
  c.dtype = "float32";  // weights stored as F16/BF16/F64 are converted on load
  return c;
}

}  // namespace vg
