// Engine loop and submit path. See engine.hpp for the threading contract.
// `Shared` (pending requests, wake flag, counters) is guarded by its mutex;
// the AdmissionController has its own lock; `running` and every Sequence
// (with its KV cache and lease) belong to the engine thread alone. Leases are
// never released while `Shared::mu` is held: a release wakes the engine
// through the same mutex.
#include "engine/engine.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <condition_variable>
#include <limits>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "device/device.hpp"
#include "engine/oom_budget.hpp"
#include "engine/text_stream.hpp"
#include "metrics/server_metrics.hpp"
#include "model/model.hpp"
#include "model/tokenizer.hpp"

namespace vg {
namespace {

struct Shared;

// A request between submit and its terminal event. Shared by the submitter
// (through RequestHandle) and the engine.
struct Request final : RequestHandle {
  GenerationRequest gen;
  RequestId admission_id = 0;
  std::int64_t cost = 0;
  std::shared_ptr<EventSink> sink;
  TimePoint enqueued;
  std::atomic<bool> cancelled{false};
  std::weak_ptr<Shared> shared;
  int reported_position = 0;  // engine thread only: last QueuedEvent sent

  const std::string& id() const override { return gen.id; }
  void cancel() override;
  int prompt_tokens() const { return static_cast<int>(gen.prompt.size()); }
};

struct Shared {
  std::mutex mu;
  std::condition_variable cv;
  bool wake = false;       // guarded by mu: something to do (submit, cancel, release)
  bool draining = false;   // guarded by mu
  bool stopping = false;   // guarded by mu
  // Requests queued in admission, by admission id. Guarded by mu.
  std::unordered_map<RequestId, std::shared_ptr<Request>> queued;
  EngineStats stats;       // guarded by mu
  std::condition_variable idle_cv;

  void notify() {
    std::lock_guard lk(mu);
    wake = true;
    cv.notify_all();
  }
};

void Request::cancel() {
  if (cancelled.exchange(true)) return;
  if (auto s = shared.lock()) s->notify();
}

// A running sequence: engine thread only.
struct Sequence {
  std::shared_ptr<Request> req;
  Lease lease;
  std::unique_ptr<KvCache> cache;
  Sampler sampler;
  TextStream text;
  int prefilled = 0;             // prompt tokens already in the cache
  std::int32_t next_token = -1;  // fed to the next decode step
  int generated = 0;
  int unsent_tokens = 0;
  bool done = false;
  TimePoint started;
  TimePoint prefill_done;
  TimePoint last_token;
  double queue_ms = 0;

  Sequence(std::shared_ptr<Request> r, Lease l, TimePoint now)
      : req(std::move(r)), lease(std::move(l)), sampler(req->gen.sampling), text(req->gen.stop), started(now),
        queue_ms(ms_between(req->enqueued, now)) {}
  bool prefilling() const { return prefilled < req->prompt_tokens(); }
  /// Queue, prefill and decode time up to `now` (decode 0 until prefilled).
  Timings timings(TimePoint now) const {
    const bool decoding = !prefilling() && prefill_done != TimePoint{};
    return {queue_ms, ms_between(started, decoding ? prefill_done : now),
            decoding ? ms_between(prefill_done, now) : 0.0};
  }
};

FailedEvent failed(const Request& r, Error e, int generated = 0) {
  return FailedEvent{std::move(e), {r.prompt_tokens(), generated}};
}

double seconds_between(TimePoint from, TimePoint to) { return std::chrono::duration<double>(to - from).count(); }

constexpr std::int64_t kIdle = std::numeric_limits<std::int64_t>::min();

}  // namespace

struct Engine::Impl {
  Options options;
  Model& model;
  Device& device;
  std::shared_ptr<Shared> shared = std::make_shared<Shared>();
  std::unique_ptr<AdmissionController> admission;
  std::optional<OomBudget> oom_budget;  // engine thread only, after create()
  std::atomic<RequestId> next_id{1};
  std::vector<std::unique_ptr<Sequence>> running;  // engine thread only
  std::int64_t steps_run = 0;                       // engine thread only
  // Watchdog heartbeat: start of the step in progress (Clock ticks), or kIdle.
  std::atomic<std::int64_t> step_started{kIdle};
  std::thread thread;

