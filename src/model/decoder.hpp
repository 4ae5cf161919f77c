// Machinery shared by the decoder-only families (gpt2.cpp, llama.cpp): the
// KV cache, the ragged step layout, step()/forward_full(), causal attention
// over the cache (host decode_attention for single-token decode in host
// memory, one batched set of tensor ops per layer elsewhere), and weight
// loading from a Checkpoint. An internal header that includes libtorch: only
// this folder's torch .cpp files include it. A model and its caches belong to
// one engine thread; every entry point binds the model's device and runs in
// InferenceMode, and no torch exception leaves these files.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
#include <unordered_set>
#include <vector>

#include "device/device.hpp"
#include "model/checkpoint.hpp"
#include "model/decode_graphs.hpp"
#include "model/kv_blocks.hpp"
#include "model/model.hpp"
#include "tokenizer/tokenizer.hpp"

namespace vg::detail {

/// Converts the exception being handled into an Error: libtorch OOM (and
/// std::bad_alloc) -> kOutOfMemory, a CUDA error other than out of memory ->
/// kDeviceFault, anything else -> kInternal (compat::current_exception_error).
Error current_exception_error(const std::string& op);

/// "float32" -> kFloat, "bfloat16" -> kBFloat16, "float64" -> kDouble,
/// "float16" -> kHalf unless `on_cpu` (libtorch has no CPU kernels for it).
/// Errors: kModelLoad for those and for names it does not know; `where`
/// starts the message.
Result<at::ScalarType> compute_dtype(const std::string& name, bool on_cpu, const std::string& where);

/// Reads tensors of a Checkpoint onto a device in the compute dtype. The
/// first error is kept and later calls return undefined tensors.
class WeightLoader {
 public:
  WeightLoader(const Checkpoint& checkpoint, std::string prefix, at::ScalarType dtype, at::Device device)
      : checkpoint_(checkpoint), prefix_(std::move(prefix)), dtype_(dtype), device_(device) {}
  /// Tensor `prefix + name`, which must have `shape` and a float dtype (F32,
  /// F16, BF16, F64); converted to the compute dtype on the device. With
  /// `transposed` (a 2-D shape), returned as [shape[1], shape[0]],
  /// contiguous, with no second copy on the device while it is made.
  at::Tensor get(const std::string& name, std::vector<std::int64_t> shape, bool transposed = false);
  const Status& status() const { return status_; }
  /// Elements of the tensors loaded so far.
  std::int64_t parameters() const { return parameters_; }

 private:
  const Checkpoint& checkpoint_;
  std::string prefix_;
  at::ScalarType dtype_;
  at::Device device_;
  Status status_;
  std::int64_t parameters_ = 0;
};

class DecoderModel;
class DecoderCache;

/// A host tensor's elements as C (std::uint16_t: the bits of a bfloat16 tensor).
template <typename C>
C* host_elements(const at::Tensor& t) {
  if constexpr (std::is_same_v<C, std::uint16_t>) {
    return reinterpret_cast<std::uint16_t*>(t.data_ptr<at::BFloat16>());
  } else {
    return t.data_ptr<C>();
  }
}

/// The storage of a KV block pool: K and V of every layer in one allocation
/// [n_layer, 2, blocks x block_tokens, n_kv_head, head_dim]; k(l) and v(l)
/// are views [slots, n_kv_head, head_dim], where block b holds slots
/// b x block_tokens .. (b + 1) x block_tokens - 1, so the keys of one
/// position are contiguous, and so are those of one block. Shared by the
/// caches that hold its blocks (the last one frees it); its block
/// bookkeeping is locked, since a prefill worker's thread makes and ends
/// caches too.
class KvPool {
 public:
  KvPool(at::Tensor storage, std::int64_t block_tokens, bool shared, bool prefix_cache = false);
  const at::Tensor& k(int layer) const { return k_[static_cast<std::size_t>(layer)]; }
  const at::Tensor& v(int layer) const { return v_[static_cast<std::size_t>(layer)]; }
  /// [n_layer, 2, slots, n_kv_head, head_dim]
  const at::Tensor& storage() const { return storage_; }
  std::int64_t block_tokens() const { return block_tokens_; }
  /// Device bytes of one block (every layer's K and V of block_tokens positions).
  std::int64_t block_bytes() const { return block_bytes_; }
  /// Whether it is a model's pool (Model::use_kv_pool), not one cache's own.
  bool shared() const { return shared_; }
  /// Whether full blocks are published for later prompts (KvPoolOptions::prefix_cache).
  bool prefix_cache() const { return prefix_cache_; }

