// DecoderModel (see decoder.hpp): caches, step layout, step()/forward_full(),
// causal attention over the KV cache, and weight loading. Called from the
// model's engine thread (loading: the start-up thread).
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
#include "model/gpt2_attention.hpp"
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

/// A view of `base`'s storage with `sizes`, `strides` and `offset` (in
/// elements), made directly rather than through the dispatcher: a view
/// launches nothing, and per-sequence views of the caches are the only
/// per-sequence host work of a batched decode layer. The caller keeps the
/// view inside the storage.
at::Tensor direct_view(const at::Tensor& base, at::IntArrayRef sizes, at::IntArrayRef strides, std::int64_t offset) {
  auto impl = c10::make_intrusive<c10::TensorImpl>(c10::TensorImpl::VIEW, c10::Storage(base.storage()),
                                                   base.key_set(), base.dtype());
  impl->set_sizes_and_strides(sizes, strides);
  impl->set_storage_offset(offset);
  return at::Tensor(std::move(impl));
}

/// `count` slots of a pool view [slots, n_kv_head, head_dim] from `first`.
at::Tensor slot_range(const at::Tensor& pool, std::int64_t first, std::int64_t count) {
  return direct_view(pool, {count, pool.size(1), pool.size(2)}, pool.strides(),
                     pool.storage_offset() + first * pool.stride(0));
}

/// The cached keys or values a segment reads from a pool view [slots,
/// n_kv_head, head_dim]: a view of consecutive slots, or gathered from its slots.
at::Tensor read_positions(const at::Tensor& pool, const Segment& s, std::int64_t count) {
  return s.first_slot >= 0 ? slot_range(pool, s.first_slot, count) : pool.index_select(0, s.slots);
}

/// libtorch's CPU batched matrix product runs a small-matrix kernel (float
/// accumulation) when contraction x rows x columns is below this, BLAS-style
/// kernels otherwise (aten/src/ATen/native/LinearAlgebra.cpp,
/// bmm_out_or_baddbmm_); a decode's two products are head_dim x 1 x keys.
constexpr std::int64_t kSmallMatrixProduct = 400;

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

KvPool::KvPool(at::Tensor storage, std::int64_t block_tokens, bool shared)
    : storage_(std::move(storage)),
      block_tokens_(block_tokens),
      block_bytes_(storage_.numel() * storage_.element_size() / (storage_.size(2) / block_tokens)),
      shared_(shared),
      blocks_(storage_.size(2) / block_tokens) {
  for (std::int64_t l = 0; l < storage_.size(0); ++l) {
    k_.push_back(storage_.select(0, l).select(0, 0));
    v_.push_back(storage_.select(0, l).select(0, 1));
  }
}

bool KvPool::take(std::int64_t count, std::vector<std::int32_t>& out) {
  const std::lock_guard lock(mutex_);
  return blocks_.take(count, out);
}

void KvPool::share(std::int32_t block) {
  const std::lock_guard lock(mutex_);
  blocks_.share(block);
}

void KvPool::release(std::span<const std::int32_t> blocks) {
  const std::lock_guard lock(mutex_);
  blocks_.release(blocks);
}

KvBlockCounts KvPool::counts() const {
  const std::lock_guard lock(mutex_);
  return blocks_.counts();
}

DecoderCache::DecoderCache(const DecoderModel* owner, std::shared_ptr<KvPool> pool, std::vector<std::int32_t> blocks)
    : owner_(owner), pool_(std::move(pool)), blocks_(std::move(blocks)) {}

DecoderCache::~DecoderCache() { pool_->release(blocks_); }

std::int64_t DecoderCache::contiguous_first_slot(std::int64_t positions) const {
  if (blocks_.empty()) return -1;
  const std::int64_t n = blocks_for_tokens(positions, pool_->block_tokens());
  for (std::int64_t i = 1; i < n; ++i) {
    if (blocks_[static_cast<std::size_t>(i)] != blocks_[0] + i) return -1;
  }
  return blocks_[0] * pool_->block_tokens();
}

