// Admission policies and the queue with aging (see admission_policy.hpp).
// Pure functions; any thread.
#include "admission/admission_policy.hpp"

#include <algorithm>
#include <charconv>
#include <numeric>

namespace vg {
namespace {

constexpr int kMaxFixedSlots = 1'000'000;

Error bad_policy(std::string_view text, const std::string& why) {
  return Error(ErrorCode::kConfig, "admission policy '" + std::string(text) + "': " + why +
                                       " (expected 'memory', 'fixed:N' with 1 <= N <= " +
                                       std::to_string(kMaxFixedSlots) + ", or 'none')");
}

bool fits(const QueuedRequest& r, std::int64_t free_bytes) { return r.cost_bytes <= free_bytes; }

}  // namespace

Result<AdmissionPolicy> parse_admission_policy(std::string_view text) {
  if (text == "memory") return AdmissionPolicy{AdmissionPolicy::Kind::kMemory, 0};
  if (text == "none") return AdmissionPolicy{AdmissionPolicy::Kind::kNone, 0};
  constexpr std::string_view kFixed = "fixed:";
  if (text.substr(0, kFixed.size()) != kFixed) return bad_policy(text, "unknown policy");
  const std::string_view digits = text.substr(kFixed.size());
  long long n = 0;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), n);
  if (digits.empty() || ec != std::errc() || end != digits.data() + digits.size()) {
    return bad_policy(text, "N must be a whole number");
  }
  if (n < 1 || n > kMaxFixedSlots) return bad_policy(text, "N out of range");
  return AdmissionPolicy{AdmissionPolicy::Kind::kFixed, static_cast<int>(n)};
}

std::string to_string(const AdmissionPolicy& policy) {
  switch (policy.kind) {
    case AdmissionPolicy::Kind::kMemory: return "memory";
    case AdmissionPolicy::Kind::kFixed: return "fixed:" + std::to_string(policy.fixed_slots);
    case AdmissionPolicy::Kind::kNone: return "none";
  }
  return "memory";
}

Priority effective_priority(const QueuedRequest& r, Duration priority_aging, TimePoint now) {
  if (priority_aging > Duration::zero() && now - r.enqueued_at >= priority_aging) return kTopPriority;
  return r.priority;
}

std::vector<std::size_t> grant_order(std::span<const QueuedRequest> queue, Duration priority_aging, TimePoint now) {
  std::vector<std::size_t> order(queue.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  if (priority_aging <= Duration::zero()) return order;
  std::vector<int> cls(queue.size());
  for (std::size_t i = 0; i < queue.size(); ++i) {
    cls[i] = static_cast<int>(effective_priority(queue[i], priority_aging, now));
  }
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return cls[a] > cls[b]; });
  return order;
}

