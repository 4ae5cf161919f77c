// GPT-2 family: weight loading from Hugging Face-named safetensors and the
// native libtorch forward pass (pre-LayerNorm blocks, causal self-attention
// over a preallocated KV cache, gelu_new MLP, tied LM head). A step runs all
// its sequences' new tokens as one ragged batch (see Plan). With
// gpt2_attention.cpp, the only torch code of src/model. A Gpt2Model and its
// caches belong to one engine thread; each entry point binds the model's
// device and runs in InferenceMode, and no torch exception leaves this file.
#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <new>
#include <optional>
#include <unordered_set>

#include "device/device.hpp"
#include "model/gpt2.hpp"
#include "model/gpt2_attention.hpp"
#include "model/safetensors.hpp"
#include "model/tokenizer.hpp"

namespace vg {
namespace {

constexpr int kByteVocab = 257;

/// Converts the exception being handled into an Error: libtorch OOM (and
/// std::bad_alloc) -> kOutOfMemory, anything else -> kInternal.
Error current_exception_error(const std::string& op) {
  try {
    throw;
  } catch (const c10::OutOfMemoryError& e) {
    return Error{ErrorCode::kOutOfMemory, op + ": " + e.what_without_backtrace()};
  } catch (const c10::Error& e) {
    return Error{ErrorCode::kInternal, op + ": " + e.what_without_backtrace()};
  } catch (const std::bad_alloc&) {
    return Error{ErrorCode::kOutOfMemory, op + ": host allocation failed"};
  } catch (const std::exception& e) {
    return Error{ErrorCode::kInternal, op + ": " + e.what()};
  } catch (...) {
    return Error{ErrorCode::kInternal, op + ": unknown exception"};
  }
}

std::optional<at::ScalarType> float_dtype(const std::string& safetensors_dtype) {
  if (safetensors_dtype == "F32") return at::kFloat;
  if (safetensors_dtype == "F16") return at::kHalf;
  if (safetensors_dtype == "BF16") return at::kBFloat16;
  if (safetensors_dtype == "F64") return at::kDouble;
  return std::nullopt;
}

std::optional<at::ScalarType> compute_dtype(const std::string& name) {
  if (name == "float32") return at::kFloat;
  if (name == "float64") return at::kDouble;
  return std::nullopt;
}

std::string shape_string(at::IntArrayRef shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

struct Layer {
  at::Tensor ln_1_w, ln_1_b;
  at::Tensor attn_w, attn_b;       // c_attn, Conv1D [n_embd, n_embd + 2 * kv_dim]
  at::Tensor attn_proj_w, attn_proj_b;
  at::Tensor ln_2_w, ln_2_b;
  at::Tensor fc_w, fc_b;           // [n_embd, 4 * n_embd]
  at::Tensor mlp_proj_w, mlp_proj_b;
};

class Gpt2Model;

/// K and V of every layer in one allocation [n_layer, 2, n_kv_head,
/// capacity, head_dim]; k(l) and v(l) are views [n_kv_head, capacity, head_dim].
class Gpt2Cache final : public KvCache {
 public:
  Gpt2Cache(const Gpt2Model* owner, at::Tensor storage) : owner_(owner), storage_(std::move(storage)) {
    for (std::int64_t l = 0; l < storage_.size(0); ++l) {
      k_.push_back(storage_.select(0, l).select(0, 0));
      v_.push_back(storage_.select(0, l).select(0, 1));
    }
  }
  int length() const override { return length_; }
  int capacity() const override { return static_cast<int>(storage_.size(3)); }
  std::int64_t bytes() const override { return storage_.numel() * storage_.element_size(); }

  const Gpt2Model* owner() const { return owner_; }
  const at::Tensor& k(int layer) const { return k_[static_cast<std::size_t>(layer)]; }
  const at::Tensor& v(int layer) const { return v_[static_cast<std::size_t>(layer)]; }
  void advance(int tokens) { length_ += tokens; }

 private:
  const Gpt2Model* owner_;
  at::Tensor storage_;
  std::vector<at::Tensor> k_, v_;
  int length_ = 0;
};

/// One input's new tokens within the concatenated rows of a step.
struct Segment {
  Gpt2Cache* cache = nullptr;  // nullptr: attends to its own tokens only (forward_full)
  std::int64_t pos0 = 0;       // position of its first new token (tokens already cached)
  std::int64_t t = 0;          // new tokens
  std::int64_t row0 = 0;       // its first row in the concatenated [rows, ...] tensors
  at::Tensor mask;             // [t, pos0 + t], true where a key lies after the query; undefined when t == 1
};

/// The ragged layout of one forward pass: every input's new tokens are rows
/// of one [rows, n_embd] tensor, so LayerNorms, QKV, projections and MLP run
/// once per layer for all of them. Decode segments (one token, with a cache)
/// come first: in host memory they attend in one decode_attention call; the
/// others attend one by one.
struct Plan {
  std::vector<Segment> segments;  // in row order
  std::int64_t rows = 0;
  std::int64_t n_decode = 0;      // leading decode segments
  at::Tensor ids, positions;      // [rows] int64
  at::Tensor last_rows;           // [inputs] int64: each input's last row, in input order
};

class Gpt2Model final : public Model {
 public:
  Gpt2Model(ModelConfig config, Device* device, at::ScalarType dtype)
      : config_(std::move(config)), device_(device), dtype_(dtype) {}

  Status load_weights(const std::filesystem::path& file_path);

  const ModelConfig& config() const override { return config_; }
  std::int64_t parameter_count() const override { return parameter_count_; }
  const Tokenizer& tokenizer() const override { return tokenizer_; }
  Result<std::unique_ptr<KvCache>> new_cache(int capacity_tokens) override;
  Result<std::vector<std::vector<float>>> step(std::span<const StepInput> inputs) override;
  Result<std::vector<float>> forward_full(std::span<const std::int32_t> tokens) override;

 private:
  Result<at::Tensor> load_tensor(const SafetensorsFile& file, const std::string& prefix, const std::string& name,
                                 std::vector<std::int64_t> shape);
  Status validate(std::span<const StepInput> inputs, std::vector<Gpt2Cache*>& caches) const;
  /// Lays out `inputs` (caches[i] == nullptr: no cache) as a Plan.
  Plan plan(std::span<const StepInput> inputs, std::span<Gpt2Cache* const> caches) const;
  /// Hidden states [rows, n_embd] after the last block, appending every
  /// segment's K and V to its cache.
  at::Tensor hidden(const Plan& plan) const;
  at::Tensor block(const at::Tensor& x, int layer, const Plan& plan) const;
  /// Appends the decode segments' K and V ([rows, ...] columns of `qkv`) to
  /// their caches and attends them in one call: -> [n_decode, n_embd].
  template <typename T>
  at::Tensor attend_decode(const at::Tensor& qkv, int layer, const Plan& plan) const;
  /// Attention of one segment: q [t, n_head, head_dim], k and v
  /// [n_kv_head, keys, head_dim] -> [t, n_embd].
  at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask) const;
  /// Final LayerNorm and tied LM head: [T, n_embd] -> [T, vocab] float32 on the host.
  at::Tensor head(const at::Tensor& x) const;

  ModelConfig config_;
  Device* device_;
  ByteTokenizer tokenizer_;
  at::ScalarType dtype_;  // compute and KV cache dtype
  std::int64_t parameter_count_ = 0;
  at::Tensor wte_, wpe_, ln_f_w_, ln_f_b_;
  std::vector<Layer> layers_;
};

Result<at::Tensor> Gpt2Model::load_tensor(const SafetensorsFile& file, const std::string& prefix,
                                          const std::string& name, std::vector<std::int64_t> shape) {
  Result<const SafetensorsEntry*> found = file.find(prefix + name);
  if (!found.ok()) return std::move(found).error();
  const SafetensorsEntry& entry = **found;
  auto where = [&] { return file.path().string() + ": tensor '" + entry.name + "': "; };
  if (entry.shape != shape) {
    return Error{ErrorCode::kModelLoad,
                 where() + "shape " + shape_string(entry.shape) + ", expected " + shape_string(shape)};
  }
  const std::optional<at::ScalarType> stored = float_dtype(entry.dtype);
  if (!stored) {
    return Error{ErrorCode::kModelLoad, where() + "dtype " + entry.dtype + ", expected F32, F16, BF16 or F64"};
  }
  // Read into host memory (for a virtual device that already is device
  // memory), then convert to the compute dtype and device; a no-op when both
  // already match.
  const at::Tensor host = at::empty(shape, at::TensorOptions().dtype(*stored));
  Status read = file.read(entry, std::span(static_cast<std::byte*>(host.data_ptr()), entry.bytes()));
  if (!read.ok()) return read.error();
  at::Tensor t = host.to(at::TensorOptions().dtype(dtype_).device(device_->torch_device()));
  parameter_count_ += t.numel();
  return t;
}

Status Gpt2Model::load_weights(const std::filesystem::path& path) {
  Result<SafetensorsFile> file = SafetensorsFile::open(path);
  if (!file.ok()) return std::move(file).error();
  const std::string prefix = file->find("wte.weight").ok()                 ? ""
                             : file->find("transformer.wte.weight").ok() ? "transformer."
                                                                         : "";
  const std::int64_t d = config_.n_embd;
  const std::int64_t kv_dim = static_cast<std::int64_t>(config_.n_kv_head) * (d / config_.n_head);
  Status status;
  auto get = [&](const std::string& name, std::vector<std::int64_t> shape) {
    if (!status.ok()) return at::Tensor();
    Result<at::Tensor> t = load_tensor(*file, prefix, name, std::move(shape));
    if (!t.ok()) {
      status = std::move(t).error();
      return at::Tensor();
    }
    return std::move(t).value();
  };
  DeviceScope scope(device_);
  c10::InferenceMode inference;
  try {
    wte_ = get("wte.weight", {config_.vocab_size, d});
    wpe_ = get("wpe.weight", {config_.n_positions, d});
    for (int i = 0; i < config_.n_layer; ++i) {
      const std::string h = "h." + std::to_string(i) + ".";
      Layer l;
      l.ln_1_w = get(h + "ln_1.weight", {d});
      l.ln_1_b = get(h + "ln_1.bias", {d});
      l.attn_w = get(h + "attn.c_attn.weight", {d, d + 2 * kv_dim});
      l.attn_b = get(h + "attn.c_attn.bias", {d + 2 * kv_dim});
      l.attn_proj_w = get(h + "attn.c_proj.weight", {d, d});
      l.attn_proj_b = get(h + "attn.c_proj.bias", {d});
      l.ln_2_w = get(h + "ln_2.weight", {d});
      l.ln_2_b = get(h + "ln_2.bias", {d});
      l.fc_w = get(h + "mlp.c_fc.weight", {d, 4 * d});
      l.fc_b = get(h + "mlp.c_fc.bias", {4 * d});
      l.mlp_proj_w = get(h + "mlp.c_proj.weight", {4 * d, d});
      l.mlp_proj_b = get(h + "mlp.c_proj.bias", {d});
      layers_.push_back(std::move(l));
    }
    ln_f_w_ = get("ln_f.weight", {d});
    ln_f_b_ = get("ln_f.bias", {d});
  } catch (...) {
    Error e = current_exception_error(path.string() + ": loading weights onto " + device_->name());
    e.code = ErrorCode::kModelLoad;
    return e;
  }
  return status;
}

Result<std::unique_ptr<KvCache>> Gpt2Model::new_cache(int capacity_tokens) {
  if (capacity_tokens < 1 || capacity_tokens > config_.n_positions) {
    return Error{ErrorCode::kInvalidRequest, "KV cache capacity " + std::to_string(capacity_tokens) +
                                                 " tokens is outside [1, " + std::to_string(config_.n_positions) + "]"};
  }
  DeviceScope scope(device_);
  c10::InferenceMode inference;
  try {
    const std::int64_t head_dim = config_.n_embd / config_.n_head;
    at::Tensor storage = at::empty({config_.n_layer, 2, config_.n_kv_head, capacity_tokens, head_dim},
                                   at::TensorOptions().dtype(dtype_).device(device_->torch_device()));
    return std::unique_ptr<KvCache>(std::make_unique<Gpt2Cache>(this, std::move(storage)));
  } catch (...) {
    return current_exception_error("KV cache of " + std::to_string(capacity_tokens) + " tokens on " + device_->name());
  }
}

Status Gpt2Model::validate(std::span<const StepInput> inputs, std::vector<Gpt2Cache*>& caches) const {
  std::unordered_set<const KvCache*> seen;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const StepInput& in = inputs[i];
    const std::string which = "step input " + std::to_string(i) + ": ";
    auto* cache = dynamic_cast<Gpt2Cache*>(in.cache);
    if (cache == nullptr || cache->owner() != this) {
      return Error{ErrorCode::kInvalidRequest, which + "no KV cache of this model"};
    }
    if (!seen.insert(cache).second) return Error{ErrorCode::kInvalidRequest, which + "KV cache used twice in one step"};
    if (in.tokens.empty()) return Error{ErrorCode::kInvalidRequest, which + "no tokens"};
    if (static_cast<std::int64_t>(cache->length()) + static_cast<std::int64_t>(in.tokens.size()) > cache->capacity()) {
      return Error{ErrorCode::kInvalidRequest, which + std::to_string(in.tokens.size()) +
                                                   " tokens overflow the KV cache (" +
                                                   std::to_string(cache->length()) + " of " +
                                                   std::to_string(cache->capacity()) + " tokens used)"};
    }
    for (std::int32_t id : in.tokens) {
      if (id < 0 || id >= config_.vocab_size) {
        return Error{ErrorCode::kInvalidRequest, which + "token id " + std::to_string(id) + " outside [0, " +
                                                     std::to_string(config_.vocab_size) + ")"};
      }
    }
    caches.push_back(cache);
  }
  return Status::Ok();
}

Result<std::vector<std::vector<float>>> Gpt2Model::step(std::span<const StepInput> inputs) {
  std::vector<Gpt2Cache*> caches;
  if (Status s = validate(inputs, caches); !s.ok()) return s.error();
  if (inputs.empty()) return std::vector<std::vector<float>>();
  DeviceScope scope(device_);
  c10::InferenceMode inference;
  try {
    const Plan p = plan(inputs, caches);
    const at::Tensor last = head(hidden(p).index_select(0, p.last_rows)).contiguous();  // [inputs, vocab]
    std::vector<std::vector<float>> logits;
    logits.reserve(inputs.size());
    const float* row = last.data_ptr<float>();
    for (std::size_t i = 0; i < inputs.size(); ++i, row += config_.vocab_size) {
      logits.emplace_back(row, row + config_.vocab_size);
    }
    // Lengths move only once the whole step has succeeded: a failed step
    // leaves all caches as they were (positions past length() are scratch).
    for (std::size_t i = 0; i < inputs.size(); ++i) caches[i]->advance(static_cast<int>(inputs[i].tokens.size()));
    return logits;
  } catch (...) {
    return current_exception_error("step of " + std::to_string(inputs.size()) + " inputs on " + device_->name());
  }
}

Result<std::vector<float>> Gpt2Model::forward_full(std::span<const std::int32_t> tokens) {
  if (tokens.empty() || tokens.size() > static_cast<std::size_t>(config_.n_positions)) {
    return Error{ErrorCode::kInvalidRequest, "forward_full takes 1.." + std::to_string(config_.n_positions) +
                                                 " tokens, got " + std::to_string(tokens.size())};
  }
  for (std::int32_t id : tokens) {
    if (id < 0 || id >= config_.vocab_size) {
      return Error{ErrorCode::kInvalidRequest, "token id " + std::to_string(id) + " outside [0, " +
                                                   std::to_string(config_.vocab_size) + ")"};
    }
  }
  DeviceScope scope(device_);
  c10::InferenceMode inference;
  try {
    const StepInput input{nullptr, tokens};
    Gpt2Cache* const no_cache = nullptr;
    const at::Tensor logits = head(hidden(plan(std::span(&input, 1), std::span(&no_cache, 1)))).contiguous();
    const float* p = logits.data_ptr<float>();
    return std::vector<float>(p, p + logits.numel());
  } catch (...) {
    return current_exception_error("forward of " + std::to_string(tokens.size()) + " tokens on " + device_->name());
  }
}

Plan Gpt2Model::plan(std::span<const StepInput> inputs, std::span<Gpt2Cache* const> caches) const {
  Plan p;
  const at::TensorOptions host_long = at::TensorOptions().dtype(at::kLong);
  const at::TensorOptions device_long = host_long.device(wte_.device());
  std::vector<std::size_t> order;  // input indices in row order: decode first
  for (int decode_pass = 1; decode_pass >= 0; --decode_pass) {
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      const bool decode = caches[i] != nullptr && inputs[i].tokens.size() == 1;
      if (decode == static_cast<bool>(decode_pass)) order.push_back(i);
    }
  }
  std::vector<std::int64_t> ids, positions, last_rows(inputs.size());
  for (std::size_t i : order) {
    Segment s;
    s.cache = caches[i];
    s.pos0 = s.cache != nullptr ? s.cache->length() : 0;
    s.t = static_cast<std::int64_t>(inputs[i].tokens.size());
    s.row0 = p.rows;
    p.rows += s.t;
    last_rows[i] = p.rows - 1;
    for (std::int64_t j = 0; j < s.t; ++j) {
      ids.push_back(inputs[i].tokens[static_cast<std::size_t>(j)]);
      positions.push_back(s.pos0 + j);
    }
    if (s.t > 1) {
      // mask[j][k]: the query at position pos0 + j must not see key k > pos0 + j.
      const at::Tensor rows = at::arange(s.pos0, s.pos0 + s.t, device_long).unsqueeze(1);
      const at::Tensor cols = at::arange(s.pos0 + s.t, device_long).unsqueeze(0);
      s.mask = cols > rows;
    } else if (s.cache != nullptr) {
      ++p.n_decode;
    }
    p.segments.push_back(std::move(s));
  }
  // One host tensor [ids | positions | last rows], one copy to the device.
  const auto n = static_cast<std::int64_t>(inputs.size());
  const at::Tensor host = at::empty({2 * p.rows + n}, host_long);
  std::int64_t* out = host.data_ptr<std::int64_t>();
  out = std::copy(ids.begin(), ids.end(), out);
  out = std::copy(positions.begin(), positions.end(), out);
  std::copy(last_rows.begin(), last_rows.end(), out);
  const at::Tensor on_device = host.to(wte_.device());
  p.ids = on_device.narrow(0, 0, p.rows);
  p.positions = on_device.narrow(0, p.rows, p.rows);
  p.last_rows = on_device.narrow(0, 2 * p.rows, n);
  return p;
}