DecoderModel::DecoderModel(ModelConfig config, Device* device, at::ScalarType dtype,
                           std::unique_ptr<Tokenizer> tokenizer)
    : config_(std::move(config)), device_(device), dtype_(dtype), tokenizer_(std::move(tokenizer)) {}

at::Device DecoderModel::torch_device() const { return at::Device(device_->torch_device()); }

at::Tensor DecoderModel::kv_storage(std::int64_t slots) const {
  return at::empty({config_.n_layer, 2, slots, config_.n_kv_head, config_.head_dim},
                   at::TensorOptions().dtype(dtype_).device(torch_device()));
}

DecoderCache* DecoderModel::own_cache(KvCache& cache) const {
  auto* c = dynamic_cast<DecoderCache*>(&cache);
  return c != nullptr && c->owner() == this ? c : nullptr;
}

Result<std::unique_ptr<KvCache>> DecoderModel::new_cache(int capacity_tokens) {
  if (capacity_tokens < 1 || capacity_tokens > config_.n_positions) {
    return Error{ErrorCode::kInvalidRequest, "KV cache capacity " + std::to_string(capacity_tokens) +
                                                 " tokens is outside [1, " + std::to_string(config_.n_positions) + "]"};
  }
  std::vector<std::int32_t> blocks;
  if (pool_) {
    const std::int64_t need = blocks_for_tokens(capacity_tokens, pool_->block_tokens());
    if (!pool_->take(need, blocks)) {
      const KvBlockCounts c = pool_->counts();
      return Error{ErrorCode::kOutOfMemory, "KV block pool of " + device_->name() + ": a cache of " +
                                                std::to_string(capacity_tokens) + " tokens needs " +
                                                std::to_string(need) + " blocks, " + std::to_string(c.free) +
                                                " of " + std::to_string(c.total) + " are free"};
    }
    return std::unique_ptr<KvCache>(std::make_unique<DecoderCache>(this, pool_, std::move(blocks)));
  }
  DeviceScope scope(device_);
  c10::InferenceMode inference;
  try {
    auto own = std::make_shared<KvPool>(kv_storage(capacity_tokens), capacity_tokens, false);
    own->take(1, blocks);
    return std::unique_ptr<KvCache>(std::make_unique<DecoderCache>(this, std::move(own), std::move(blocks)));
  } catch (...) {
    return current_exception_error("KV cache of " + std::to_string(capacity_tokens) + " tokens on " + device_->name());
  }
}

Status DecoderModel::use_kv_pool(const KvPoolOptions& options) {
  if (options.block_tokens < 1 || options.block_tokens > config_.n_positions) {
    return Error{ErrorCode::kInvalidRequest, "KV block of " + std::to_string(options.block_tokens) +
                                                 " tokens is outside [1, " + std::to_string(config_.n_positions) + "]"};
  }
  if (options.blocks < 1 || options.blocks > std::numeric_limits<std::int32_t>::max() / options.block_tokens) {
    return Error{ErrorCode::kInvalidRequest, "a KV block pool of " + std::to_string(options.blocks) +
                                                 " blocks is outside [1, " +
                                                 std::to_string(std::numeric_limits<std::int32_t>::max() /
                                                                options.block_tokens) +
                                                 "]"};
  }
  DeviceScope scope(device_);
  c10::InferenceMode inference;
  try {
    pool_ = std::make_shared<KvPool>(kv_storage(options.blocks * options.block_tokens), options.block_tokens, true);
    return Status::Ok();
  } catch (...) {
    return current_exception_error("KV block pool of " + std::to_string(options.blocks) + " blocks of " +
                                   std::to_string(options.block_tokens) + " tokens on " + device_->name());
  }
}

std::optional<KvBlockCounts> DecoderModel::kv_pool_counts() const {
  if (!pool_) return std::nullopt;
  return pool_->counts();
}

std::int64_t DecoderModel::kv_block_bytes() const { return pool_ ? pool_->block_bytes() : 0; }