std::vector<GrantAssignment> assign_grants(const AdmissionPolicy& policy, Duration max_bypass,
                                           Duration priority_aging, std::span<const DeviceGrantState> devices,
                                           std::span<const EngineGrantState> engines,
                                           std::span<const QueuedRequest> queue, TimePoint now,
                                           std::optional<TimePoint>* bypass_closes) {
  std::vector<GrantAssignment> out;
  if (bypass_closes) bypass_closes->reset();
  std::vector<DeviceGrantState> dev(devices.begin(), devices.end());
  std::vector<EngineGrantState> eng(engines.begin(), engines.end());
  for (std::size_t i : grant_order(queue, priority_aging, now)) {
    const QueuedRequest& r = queue[i];
    int best = -1;
    bool had_slot = false;
    for (std::size_t e = 0; e < eng.size(); ++e) {
      const EngineGrantState& x = eng[e];
      if (!x.available || x.model != r.model) continue;
      if (policy.kind != AdmissionPolicy::Kind::kNone && x.max_running > 0 &&
          x.active_leases + r.sequences > x.max_running) {
        continue;
      }
      had_slot = true;
      const DeviceGrantState& d = dev[static_cast<std::size_t>(x.device)];
      switch (policy.kind) {
        case AdmissionPolicy::Kind::kMemory:
          if (!fits(r, d.free_bytes)) continue;
          break;
        case AdmissionPolicy::Kind::kFixed:
          if (d.active_leases + r.sequences > policy.fixed_slots) continue;
          break;
        case AdmissionPolicy::Kind::kNone:
          break;
      }
      if (best >= 0) {
        const EngineGrantState& b = eng[static_cast<std::size_t>(best)];
        const std::int64_t bf = dev[static_cast<std::size_t>(b.device)].free_bytes;
        if (d.free_bytes < bf || (d.free_bytes == bf && x.active_leases >= b.active_leases)) continue;
      }
      best = static_cast<int>(e);
    }
    if (best >= 0) {
      EngineGrantState& x = eng[static_cast<std::size_t>(best)];
      DeviceGrantState& d = dev[static_cast<std::size_t>(x.device)];
      d.free_bytes -= r.cost_bytes;
      d.active_leases += r.sequences;
      x.active_leases += r.sequences;
      out.push_back(GrantAssignment{i, best});
      continue;
    }
    // r waits. Under memory, later requests may pass it only while its
    // bypass window is open (a request that found no free slot anywhere
    // waits for a slot and blocks no one: later requests of its model find
    // no slot either).
    if (policy.kind != AdmissionPolicy::Kind::kMemory || !had_slot) continue;
    const TimePoint closes = r.enqueued_at + max_bypass;
    if (closes <= now) break;
    if (bypass_closes && (!*bypass_closes || closes < **bypass_closes)) *bypass_closes = closes;
  }
  return out;
}

namespace {

// select_grants() and bypass_window_closes() are assign_grants() for one
// device and one engine that serves every queued request. The batch limit
// applies under kMemory only (the callers of kFixed and kNone apply it).
std::vector<GrantAssignment> assign_one(const GrantState& state, std::span<const QueuedRequest> queue,
                                        TimePoint now, std::optional<TimePoint>* bypass_closes) {
  std::vector<QueuedRequest> q(queue.begin(), queue.end());
  for (QueuedRequest& r : q) r.model = 0;
  const DeviceGrantState device{state.free_bytes, state.active_leases};
  const EngineGrantState engine{0, 0, state.policy.kind == AdmissionPolicy::Kind::kMemory ? state.max_running : 0,
                                state.active_leases};
  return assign_grants(state.policy, state.max_bypass, state.priority_aging, std::span(&device, 1),
                       std::span(&engine, 1), q, now, bypass_closes);
}

}  // namespace

std::vector<std::size_t> select_grants(const GrantState& state, std::span<const QueuedRequest> queue, TimePoint now) {
  std::vector<std::size_t> out;
  for (const GrantAssignment& a : assign_one(state, queue, now, nullptr)) out.push_back(a.index);
  return out;
}

std::optional<TimePoint> bypass_window_closes(const GrantState& state, std::span<const QueuedRequest> queue,
                                              TimePoint now) {
  std::optional<TimePoint> closes;
  if (state.policy.kind == AdmissionPolicy::Kind::kMemory) (void)assign_one(state, queue, now, &closes);
  return closes;
}

std::optional<TimePoint> priority_aging_due(std::span<const QueuedRequest> queue, Duration priority_aging,
                                            TimePoint now) {
  if (priority_aging <= Duration::zero()) return std::nullopt;
  // Aging changes the order only for a request below the highest class queued.
  int highest = static_cast<int>(Priority::kLow);
  for (const QueuedRequest& r : queue) {
    highest = std::max(highest, static_cast<int>(effective_priority(r, priority_aging, now)));
  }
  std::optional<TimePoint> due;
  for (const QueuedRequest& r : queue) {
    if (static_cast<int>(effective_priority(r, priority_aging, now)) >= highest) continue;
    const TimePoint t = r.enqueued_at + priority_aging;
    if (!due || t < *due) due = t;
  }
  return due;
}

}  // namespace vg