at::Tensor Gpt2Model::hidden(const Plan& plan) const {
  at::Tensor x = wte_.index_select(0, plan.ids).add_(wpe_.index_select(0, plan.positions));
  for (int l = 0; l < config_.n_layer; ++l) x = block(x, l, plan);
  return x;
}

at::Tensor Gpt2Model::block(const at::Tensor& x, int layer, const Plan& plan) const {
  const Layer& w = layers_[static_cast<std::size_t>(layer)];
  const std::int64_t rows = x.size(0);
  const std::int64_t d = config_.n_embd;
  const std::int64_t head_dim = d / config_.n_head;
  const std::int64_t kv_dim = config_.n_kv_head * head_dim;
  const double eps = config_.layer_norm_epsilon;

  at::Tensor h = at::layer_norm(x, {d}, w.ln_1_w, w.ln_1_b, eps);
  const at::Tensor qkv = at::addmm(w.attn_b, h, w.attn_w);  // [rows, d + 2 * kv_dim]
  const std::vector<at::Tensor> parts = qkv.split_with_sizes({d, kv_dim, kv_dim}, 1);
  const at::Tensor q = parts[0].view({rows, config_.n_head, head_dim});
  const at::Tensor k = parts[1].view({rows, config_.n_kv_head, head_dim});
  const at::Tensor v = parts[2].view({rows, config_.n_kv_head, head_dim});
  // Rotary position embeddings (other families) would rotate q and k here.
  // Decode segments in host memory attend in one call (float32 or float64);
  // elsewhere every segment attends with tensor ops.
  const bool host_decode = plan.n_decode > 0 && qkv.is_cpu() && (dtype_ == at::kFloat || dtype_ == at::kDouble);
  const auto first = static_cast<std::size_t>(host_decode ? plan.n_decode : 0);
  std::vector<at::Tensor> y;  // attention output pieces in row order
  y.reserve(plan.segments.size() - first + 1);
  if (host_decode) {
    y.push_back(dtype_ == at::kFloat ? attend_decode<float>(qkv, layer, plan) : attend_decode<double>(qkv, layer, plan));
  }
  for (std::size_t i = first; i < plan.segments.size(); ++i) {
    const Segment& s = plan.segments[i];
    const at::Tensor qs = q.narrow(0, s.row0, s.t);
    const at::Tensor ks = k.narrow(0, s.row0, s.t).transpose(0, 1);  // [n_kv_head, t, head_dim]
    const at::Tensor vs = v.narrow(0, s.row0, s.t).transpose(0, 1);
    if (s.cache == nullptr) {
      y.push_back(attend(qs, ks, vs, s.mask));
      continue;
    }
    s.cache->k(layer).narrow(1, s.pos0, s.t).copy_(ks);
    s.cache->v(layer).narrow(1, s.pos0, s.t).copy_(vs);
    y.push_back(attend(qs, s.cache->k(layer).narrow(1, 0, s.pos0 + s.t), s.cache->v(layer).narrow(1, 0, s.pos0 + s.t),
                       s.mask));
  }
  const at::Tensor attn = y.size() == 1 ? y[0] : at::cat(y, 0);  // [rows, d]
  at::Tensor out = at::addmm(w.attn_proj_b, attn, w.attn_proj_w).add_(x);
  h = at::layer_norm(out, {d}, w.ln_2_w, w.ln_2_b, eps);
  h = at::gelu(at::addmm(w.fc_b, h, w.fc_w), "tanh");
  out.add_(at::addmm(w.mlp_proj_b, h, w.mlp_proj_w));
  return out;
}

