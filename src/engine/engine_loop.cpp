// The engine thread: take admitted work -> prefill -> decode step over all
// running sequences -> emit -> retire, until shut down. See engine_impl.hpp
// for who owns what.
#include <spdlog/spdlog.h>

#include <algorithm>

#include "device/device.hpp"
#include "engine/engine_impl.hpp"
#include "metrics/server_metrics.hpp"
#include "model/tokenizer.hpp"

namespace vg {

using engine_detail::failed;
using engine_detail::kIdle;
using engine_detail::seconds_between;


void Engine::Impl::run() {
  DeviceScope scope(&device);
  while (wait_for_work()) {
    step_started.store(Clock::now().time_since_epoch().count(), std::memory_order_relaxed);
    oom_budget->on_tick(Clock::now());
    admit(Clock::now());
    if (prefill) collect_prefills(Clock::now());
    sweep_running(Clock::now());
    retire_done();
    if (prefill) hand_off_prefills();
    if (!running.empty()) run_step();
    retire_done();
    publish();
    if (options.step_delay_ms > 0 && !running.empty()) {
      std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(options.step_delay_ms));
    }
    step_started.store(kIdle, std::memory_order_relaxed);
  }
  cancel_everything();
  publish();
}

// Sleeps until there is something to do: running sequences, a wake-up
// (submit, cancel, lease release), the admission controller's next timer or
// the OOM governor's next raise. False when the engine is stopping.
bool Engine::Impl::wait_for_work() {
  auto next = admission->next_wakeup(Clock::now());
  if (auto raise = oom_budget->next_change(); raise && (!next || *raise < *next)) next = raise;
  std::unique_lock lk(shared->mu);
  if (const TimePoint until = shared->unready_until; until > Clock::now() && (!next || until < *next)) next = until;
  auto ready = [&] { return shared->stopping || shared->wake || !running.empty(); };
  if (!ready()) {
    shared->idle_cv.notify_all();
    if (next) {
      shared->cv.wait_until(lk, *next, ready);
    } else {
      shared->cv.wait(lk, ready);
    }
  }
  shared->wake = false;
  return !shared->stopping;
}

// Drops cancelled queued requests and expires those past their limits
// (either thread: the engine's or its prefill worker's; each request is
// dropped once).
void Engine::Impl::drop_queued(TimePoint now) {
  std::vector<std::shared_ptr<Request>> cancelled;
  {
    std::lock_guard lk(front->mu);
    for (auto& [id, r] : front->queued) {
      if (r->cancelled.load()) cancelled.push_back(r);
    }
  }
  std::vector<std::pair<std::shared_ptr<Request>, Error>> dropped;
  for (auto& r : cancelled) {
    if (admission->cancel(r->admission_id)) {
      dropped.emplace_back(r, Error(ErrorCode::kCancelled, "client closed the connection while queued"));
    }
  }
  for (AdmissionExpiry& e : admission->expire(now)) {
    std::lock_guard lk(front->mu);
    auto it = front->queued.find(e.id);
    if (it != front->queued.end()) dropped.emplace_back(it->second, std::move(e.error));
  }
  if (dropped.empty()) return;
  for (auto& [r, e] : dropped) front->take(r->admission_id);
  {
    std::lock_guard lk(shared->mu);
    for (auto& [r, e] : dropped) {
      if (e.code == ErrorCode::kCancelled) ++shared->stats.cancelled;
      else ++shared->stats.failed;
    }
  }
  for (auto& [r, e] : dropped) {
    if (e.code == ErrorCode::kCancelled) {
      spdlog::info("request {} cancelled while queued: client closed", r->gen.id);
    } else {
      spdlog::info("request {} left the queue: {}", r->gen.id, e.message);
    }
    observe_end(*r, now);
    FailedEvent ev = failed(*r, std::move(e));
    ev.timings.queue_ms = ms_between(r->enqueued, now);
    r->sink->push(std::move(ev));
  }
}

