// What an engine tells a request's owner, and how: EngineEvent values pushed
// into the request's EventSink, in order, ending with exactly one terminal
// event (FinishedEvent or FailedEvent). Torch-free, Asio-free.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "common/error.hpp"

namespace vg {

/// Token counts, as in OpenAI's `usage`.
struct Usage {
  int prompt_tokens = 0;
  int completion_tokens = 0;
};

/// The request waits in the queue at `position` (1 = next).
struct QueuedEvent {
  int position = 0;
};

/// The request left the queue and holds its lease; compute starts.
struct StartedEvent {
  double queue_ms = 0;
};

/// One token's log-probability as the OpenAI API reports it (the
/// log-softmax of the raw logits; see model/logprobs.hpp).
struct TokenLogprobs {
  std::string token;               ///< the token's raw bytes (may be part of a UTF-8 character)
  std::optional<double> logprob{};  ///< nullopt: the first prompt token (nothing predicts it)
  /// The most likely tokens at this position, most likely first: raw bytes and logprob.
  std::vector<std::pair<std::string, double>> top{};
};

/// New generated text: valid UTF-8, never part of a stop string.
struct TextEvent {
  std::string text;
  int tokens = 0;  ///< tokens generated since the previous TextEvent
  int choice = 0;  ///< which of the request's n choices (0-based)
  /// With logprobs requested: one entry per token since the previous
  /// TextEvent of this choice (text may lag behind its tokens).
  std::vector<TokenLogprobs> logprobs{};
  /// The ids of those tokens, in order (token_ids.size() == tokens): what a
  /// gateway resubmits to resume the request on another engine.
  std::vector<std::int32_t> token_ids{};
};

/// The prompt's tokens with their logprobs (echo with logprobs): sent once,
/// when the prompt has been prefilled, before the first TextEvent.
struct PromptEvent {
  std::vector<TokenLogprobs> logprobs;
};

/// One choice of an n > 1 request ended (the others go on); the last
/// choice's end is the terminal FinishedEvent.
struct ChoiceEndEvent {
  int choice = 0;
  std::string finish_reason{};
};

/// Where a request's time went, in milliseconds. A request that ended early
/// has the phases it reached (0 for the others).
struct Timings {
  double queue_ms = 0;
  double prefill_ms = 0;
  double decode_ms = 0;
};

/// Generation ended normally. finish_reason: "stop" (end-of-text or a stop
/// string) or "length" (max_tokens or the context length).
struct FinishedEvent {
  std::string finish_reason;
  Usage usage;  ///< completion_tokens: of every choice together
  Timings timings{};
  int choice = 0;  ///< the choice whose end this is (the last to end)
};

/// Generation ended with an error (timeout, overload, out of memory...).
struct FailedEvent {
  Error error;
  Usage usage;
  Timings timings{};
};

using EngineEvent =
    std::variant<QueuedEvent, StartedEvent, TextEvent, PromptEvent, ChoiceEndEvent, FinishedEvent, FailedEvent>;

inline bool is_terminal(const EngineEvent& e) {
  return std::holds_alternative<FinishedEvent>(e) || std::holds_alternative<FailedEvent>(e);
}

/// Receives a request's events. push() is called from the engine thread, must
/// be thread-safe and must never block.
class EventSink {
 public:
  virtual ~EventSink() = default;
  virtual void push(EngineEvent event) = 0;
};

/// The submitter's handle on a request in an engine. cancel() is thread-safe
/// and idempotent: the engine drops the request if queued, or stops it at the
/// next step boundary, and then pushes a FailedEvent{kCancelled}.
class RequestHandle {
 public:
  virtual ~RequestHandle() = default;
  virtual void cancel() = 0;
  virtual const std::string& id() const = 0;
  /// Takes the request back while it waits for admission, so that it can be
  /// placed elsewhere (a gateway moving it to an engine where room freed):
  /// true, it left the queue, is not counted as cancelled and gets no
  /// further event; false (it was admitted, ended, or this kind of request
  /// cannot be taken back), it goes on as before. Thread-safe.
  virtual bool withdraw() { return false; }
};

}  // namespace vg
