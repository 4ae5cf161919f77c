// The API boundary's plain request/response structs, between the HTTP layer
// and a Service (api/service.hpp). src/http decodes JSON into these and
// encodes these into JSON, src/wire carries them between a gateway and an
// engine process; nothing here knows about JSON, Beast or libtorch.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "api/chat.hpp"
#include "api/counters.hpp"
#include "api/retry.hpp"
#include "api/sampling.hpp"
#include "api/tensor.hpp"
#include "common/error.hpp"
#include "common/priority.hpp"

namespace vg {

/// The chat part of a POST /v1/chat/completions request.
struct ChatPrompt {
  std::vector<ChatMessage> messages;
  /// Request field `chat_template`: a format name or a Jinja template to
  /// recognise; empty: the server's --chat-template, else the model's own.
  std::string chat_template;
};

/// Where a request's max_tokens comes from (CompletionRequest::max_tokens_from).
enum class MaxTokensFrom {
  kRequest,        ///< the request's max_tokens (or the completions default, 16)
  kRestOfContext,  ///< the context length less the prompt's tokens
};

/// A completion request (OpenAI /v1/completions or the short /infer form),
/// already type-checked and range-checked by the decoder.
struct CompletionRequest {
  std::string request_id;  ///< X-Request-Id, set by the HTTP layer
  std::string model;  ///< empty: the default model
  /// Text, or token ids (OpenAI allows a list of integers).
  std::variant<std::string, std::vector<std::int32_t>> prompt;
  int max_tokens = 16;  ///< OpenAI's default when absent (completions)
  /// Where max_tokens comes from: the request (or the completions default),
  /// or the context left after the prompt (a chat request without max_tokens,
  /// as OpenAI and vLLM: generate until end-of-sequence or the context).
  /// fit_max_tokens() resolves it once the prompt's tokens are known.
  MaxTokensFrom max_tokens_from = MaxTokensFrom::kRequest;
  SamplingParams sampling;
  std::vector<std::string> stop;  ///< up to 4 stop strings, none empty
  bool stream = false;
  /// Keep generating past end-of-text until max_tokens (vLLM's extension).
  bool ignore_eos = false;
  /// Total deadline override in seconds (vramgate extension `timeout`).
  std::optional<double> timeout_s;
  /// A chat request: the service renders `chat` with the model's chat
  /// template into the prompt (`prompt` is unused).
  std::optional<ChatPrompt> chat;
  /// Admission class (vramgate extension `priority`: "low", "normal", "high"
  /// or 0..2); the HTTP layer resolves it with X-Priority and the API key's cap.
  std::optional<Priority> priority;
  /// Choices to generate (OpenAI n), 1..--max-n.
  int n = 1;
  /// Alternatives reported per token (completions `logprobs` 0..20; chat
  /// `top_logprobs` with `logprobs: true`); nullopt: no logprobs.
  std::optional<int> logprobs;
  /// Completions `echo`: the prompt precedes each choice's text (and, with
  /// logprobs, the prompt tokens' logprobs come first). max_tokens may be 0.
  bool echo = false;
  /// stream_options.include_usage: a last chunk with usage and no choices.
  bool include_usage = false;
  /// Set by the HTTP layer: recognises the retry of a booked refusal, and
  /// books a place for this request's retry if it is refused as overloaded.
  RetryIdentity retry;
};

/// The max_tokens of `request` once its prompt is known to take
/// `prompt_tokens` of a context of `context_length` tokens (<= 0: unknown,
/// nothing checked): MaxTokensFrom::kRestOfContext gives what the context
/// leaves. Errors: kInvalidRequest (exceeds_context_length, naming `model`)
/// when prompt + max_tokens exceed the context, or a chat prompt leaves no token.
inline Result<int> fit_max_tokens(const CompletionRequest& request, std::int64_t prompt_tokens,
                                  std::int64_t context_length, const std::string& model) {
  std::int64_t max_tokens = request.max_tokens;
  if (request.max_tokens_from == MaxTokensFrom::kRestOfContext && context_length > 0) {
    if (prompt_tokens >= context_length) {
      return Error(ErrorCode::kInvalidRequest,
                   "prompt (" + std::to_string(prompt_tokens) + " tokens) fills the context length of model '" + model +
                       "' (" + std::to_string(context_length) + " tokens): no token is left to generate");
    }
    max_tokens = context_length - prompt_tokens;
  }
  if (context_length > 0 && prompt_tokens + max_tokens > context_length) {
    return exceeds_context_length(prompt_tokens, max_tokens, model, context_length);
  }
  return static_cast<int>(max_tokens);
}

/// Where a request continues that already ran elsewhere: a gateway
/// resubmitting it after its engine process died, or a Redis engine taking
/// over another engine's request (Service::submit_resumed). Not part of
/// the API: it travels beside the request (wire::Submit::resume).
struct ResumeFrom {
  /// The tokens of choice 0 already sent to the client, in order: the
  /// engine prefills prompt + these and goes on from there, as after a
  /// preemption. Empty: from the start.
  std::vector<std::int32_t> tokens{};
  bool prompt_sent = false;  ///< the prompt's logprobs were sent (not again)
  /// An engine admitted it before (its start was counted): it counts as
  /// granted again, not admitted again.
  bool admitted_before = false;
};

/// A KServe v2 inference request (POST /v2/models/{name}/infer), decoded
/// and type-checked by the HTTP layer; the service checks it against the model.
struct TensorInferRequest {
  std::string request_id;  ///< X-Request-Id
  std::string model;       ///< from the path
  std::string id;          ///< the request body's optional "id", echoed in the response
  std::vector<HostTensor> inputs;
  std::vector<std::string> dtypes;  ///< each input's "datatype", parallel to inputs
  /// Names of the outputs to return (the body's "outputs"); empty: all.
  std::vector<std::string> outputs;
  /// Binary tensor extension (HTTP only; the service ignores these): the
  /// outputs asked for with "binary_data": true, and the request parameter
  /// "binary_data_output": true (every output as raw bytes).
  std::vector<std::string> binary_outputs;
  bool all_outputs_binary = false;
  std::optional<double> timeout_s;  ///< vramgate parameter "timeout" (seconds)
  std::optional<Priority> priority;
};

/// A request's outputs, in the declared order, and where its time went.
struct TensorResult {
  std::vector<HostTensor> outputs;  ///< cropped back to the request's own sizes when padded
  int batch_requests = 1;   ///< requests in the forward pass that computed it
  /// That pass's first input shape (rows summed, paddable dimensions padded).
  std::vector<std::int64_t> batch_shape;
  /// That pass's cost: tensor_cost over its (padded) input elements, bytes.
  std::int64_t batch_cost_bytes = 0;
  double queue_ms = 0;      ///< enqueue -> grant
  double compute_ms = 0;    ///< grant -> outputs (batching delay included)
};

/// Called exactly once per accepted request with its result or error
/// (kTimeout, kOverloaded + retry_after_s, kOutOfMemory under policy none,
/// kCancelled); on the engine thread or the cancelling thread. Must not block.
using TensorDone = std::function<void(Result<TensorResult>)>;

/// The submitter's handle: cancel() is thread-safe and idempotent (a queued
/// request is dropped at once, a granted one before its forward pass).
class TensorHandle {
 public:
  virtual ~TensorHandle() = default;
  virtual void cancel() = 0;
};

/// What GET /v2/models/{name} shows for a TorchScript model.
struct TensorModelInfo {
  std::string id;
  std::vector<std::string> devices;
  TensorModelSpec spec;
  TensorMemoryProfile profile;  ///< of its first device
  int max_batch = 1;            ///< requests one forward pass may batch (--max-batch and the batch dimension)
  std::int64_t budget_bytes = 0;  ///< the largest device budget serving it
};

/// What /v1/models shows for one model.
struct ModelInfo {
  std::string id;
  std::string family;
  std::string dtype;
  int context_length = 0;
  std::int64_t parameter_count = 0;
  std::string device;                ///< the first device serving it
  std::vector<std::string> devices;  ///< every device serving it (one replica each)
  std::int64_t resident_bytes = 0;   ///< its weights on one device
  std::int64_t created = 0;  ///< unix seconds (server start)
  // Memory profile measured at start-up (bytes).
  std::int64_t workspace_bytes = 0;
  std::int64_t kv_bytes_per_token = 0;
  std::int64_t sequence_overhead_bytes = 0;
  double safety_factor = 1.0;
  // How its prompts are encoded (language models; not shown by /v1/models):
  // a gateway reads the tokenizer and chat template from `dir` and encodes
  // prompts itself (tokenizer/prompt_encoder.hpp).
  std::string dir;            ///< the folder it was loaded from, absolute
  int vocab_size = 0;         ///< config.json vocab_size
  int eos_token_id = -1;      ///< config.json eos_token_id; -1: none
};

/// Sequences that may run at once when nothing limits them: an engine under
/// --admission none, or a gateway's count of the free slots of an engine
/// whose devices report no max_running. Far above any real batch, and small
/// enough to add to and subtract from as an int.
inline constexpr int kUnlimitedRunning = 1 << 20;

/// One device's memory and admission numbers, in bytes.
struct DeviceState {
  std::string name;
  std::int64_t capacity_bytes = 0;
  std::int64_t budget_bytes = 0;    ///< what admission may hand to requests
  std::int64_t effective_budget_bytes = 0;  ///< budget after other processes' bytes and OOM-governor cuts
  std::int64_t reserved_bytes = 0;  ///< held by leases now
  std::int64_t used_bytes = 0;      ///< in use on the device now (CUDA: total - free, so cached segments count)
  std::int64_t peak_bytes = 0;      ///< highest used since start
  std::int64_t allocated_bytes = 0; ///< held by live tensors now (virtual: = used_bytes)
  std::int64_t cache_reserved_bytes = 0;  ///< held by the caching allocator, allocated or cached (virtual: = allocated)
  /// In use on the device but not by this process's allocator: other
  /// processes (on CUDA also this process's context). The effective budget
  /// leaves them out.
  std::int64_t foreign_bytes = 0;
  std::int64_t resident_bytes = 0;  ///< weights and buffers of the models on it
  std::int64_t workspace_bytes = 0; ///< activations of the largest step, set aside once
  std::int64_t peak_reserved_bytes = 0;  ///< highest reserved_bytes since start
  bool ready = true;  ///< false while not serving: state not_ready or unhealthy
  /// "ready"; "not_ready" (repeated out-of-memory errors: no new work for a
  /// quiet period); "unhealthy" (failed at start-up: excluded).
  std::string state = "ready";
  std::string reason;  ///< why it is not ready or unhealthy; empty when ready
  std::vector<std::string> models;  ///< the models served on it
  int running = 0;                  ///< sequences running on it now
  /// Sequences its language engines may run at once (max_batch per model);
  /// 0: unknown. Carried to gateways, which place by free sequence slots.
  int max_running = 0;
  /// Counters since its engines started (api/counters.hpp kDeviceCounters);
  /// a gateway carries them across engine restarts.
  DeviceCounters counters;
  // Its paged KV cache (docs/admission-and-memory.md "KV blocks"), when its
  // language model holds one; kv_reservation is empty otherwise.
  std::string kv_reservation;         ///< "on-demand" or "full"
  int kv_block_tokens = 0;            ///< positions per block
  std::int64_t kv_block_bytes = 0;    ///< device bytes of one block
  std::int64_t kv_blocks_total = 0;   ///< blocks in the pool now (it follows the effective budget)
  std::int64_t kv_blocks_used = 0;    ///< held by running sequences
  std::int64_t kv_blocks_cached = 0;  ///< kept for the prefix cache, given out when needed
  /// Blocks neither used nor cached.
  std::int64_t kv_blocks_free() const {
    const std::int64_t free = kv_blocks_total - kv_blocks_used - kv_blocks_cached;
    return free > 0 ? free : 0;
  }
};

/// One request waiting in the admission queue (GET /v1/admission `waiting`).
struct WaitingRequest {
  int position = 0;             ///< 1-based, in grant order
  std::int64_t cost_bytes = 0;  ///< what it will reserve
  double waited_s = 0;          ///< time in the queue so far
  std::string priority;         ///< "low", "normal" or "high"
};

/// One engine process as GET /v1/engines shows it (multi-process mode; in
/// one process a single "in-process" entry).
struct EngineInfo {
  std::string address;  ///< "unix:PATH", or "in-process"
  std::string device;   ///< the device(s) it serves, comma-separated
  std::vector<std::string> models;
  std::int64_t pid = 0;  ///< 0 while no process runs
  /// starting, ready, not_ready (connected, but its device refuses work),
  /// restarting (it died; a new one is due or loading), gone (an engine this
  /// gateway does not start is unreachable).
  std::string state;
  int restarts = 0;
  double started_at = 0;  ///< unix seconds of the current process's start (0: none)
  std::string last_exit;  ///< "exit N", "signal N" or "no heartbeat for S s"; empty: never exited
  std::string reason;     ///< why it is not ready; empty when ready
  // Engines seen through the shared queue (Redis mode) only:
  std::string host;                               ///< where it runs
  std::optional<std::int64_t> free_budget_bytes;  ///< its largest device budget not reserved now
  std::optional<double> last_heartbeat_s;         ///< seconds since its last registration
  int running = 0;                                ///< sequences running on it
};

/// What GET /v1/admission shows.
struct AdmissionState {
  std::string policy;
  std::vector<DeviceState> devices;
  int queue_depth = 0;  ///< requests waiting for admission (not grantable now)
  int queued = 0;       ///< every queue entry, those an engine takes at its next turn included
  /// The first kMaxWaitingShown queue entries, in grant order.
  std::vector<WaitingRequest> waiting{};
  static constexpr std::size_t kMaxWaitingShown = 64;
  int running = 0;
  bool draining = false;
  // Booked retries: places held now (open: occupying a queue place).
  int retry_bookings = 0;
  int retry_places = 0;
  /// Counters since start (api/counters.hpp): admission decisions, admitted
  /// requests by how they ended, out-of-memory errors, booked retries.
  Counters counters;
};

}  // namespace vg