  /// KvBlockAllocator::take(count, out) under the lock.
  bool take(std::int64_t count, std::vector<std::int32_t>& out);
  void share(std::int32_t block);
  void release(std::span<const std::int32_t> blocks);
  /// KvBlockAllocator::publish and find under the lock.
  std::uint64_t publish(std::int32_t block, std::uint64_t parent, std::span<const std::int32_t> tokens);
  std::optional<std::int32_t> find(std::uint64_t parent, std::span<const std::int32_t> tokens);
  KvBlockCounts counts() const;
  std::int64_t evicted() const;

  /// A cache that holds blocks of this pool, for resize() to renumber.
  void attach(DecoderCache* cache);
  void detach(DecoderCache* cache);
  /// Makes it a pool of `blocks` blocks: the blocks in use (and as many
  /// cached ones as fit) are copied into host memory, the old storage is
  /// freed, a new one is allocated by `allocate(slots)` and the blocks are
  /// copied into it, renumbered from 0 in every attached cache. Every copy
  /// between the device and the host is of one layer's K or V of a run of
  /// consecutive blocks, contiguous on both sides, so it needs no device
  /// memory of its own (a copy of a strided slice would make a device
  /// temporary as large as the blocks kept, when memory is short).
  /// Errors: kInvalidRequest when more than `blocks` are in use; when
  /// `allocate` or a copy into the new storage throws, the old size is
  /// allocated again with the same contents and the exception is passed on
  /// (the callers turn it into an Error); if that fails too, the storage is
  /// lost (KvBlockCounts::lost: nothing is published any more, and the
  /// next resize allocates afresh) and that exception is passed on. No
  /// step may run on the pool meanwhile.
  Status resize(std::int64_t blocks, const std::function<at::Tensor(std::int64_t)>& allocate);
  /// Whether the storage was lost (see resize()).
  bool lost() const;

 private:
  void set_storage(at::Tensor storage);
  void clear_storage();
  /// Allocates `blocks` blocks and copies `saved` (the kept blocks, in
  /// new-id order) into blocks `to` of it (a libtorch error escapes).
  void fill_new_storage(std::int64_t blocks, const std::function<at::Tensor(std::int64_t)>& allocate,
                        const at::Tensor& saved, std::span<const std::int32_t> to);
  /// Copies blocks `from[i]` of `src` to blocks `to[i]` of `dst` (tensors
  /// [n_layer, 2, blocks, block_tokens, n_kv_head, head_dim]), a run of
  /// consecutive ids of one layer's K or V at a time.
  static void copy_blocks(const at::Tensor& src, std::span<const std::int32_t> from, const at::Tensor& dst,
                          std::span<const std::int32_t> to);
  /// The storage viewed as [n_layer, 2, blocks, block_tokens, n_kv_head, head_dim].
  at::Tensor by_block(const at::Tensor& storage) const;

  at::Tensor storage_;
  std::vector<at::Tensor> k_, v_;
  std::int64_t block_tokens_;
  std::int64_t block_bytes_;
  std::vector<std::int64_t> shape_;  ///< the storage's [n_layer, 2, slots, n_kv_head, head_dim], kept when it is lost
  at::ScalarType dtype_;
  bool shared_;
  bool prefix_cache_;
  bool lost_ = false;  ///< guarded by mutex_
  mutable std::mutex mutex_;
  KvBlockAllocator blocks_;  ///< guarded by mutex_
  std::unordered_set<DecoderCache*> caches_;  ///< guarded by mutex_
};

/// One sequence's KV cache: its block table in a KvPool (a model's shared
/// pool, or a pool of one block of exactly its capacity, its own).
class DecoderCache final : public KvCache {
 public:
  DecoderCache(const DecoderModel* owner, std::shared_ptr<KvPool> pool, std::vector<std::int32_t> blocks);
  ~DecoderCache() override;
  DecoderCache(const DecoderCache&) = delete;
  DecoderCache& operator=(const DecoderCache&) = delete;

  int length() const override { return length_; }
  int capacity() const override { return static_cast<int>(blocks_.size() * pool_->block_tokens()); }
  std::int64_t bytes() const override { return static_cast<std::int64_t>(blocks_.size()) * pool_->block_bytes(); }

