// Admission policies: parsing, and the pure grant selection with aging
// (docs/scenarios.md S7 at the level of one decision).
#include "admission/admission_policy.hpp"

#include <gtest/gtest.h>

#include <vector>

#include "manual_clock.hpp"

namespace vg {
namespace {

using namespace std::chrono_literals;
using Kind = AdmissionPolicy::Kind;
using Indices = std::vector<std::size_t>;

using testing::kT0;

QueuedRequest req(RequestId id, std::int64_t cost, TimePoint at) { return QueuedRequest{id, cost, at}; }

GrantState memory_state(std::int64_t free_bytes, Duration max_bypass = 5s) {
  return GrantState{AdmissionPolicy{Kind::kMemory, 0}, free_bytes, 0, max_bypass};
}

TEST(ParseAdmissionPolicy, AcceptsTheThreeForms) {
  auto m = parse_admission_policy("memory");
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->kind, Kind::kMemory);
  auto n = parse_admission_policy("none");
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(n->kind, Kind::kNone);
  auto f = parse_admission_policy("fixed:4");
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->kind, Kind::kFixed);
  EXPECT_EQ(f->fixed_slots, 4);
  EXPECT_EQ(parse_admission_policy("fixed:1000000")->fixed_slots, 1000000);
}

TEST(ParseAdmissionPolicy, RoundTripsThroughToString) {
  for (const char* text : {"memory", "none", "fixed:1", "fixed:32"}) {
    auto p = parse_admission_policy(text);
    ASSERT_TRUE(p.ok()) << text;
    EXPECT_EQ(to_string(*p), text);
  }
}

TEST(ParseAdmissionPolicy, RejectsWithAClearMessage) {
  for (const char* text : {"", "Memory", "fixed", "fixed:", "fixed:0", "fixed:-1", "fixed:abc", "fixed:4x",
                           "fixed: 4", "fixed:1000001", "fixed:99999999999999999999", "semaphore:4"}) {
    auto p = parse_admission_policy(text);
    ASSERT_FALSE(p.ok()) << text;
    EXPECT_EQ(p.error().code, ErrorCode::kConfig) << text;
    EXPECT_NE(p.error().message.find("'" + std::string(text) + "'"), std::string::npos) << p.error().message;
    EXPECT_NE(p.error().message.find("fixed:N"), std::string::npos) << p.error().message;
  }
}

TEST(SelectGrants, MemoryGrantsInFifoOrderWhileTheyFit) {
  const std::vector<QueuedRequest> q = {req(1, 300, kT0), req(2, 300, kT0), req(3, 300, kT0)};
  EXPECT_EQ(select_grants(memory_state(1000), q, kT0), (Indices{0, 1, 2}));
  EXPECT_EQ(select_grants(memory_state(600), q, kT0), (Indices{0, 1}));
  EXPECT_EQ(select_grants(memory_state(599), q, kT0), (Indices{0}));
  EXPECT_EQ(select_grants(memory_state(0), q, kT0), Indices{});
}

TEST(SelectGrants, CostEqualToFreeBytesFits) {
  const std::vector<QueuedRequest> q = {req(1, 1000, kT0)};
  EXPECT_EQ(select_grants(memory_state(1000), q, kT0), (Indices{0}));
  EXPECT_EQ(select_grants(memory_state(999), q, kT0), Indices{});
}

TEST(SelectGrants, SmallPassesAYoungLargeHead) {
  const std::vector<QueuedRequest> q = {req(1, 900, kT0), req(2, 100, kT0 + 1s), req(3, 100, kT0 + 2s)};
  EXPECT_EQ(select_grants(memory_state(500), q, kT0 + 4999ms), (Indices{1, 2}));
}

TEST(SelectGrants, NothingPassesAHeadOlderThanMaxBypass) {
  const std::vector<QueuedRequest> q = {req(1, 900, kT0), req(2, 100, kT0 + 1s)};
  EXPECT_EQ(select_grants(memory_state(500), q, kT0 + 5s), Indices{});
  // Once the device has drained enough the head goes first, then the rest.
  EXPECT_EQ(select_grants(memory_state(1000), q, kT0 + 9s), (Indices{0, 1}));
}

