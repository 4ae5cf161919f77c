// Several engines drawing from one queue (assign_grants and the
// AdmissionController topology): placement by most free budget, the shared
// queue, per-model routing, unavailable engines, per-device accounting.
#include <gtest/gtest.h>

#include <vector>

#include "admission/admission_controller.hpp"
#include "admission/admission_policy.hpp"
#include "manual_clock.hpp"

namespace vg {
namespace {

using namespace std::chrono_literals;
using testing::ManualClock;
using Kind = AdmissionPolicy::Kind;

using testing::kT0;
const AdmissionPolicy kMemory{Kind::kMemory, 0};

QueuedRequest model_req(RequestId id, std::int64_t cost, TimePoint at = kT0, int model = 0) {
  return QueuedRequest{id, cost, at, Priority::kNormal, model};
}

std::vector<GrantAssignment> assign(std::vector<DeviceGrantState> devices, std::vector<EngineGrantState> engines,
                                    std::vector<QueuedRequest> q, TimePoint now = kT0,
                                    AdmissionPolicy policy = kMemory) {
  return assign_grants(policy, 5s, 0s, devices, engines, q, now);
}

TEST(AssignGrants, PlacesEachRequestOnTheDeviceWithTheMostFreeBudget) {
  // Device 1 has more free bytes: the first request goes there; then device
  // 0 has more, and so on.
  const auto a = assign({{100, 0}, {150, 0}}, {{0, 0, 8, 0}, {1, 0, 8, 0}},
                        {model_req(1, 60), model_req(2, 60), model_req(3, 60)});
  EXPECT_EQ(a, (std::vector<GrantAssignment>{{0, 1}, {1, 0}, {2, 1}}));
}

TEST(AssignGrants, TiesGoToTheEngineWithFewerLeasesThenTheLowerIndex) {
  EXPECT_EQ(assign({{100, 2}, {100, 1}}, {{0, 0, 8, 2}, {1, 0, 8, 1}}, {model_req(1, 10)}),
            (std::vector<GrantAssignment>{{0, 1}}));
  EXPECT_EQ(assign({{100, 0}, {100, 0}}, {{0, 0, 8, 0}, {1, 0, 8, 0}}, {model_req(1, 10)}),
            (std::vector<GrantAssignment>{{0, 0}}));
}

TEST(AssignGrants, ARequestGoesWhereItFitsNotWhereMostIsFree) {
  // 80 fits only on device 0 once device 1's free bytes are below it.
  const auto a = assign({{90, 0}, {70, 0}}, {{0, 0, 8, 0}, {1, 0, 8, 0}}, {model_req(1, 80), model_req(2, 60)});
  EXPECT_EQ(a, (std::vector<GrantAssignment>{{0, 0}, {1, 1}}));
}

TEST(AssignGrants, FullBatchesAndUnavailableEnginesAreSkipped) {
  // Engine 0 has the most room but its batch is full; engine 1 is not
  // available; engine 2 takes the request.
  const auto a =
      assign({{500, 2}, {400, 0}, {100, 0}}, {{0, 0, 2, 2}, {1, 0, 8, 0, false}, {2, 0, 8, 0}}, {model_req(1, 50)});
  EXPECT_EQ(a, (std::vector<GrantAssignment>{{0, 2}}));
}

TEST(AssignGrants, RequestsGoOnlyToEnginesOfTheirModel) {
  // Two models on one device (engines 0, 1) and model 1 on a second device.
  const auto a = assign({{100, 0}, {300, 0}}, {{0, 0, 8, 0}, {0, 1, 8, 0}, {1, 1, 8, 0}},
                        {model_req(1, 50, kT0, 1), model_req(2, 50, kT0, 0), model_req(3, 60, kT0, 0)});
  EXPECT_EQ(a, (std::vector<GrantAssignment>{{0, 2}, {1, 0}}));  // 3 no longer fits device 0
}

TEST(AssignGrants, AnOldRequestThatFitsNowhereBlocksLaterOnesOnEveryDevice) {
  const std::vector<DeviceGrantState> dev{{50, 0}, {60, 0}};
  const std::vector<EngineGrantState> eng{{0, 0, 8, 0}, {1, 0, 8, 0}};
  // Young: later requests pass it.
  EXPECT_EQ(assign(dev, eng, {model_req(1, 100), model_req(2, 30)}, kT0 + 1s), (std::vector<GrantAssignment>{{1, 1}}));
  // Its bypass window closed: no one passes it, on any device.
  EXPECT_TRUE(assign(dev, eng, {model_req(1, 100), model_req(2, 30)}, kT0 + 5s).empty());
  std::optional<TimePoint> closes;
  (void)assign_grants(kMemory, 5s, 0s, dev, eng, std::vector<QueuedRequest>{model_req(1, 100), model_req(2, 30)},
                      kT0 + 1s, &closes);
  EXPECT_EQ(closes, kT0 + 5s);
}

TEST(AssignGrants, FixedCountsLeasesPerDevice) {
  const AdmissionPolicy fixed{Kind::kFixed, 1};
  const auto a =
      assign({{0, 1}, {0, 0}}, {{0, 0, 8, 1}, {1, 0, 8, 0}}, {model_req(1, 10), model_req(2, 10)}, kT0, fixed);
  EXPECT_EQ(a, (std::vector<GrantAssignment>{{0, 1}}));
}

AdmissionTopology two_devices(std::int64_t b0, std::int64_t b1, int max_running = 8) {
  AdmissionTopology t;
  t.devices = {{"virt:0", b0}, {"virt:1", b1}};
  t.engines = {{0, 0, max_running}, {1, 0, max_running}};
  return t;
}

std::unique_ptr<AdmissionController> make_multi_device(AdmissionTopology t, int max_queue = 8) {
  AdmissionOptions o;
  o.max_queue = max_queue;
  o.queue_timeout = 30s;
  o.max_bypass = 5s;
  auto c = AdmissionController::create(o, std::move(t));
  EXPECT_TRUE(c.ok()) << (c.ok() ? "" : c.error().message);
  return std::move(c).value();
}

TEST(AdmissionTopologyTest, EachEngineGetsOnlyWhatIsPlacedOnIt) {
  ManualClock clock;
  auto ac = make_multi_device(two_devices(100, 100));
  ASSERT_TRUE(ac->enqueue(1, 60, clock.now()).ok());
  ASSERT_TRUE(ac->enqueue(2, 60, clock.now()).ok());
  auto g0 = ac->grant(clock.now(), 8, 0);
  ASSERT_EQ(g0.size(), 1u);
  EXPECT_EQ(g0[0].id, 1u);
  auto g1 = ac->grant(clock.now(), 8, 1);
  ASSERT_EQ(g1.size(), 1u);
  EXPECT_EQ(g1[0].id, 2u);
  const AdmissionSnapshot snap = ac->snapshot(clock.now());
  ASSERT_EQ(snap.devices.size(), 2u);
  EXPECT_EQ(snap.devices[0].reserved_bytes, 60);
  EXPECT_EQ(snap.devices[1].reserved_bytes, 60);
  EXPECT_EQ(snap.reserved_bytes, 120);
  EXPECT_EQ(snap.budget_bytes, 200);
  // A release returns the bytes to the device that held them.
  g1[0].lease.release();
  EXPECT_EQ(ac->snapshot(clock.now()).devices[1].reserved_bytes, 0);
  EXPECT_EQ(ac->snapshot(clock.now()).devices[0].reserved_bytes, 60);
}

TEST(AdmissionTopologyTest, AWaitingRequestGoesToTheFirstDeviceThatFreesRoom) {
  ManualClock clock;
  auto ac = make_multi_device(two_devices(100, 100));
  ASSERT_TRUE(ac->enqueue(1, 80, clock.now()).ok());
  ASSERT_TRUE(ac->enqueue(2, 80, clock.now()).ok());
  auto a = ac->grant(clock.now(), 8, 0);
  auto b = ac->grant(clock.now(), 8, 1);
  ASSERT_EQ(a.size() + b.size(), 2u);
  ASSERT_TRUE(ac->enqueue(3, 80, clock.now()).ok());  // fits nowhere now: one shared queue
  EXPECT_TRUE(ac->grant(clock.now(), 8, 0).empty());
  EXPECT_TRUE(ac->grant(clock.now(), 8, 1).empty());
  b[0].lease.release();  // device 1 frees room: only its engine is given the request
  EXPECT_TRUE(ac->grant(clock.now(), 8, 0).empty());
  auto c = ac->grant(clock.now(), 8, 1);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].id, 3u);
}

