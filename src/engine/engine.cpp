// Engine: the any-thread API (create, submit, drain, shutdown, stats). The
// engine thread's loop is in engine_loop.cpp, out-of-memory recovery in
// engine_recovery.cpp; the shared internals and their ownership rules are in
// engine_impl.hpp.
#include "engine/compute_thread.hpp"
#include "engine/engine.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>

#include "device/device.hpp"
#include "engine/engine_impl.hpp"

namespace vg {

using engine_detail::Request;
using engine_detail::Shared;
using engine_detail::kIdle;

void engine_detail::Request::cancel() {
  if (cancelled.exchange(true)) return;
  if (auto f = front.lock()) f->notify_all();
}

bool engine_detail::Request::withdraw() {
  if (cancelled.load()) return false;
  auto f = front.lock();
  if (!f) return false;
  // Admission first: once out of its queue it can never be granted, so no
  // engine takes it from the front's map after this.
  if (!f->admission->withdraw(admission_id)) return false;
  (void)f->take(admission_id);
  f->notify_all();  // the queue changed: the others' positions, what fits next
  return true;
}

Result<std::shared_ptr<EngineFront>> make_engine_front(const AdmissionOptions& options, AdmissionTopology topology) {
  auto front = std::make_shared<EngineFront>();
  front->topology = topology;
  std::weak_ptr<EngineFront> weak = front;
  auto controller = AdmissionController::create(options, std::move(topology), [weak] {
    if (auto f = weak.lock()) f->notify_all();
  });
  if (!controller.ok()) return std::move(controller).error();
  front->admission = std::move(controller).value();
  return front;
}

AdmissionController& front_admission(EngineFront& front) { return *front.admission; }

RequestId next_front_id(EngineFront& front) { return front.next_id.fetch_add(1); }

void add_front_listener(EngineFront& front, std::function<void()> wake) {
  MutexLock lk(front.mu);
  front.listeners.push_back(std::move(wake));
}

void set_front_other_expiry(EngineFront& front, std::function<void(AdmissionExpiry)> handler) {
  MutexLock lk(front.mu);
  front.other_expiry = std::move(handler);
}

void notify_front(EngineFront& front) { front.notify_all(); }

Result<AdmissionTopology::Engine> front_engine(EngineFront& front, int index) {
  if (index < 0 || static_cast<std::size_t>(index) >= front.topology.engines.size()) {
    return Error(ErrorCode::kConfig, "engine index " + std::to_string(index) + " is not in the admission topology");
  }
  return front.topology.engines[static_cast<std::size_t>(index)];
}

int front_language_engines(EngineFront& front) {
  MutexLock lk(front.mu);
  return front.live_engines;
}

Result<std::unique_ptr<Engine>> Engine::create(const Options& options, Model& model, Device& device,
                                               std::shared_ptr<EngineFront> front, int index) {
  if (options.max_batch < 1) return Error(ErrorCode::kConfig, "max_batch must be >= 1");
  if (options.max_batch_tokens < 1) return Error(ErrorCode::kConfig, "max_batch_tokens must be >= 1");
  if (Status st = validate(options.profile); !st.ok()) return st.error();
  if (Status st = validate(options.oom_governor); !st.ok()) return st.error();
  if (options.kv_pool) {
    if (options.prefill_worker) return Error(ErrorCode::kConfig, "a KV block pool does not run with a prefill worker");
    if (!model.kv_pool_counts() || options.kv_pool->geometry.block_bytes <= 0) {
      return Error(ErrorCode::kConfig, "kv_pool is set but the model holds no KV block pool");
    }
  }
  auto impl = std::make_unique<Impl>(options, model, device);
  // Admission grants no more sequences than a step runs (none: no limit).
  impl->options.admission.max_running = impl->max_running();
  if (!front) {
    AdmissionTopology topology;
    topology.devices.push_back(AdmissionTopology::Device{device.name(), options.admission.budget_bytes});
    topology.engines.push_back(AdmissionTopology::Engine{0, 0, impl->max_running()});
    auto made = make_engine_front(impl->options.admission, std::move(topology));
    if (!made.ok()) return std::move(made).error();
    front = std::move(made).value();
    index = 0;
  }
  if (index < 0 || static_cast<std::size_t>(index) >= front->topology.engines.size()) {
    return Error(ErrorCode::kConfig, "engine index " + std::to_string(index) + " is not in the admission topology");
  }
  impl->front = front;
  impl->admission = front->admission.get();
  impl->index = index;
  impl->device_index = front->topology.engines[static_cast<std::size_t>(index)].device;
  impl->model_index = front->topology.engines[static_cast<std::size_t>(index)].model;
  if (options.prefill_worker) impl->prefill = std::make_unique<Impl::PrefillWorker>();
  {
    MutexLock lk(front->mu);
    front->engines.push_back(impl->shared);
    if (impl->prefill) front->engines.push_back(impl->prefill->signal);  // it grants too
    ++front->live_engines;
  }
  impl->oom_budget.emplace(options.oom_governor, options.admission.budget_bytes,
                           options.admission.policy.kind == AdmissionPolicy::Kind::kMemory, *impl->admission, device,
                           options.budget_inputs, impl->device_index, impl->index);
  if (impl->pooled()) impl->start_kv_pool();
  impl->oom_budget->publish(impl->shared->stats);
  impl->publish_kv_pool(impl->shared->stats);
  Impl* raw = impl.get();
  if (impl->prefill) impl->prefill->thread = start_compute_thread(device, [raw] { raw->prefill_loop(); });
  impl->thread = start_compute_thread(device, [raw] { raw->run(); });
  return std::unique_ptr<Engine>(new Engine(std::move(impl)));
}

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Engine::~Engine() { shutdown(); }

std::int64_t Engine::cost(int prompt_tokens, int max_tokens) const {
  return request_cost(impl_->options.profile, prompt_tokens, max_tokens);
}

std::int64_t Engine::cost(const GenerationRequest& request) const {
  return std::max(1, request.n) * impl_->choice_cost(request);
}

std::int64_t Engine::Impl::choice_cost(const GenerationRequest& request) const {
  const int prompt = static_cast<int>(request.prompt.size());
  std::int64_t bytes =
      pooled() ? pool_cost(prompt, request.max_tokens) : request_cost(options.profile, prompt, request.max_tokens);
  if (request.prompt_logprobs) {
    // The logits of every token of a prefill chunk, float32, on the device and copied to the host.
    const std::int64_t rows = std::min(prompt, options.max_batch_tokens);
    const double logits = 2.0 * 4.0 * static_cast<double>(rows) * model.config().vocab_size;
    bytes += static_cast<std::int64_t>(std::ceil(logits * options.profile.safety_factor));
  }
  return bytes;
}

Result<std::shared_ptr<RequestHandle>> Engine::submit(GenerationRequest request, std::shared_ptr<EventSink> sink,
                                                      int* queue_position, std::string* retry_claimed_by) {
  auto req = std::make_shared<Request>();
  req->gen = std::move(request);
  req->sink = std::move(sink);
  req->enqueued = Clock::now();
  req->front = impl_->front;
  req->model_index = impl_->model_index;
  req->admission_id = impl_->front->next_id.fetch_add(1);
  req->cost = cost(req->gen);
  req->admitted = req->gen.admitted_before;
  Shared& s = *impl_->shared;
  {
    std::lock_guard lk(s.mu);
    if (s.draining || s.stopping) {
      ++s.stats.rejected;
      return shutting_down();
    }
    if (req->enqueued < s.unready_until) {
      ++s.stats.rejected;
      Error e(ErrorCode::kOverloaded, "device " + impl_->device.name() +
                                          " is recovering from repeated out-of-memory errors");
      e.retry_after_s = std::max(1.0, std::ceil(seconds_between(req->enqueued, s.unready_until)));
      return e;
    }
  }
  // Registered before it is queued, so an engine finds it the moment
  // admission grants it.
  impl_->front->put(req);
  EnqueueOptions eo;
  eo.deadline = req->gen.deadline;
  eo.priority = req->gen.priority;
  eo.model = req->model_index;
  eo.tokens = req->gen.max_tokens * std::max(1, req->gen.n);
  eo.sequences = std::max(1, req->gen.n);
  eo.admitted_before = req->gen.admitted_before;
  if (impl_->on_demand()) {
    // It may grow to its worst case: the never-fits check counts that.
    const std::int64_t worst = Impl::cached_positions(req->prompt_tokens(), req->gen.max_tokens);
    eo.peak_bytes = std::max(1, req->gen.n) * kv_blocks_bytes(impl_->options.kv_pool->geometry, worst);
  }
  if (!req->gen.retry.fingerprint.empty()) eo.retry = &req->gen.retry;
  auto ticket = impl_->admission->enqueue(req->admission_id, req->cost, req->enqueued, eo);
  if (!ticket.ok()) {
    impl_->front->take(req->admission_id);
    std::lock_guard lk(s.mu);
    ++s.stats.rejected;
    return std::move(ticket).error();
  }
  if (queue_position) *queue_position = ticket->position;
  if (retry_claimed_by) *retry_claimed_by = ticket->retry_claimed_by;
  impl_->log_memory(*req, "enter");
  impl_->front->notify_all();
  return std::shared_ptr<RequestHandle>(req);
}

void Engine::begin_drain() {
  std::lock_guard lk(impl_->shared->mu);
  impl_->shared->draining = true;
}

bool Engine::wait_idle(TimePoint deadline) const {
  Shared& s = *impl_->shared;
  const EngineFront& f = *impl_->front;
  std::unique_lock lk(s.mu);
  // The shared queue may empty on another engine, which does not notify
  // this one's idle_cv: re-check at least every 50 ms.
  auto idle = [&] { return f.queued_count.load() == 0 && s.stats.running == 0; };
  while (!idle()) {
    const TimePoint now = Clock::now();
    if (now >= deadline) return false;
    s.idle_cv.wait_until(lk, std::min(deadline, now + std::chrono::milliseconds(50)), idle);
  }
  return true;
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
  st.queue_depth = impl_->front->queued_count.load();
  st.max_running = impl_->max_running();
  return st;
}

bool Engine::ready(TimePoint now, std::string* reason) const {
  std::lock_guard lk(impl_->shared->mu);
  if (now >= impl_->shared->unready_until) return true;
  if (reason) {
    *reason = impl_->device.name() + " is recovering from repeated out-of-memory errors (" +
              std::to_string(impl_->shared->stats.consecutive_oom_steps) + " failed steps in a row)";
  }
  return false;
}

AdmissionSnapshot Engine::admission() const { return impl_->admission->snapshot(Clock::now()); }

int Engine::device_index() const { return impl_->device_index; }

std::optional<Duration> Engine::busy_for(TimePoint now) const {
  std::optional<Duration> busy;
  for (const auto* heartbeat : {&impl_->step_started, &impl_->prefill_step_started}) {
    const std::int64_t started = heartbeat->load(std::memory_order_relaxed);
    if (started == kIdle) continue;
    const Duration d = std::max(Duration::zero(), now - TimePoint(Duration(started)));
    if (!busy || d > *busy) busy = d;
  }
  return busy;
}

}  // namespace vg