Status DecoderModel::grow_cache(KvCache& cache, int capacity_tokens) {
  DecoderCache* c = own_cache(cache);
  if (c == nullptr) return Error{ErrorCode::kInvalidRequest, "grow_cache: not a KV cache of this model"};
  if (capacity_tokens > config_.n_positions) {
    return Error{ErrorCode::kInvalidRequest, "grow_cache: " + std::to_string(capacity_tokens) + " tokens exceed the " +
                                                 std::to_string(config_.n_positions) + " positions of the model"};
  }
  if (capacity_tokens <= c->capacity()) return Status::Ok();
  if (!c->pool().shared()) {
    return Error{ErrorCode::kInvalidRequest, "grow_cache: a KV cache outside a block pool keeps its capacity"};
  }
  const std::int64_t need =
      blocks_for_tokens(capacity_tokens, c->pool().block_tokens()) - static_cast<std::int64_t>(c->blocks().size());
  if (!c->pool().take(need, c->blocks())) {
    const KvBlockCounts counts = c->pool().counts();
    return Error{ErrorCode::kOutOfMemory, "KV block pool of " + device_->name() + ": growing a cache to " +
                                              std::to_string(capacity_tokens) + " tokens needs " +
                                              std::to_string(need) + " more blocks, " + std::to_string(counts.free) +
                                              " of " + std::to_string(counts.total) + " are free"};
  }
  return Status::Ok();
}

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
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const StepInput& in = inputs[i];
    const std::string which = "step input " + std::to_string(i) + ": ";
    auto* cache = dynamic_cast<DecoderCache*>(in.cache);
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
    const at::Tensor last = head(x.index_select(0, rows)).contiguous();  // [picked rows, vocab]
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
    for (std::size_t i = 0; i < inputs.size(); ++i) caches[i]->advance(static_cast<int>(inputs[i].tokens.size()));
    return logits;
  } catch (...) {
    return current_exception_error("step of " + std::to_string(inputs.size()) + " inputs on " + device_->name());
  }
}

Status DecoderModel::copy_cache(const KvCache& from, KvCache& to) {
  const DecoderCache* src = own_cache(const_cast<KvCache&>(from));
  DecoderCache* dst = own_cache(to);
  if (src == nullptr || dst == nullptr) {
    return Error{ErrorCode::kInvalidRequest, "copy_cache: not KV caches of this model"};
  }
  if (dst->length() != 0) {
    return Error{ErrorCode::kInvalidRequest, "copy_cache: the destination holds " + std::to_string(dst->length()) +
                                                 " tokens already"};
  }
  if (src->length() > dst->capacity()) {
    return Error{ErrorCode::kInvalidRequest, "copy_cache: " + std::to_string(src->length()) +
                                                 " cached tokens do not fit a cache of " +
                                                 std::to_string(dst->capacity())};
  }
  DeviceScope scope(device_);
  c10::InferenceMode inference;
  try {
    std::int64_t first = 0;  // the first position copied
    if (src->pool_ptr() == dst->pool_ptr() && src->pool().shared()) {
      // Full blocks are shared: dst's first ones go back to the pool.
      KvPool& pool = src->pool();
      const std::int64_t full = src->length() / pool.block_tokens();
      for (std::size_t i = 0; i < static_cast<std::size_t>(full); ++i) {
        pool.share(src->blocks()[i]);
        pool.release(std::span(&dst->blocks()[i], 1));
        dst->blocks()[i] = src->blocks()[i];
      }
      first = full * pool.block_tokens();
    }
    copy_positions(*src, *dst, first);
    dst->set_length(src->length());
    return Status::Ok();
  } catch (...) {
    return current_exception_error("copy of a KV cache on " + device_->name());
  }
}