// Drops what may no longer start, then starts what admission grants.
void Engine::Impl::admit(TimePoint now) {
  drop_queued(now);
  // A paused engine (not ready) leaves its share of the queue to the others.
  const bool available = !paused(now);
  if (available != admission->engine_available(index)) {
    admission->set_engine_available(index, available);
    if (!available) front->notify_all();
  }
  const int free_slots = available ? std::max(0, max_running() - holding()) : 0;
  std::vector<AdmissionGrant> grants;
  if (free_slots > 0) grants = admission->grant(now, free_slots, index);
  {
    // Counted as running before they leave the queue, so that wait_idle()
    // never sees nothing queued and nothing running while they start.
    std::lock_guard lk(shared->mu);
    shared->stats.running = holding() + static_cast<int>(grants.size());
  }
  std::vector<std::pair<std::shared_ptr<Request>, AdmissionGrant>> started;
  for (AdmissionGrant& g : grants) {
    if (g.promise_error && options.metrics) {
      options.metrics->retry_promise_error_seconds.observe(std::chrono::duration<double>(*g.promise_error).count());
    }
    auto r = front->take(g.id);
    if (r) started.emplace_back(std::move(r), std::move(g));  // always found: registered before enqueue
  }
  for (auto& [r, g] : started) start_sequence(std::move(r), std::move(g.lease), now);
  report_queue_positions(now);
}

// Tells each waiting request its queue position when it changed (SSE
// clients see it as progress while they wait).
void Engine::Impl::report_queue_positions(TimePoint now) {
  {
    // Runs after every step: skip the admission snapshot when nobody waits.
    if (front->queued_count.load() == 0) return;
  }
  const AdmissionSnapshot snap = admission->snapshot(now);
  std::vector<std::pair<std::shared_ptr<Request>, int>> moved;
  {
    // Any engine of the front may report; the position is the shared queue's.
    std::lock_guard lk(front->mu);
    for (const QueuedView& q : snap.queue) {
      auto it = front->queued.find(q.id);
      if (it != front->queued.end() && it->second->reported_position != q.position) {
        it->second->reported_position = q.position;
        moved.emplace_back(it->second, q.position);
      }
    }
  }
  for (auto& [r, pos] : moved) r->sink->push(QueuedEvent{pos});
}

std::unique_ptr<Engine::Impl::Sequence> Engine::Impl::make_sequence(std::shared_ptr<Request> req, Lease lease,
                                                                   TimePoint now) {
  // A preempted request resumes with what it had produced; a new one starts.
  const bool resumed = req->resume.has_value();
  engine_detail::Progress progress =
      resumed ? std::move(*req->resume)
              : engine_detail::Progress(req->gen.sampling, req->gen.stop, now, ms_between(req->enqueued, now));
  req->resume.reset();
  auto seq = std::make_unique<Sequence>(std::move(req), std::move(lease), std::move(progress), now);
  if (!resumed) {
    if (options.metrics) options.metrics->queue_wait_seconds.observe(seq->p.queue_ms / 1000.0);
    seq->req->sink->push(StartedEvent{seq->p.queue_ms});
  }
  return seq;
}

std::optional<Error> Engine::Impl::open_sequence(Sequence& s) {
  if (s.req->cancelled.load()) return Error(ErrorCode::kCancelled, "client closed the connection");
  // The whole KV cache (prompt + max_tokens) is allocated now, inside the
  // lease, so that growth never fails mid-generation.
  auto cache = model.new_cache(s.req->prompt_tokens() + s.req->gen.max_tokens);
  if (!cache.ok()) return std::move(cache).error();
  s.cache = std::move(cache).value();
  s.kv_bytes = s.cache->bytes();
  log_memory(*s.req, "admit");
  return std::nullopt;
}

void Engine::Impl::start_sequence(std::shared_ptr<Request> req, Lease lease, TimePoint now) {
  running.push_back(make_sequence(std::move(req), std::move(lease), now));
  Sequence& s = *running.back();
  if (std::optional<Error> e = open_sequence(s)) not_opened(now, s, std::move(*e));
}

void Engine::Impl::not_opened(TimePoint now, Sequence& s, Error error) {
  if (error.code == ErrorCode::kOutOfMemory && recovers()) {
    recover_from_oom(now, error, &s);
  } else {
    fail(s, std::move(error));
  }
}

