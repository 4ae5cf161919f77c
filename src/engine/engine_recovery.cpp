// Out-of-memory recovery on the engine thread (policies memory and fixed;
// under none an out-of-memory error fails the step's requests, as a naive
// server would). On an out-of-memory error:
//   1. the OOM governor cuts the effective budget (policy memory);
//   2. the device returns its cached memory (CUDA's caching allocator);
//   3. running sequences, lowest priority class first and within a class
//      the fewest times preempted, then the youngest (preemption_order), are
//      preempted until the leases left fit the effective budget (at least
//      one): their KV caches and leases
//      are freed and they go back to the head of the queue, to be recomputed
//      from prompt + generated tokens, so their clients see only latency;
//      a sequence preempted max_preemptions times already gets 503 instead;
//   4. oom_unready_after out-of-memory steps in a row mark the device not
//      ready for one quiet period (no grants, new requests refused), a
//      breaker against serving errors forever. After it, work is granted
//      again; one more failed step opens it again, one good step closes it.
// Before that line: when other processes take memory, the effective budget
// falls (OomBudget) and shed_over_budget preempts by the same order until
// the leases fit again, before the next step can run out of memory.
// The failed step itself leaves no trace: the model returns an Error (a
// message), its tensors are freed when the step unwinds, and every cache is
// as it was before the step.
#include <spdlog/spdlog.h>

#include <algorithm>

#include "device/device.hpp"
#include "engine/engine_impl.hpp"