TEST(SelectGrants, AnOldRequestBehindAYoungOneIsNotPassedEither) {
  // Enqueue times can tie or invert across threads; age is checked per request.
  const std::vector<QueuedRequest> q = {req(1, 900, kT0 + 3s), req(2, 800, kT0), req(3, 100, kT0 + 3s)};
  EXPECT_EQ(select_grants(memory_state(500), q, kT0 + 6s), Indices{});
  EXPECT_EQ(select_grants(memory_state(500), q, kT0 + 4s), (Indices{2}));
}

TEST(SelectGrants, ZeroMaxBypassIsStrictFifo) {
  const std::vector<QueuedRequest> q = {req(1, 900, kT0), req(2, 100, kT0)};
  EXPECT_EQ(select_grants(memory_state(500, 0s), q, kT0), Indices{});
}

TEST(SelectGrants, NegativeFreeBytesGrantNothingUnderMemory) {
  const std::vector<QueuedRequest> q = {req(1, 0, kT0), req(2, 1, kT0)};
  EXPECT_EQ(select_grants(memory_state(-1), q, kT0), Indices{});
  EXPECT_EQ(select_grants(memory_state(0), q, kT0), (Indices{0}));
}

TEST(SelectGrants, FixedIsASemaphoreIgnoringCosts) {
  const std::vector<QueuedRequest> q = {req(1, 1'000'000, kT0), req(2, 5, kT0), req(3, 5, kT0)};
  GrantState s{AdmissionPolicy{Kind::kFixed, 2}, -100, 0, 5s};
  EXPECT_EQ(select_grants(s, q, kT0), (Indices{0, 1}));
  s.active_leases = 1;
  EXPECT_EQ(select_grants(s, q, kT0), (Indices{0}));
  s.active_leases = 2;
  EXPECT_EQ(select_grants(s, q, kT0), Indices{});
  s.active_leases = 5;  // after a policy change: more running than slots
  EXPECT_EQ(select_grants(s, q, kT0), Indices{});
}

TEST(SelectGrants, NoneGrantsEverything) {
  const std::vector<QueuedRequest> q = {req(1, 1'000'000, kT0), req(2, 5, kT0)};
  GrantState s{AdmissionPolicy{Kind::kNone, 0}, -100, 1000, 0s};
  EXPECT_EQ(select_grants(s, q, kT0), (Indices{0, 1}));
}

TEST(BypassWindowCloses, IsTheBlockedHeadsEnqueuePlusMaxBypass) {
  const std::vector<QueuedRequest> q = {req(1, 100, kT0), req(2, 900, kT0 + 1s), req(3, 100, kT0 + 2s)};
  const auto t = bypass_window_closes(memory_state(500), q, kT0 + 2s);
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(*t, kT0 + 6s);
  EXPECT_FALSE(bypass_window_closes(memory_state(500), q, kT0 + 6s).has_value());  // closed already
  EXPECT_FALSE(bypass_window_closes(memory_state(2000), q, kT0).has_value());      // everything fits
  GrantState fixed{AdmissionPolicy{Kind::kFixed, 1}, 0, 0, 5s};
  EXPECT_FALSE(bypass_window_closes(fixed, q, kT0).has_value());
}

}  // namespace
}  // namespace vg

namespace vg {
namespace {

TEST(SelectGrantsMemory, MaxRunningCapsGrantsInQueueOrder) {
  const TimePoint t0 = TimePoint{} + std::chrono::hours(1);
  std::vector<QueuedRequest> q = {{1, 10, t0}, {2, 10, t0}, {3, 10, t0}};
  GrantState s{AdmissionPolicy{AdmissionPolicy::Kind::kMemory, 0}, 1000, 1, std::chrono::seconds(5), 3};
  EXPECT_EQ(select_grants(s, q, t0), (std::vector<std::size_t>{0, 1}));
  s.active_leases = 3;
  EXPECT_TRUE(select_grants(s, q, t0).empty());
  s.max_running = 0;  // no limit
  EXPECT_EQ(select_grants(s, q, t0).size(), 3u);
}

}  // namespace
}  // namespace vg