void DecoderModel::copy_positions(const DecoderCache& from, DecoderCache& to, std::int64_t first) const {
  const std::int64_t n = from.length() - first;
  if (n <= 0) return;
  const std::int64_t from_slot = from.contiguous_first_slot(from.length());
  const std::int64_t to_slot = to.contiguous_first_slot(from.length());
  if (from_slot >= 0 && to_slot >= 0) {
    to.pool().storage().narrow(2, to_slot + first, n).copy_(from.pool().storage().narrow(2, from_slot + first, n));
    return;
  }
  std::vector<std::int64_t> from_slots, to_slots;
  for (std::int64_t p = first; p < from.length(); ++p) {
    from_slots.push_back(from.slot(p));
    to_slots.push_back(to.slot(p));
  }
  const at::TensorOptions device_long = at::TensorOptions().dtype(at::kLong).device(torch_device());
  const at::Tensor rows = from.pool().storage().index_select(2, at::tensor(from_slots, device_long));
  to.pool().storage().index_copy_(2, at::tensor(to_slots, device_long), rows);
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
    const at::Tensor logits = head(hidden(plan(std::span(&input, 1), std::span(&no_cache, 1)))).contiguous();
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

namespace {

/// A host tensor's elements as C (std::uint16_t: the bits of a bfloat16 tensor).
template <typename C>
C* elements(const at::Tensor& t) {
  if constexpr (std::is_same_v<C, std::uint16_t>) {
    return reinterpret_cast<std::uint16_t*>(t.data_ptr<at::BFloat16>());
  } else {
    return t.data_ptr<C>();
  }
}

}  // namespace

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
    g.w_bf16 = elements<std::uint16_t>(w);
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

Plan DecoderModel::plan(std::span<const StepInput> inputs, std::span<DecoderCache* const> caches) const {
  Plan p;
  p.host_decode = uses_host_decode();
  // Input indices in row order: decode first. On the tensor path in host
  // memory, decodes whose products are small enough for libtorch's
  // small-matrix kernel come before the others and attend as their own
  // DecodeGroup, so that each gets the arithmetic it gets alone.
  const bool small_group = !p.host_decode && torch_device().is_cpu();
  const auto pass_of = [&](std::size_t i) {
    if (caches[i] == nullptr || inputs[i].tokens.size() != 1) return 2;
    const std::int64_t keys = caches[i]->length() + 1;
    return small_group && keys * config_.head_dim < kSmallMatrixProduct ? 0 : 1;
  };
  std::vector<std::size_t> order;
  std::int64_t n_small = 0;
  for (int pass = 0; pass <= 2; ++pass) {
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      if (pass_of(i) != pass) continue;
      order.push_back(i);
      if (pass == 0) ++n_small;
    }
  }
  // One host buffer [ids | positions | last rows | groups' gather and pad |
  // decode write slots | segments' slots], copied to the device at once.
  std::vector<std::int64_t> ids, positions, last_rows(inputs.size());
  p.first_rows.resize(inputs.size());
  for (std::size_t i : order) {
    Segment s;
    s.cache = caches[i];
    s.pos0 = s.cache != nullptr ? s.cache->length() : 0;
    s.t = static_cast<std::int64_t>(inputs[i].tokens.size());
    s.row0 = p.rows;
    p.rows += s.t;
    last_rows[i] = p.rows - 1;
    p.first_rows[i] = s.row0;
    for (std::int64_t j = 0; j < s.t; ++j) {
      ids.push_back(inputs[i].tokens[static_cast<std::size_t>(j)]);
      positions.push_back(s.pos0 + j);
    }
    if (s.t > 1) {
      // mask[j][k]: the query at position pos0 + j must not see key k > pos0 + j.
      const at::TensorOptions device_long = at::TensorOptions().dtype(at::kLong).device(torch_device());
      const at::Tensor rows = at::arange(s.pos0, s.pos0 + s.t, device_long).unsqueeze(1);
      const at::Tensor cols = at::arange(s.pos0 + s.t, device_long).unsqueeze(0);
      s.mask = cols > rows;
    } else if (s.cache != nullptr) {
      ++p.n_decode;
    }
    p.segments.push_back(std::move(s));
  }
  std::vector<std::int64_t> host = std::move(ids);
  host.insert(host.end(), positions.begin(), positions.end());
  host.insert(host.end(), last_rows.begin(), last_rows.end());
  if (p.n_decode > 0 && !p.host_decode) plan_decode_groups(p, n_small, host);
  const std::vector<std::int64_t> slot_lengths = plan_segment_slots(p, host);
  const at::Tensor on_device = at::tensor(host, at::TensorOptions().dtype(at::kLong)).to(torch_device());
  const auto n = static_cast<std::int64_t>(inputs.size());
  p.ids = on_device.narrow(0, 0, p.rows);
  p.positions = on_device.narrow(0, p.rows, p.rows);
  p.last_rows = on_device.narrow(0, 2 * p.rows, n);
  std::int64_t offset = 2 * p.rows + n;
  for (DecodeGroup& g : p.decode.groups) {
    const std::int64_t size = g.rows * g.keys;
    g.gather = on_device.narrow(0, offset, size);
    g.pad = on_device.narrow(0, offset + size, size).view({1, g.rows, 1, 1, g.keys}).ne(0);
    offset += 2 * size;
  }
  if (p.decode.pool != nullptr) {
    p.decode.write = on_device.narrow(0, offset, p.n_decode);
    offset += p.n_decode;
  }
  for (std::size_t i = 0; i < p.segments.size(); ++i) {
    if (slot_lengths[i] == 0) continue;
    p.segments[i].slots = on_device.narrow(0, offset, slot_lengths[i]);
    offset += slot_lengths[i];
  }
  if (!p.decode.groups.empty() && p.decode.pool == nullptr) {
    p.decode.new_kv.reserve(2 * static_cast<std::size_t>(config_.n_layer));
  }
  return p;
}

