// Priority classes in admission on a manual clock: grant order, aging that
// bounds how long a lower class waits, bypass inside the order, and the
// controller's positions, grants and wakeups (docs/admission-and-memory.md "Traffic policies").
#include <gtest/gtest.h>

#include <vector>

#include "admission/admission_controller.hpp"
#include "admission/admission_policy.hpp"
#include "manual_clock.hpp"

namespace vg {
namespace {

using namespace std::chrono_literals;
using Kind = AdmissionPolicy::Kind;
using Indices = std::vector<std::size_t>;
using P = Priority;

using testing::kT0;

QueuedRequest class_req(RequestId id, std::int64_t cost, TimePoint at, P p) { return QueuedRequest{id, cost, at, p}; }

GrantState memory(std::int64_t free_bytes, Duration aging = 10s, Duration max_bypass = 5s) {
  GrantState s{AdmissionPolicy{Kind::kMemory, 0}, free_bytes, 0, max_bypass};
  s.priority_aging = aging;
  return s;
}

TEST(PriorityOrder, HigherClassFirstFifoWithinAClass) {
  const std::vector<QueuedRequest> q = {class_req(1, 1, kT0, P::kLow), class_req(2, 1, kT0, P::kNormal),
                                        class_req(3, 1, kT0 + 1s, P::kHigh), class_req(4, 1, kT0 + 1s, P::kLow),
                                        class_req(5, 1, kT0 + 2s, P::kHigh)};
  EXPECT_EQ(grant_order(q, 10s, kT0 + 2s), (Indices{2, 4, 1, 0, 3}));
  // Aging 0: classes are ignored.
  EXPECT_EQ(grant_order(q, 0s, kT0 + 2s), (Indices{0, 1, 2, 3, 4}));
}

TEST(PriorityOrder, AgingPromotesAWaitingRequestToTheTopClass) {
  const std::vector<QueuedRequest> q = {class_req(1, 1, kT0, P::kLow), class_req(2, 1, kT0 + 5s, P::kHigh)};
  EXPECT_EQ(grant_order(q, 10s, kT0 + 9999ms), (Indices{1, 0}));
  // At 10 s the low one counts as high and, being first in the queue, leads.
  EXPECT_EQ(effective_priority(q[0], 10s, kT0 + 10s), P::kHigh);
  EXPECT_EQ(grant_order(q, 10s, kT0 + 10s), (Indices{0, 1}));
}

TEST(PrioritySelect, HighOvertakesLowWhenOnlyOneFits) {
  const std::vector<QueuedRequest> q = {class_req(1, 100, kT0, P::kLow), class_req(2, 100, kT0, P::kLow),
                                        class_req(3, 100, kT0 + 1s, P::kHigh)};
  EXPECT_EQ(select_grants(memory(100), q, kT0 + 1s), (Indices{2}));
  EXPECT_EQ(select_grants(memory(200), q, kT0 + 1s), (Indices{2, 0}));
  // max_running is a slot count in grant order too.
  GrantState one_slot = memory(1000);
  one_slot.max_running = 1;
  EXPECT_EQ(select_grants(one_slot, q, kT0 + 1s), (Indices{2}));
}

TEST(PrioritySelect, FixedAndNoneFollowTheOrder) {
  const std::vector<QueuedRequest> q = {class_req(1, 1, kT0, P::kLow), class_req(2, 1, kT0, P::kNormal),
                                        class_req(3, 1, kT0, P::kHigh)};
  GrantState fixed{AdmissionPolicy{Kind::kFixed, 2}, 0, 0, 5s};
  fixed.priority_aging = 10s;
  EXPECT_EQ(select_grants(fixed, q, kT0), (Indices{2, 1}));
  GrantState none{AdmissionPolicy{Kind::kNone, 0}, 0, 0, 5s};
  none.priority_aging = 10s;
  EXPECT_EQ(select_grants(none, q, kT0), (Indices{2, 1, 0}));
}

TEST(PrioritySelect, BypassAppliesInGrantOrder) {
  // A large high request that does not fit may be passed by a small low one
  // only while it is younger than max_bypass.
  const std::vector<QueuedRequest> q = {class_req(1, 500, kT0, P::kHigh), class_req(2, 100, kT0, P::kLow)};
  EXPECT_EQ(select_grants(memory(200), q, kT0 + 4s), (Indices{1}));
  EXPECT_EQ(select_grants(memory(200), q, kT0 + 5s), Indices{});
}

TEST(PrioritySelect, NoClassStarves) {
  // A stream of high requests keeps arriving; each low request is granted
  // within priority_aging of its arrival, once the device has room.
  const Duration aging = 10s;
  std::vector<QueuedRequest> q = {class_req(1, 100, kT0, P::kLow)};
  RequestId next = 2;
  TimePoint now = kT0;
  bool low_granted = false;
  for (int step = 0; step < 100 && !low_granted; ++step) {
    now += 1s;
    q.push_back(class_req(next++, 100, now, P::kHigh));
    const Indices g = select_grants(memory(100, aging), q, now);  // room for one a second
    ASSERT_EQ(g.size(), 1u);
    low_granted = q[g[0]].id == 1;
    q.erase(q.begin() + static_cast<std::ptrdiff_t>(g[0]));
  }
  EXPECT_TRUE(low_granted);
  EXPECT_LE(now - kT0, aging);
}

TEST(PriorityAgingDue, OnlyWhenAgingChangesTheOrder) {
  const std::vector<QueuedRequest> same = {class_req(1, 1, kT0, P::kNormal), class_req(2, 1, kT0, P::kNormal)};
  EXPECT_FALSE(priority_aging_due(same, 10s, kT0).has_value());
  const std::vector<QueuedRequest> mixed = {class_req(1, 1, kT0, P::kLow), class_req(2, 1, kT0 + 3s, P::kNormal),
                                            class_req(3, 1, kT0 + 4s, P::kHigh)};
  EXPECT_EQ(priority_aging_due(mixed, 10s, kT0 + 4s), kT0 + 10s);
  EXPECT_EQ(priority_aging_due(mixed, 10s, kT0 + 10s), kT0 + 13s);
  EXPECT_FALSE(priority_aging_due(mixed, 0s, kT0).has_value());
}

std::unique_ptr<AdmissionController> controller(int max_running) {
  AdmissionOptions o;
  o.budget_bytes = 1000;
  o.max_queue = 16;
  o.max_running = max_running;
  o.priority_aging = 10s;
  auto c = AdmissionController::create(o);
  EXPECT_TRUE(c.ok());
  return std::move(c).value();
}

TEST(PriorityController, PositionsGrantsAndSnapshotFollowTheOrder) {
  testing::ManualClock clock;
  auto c = controller(1);
  ASSERT_EQ(c->enqueue(1, 100, clock.now(), std::nullopt, P::kLow)->position, 1);
  auto granted = c->grant(clock.now());
  ASSERT_EQ(granted.size(), 1u);  // the one slot is now held
  EXPECT_EQ(granted[0].priority, P::kLow);
  EXPECT_EQ(c->enqueue(2, 100, clock.now(), std::nullopt, P::kLow)->position, 1);
  EXPECT_EQ(c->enqueue(3, 100, clock.now(), std::nullopt, P::kLow)->position, 2);
  EXPECT_EQ(c->enqueue(4, 100, clock.now(), std::nullopt, P::kNormal)->position, 1);
  EXPECT_EQ(c->enqueue(5, 100, clock.now(), std::nullopt, P::kHigh)->position, 1);
  EXPECT_EQ(c->queue_position(2, clock.now()), 3);
  const AdmissionSnapshot snap = c->snapshot(clock.now());
  ASSERT_EQ(snap.queue.size(), 4u);
  EXPECT_EQ(snap.queue[0].id, 5u);
  EXPECT_EQ(snap.queue[0].priority, P::kHigh);
  EXPECT_EQ(snap.queue[3].id, 3u);
  EXPECT_EQ(snap.queue[3].position, 4);
  // The slot frees: the high request goes first, then normal, then the lows in order.
  std::vector<RequestId> order;
  for (int i = 0; i < 4; ++i) {
    granted.clear();
    auto next = c->grant(clock.now());
    ASSERT_EQ(next.size(), 1u);
    order.push_back(next[0].id);
    granted = std::move(next);
  }
  EXPECT_EQ(order, (std::vector<RequestId>{5, 4, 2, 3}));
}

TEST(PriorityController, WakesWhenARequestAgesIntoTheTopClass) {
  testing::ManualClock clock;
  auto c = controller(1);
  ASSERT_TRUE(c->enqueue(1, 100, clock.now(), std::nullopt, P::kHigh).ok());
  auto held = c->grant(clock.now());
  ASSERT_TRUE(c->enqueue(2, 100, clock.now(), std::nullopt, P::kLow).ok());
  clock.advance(2s);
  ASSERT_TRUE(c->enqueue(3, 100, clock.now(), std::nullopt, P::kHigh).ok());
  // Queue wait limit (30 s) is later than the low request's aging (10 s).
  EXPECT_EQ(c->next_wakeup(clock.now()), clock.now() - 2s + 10s);
}

TEST(PriorityController, RejectsNegativeAging) {
  AdmissionOptions o;
  o.budget_bytes = 1;
  o.priority_aging = -1s;
  EXPECT_EQ(AdmissionController::create(o).error().code, ErrorCode::kConfig);
}

}  // namespace
}  // namespace vg