template <typename T>
at::Tensor Gpt2Model::attend_decode(const at::Tensor& qkv, int layer, const Plan& plan) const {
  const std::int64_t d = config_.n_embd;
  const DecodeAttentionShape shape{config_.n_head, config_.n_kv_head, d / config_.n_head};
  const std::int64_t kv_dim = shape.n_kv_head * shape.head_dim;
  const at::Tensor rows = qkv.contiguous();  // [rows, d + 2 * kv_dim]
  const at::Tensor out = at::empty({plan.n_decode, d}, qkv.options());
  const T* row = rows.data_ptr<T>();
  T* out_row = out.data_ptr<T>();
  std::vector<DecodeSequence<T>> sequences;
  sequences.reserve(static_cast<std::size_t>(plan.n_decode));
  for (std::int64_t i = 0; i < plan.n_decode; ++i, row += d + 2 * kv_dim, out_row += d) {
    const Segment& s = plan.segments[static_cast<std::size_t>(i)];
    sequences.push_back({row, row + d, row + d + kv_dim, s.cache->k(layer).data_ptr<T>(),
                         s.cache->v(layer).data_ptr<T>(), s.cache->capacity(), s.pos0, out_row});
  }
  decode_attention<T>(sequences, shape);
  return out;
}

at::Tensor Gpt2Model::attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const at::Tensor& mask) const {
  const std::int64_t t = q.size(0);
  const std::int64_t kv_heads = k.size(0);
  const std::int64_t group = config_.n_head / kv_heads;
  const std::int64_t head_dim = q.size(2);
  // Query head h reads KV head h / group: q [kv_heads, group, t, head_dim]
  // against k and v [kv_heads, 1, keys, head_dim].
  const at::Tensor qg = q.reshape({t, kv_heads, group, head_dim}).permute({1, 2, 0, 3});
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
  at::Tensor scores = at::matmul(qg, k.unsqueeze(1).transpose(2, 3)).mul_(scale);  // [kv_heads, group, t, keys]
  if (mask.defined()) scores.masked_fill_(mask, -std::numeric_limits<double>::infinity());
  const at::Tensor y = at::matmul(at::softmax(scores, -1), v.unsqueeze(1));  // [kv_heads, group, t, head_dim]
  return y.permute({2, 0, 1, 3}).reshape({t, config_.n_embd});
}

