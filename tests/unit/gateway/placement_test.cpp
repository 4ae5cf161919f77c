// Placement over engine snapshots: free budget and slots from an engine's
// last state and what was placed since, the engine a new request goes to,
// the engine with room for a waiting one, and Retry-After on the manual clock.
#include "gateway/placement.hpp"

#include <gtest/gtest.h>

#include <limits>
#include <vector>

#include "../admission/manual_clock.hpp"

namespace vg::gateway {
namespace {

using vg::testing::ManualClock;
using namespace std::chrono_literals;

DeviceState device(std::int64_t budget, std::int64_t reserved, int max_running = 0, int running = 0) {
  DeviceState d;
  d.budget_bytes = budget;
  d.reserved_bytes = reserved;
  d.max_running = max_running;
  d.running = running;
  return d;
}

EngineSnapshot engine(std::int64_t free_budget, int free_slots = 1, std::size_t inflight = 0) {
  EngineSnapshot e;
  e.ready = true;
  e.serves = true;
  e.has_state = true;
  e.free_budget = free_budget;
  e.free_slots = free_slots;
  e.largest_budget = 1 << 30;
  e.inflight = inflight;
  return e;
}

TEST(Placement, FreeBudgetIsTheReadyDevicesFreeBytesLessWaitingAndPlaced) {
  AdmissionState st;
  st.devices = {device(1000, 300), device(500, 600), device(800, 0)};
  st.devices[1].effective_budget_bytes = 700;  // a cut budget counts, not the nominal one
  st.devices[2].ready = false;
  st.waiting.push_back(WaitingRequest{});
  st.waiting.back().cost_bytes = 50;
  PlacedSinceStatus placed;
  placed.add(100);
  EXPECT_EQ(free_budget(st, placed), 700 + 100 - 50 - 100);
  placed.remove(100);
  EXPECT_EQ(free_budget(st, placed), 750);
  EXPECT_EQ(free_budget(std::nullopt, placed), 0) << "no state yet: nothing known free";
}

TEST(Placement, PlacedNeverGoesBelowZero) {
  PlacedSinceStatus placed;
  placed.add(10);
  placed.remove(25);
  placed.remove(0);
  EXPECT_EQ(placed.bytes, 0);
  EXPECT_EQ(placed.requests, 0);
}

TEST(Placement, FreeSlotsCountLimitedReadyDevicesLessQueuedAndPlaced) {
  AdmissionState st;
  st.devices = {device(1, 0, 4, 1), device(1, 0, 2, 2), device(1, 0, 0, 0)};
  st.queued = 1;
  PlacedSinceStatus placed;
  placed.add(0);
  EXPECT_EQ(free_slots(st, placed), 3 + 0 - 1 - 1);
  AdmissionState unlimited;
  unlimited.devices = {device(1, 0)};
  EXPECT_EQ(free_slots(unlimited, placed), kUnlimitedRunning);
  EXPECT_EQ(free_slots(std::nullopt, placed), -1) << "no state yet: no free slot, less what was placed";
}

TEST(Placement, LargestBudgetIsUnknownWithoutDevices) {
  AdmissionState st;
  EXPECT_EQ(largest_budget(st), std::numeric_limits<std::int64_t>::max());
  st.devices = {device(100, 0), device(300, 0), device(900, 0)};
  st.devices[2].ready = false;
  EXPECT_EQ(largest_budget(st), 300);
}

TEST(Placement, PicksAFreeSlotFirstThenTheMostFreeBudget) {
  std::vector<EngineSnapshot> engines = {engine(500, 0), engine(200, 1), engine(300, 2)};
  EXPECT_EQ(pick_engine(engines), 2u);
  engines[2].free_slots = 0;
  EXPECT_EQ(pick_engine(engines), 1u) << "a free sequence slot beats more free budget";
  engines[1].free_slots = 0;
  EXPECT_EQ(pick_engine(engines), 0u);
}

TEST(Placement, ATieGoesToFewerInFlightThenTheEarlierEngine) {
  std::vector<EngineSnapshot> engines = {engine(100, 1, 3), engine(100, 1, 1), engine(100, 1, 1)};
  EXPECT_EQ(pick_engine(engines), 1u);
}

TEST(Placement, PickLeavesOutEnginesThatCannotTakeTheRequest) {
  std::vector<EngineSnapshot> engines = {engine(900), engine(800), engine(700), engine(600)};
  engines[0].ready = false;
  engines[1].serves = false;
  engines[2].skip = true;
  engines[3].largest_budget = 1000;
  EXPECT_EQ(pick_engine(engines), 3u);
  EXPECT_EQ(pick_engine(engines, 1001), std::nullopt) << "its devices are too small";
  EXPECT_EQ(pick_engine(std::vector<EngineSnapshot>{}), std::nullopt);
}

TEST(Placement, RoomNowNeedsAStateNoQueueAFreeSlotAndTheCost) {
  std::vector<EngineSnapshot> engines = {engine(900), engine(800), engine(700), engine(600), engine(500)};
  engines[0].has_state = false;
  engines[1].queue_depth = 1;
  engines[2].free_slots = 0;
  EXPECT_EQ(engine_with_room(engines, 550), 3u);
  EXPECT_EQ(engine_with_room(engines, 550, 3), std::nullopt) << "the engine it waits on is not a move";
  EXPECT_EQ(engine_with_room(engines, 400, 3), 4u);
  EXPECT_EQ(engine_with_room(engines, 601), std::nullopt);
}

TEST(Placement, RoomNowTakesTheMostFreeBudgetAndTheEarlierOnATie) {
  std::vector<EngineSnapshot> engines = {engine(300), engine(700), engine(700)};
  EXPECT_EQ(engine_with_room(engines, 100), 1u);
}

TEST(Placement, RetryAfterIsOneSecondWhileAnEngineIsReady) {
  ManualClock clock;
  std::vector<EngineStartup> engines(2);
  engines[1].ready = true;
  EXPECT_EQ(retry_after_s(engines, clock.now(), 5), 1.0);
}

TEST(Placement, RetryAfterCountsDownAStartingEnginesStartup) {
  ManualClock clock;
  std::vector<EngineStartup> engines(1);
  engines[0].has_process = true;
  engines[0].spawned = clock.now();
  engines[0].startup_s = 8.0;
  EXPECT_DOUBLE_EQ(retry_after_s(engines, clock.now(), 5), 8.0);
  clock.advance(3s);
  EXPECT_DOUBLE_EQ(retry_after_s(engines, clock.now(), 5), 5.0);
  clock.advance(10s);
  EXPECT_DOUBLE_EQ(retry_after_s(engines, clock.now(), 5), 1.0) << "overdue: at least 1 s";
}

TEST(Placement, RetryAfterAddsTheBackoffBeforeARestartAndTakesTheSoonest) {
  ManualClock clock;
  std::vector<EngineStartup> engines(2);
  engines[0].next_start = clock.now() + 4s;  // no process: restarts in 4 s, default start-up 5 s
  engines[1].has_process = true;             // attached, not started here: its whole start-up
  engines[1].startup_s = 12.0;
  EXPECT_DOUBLE_EQ(retry_after_s(engines, clock.now(), 5), 9.0);
  clock.advance(2s);
  EXPECT_DOUBLE_EQ(retry_after_s(engines, clock.now(), 5), 7.0);
}

}  // namespace
}  // namespace vg::gateway
