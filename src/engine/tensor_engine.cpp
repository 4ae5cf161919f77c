// TensorEngine (see tensor_engine.hpp): submit, the registry of queued tensor
// requests, the engine thread's loop (grant, batch, run, split on
// out-of-memory) and shutdown.
#include "engine/tensor_engine.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "admission/memory_profile.hpp"
#include "device/device.hpp"
#include "engine/compute_thread.hpp"
#include "engine/oom_budget.hpp"
#include "engine/tensor_batch.hpp"
#include "metrics/server_metrics.hpp"
#include "model/torchscript_model.hpp"

namespace vg {
namespace {


Duration ms(double v) { return std::chrono::duration_cast<Duration>(std::chrono::duration<double, std::milli>(v)); }

}  // namespace

struct TensorJob {
  TensorRequest req;
  TensorDone done;
  RequestId admission_id = 0;
  std::int64_t cost = 0;
  TimePoint enqueued;
  TimePoint granted;
  Lease lease;
  std::atomic<bool> cancelled{false};
  std::atomic<bool> finished{false};

  /// Whether this caller is the one that finishes it (once; later calls: false).
  bool claim() { return !finished.exchange(true); }
  /// Releases the lease and answers: after claim().
  void deliver(Result<TensorResult> result) {
    lease.release();
    done(std::move(result));
  }
  /// claim(), then deliver(); false when it was finished already.
  bool finish(Result<TensorResult> result) {
    if (!claim()) return false;
    deliver(std::move(result));
    return true;
  }
};

struct TensorRegistry {
  std::shared_ptr<EngineFront> front;
  std::mutex mu;
  std::unordered_map<RequestId, std::shared_ptr<TensorJob>> queued;  // guarded by mu

  void put(std::shared_ptr<TensorJob> job) {
    std::lock_guard lk(mu);
    const RequestId id = job->admission_id;
    queued.emplace(id, std::move(job));
  }
  std::shared_ptr<TensorJob> take(RequestId id) {
    std::lock_guard lk(mu);
    auto it = queued.find(id);
    if (it == queued.end()) return nullptr;
    auto job = std::move(it->second);
    queued.erase(it);
    return job;
  }
  /// Removes every queued tensor request from the queue and fails it (shutdown).
  void fail_queued(const Error& error) {
    std::vector<std::shared_ptr<TensorJob>> jobs;
    {
      std::lock_guard lk(mu);
      for (auto& [id, job] : queued) jobs.push_back(job);
    }
    for (auto& job : jobs) {
      if (front_admission(*front).cancel(job->admission_id) && take(job->admission_id)) job->finish(error);
    }
  }
  /// A queued request expired (its wait limit or deadline).
  void expire(AdmissionExpiry e) {
    if (auto job = take(e.id)) {
      spdlog::info("request {} left the queue: {}", job->req.id, e.error.message);
      job->finish(std::move(e.error));
    }
  }
};

std::shared_ptr<TensorRegistry> make_tensor_registry(std::shared_ptr<EngineFront> front) {
  auto registry = std::make_shared<TensorRegistry>();
  registry->front = front;
  std::weak_ptr<TensorRegistry> weak = registry;
  set_front_other_expiry(*front, [weak](AdmissionExpiry e) {
    if (auto r = weak.lock()) r->expire(std::move(e));
  });
  return registry;
}

namespace {

class JobHandle final : public TensorHandle {
 public:
  JobHandle(std::weak_ptr<TensorJob> job, std::weak_ptr<TensorRegistry> registry)
      : job_(std::move(job)), registry_(std::move(registry)) {}
  void cancel() override {
    auto job = job_.lock();
    auto registry = registry_.lock();
    if (!job || !registry) return;
    job->cancelled.store(true);
    if (front_admission(*registry->front).cancel(job->admission_id)) {
      if (auto queued = registry->take(job->admission_id)) {
        queued->finish(Error(ErrorCode::kCancelled, "client closed the connection while queued"));
      }
    }
    notify_front(*registry->front);  // a granted one is dropped by its engine
  }

 private:
  std::weak_ptr<TensorJob> job_;
  std::weak_ptr<TensorRegistry> registry_;
};

}  // namespace

/// What wakes the engine thread; shared with the front's listener, which may
/// outlive the engine.
struct TensorSignal {
  std::mutex mu;
  std::condition_variable cv;
  bool wake = false;      // guarded by mu
  bool stopping = false;  // guarded by mu
  void notify() {
    {
      std::lock_guard lk(mu);
      wake = true;
    }
    cv.notify_all();
  }
};

struct TensorEngine::Impl {
  Options options;
  TorchScriptModel& model;
  Device& device;
  std::shared_ptr<EngineFront> front;
  std::shared_ptr<TensorRegistry> registry;
  AdmissionController* admission = nullptr;
  int index = 0;
  AdmissionTopology::Engine place;
  std::optional<OomBudget> oom;  // engine thread only (after create)
  std::shared_ptr<TensorSignal> signal = std::make_shared<TensorSignal>();
  std::atomic<bool> draining{false};

