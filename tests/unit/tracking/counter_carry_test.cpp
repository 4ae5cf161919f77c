// One engine's counters across its processes: a crashed process's counts
// are kept under the next one's, the same process connecting again is not
// counted twice, and no counter of either table (the service's, each
// device's) ever goes back, whatever the order of connections and reports.
#include "tracking/counter_carry.hpp"

#include <gtest/gtest.h>

#include <random>
#include <vector>

namespace vg::tracking {
namespace {

/// A state with every counter of both tables at `base` + its index, on
/// device `device`.
AdmissionState state_at(std::int64_t base, const std::string& device = "virt:0") {
  AdmissionState s;
  for (std::size_t i = 0; i < kCounterCount; ++i) s.counters.values[i] = base + static_cast<std::int64_t>(i);
  DeviceState d;
  d.name = device;
  for (std::size_t i = 0; i < kDeviceCounterCount; ++i) d.counters.values[i] = 2 * base + static_cast<std::int64_t>(i);
  s.devices.push_back(d);
  return s;
}

/// Whether no counter of `now` is below its value in `before`.
::testing::AssertionResult none_went_back(const CounterTotals& before, const CounterTotals& now) {
  for (const CounterInfo& c : kCounters) {
    if (now.counters[c.id] < before.counters[c.id]) {
      return ::testing::AssertionFailure() << c.key << " went back from " << before.counters[c.id];
    }
  }
  for (const auto& [name, counters] : before.devices) {
    const auto it = now.devices.find(name);
    if (it == now.devices.end()) return ::testing::AssertionFailure() << "device " << name << " left the totals";
    for (const DeviceCounterInfo& c : kDeviceCounters) {
      if (it->second[c.id] < counters[c.id]) {
        return ::testing::AssertionFailure() << name << " " << c.key << " went back from " << counters[c.id];
      }
    }
  }
  return ::testing::AssertionSuccess();
}

TEST(CounterCarry, ACrashedProcessesCountsAreKeptUnderTheNextOnes) {
  CounterCarry carry;
  carry.begin({100, 1.0});
  carry.report(CounterTotals::of(state_at(10)));
  carry.begin({200, 2.0});  // another process: the first ended
  carry.report(CounterTotals::of(state_at(3)));
  CounterTotals expected = CounterTotals::of(state_at(10));
  expected += CounterTotals::of(state_at(3));
  EXPECT_EQ(carry.totals(), expected);
}

TEST(CounterCarry, TheSameProcessConnectingAgainIsNotCountedTwice) {
  CounterCarry carry;
  carry.begin({100, 1.0});
  carry.report(CounterTotals::of(state_at(10)));
  carry.begin({100, 1.0});  // its channel closed, the process lived on
  carry.report(CounterTotals::of(state_at(12)));
  EXPECT_EQ(carry.totals(), CounterTotals::of(state_at(12)));
}

TEST(CounterCarry, AReportBelowAnEarlierOneOfTheSameProcessLowersNothing) {
  // What the gateway counted for a process (its last state plus the ends
  // since) may be ahead of the process's next state: the higher value stays.
  CounterCarry carry;
  carry.begin({100, 1.0});
  carry.report(CounterTotals::of(state_at(10)));
  carry.report(CounterTotals::of(state_at(7)));
  EXPECT_EQ(carry.totals(), CounterTotals::of(state_at(10)));
}

TEST(CounterCarry, ApplyGivesAStateTheTotalsOfItsDevicesByName) {
  CounterCarry carry;
  carry.begin({100, 1.0});
  carry.report(CounterTotals::of(state_at(10)));
  carry.begin({200, 2.0});
  AdmissionState now = state_at(1);
  now.devices.push_back(state_at(1, "virt:1").devices[0]);
  carry.report(CounterTotals::of(now));
  carry.apply(now);
  EXPECT_EQ(now.counters[CounterId::kCompleted], 10 + 1 + 2 * static_cast<std::int64_t>(CounterId::kCompleted));
  EXPECT_EQ(now.devices[0].counters[DeviceCounterId::kKvPromptTokens],
            20 + 2 + 2 * static_cast<std::int64_t>(DeviceCounterId::kKvPromptTokens));
  EXPECT_EQ(now.devices[1].counters, state_at(1, "virt:1").devices[0].counters) << "only the second process had it";
}

TEST(CounterCarry, NoCounterGoesBackWhateverTheOrderOfConnectionsAndReports) {
  // A random walk: processes start (a new pid), the current one connects
  // again, or reports counts that grew (each counter by its own step, on
  // one of two devices). After each step no counter of either table is
  // below its value before, and the totals are the sum of each process's
  // highest report.
  std::mt19937 rng(20261207);
  for (int walk = 0; walk < 50; ++walk) {
    CounterCarry carry;
    std::vector<CounterTotals> processes;  // each process's highest report
    std::int64_t pid = 1;
    carry.begin({pid, 1.0});
    processes.emplace_back();
    CounterTotals before = carry.totals();
    for (int step = 0; step < 40; ++step) {
      const int what = std::uniform_int_distribution<int>(0, 5)(rng);
      if (what == 0) {
        ++pid;
        carry.begin({pid, static_cast<double>(pid)});
        processes.emplace_back();
      } else if (what == 1) {
        carry.begin({pid, static_cast<double>(pid)});
      } else {
        CounterTotals grown = processes.back();
        for (auto& v : grown.counters.values) v += std::uniform_int_distribution<int>(0, 3)(rng);
        DeviceCounters& d = grown.devices[what % 2 ? "virt:0" : "virt:1"];
        for (auto& v : d.values) v += std::uniform_int_distribution<int>(0, 3)(rng);
        processes.back() = grown;
        carry.report(grown);
      }
      const CounterTotals now = carry.totals();
      ASSERT_TRUE(none_went_back(before, now)) << "walk " << walk << " step " << step;
      CounterTotals sum;
      for (const CounterTotals& p : processes) sum += p;
      for (const auto& [name, c] : now.devices) sum.devices[name];  // a device of no report shows zeros
      ASSERT_EQ(now, sum) << "walk " << walk << " step " << step;
      before = now;
    }
  }
}

}  // namespace
}  // namespace vg::tracking
