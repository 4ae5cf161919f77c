// CompletionChoices: the choices of one completion request (POST
// /v1/completions, /infer, /v1/chat/completions) as its engine events
// arrive: each choice's text, logprobs, text offsets and finish reason and,
// when streaming, the SSE chunks that carry them; then the final SSE chunks
// or the JSON body. No I/O; used on the connection's strand. Internal to
// src/http.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "api/events.hpp"
#include "api/types.hpp"
#include "common/clock.hpp"

namespace vg::httpd {

/// What the engine said about one completion request so far.
struct CompletionOutcome {
  double queue_ms = 0;  ///< from its StartedEvent
  std::optional<FinishedEvent> finished;
  std::optional<FailedEvent> failed;
  bool ended() const { return finished || failed; }
};

class CompletionChoices {
 public:
  /// `chat`: chat.completion objects instead of text_completion ones;
  /// `echo_text`: the prompt as text, for echo; `keep_text`: keep a stream's
  /// text too (for the request log).
  CompletionChoices(const CompletionRequest& request, bool chat, std::string id, std::string model,
                    std::string echo_text, bool keep_text);

  /// The response's id ("cmpl-..." or "chatcmpl-...").
  const std::string& id() const { return id_; }

  /// Applies `events` in order, up to the one that ends the request, to the
  /// choices and `out`; streaming, appends their SSE to `sse`. Says whether
  /// one of them was other than a failure (an engine accepted the request).
  bool apply(std::vector<EngineEvent> events, std::string& sse, CompletionOutcome& out);

  /// Gives `fin`'s finish reason to the choice it ends (the first when it
  /// names none); returns that choice's index.
  int finish(const FinishedEvent& fin);
  /// Streaming, after finish(): the chunk ending choice `last`, the usage
  /// (in it, or with include_usage in a chunk of its own) and [DONE].
  std::string stream_tail(int last, const FinishedEvent& fin);
  /// Not streaming, after finish(): the chat or completion body, with every
  /// choice. Moves the choices' text out.
  std::string body(const FinishedEvent& fin);
  /// /infer, after finish(): the short body of the first choice, `queue_ms`
  /// and the latency since `start`. Moves its text out.
  std::string infer_body(const FinishedEvent& fin, TimePoint start, double queue_ms);

  /// The first choice's text: all of it unless streaming without keep_text.
  const std::string& first_text() const { return choices_.front().text; }

 private:
  struct Choice {
    std::string text;  // non-streaming (and logged): all of it
    std::vector<TokenLogprobs> logprobs;
    std::vector<std::int64_t> offsets;
    std::int64_t chars = 0;  // characters of its tokens so far
    std::optional<std::string> finish_reason;
    bool echoed = false;
    bool role_sent = false;  // chat chunks: the first says role "assistant"
    bool announced = false;  // a chunk of its text was sent
  };

  void apply_one(EngineEvent& event, std::string& sse, CompletionOutcome& out);
  /// An SSE chunk of choice `index`.
  std::string chunk(int index, std::optional<std::string> text, std::vector<TokenLogprobs>* lp,
                    std::vector<std::int64_t> offsets, std::optional<std::string> finish, std::optional<Usage> usage);
  /// Records `text` and its tokens' logprobs for choice `index` (and, streaming, its chunk).
  void add(std::string& sse, int index, std::string text, std::vector<TokenLogprobs> lp);
  /// echo: the prompt first, in every choice not yet echoed (with its logprobs when given).
  void echo(std::string& sse, const std::vector<TokenLogprobs>* prompt_lp);
  bool has_choice(int index) const;
  Choice& at(int index) { return choices_[static_cast<std::size_t>(index)]; }
  /// The choice's logprobs for the body: nullopt unless asked for.
  std::optional<std::vector<TokenLogprobs>> take_logprobs(Choice& c) const;

  const std::string id_;
  const std::string model_;
  const std::int64_t created_;
  const std::string echo_text_;
  const bool chat_;
  const bool stream_;
  const bool echo_;
  const bool logprobs_;
  const bool echo_waits_;  // the prompt's logprobs come with a PromptEvent
  const bool include_usage_;
  const bool keep_text_;
  std::vector<Choice> choices_;
};

}  // namespace vg::httpd