  mutable std::mutex mu;
  mutable std::condition_variable idle_cv;
  TensorEngineStats stats;  // guarded by mu
  std::thread thread;

  std::vector<std::shared_ptr<TensorJob>> pending;  // engine thread only: granted, not yet run
  std::atomic<std::int64_t> passes{0};  // forward passes attempted

  /// The metric children of this model (looked up once; null without metrics).
  struct Recorders {
    metrics::Histogram* queue_wait = nullptr;        // every request
    metrics::Histogram* duration = nullptr;          // every request
    metrics::Histogram* model_queue_wait = nullptr;  // {model}
    metrics::Histogram* model_duration = nullptr;    // {model}
    metrics::Histogram* model_batch_size = nullptr;  // {model}
    metrics::Counter* completed = nullptr;
    metrics::Counter* failed = nullptr;
    metrics::Counter* cancelled = nullptr;
  } rec;

  /// A batch chosen to run now, with the bytes reserved beyond its leases.
  struct ReadyBatch {
    std::vector<std::shared_ptr<TensorJob>> jobs;
    Lease extra;  // held for the pass: its padded peak above the members' leases
  };

  Impl(const Options& o, TorchScriptModel& m, Device& d) : options(o), model(m), device(d) {}

  void end(const std::shared_ptr<TensorJob>& job, Result<TensorResult> result, TimePoint now) {
    const bool ok = result.ok();
    const ErrorCode code = ok ? ErrorCode::kInternal : result.error().code;
    // A granted job is finished only here (a cancel finishes queued ones):
    // its metrics and counters go in before its answer does, so a client
    // that reads them after its answer sees it counted.
    if (!job->claim()) return;
    if (rec.duration) {
      const double s = seconds_between(job->enqueued, now);
      rec.duration->observe(s);
      rec.model_duration->observe(s);
      (ok ? rec.completed : code == ErrorCode::kCancelled ? rec.cancelled : rec.failed)->inc();
    }
    if (ok) admission->record_completion(now);
    {
      std::lock_guard lk(mu);
      --stats.running;
      if (ok)
        ++stats.counters[CounterId::kCompleted];
      else if (code == ErrorCode::kCancelled)
        ++stats.counters[CounterId::kCancelled];
      else
        ++stats.counters[CounterId::kFailed];
    }
    job->deliver(std::move(result));
    idle_cv.notify_all();
  }

