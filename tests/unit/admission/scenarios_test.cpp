// Scenarios S1 (deterministic part), S6 and S7 of docs/scenarios.md on the
// admission controller with a manual clock. Sizes relative to the budget B:
// small = B/6, medium = B/3, large = 0.9·B.
#include <gtest/gtest.h>

#include <atomic>
#include <latch>
#include <thread>
#include <vector>

#include "admission/admission_controller.hpp"
#include "manual_clock.hpp"

namespace vg {
namespace {

using namespace std::chrono_literals;
using testing::ManualClock;

constexpr std::int64_t kScenarioBudget = 600;
constexpr std::int64_t kSmall = kScenarioBudget / 6;       // 100
constexpr std::int64_t kMedium = kScenarioBudget / 3;      // 200
constexpr std::int64_t kLarge = kScenarioBudget * 9 / 10;  // 540

std::unique_ptr<AdmissionController> make_scenario(std::int64_t budget, int max_queue,
                                                   std::function<void()> wake = {}) {
  AdmissionOptions o;
  o.budget_bytes = budget;
  o.max_queue = max_queue;
  o.queue_timeout = 60s;
  o.max_bypass = 5s;
  auto c = AdmissionController::create(o, std::move(wake));
  EXPECT_TRUE(c.ok());
  return std::move(c).value();
}

std::vector<RequestId> ids(const std::vector<AdmissionGrant>& grants) {
  std::vector<RequestId> out;
  for (const auto& g : grants) out.push_back(g.id);
  return out;
}

// ---- S1: A holds the only slot; A finishes as B is cancelled; C starts ----

TEST(ScenarioS1, CIsGrantedAtOnceAndTheBudgetReturnsExactly) {
  int wakes = 0;
  auto c = make_scenario(kLarge, 8, [&wakes] { ++wakes; });
  ManualClock clock;
  const std::int64_t start_free = c->snapshot(clock.now()).effective_budget_bytes;
  ASSERT_TRUE(c->enqueue(1, kLarge, clock.now()).ok());  // A
  auto a = c->grant(clock.now());
  ASSERT_EQ(ids(a), std::vector<RequestId>{1});
  ASSERT_TRUE(c->enqueue(2, kLarge, clock.now()).ok());  // B
  ASSERT_TRUE(c->enqueue(3, kLarge, clock.now()).ok());  // C
  EXPECT_TRUE(c->grant(clock.now()).empty());

  clock.advance(1s);
  a[0].lease.release();  // A finishes ...
  EXPECT_TRUE(c->cancel(2));  // ... as B's client disconnects
  EXPECT_EQ(wakes, 1);
  EXPECT_TRUE(c->expire(clock.now()).empty());
  auto granted = c->grant(clock.now());
  ASSERT_EQ(ids(granted), std::vector<RequestId>{3});
  EXPECT_EQ(c->snapshot(clock.now()).reserved_bytes, kLarge);  // never two large at once
  granted.clear();

  const auto snap = c->snapshot(clock.now());
  EXPECT_EQ(snap.effective_budget_bytes - snap.reserved_bytes, start_free);
  EXPECT_EQ(snap.reserved_bytes, 0);
  EXPECT_EQ(snap.queue_depth, 0);
  EXPECT_EQ(snap.peak_reserved_bytes, kLarge);
  EXPECT_EQ(snap.counters.admitted, 2);
  EXPECT_EQ(snap.counters.cancelled, 1);
  EXPECT_EQ(snap.counters.released, 2);
}

TEST(ScenarioS1, ReleaseAndCancelOnTwoThreadsAtOnce) {
  // The same moment, made literal: two threads released by one latch.
  for (int round = 0; round < 300; ++round) {
    std::atomic<int> wakes{0};
    auto c = make_scenario(kLarge, 8, [&wakes] { wakes.fetch_add(1); });
    const TimePoint t0 = TimePoint{} + 1h;
    ASSERT_TRUE(c->enqueue(1, kLarge, t0).ok());
    auto a = c->grant(t0);
    ASSERT_EQ(a.size(), 1u);
    ASSERT_TRUE(c->enqueue(2, kLarge, t0).ok());
    ASSERT_TRUE(c->enqueue(3, kLarge, t0).ok());
    std::latch go(2);
    bool cancelled = false;
    std::thread releaser([&] {
      go.arrive_and_wait();
      a[0].lease.release();
    });
    std::thread canceller([&] {
      go.arrive_and_wait();
      cancelled = c->cancel(2);
    });
    releaser.join();
    canceller.join();
    ASSERT_TRUE(cancelled);
    ASSERT_EQ(wakes.load(), 1);
    auto granted = c->grant(t0 + 1ms);
    ASSERT_EQ(ids(granted), std::vector<RequestId>{3}) << "round " << round;
    granted.clear();
    ASSERT_EQ(c->snapshot(t0).reserved_bytes, 0);
  }
}

// ---- S6: queue limit 8, budget for 6 small, 50 small at once ----

TEST(ScenarioS6, SixRunEightWaitTheRestAreToldWhenToRetry) {
  auto c = make_scenario(6 * kSmall, 8);
  ManualClock clock;
  int queued = 0;
  int overloaded = 0;
  for (RequestId id = 1; id <= 50; ++id) {
    auto t = c->enqueue(id, kSmall, clock.now());
    if (t.ok()) {
      ++queued;
      continue;
    }
    ++overloaded;
    EXPECT_EQ(t.error().code, ErrorCode::kOverloaded);
    ASSERT_TRUE(t.error().retry_after_s.has_value());
    EXPECT_EQ(*t.error().retry_after_s, 9.0);  // 8 waiting + itself at the unmeasured 1 request/s
    EXPECT_NE(t.error().message.find("8 requests waiting (max 8)"), std::string::npos) << t.error().message;
  }
  EXPECT_EQ(queued, 14);
  EXPECT_EQ(overloaded, 36);
  auto running = c->grant(clock.now());
  EXPECT_EQ(running.size(), 6u);
  auto snap = c->snapshot(clock.now());
  EXPECT_EQ(snap.queue_depth, 8);
  EXPECT_EQ(snap.reserved_bytes, 6 * kSmall);
  EXPECT_EQ(snap.counters.rejected_queue_full, 36);

  // I2: everyone finishes; then a new small request is admitted at once.
  running.clear();
  running = c->grant(clock.now());
  EXPECT_EQ(running.size(), 6u);
  running.clear();
  running = c->grant(clock.now());
  EXPECT_EQ(running.size(), 2u);
  running.clear();
  snap = c->snapshot(clock.now());
  EXPECT_EQ(snap.queue_depth, 0);
  EXPECT_EQ(snap.reserved_bytes, 0);
  ASSERT_TRUE(c->enqueue(100, kSmall, clock.now()).ok());
  EXPECT_EQ(c->grant(clock.now()).size(), 1u);
}

TEST(ScenarioS6, GrantingBetweenArrivalsGivesTheSameSplit) {
  auto c = make_scenario(6 * kSmall, 8);
  ManualClock clock;
  std::vector<AdmissionGrant> running;
  int rejected = 0;
  for (RequestId id = 1; id <= 50; ++id) {
    if (!c->enqueue(id, kSmall, clock.now()).ok()) ++rejected;
    for (auto& g : c->grant(clock.now())) running.push_back(std::move(g));
  }
  EXPECT_EQ(running.size(), 6u);
  EXPECT_EQ(c->snapshot(clock.now()).queue_depth, 8);
  EXPECT_EQ(rejected, 36);
}

TEST(ScenarioS6, RetryAfterFollowsTheMeasuredDrainRate) {
  auto c = make_scenario(6 * kSmall, 8);
  ManualClock clock;
  for (int i = 0; i < 30; ++i) {  // 3 completions per second for 10 s
    c->record_completion(clock.now());
    clock.advance(std::chrono::milliseconds(1000) / 3);
  }
  for (RequestId id = 1; id <= 14; ++id) ASSERT_TRUE(c->enqueue(id, kSmall, clock.now()).ok());
  auto refused = c->enqueue(15, kSmall, clock.now());
  ASSERT_FALSE(refused.ok());
  // (8 waiting + 1) / (30 completions in 29 × 333 ms + 333 ms): the promise
  // itself, not rounded (Retry-After rounds it up to 3 s).
  EXPECT_NEAR(*refused.error().retry_after_s, 9 / (30 / 9.99), 1e-9);
}

// ---- S7: aging lets small requests pass a large one, but only for a while ----

TEST(ScenarioS7, SmallOnesPassAWaitingLargeOneUntilMaxBypassThenItRuns) {
  auto c = make_scenario(kScenarioBudget, 16);
  ManualClock clock;
  const TimePoint t0 = clock.now();
  RequestId next = 1;
  std::vector<AdmissionGrant> running;  // oldest first
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(c->enqueue(next++, kSmall, t0).ok());
  running = c->grant(t0);
  ASSERT_EQ(running.size(), 2u);
  const RequestId large = 1000;
  ASSERT_TRUE(c->enqueue(large, kLarge, t0).ok());  // free 400 < 540: waits

  // Clients keep small requests back to back: one ends, the next arrives.
  std::vector<RequestId> small_waiting;
  for (int k = 1; k <= 6; ++k) {
    const TimePoint now = clock.advance(1s);
    running.erase(running.begin());  // the oldest finishes
    const RequestId s = next++;
    ASSERT_TRUE(c->enqueue(s, kSmall, now).ok());
    EXPECT_TRUE(c->expire(now).empty());
    auto g = c->grant(now);
    if (k < 5) {
      EXPECT_EQ(ids(g), std::vector<RequestId>{s}) << "k=" << k << ": a small passes the young large one";
    } else if (k == 5) {
      EXPECT_TRUE(g.empty()) << "the large one has waited max_bypass: nothing passes it";
      small_waiting.push_back(s);
    } else {
      EXPECT_EQ(ids(g), std::vector<RequestId>{large}) << "drained: the large one runs";
      small_waiting.push_back(s);
    }
    EXPECT_LE(c->snapshot(now).reserved_bytes, kScenarioBudget);
    for (auto& x : g) running.push_back(std::move(x));
  }
  ASSERT_EQ(running.size(), 1u);
  EXPECT_EQ(running[0].id, large);
  EXPECT_EQ(running[0].queue_wait, 6s);
  // The small ones that queued behind it are not starved either.
  running.clear();
  auto g = c->grant(clock.advance(1s));
  EXPECT_EQ(ids(g), small_waiting);
}

TEST(ScenarioS7, MediumRunsLargeWaitsSmallOnesPassOnlyWhileItIsYoung) {
  auto c = make_scenario(kScenarioBudget, 16);
  ManualClock clock;
  const TimePoint t0 = clock.now();
  ASSERT_TRUE(c->enqueue(1, kMedium, t0).ok());
  auto medium = c->grant(t0);
  ASSERT_EQ(medium.size(), 1u);
  ASSERT_TRUE(c->enqueue(2, kLarge, t0).ok());

  std::vector<AdmissionGrant> smalls;
  for (RequestId id = 10; id < 14; ++id) {
    const TimePoint now = t0 + std::chrono::seconds(id - 9);  // t0+1s .. t0+4s
    ASSERT_TRUE(c->enqueue(id, kSmall, now).ok());
    auto g = c->grant(now);
    ASSERT_EQ(ids(g), std::vector<RequestId>{id});
    smalls.push_back(std::move(g[0]));
  }
  ASSERT_TRUE(c->enqueue(14, kSmall, t0 + 4500ms).ok());  // no room now (600 of 600)
  EXPECT_TRUE(c->grant(t0 + 4500ms).empty());

  medium.clear();  // 200 free at t0+5s: the small one would fit, but the large one is old now
  EXPECT_TRUE(c->grant(t0 + 5s).empty());
  EXPECT_EQ(c->queue_position(2), 1);
  EXPECT_EQ(c->queue_position(14), 2);

  smalls.clear();
  auto large = c->grant(t0 + 6s);
  ASSERT_EQ(ids(large), std::vector<RequestId>{2});
  large.clear();
  EXPECT_EQ(ids(c->grant(t0 + 7s)), std::vector<RequestId>{14});
}

}  // namespace
}  // namespace vg
