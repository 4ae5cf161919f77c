// InferenceService's admission state (see inference_service.hpp): each
// device's budget, leases, memory, counters and KV block pool, and the
// front's queue and counters, for /v1/admission, /metrics and the gateways.
#include "device/device.hpp"
#include "engine/engine.hpp"
#include "engine/tensor_engine.hpp"
#include "service/inference_service_entries.hpp"

namespace vg {
namespace {

// The KV block pool of one engine on its device (one at most: a pool is
// made only for a device with one model).
void add_kv_pool(DeviceState& ds, const EngineStats& es) {
  const KvPoolStats& k = es.kv_pool;
  if (!k.reservation) return;
  ds.kv_reservation = kv_reservation_name(*k.reservation);
  ds.kv_block_tokens = k.block_tokens;
  ds.kv_block_bytes = k.block_bytes;
  ds.kv_blocks_total = k.blocks_total;
  ds.kv_blocks_used = k.blocks_used;
  ds.kv_blocks_cached = k.blocks_cached;
  DeviceCounters& c = ds.counters;
  c[DeviceCounterId::kKvBlocksEvicted] = k.blocks_evicted;
  c[DeviceCounterId::kKvPromptTokens] = k.prompt_tokens;
  c[DeviceCounterId::kKvPrefixHitTokens] = k.prefix_hit_tokens;
  c[DeviceCounterId::kKvRecomputedTokens] = k.recomputed_tokens;
  c[DeviceCounterId::kKvGrowthPreemptions] = k.growth_preemptions;
}

// One engine's budget changes on its device. The engines of one device each
// follow the same foreign bytes, so those count once (the largest); their
// out-of-memory governors are their own, so those add up.
void add_budget_changes(DeviceState& ds, const EngineStats& es) {
  DeviceCounters& c = ds.counters;
  c[DeviceCounterId::kBudgetCutsOutOfMemory] += es.counters[CounterId::kOomBudgetCuts];
  c[DeviceCounterId::kBudgetRaisesQuietPeriod] += es.oom_budget_raises;
  std::int64_t& grew = c[DeviceCounterId::kBudgetCutsForeign];
  std::int64_t& shrank = c[DeviceCounterId::kBudgetRaisesForeign];
  grew = std::max(grew, es.budget_foreign_grew);
  shrank = std::max(shrank, es.budget_foreign_shrank);
}

// The per-device counters of an engine's (language or tensor) counters.
void add_device_counters(DeviceState& ds, const Counters& c) {
  ds.counters[DeviceCounterId::kCompleted] += c[CounterId::kCompleted];
  ds.counters[DeviceCounterId::kOutOfMemory] += c[CounterId::kOutOfMemory];
  ds.counters[DeviceCounterId::kPreemptions] += c[CounterId::kPreemptions];
}

// The admission front's counters: its queue's decisions and booked retries.
void add_admission_counters(Counters& c, const AdmissionSnapshot& as) {
  c[CounterId::kAdmitted] += as.counters.admitted;
  c[CounterId::kRejectedNeverFits] += as.counters.rejected_never_fits;
  c[CounterId::kRejectedQueueFull] += as.counters.rejected_queue_full;
  c[CounterId::kQueueTimeouts] += as.counters.queue_timeout;
  c[CounterId::kDeadlineExpired] += as.counters.deadline_expired;
  c[CounterId::kCancelledQueued] += as.counters.cancelled;
  c[CounterId::kMoved] += as.counters.withdrawn;
  c[CounterId::kRetryBooked] += as.retry_booking_counters.booked;
  c[CounterId::kRetryClaimed] += as.retry_booking_counters.claimed;
  c[CounterId::kRetryExpired] += as.retry_booking_counters.expired;
  c[CounterId::kRetryEarly] += as.retry_booking_counters.early;
  c[CounterId::kRetryRefused] += as.retry_booking_counters.refused;
  c[CounterId::kRetryReclaimed] += as.retry_booking_counters.reclaimed;
}

}  // namespace

AdmissionState InferenceService::admission_state() const {
  AdmissionState st;
  st.policy = config_.admission;
  st.draining = draining_.load();
  const TimePoint now = Clock::now();
  std::optional<AdmissionSnapshot> as;
  for (auto& d : devices_) {
    DeviceState ds;
    ds.name = d->name;
    for (auto& m : models_) ds.models.push_back(m->info.id);
    if (!d->failure.empty()) {
      ds.ready = false;
      ds.state = "unhealthy";
      ds.reason = d->failure;
      ds.capacity_bytes = d->failed_capacity;
      st.devices.push_back(ds);
      continue;
    }
    if (!as && !d->engines.empty()) as = d->engines.front()->admission();  // the front's: every device, the one queue
    if (!as && !d->tensor_engines.empty()) as = d->tensor_engines.front()->admission();
    const DeviceMemory mem = d->setup.device->memory();
    ds.capacity_bytes = mem.capacity;
    ds.used_bytes = mem.used;
    ds.peak_bytes = mem.peak;
    ds.allocated_bytes = mem.allocated;
    ds.cache_reserved_bytes = mem.cache_reserved;
    ds.foreign_bytes = mem.foreign;
    ds.resident_bytes = d->setup.resident_bytes;
    ds.workspace_bytes = d->setup.workspace_bytes;
    const DeviceAdmission& da = as->devices[static_cast<std::size_t>(d->topology_index)];
    ds.budget_bytes = da.budget_bytes;
    ds.effective_budget_bytes = da.effective_budget_bytes;
    ds.reserved_bytes = da.reserved_bytes;
    ds.peak_reserved_bytes = da.peak_reserved_bytes;
    for (auto& e : d->engines) {
      const EngineStats es = e->stats();
      ds.running += es.running;
      ds.max_running += es.max_running;
      add_device_counters(ds, es.counters);
      add_budget_changes(ds, es);
      add_kv_pool(ds, es);
      st.counters += es.counters;
      std::string why;
      if (!e->ready(now, &why)) {
        ds.ready = false;
        ds.state = "not_ready";
        ds.reason = why;
      }
    }
    for (auto& e : d->tensor_engines) {
      const TensorEngineStats ts = e->stats();
      ds.running += ts.running;
      add_device_counters(ds, ts.counters);
      st.counters += ts.counters;
    }
    st.running += ds.running;
    st.devices.push_back(ds);
  }
  if (as) {
    st.queue_depth = as->queue_depth;
    st.queued = as->queued;
    for (const QueuedView& q : as->queue) {
      if (st.waiting.size() >= AdmissionState::kMaxWaitingShown) break;
      st.waiting.push_back(
          WaitingRequest{q.position, q.cost_bytes, to_seconds(q.waited), std::string(to_string(q.priority))});
    }
    add_admission_counters(st.counters, *as);
    st.retry_bookings = as->retry_bookings;
    st.retry_places = as->retry_places;
  }
  return st;
}

}  // namespace vg
