// The engine thread: take admitted work -> prefill -> decode step over all
// running sequences -> emit -> retire, until shut down. See engine_impl.hpp
// for who owns what.
#include <spdlog/spdlog.h>

#include <algorithm>

#include "common/wakeup_batch.hpp"
#include "device/device.hpp"
#include "engine/engine_impl.hpp"
#include "metrics/server_metrics.hpp"
#include "model/logprobs.hpp"
#include "tokenizer/tokenizer.hpp"

namespace vg {

using engine_detail::failed;
using engine_detail::kIdle;

// How often an idle engine measures the bytes other processes hold.
constexpr Duration kForeignBytesPoll = std::chrono::seconds(1);


void Engine::Impl::run() {
  DeviceScope scope(&device);
  while (wait_for_work()) {
    step_started.store(Clock::now().time_since_epoch().count(), std::memory_order_relaxed);
    {
      // The events of this turn (queue positions, starts, tokens, ends)
      // wake each consumer once, as it ends (common/wakeup_batch.hpp).
      WakeupBatch events;
      if (!options.test_foreign_bytes.file.empty()) follow_foreign_bytes_file();
      oom_budget->on_tick(Clock::now());
      shed_over_budget(Clock::now());
      // A pool without storage (a resize lost it) takes no work this turn.
      if (!pooled() || fit_kv_pool(Clock::now())) admit_and_step();
      publish();
    }
    if (options.step_delay_ms > 0 && !running.empty()) {
      std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(options.step_delay_ms));
    }
    step_started.store(kIdle, std::memory_order_relaxed);
  }
  step_profile.stop();
  cancel_everything();
  publish();
}

void Engine::Impl::admit_and_step() {
  admit(Clock::now());
  if (prefill) collect_prefills(Clock::now());
  sweep_running(Clock::now());
  retire_done();
  if (prefill) hand_off_prefills();
  if (on_demand()) grow_for_step(Clock::now());
  if (!running.empty()) run_step();
  retire_done();
}

// Sleeps until there is something to do: running sequences, a wake-up
// (submit, cancel, lease release), the admission controller's next timer or
// the OOM governor's next raise. False when the engine is stopping.
bool Engine::Impl::wait_for_work() {
  auto next = admission->next_wakeup(Clock::now());
  if (auto raise = oom_budget->next_change(); raise && (!next || *raise < *next)) next = raise;
  if (kv_pool_lost_retry && (!next || *kv_pool_lost_retry < *next)) next = kv_pool_lost_retry;
  // Other processes' bytes are measured at each turn: at least one a second.
  if (options.budget_inputs || !options.test_foreign_bytes.file.empty()) {
    const TimePoint poll = Clock::now() + kForeignBytesPoll;
    if (!next || poll < *next) next = poll;
  }
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
    MutexLock lk(front->mu);
    for (auto& [id, r] : front->queued) {
      if (r->is_cancelled()) cancelled.push_back(r);
    }
  }
  std::vector<std::pair<std::shared_ptr<Request>, Error>> dropped;
  for (auto& r : cancelled) {
    if (admission->cancel(r->admission_id)) {
      dropped.emplace_back(r, Error(ErrorCode::kCancelled, "client closed the connection while queued"));
    }
  }
  std::vector<AdmissionExpiry> others;
  std::function<void(AdmissionExpiry)> to_others;
  for (AdmissionExpiry& e : admission->expire(now)) {
    MutexLock lk(front->mu);
    auto it = front->queued.find(e.id);
    if (it != front->queued.end()) {
      dropped.emplace_back(it->second, std::move(e.error));
    } else {
      others.push_back(std::move(e));
      to_others = front->other_expiry;
    }
  }
  if (to_others) {
    for (AdmissionExpiry& e : others) to_others(std::move(e));
  }
  if (dropped.empty()) return;
  for (auto& [r, e] : dropped) front->take(r->admission_id);
  for (auto& [r, e] : dropped) {
    if (e.code == ErrorCode::kCancelled) {
      spdlog::info("request {} cancelled while queued: client closed", r->gen.id);
    } else {
      spdlog::info("request {} left the queue: {}", r->gen.id, e.message);
    }
    // Counted by admission unless it was admitted before (preempted, resubmitted).
    count_end(*r, &e, r->resume ? static_cast<int>(r->resume->generated.size()) : 0, now);
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
      options.metrics->retry_promise_error_seconds.observe(to_seconds(*g.promise_error));
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
    MutexLock lk(front->mu);
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
              : engine_detail::Progress(req->gen.sampling, req->gen.prompt, req->gen.stop, now,
                                        ms_between(req->enqueued, now));
  req->resume.reset();
  if (!resumed && !req->gen.resume_generated.empty()) {
    // Resumed from another engine process: what it produced is replayed
    // (sampler, text stream) and prefilled with the prompt, and not sent again.
    const Tokenizer& tok = model.tokenizer();
    const auto vocab = static_cast<std::size_t>(model.config().vocab_size);
    for (std::int32_t token : req->gen.resume_generated) {
      progress.sampler.replay(token, vocab);
      progress.generated.push_back(token);
      (void)progress.text.push(tok.token_bytes(token));
    }
    progress.last_token = now;
  }
  auto seq = std::make_unique<Sequence>(std::move(req), std::move(lease), std::move(progress), now);
  if (!resumed) {
    if (options.metrics && seq->req->choice == 0) {
      options.metrics->queue_wait_seconds.observe(seq->p.queue_ms / 1000.0);
    }
    seq->req->sink->push(StartedEvent{seq->p.queue_ms});
  }
  return seq;
}