TEST(AdmissionTopologyTest, NeverFitsUsesTheLargestDeviceBudget) {
  ManualClock clock;
  auto ac = make_multi_device(two_devices(100, 150));
  EXPECT_TRUE(ac->enqueue(1, 150, clock.now()).ok());
  auto r = ac->enqueue(2, 151, clock.now());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::kExceedsDeviceMemory);
  EXPECT_EQ(r.error().budget_bytes, 150);
  // The 150-byte request can only go to device 1.
  EXPECT_TRUE(ac->grant(clock.now(), 8, 0).empty());
  EXPECT_EQ(ac->grant(clock.now(), 8, 1).size(), 1u);
}

TEST(AdmissionTopologyTest, AnUnavailableEnginesShareGoesToTheOthers) {
  ManualClock clock;
  auto ac = make_multi_device(two_devices(100, 50));
  ac->set_engine_available(0, false);
  EXPECT_FALSE(ac->engine_available(0));
  ASSERT_TRUE(ac->enqueue(1, 40, clock.now()).ok());
  EXPECT_TRUE(ac->grant(clock.now(), 8, 0).empty());
  EXPECT_EQ(ac->grant(clock.now(), 8, 1).size(), 1u);
  ac->set_engine_available(0, true);
  ASSERT_TRUE(ac->enqueue(2, 40, clock.now()).ok());
  EXPECT_EQ(ac->grant(clock.now(), 8, 0).size(), 1u);
}