  Impl(const Options& o, Model& m, Device& d) : options(o), model(m), device(d) {}

  void run();
  bool wait_for_work();
  void admit(TimePoint now);
  void report_queue_positions(TimePoint now);
  void start_sequence(std::shared_ptr<Request> req, Lease lease, TimePoint now);
  void run_step();
  void on_token(Sequence& s, std::int32_t token, TimePoint now);
  void finish(Sequence& s, const char* reason);
  void fail(Sequence& s, Error error);
  void sweep_running(TimePoint now);
  void retire_done();
  void publish();
  void cancel_everything();
  void observe_end(const Request& r, TimePoint now);
  void log_memory(const Request& r, const char* stage) const;
  int max_running() const {
    return options.admission.policy.kind == AdmissionPolicy::Kind::kNone ? 1 << 20 : options.max_batch;
  }
};

Result<std::unique_ptr<Engine>> Engine::create(const Options& options, Model& model, Device& device) {
  if (options.max_batch < 1) return Error(ErrorCode::kConfig, "max_batch must be >= 1");
  if (options.max_batch_tokens < 1) return Error(ErrorCode::kConfig, "max_batch_tokens must be >= 1");
  if (Status st = validate(options.profile); !st.ok()) return st.error();
  if (Status st = validate(options.oom_governor); !st.ok()) return st.error();
  auto impl = std::make_unique<Impl>(options, model, device);
  // Admission grants no more sequences than a step runs (none: no limit).
  impl->options.admission.max_running = impl->max_running();
  std::weak_ptr<Shared> weak = impl->shared;
  auto controller = AdmissionController::create(impl->options.admission, [weak] {
    if (auto s = weak.lock()) s->notify();
  });
  if (!controller.ok()) return std::move(controller).error();
  impl->admission = std::move(controller).value();
  impl->oom_budget.emplace(options.oom_governor, options.admission.budget_bytes,
                           options.admission.policy.kind == AdmissionPolicy::Kind::kMemory, *impl->admission,
                           device.name());
  impl->oom_budget->publish(impl->shared->stats);
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] { raw->run(); });
  return std::unique_ptr<Engine>(new Engine(std::move(impl)));
}

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Engine::~Engine() { shutdown(); }

std::int64_t Engine::cost(int prompt_tokens, int max_tokens) const {
  return request_cost(impl_->options.profile, prompt_tokens, max_tokens);
}

Result<std::shared_ptr<RequestHandle>> Engine::submit(GenerationRequest request, std::shared_ptr<EventSink> sink,
                                                      int* queue_position) {
  auto req = std::make_shared<Request>();
  req->gen = std::move(request);
  req->sink = std::move(sink);
  req->enqueued = Clock::now();
  req->shared = impl_->shared;
  req->admission_id = impl_->next_id.fetch_add(1);
  req->cost = cost(req->prompt_tokens(), req->gen.max_tokens);
  Shared& s = *impl_->shared;
  {
    std::lock_guard lk(s.mu);
    if (s.draining || s.stopping) {
      ++s.stats.rejected;
      Error e(ErrorCode::kOverloaded, "server is shutting down");
      e.retry_after_s = 1.0;
      return e;
    }
    // Registered before it is queued, so the engine thread finds it the
    // moment admission grants it.
    s.queued.emplace(req->admission_id, req);
  }
  auto ticket = impl_->admission->enqueue(req->admission_id, req->cost, req->enqueued, req->gen.deadline);
  if (!ticket.ok()) {
    std::lock_guard lk(s.mu);
    s.queued.erase(req->admission_id);
    ++s.stats.rejected;
    return std::move(ticket).error();
  }
  if (queue_position) *queue_position = ticket->position;
  impl_->log_memory(*req, "enter");
  s.notify();
  return std::shared_ptr<RequestHandle>(req);
}