std::optional<Error> Engine::Impl::open_sequence(Sequence& s) {
  if (s.req->is_cancelled()) return Error(ErrorCode::kCancelled, "client closed the connection");
  if (pooled()) {
    std::optional<Error> e = open_pooled(s);
    if (!e) log_memory(*s.req, "admit");
    return e;
  }
  // The whole KV cache (prompt + max_tokens) is allocated now, inside the
  // lease, so that growth never fails mid-generation.
  auto cache = model.new_cache(s.req->prompt_tokens() + s.req->gen.max_tokens);
  if (!cache.ok()) return std::move(cache).error();
  s.cache = std::move(cache).value();
  s.kv_bytes = s.cache->bytes();
  log_memory(*s.req, "admit");
  return std::nullopt;
}

std::vector<std::unique_ptr<Engine::Impl::Sequence>> Engine::Impl::make_sequences(std::shared_ptr<Request> req,
                                                                                   Lease lease, TimePoint now,
                                                                                   bool fork) {
  std::vector<std::unique_ptr<Sequence>> out;
  req->admitted = true;
  const int n = req->gen.n;
  if (n <= 1 || req->parent) {
    out.push_back(make_sequence(std::move(req), std::move(lease), now));
    return out;
  }
  // The choices: one child request each, cancelled with the parent, its
  // share of the lease its own (released when that choice ends, requeued
  // alone when it is preempted). Every choice that prefills computes the
  // prompt logprobs (the group forwards the first), so they always come
  // before any choice's text.
  const std::int64_t one = choice_cost(req->gen);
  auto group = std::make_shared<engine_detail::ChoiceGroup>(req->sink, n, [weak = req->front] {
    if (auto f = weak.lock()) f->notify_all();
  });
  std::vector<std::shared_ptr<Request>> children;
  for (int i = 0; i < n; ++i) {
    auto c = std::make_shared<Request>();
    c->gen = req->gen;
    c->gen.n = 1;
    c->gen.id = req->gen.id + "/" + std::to_string(i);
    if (c->gen.sampling.seed) c->gen.sampling.seed = *c->gen.sampling.seed + static_cast<std::uint64_t>(i);
    c->admission_id = i == 0 ? req->admission_id : front->next_id.fetch_add(1);
    c->cost = i == 0 ? req->cost - (n - 1) * one : one;
    c->sink = group->sink_for(i);
    c->enqueued = req->enqueued;
    c->front = req->front;
    c->model_index = req->model_index;
    c->parent = req;
    c->group = group;
    c->choice = i;
    c->admitted = true;
    children.push_back(std::move(c));
  }
  std::vector<Lease> parts;
  for (int i = n - 1; i >= 1; --i) parts.push_back(lease.split(children[static_cast<std::size_t>(i)]->admission_id, one));
  parts.push_back(std::move(lease));
  std::reverse(parts.begin(), parts.end());
  for (int i = 0; i < n; ++i) {
    out.push_back(make_sequence(children[static_cast<std::size_t>(i)], std::move(parts[static_cast<std::size_t>(i)]), now));
  }
  if (fork) {
    out.front()->fork_token = std::make_shared<int>(0);
    for (std::size_t i = 1; i < out.size(); ++i) out[i]->fork_from = out.front()->fork_token;
  }
  return out;
}

void Engine::Impl::start_sequence(std::shared_ptr<Request> req, Lease lease, TimePoint now) {
  for (auto& seq : make_sequences(std::move(req), std::move(lease), now, /*fork=*/!prefill)) {
    running.push_back(std::move(seq));
    Sequence& s = *running.back();
    if (std::optional<Error> e = open_sequence(s)) not_opened(now, s, std::move(*e));
  }
}