// One step: a decode token for every decoding sequence, then prefill chunks
// of prefilling sequences (oldest first) within max_batch_tokens (none with
// a prefill worker: it has them).
void Engine::Impl::run_step() {
  std::vector<StepInput> inputs;
  std::vector<Sequence*> owners;
  std::vector<std::int32_t> decode_tokens;
  decode_tokens.reserve(running.size());
  int budget = options.max_batch_tokens;
  for (auto& s : running) {
    if (s->done || s->prefilling()) continue;
    decode_tokens.push_back(s->next_token);
  }
  std::size_t k = 0;
  for (auto& s : running) {
    if (s->done || s->prefilling()) continue;
    inputs.push_back(StepInput{s->cache.get(), std::span<const std::int32_t>(&decode_tokens[k++], 1)});
    owners.push_back(s.get());
    --budget;
  }
  for (auto& s : running) {
    if (s->done || !s->prefilling() || budget <= 0) continue;
    inputs.push_back(s->next_chunk(budget));
    owners.push_back(s.get());
    budget -= static_cast<int>(inputs.back().tokens.size());
  }
  if (inputs.empty()) return;
  const std::int64_t step = begin_step();
  if (options.metrics) options.metrics->batch_size.observe(static_cast<double>(owners.size()));
  auto logits = model.step(inputs);
  {
    std::lock_guard lk(shared->mu);
    ++shared->stats.steps;
  }
  if (!logits.ok()) {
    on_failed_step(Clock::now(), logits.error(), owners, "step " + std::to_string(step));
    return;
  }
  on_step_ok();
  const TimePoint now = Clock::now();
  for (std::size_t i = 0; i < owners.size(); ++i) {
    Sequence& s = *owners[i];
    // A chunk that leaves more to prefill: its logits are not needed.
    if (s.prefilling() && !s.chunk_done(static_cast<int>(inputs[i].tokens.size()), now)) continue;
    on_token(s, s.p.sampler.sample(logits.value()[i]), now);
  }
}

void Engine::Impl::on_failed_step(TimePoint now, const Error& error, std::span<Sequence* const> owners,
                                  const std::string& step) {
  if (error.code == ErrorCode::kOutOfMemory) {
    {
      std::lock_guard lk(shared->mu);
      ++shared->stats.out_of_memory;
    }
    spdlog::warn("out of memory in {} ({} sequences): {}", step, owners.size(), error.message);
    if (recovers()) {
      // The step left every cache as it was: preempt some sequences, and the
      // others run again in the next step.
      recover_from_oom(now, error);
      return;
    }
    oom_budget->on_oom(now);  // no-op outside policy memory
    device.release_cached_memory();
  }
  for (Sequence* s : owners) fail(*s, error);
}

std::int64_t Engine::Impl::begin_step() {
  const std::int64_t n = ++steps_run;
  if (options.inject_oom_at_step > 0 && n >= options.inject_oom_at_step &&
      n < options.inject_oom_at_step + options.inject_oom_count) {
    device.inject_out_of_memory();
  }
  return n;
}