void Engine::begin_drain() {
  std::lock_guard lk(impl_->shared->mu);
  impl_->shared->draining = true;
}

bool Engine::wait_idle(TimePoint deadline) const {
  Shared& s = *impl_->shared;
  std::unique_lock lk(s.mu);
  return s.idle_cv.wait_until(lk, deadline, [&] { return s.queued.empty() && s.stats.running == 0; });
}

void Engine::request_stop() {
  std::lock_guard lk(impl_->shared->mu);
  impl_->shared->stopping = true;
  impl_->shared->cv.notify_all();
}

void Engine::shutdown() {
  if (!impl_ || !impl_->thread.joinable()) return;
  request_stop();
  impl_->thread.join();
}

EngineStats Engine::stats() const {
  std::lock_guard lk(impl_->shared->mu);
  EngineStats st = impl_->shared->stats;
  st.queue_depth = static_cast<int>(impl_->shared->queued.size());
  return st;
}

AdmissionSnapshot Engine::admission() const { return impl_->admission->snapshot(Clock::now()); }

std::optional<Duration> Engine::busy_for(TimePoint now) const {
  const std::int64_t started = impl_->step_started.load(std::memory_order_relaxed);
  if (started == kIdle) return std::nullopt;
  return std::max(Duration::zero(), now - TimePoint(Duration(started)));
}

// ---- engine thread ---------------------------------------------------------

