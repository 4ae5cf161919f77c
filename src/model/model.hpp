// Model interface the engine runs: load once, create per-sequence KV caches,
// run steps. Torch-free header (libtorch lives in the .cpp files of this
// folder). A Model and its caches belong to one engine thread, which must
// hold a DeviceScope for the model's device while calling into it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "model/kv_blocks.hpp"
#include "model/logprobs.hpp"

namespace vg {

class Device;
class Sampler;
class Tokenizer;

/// How decode graphs are recorded: kCuda, as CUDA graphs sharing one
/// memory pool (device/step_graph.hpp); kEmulated, not at all (a replay
/// runs the recorded step again on the same buffers), to test the logic
/// around the graphs on the CPU.
enum class DecodeGraphKind { kCuda, kEmulated };

/// How Model::record_decode_graphs() records.
struct DecodeGraphOptions {
  DecodeGraphKind kind = DecodeGraphKind::kCuda;
  int max_batch = 1;  ///< the largest decode batch; buckets up to its next power of two
};

/// What a model's decode graphs hold.
struct DecodeGraphStats {
  int graphs = 0;            ///< recorded graphs
  std::int64_t bytes = 0;    ///< device bytes they took from this process's allocator when recorded
  /// Device bytes that appeared outside the allocator while they were
  /// recorded (graph executables, kernels loaded at their first use, a
  /// recording thread's library state): other processes' memory to a
  /// device that measures what is free (DeviceMemory::foreign).
  std::int64_t outside_bytes = 0;
  std::int64_t replays = 0;  ///< decode steps that replayed a graph (since the model loaded)
  std::int64_t eager = 0;    ///< decode steps that ran eagerly while graphs were held
  std::int64_t records = 0;  ///< times the graphs were recorded (again after a pool resize)
};

/// Architecture hyper-parameters, read from config.json (Hugging Face key
/// names of the family; see model_config.hpp for which keys each reads).
struct ModelConfig {
  std::string family;        ///< config.json model_type: "gpt2" or "llama"
  int n_layer = 0;
  int n_head = 0;            ///< query heads
  int n_kv_head = 0;         ///< key/value heads (divides n_head; == n_head for GPT-2)
  int n_embd = 0;            ///< hidden size
  int head_dim = 0;          ///< per head; n_embd / n_head unless the config says otherwise (llama)
  int intermediate_size = 0; ///< MLP width (GPT-2: n_inner or 4 * n_embd)
  int n_positions = 0;       ///< context length in tokens
  int vocab_size = 0;
  int eos_token_id = -1;     ///< the first one when config.json lists several; -1: none
  double layer_norm_epsilon = 1e-5;  ///< LayerNorm (gpt2) or RMSNorm (llama) epsilon
  double rope_theta = 10000.0;       ///< rotary embedding base (llama)
  bool tie_word_embeddings = true;   ///< LM head shares the token embedding (always for gpt2)
  std::string dtype = "float32";  ///< compute and KV cache dtype
  /// Decode through the hand-written host kernel when the dtype is float32 or
  /// float64 and the weights live in host memory (set from Model::Options).
  bool host_decode_kernel = true;
};

/// One sequence's KV cache: per layer, K and V of every cached position in
/// the model dtype, in blocks (kv_blocks.hpp) listed by a block table. Its
/// blocks are held from creation, so that growth up to capacity never
/// allocates; in a shared block pool (Model::use_kv_pool) it may take more
/// (Model::grow_cache), and n > 1 choices share the blocks of their prompt.
class KvCache {
 public:
  virtual ~KvCache() = default;
  /// Tokens cached so far.
  virtual int length() const = 0;
  /// Tokens it can hold: its blocks x tokens per block.
  virtual int capacity() const = 0;
  /// Device bytes of its blocks (a block shared with another cache counts in both).
  virtual std::int64_t bytes() const = 0;
};

/// A pool of KV blocks allocated once on the model's device, from which every
/// cache that Model::new_cache makes afterwards takes its blocks.
struct KvPoolOptions {
  int block_tokens = 16;    ///< positions per block (1..n_positions)
  std::int64_t blocks = 0;  ///< blocks in the pool (>= 1)
  /// Full blocks are published by the token ids they follow and hold, kept
  /// after their sequence ends, and shared by caches made for prompts that
  /// start with the same tokens (new_cache_for_prompt); see kv_blocks.hpp.
  bool prefix_cache = true;
};

/// One sequence's part of a step: `tokens` are appended at positions
/// cache->length() .. cache->length()+tokens.size()-1.
struct StepInput {
  KvCache* cache = nullptr;
  std::span<const std::int32_t> tokens;
  /// Return the logits of every token of `tokens` (prompt logprobs), not
  /// only of the last one.
  bool all_logits = false;
};

/// How one row of a decode step picks its next token: the sequence's own
/// Sampler (its parameters, random state and penalty counts; the model
/// draws from it and records the pick) and the logprobs it asked for.
struct SampleSpec {
  Sampler* sampler = nullptr;
  /// Alternatives to report with the chosen token's logprob; -1: no logprobs.
  int top_logprobs = -1;
};

/// A decode row's pick: the token, whether every logit of the row was
/// finite (a row that was not has a token that must not be used), and with
/// SampleSpec::top_logprobs >= 0 its logprob and alternatives as
/// token_logprobs() reports them (raw logits, natural log).
struct SampledToken {
  std::int32_t id = 0;
  bool finite = true;
  std::optional<LogprobResult> logprobs;
};

class Model {
 public:
  struct Options {
    /// Folder with config.json and model.safetensors, or the shards named by
    /// model.safetensors.index.json.
    std::filesystem::path dir;
    Device* device = nullptr;   ///< weights are copied onto it through its allocator
    /// Compute and KV cache dtype: "float32", "bfloat16" or "float64" (a
    /// test mode); "float16" is refused on virtual devices (libtorch has no
    /// CPU kernels for it). Weights stored as F32, F16, BF16 or F64 are
    /// converted on load. Logits are float32 either way.
    std::string dtype = "float32";
    /// false: float32/float64 models in host memory decode on the tensor path
    /// that CUDA devices and bfloat16 run (one set of tensor ops per layer for
    /// all decoding sequences) instead of the hand-written host kernel; for
    /// tests and benchmarks that compare the two.
    bool host_decode_kernel = true;
  };

