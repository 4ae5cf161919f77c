// DecoderModel (see decoder.hpp): step()/forward_full(), the dense layers'
// products and norms, and weight loading; its KV caches are in
// decoder_cache.cpp, a step's layout and attention in decoder_attention.cpp.
// Called from the model's engine thread (loading: the start-up thread).
#include "model/decoder.hpp"

#include <ATen/Parallel.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <new>
#include <span>
#include <type_traits>
#include <unordered_set>
#include <vector>

#include "device/device.hpp"
#include "device/torch_compat.hpp"
#include "model/host_gemm.hpp"
#include "model/runtime.hpp"

namespace vg::detail {
namespace {

std::optional<at::ScalarType> stored_dtype(const std::string& safetensors_dtype) {
  if (safetensors_dtype == "F32") return at::kFloat;
  if (safetensors_dtype == "F16") return at::kHalf;
  if (safetensors_dtype == "BF16") return at::kBFloat16;
  if (safetensors_dtype == "F64") return at::kDouble;
  return std::nullopt;
}

std::string shape_string(at::IntArrayRef shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace

Error current_exception_error(const std::string& op) { return compat::current_exception_error(op); }

Result<at::ScalarType> compute_dtype(const std::string& name, bool on_cpu, const std::string& where) {
  if (name == "float32") return at::kFloat;
  if (name == "bfloat16") return at::kBFloat16;
  if (name == "float64") return at::kDouble;
  if (name == "float16" && !on_cpu) return at::kHalf;
  if (name == "float16") {
    return Error{ErrorCode::kModelLoad,
                 where + ": compute dtype 'float16' is for CUDA devices (libtorch has no CPU kernels for it); on a "
                         "virtual device use float32, or bfloat16 for 2-byte weights and KV cache"};
  }
  return Error{ErrorCode::kModelLoad,
               where + ": compute dtype '" + name + "' is not supported (supported: float32, bfloat16, float64; float16 on CUDA)"};
}

at::Tensor WeightLoader::get(const std::string& name, std::vector<std::int64_t> shape, bool transposed) {
  if (!status_.ok()) return {};
  Result<Checkpoint::Tensor> found = checkpoint_.find(prefix_ + name);
  if (!found.ok()) {
    status_ = std::move(found).error();
    return {};
  }
  const SafetensorsEntry& entry = *found->entry;
  const std::string where = found->file->path().string() + ": tensor '" + entry.name + "': ";
  if (entry.shape != shape) {
    status_ = Error{ErrorCode::kModelLoad, where + "shape " + shape_string(entry.shape) + ", expected " +
                                               shape_string(shape)};
    return {};
  }
  const std::optional<at::ScalarType> stored = stored_dtype(entry.dtype);
  if (!stored) {
    status_ = Error{ErrorCode::kModelLoad, where + "dtype " + entry.dtype + ", expected F32, F16, BF16 or F64"};
    return {};
  }
  if (transposed && shape.size() == 2) {
    // Read into a scratch buffer outside libtorch (never charged to a
    // device), then transpose it straight into the device tensor.
    std::vector<std::byte> scratch(static_cast<std::size_t>(entry.bytes()));
    Status read = found->file->read(entry, std::span(scratch.data(), scratch.size()));
    if (!read.ok()) {
      status_ = read;
      return {};
    }
    // Transposed in the stored dtype into a second scratch buffer, then
    // converted contiguous to contiguous: neither copy makes a temporary.
    const at::TensorOptions stored_options = at::TensorOptions().dtype(*stored);
    std::vector<std::byte> flipped(scratch.size());
    at::from_blob(flipped.data(), {shape[1], shape[0]}, stored_options)
        .copy_(at::from_blob(scratch.data(), shape, stored_options).t());
    at::Tensor t = at::empty({shape[1], shape[0]}, at::TensorOptions().dtype(dtype_).device(device_));
    t.copy_(at::from_blob(flipped.data(), {shape[1], shape[0]}, stored_options));
    parameters_ += t.numel();
    return t;
  }
  // Read into host memory (for a virtual device that already is device
  // memory), then convert to the compute dtype and device; a no-op when both
  // already match.
  const at::Tensor host = at::empty(shape, at::TensorOptions().dtype(*stored));
  Status read = found->file->read(entry, std::span(static_cast<std::byte*>(host.data_ptr()), entry.bytes()));
  if (!read.ok()) {
    status_ = read;
    return {};
  }
  at::Tensor t = host.to(at::TensorOptions().dtype(dtype_).device(device_));
  parameters_ += t.numel();
  return t;
}

DecoderModel::DecoderModel(ModelConfig config, Device* device, at::ScalarType dtype,
                           std::unique_ptr<Tokenizer> tokenizer)
    : config_(std::move(config)), device_(device), dtype_(dtype), tokenizer_(std::move(tokenizer)) {}

at::Device DecoderModel::torch_device() const { return at::Device(device_->torch_device()); }

Status DecoderModel::read_weights(const Checkpoint& checkpoint, std::string prefix,
                                  const std::function<void(WeightLoader&)>& read) {
  WeightLoader w(checkpoint, std::move(prefix), dtype_, torch_device());
  DeviceScope scope(device_);
  c10::InferenceMode inference;
  try {
    read(w);
  } catch (...) {
    Error e = current_exception_error(checkpoint.path().string() + ": loading weights onto " + device_->name());
    // Weights that do not fit stay out of memory (the device is too small:
    // a setting); any other failure is the checkpoint's.
    if (e.code != ErrorCode::kOutOfMemory) e.code = ErrorCode::kModelLoad;
    return e;
  }
  parameter_count_ = w.parameters();
  return w.status();
}

Status DecoderModel::validate(std::span<const StepInput> inputs, std::vector<DecoderCache*>& caches) const {
  std::unordered_set<const KvCache*> seen;
  const bool pool_lost = pool_ && pool_->lost();
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const StepInput& in = inputs[i];
    const std::string which = "step input " + std::to_string(i) + ": ";
    auto* cache = dynamic_cast<DecoderCache*>(in.cache);
    if (cache == nullptr || cache->owner() != this) {
      return Error{ErrorCode::kInvalidRequest, which + "no KV cache of this model"};
    }
    if (pool_lost && cache->pool_ptr() == pool_) {
      return Error{ErrorCode::kOutOfMemory, which + "the KV block pool of " + device_->name() +
                                                " lost its storage in a failed resize; its caches start again"};
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

Result<std::vector<std::vector<float>>> DecoderModel::step(std::span<const StepInput> inputs) {
  std::vector<DecoderCache*> caches;
  if (Status s = validate(inputs, caches); !s.ok()) return s.error();
  if (inputs.empty()) return std::vector<std::vector<float>>();
  DeviceScope scope(device_);
  c10::InferenceMode inference;
  try {
    const Plan p = plan(inputs, caches);
    const bool all = std::any_of(inputs.begin(), inputs.end(), [](const StepInput& in) { return in.all_logits; });
    at::Tensor rows = p.last_rows;
    if (all) {
      // Every row of the inputs that asked for all of them, the last row of the others.
      std::vector<std::int64_t> pick;
      for (std::size_t i = 0; i < inputs.size(); ++i) {
        const auto t = static_cast<std::int64_t>(inputs[i].tokens.size());
        for (std::int64_t j = inputs[i].all_logits ? 0 : t - 1; j < t; ++j) pick.push_back(p.first_rows[i] + j);
      }
      rows = at::tensor(pick, at::TensorOptions().dtype(at::kLong)).to(torch_device());
    }
    const at::Tensor x = hidden(p);
    if (p.n_decode > 0 && !p.host_decode && p.decode.pool == nullptr) write_decode_kv(p);
    const at::Tensor last = head(x.index_select(0, rows)).to(at::kCPU).contiguous();  // [picked rows, vocab]
    std::vector<std::vector<float>> logits;
    logits.reserve(inputs.size());
    const float* row = last.data_ptr<float>();
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      const std::int64_t n = inputs[i].all_logits ? static_cast<std::int64_t>(inputs[i].tokens.size()) : 1;
      logits.emplace_back(row, row + n * config_.vocab_size);
      row += n * config_.vocab_size;
    }
    // Lengths move only once the whole step has succeeded: a failed step
    // leaves all caches as they were (positions past length() are scratch).
    for (std::size_t i = 0; i < inputs.size(); ++i) caches[i]->advance(inputs[i].tokens);
    return logits;
  } catch (...) {
    return current_exception_error("step of " + std::to_string(inputs.size()) + " inputs on " + device_->name());
  }
}

Result<std::vector<float>> DecoderModel::forward_full(std::span<const std::int32_t> tokens) {
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
    DecoderCache* const no_cache = nullptr;
    const at::Tensor logits =
        head(hidden(plan(std::span(&input, 1), std::span(&no_cache, 1)))).to(at::kCPU).contiguous();
    const float* p = logits.data_ptr<float>();
    return std::vector<float>(p, p + logits.numel());
  } catch (...) {
    return current_exception_error("forward of " + std::to_string(tokens.size()) + " tokens on " + device_->name());
  }
}

bool DecoderModel::uses_host_decode() const {
  return config_.host_decode_kernel && torch_device().is_cpu() &&
         (dtype_ == at::kFloat || dtype_ == at::kDouble || dtype_ == at::kBFloat16);
}

bool DecoderModel::uses_host_gemm() const {
  return config_.host_decode_kernel && torch_device().is_cpu() && (dtype_ == at::kFloat || dtype_ == at::kBFloat16) &&
         host_cpu_has_avx2_fma();
}

at::Tensor DecoderModel::conv1d(const at::Tensor& a, const at::Tensor& w, const at::Tensor& bias) const {
  if (uses_host_gemm()) return host_linear(a, w, bias);  // w was read transposed: [n, k], contiguous
  return at::addmm(bias, a, w);
}

at::Tensor DecoderModel::linear(const at::Tensor& a, const at::Tensor& w, const at::Tensor& bias) const {
  if (uses_host_gemm() && w.is_contiguous()) return host_linear(a, w, bias);
  return bias.defined() ? at::linear(a, w, bias) : at::linear(a, w);
}

namespace {

/// While alive, libtorch's CPU ops called on this thread run on it alone
/// (this thread's OpenMP team size set to 1) when `small`, where vg_model is
/// built with OpenMP; otherwise it does nothing. For ops that split finer
/// than waking a compute thread is worth: libtorch's CPU layer norm gives
/// each thread one row at the least, so without this a decode step of a few
/// short rows woke the other compute threads at every layer norm.
class SerialOpenMPOps {
 public:
  explicit SerialOpenMPOps(bool small) {
#ifdef _OPENMP
    // get_num_threads() first: it sets this thread's team size on its first
    // call, which would undo a size set before it.
    if (small && (saved_ = at::get_num_threads()) > 1) omp_set_num_threads(1);
#else
    (void)small;
#endif
  }
  ~SerialOpenMPOps() {
#ifdef _OPENMP
    if (saved_ > 1) omp_set_num_threads(saved_);
#endif
  }
  SerialOpenMPOps(const SerialOpenMPOps&) = delete;
  SerialOpenMPOps& operator=(const SerialOpenMPOps&) = delete;

#ifdef _OPENMP
 private:
  int saved_ = 0;  ///< the team size to restore; 0: none was changed
#endif
};

}  // namespace

at::Tensor DecoderModel::layer_norm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) const {
  const SerialOpenMPOps serial(x.device().is_cpu() && x.numel() < kSerialLayerNormElements);
  return at::layer_norm(x, {x.size(-1)}, weight, bias, config_.layer_norm_epsilon);
}


at::Tensor DecoderModel::host_linear(const at::Tensor& a_in, const at::Tensor& w_in, const at::Tensor& bias) const {
  // bfloat16: the activations and bias widened to float (exact), the weights
  // read in place; the float sums rounded to bfloat16 once, at the end.
  const bool bf16 = w_in.scalar_type() == at::kBFloat16;
  const at::Tensor a = bf16 ? a_in.to(at::kFloat).contiguous() : a_in.contiguous();
  const at::Tensor& w = w_in;  // contiguous (the callers check)
  const at::Tensor b = !bias.defined() ? bias : bf16 ? bias.to(at::kFloat).contiguous() : bias.contiguous();
  const std::int64_t rows = a.size(0);
  const std::int64_t k = a.size(1);
  const std::int64_t n = w.size(0);
  at::Tensor out = at::empty({rows, n}, a.options());
  if (rows == 0 || n == 0) return bf16 ? out.to(at::kBFloat16) : out;
  HostGemm g{a.data_ptr<float>(), rows, k, k, nullptr, n, b.defined() ? b.data_ptr<float>() : nullptr,
             out.data_ptr<float>(), n};
  if (bf16) {
    g.w_bf16 = host_elements<std::uint16_t>(w);
  } else {
    g.w = w.data_ptr<float>();
  }
  // Column panels of kHostGemmColumnAlign. A panel costs its multiply-adds
  // plus its weight reads (a weight element read from memory costs about as
  // much as 4 multiply-adds, which is what bounds a step of a few rows); a
  // thread gets at least kHostParallelGrain of that, since waking a sleeping
  // compute thread costs tens of microseconds.
  const std::int64_t panels = (n + kHostGemmColumnAlign - 1) / kHostGemmColumnAlign;
  const std::int64_t per_panel = std::max<std::int64_t>(1, (rows + 4) * k * kHostGemmColumnAlign);
  const std::int64_t grain = (kHostParallelGrain + per_panel - 1) / per_panel;
  host_parallel_for(panels, grain, [&](std::int64_t begin, std::int64_t end) {
    gemm_nk(g, begin * kHostGemmColumnAlign, std::min(n, end * kHostGemmColumnAlign));
  });
  return bf16 ? out.to(at::kBFloat16) : out;
}

}  // namespace vg::detail