void DecoderModel::plan_decode_groups(Plan& p, std::int64_t n_small, std::vector<std::int64_t>& host) const {
  // One pool for every decode segment: new keys go to it, and keys are gathered from it.
  p.decode.pool = &p.segments.front().cache->pool();
  for (std::int64_t i = 1; i < p.n_decode; ++i) {
    if (&p.segments[static_cast<std::size_t>(i)].cache->pool() != p.decode.pool) p.decode.pool = nullptr;
  }
  for (const auto& [row0, rows] : {std::pair{std::int64_t{0}, n_small}, std::pair{n_small, p.n_decode - n_small}}) {
    if (rows == 0) continue;
    DecodeGroup g{row0, rows, 0, {}, {}};
    for (std::int64_t i = row0; i < row0 + rows; ++i) {
      g.keys = std::max(g.keys, p.segments[static_cast<std::size_t>(i)].pos0 + 1);
    }
    p.decode.groups.push_back(std::move(g));
  }
  // Padded key j of the group's segment i reads pool slot or row gather[i *
  // keys + j]; in the concatenation [cached keys of its segments | their new
  // keys], segment i's cached keys start at the sum of the lengths before it.
  for (const DecodeGroup& g : p.decode.groups) {
    std::int64_t cached = 0;
    for (std::int64_t i = g.row0; i < g.row0 + g.rows; ++i) cached += p.segments[static_cast<std::size_t>(i)].pos0;
    const std::size_t gather = host.size();
    host.resize(gather + 2 * static_cast<std::size_t>(g.rows * g.keys));
    std::int64_t* out = host.data() + gather;
    std::int64_t* pad = out + g.rows * g.keys;
    for (std::int64_t i = 0, first = 0; i < g.rows; ++i) {
      const Segment& s = p.segments[static_cast<std::size_t>(g.row0 + i)];
      const std::int64_t length = s.pos0;
      for (std::int64_t j = 0; j < g.keys; ++j, ++out, ++pad) {
        if (p.decode.pool != nullptr) {
          *out = s.cache->slot(j <= length ? j : 0);
        } else {
          *out = j < length ? first + j : j == length ? cached + i : 0;
        }
        *pad = j > length ? 1 : 0;
      }
      first += length;
    }
  }
  if (p.decode.pool != nullptr) {
    for (std::int64_t i = 0; i < p.n_decode; ++i) {
      const Segment& s = p.segments[static_cast<std::size_t>(i)];
      host.push_back(s.cache->slot(s.pos0));
    }
  }
}

