// What the gateway counts for its engine processes (remote_service_fixture.hpp):
// a completion an engine died before reporting, one it reported, and every
// counter of both tables carried across an engine's crash and restart.
#include "gateway/remote_service.hpp"

#include <gtest/gtest.h>

#include <map>
#include <string>

#include "remote_service_fixture.hpp"

namespace vg::gateway::remote_testing {
namespace {

TEST_F(RemoteServiceTest, ACompletionTheEngineDiedBeforeReportingIsStillCounted) {
  // No heartbeats: the engine's only state is its hello's (nothing completed).
  FakeService& fake = new_fake();
  start_engines_and_gateway({&fake});
  run_one_to_the_end(fake);
  more_engines_[0]->stop();  // dies before any state holds the completion
  EXPECT_EQ(gateway_->admission_state().counters[CounterId::kCompleted], 1);
}

TEST_F(RemoteServiceTest, ACompletionTheEngineReportedIsCountedOnce) {
  FakeService& fake = new_fake();
  start_engines_and_gateway({&fake});
  run_one_to_the_end(fake);
  // The fake counts its one submission as completed: the state the gateway
  // asks for now holds it, and what the gateway counted itself is dropped.
  EXPECT_EQ(gateway_->admission_state().counters[CounterId::kCompleted], 1);
  more_engines_[0]->stop();
  EXPECT_EQ(gateway_->admission_state().counters[CounterId::kCompleted], 1);
}

/// Every counter of `s` (the service's and its one device's), named, for
/// comparing states counter by counter.
std::map<std::string, std::int64_t> every_counter(const AdmissionState& s) {
  std::map<std::string, std::int64_t> out;
  for (const CounterInfo& c : kCounters) out[std::string(c.key)] = s.counters[c.id];
  for (const DeviceCounterInfo& c : kDeviceCounters) {
    out["device." + std::string(c.key)] = s.devices.empty() ? -1 : s.devices.at(0).counters[c.id];
  }
  return out;
}

TEST_F(RemoteServiceTest, EveryCounterIsCarriedAcrossAnEngineCrashAndRestart) {
  // Each counter of both tables at its own value in the first process, and
  // at another in the second: the gateway shows the first's while it is
  // gone, then the sum, and no counter ever goes back.
  FakeService& first = new_fake();
  FakeService& second = new_fake();
  for (FakeService* f : {&first, &second}) {
    const std::int64_t base = f == &first ? 100 : 1000;
    f->budget_bytes = 1'000'000;
    for (std::size_t i = 0; i < kCounterCount; ++i) f->counters.values[i] = base + static_cast<std::int64_t>(i);
    for (std::size_t i = 0; i < kDeviceCounterCount; ++i) {
      f->device_counters.values[i] = 2 * base + static_cast<std::int64_t>(i);
    }
  }
  start_engines_and_gateway({&first});
  // A request waits in the first engine's queue: the gateway sends it to
  // the second once that one is connected (the test's sign that it is).
  ASSERT_TRUE(gateway_->submit(request("r1"), std::make_shared<Recorder>()).ok());
  first.wait_sub(1);
  const auto before = every_counter(first.admission_state());
  EXPECT_EQ(every_counter(gateway_->admission_state()), before);
  more_engines_[0]->stop();
  EXPECT_EQ(every_counter(gateway_->admission_state()), before) << "the crashed process's counts are kept";
  ASSERT_FALSE(start_numbered_engine(0, second).empty());  // restarted on its socket
  second.wait_sub(1);
  auto expected = every_counter(second.admission_state());
  for (auto& [name, value] : expected) value += before.at(name);
  const auto after = every_counter(gateway_->admission_state());
  EXPECT_EQ(after, expected);
  for (const auto& [name, value] : after) EXPECT_GE(value, before.at(name)) << name << " went back";
}

}  // namespace
}  // namespace vg::gateway::remote_testing