  const DecoderModel* owner() const { return owner_; }
  KvPool& pool() const { return *pool_; }
  const std::shared_ptr<KvPool>& pool_ptr() const { return pool_; }
  /// The block table: block ids in position order.
  const std::vector<std::int32_t>& blocks() const { return blocks_; }
  std::vector<std::int32_t>& blocks() { return blocks_; }
  /// The pool slot of `position` (< capacity()).
  std::int64_t slot(std::int64_t position) const {
    const std::int64_t bt = pool_->block_tokens();
    return blocks_[static_cast<std::size_t>(position / bt)] * bt + position % bt;
  }
  /// The slot of position 0 when positions 0..positions-1 lie in consecutive
  /// slots (always in a cache's own pool), else -1.
  std::int64_t contiguous_first_slot(std::int64_t positions) const;
  /// Appends `tokens` after a step that cached them; in a pool with a prefix
  /// cache, remembers their ids and publishes each block they fill.
  void advance(std::span<const std::int32_t> tokens);
  /// Makes it hold `from`'s length, the ids and published keys of its tokens.
  void copy_length(const DecoderCache& from);
  /// Its first `blocks.size()` blocks are `blocks`, found in the prefix cache
  /// under `keys`, holding `tokens` (blocks x block_tokens ids).
  void set_prefix(std::span<const std::uint64_t> keys, std::span<const std::int32_t> tokens);

