// AdmissionController on a manual clock: immediate errors with their numbers,
// grants, expiry, cancel, effective budget, snapshot (docs/scenarios.md S2, I1, I2).
#include "admission/admission_controller.hpp"

#include <gtest/gtest.h>

#include <string>

#include "admission/memory_profile.hpp"
#include "manual_clock.hpp"

namespace vg {
namespace {

using namespace std::chrono_literals;
using testing::ManualClock;

std::unique_ptr<AdmissionController> make_controller(AdmissionOptions o, std::function<void()> on_release = {}) {
  auto c = AdmissionController::create(o, std::move(on_release));
  EXPECT_TRUE(c.ok()) << (c.ok() ? "" : c.error().message);
  return std::move(c).value();
}

AdmissionOptions options(std::int64_t budget, int max_queue = 8) {
  AdmissionOptions o;
  o.budget_bytes = budget;
  o.max_queue = max_queue;
  o.queue_timeout = 30s;
  o.max_bypass = 5s;
  return o;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(AdmissionControllerCreate, RejectsBadOptions) {
  AdmissionOptions o = options(100);
  o.budget_bytes = -1;
  EXPECT_EQ(AdmissionController::create(o).error().code, ErrorCode::kConfig);
  o = options(100);
  o.max_queue = -1;
  EXPECT_FALSE(AdmissionController::create(o).ok());
  o = options(100);
  o.queue_timeout = 0s;
  EXPECT_FALSE(AdmissionController::create(o).ok());
  o = options(100);
  o.max_bypass = -1s;
  EXPECT_FALSE(AdmissionController::create(o).ok());
  o = options(100);
  o.policy = AdmissionPolicy{AdmissionPolicy::Kind::kFixed, 0};
  EXPECT_FALSE(AdmissionController::create(o).ok());
  o = options(100);
  o.retry_after.min_s = 0.5;
  EXPECT_FALSE(AdmissionController::create(o).ok());
  EXPECT_TRUE(AdmissionController::create(options(0, 0)).ok());
}

// S2 boundaries: exactly the budget runs on an empty device; one token more
// can never run and says so with the numbers.
TEST(AdmissionControllerS2, CostEqualToTheBudgetIsAdmittedOneTokenMoreIsNot) {
  MemoryProfile p;
  p.kv_bytes_per_token = 12288;
  p.sequence_overhead_bytes = 4096;
  p.safety_factor = 1.2;
  const std::int64_t budget = request_cost(p, 100, 50);
  auto c = make_controller(options(budget));
  ManualClock clock;

  const std::int64_t over = request_cost(p, 100, 51);
  ASSERT_GT(over, budget);
  ASSERT_LE(over - budget, 14746);  // one token's worth: 12288 × 1.2, rounded up
  auto rejected = c->enqueue(1, over, clock.now());
  ASSERT_FALSE(rejected.ok());
  const Error& e = rejected.error();
  EXPECT_EQ(e.code, ErrorCode::kExceedsDeviceMemory);
  ASSERT_TRUE(e.needed_bytes && e.budget_bytes);
  EXPECT_EQ(*e.needed_bytes, over);
  EXPECT_EQ(*e.budget_bytes, budget);
  EXPECT_TRUE(contains(e.message, std::to_string(over))) << e.message;
  EXPECT_TRUE(contains(e.message, std::to_string(budget))) << e.message;
  EXPECT_EQ(c->snapshot(clock.now()).queue_depth, 0);  // never queued

  auto ticket = c->enqueue(2, budget, clock.now());
  ASSERT_TRUE(ticket.ok());
  EXPECT_EQ(ticket->position, 1);
  auto grants = c->grant(clock.now());
  ASSERT_EQ(grants.size(), 1u);
  EXPECT_EQ(grants[0].id, 2u);
  EXPECT_EQ(grants[0].lease.bytes(), budget);
  const auto snap = c->snapshot(clock.now());
  EXPECT_EQ(snap.reserved_bytes, budget);
  EXPECT_EQ(snap.counters.rejected_never_fits, 1);
  EXPECT_EQ(snap.counters.admitted, 1);
}

TEST(AdmissionController, NeverFitsIsJudgedAgainstTheFullBudgetNotTheFreeBytes) {
  auto c = make_controller(options(1000));
  ManualClock clock;
  ASSERT_TRUE(c->enqueue(1, 600, clock.now()).ok());
  auto held = c->grant(clock.now());
  ASSERT_EQ(held.size(), 1u);
  auto waits = c->enqueue(2, 1000, clock.now());  // does not fit now, but would on an empty device
  ASSERT_TRUE(waits.ok());
  EXPECT_TRUE(c->grant(clock.now()).empty());
  held.clear();  // releases 600
  auto g = c->grant(clock.now());
  ASSERT_EQ(g.size(), 1u);
  EXPECT_EQ(g[0].id, 2u);
}

TEST(AdmissionController, RejectsNegativeCostAndDuplicateIds) {
  auto c = make_controller(options(1000));
  ManualClock clock;
  EXPECT_EQ(c->enqueue(1, -1, clock.now()).error().code, ErrorCode::kInvalidRequest);
  ASSERT_TRUE(c->enqueue(1, 10, clock.now()).ok());
  EXPECT_EQ(c->enqueue(1, 10, clock.now()).error().code, ErrorCode::kInternal);
}

TEST(AdmissionController, LeaseReleaseReturnsBytesAndWakesTheEngine) {
  int wakes = 0;
  auto c = make_controller(options(1000), [&wakes] { ++wakes; });
  ManualClock clock;
  ASSERT_TRUE(c->enqueue(1, 400, clock.now()).ok());
  ASSERT_TRUE(c->enqueue(2, 400, clock.now()).ok());
  auto g = c->grant(clock.now());
  ASSERT_EQ(g.size(), 2u);
  EXPECT_EQ(c->snapshot(clock.now()).reserved_bytes, 800);
  Lease moved = std::move(g[0].lease);
  g[0].lease.release();  // moved-from: nothing
  EXPECT_EQ(wakes, 0);
  moved.release();
  moved.release();
  EXPECT_EQ(wakes, 1);
  EXPECT_EQ(c->snapshot(clock.now()).reserved_bytes, 400);
  g.clear();
  EXPECT_EQ(wakes, 2);
  const auto snap = c->snapshot(clock.now());
  EXPECT_EQ(snap.reserved_bytes, 0);
  EXPECT_EQ(snap.active_leases, 0);
  EXPECT_EQ(snap.peak_reserved_bytes, 800);
  EXPECT_EQ(snap.counters.released, 2);
}

// A padded tensor batch tops its requests' leases up with free bytes: only
// while the budget holds them (I1), counted in reserved and peak bytes, never
// as a request admitted or released, and it blocks grants while held.
TEST(AdmissionController, ReserveExtraTakesOnlyFreeBytesAndReturnsThem) {
  int wakes = 0;
  auto c = make_controller(options(1000), [&wakes] { ++wakes; });
  ManualClock clock;
  ASSERT_TRUE(c->enqueue(1, 400, clock.now()).ok());
  auto g = c->grant(clock.now());
  ASSERT_EQ(g.size(), 1u);
  EXPECT_FALSE(c->reserve_extra(0, 100, 601).has_value());  // 400 + 601 > 1000
  EXPECT_FALSE(c->reserve_extra(0, 100, 0).has_value());
  EXPECT_FALSE(c->reserve_extra(1, 100, 10).has_value());   // no engine 1
  EXPECT_FALSE(c->reserve_extra(0, 1, 10).has_value());     // id 1 holds a lease
  std::optional<Lease> extra = c->reserve_extra(0, 100, 600);
  ASSERT_TRUE(extra.has_value());
  EXPECT_EQ(extra->bytes(), 600);
  EXPECT_EQ(c->snapshot(clock.now()).reserved_bytes, 1000);
  ASSERT_TRUE(c->enqueue(2, 1, clock.now()).ok());
  EXPECT_TRUE(c->grant(clock.now()).empty());  // the budget is full while the extra bytes are held
  extra->release();
  EXPECT_EQ(wakes, 1);
  auto later = c->grant(clock.now());
  EXPECT_EQ(later.size(), 1u);
  const auto snap = c->snapshot(clock.now());
  EXPECT_EQ(snap.reserved_bytes, 401);
  EXPECT_EQ(snap.peak_reserved_bytes, 1000);
  EXPECT_EQ(snap.counters.admitted, 2);
  EXPECT_EQ(snap.counters.released, 0);
  EXPECT_EQ(snap.active_leases, 2);

  AdmissionOptions fixed = options(1000);
  fixed.policy = AdmissionPolicy{AdmissionPolicy::Kind::kFixed, 2};
  auto f = make_controller(fixed);
  EXPECT_TRUE(f->reserve_extra(0, 7, 5000).has_value());  // fixed:N checks no bytes
}

TEST(AdmissionController, ALeaseGrowsOnlyWithinTheBudgetUnlessForcedAndShrinkingWakesTheEngines) {
  int wakes = 0;
  auto c = make_controller(options(1000), [&wakes] { ++wakes; });
  ManualClock clock;
  ASSERT_TRUE(c->enqueue(1, 400, clock.now()).ok());
  auto g = c->grant(clock.now());
  ASSERT_EQ(g.size(), 1u);
  Lease& lease = g[0].lease;
  EXPECT_TRUE(lease.resize(1000));
  EXPECT_EQ(c->snapshot(clock.now()).reserved_bytes, 1000);
  EXPECT_FALSE(lease.resize(1001));  // over the budget: nothing changes
  EXPECT_EQ(lease.bytes(), 1000);
  EXPECT_EQ(wakes, 0);
  EXPECT_TRUE(lease.resize(300));
  EXPECT_EQ(wakes, 1);
  EXPECT_EQ(c->snapshot(clock.now()).reserved_bytes, 300);
  // Forced past the budget (bytes already in use): counted, and nothing is granted until they go.
  std::optional<Lease> orphans = c->hold_extra(0, 99);
  ASSERT_TRUE(orphans.has_value());
  EXPECT_FALSE(c->hold_extra(0, 99).has_value());  // the id holds a lease
  EXPECT_TRUE(orphans->resize(800, /*force=*/true));
  const auto snap = c->snapshot(clock.now());
  EXPECT_EQ(snap.reserved_bytes, 1100);
  EXPECT_EQ(snap.peak_reserved_bytes, 1100);
  EXPECT_EQ(snap.active_leases, 1);  // the extra lease is no request
  ASSERT_TRUE(c->enqueue(2, 1, clock.now()).ok());
  EXPECT_TRUE(c->grant(clock.now()).empty());
  lease.release();
  orphans->release();
  EXPECT_EQ(c->snapshot(clock.now()).reserved_bytes, 0);
  EXPECT_EQ(c->snapshot(clock.now()).counters.released, 1);
  EXPECT_EQ(c->grant(clock.now()).size(), 1u);
}

TEST(AdmissionController, TheNeverFitsCheckCountsWhatALeaseMayGrowTo) {
  auto c = make_controller(options(1000));
  ManualClock clock;
  EnqueueOptions eo;
  eo.peak_bytes = 1001;
  auto r = c->enqueue(1, 100, clock.now(), eo);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::kExceedsDeviceMemory);
  EXPECT_EQ(r.error().needed_bytes, 1001);
  eo.peak_bytes = 1000;
  EXPECT_TRUE(c->enqueue(2, 100, clock.now(), eo).ok());
  EXPECT_EQ(c->snapshot(clock.now()).counters.rejected_never_fits, 1);
}

TEST(AdmissionController, LeaseMayOutliveTheControllerWithoutWakingIt) {
  int wakes = 0;
  auto c = make_controller(options(1000), [&wakes] { ++wakes; });
  ManualClock clock;
  ASSERT_TRUE(c->enqueue(1, 400, clock.now()).ok());
  auto g = c->grant(clock.now());
  ASSERT_EQ(g.size(), 1u);
  c.reset();
  g[0].lease.release();
  EXPECT_EQ(wakes, 0);
  EXPECT_FALSE(g[0].lease.held());
}

TEST(AdmissionController, ExpireReportsQueueWaitLimitWithRetryAfter) {
  auto c = make_controller(options(100));
  ManualClock clock;
  const TimePoint t0 = clock.now();
  ASSERT_TRUE(c->enqueue(1, 100, t0).ok());
  auto held = c->grant(t0);
  ASSERT_EQ(held.size(), 1u);
  ASSERT_TRUE(c->enqueue(2, 100, t0).ok());
  ASSERT_TRUE(c->enqueue(3, 100, t0 + 1s, t0 + 3s).ok());  // own deadline first
  EXPECT_EQ(c->next_wakeup(t0 + 1s), t0 + 3s);

  EXPECT_TRUE(c->expire(t0 + 2999ms).empty());
  auto gone = c->expire(t0 + 3s);
  ASSERT_EQ(gone.size(), 1u);
  EXPECT_EQ(gone[0].id, 3u);
  EXPECT_EQ(gone[0].error.code, ErrorCode::kTimeout);
  EXPECT_EQ(c->next_wakeup(t0 + 3s), t0 + 5s);  // request 2's bypass window closes
  EXPECT_EQ(c->next_wakeup(t0 + 5s), t0 + 30s);

  EXPECT_TRUE(c->expire(t0 + 30s - 1ns).empty());
  gone = c->expire(t0 + 30s);
  ASSERT_EQ(gone.size(), 1u);
  EXPECT_EQ(gone[0].id, 2u);
  EXPECT_EQ(gone[0].error.code, ErrorCode::kOverloaded);
  ASSERT_TRUE(gone[0].error.retry_after_s.has_value());
  EXPECT_GE(*gone[0].error.retry_after_s, 1.0);
  EXPECT_TRUE(contains(gone[0].error.message, "queue wait limit")) << gone[0].error.message;
  EXPECT_FALSE(c->next_wakeup(t0 + 30s).has_value());

  const auto snap = c->snapshot(t0 + 30s);
  EXPECT_EQ(snap.counters.queue_timeout, 1);
  EXPECT_EQ(snap.counters.deadline_expired, 1);
  EXPECT_EQ(snap.queue_depth, 0);
}

// A quiet spell between two bursts is not slow draining: the Retry-After of
// a refusal after it is the one given after a pause of 1 s (idle_after).
TEST(AdmissionController, RetryAfterIgnoresTheTimeTheDeviceSatIdle) {
  const auto retry_after_of_a_burst_at = [](Duration pause) {
    auto c = make_controller(options(100, 1));
    ManualClock clock;
    const TimePoint t0 = clock.now();
    // Four requests one after another, 2 s each: completions at 2, 4, 6, 8 s.
    for (RequestId id = 1; id <= 4; ++id) {
      const TimePoint start = t0 + std::chrono::seconds(2 * (id - 1));
      EXPECT_TRUE(c->enqueue(id, 100, start).ok());
      auto g = c->grant(start);
      EXPECT_EQ(g.size(), 1u);
      c->record_completion(start + 2s);
      g[0].lease.release();
    }
    // Then, after `pause` with nothing to do: one runs, one waits, one is refused.
    const TimePoint burst = t0 + 8s + pause;
    EXPECT_TRUE(c->enqueue(10, 100, burst).ok());
    auto running = c->grant(burst);
    EXPECT_EQ(running.size(), 1u);
    EXPECT_TRUE(c->enqueue(11, 100, burst).ok());
    auto refused = c->enqueue(12, 100, burst);
    EXPECT_FALSE(refused.ok());
    if (refused.ok()) return -1.0;
    EXPECT_EQ(refused.error().code, ErrorCode::kOverloaded);
    return refused.error().retry_after_s.value_or(-1.0);
  };
  const double after_1s = retry_after_of_a_burst_at(1s);
  EXPECT_GE(after_1s, 1.0);
  EXPECT_LE(after_1s, 10.0);  // 3 requests at 4 completions in 7 s
  EXPECT_EQ(retry_after_of_a_burst_at(20s), after_1s);   // inside the 30 s window
  EXPECT_EQ(retry_after_of_a_burst_at(300s), after_1s);  // long after it
}

TEST(AdmissionController, NextWakeupIncludesTheBypassWindow) {
  auto c = make_controller(options(1000));
  ManualClock clock;
  const TimePoint t0 = clock.now();
  ASSERT_TRUE(c->enqueue(1, 500, t0).ok());
  auto held = c->grant(t0);
  ASSERT_TRUE(c->enqueue(2, 900, t0 + 1s).ok());  // waits, window closes at t0 + 6 s
  EXPECT_EQ(c->next_wakeup(t0 + 2s), t0 + 6s);
  EXPECT_EQ(c->next_wakeup(t0 + 6s), t0 + 31s);  // window closed: only the queue wait limit
}

TEST(AdmissionController, CancelRemovesOnlyQueuedRequests) {
  auto c = make_controller(options(100));
  ManualClock clock;
  ASSERT_TRUE(c->enqueue(1, 100, clock.now()).ok());
  ASSERT_TRUE(c->enqueue(2, 100, clock.now()).ok());
  auto g = c->grant(clock.now());
  ASSERT_EQ(g.size(), 1u);
  EXPECT_FALSE(c->cancel(1));  // granted: its lease holder releases it
  EXPECT_TRUE(c->cancel(2));
  EXPECT_FALSE(c->cancel(2));
  EXPECT_FALSE(c->cancel(99));
  g.clear();
  EXPECT_TRUE(c->grant(clock.now()).empty());
  const auto snap = c->snapshot(clock.now());
  EXPECT_EQ(snap.counters.cancelled, 1);
  EXPECT_EQ(snap.reserved_bytes, 0);
}

// Each request is counted once by how it leaves the queue: a request granted
// before (requeued after a preemption, or resubmitted after its engine died)
// is granted again, not admitted again, and its end in the queue is its
// engine's to count.
TEST(AdmissionController, ARequestGrantedBeforeCountsAsRegrantedAndItsQueueEndIsNotCounted) {
  auto c = make_controller(options(100));
  ManualClock clock;
  ASSERT_TRUE(c->enqueue(1, 100, clock.now()).ok());
  auto g = c->grant(clock.now());
  ASSERT_EQ(g.size(), 1u);
  g.clear();  // preempted: its lease released, then requeued
  ASSERT_TRUE(c->requeue_front(1, 100, clock.now(), clock.now()).ok());
  ASSERT_EQ(c->grant(clock.now()).size(), 1u);  // granted again, lease released at once
  ASSERT_TRUE(c->requeue_front(1, 100, clock.now(), clock.now()).ok());
  EXPECT_TRUE(c->cancel(1));
  EnqueueOptions resubmitted;
  resubmitted.admitted_before = true;
  ASSERT_TRUE(c->enqueue(2, 100, clock.now(), resubmitted).ok());
  ASSERT_EQ(c->grant(clock.now()).size(), 1u);
  ASSERT_TRUE(c->enqueue(3, 100, clock.now(), resubmitted).ok());
  clock.advance(31s);
  EXPECT_EQ(c->expire(clock.now()).size(), 1u);
  ASSERT_TRUE(c->enqueue(4, 100, clock.now()).ok());
  EXPECT_TRUE(c->cancel(4));
  const AdmissionCounters n = c->snapshot(clock.now()).counters;
  EXPECT_EQ(n.admitted, 1);
  EXPECT_EQ(n.regranted, 2);
  EXPECT_EQ(n.requeued, 2);
  EXPECT_EQ(n.cancelled, 1);  // request 4 only
  EXPECT_EQ(n.queue_timeout, 0);
}

TEST(AdmissionController, EffectiveBudgetCutRevokesNothingAndBlocksGrantsUntilUnder) {
  auto c = make_controller(options(1000));
  ManualClock clock;
  ASSERT_TRUE(c->enqueue(1, 600, clock.now()).ok());
  ASSERT_TRUE(c->enqueue(2, 300, clock.now()).ok());
  auto g = c->grant(clock.now());
  ASSERT_EQ(g.size(), 2u);
  EXPECT_EQ(c->set_effective_budget(500), 500);
  ASSERT_TRUE(c->enqueue(3, 50, clock.now()).ok());
  EXPECT_TRUE(c->grant(clock.now()).empty());
  auto snap = c->snapshot(clock.now());
  EXPECT_EQ(snap.reserved_bytes, 900);  // nothing revoked
  EXPECT_EQ(snap.effective_budget_bytes, 500);
  EXPECT_EQ(snap.budget_bytes, 1000);

  g[0].lease.release();  // reserved 300 of 500
  auto g3 = c->grant(clock.now());
  ASSERT_EQ(g3.size(), 1u);
  EXPECT_EQ(g3[0].id, 3u);
  ASSERT_TRUE(c->enqueue(4, 200, clock.now()).ok());
  EXPECT_TRUE(c->grant(clock.now()).empty());  // 350 + 200 > 500
  EXPECT_EQ(c->set_effective_budget(5000), 1000);  // clamped to the budget
  EXPECT_EQ(c->grant(clock.now()).size(), 1u);
  EXPECT_EQ(c->set_effective_budget(-7), 0);
}

TEST(AdmissionController, SnapshotListsQueuePositionsInFifoOrder) {
  auto c = make_controller(options(100));
  ManualClock clock;
  const TimePoint t0 = clock.now();
  ASSERT_TRUE(c->enqueue(10, 100, t0).ok());
  auto held = c->grant(t0);
  EXPECT_EQ(c->enqueue(11, 60, t0 + 1s)->position, 1);
  EXPECT_EQ(c->enqueue(12, 70, t0 + 2s)->position, 2);
  EXPECT_EQ(c->queue_position(12), 2);
  EXPECT_FALSE(c->queue_position(10).has_value());
  const auto snap = c->snapshot(t0 + 3s);
  ASSERT_EQ(snap.queue.size(), 2u);
  EXPECT_EQ(snap.queue[0].id, 11u);
  EXPECT_EQ(snap.queue[0].position, 1);
  EXPECT_EQ(snap.queue[0].cost_bytes, 60);
  EXPECT_EQ(snap.queue[0].waited, 2s);
  EXPECT_EQ(snap.queue[1].id, 12u);
  EXPECT_EQ(snap.queue[1].waited, 1s);
  EXPECT_TRUE(c->cancel(11));
  EXPECT_EQ(c->queue_position(12), 1);
}

TEST(AdmissionController, DropAllEmptiesTheQueue) {
  auto c = make_controller(options(100));
  ManualClock clock;
  ASSERT_TRUE(c->enqueue(1, 100, clock.now()).ok());
  auto held = c->grant(clock.now());
  ASSERT_TRUE(c->enqueue(2, 100, clock.now()).ok());
  ASSERT_TRUE(c->enqueue(3, 100, clock.now()).ok());
  EXPECT_EQ(c->drop_all(), (std::vector<RequestId>{2, 3}));
  const auto snap = c->snapshot(clock.now());
  EXPECT_EQ(snap.queue_depth, 0);
  EXPECT_EQ(snap.counters.dropped, 2);
  EXPECT_EQ(snap.active_leases, 1);  // running work is not the queue's business
}

TEST(AdmissionController, FixedPolicyIsASemaphore) {
  AdmissionOptions o = options(1000, 2);
  o.policy = *parse_admission_policy("fixed:2");
  auto c = make_controller(o);
  ManualClock clock;
  EXPECT_EQ(c->enqueue(9, 1001, clock.now()).error().code, ErrorCode::kExceedsDeviceMemory);
  for (RequestId id = 1; id <= 4; ++id) ASSERT_TRUE(c->enqueue(id, 900, clock.now()).ok()) << id;
  EXPECT_EQ(c->enqueue(5, 1, clock.now()).error().code, ErrorCode::kOverloaded);  // 2 wait (max 2)
  auto g = c->grant(clock.now());
  ASSERT_EQ(g.size(), 2u);  // costs ignored: 1800 bytes of a 1000-byte budget
  EXPECT_EQ(c->snapshot(clock.now()).reserved_bytes, 1800);
  EXPECT_TRUE(c->grant(clock.now()).empty());
  g.pop_back();
  auto g2 = c->grant(clock.now());
  ASSERT_EQ(g2.size(), 1u);
  EXPECT_EQ(g2[0].id, 3u);
}

TEST(AdmissionController, NonePolicyGrantsEverythingAtOnce) {
  AdmissionOptions o = options(1000, 0);
  o.policy = *parse_admission_policy("none");
  auto c = make_controller(o);
  ManualClock clock;
  for (RequestId id = 1; id <= 50; ++id) ASSERT_TRUE(c->enqueue(id, 5000, clock.now()).ok()) << id;
  auto g = c->grant(clock.now());
  EXPECT_EQ(g.size(), 50u);
  EXPECT_EQ(c->snapshot(clock.now()).reserved_bytes, 250000);  // the naive baseline overcommits
}

}  // namespace
}  // namespace vg