  void run();
  /// Expires the queue when no language-model engine does (they hand the
  /// tensor requests' expiries to the registry).
  void expire_queue(TimePoint now) {
    if (front_language_engines(*front) != 0) return;
    for (AdmissionExpiry& e : admission->expire(now)) registry->expire(std::move(e));
  }
  void take_grants(TimePoint now);
  void drop_pending(TimePoint now);
  /// The next batch to run now, removed from `pending` (plan_batch over the
  /// pending requests in grant order); empty (and *wait_until set) while a
  /// partial batch may wait `delay_ms` for more.
  ReadyBatch next_batch(TimePoint now, double delay_ms, std::optional<TimePoint>* wait_until);
  void run_batch(std::vector<std::shared_ptr<TensorJob>> batch);
  void fail_all(std::vector<std::shared_ptr<TensorJob>>& jobs, const Error& error, TimePoint now) {
    for (auto& j : jobs) end(j, error, now);
    jobs.clear();
  }
  bool naive() const { return options.policy.kind == AdmissionPolicy::Kind::kNone; }
};

TensorEngine::TensorEngine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

TensorEngine::~TensorEngine() { shutdown(); }

Result<std::unique_ptr<TensorEngine>> TensorEngine::create(const Options& options, TorchScriptModel& model,
                                                           Device& device, std::shared_ptr<EngineFront> front,
                                                           std::shared_ptr<TensorRegistry> registry, int index) {
  if (options.max_batch < 1) return Error(ErrorCode::kConfig, "max_batch must be >= 1");
  if (!(options.max_batch_delay_ms >= 0)) return Error(ErrorCode::kConfig, "max_batch_delay_ms must be >= 0");
  if (!front || !registry) return Error(ErrorCode::kConfig, "a tensor engine needs an admission front");
  if (Status st = validate(options.oom_governor); !st.ok()) return st.error();
  auto place = front_engine(*front, index);
  if (!place.ok()) return std::move(place).error();
  auto impl = std::make_unique<Impl>(options, model, device);
  impl->front = front;
  impl->registry = std::move(registry);
  impl->admission = &front_admission(*front);
  impl->index = index;
  impl->place = *place;
  if (metrics::ServerMetrics* m = options.metrics) {
    const std::vector<std::string> labels{options.model_name};
    impl->rec = Impl::Recorders{&m->queue_wait_seconds,
                                &m->request_duration_seconds,
                                &m->tensor_queue_wait_seconds.with(labels),
                                &m->tensor_request_duration_seconds.with(labels),
                                &m->tensor_batch_size.with(labels),
                                &m->tensor_requests_total.with({options.model_name, "completed"}),
                                &m->tensor_requests_total.with({options.model_name, "failed"}),
                                &m->tensor_requests_total.with({options.model_name, "cancelled"})};
  }
  impl->oom.emplace(options.oom_governor, options.budget_bytes, options.policy.kind == AdmissionPolicy::Kind::kMemory,
                    *impl->admission, device, options.budget_inputs, place->device, index);
  add_front_listener(*front, [weak = std::weak_ptr<TensorSignal>(impl->signal)] {
    if (auto s = weak.lock()) s->notify();
  });
  Impl* raw = impl.get();
  impl->thread = start_compute_thread(device, [raw] { raw->run(); });
  return std::unique_ptr<TensorEngine>(new TensorEngine(std::move(impl)));
}

std::int64_t TensorEngine::cost(const TensorRequest& request) const {
  std::int64_t elements = 0;
  for (const HostTensor& t : request.inputs) elements += t.elements();
  return tensor_cost(impl_->options.profile, elements);
}

Result<std::shared_ptr<TensorHandle>> TensorEngine::submit(TensorRequest request, TensorDone done,
                                                           int* queue_position) {
  if (impl_->draining.load()) {
    return shutting_down();
  }
  auto job = std::make_shared<TensorJob>();
  job->cost = cost(request);
  job->req = std::move(request);
  job->done = std::move(done);
  job->admission_id = next_front_id(*impl_->front);
  job->enqueued = Clock::now();
  impl_->registry->put(job);
  auto ticket = impl_->admission->enqueue(job->admission_id, job->cost, job->enqueued, job->req.deadline,
                                          job->req.priority, impl_->place.model);
  if (!ticket.ok()) {
    impl_->registry->take(job->admission_id);
    Error e = std::move(ticket).error();
    if (e.code == ErrorCode::kExceedsDeviceMemory) {
      e.message = "a forward pass over these inputs needs " + format_bytes(job->cost) +
                  " (predicted peak x --memory-safety) and can never fit: " + e.message;
    }
    return e;
  }
  if (queue_position) *queue_position = ticket->position;
  notify_front(*impl_->front);
  return std::shared_ptr<TensorHandle>(std::make_shared<JobHandle>(job, impl_->registry));
}

void TensorEngine::Impl::take_grants(TimePoint now) {
  const int free = std::max(0, (naive() ? kUnlimitedRunning : options.max_batch) - static_cast<int>(pending.size()));
  if (free == 0) return;
  for (AdmissionGrant& g : admission->grant(now, free, index)) {
    auto job = registry->take(g.id);
    if (!job) {  // cancelled between grant and here
      g.lease.release();
      continue;
    }
    job->lease = std::move(g.lease);
    job->granted = now;
    if (rec.queue_wait) {
      const double s = seconds_between(job->enqueued, now);
      rec.queue_wait->observe(s);
      rec.model_queue_wait->observe(s);
    }
    {
      std::lock_guard lk(mu);
      ++stats.running;
    }
    pending.push_back(std::move(job));
  }
}

void TensorEngine::Impl::drop_pending(TimePoint now) {
  std::vector<std::shared_ptr<TensorJob>> keep;
  for (auto& job : pending) {
    if (job->cancelled.load()) {
      end(job, Error(ErrorCode::kCancelled, "client closed the connection"), now);
    } else if (job->req.deadline && now >= *job->req.deadline) {
      end(job, Error(ErrorCode::kTimeout, "request deadline passed before its forward pass"), now);
    } else {
      keep.push_back(std::move(job));
    }
  }
  pending.swap(keep);
}

TensorEngine::Impl::ReadyBatch TensorEngine::Impl::next_batch(TimePoint now, double delay_ms,
                                                              std::optional<TimePoint>* wait_until) {
  ReadyBatch ready;
  if (pending.empty()) return ready;
  std::vector<BatchCandidate> candidates;
  candidates.reserve(pending.size());
  for (const auto& job : pending) {
    BatchCandidate c;
    for (const HostTensor& t : job->req.inputs) c.shapes.push_back(t.shape);
    c.held_bytes = job->lease.bytes();
    candidates.push_back(std::move(c));
  }
  const AdmissionSnapshot snap = admission->snapshot(now);
  BatchLimits limits;
  limits.max_requests = options.max_batch;
  limits.max_rows = model.spec().max_batch();
  const bool by_bytes = options.policy.kind == AdmissionPolicy::Kind::kMemory;
  if (by_bytes) {
    const DeviceAdmission& dev = snap.devices.at(static_cast<std::size_t>(place.device));
    limits.extra_bytes = std::max<std::int64_t>(0, dev.effective_budget_bytes - dev.reserved_bytes);
  }
  BatchPlan plan = plan_batch(model.spec(), options.profile, candidates, limits);
  // A partial batch waits for more while requests may still come: not past
  // the delay, and nothing left waiting in the queue (then the budget or
  // max_running is what limits the batch, and waiting would not grow it).
  const TimePoint due = pending.front()->granted + ms(delay_ms);
  if (!plan.full && now < due && snap.queue_depth == 0) {
    *wait_until = due;
    return ready;
  }
  if (by_bytes && plan.cost_bytes > plan.held_bytes) {
    // Padding: the pass needs more than its leases; reserve the difference
    // for it, or (the free bytes went to a grant meanwhile) batch fewer.
    if (auto extra = admission->reserve_extra(index, next_front_id(*front), plan.cost_bytes - plan.held_bytes)) {
      ready.extra = std::move(*extra);
    } else {
      limits.extra_bytes = 0;
      plan = plan_batch(model.spec(), options.profile, candidates, limits);
    }
  }
  for (std::size_t i : plan.members) ready.jobs.push_back(pending[i]);
  for (auto it = plan.members.rbegin(); it != plan.members.rend(); ++it) {
    pending.erase(pending.begin() + static_cast<long>(*it));
  }
  return ready;
}

void TensorEngine::Impl::run_batch(std::vector<std::shared_ptr<TensorJob>> batch) {
  if (batch.empty()) return;
  std::vector<TensorInputs> inputs;
  for (auto& job : batch) {
    TensorInputs in;
    for (const HostTensor& t : job->req.inputs) in.push_back(&t);
    inputs.push_back(std::move(in));
  }
  const std::int64_t pass = passes.fetch_add(1) + 1;
  if (options.inject_oom_at_pass > 0 && pass >= options.inject_oom_at_pass &&
      pass < options.inject_oom_at_pass + std::max<std::int64_t>(1, options.inject_oom_count)) {
    device.inject_out_of_memory();
  }
  auto out = model.forward(inputs);
  const TimePoint now = Clock::now();
  if (out.ok()) {
    {
      std::lock_guard lk(mu);
      ++stats.batches;
      stats.batched_requests += static_cast<std::int64_t>(batch.size());
      stats.largest_batch = std::max(stats.largest_batch, static_cast<int>(batch.size()));
    }
    if (rec.model_batch_size) rec.model_batch_size->observe(static_cast<double>(batch.size()));
    std::vector<std::vector<std::vector<std::int64_t>>> shapes(batch.size());
    std::vector<const std::vector<std::vector<std::int64_t>>*> members;
    for (std::size_t i = 0; i < batch.size(); ++i) {
      for (const HostTensor& t : batch[i]->req.inputs) shapes[i].push_back(t.shape);
      members.push_back(&shapes[i]);
    }
    const auto pass_shapes = batch_shapes(model.spec(), members);
    const std::int64_t pass_cost = tensor_cost(options.profile, total_elements(pass_shapes));
    for (std::size_t i = 0; i < batch.size(); ++i) {
      TensorResult r;
      r.outputs = std::move((*out)[i]);
      r.batch_requests = static_cast<int>(batch.size());
      if (!pass_shapes.empty()) r.batch_shape = pass_shapes.front();
      r.batch_cost_bytes = pass_cost;
      r.queue_ms = ms_between(batch[i]->enqueued, batch[i]->granted);
      r.compute_ms = ms_between(batch[i]->granted, now);
      end(batch[i], std::move(r), now);
    }
    return;
  }
  Error error = std::move(out).error();
  if (error.code != ErrorCode::kOutOfMemory) {
    spdlog::error("forward pass of {} requests failed: {}", batch.size(), error.message);
    fail_all(batch, error, now);
    return;
  }
  {
    std::lock_guard lk(mu);
    ++stats.counters[CounterId::kOutOfMemory];
  }
  device.release_cached_memory();
  if (naive()) {  // the baseline: no recovery
    fail_all(batch, Error(ErrorCode::kOutOfMemory, "device out of memory: " + error.message), now);
    return;
  }
  oom->on_oom(now);
  {
    EngineStats published;
    oom->publish(published);
    std::lock_guard lk(mu);
    stats.counters[CounterId::kOomBudgetCuts] = published.counters[CounterId::kOomBudgetCuts];
    if (batch.size() > 1) ++stats.counters[CounterId::kOomBatchSplits];
  }
  if (batch.size() > 1) {
    spdlog::warn("a batch of {} requests ran out of memory on {}: retrying it in halves", batch.size(), device.name());
    const auto half = batch.begin() + static_cast<long>(batch.size() / 2);
    std::vector<std::shared_ptr<TensorJob>> first(batch.begin(), half), second(half, batch.end());
    run_batch(std::move(first));
    run_batch(std::move(second));
    return;
  }
  Error busy(ErrorCode::kOverloaded, "device memory ran short during the forward pass (" + error.message +
                                         "); retry later");
  busy.retry_after_s = admission->retry_after_s(1, now);
  fail_all(batch, busy, now);
}

void TensorEngine::Impl::run() {
  DeviceScope scope(&device);
  while (true) {
    std::optional<TimePoint> wait_until;
    TimePoint now = Clock::now();
    expire_queue(now);
    oom->on_tick(now);
    take_grants(now);
    drop_pending(now);
    if (naive()) {
      // The baseline runs every waiting request at once, as a server without
      // admission would: one thread per batch of equal shapes.
      std::vector<std::vector<std::shared_ptr<TensorJob>>> batches;
      while (!pending.empty()) {
        std::optional<TimePoint> ignored;
        batches.push_back(next_batch(now, 0, &ignored).jobs);
      }
      std::vector<std::thread> threads;
      for (auto& b : batches) {
        threads.emplace_back([this, b = std::move(b)]() mutable {
          DeviceScope inner(&device);
          run_batch(std::move(b));
        });
      }
      for (auto& t : threads) t.join();
      if (!batches.empty() && options.step_delay_ms > 0) std::this_thread::sleep_for(ms(options.step_delay_ms));
    } else {
      while (true) {
        ReadyBatch batch = next_batch(now, options.max_batch_delay_ms, &wait_until);
        if (batch.jobs.empty()) break;
        run_batch(std::move(batch.jobs));
        batch.extra.release();
        if (options.step_delay_ms > 0) std::this_thread::sleep_for(ms(options.step_delay_ms));
        now = Clock::now();
        expire_queue(now);
        take_grants(now);
        drop_pending(now);
      }
    }
    now = Clock::now();
    std::optional<TimePoint> next = admission->next_wakeup(now);
    if (wait_until && (!next || *wait_until < *next)) next = wait_until;
    if (auto change = oom->next_change(); change && (!next || *change < *next)) next = change;
    std::unique_lock lk(signal->mu);
    const auto ready = [&] { return signal->wake || signal->stopping; };
    if (next) {
      signal->cv.wait_until(lk, *next, ready);
    } else {
      signal->cv.wait(lk, ready);
    }
    signal->wake = false;
    if (signal->stopping) break;
  }
  const TimePoint now = Clock::now();
  const Error bye = shutting_down();
  fail_all(pending, bye, now);
  registry->fail_queued(bye);
}

void TensorEngine::begin_drain() { impl_->draining.store(true); }

bool TensorEngine::wait_idle(TimePoint deadline) const {
  std::unique_lock lk(impl_->mu);
  return impl_->idle_cv.wait_until(lk, deadline, [&] { return impl_->stats.running == 0; });
}

void TensorEngine::request_stop() {
  {
    std::lock_guard lk(impl_->signal->mu);
    impl_->signal->stopping = true;
  }
  impl_->signal->cv.notify_all();
}

void TensorEngine::shutdown() {
  request_stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

AdmissionSnapshot TensorEngine::admission() const { return impl_->admission->snapshot(Clock::now()); }

TensorEngineStats TensorEngine::stats() const {
  std::lock_guard lk(impl_->mu);
  TensorEngineStats s = impl_->stats;
  return s;
}

}  // namespace vg