 private:
  const DecoderModel* owner_;
  std::shared_ptr<KvPool> pool_;
  std::vector<std::int32_t> blocks_;
  int length_ = 0;
  std::vector<std::int32_t> tokens_;  ///< ids of positions 0..length-1 (with a prefix cache)
  std::vector<std::uint64_t> keys_;   ///< chain keys of its first keys_.size() blocks, published
};

/// One input's new tokens within the concatenated rows of a step.
struct Segment {
  DecoderCache* cache = nullptr;  ///< nullptr: attends to its own tokens only (forward_full)
  std::int64_t pos0 = 0;          ///< position of its first new token (tokens already cached)
  std::int64_t t = 0;             ///< new tokens
  std::int64_t row0 = 0;          ///< its first row in the concatenated [rows, ...] tensors
  at::Tensor mask;                ///< [t, pos0 + t], true where a key lies after the query; undefined when t == 1
  /// The cached positions it reads (pos0 + t for a prefill chunk, after
  /// writing its own; pos0 for a decode of a DecodeGroup's concatenation):
  /// the slot of position 0 when they lie in consecutive slots of its pool
  /// (read as a view), else -1 and `slots` lists their slots (int64 on the
  /// device).
  std::int64_t first_slot = -1;
  at::Tensor slots;
};

/// Decode segments of a step on the tensor path that attend together: per
/// layer, their keys are gathered into a padded [n_kv_head * rows, keys,
/// head_dim] batch and attended with one pair of batched matrix products and
/// a masked softmax (attend_grouped). When every decode segment's cache is in one pool
/// (DecodeBatch::pool), the new keys are first written to the pool and
/// `gather` lists pool slots; otherwise the cached keys of its segments and
/// the new keys are concatenated ([sum of lengths + rows, n_kv_head,
/// head_dim]) and `gather` lists rows of that.
struct DecodeGroup {
  std::int64_t row0 = 0;  ///< its first decode row
  std::int64_t rows = 0;
  std::int64_t keys = 0;  ///< padded key count: its longest sequence's length + 1
  at::Tensor gather;      ///< [rows * keys] int64: pool slot or row of the concatenation for each padded key (a valid one for padding)
  at::Tensor pad;         ///< [1, rows, 1, keys] bool: true past a sequence's length + 1 keys
};

/// The decode segments of a step on the tensor path: one group, or in host
/// memory two (those short enough for libtorch's small-matrix CPU kernel,
/// then the others), so each sequence gets the arithmetic it gets alone. In
/// one pool their new K and V are written to it at every layer (one
/// index_copy_ each); otherwise they reach the caches at the end of the step,
/// in one copy for all layers and sequences.
struct DecodeBatch {
  std::vector<DecodeGroup> groups;
  KvPool* pool = nullptr;  ///< the pool of every decode segment's cache, if they share one
  at::Tensor write;        ///< with `pool`: [n_decode] int64, the slot each new key goes to
  /// Per layer, K then V of the decode rows [n_decode, n_kv_head, head_dim]
  /// (contiguous), appended by attention() as the layers run.
  mutable std::vector<at::Tensor> new_kv;
};

/// A decode step with fixed shapes (DecoderModel::decode_step on the
/// tensor path): its `rows` decode rows padded to `bucket` rows, the next
/// power of two, and every row's keys padded to `keys`, a power of two of
/// blocks (at most a full context), so that a step's tensors have one of a
/// few shapes whatever the batch, and a step's ops do not depend on it.
/// Attention reads the pool through the block table: every row writes its
/// new K and V at its slot, then gathers keys [bucket, keys] by slot, masked
/// past its length. A padding row repeats row 0's block table at position 0
/// and writes back what row 0's first slot holds (no real row writes that
/// slot in the step), so it changes nothing.
struct StaticDecode {
  KvPool* pool = nullptr;   ///< set: the step is a static-shape decode step
  std::int64_t rows = 0;    ///< real rows (the first ones)
  std::int64_t bucket = 0;  ///< rows after padding
  std::int64_t keys = 0;    ///< keys each row reads, padded (table blocks x block_tokens)
  at::Tensor slots;         ///< [bucket * keys] int64: the pool slot of each padded key
  at::Tensor pad;           ///< [1, bucket, 1, keys] bool: true past a row's position
  at::Tensor write;         ///< [bucket] int64: the slot each row's new K and V go to
  at::Tensor padding;       ///< [bucket, 1, 1] bool: true for padding rows
};

/// The ragged layout of one forward pass: every input's new tokens are rows
/// of one [rows, n_embd] tensor, so norms, projections and MLP run once per
/// layer for all of them. Decode segments (one token, with a cache) come
/// first: in host memory they attend in one decode_attention call, elsewhere
/// as one DecodeBatch; the others attend one by one.
struct Plan {
  std::vector<Segment> segments;  ///< in row order
  std::int64_t rows = 0;
  std::int64_t n_decode = 0;      ///< leading decode segments
  bool host_decode = false;       ///< the decode segments attend through decode_attention
  DecodeBatch decode;             ///< filled when n_decode > 0 and !host_decode
  StaticDecode fixed;             ///< fixed.pool set: a static-shape decode step (every row a decode)
  at::Tensor ids, positions;      ///< [rows] int64 on the device
  at::Tensor last_rows;           ///< [inputs] int64: each input's last row, in input order
  std::vector<std::int64_t> first_rows;  ///< each input's first row, in input order (host)
};

/// A decoder-only transformer: a family supplies hidden() (embedding and
/// blocks, calling attention()) and head() (final norm and LM head).
class DecoderModel : public Model {
 public:
  DecoderModel(ModelConfig config, Device* device, at::ScalarType dtype, std::unique_ptr<Tokenizer> tokenizer);

  const ModelConfig& config() const final { return config_; }
  std::int64_t parameter_count() const final { return parameter_count_; }
  const Tokenizer& tokenizer() const final { return *tokenizer_; }
  Result<std::unique_ptr<KvCache>> new_cache(int capacity_tokens) final;
  Result<std::vector<std::vector<float>>> step(std::span<const StepInput> inputs) final;
  /// On the tensor path, with every cache in the model's pool and holding
  /// at least one token: a static-shape step (StaticDecode), replayed from
  /// a decode graph where one of its shape is held; otherwise the layout
  /// step() uses. Either way, the logits stay on the device and are sampled
  /// there (sample_on_device). On the host-kernel path: step() and the host
  /// Sampler (Model::decode_step).
  Result<std::vector<SampledToken>> decode_step(std::span<const StepInput> inputs,
                                                std::span<const SampleSpec> specs) final;
  /// On the tensor path (where static-shape steps run).
  bool pads_decode_batch() const final { return !uses_host_decode(); }
  /// The batch bucket of a static-shape decode step of `rows` rows: the
  /// next power of two.
  static std::int64_t batch_bucket(std::int64_t rows);
  Status copy_cache(const KvCache& from, KvCache& to) final;
  Result<std::unique_ptr<KvCache>> new_cache_for_prompt(int capacity_tokens,
                                                       std::span<const std::int32_t> prompt) final;
  Status use_kv_pool(const KvPoolOptions& options) final;
  std::optional<KvBlockCounts> kv_pool_counts() const final;
  std::int64_t kv_blocks_evicted() const final;
  std::int64_t kv_block_bytes() const final;
  Status grow_cache(KvCache& cache, int capacity_tokens) final;
  /// Records the pool's moves too: resize_kv_pool() records the graphs
  /// again after it (or, failing that, logs why and runs decode steps
  /// eagerly).
  Status resize_kv_pool(std::int64_t blocks) final;
  Result<std::vector<float>> forward_full(std::span<const std::int32_t> tokens) final;
  Result<DecodeGraphStats> record_decode_graphs(const DecodeGraphOptions& options) final;
  void drop_decode_graphs() final;
  DecodeGraphStats decode_graph_stats() const final;

