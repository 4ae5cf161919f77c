#include "admission/oom_governor.hpp"

#include <gtest/gtest.h>

#include "manual_clock.hpp"

namespace vg {
namespace {

using testing::ManualClock;
using namespace std::chrono_literals;

constexpr std::int64_t kBudget = 1000;

TEST(OomGovernor, DefaultsAreValidAndStartAtTheFullBudget) {
  ASSERT_TRUE(validate(OomGovernorOptions{}).ok());
  ManualClock clock;
  OomGovernor g({}, kBudget);
  EXPECT_EQ(g.budget(), kBudget);
  EXPECT_EQ(g.effective(), kBudget);
  EXPECT_EQ(g.floor(), 250);
  EXPECT_EQ(g.step(), 100);
  EXPECT_FALSE(g.next_change());
  EXPECT_FALSE(g.on_tick(clock.advance(1h)));
  EXPECT_EQ(g.effective(), kBudget);
}

TEST(OomGovernor, RejectsOptionsOutOfRange) {
  auto with = [](auto set) {
    OomGovernorOptions o;
    set(o);
    return validate(o);
  };
  EXPECT_FALSE(with([](auto& o) { o.decrease_factor = 0; }).ok());
  EXPECT_FALSE(with([](auto& o) { o.decrease_factor = 1; }).ok());
  EXPECT_FALSE(with([](auto& o) { o.floor_fraction = -0.1; }).ok());
  EXPECT_FALSE(with([](auto& o) { o.floor_fraction = 1.5; }).ok());
  EXPECT_FALSE(with([](auto& o) { o.quiet_period = 0s; }).ok());
  EXPECT_FALSE(with([](auto& o) { o.increase_step = 0; }).ok());
  EXPECT_FALSE(with([](auto& o) { o.increase_step = 1.1; }).ok());
  EXPECT_TRUE(with([](auto& o) { o.floor_fraction = 0; o.increase_step = 1; }).ok());
}

TEST(OomGovernor, AnOomHalvesTheEffectiveBudget) {
  ManualClock clock;
  OomGovernor g({}, kBudget);
  auto c = g.on_oom(clock.now());
  ASSERT_TRUE(c);
  EXPECT_EQ(c->from, kBudget);
  EXPECT_EQ(c->to, 500);
  EXPECT_EQ(g.effective(), 500);
  EXPECT_EQ(g.next_change(), clock.now() + 10s);
}

TEST(OomGovernor, RepeatedOomsStopAtTheFloor) {
  ManualClock clock;
  OomGovernor g({}, kBudget);
  EXPECT_EQ(g.on_oom(clock.now())->to, 500);
  EXPECT_EQ(g.on_oom(clock.advance(1s))->to, 250);
  EXPECT_FALSE(g.on_oom(clock.advance(1s)));  // at the floor: no change
  EXPECT_EQ(g.effective(), 250);
}

TEST(OomGovernor, FloorAboveTheHalfLimitsTheFirstCut) {
  ManualClock clock;
  OomGovernorOptions o;
  o.floor_fraction = 0.8;
  OomGovernor g(o, kBudget);
  EXPECT_EQ(g.on_oom(clock.now())->to, 800);
}

TEST(OomGovernor, RestoresOneStepPerQuietPeriod) {
  ManualClock clock;
  OomGovernor g({}, kBudget);
  g.on_oom(clock.now());
  EXPECT_FALSE(g.on_tick(clock.advance(9s)));  // not quiet long enough
  EXPECT_EQ(g.effective(), 500);
  auto c = g.on_tick(clock.advance(1s));
  ASSERT_TRUE(c);
  EXPECT_EQ(c->from, 500);
  EXPECT_EQ(c->to, 600);
  EXPECT_FALSE(g.on_tick(clock.advance(5s)));  // the next period counts from the raise
  EXPECT_EQ(g.on_tick(clock.advance(5s))->to, 700);
  EXPECT_EQ(g.next_change(), clock.now() + 10s);
}

TEST(OomGovernor, SeveralQuietPeriodsAtOnceRaiseSeveralSteps) {
  ManualClock clock;
  OomGovernor g({}, kBudget);
  g.on_oom(clock.now());
  EXPECT_EQ(g.on_tick(clock.advance(35s))->to, 800);
  // The remainder of the current period still counts.
  EXPECT_EQ(g.on_tick(clock.advance(5s))->to, 900);
}

TEST(OomGovernor, NeverRaisesAboveTheBudget) {
  ManualClock clock;
  OomGovernorOptions o;
  o.increase_step = 0.3;
  OomGovernor g(o, kBudget);
  g.on_oom(clock.now());  // 500
  EXPECT_EQ(g.on_tick(clock.advance(10s))->to, 800);
  EXPECT_EQ(g.on_tick(clock.advance(10s))->to, kBudget);  // 1100 clamped
  EXPECT_FALSE(g.next_change());
  EXPECT_FALSE(g.on_tick(clock.advance(1h)));
  EXPECT_EQ(g.effective(), kBudget);

  OomGovernor h({}, kBudget);
  h.on_oom(clock.now());
  EXPECT_EQ(h.on_tick(clock.advance(24h))->to, kBudget);  // many periods at once
}

TEST(OomGovernor, AnOomDuringRestoreCutsAgainAndRestartsTheQuietPeriod) {
  ManualClock clock;
  OomGovernor g({}, kBudget);
  g.on_oom(clock.now());                            // 500
  EXPECT_EQ(g.on_tick(clock.advance(10s))->to, 600);
  EXPECT_EQ(g.on_tick(clock.advance(10s))->to, 700);
  auto c = g.on_oom(clock.advance(3s));
  ASSERT_TRUE(c);
  EXPECT_EQ(c->from, 700);
  EXPECT_EQ(c->to, 350);
  EXPECT_FALSE(g.on_tick(clock.advance(9s)));  // quiet period restarted at the OOM
  EXPECT_EQ(g.on_tick(clock.advance(1s))->to, 450);
}

TEST(OomGovernor, AnOomAtTheFloorStillRestartsTheQuietPeriod) {
  ManualClock clock;
  OomGovernorOptions o;
  o.floor_fraction = 0.5;
  OomGovernor g(o, kBudget);
  g.on_oom(clock.now());
  EXPECT_FALSE(g.on_oom(clock.advance(8s)));
  EXPECT_FALSE(g.on_tick(clock.advance(8s)));
  EXPECT_EQ(g.on_tick(clock.advance(2s))->to, 600);
}

TEST(OomGovernor, ZeroBudgetNeverChanges) {
  ManualClock clock;
  OomGovernor g({}, 0);
  EXPECT_FALSE(g.on_oom(clock.now()));
  EXPECT_FALSE(g.on_tick(clock.advance(1h)));
  EXPECT_EQ(g.effective(), 0);
  EXPECT_FALSE(g.next_change());
}

TEST(OomGovernor, TheEffectiveBudgetFollowsTheCeilingBothWays) {
  OomGovernor g({}, kBudget);
  auto down = g.set_ceiling(400);  // another process took 600 bytes
  ASSERT_TRUE(down);
  EXPECT_EQ(down->from, kBudget);
  EXPECT_EQ(down->to, 400);
  EXPECT_EQ(g.ceiling(), 400);
  EXPECT_EQ(g.floor(), 100);  // a share of the memory really there
  EXPECT_FALSE(g.next_change());  // nothing to raise: at the ceiling
  EXPECT_FALSE(g.set_ceiling(400));
  auto up = g.set_ceiling(5000);  // freed again: back to the budget, never above
  ASSERT_TRUE(up);
  EXPECT_EQ(up->to, kBudget);
  EXPECT_EQ(g.ceiling(), kBudget);
  EXPECT_EQ(g.floor(), 250);
  EXPECT_EQ(g.set_ceiling(-5)->to, 0);
}

TEST(OomGovernor, AnOomCutHoldsWhenTheCeilingRises) {
  ManualClock clock;
  OomGovernor g({}, kBudget);
  g.set_ceiling(600);
  EXPECT_EQ(g.on_oom(clock.now())->to, 300);
  EXPECT_EQ(g.on_oom(clock.advance(1s))->to, 150);  // the floor: 25 % of 600, not of the budget
  EXPECT_FALSE(g.on_oom(clock.advance(1s)));
  EXPECT_EQ(g.effective(), 150);
  EXPECT_FALSE(g.set_ceiling(kBudget));  // the cut stays until quiet periods pass
  EXPECT_EQ(g.effective(), 150);
  EXPECT_EQ(g.on_tick(clock.advance(10s))->to, 250);  // steps stay 10 % of the budget
  auto lower = g.set_ceiling(200);  // a lower ceiling still binds at once
  ASSERT_TRUE(lower);
  EXPECT_EQ(lower->to, 200);
  EXPECT_FALSE(g.on_tick(clock.advance(1s)));  // at the ceiling
  // The ceiling rises again: the cut is still in force, so the budget does
  // not jump to it; quiet periods raise it step by step.
  EXPECT_FALSE(g.set_ceiling(700));
  EXPECT_EQ(g.effective(), 200);
  EXPECT_EQ(g.on_tick(clock.advance(10s))->to, 300);
  EXPECT_EQ(g.on_tick(clock.advance(50s))->to, 700);  // back at the ceiling: the cut is over
  EXPECT_EQ(g.set_ceiling(900)->to, 900);             // and the ceiling is followed again
}

}  // namespace
}  // namespace vg