void Engine::Impl::not_opened(TimePoint now, Sequence& s, Error error) {
  if (error.code == ErrorCode::kDeviceFault) on_device_fault(error, "the KV cache of request " + s.req->gen.id);
  if (error.code == ErrorCode::kOutOfMemory && pooled()) {
    // The pool had fewer free blocks than the budget promised (it could not
    // grow back yet): the device is not short, the pool is.
    preempt_or_refuse(s, now, "the KV cache pool is full (" + error.message + ")");
    return;
  }
  if (error.code == ErrorCode::kOutOfMemory) {
    count_out_of_memory();
    spdlog::warn("out of memory opening the KV cache of request {}: {}", s.req->gen.id, error.message);
    if (recovers()) {
      recover_from_oom(now, error, &s);
      return;
    }
  }
  fail(s, std::move(error));
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
    if (s->done || !s->prefilling() || s->awaiting_fork() || budget <= 0) continue;
    inputs.push_back(s->next_chunk(budget));
    owners.push_back(s.get());
    budget -= static_cast<int>(inputs.back().tokens.size());
  }
  if (inputs.empty()) return;
  const std::int64_t step = begin_step();
  if (options.metrics) options.metrics->batch_size.observe(static_cast<double>(owners.size()));
  const int decoding = static_cast<int>(k);
  if (k == inputs.size()) {
    run_decode_step(inputs, owners, step);
    return;
  }
  const bool profiled = step_profile.before_step(decoding, static_cast<int>(inputs.size()) - decoding);
  auto logits = model.step(inputs);
  if (profiled) step_profile.after_step();
  count_step();
  if (!logits.ok()) {
    on_failed_step(Clock::now(), logits.error(), owners, "step " + std::to_string(step));
    return;
  }
  on_step_ok();
  const TimePoint now = Clock::now();
  for (std::size_t i = 0; i < owners.size(); ++i) {
    Sequence& s = *owners[i];
    const std::vector<float>& out = logits.value()[i];
    if (s.prefilling()) {
      on_chunk(s, inputs[i], out, now);
      continue;
    }
    on_token(s, s.p.sampler.sample(out), now, out);
  }
}

void Engine::Impl::run_decode_step(std::span<const StepInput> inputs, std::span<Sequence* const> owners,
                                   std::int64_t step) {
  std::vector<SampleSpec> specs;
  specs.reserve(owners.size());
  for (Sequence* s : owners) specs.push_back(SampleSpec{&s->p.sampler, s->req->gen.logprobs.value_or(-1)});
  const bool profiled = step_profile.before_step(static_cast<int>(inputs.size()), 0);
  auto picks = model.decode_step(inputs, specs);
  if (profiled) step_profile.after_step();
  count_step();
  if (!picks.ok()) {
    on_failed_step(Clock::now(), picks.error(), owners, "step " + std::to_string(step));
    return;
  }
  on_step_ok();
  const TimePoint now = Clock::now();
  for (std::size_t i = 0; i < owners.size(); ++i) on_token(*owners[i], std::move(picks.value()[i]), now);
}

void Engine::Impl::count_step() {
  std::lock_guard lk(shared->mu);
  ++shared->stats.steps;
}

bool Engine::Impl::on_chunk(Sequence& s, const StepInput& input, const std::vector<float>& logits, TimePoint now) {
  const int vocab = model.config().vocab_size;
  const int t = static_cast<int>(input.tokens.size());
  if (input.all_logits && s.wants_prompt_logprobs()) {
    // Row j predicts the context token at prefilled + j + 1.
    const Tokenizer& tok = model.tokenizer();
    const int top = s.req->gen.logprobs.value_or(0);
    const int prompt = s.req->prompt_tokens();
    if (s.prefilled == 0) s.prompt_logprobs.push_back(TokenLogprobs{tok.token_bytes(s.context[0]), std::nullopt, {}});
    for (int j = 0; j < t && s.prefilled + j + 1 < prompt; ++j) {
      const std::int32_t next = s.context[static_cast<std::size_t>(s.prefilled + j + 1)];
      const std::span<const float> row(logits.data() + static_cast<std::ptrdiff_t>(j) * vocab,
                                       static_cast<std::size_t>(vocab));
      const LogprobResult lp = token_logprobs(row, next, top);
      TokenLogprobs entry{tok.token_bytes(next), lp.logprob, {}};
      for (const TokenLogprob& alt : lp.top) entry.top.emplace_back(tok.token_bytes(alt.id), alt.logprob);
      s.prompt_logprobs.push_back(std::move(entry));
    }
  }
  // A chunk that leaves more to prefill: its last logits are not needed.
  if (!s.chunk_done(t, now)) return false;
  if (s.wants_prompt_logprobs()) {
    s.p.prompt_logprobs_sent = true;
    s.req->sink->push(PromptEvent{std::move(s.prompt_logprobs)});
    s.prompt_logprobs.clear();
  }
  const std::span<const float> last(logits.data() + logits.size() - static_cast<std::size_t>(vocab),
                                    static_cast<std::size_t>(vocab));
  if (s.fork_token) fork_followers(s, last, now);
  if (s.req->gen.max_tokens == 0) {
    finish(s, "length");  // a scoring request: the prompt was all it asked for
  } else {
    on_token(s, s.p.sampler.sample(last), now, last);
  }
  return true;
}