 protected:
  /// Hidden states [rows, n_embd] after the last block, appending every
  /// segment's K and V to its cache (through attention()).
  virtual at::Tensor hidden(const Plan& plan) const = 0;
  /// Final norm and LM head: [T, n_embd] -> [T, vocab] float32 on the device.
  virtual at::Tensor head(const at::Tensor& x) const = 0;

  /// Causal attention of layer `layer` for all rows of `plan`: q [rows,
  /// n_head, head_dim], k and v [rows, n_kv_head, head_dim] (positions
  /// already encoded) -> [rows, n_head * head_dim]. Appends k and v to each
  /// segment's cache at its positions. Query head h reads KV head
  /// h / (n_head / n_kv_head).
  at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int layer,
                       const Plan& plan) const;

  at::Device torch_device() const;

  /// Whether GPT-2's Conv1D weights ([k, n] in the checkpoint) are kept
  /// transposed, [n, k], as conv1d() takes them where uses_host_gemm():
  /// pass it to WeightLoader::get.
  bool conv1d_transposed() const { return uses_host_gemm(); }
  /// a [rows, k] · W + bias [n] -> [rows, n], for W read as conv1d_transposed() says.
  at::Tensor conv1d(const at::Tensor& a, const at::Tensor& w, const at::Tensor& bias) const;
  /// LayerNorm over the last dimension of x [rows, d] with weight and bias
  /// [d] and config().layer_norm_epsilon -> [rows, d]. In host memory, below
  /// kSerialLayerNormElements elements and where vg_model is built with
  /// OpenMP, it runs on the calling thread alone: that thread's OpenMP team
  /// size is 1 for the call (same values: libtorch normalises each row on
  /// one thread either way).
  at::Tensor layer_norm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) const;
  /// About 34 µs of one core's layer norm ([128, 512] through PyTorch 1.13
  /// here), a little more than waking a compute thread that waits passively
  /// costs (bench/reports/decode-steps.md, "Fewer wake-ups").
  static constexpr std::int64_t kSerialLayerNormElements = std::int64_t{1} << 16;
  /// a [rows, k] · w [n, k]ᵀ + bias [n] (nn.Linear's layout; bias may be
  /// undefined) -> [rows, n].
  at::Tensor linear(const at::Tensor& a, const at::Tensor& w, const at::Tensor& bias) const;

  /// Reads the weights: `read` takes every tensor it needs from a
  /// WeightLoader over `checkpoint` (names after `prefix`), on the device, in
  /// the compute dtype, in inference mode; then parameter_count() counts them.
  /// Errors: the loader's first error (missing tensor, wrong shape or dtype),
  /// or kModelLoad naming the checkpoint and the device for a libtorch error
  /// or out-of-memory while reading.
  Status read_weights(const Checkpoint& checkpoint, std::string prefix,
                      const std::function<void(WeightLoader&)>& read);

  ModelConfig config_;
  Device* device_;
  at::ScalarType dtype_;  ///< compute and KV cache dtype
  std::unique_ptr<Tokenizer> tokenizer_;
  std::int64_t parameter_count_ = 0;

 private:
  /// Who a KV storage is for: the shared block pool (allocated at start-up
  /// and on a resize) or one sequence's own cache (allocated as it starts).
  enum class KvStorageUse { kSharedPool, kOneSequence };
  /// A pool's storage for `slots` positions on the device, zeroed (a
  /// libtorch error escapes: callers catch). The shared pool's comes from
  /// fresh pages on a virtual device (device.hpp: FreshPagesScope); a
  /// sequence's from the heap, whose recycled memory is zeroed about 15x
  /// faster than fresh pages are mapped (4 MiB: 0.05 ms against 0.7 ms).
  at::Tensor kv_storage(std::int64_t slots, KvStorageUse use) const;
  /// The cache as one of this model's, or nullptr.
  DecoderCache* own_cache(KvCache& cache) const;
  /// A cache of `capacity_tokens` (in range) in a pool of its own: one block, allocated now.
  Result<std::unique_ptr<KvCache>> own_pool_cache(int capacity_tokens);
  /// kOutOfMemory: `pool` cannot give `what` the `need` more blocks it needs.
  Error pool_short(const KvPool& pool, const std::string& what, std::int64_t need) const;
  /// Copies positions 0..from.length()-1 of `from` to the same positions of
  /// `to` in every layer (a libtorch error escapes: callers catch).
  void copy_positions(const DecoderCache& from, DecoderCache& to, std::int64_t first) const;
  std::shared_ptr<KvPool> pool_;  ///< the shared block pool, once use_kv_pool made one
  std::unique_ptr<StepGraphRecorder> recorder_;  ///< made by the first record_decode_graphs
  DecodeGraphKind recorder_kind_ = DecodeGraphKind::kCuda;
  std::unique_ptr<DecodeGraphs> graphs_;  ///< recorded decode graphs (none: eager steps)
  std::optional<DecodeGraphOptions> graphs_wanted_;  ///< the last record_decode_graphs, until drop_decode_graphs
  bool recording_failed_ = false;                    ///< a recording failed: none is tried again (record_decode_graphs)
  DecodeGraphStats graph_stats_;          ///< replays, eager steps and records since load
  Status validate(std::span<const StepInput> inputs, std::vector<DecoderCache*>& caches) const;
  /// Lays out `inputs` (caches[i] == nullptr: no cache) as a Plan.
  Plan plan(std::span<const StepInput> inputs, std::span<DecoderCache* const> caches) const;
  /// Whether decode inputs over `caches` run as a static-shape step: the
  /// tensor path, every cache in the model's pool, none empty.
  bool static_decode_fits(std::span<DecoderCache* const> caches) const;
  /// The shape of a static-shape step over `caches`: the batch bucket, and
  /// the next power of two of the blocks the longest row reads (at most a
  /// full context).
  StaticShape static_shape(std::span<DecoderCache* const> caches) const;
  /// The step's input buffer (StaticShape::input_size() values) in host memory.
  std::vector<std::int64_t> static_inputs(std::span<const StepInput> inputs, std::span<DecoderCache* const> caches,
                                          const StaticShape& shape) const;
  /// A static-shape step (Plan::fixed) over `buffer`, the input buffer on the
  /// device: device ops only (it runs inside a recorded graph).
  Plan static_views(const at::Tensor& buffer, const StaticShape& shape) const;
  /// Records the graphs of every (bucket, blocks) up to g.options.max_batch
  /// and a full context, largest first, with recorder_ (a libtorch error
  /// escapes).
  void record_graphs(DecodeGraphs& g) const;
  /// After the pool moved: records the graphs last asked for again (if
  /// any), logging either way; when that fails, none is asked for again.
  void record_again();
  /// The recorder of `kind`, recording on a thread of its own; nullptr
  /// where this libtorch has no CUDA graphs.
  std::unique_ptr<StepGraphRecorder> make_recorder(DecodeGraphKind kind) const;
  /// What an emulated recording costs a virtual device (a small cuBLAS
  /// workspace per recording thread, an executable per graph), so that CPU
  /// tests see what a GPU would.
  static constexpr EmulatedGraphCosts kEmulatedGraphCosts{256 << 10, 4 << 10};
  /// Frees the graphs held, keeping graphs_wanted_.
  void free_graphs();
  /// The logits [rows, vocab] (on the device) of a static-shape step:
  /// replayed where a graph of its shape is held, eagerly otherwise.
  at::Tensor static_logits(std::span<const StepInput> inputs, std::span<DecoderCache* const> caches);
  /// The logits [inputs, vocab] (on the device) of decode `inputs` laid out as step() lays them out.
  at::Tensor ragged_logits(std::span<const StepInput> inputs, std::span<DecoderCache* const> caches) const;
  /// Attention of a static-shape step's rows: q [bucket, n_head, head_dim],
  /// k and v [bucket, n_kv_head, head_dim] -> [bucket, n_head * head_dim].
  at::Tensor attend_static(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int layer,
                           const Plan& plan) const;
  /// Decode attention of `n` rows over padded keys and values [n_kv_head *
  /// n, keys, head_dim] (KV head-major): q [n, n_head, head_dim], pad [1, n,
  /// 1, keys] (true: masked) -> [n, n_head * head_dim]. Query head h reads KV
  /// head h / (n_head / n_kv_head); the query heads of one KV head are the
  /// rows of one product, so grouped-query attention reads K and V once.
  at::Tensor attend_grouped(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values,
                            const at::Tensor& pad, std::int64_t n) const;
  /// The tensor-path DecodeGroups of `p`'s first n_decode segments (the
  /// first `n_small` of them in a group of their own): appends each group's
  /// gather and pad, then (in one pool) the decode write slots, to `host`.
  void plan_decode_groups(Plan& p, std::int64_t n_small, std::vector<std::int64_t>& host) const;
  /// Sets each cached segment's first_slot and appends the slots of those
  /// that are not consecutive to `host`; returns how many each appended.
  std::vector<std::int64_t> plan_segment_slots(Plan& p, std::vector<std::int64_t>& host) const;
  /// Whether decode segments attend through the host kernel: float32,
  /// float64 or bfloat16 weights in host memory, unless
  /// config().host_decode_kernel is off.
  bool uses_host_decode() const;
  /// Whether conv1d() and linear() run host_gemm.hpp's batch-invariant
  /// kernels: float32 or bfloat16 weights in host memory on a CPU with AVX2
  /// and FMA, unless config().host_decode_kernel is off (libtorch's CPU
  /// bfloat16 product is a scalar loop, ~40x slower here than this kernel).
  /// Elsewhere they run BLAS or the device's kernels (at::addmm,
  /// at::linear), whose products are batch-invariant too.
  bool uses_host_gemm() const;
  /// gemm_nk over the compute threads, by column panel: a [rows, k], w [n, k].
  at::Tensor host_linear(const at::Tensor& a, const at::Tensor& w, const at::Tensor& bias) const;
  /// The decode segments of `plan` as its DecodeBatch (tensor path) ->
  /// [n_decode, n_head * head_dim].
  at::Tensor attend_decode_batch(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int layer,
                                 const Plan& plan) const;
  /// One DecodeGroup: q [rows, n_head, head_dim], its new k and v [rows,
  /// n_kv_head, head_dim] -> [rows, n_head * head_dim].
  at::Tensor attend_decode_group(const at::Tensor& q, const at::Tensor& k_new, const at::Tensor& v_new, int layer,
                                 const Plan& plan, const DecodeGroup& group) const;
  /// Writes the DecodeBatch's new K and V of every layer at each decode
  /// segment's position (one unbind_copy over all segments).
  void write_decode_kv(const Plan& plan) const;
  /// The decode segments in one decode_attention call: -> [n_decode, n_head * head_dim].
  /// T: the arithmetic type; C: the KV cache's (std::uint16_t: bfloat16
  /// bits, with q widened to float32 and the output rounded to bfloat16).
  template <typename T, typename C = T>
  at::Tensor attend_decode(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int layer,
                           const Plan& plan) const;
  /// One segment: q [t, n_head, head_dim], k and v [keys, n_kv_head,
  /// head_dim] -> [t, n_head * head_dim].
  at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask) const;
};

/// Creates the model of family M (a DecoderModel constructed as
/// M(config, device, dtype, tokenizer), with `Status load_weights(const
/// Checkpoint&)`) in the compute dtype of config.dtype and loads its weights.
/// Errors: as compute_dtype() and M::load_weights().
template <class M>
Result<std::unique_ptr<Model>> load_decoder(const ModelConfig& config, const Checkpoint& checkpoint, Device* device,
                                            std::unique_ptr<Tokenizer> tokenizer) {
  Result<at::ScalarType> dtype =
      compute_dtype(config.dtype, device->torch_device() == "cpu", checkpoint.path().parent_path().string());
  if (!dtype.ok()) return std::move(dtype).error();
  auto model = std::make_unique<M>(config, device, *dtype, std::move(tokenizer));
  if (Status s = model->load_weights(checkpoint); !s.ok()) return s.error();
  return std::unique_ptr<Model>(std::move(model));
}

}  // namespace vg::detail