  /// Loads a model folder. Errors: kModelLoad naming the file (and tensor)
  /// for missing/corrupt files, unknown families, wrong shapes or dtypes, an
  /// unsupported Options::dtype.
  static Result<std::unique_ptr<Model>> load(const Options& options);

  virtual ~Model() = default;
  virtual const ModelConfig& config() const = 0;
  virtual std::int64_t parameter_count() const = 0;
  /// The tokenizer that goes with the model.
  virtual const Tokenizer& tokenizer() const = 0;

  /// A KV cache for `capacity_tokens` tokens (1..n_positions). Without a
  /// block pool it is one block of exactly that many tokens, allocated now
  /// through the device's allocator; with one (use_kv_pool), the blocks that
  /// hold them are taken from the pool and nothing is allocated. Errors:
  /// kInvalidRequest for a capacity outside the range, kOutOfMemory when the
  /// device (or the pool) cannot hold it.
  virtual Result<std::unique_ptr<KvCache>> new_cache(int capacity_tokens) = 0;

  /// new_cache(capacity_tokens), whose leading positions already hold the
  /// keys and values of the longest prefix of `prompt` in whole blocks that
  /// the pool's prefix cache holds (those blocks shared, not copied; at least
  /// the prompt's last token is left to compute): its length() says how many
  /// tokens that is (0 without a pool or prefix cache, or without a match).
  /// Errors: as new_cache. The default is new_cache.
  virtual Result<std::unique_ptr<KvCache>> new_cache_for_prompt(int capacity_tokens,
                                                               std::span<const std::int32_t> prompt);

  /// Allocates a pool of KV blocks on the device (options.blocks x the bytes
  /// of one block, kv_pool_counts()) that the caches made afterwards take
  /// their blocks from; caches made before keep theirs. A later call replaces
  /// the pool for later caches and drops the decode graphs (they read the
  /// old pool). Errors: kInvalidRequest for options outside
  /// their ranges or a model without a KV cache, kOutOfMemory when the device
  /// cannot hold the pool. The default refuses (kInvalidRequest).
  virtual Status use_kv_pool(const KvPoolOptions& options);
  /// Makes the pool `blocks` blocks large, keeping every cache's keys and
  /// values (they are renumbered; the caches' blocks in use and as many
  /// cached blocks as fit are copied through host memory, the old storage
  /// freed before the new one is allocated): to give memory back when the
  /// budget falls, and take it again when it rises. No step may run
  /// meanwhile. Errors: kInvalidRequest without a pool, for `blocks` < 1 or
  /// fewer blocks than are in use; kOutOfMemory when the device cannot hold
  /// the new size (the pool keeps its old size and contents; if even that
  /// cannot be allocated again, the pool holds nothing and its caches must
  /// not be stepped again). The default refuses.
  virtual Status resize_kv_pool(std::int64_t blocks);
  /// Blocks of the pool (nullopt: no pool). The default has none.
  virtual std::optional<KvBlockCounts> kv_pool_counts() const;
  /// Cached blocks the pool evicted so far (0: none, or no pool).
  virtual std::int64_t kv_blocks_evicted() const;
  /// Device bytes of one block of the pool (0: no pool). The default has none.
  virtual std::int64_t kv_block_bytes() const;
  /// Gives `cache` blocks from its pool until it holds `capacity_tokens`
  /// (<= n_positions); a smaller capacity changes nothing. Errors:
  /// kInvalidRequest for a cache of another model, outside a pool, or a
  /// capacity past n_positions; kOutOfMemory when the pool has too few free
  /// blocks (the cache is left as it was). The default refuses.
  virtual Status grow_cache(KvCache& cache, int capacity_tokens);