std::vector<std::int64_t> DecoderModel::plan_segment_slots(Plan& p, std::vector<std::int64_t>& host) const {
  // Positions a segment reads from its cache: pos0 + t for a prefill chunk
  // (after writing its t), pos0 for a decode of the concatenation; none for
  // decodes through the host kernel or from one pool.
  const bool decode_reads = !p.host_decode && p.decode.pool == nullptr;
  std::vector<std::int64_t> lengths(p.segments.size(), 0);
  for (std::size_t i = 0; i < p.segments.size(); ++i) {
    Segment& s = p.segments[i];
    if (s.cache == nullptr) continue;
    const bool decode = i < static_cast<std::size_t>(p.n_decode);
    if (decode && !decode_reads) continue;
    const std::int64_t reads = decode ? s.pos0 : s.pos0 + s.t;
    s.first_slot = s.cache->contiguous_first_slot(reads);
    if (s.first_slot >= 0 || reads == 0) continue;
    for (std::int64_t j = 0; j < reads; ++j) host.push_back(s.cache->slot(j));
    lengths[i] = reads;
  }
  return lengths;
}

at::Tensor DecoderModel::attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int layer,
                                   const Plan& plan) const {
  // Decode segments attend together: in host memory in one decode_attention
  // call (float32 or float64), elsewhere as one DecodeBatch; every other
  // segment attends with its own tensor ops.
  const auto first = static_cast<std::size_t>(plan.n_decode);
  std::vector<at::Tensor> y;  // attention output pieces in row order
  y.reserve(plan.segments.size() - first + 1);
  if (plan.n_decode > 0 && plan.host_decode) {
    y.push_back(dtype_ == at::kFloat    ? attend_decode<float>(q, k, v, layer, plan)
                : dtype_ == at::kDouble ? attend_decode<double>(q, k, v, layer, plan)
                                        : attend_decode<float, std::uint16_t>(q, k, v, layer, plan));
  } else if (plan.n_decode > 0) {
    y.push_back(attend_decode_batch(q, k, v, layer, plan));
  }
  for (std::size_t i = first; i < plan.segments.size(); ++i) {
    const Segment& s = plan.segments[i];
    const at::Tensor qs = q.narrow(0, s.row0, s.t);
    const at::Tensor ks = k.narrow(0, s.row0, s.t);  // [t, n_kv_head, head_dim]
    const at::Tensor vs = v.narrow(0, s.row0, s.t);
    if (s.cache == nullptr) {
      y.push_back(attend(qs, ks, vs, s.mask));
      continue;
    }
    const at::Tensor& pool_k = s.cache->pool().k(layer);
    const at::Tensor& pool_v = s.cache->pool().v(layer);
    if (s.first_slot >= 0) {
      pool_k.narrow(0, s.first_slot + s.pos0, s.t).copy_(ks);
      pool_v.narrow(0, s.first_slot + s.pos0, s.t).copy_(vs);
    } else {
      const at::Tensor write = s.slots.narrow(0, s.pos0, s.t);
      pool_k.index_copy_(0, write, ks);
      pool_v.index_copy_(0, write, vs);
    }
    y.push_back(attend(qs, read_positions(pool_k, s, s.pos0 + s.t), read_positions(pool_v, s, s.pos0 + s.t), s.mask));
  }
  return y.size() == 1 ? y[0] : at::cat(y, 0);  // [rows, n_head * head_dim]
}