void Engine::Impl::fork_followers(Sequence& leader, std::span<const float> logits, TimePoint now) {
  for (auto& f : running) {
    if (f->done || f->fork_from.lock() != leader.fork_token) continue;
    f->fork_from.reset();
    const std::int64_t before = kv_used_blocks();
    const Status st = model.copy_cache(*leader.cache, *f->cache);
    charge_blocks(*f, before);
    if (!st.ok()) {
      if (st.error().code == ErrorCode::kDeviceFault) {
        on_device_fault(st.error(), "the KV cache copy of request " + f->req->gen.id);
      }
      fail(*f, st.error());
      continue;
    }
    f->prefilled = leader.prefilled;
    f->p.prefill_done = now;
    f->p.prompt_logprobs_sent = true;  // the leader sent them for every choice
    if (f->req->gen.max_tokens == 0) {
      finish(*f, "length");
    } else {
      on_token(*f, f->p.sampler.sample(logits), now, logits);
    }
  }
  leader.fork_token.reset();
}

void Engine::Impl::on_failed_step(TimePoint now, const Error& error, std::span<Sequence* const> owners,
                                  const std::string& step) {
  if (error.code == ErrorCode::kDeviceFault) on_device_fault(error, step);
  if (error.code == ErrorCode::kOutOfMemory) {
    count_out_of_memory();
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

void Engine::Impl::count_out_of_memory() {
  std::lock_guard lk(shared->mu);
  ++shared->stats.counters[CounterId::kOutOfMemory];
}

void Engine::Impl::on_device_fault(const Error& error, const std::string& where) {
  const std::string reason = "device fault in " + where + ": " + error.message;
  spdlog::error("engine on {}: {}", device.name(), reason);
  if (options.on_poisoned) options.on_poisoned(reason);
}

std::int64_t Engine::Impl::begin_step() {
  const std::int64_t n = ++steps_run;
  if (auto foreign = options.test_foreign_bytes.at_step(n)) {
    const std::int64_t held = device.set_test_foreign_bytes(*foreign);
    spdlog::info("{}: test hook: at step {} another process holds {} bytes (asked {})", device.name(), n, held,
                 *foreign);
  }
  if (options.test_device_fault_at_step > 0 && n == options.test_device_fault_at_step) device.inject_device_fault();
  if (options.inject_oom_at_step > 0 && n >= options.inject_oom_at_step &&
      n < options.inject_oom_at_step + options.inject_oom_count) {
    device.inject_out_of_memory();
  }
  return n;
}

void Engine::Impl::sweep_running(TimePoint now) {
  for (auto& s : running) {
    if (s->done) continue;
    if (s->req->is_cancelled()) {
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
  publish_kv_pool(shared->stats);
  if (shared->stats.running == 0 && front->queued_count.load() == 0) shared->idle_cv.notify_all();
}

// Shutdown: what is left gets 503 "shutting down".
void Engine::Impl::cancel_everything() {
  stop_prefill_worker();
  const Error bye = shutting_down();
  for (auto& s : running) fail(*s, bye);
  running.clear();
  admission->set_engine_available(index, false);
  std::unordered_map<RequestId, std::shared_ptr<Request>> left;
  {
    // The queue is shared: the last engine to stop answers what waits in it;
    // until then another engine may take what this one would have run.
    MutexLock lk(front->mu);
    if (--front->live_engines == 0) {
      admission->drop_all();
      left.swap(front->queued);
      front->queued_count.store(0);
    }
  }
  front->notify_all();
  const TimePoint now = Clock::now();
  for (auto& [id, r] : left) {
    count_end(*r, &bye, 0, now);
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