void Engine::Impl::on_token(Sequence& s, std::int32_t token, TimePoint now) {
  s.p.generated.push_back(token);
  ++s.p.unsent_tokens;
  const int generated = s.generated();
  if (options.metrics) {
    options.metrics->generated_tokens_total.inc();
    if (generated == 1) {
      options.metrics->time_to_first_token_seconds.observe(seconds_between(s.req->enqueued, now));
    } else {
      options.metrics->inter_token_latency_seconds.observe(seconds_between(s.p.last_token, now));
    }
  }
  s.p.last_token = now;
  if (generated == 1) log_memory(*s.req, "first token");
  const Tokenizer& tok = model.tokenizer();
  if (tok.is_eos(token) && !s.req->gen.ignore_eos) {
    finish(s, "stop");
    return;
  }
  std::string text = s.p.text.push(tok.token_bytes(token));
  // The first token is always announced, even when its bytes are held back
  // (part of a character or of a stop string): streams show time to first
  // token as it is.
  if (!text.empty() || generated == 1) {
    s.req->sink->push(TextEvent{std::move(text), s.p.unsent_tokens});
    s.p.unsent_tokens = 0;
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
  if (!tail.empty() || s.p.unsent_tokens > 0) s.req->sink->push(TextEvent{std::move(tail), s.p.unsent_tokens});
  const TimePoint now = Clock::now();
  FinishedEvent ev;
  ev.finish_reason = reason;
  ev.usage = {s.req->prompt_tokens(), s.generated()};
  ev.timings = s.timings(now);
  s.done = true;
  s.cache.reset();
  s.lease.release();
  admission->record_completion(now);
  {
    std::lock_guard lk(shared->mu);
    ++shared->stats.completed;
    shared->stats.generated_tokens += s.generated();
  }
  observe_end(*s.req, now);
  log_memory(*s.req, "finish");
  s.req->sink->push(std::move(ev));
}

void Engine::Impl::fail(Sequence& s, Error error) {
  if (s.done) return;
  const TimePoint now = Clock::now();
  s.done = true;
  s.cache.reset();
  s.lease.release();
  {
    std::lock_guard lk(shared->mu);
    if (error.code == ErrorCode::kCancelled) ++shared->stats.cancelled;
    else ++shared->stats.failed;
    shared->stats.generated_tokens += s.generated();
  }
  if (error.code == ErrorCode::kCancelled) {
    spdlog::info("request {} stopped after {} tokens: client closed", s.req->gen.id, s.generated());
  } else {
    spdlog::warn("request {} failed: {}", s.req->gen.id, error.message);
  }
  observe_end(*s.req, now);
  log_memory(*s.req, "finish");
  FailedEvent ev{std::move(error), {s.req->prompt_tokens(), s.generated()}};
  ev.timings = s.timings(now);
  s.req->sink->push(std::move(ev));
}

void Engine::Impl::sweep_running(TimePoint now) {
  for (auto& s : running) {
    if (s->done) continue;
    if (s->req->cancelled.load()) {
      fail(*s, Error(ErrorCode::kCancelled, "client closed the connection"));
    } else if (s->req->gen.deadline && now >= *s->req->gen.deadline) {
      fail(*s, Error(ErrorCode::kTimeout, "request deadline passed after " + std::to_string(s->generated()) +
                                              " generated tokens"));
    }
  }
}

void Engine::Impl::retire_done() {
  std::erase_if(running, [](const std::unique_ptr<Sequence>& s) { return s->done; });
}

void Engine::Impl::publish() {
  std::int64_t kv = in_prefill_kv_bytes;
  for (auto& s : running) {
    if (s->cache) kv += s->cache->bytes();
  }
  std::lock_guard lk(shared->mu);
  shared->stats.running = holding();
  shared->stats.kv_cache_bytes = kv;
  oom_budget->publish(shared->stats);
  if (shared->stats.running == 0 && front->queued_count.load() == 0) shared->idle_cv.notify_all();
}

// Shutdown: what is left gets 503 "shutting down".
void Engine::Impl::cancel_everything() {
  stop_prefill_worker();
  Error bye(ErrorCode::kOverloaded, "server is shutting down");
  bye.retry_after_s = 1.0;
  for (auto& s : running) fail(*s, bye);
  running.clear();
  admission->set_engine_available(index, false);
  std::unordered_map<RequestId, std::shared_ptr<Request>> left;
  {
    // The queue is shared: the last engine to stop answers what waits in it;
    // until then another engine may take what this one would have run.
    std::lock_guard lk(front->mu);
    if (--front->live_engines == 0) {
      admission->drop_all();
      left.swap(front->queued);
      front->queued_count.store(0);
    }
  }
  front->notify_all();
  const TimePoint now = Clock::now();
  for (auto& [id, r] : left) {
    observe_end(*r, now);
    r->sink->push(failed(*r, bye));
  }
}

void Engine::Impl::observe_end(const Request& r, TimePoint now) {
  if (options.metrics) options.metrics->request_duration_seconds.observe(seconds_between(r.enqueued, now));
}

// Debug: device memory at a request's milestones (enter, admit, first token, finish).
void Engine::Impl::log_memory(const Request& r, const char* stage) const {
  if (!spdlog::should_log(spdlog::level::debug)) return;
  const DeviceMemory mem = device.memory();
  const AdmissionSnapshot snap = admission->snapshot(Clock::now());
  spdlog::debug("request {} {}: {} used {} bytes, reserved {} bytes (request cost {} bytes)", r.gen.id, stage,
                device.name(), mem.used, snap.devices[static_cast<std::size_t>(device_index)].reserved_bytes, r.cost);
}

}  // namespace vg