  /// Makes `to` hold the same cached tokens as `from` (a prompt prefilled
  /// once, shared by the n choices of a request), `to` having none yet. In
  /// one pool, `to` shares from's full blocks (no copy; neither cache ever
  /// writes a shared block, since both write past their length only) and gets
  /// a copy of the partly filled last one; otherwise every layer's cached
  /// positions are copied. Errors: kInvalidRequest for caches of another
  /// model, a `to` that holds tokens, or one too small.
  virtual Status copy_cache(const KvCache& from, KvCache& to) = 0;

  /// Runs one step over several sequences (prefill chunks and/or single decode
  /// tokens) as one batched forward pass, appending to each cache. Returns, per
  /// input, the logits of its last token ([vocab_size] float32), or with
  /// all_logits those of each of its tokens ([tokens * vocab_size], row-major). Errors:
  /// kOutOfMemory (the caches are left as before the step), kInvalidRequest
  /// when a cache would overflow, kInternal for other libtorch errors.
  virtual Result<std::vector<std::vector<float>>> step(std::span<const StepInput> inputs) = 0;

  /// A decode step: every input one token with a cache (no all_logits), and
  /// specs[i] how input i picks its next token. Returns one SampledToken per
  /// input, in input order; only the picks come back to the host. Errors: as
  /// step(), and kInvalidRequest for a prefill input or specs of another
  /// length (the caches are left as before). The default runs step() and
  /// each row's Sampler::sample on the host; decoder models (decoder.hpp)
  /// pad the step to a batch bucket with fixed shapes and sample on the
  /// device (model/device_sampler.hpp), with the same picks on the CPU
  /// device.
  virtual Result<std::vector<SampledToken>> decode_step(std::span<const StepInput> inputs,
                                                        std::span<const SampleSpec> specs);
  /// Whether decode_step() pads its batch to the next power of two (static
  /// shapes), so that a batch costs the workspace and time of its padded
  /// rows. The default does not.
  virtual bool pads_decode_batch() const;

  /// Records decode steps as graphs (DecodeGraphKind), one per batch
  /// bucket up to options.max_batch and per key bucket up to a full
  /// context, largest first, over the KV block pool as it is now (graphs
  /// read its addresses: resize_kv_pool() records them again). decode_step()
  /// then copies a step's inputs into its graph's buffers and replays it
  /// where one matches; other steps run eagerly. Replaces graphs recorded
  /// before. Every recording runs on one thread of the model's, whichever
  /// thread calls (device/step_graph.hpp, record_on_one_thread). Returns
  /// what the graphs hold; DecodeGraphStats::bytes is the device memory they
  /// took from the allocator (the graphs' pool and buffers, the recording
  /// thread's workspace the first time), which the caller charges to the
  /// budget, and outside_bytes what appeared outside it. Errors:
  /// kInvalidRequest without a pool or off the tensor path; kInternal after
  /// a recording that failed (none is tried again: a failed capture may leave
  /// state behind that only eager work is known to be safe with);
  /// the device's error (kOutOfMemory, ...) while recording, with no graph
  /// kept. After the pool moved, a recording that fails is not tried again:
  /// decode steps run eagerly for the life of the model. The default
  /// refuses (kInvalidRequest).
  virtual Result<DecodeGraphStats> record_decode_graphs(const DecodeGraphOptions& options);
  /// Frees every recorded graph (decode steps run eagerly), and a later
  /// resize_kv_pool() records none. The default has none.
  virtual void drop_decode_graphs();
  /// The graphs held and the steps that replayed one. The default has none.
  virtual DecodeGraphStats decode_graph_stats() const;

  /// Logits for every position of `tokens` in one full forward pass without a
  /// cache: [tokens.size() * vocab_size], row-major. For tests and checks.
  virtual Result<std::vector<float>> forward_full(std::span<const std::int32_t> tokens) = 0;
};

/// Checks decode_step()'s arguments: as many specs as inputs, each input
/// one token without all_logits, each spec with a sampler. Errors:
/// kInvalidRequest naming the first input that is not.
Status check_decode_inputs(std::span<const StepInput> inputs, std::span<const SampleSpec> specs);

}  // namespace vg
