// CompletionChoices (see completion_choices.hpp).
#include "http/completion_choices.hpp"

#include <algorithm>
#include <chrono>
#include <utility>
#include <variant>

#include "http/chat_codec.hpp"
#include "http/json_codec.hpp"
#include "http/json_fields.hpp"

namespace vg::httpd {
namespace {

std::int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

CompletionChoices::CompletionChoices(const CompletionRequest& request, bool chat, std::string id, std::string model,
                                     std::string echo_text, bool keep_text)
    : id_(std::move(id)),
      model_(std::move(model)),
      created_(unix_now()),
      echo_text_(std::move(echo_text)),
      chat_(chat),
      stream_(request.stream),
      echo_(request.echo),
      logprobs_(request.logprobs.has_value()),
      echo_waits_(request.echo && request.logprobs.has_value()),
      include_usage_(request.include_usage),
      keep_text_(!request.stream || keep_text),
      choices_(static_cast<std::size_t>(std::max(1, request.n))) {}

bool CompletionChoices::apply(std::vector<EngineEvent> events, std::string& sse, CompletionOutcome& out) {
  bool progress = false;
  for (EngineEvent& event : events) {
    if (out.ended()) break;
    if (!std::holds_alternative<FailedEvent>(event)) progress = true;
    apply_one(event, sse, out);
  }
  return progress;
}

void CompletionChoices::apply_one(EngineEvent& event, std::string& sse, CompletionOutcome& out) {
  if (echo_ && !echo_waits_ && !std::holds_alternative<QueuedEvent>(event)) echo(sse, nullptr);
  if (const auto* q = std::get_if<QueuedEvent>(&event)) {
    if (stream_) sse += ": queue position " + std::to_string(q->position) + "\n\n";
  } else if (const auto* s = std::get_if<StartedEvent>(&event)) {
    out.queue_ms = s->queue_ms;
  } else if (auto* pe = std::get_if<PromptEvent>(&event)) {
    if (echo_) echo(sse, &pe->logprobs);
  } else if (auto* t = std::get_if<TextEvent>(&event)) {
    if (has_choice(t->choice)) add(sse, t->choice, std::move(t->text), std::move(t->logprobs));
  } else if (auto* ce = std::get_if<ChoiceEndEvent>(&event)) {
    if (!has_choice(ce->choice)) return;
    at(ce->choice).finish_reason = ce->finish_reason;
    if (stream_) sse += chunk(ce->choice, std::nullopt, nullptr, {}, ce->finish_reason, std::nullopt);
  } else if (auto* f = std::get_if<FinishedEvent>(&event)) {
    if (echo_) echo(sse, nullptr);  // a request that failed to send its prompt logprobs still echoes
    out.finished = std::move(*f);
  } else if (auto* e = std::get_if<FailedEvent>(&event)) {
    out.failed = std::move(*e);
  }
}

bool CompletionChoices::has_choice(int index) const {
  return index >= 0 && static_cast<std::size_t>(index) < choices_.size();
}

std::string CompletionChoices::chunk(int index, std::optional<std::string> text, std::vector<TokenLogprobs>* lp,
                                     std::vector<std::int64_t> offsets, std::optional<std::string> finish,
                                     std::optional<Usage> usage) {
  Choice& c = at(index);
  std::optional<std::vector<TokenLogprobs>> entries;
  if (logprobs_) entries = lp ? std::move(*lp) : std::vector<TokenLogprobs>();
  if (chat_) {
    ChatResponse r{id_, model_, created_, true, {}, std::move(usage), include_usage_};
    r.choices.push_back(
        ChatChoice{index, !std::exchange(c.role_sent, true), std::move(text), std::move(finish), std::move(entries)});
    return sse_data(encode_chat_response(r));
  }
  CompletionResponse r{id_, model_, created_, {}, std::move(usage), include_usage_};
  r.choices.push_back(
      CompletionChoice{index, text.value_or(std::string()), std::move(finish), std::move(entries), std::move(offsets)});
  return sse_data(encode_completion_response(r));
}

void CompletionChoices::add(std::string& sse, int index, std::string text, std::vector<TokenLogprobs> lp) {
  Choice& c = at(index);
  std::vector<std::int64_t> offsets;
  for (const TokenLogprobs& t : lp) {
    offsets.push_back(c.chars);
    c.chars += json_fields::text_chars(t.token);
  }
  if (keep_text_) c.text += text;
  // A chunk with nothing in it is sent only as a choice's first (its first
  // token is announced even when its bytes are held back).
  if (stream_ && (!text.empty() || !lp.empty() || !std::exchange(c.announced, true))) {
    c.announced = true;
    sse += chunk(index, std::move(text), &lp, std::move(offsets), std::nullopt, std::nullopt);
  } else if (!stream_ && logprobs_) {
    c.offsets.insert(c.offsets.end(), offsets.begin(), offsets.end());
    for (TokenLogprobs& t : lp) c.logprobs.push_back(std::move(t));
  }
}

void CompletionChoices::echo(std::string& sse, const std::vector<TokenLogprobs>* prompt_lp) {
  for (std::size_t i = 0; i < choices_.size(); ++i) {
    if (std::exchange(choices_[i].echoed, true)) continue;
    add(sse, static_cast<int>(i), echo_text_, prompt_lp ? *prompt_lp : std::vector<TokenLogprobs>());
    choices_[i].chars = json_fields::text_chars(echo_text_);
  }
}

int CompletionChoices::finish(const FinishedEvent& fin) {
  const int last = has_choice(fin.choice) ? fin.choice : 0;
  at(last).finish_reason = fin.finish_reason;
  return last;
}

std::string CompletionChoices::stream_tail(int last, const FinishedEvent& fin) {
  std::string tail = chunk(last, std::nullopt, nullptr, {}, fin.finish_reason,
                           include_usage_ ? std::nullopt : std::optional<Usage>(fin.usage));
  if (include_usage_) {
    tail +=
        sse_data(chat_ ? encode_chat_response(ChatResponse{id_, model_, created_, true, {}, fin.usage, false})
                       : encode_completion_response(CompletionResponse{id_, model_, created_, {}, fin.usage, false}));
  }
  return tail + sse_data("[DONE]");
}

std::optional<std::vector<TokenLogprobs>> CompletionChoices::take_logprobs(Choice& c) const {
  std::optional<std::vector<TokenLogprobs>> lp;
  if (logprobs_) lp = std::move(c.logprobs);
  return lp;
}

std::string CompletionChoices::body(const FinishedEvent& fin) {
  if (chat_) {
    ChatResponse r{id_, model_, created_, false, {}, fin.usage, false};
    for (std::size_t i = 0; i < choices_.size(); ++i) {
      Choice& c = choices_[i];
      r.choices.push_back(ChatChoice{static_cast<int>(i), true, std::move(c.text), c.finish_reason, take_logprobs(c)});
    }
    return encode_chat_response(r);
  }
  CompletionResponse r{id_, model_, created_, {}, fin.usage, false};
  for (std::size_t i = 0; i < choices_.size(); ++i) {
    Choice& c = choices_[i];
    r.choices.push_back(CompletionChoice{static_cast<int>(i), std::move(c.text), c.finish_reason, take_logprobs(c),
                                         std::move(c.offsets)});
  }
  return encode_completion_response(r);
}

std::string CompletionChoices::infer_body(const FinishedEvent& fin, TimePoint start, double queue_ms) {
  return encode_infer_response(
      {std::move(choices_.front().text), ms_between(start, Clock::now()), queue_ms, fin.finish_reason, fin.usage});
}

}  // namespace vg::httpd