void Engine::Impl::run() {
  DeviceScope scope(&device);
  while (wait_for_work()) {
    step_started.store(Clock::now().time_since_epoch().count(), std::memory_order_relaxed);
    oom_budget->on_tick(Clock::now());
    admit(Clock::now());
    sweep_running(Clock::now());
    retire_done();
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

// Drops cancelled queued requests, expires those past their limits, then
// starts what admission grants.
void Engine::Impl::admit(TimePoint now) {
  std::vector<std::shared_ptr<Request>> cancelled;
  {
    std::lock_guard lk(shared->mu);
    for (auto& [id, r] : shared->queued) {
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
    std::lock_guard lk(shared->mu);
    auto it = shared->queued.find(e.id);
    if (it != shared->queued.end()) dropped.emplace_back(it->second, std::move(e.error));
  }
  const int free_slots = std::max(0, max_running() - static_cast<int>(running.size()));
  std::vector<AdmissionGrant> grants = admission->grant(now, free_slots);
  std::vector<std::pair<std::shared_ptr<Request>, AdmissionGrant>> started;
  {
    std::lock_guard lk(shared->mu);
    for (auto& [r, e] : dropped) {
      shared->queued.erase(r->admission_id);
      if (e.code == ErrorCode::kCancelled) ++shared->stats.cancelled;
      else ++shared->stats.failed;
    }
    for (AdmissionGrant& g : grants) {
      auto it = shared->queued.find(g.id);
      if (it == shared->queued.end()) continue;  // cannot happen: registered before enqueue
      started.emplace_back(it->second, std::move(g));
      shared->queued.erase(it);
    }
    shared->stats.running = static_cast<int>(running.size() + started.size());
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
  for (auto& [r, g] : started) start_sequence(std::move(r), std::move(g.lease), now);
  report_queue_positions(now);
}

// Tells each waiting request its queue position when it changed (SSE
// clients see it as progress while they wait).
void Engine::Impl::report_queue_positions(TimePoint now) {
  {
    // Runs after every step: skip the admission snapshot when nobody waits.
    std::lock_guard lk(shared->mu);
    if (shared->queued.empty()) return;
  }
  const AdmissionSnapshot snap = admission->snapshot(now);
  std::vector<std::pair<std::shared_ptr<Request>, int>> moved;
  {
    std::lock_guard lk(shared->mu);
    for (const QueuedView& q : snap.queue) {
      auto it = shared->queued.find(q.id);
      if (it != shared->queued.end() && it->second->reported_position != q.position) {
        it->second->reported_position = q.position;
        moved.emplace_back(it->second, q.position);
      }
    }
  }
  for (auto& [r, pos] : moved) r->sink->push(QueuedEvent{pos});
}

void Engine::Impl::start_sequence(std::shared_ptr<Request> req, Lease lease, TimePoint now) {
  auto seq = std::make_unique<Sequence>(std::move(req), std::move(lease), now);
  Sequence& s = *seq;
  running.push_back(std::move(seq));
  if (options.metrics) options.metrics->queue_wait_seconds.observe(s.queue_ms / 1000.0);
  s.req->sink->push(StartedEvent{s.queue_ms});
  if (s.req->cancelled.load()) {
    fail(s, Error(ErrorCode::kCancelled, "client closed the connection"));
    return;
  }
  // The whole KV cache (prompt + max_tokens) is allocated now, inside the
  // lease, so that growth never fails mid-generation.
  auto cache = model.new_cache(s.req->prompt_tokens() + s.req->gen.max_tokens);
  if (!cache.ok()) {
    fail(s, std::move(cache).error());
    return;
  }
  s.cache = std::move(cache).value();
  log_memory(*s.req, "admit");
}

// One step: a decode token for every decoding sequence, then prefill chunks
// of prefilling sequences (oldest first) within max_batch_tokens.
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
    const int n = std::min(budget, s->req->prompt_tokens() - s->prefilled);
    inputs.push_back(StepInput{s->cache.get(), std::span<const std::int32_t>(s->req->gen.prompt).subspan(
                                                   static_cast<std::size_t>(s->prefilled), static_cast<std::size_t>(n))});
    owners.push_back(s.get());
    budget -= n;
  }
  if (inputs.empty()) return;
  ++steps_run;
  if (options.metrics) options.metrics->batch_size.observe(static_cast<double>(owners.size()));
  if (options.inject_oom_at_step > 0 && steps_run == options.inject_oom_at_step) device.inject_out_of_memory();
  auto logits = model.step(inputs);
  const bool oom = !logits.ok() && logits.error().code == ErrorCode::kOutOfMemory;
  if (oom) oom_budget->on_oom(Clock::now());  // before the step's requests hear of it
  {
    std::lock_guard lk(shared->mu);
    ++shared->stats.steps;
    if (oom) ++shared->stats.out_of_memory;
    oom_budget->publish(shared->stats);
  }
  if (!logits.ok()) {
    Error e = logits.error();
    if (e.code == ErrorCode::kOutOfMemory) {
      spdlog::warn("out of memory in step {} ({} sequences): {}", steps_run, owners.size(), e.message);
      if (options.admission.policy.kind != AdmissionPolicy::Kind::kNone) {
        // Admission promised these bytes: the shortfall is the server's, so
        // the client is told "not now" rather than given a server error.
        Error busy(ErrorCode::kOverloaded, "device memory ran short during generation; retry");
        busy.retry_after_s = admission->retry_after_s(1, Clock::now());
        e = std::move(busy);
      }
    }
    for (Sequence* s : owners) fail(*s, e);
    return;
  }
  const TimePoint now = Clock::now();
  for (std::size_t i = 0; i < owners.size(); ++i) {
    Sequence& s = *owners[i];
    if (s.prefilling()) {
      s.prefilled += static_cast<int>(inputs[i].tokens.size());
      if (s.prefilling()) continue;  // more chunks to go; these logits are not needed
      s.prefill_done = now;
    }
    on_token(s, s.sampler.sample(logits.value()[i]), now);
  }
}

void Engine::Impl::on_token(Sequence& s, std::int32_t token, TimePoint now) {
  ++s.generated;
  ++s.unsent_tokens;
  if (options.metrics) {
    options.metrics->generated_tokens_total.inc();
    if (s.generated == 1) {
      options.metrics->time_to_first_token_seconds.observe(seconds_between(s.req->enqueued, now));
    } else {
      options.metrics->inter_token_latency_seconds.observe(seconds_between(s.last_token, now));
    }
  }
  s.last_token = now;
  if (s.generated == 1) log_memory(*s.req, "first token");
  const Tokenizer& tok = model.tokenizer();
  if (tok.eos_id() && token == *tok.eos_id() && !s.req->gen.ignore_eos) {
    finish(s, "stop");
    return;
  }
  std::string text = s.text.push(tok.token_bytes(token));
  // The first token is always announced, even when its bytes are held back
  // (part of a character or of a stop string): streams show time to first
  // token as it is.
  if (!text.empty() || s.generated == 1) {
    s.req->sink->push(TextEvent{std::move(text), s.unsent_tokens});
    s.unsent_tokens = 0;
  }
  if (s.text.stopped()) {
    finish(s, "stop");
  } else if (s.generated >= s.req->gen.max_tokens) {
    finish(s, "length");
  } else {
    s.next_token = token;
  }
}

void Engine::Impl::finish(Sequence& s, const char* reason) {
  std::string tail = s.text.finish();
  if (!tail.empty() || s.unsent_tokens > 0) s.req->sink->push(TextEvent{std::move(tail), s.unsent_tokens});
  const TimePoint now = Clock::now();
  FinishedEvent ev;
  ev.finish_reason = reason;
  ev.usage = {s.req->prompt_tokens(), s.generated};
  ev.timings = s.timings(now);
  s.done = true;
  s.cache.reset();
  s.lease.release();
  admission->record_completion(now);
  {
    std::lock_guard lk(shared->mu);
    ++shared->stats.completed;
    shared->stats.generated_tokens += s.generated;
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
    shared->stats.generated_tokens += s.generated;
  }
  if (error.code == ErrorCode::kCancelled) {
    spdlog::info("request {} stopped after {} tokens: client closed", s.req->gen.id, s.generated);
  } else {
    spdlog::warn("request {} failed: {}", s.req->gen.id, error.message);
  }
  observe_end(*s.req, now);
  log_memory(*s.req, "finish");
  FailedEvent ev = failed(*s.req, std::move(error), s.generated);
  ev.timings = s.timings(now);
  s.req->sink->push(std::move(ev));
}

void Engine::Impl::sweep_running(TimePoint now) {
  for (auto& s : running) {
    if (s->done) continue;
    if (s->req->cancelled.load()) {
      fail(*s, Error(ErrorCode::kCancelled, "client closed the connection"));
    } else if (s->req->gen.deadline && now >= *s->req->gen.deadline) {
      fail(*s, Error(ErrorCode::kTimeout, "request deadline passed after " + std::to_string(s->generated) +
                                              " generated tokens"));
    }
  }
}

void Engine::Impl::retire_done() {
  std::erase_if(running, [](const std::unique_ptr<Sequence>& s) { return s->done; });
}

void Engine::Impl::publish() {
  std::int64_t kv = 0;
  for (auto& s : running) {
    if (s->cache) kv += s->cache->bytes();
  }
  std::lock_guard lk(shared->mu);
  shared->stats.running = static_cast<int>(running.size());
  shared->stats.kv_cache_bytes = kv;
  oom_budget->publish(shared->stats);
  if (shared->stats.running == 0 && shared->queued.empty()) shared->idle_cv.notify_all();
}

// Shutdown: what is left gets 503 "shutting down".
void Engine::Impl::cancel_everything() {
  Error bye(ErrorCode::kOverloaded, "server is shutting down");
  bye.retry_after_s = 1.0;
  for (auto& s : running) fail(*s, bye);
  running.clear();
  admission->drop_all();
  std::unordered_map<RequestId, std::shared_ptr<Request>> left;
  {
    std::lock_guard lk(shared->mu);
    left.swap(shared->queued);
  }
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
                device.name(), mem.used, snap.reserved_bytes, r.cost);
}

}  // namespace vg