at::Tensor Gpt2Model::head(const at::Tensor& x) const {
  const at::Tensor h = at::layer_norm(x, {config_.n_embd}, ln_f_w_, ln_f_b_, config_.layer_norm_epsilon);
  return at::matmul(h, wte_.t()).to(at::kCPU, at::kFloat);
}

}  // namespace

Result<std::unique_ptr<Model>> load_gpt2(const ModelConfig& config, const std::filesystem::path& dir, Device* device) {
  if (config.vocab_size != kByteVocab) {
    return Error{ErrorCode::kModelLoad, (dir / "config.json").string() + ": vocab_size " +
                                            std::to_string(config.vocab_size) +
                                            ": no tokenizer is supported yet for it (only the byte tokenizer, "
                                            "vocab_size 257)"};
  }
  const std::optional<at::ScalarType> dtype = compute_dtype(config.dtype);
  if (!dtype) {
    return Error{ErrorCode::kModelLoad, dir.string() + ": compute dtype '" + config.dtype +
                                            "' is not supported (supported: float32, float64)"};
  }
  auto model = std::make_unique<Gpt2Model>(config, device, *dtype);
  if (Status s = model->load_weights(dir / "model.safetensors"); !s.ok()) return s.error();
  return std::unique_ptr<Model>(std::move(model));
}

}  // namespace vg