template <typename T, typename C>
at::Tensor DecoderModel::attend_decode(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int layer,
                                       const Plan& plan) const {
  constexpr bool kWidened = !std::is_same_v<T, C>;  // bfloat16 cache, float32 arithmetic
  const DecodeAttentionShape shape{config_.n_head, config_.n_kv_head, config_.head_dim};
  const std::int64_t q_dim = shape.n_head * shape.head_dim;
  const std::int64_t kv_dim = shape.n_kv_head * shape.head_dim;
  // Decode rows come first; contiguous [n_decode, heads, head_dim] copies
  // (queries widened to float32 when the cache is bfloat16: exact).
  const at::Tensor q_narrow = q.narrow(0, 0, plan.n_decode);
  const at::Tensor qd = kWidened ? q_narrow.to(at::kFloat).contiguous() : q_narrow.contiguous();
  const at::Tensor kd = k.narrow(0, 0, plan.n_decode).contiguous();
  const at::Tensor vd = v.narrow(0, 0, plan.n_decode).contiguous();
  const at::Tensor out = at::empty({plan.n_decode, q_dim}, qd.options());
  const T* q_row = qd.data_ptr<T>();
  const C* k_row = elements<C>(kd);
  const C* v_row = elements<C>(vd);
  T* out_row = out.data_ptr<T>();
  std::vector<DecodeSequence<T, C>> sequences;
  sequences.reserve(static_cast<std::size_t>(plan.n_decode));
  for (std::int64_t i = 0; i < plan.n_decode; ++i, q_row += q_dim, k_row += kv_dim, v_row += kv_dim, out_row += q_dim) {
    const Segment& s = plan.segments[static_cast<std::size_t>(i)];
    const KvPool& pool = s.cache->pool();
    sequences.push_back({q_row, k_row, v_row, elements<C>(pool.k(layer)), elements<C>(pool.v(layer)),
                         s.cache->blocks().data(), pool.block_tokens(), s.pos0, out_row});
  }
  decode_attention<T, C>(sequences, shape);
  return kWidened ? out.to(q.scalar_type()) : out;  // one rounding to bfloat16
}

at::Tensor DecoderModel::attend_decode_batch(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int layer,
                                             const Plan& plan) const {
  const at::Tensor k_new = k.narrow(0, 0, plan.n_decode).contiguous();  // [n_decode, kv_heads, head_dim]
  const at::Tensor v_new = v.narrow(0, 0, plan.n_decode).contiguous();
  if (plan.decode.pool != nullptr) {
    plan.decode.pool->k(layer).index_copy_(0, plan.decode.write, k_new);
    plan.decode.pool->v(layer).index_copy_(0, plan.decode.write, v_new);
  } else {
    plan.decode.new_kv.push_back(k_new);
    plan.decode.new_kv.push_back(v_new);
  }
  std::vector<at::Tensor> y;
  for (const DecodeGroup& g : plan.decode.groups) {
    y.push_back(attend_decode_group(q.narrow(0, g.row0, g.rows), k_new.narrow(0, g.row0, g.rows),
                                    v_new.narrow(0, g.row0, g.rows), layer, plan, g));
  }
  return y.size() == 1 ? y[0] : at::cat(y, 0);
}

