// What a step's tokens become: the events of each generated token (text,
// logprobs, metrics), and the end of a sequence (finished or failed, its KV
// cache and lease released, the request counted once). Engine thread (and the prefill worker for the
// sequences it holds); see engine_impl.hpp for who owns what.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>

#include "device/device.hpp"
#include "engine/engine_impl.hpp"
#include "metrics/server_metrics.hpp"
#include "model/logprobs.hpp"
#include "tokenizer/tokenizer.hpp"

namespace vg {


void Engine::Impl::on_token(Sequence& s, std::int32_t token, TimePoint now, std::span<const float> logits) {
  SampledToken pick{token, std::all_of(logits.begin(), logits.end(), [](float x) { return std::isfinite(x); }), {}};
  if (s.req->gen.logprobs) pick.logprobs = token_logprobs(logits, token, *s.req->gen.logprobs);
  on_token(s, std::move(pick), now);
}

void Engine::Impl::on_token(Sequence& s, SampledToken pick, TimePoint now) {
  const bool injected = options.test_poison_logits_at_step > 0 && steps_run.load() == options.test_poison_logits_at_step;
  if (injected || !pick.finite) {
    const std::string reason = "the logits of request " + s.req->gen.id + " at step " +
                               std::to_string(steps_run.load()) + " are not finite (NaN or Inf)" +
                               (injected ? " (test hook)" : "");
    spdlog::error("engine on {}: {}", device.name(), reason);
    if (options.on_poisoned) options.on_poisoned(reason);
    fail(s, Error(ErrorCode::kInternal, reason + "; the device state is not trusted"));
    return;
  }
  const std::int32_t token = pick.id;
  s.p.generated.push_back(token);
  ++s.p.unsent_tokens;
  const Tokenizer& tok = model.tokenizer();
  const bool ends = tok.is_eos(token) && !s.req->gen.ignore_eos;
  if (pick.logprobs && !ends) {
    const LogprobResult& lp = *pick.logprobs;
    TokenLogprobs entry{tok.token_bytes(token), lp.logprob, {}};
    for (const TokenLogprob& alt : lp.top) entry.top.emplace_back(tok.token_bytes(alt.id), alt.logprob);
    s.p.unsent_logprobs.push_back(std::move(entry));
  }
  const int generated = s.generated();
  if (options.metrics) {
    options.metrics->generated_tokens_total.inc();
    if (generated == 1) {
      // One sample per request: its first token, whichever choice has it.
      if (!s.req->group || s.req->group->first_token()) {
        options.metrics->time_to_first_token_seconds.observe(seconds_between(s.req->enqueued, now));
      }
    } else {
      options.metrics->inter_token_latency_seconds.observe(seconds_between(s.p.last_token, now));
    }
  }
  s.p.last_token = now;
  if (generated == 1) log_memory(*s.req, "first token");
  if (ends) {
    finish(s, "stop");
    return;
  }
  std::string text = s.p.text.push(tok.token_bytes(token));
  // The first token is always announced, even when its bytes are held back
  // (part of a character or of a stop string): streams show time to first
  // token as it is.
  if (!text.empty() || generated == 1) {
    s.req->sink->push(TextEvent{std::move(text), s.p.unsent_tokens, s.req->choice, std::move(s.p.unsent_logprobs),
                                s.unsent_ids()});
    s.p.unsent_tokens = 0;
    s.p.unsent_logprobs.clear();
  }
  if (s.p.text.stopped()) {
    finish(s, "stop");
  } else if (generated >= s.req->gen.max_tokens) {
    finish(s, "length");
  } else {
    s.next_token = token;
  }
}

void Engine::Impl::finish(Sequence& s, const char* reason) {
  std::string tail = s.p.text.finish();
  if (!tail.empty() || s.p.unsent_tokens > 0) {
    s.req->sink->push(TextEvent{std::move(tail), s.p.unsent_tokens, s.req->choice, std::move(s.p.unsent_logprobs),
                                s.unsent_ids()});
    s.p.unsent_tokens = 0;
    s.p.unsent_logprobs.clear();
  }
  const TimePoint now = Clock::now();
  FinishedEvent ev;
  ev.finish_reason = reason;
  ev.usage = {s.req->prompt_tokens(), s.generated()};
  ev.timings = s.timings(now);
  s.done = true;
  if (pooled()) output_lengths.record(s.generated());
  release_kv(s);
  count_end(*s.req, nullptr, s.generated(), now);
  log_memory(*s.req, "finish");
  s.req->sink->push(std::move(ev));
}

void Engine::Impl::fail(Sequence& s, Error error) {
  if (s.done) return;
  const TimePoint now = Clock::now();
  s.done = true;
  release_kv(s);
  count_end(*s.req, &error, s.generated(), now);
  if (error.code == ErrorCode::kCancelled) {
    spdlog::info("request {} stopped after {} tokens: client closed", s.req->gen.id, s.generated());
  } else {
    spdlog::warn("request {} failed: {}", s.req->gen.id, error.message);
  }
  log_memory(*s.req, "finish");
  FailedEvent ev{std::move(error), {s.req->prompt_tokens(), s.generated()}};
  ev.timings = s.timings(now);
  s.req->sink->push(std::move(ev));
}

void Engine::Impl::count_end(const Request& r, const Error* error, int generated, TimePoint now) {
  const bool request_ends = !r.group || r.group->ends_request(error == nullptr);
  {
    std::lock_guard lk(shared->mu);
    shared->stats.generated_tokens += generated;
    if (request_ends && r.admitted) {
      if (!error)
        ++shared->stats.counters[CounterId::kCompleted];
      else if (error->code == ErrorCode::kCancelled)
        ++shared->stats.counters[CounterId::kCancelled];
      else
        ++shared->stats.counters[CounterId::kFailed];
    }
  }
  if (!request_ends) return;
  // The drain rate counts requests freed, as Retry-After counts the
  // requests ahead: one per request, whatever its n.
  if (!error) admission->record_completion(now);
  observe_end(r, now);
}

}  // namespace vg