TEST(AdmissionTopologyTest, EffectiveBudgetIsPerDevice) {
  ManualClock clock;
  auto ac = make_multi_device(two_devices(100, 100));
  EXPECT_EQ(ac->set_effective_budget(30, 1), 30);
  ASSERT_TRUE(ac->enqueue(1, 60, clock.now()).ok());
  ASSERT_TRUE(ac->enqueue(2, 60, clock.now()).ok());
  EXPECT_EQ(ac->grant(clock.now(), 8, 1).size(), 0u);
  auto held = ac->grant(clock.now(), 8, 0);
  EXPECT_EQ(held.size(), 1u);  // the second waits: device 1 is cut
  EXPECT_EQ(ac->snapshot(clock.now()).queue_depth, 1);
  EXPECT_EQ(ac->snapshot(clock.now()).devices[1].effective_budget_bytes, 30);
}

TEST(AdmissionTopologyTest, TheEffectiveBudgetIsTheLeastItsSourcesAllow) {
  // Two engines (sources 0 and 1) of one device: one's cut holds while the
  // other raises what it allows; raising the cut source lifts the budget.
  ManualClock clock;
  auto ac = make_multi_device(two_devices(100, 100));
  EXPECT_EQ(ac->set_effective_budget(40, 0, 0), 40);
  EXPECT_EQ(ac->set_effective_budget(90, 0, 1), 40);
  EXPECT_EQ(ac->set_effective_budget(100, 0, 1), 40);
  EXPECT_EQ(ac->set_effective_budget(70, 0, 0), 70);
  EXPECT_EQ(ac->set_effective_budget(500, 0, 0), 100);  // each clamped to the budget
  EXPECT_EQ(ac->snapshot(clock.now()).devices[0].effective_budget_bytes, 100);
  EXPECT_EQ(ac->snapshot(clock.now()).devices[1].effective_budget_bytes, 100);  // the other device is apart
}

TEST(AdmissionTopologyTest, RejectsABadTopology) {
  AdmissionOptions o;
  EXPECT_FALSE(AdmissionController::create(o, AdmissionTopology{}).ok());
  AdmissionTopology t = two_devices(100, 100);
  t.engines.push_back({2, 0, 8});
  EXPECT_FALSE(AdmissionController::create(o, t).ok());
  auto ac = make_multi_device(two_devices(100, 100));
  auto r = ac->enqueue(1, 10, TimePoint{}, std::nullopt, Priority::kNormal, 3);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::kInvalidRequest);
}

}  // namespace
}  // namespace vg