at::Tensor DecoderModel::attend_decode_group(const at::Tensor& q, const at::Tensor& k_new, const at::Tensor& v_new,
                                             int layer, const Plan& plan, const DecodeGroup& group) const {
  const std::int64_t n = group.rows;
  const std::int64_t keys = group.keys;
  const std::int64_t kv_heads = config_.n_kv_head;
  const std::int64_t per_kv = config_.n_head / kv_heads;
  const std::int64_t head_dim = config_.head_dim;
  // Rows are gathered whole (contiguous [kv_heads * head_dim] each), then laid
  // out head-major in one copy: [kv_heads, n, 1, keys, head_dim].
  const auto padded = [&](const at::Tensor& rows) {
    return rows.index_select(0, group.gather)
        .view({n, keys, kv_heads, head_dim})
        .permute({2, 0, 1, 3})
        .contiguous()
        .view({kv_heads, n, 1, keys, head_dim});
  };
  // From one pool (the new keys already in it), or from [cached keys of each
  // sequence..., new keys].
  const auto rows = [&](bool values) {
    if (plan.decode.pool != nullptr) return values ? plan.decode.pool->v(layer) : plan.decode.pool->k(layer);
    std::vector<at::Tensor> parts;
    parts.reserve(static_cast<std::size_t>(n) + 1);
    for (std::int64_t i = group.row0; i < group.row0 + n; ++i) {
      const Segment& s = plan.segments[static_cast<std::size_t>(i)];
      if (s.pos0 == 0) continue;
      const KvPool& pool = s.cache->pool();
      parts.push_back(read_positions(values ? pool.v(layer) : pool.k(layer), s, s.pos0));
    }
    parts.push_back(values ? v_new : k_new);
    return at::cat(parts, 0);
  };
  const at::Tensor keys_padded = padded(rows(false));
  const at::Tensor values_padded = padded(rows(true));
  // The products have the shapes and layouts of attend()'s for one sequence,
  // with the sequences as one more batch dimension, so each sequence's
  // arithmetic is the one it gets alone: query head h reads KV head h / per_kv,
  // q [kv_heads, n, per_kv, 1, head_dim] against k^T [kv_heads, n, 1,
  // head_dim, keys] (a transposed view) and v [kv_heads, n, 1, keys, head_dim].
  const at::Tensor qg = q.reshape({n, kv_heads, per_kv, 1, head_dim}).permute({1, 0, 2, 3, 4});
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
  at::Tensor scores = at::matmul(qg, keys_padded.transpose(3, 4)).mul_(scale);  // [kv_heads, n, per_kv, 1, keys]
  scores.masked_fill_(group.pad, -std::numeric_limits<double>::infinity());
  const at::Tensor y = at::matmul(at::softmax(scores, -1), values_padded);  // [kv_heads, n, per_kv, 1, head_dim]
  return y.permute({1, 0, 2, 3, 4}).reshape({n, config_.n_head * head_dim});
}


void DecoderModel::write_decode_kv(const Plan& plan) const {
  const std::int64_t n = plan.n_decode;
  // [n, n_layer * 2, kv_heads, head_dim] -> one [n_layer, 2, kv_heads, head_dim] slice per sequence.
  const at::Tensor all = at::stack(plan.decode.new_kv, 1).view({n, config_.n_layer, 2, config_.n_kv_head, config_.head_dim});
  std::vector<at::Tensor> slots;
  slots.reserve(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    const Segment& s = plan.segments[static_cast<std::size_t>(i)];
    const at::Tensor& storage = s.cache->pool().storage();  // [n_layer, 2, slots, kv_heads, head_dim]
    slots.push_back(direct_view(storage, {storage.size(0), 2, storage.size(3), storage.size(4)},
                                {storage.stride(0), storage.stride(1), storage.stride(3), storage.stride(4)},
                                storage.storage_offset() + s.cache->slot(s.pos0) * storage.stride(2)));
  }
  at::unbind_copy_out(slots, all, 0);
}

at::Tensor DecoderModel::attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const at::Tensor& mask) const {
  const std::int64_t t = q.size(0);
  const std::int64_t kv_heads = k.size(1);
  const std::int64_t group = config_.n_head / kv_heads;
  const std::int64_t head_dim = q.size(2);
  // Query head h reads KV head h / group: q [kv_heads, group, t, head_dim]
  // against k and v [kv_heads, 1, keys, head_dim].
  const at::Tensor qg = q.reshape({t, kv_heads, group, head_dim}).permute({1, 2, 0, 3});
  const at::Tensor kh = k.transpose(0, 1).unsqueeze(1);
  const at::Tensor vh = v.transpose(0, 1).unsqueeze(1);
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
  at::Tensor scores = at::matmul(qg, kh.transpose(2, 3)).mul_(scale);  // [kv_heads, group, t, keys]
  if (mask.defined()) scores.masked_fill_(mask, -std::numeric_limits<double>::infinity());
  const at::Tensor y = at::matmul(at::softmax(scores, -1), vh);  // [kv_heads, group, t, head_dim]
  return y.permute({2, 0, 1, 3}).reshape({t, config_.n_head * head_dim});
}

}  // namespace vg::detail