namespace vg {

void Engine::Impl::recover_from_oom(TimePoint now, const Error& error, Sequence* victim) {
  oom_budget->on_oom(now);
  device.release_cached_memory();
  if (options.test_leak_bytes_on_oom > 0) device.hold_test_bytes(options.test_leak_bytes_on_oom);
  ++consecutive_oom_steps;
  const bool trip = consecutive_oom_steps >= options.oom_unready_after;
  {
    std::lock_guard lk(shared->mu);
    shared->stats.consecutive_oom_steps = consecutive_oom_steps;
    if (trip) {
      shared->unready_until = now + options.oom_governor.quiet_period;
      ++shared->stats.counters[CounterId::kNotReadyTrips];
    }
    oom_budget->publish(shared->stats);
  }
  if (trip) {
    // Queued work goes to the other engines of the front meanwhile.
    admission->set_engine_available(index, false);
    front->notify_all();
    spdlog::error("{}: {} out-of-memory steps in a row; not ready for {:.1f} s", device.name(),
                  consecutive_oom_steps, to_seconds(options.oom_governor.quiet_period));
  }

  // Victims: `victim` first (its cache allocation failed), then the
  // preemption order, until what is left fits the effective budget.
  std::vector<Sequence*> order = preemption_order();
  if (victim) {
    std::erase(order, victim);
    order.insert(order.begin(), victim);
  }
  std::int64_t held = in_prefill_cost;  // the prefill worker's leases stay
  for (const Sequence* s : order) held += s->lease.bytes();
  const std::int64_t fits =
      admission->snapshot(now).devices[static_cast<std::size_t>(device_index)].effective_budget_bytes;
  const bool by_bytes = options.admission.policy.kind == AdmissionPolicy::Kind::kMemory;
  std::size_t n = 0;
  while (n < order.size() && (n == 0 || (by_bytes && held > fits))) held -= order[n++]->lease.bytes();
  for (std::size_t i = 0; i < n; ++i) {
    preempt_or_refuse(*order[i], now, "device memory ran short during generation (" + error.message + ")");
  }
}

std::vector<Engine::Impl::Sequence*> Engine::Impl::preemption_order() const {
  std::vector<Sequence*> order;
  for (const auto& s : running) {
    if (!s->done) order.push_back(s.get());
  }
  // Lowest priority class first; within a class, those preempted fewer times
  // first (one preempted once is not preempted again before one that never
  // was, so recomputation cannot chase one sequence), then the youngest.
  std::sort(order.begin(), order.end(), [](const Sequence* a, const Sequence* b) {
    if (a->req->gen.priority != b->req->gen.priority) return a->req->gen.priority < b->req->gen.priority;
    if (a->req->preemptions != b->req->preemptions) return a->req->preemptions < b->req->preemptions;
    return a->admitted > b->admitted;
  });
  return order;
}

void Engine::Impl::preempt_or_refuse(Sequence& s, TimePoint now, const std::string& why) {
  if (s.req->preemptions < options.max_preemptions) {
    preempt(s, now);
    return;
  }
  Error busy(ErrorCode::kOverloaded,
             why + "; preempted " + std::to_string(s.req->preemptions) + " times already; retry");
  busy.retry_after_s = admission->retry_after_s(1, now);
  fail(s, std::move(busy));
}

void Engine::Impl::shed_over_budget(TimePoint now) {
  if (options.admission.policy.kind != AdmissionPolicy::Kind::kMemory) return;
  // Only a lower effective budget can leave the leases above it: grants
  // never pass it.
  const std::int64_t effective = oom_budget->effective();
  const bool lowered = effective < shed_checked_budget;
  shed_checked_budget = effective;
  if (!lowered) return;
  const DeviceAdmission dev = admission->snapshot(now).devices[static_cast<std::size_t>(device_index)];
  std::int64_t excess = dev.reserved_bytes - dev.effective_budget_bytes;
  if (excess <= 0) return;
  spdlog::warn("{}: leases hold {} bytes over the lowered effective budget of {} bytes: preempting", device.name(),
               excess, dev.effective_budget_bytes);
  for (Sequence* s : preemption_order()) {
    if (excess <= 0) break;
    excess -= s->lease.bytes();
    preempt_or_refuse(*s, now, "other processes took the device memory it needed");
  }
}

void Engine::Impl::follow_foreign_bytes_file() {
  const std::optional<std::int64_t> bytes = options.test_foreign_bytes.read_file();
  if (!bytes || bytes == foreign_file_bytes) return;
  foreign_file_bytes = bytes;
  const std::int64_t held = device.set_test_foreign_bytes(*bytes);
  spdlog::info("{}: test hook: another process holds {} bytes (asked {})", device.name(), held, *bytes);
}

// Frees the sequence's KV cache and lease and puts its request back at the
// head of the queue with what it produced so far.
void Engine::Impl::preempt(Sequence& s, TimePoint now) {
  std::shared_ptr<Request> req = s.req;
  ++req->preemptions;
  s.done = true;
  release_kv(s);
  req->resume.emplace(std::move(s.p));
  if (pooled()) {
    // It starts again from its context (prompt + generated), whatever of it the prefix cache still holds.
    const int generated = static_cast<int>(req->resume->generated.size());
    req->cost = pool_cost(req->prompt_tokens() + generated, req->gen.max_tokens - generated);
  }
  // Read and reset while only this thread sees it: once requeued, another
  // engine of the front may grant it and take its progress at once, and
  // any engine reports its position under the front's mutex.
  const std::size_t generated = req->resume->generated.size();
  const int preemptions = req->preemptions;
  req->reported_position = 0;
  front->put(req);
  {
    std::lock_guard lk(shared->mu);
    ++shared->stats.counters[CounterId::kPreemptions];
    shared->wake = true;  // grant it again as soon as it fits
  }
  Status st = admission->requeue_front(req->admission_id, req->cost, req->enqueued, now, req->gen.deadline,
                                       req->gen.priority, req->model_index);
  if (!st.ok()) {  // cannot happen: a running request is not queued
    front->take(req->admission_id);
    count_end(*req, &st.error(), static_cast<int>(generated), now);
    req->sink->push(engine_detail::failed(*req, st.error()));
    return;
  }
  front->notify_all();  // another device may take it now
  spdlog::warn("request {} preempted after {} generated tokens (preemption {} of at most {}); requeued at the "
               "head to be recomputed",
               s.req->gen.id, generated, preemptions, options.max_preemptions);
}

void Engine::Impl::on_step_ok() {
  if (consecutive_oom_steps == 0) return;
  consecutive_oom_steps = 0;
  std::lock_guard lk(shared->mu);
  shared->stats.consecutive_oom_steps = 0;
}

bool Engine::Impl::paused(TimePoint now) const {
  std::lock_guard lk(shared->mu);
  return now < shared->unready_until;
}

}  // namespace vg
