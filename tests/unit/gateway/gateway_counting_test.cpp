// The gateway's own counting: a request's end by outcome when an engine's
// start of it was counted, else by how it ended waiting; the device label
// of an engine's metrics.
#include "gateway/gateway_counting.hpp"

#include <gtest/gtest.h>

namespace vg::gateway {
namespace {

std::int64_t finished(const Counters& s) {
  return s[CounterId::kCompleted] + s[CounterId::kFailed] + s[CounterId::kCancelled];
}

TEST(GatewayCounting, AnAdmittedRequestEndsByOutcome) {
  Counters s;
  const Error cancelled(ErrorCode::kCancelled, "gone");
  const Error crashed(ErrorCode::kEngineCrashed, "crashed twice");
  const Error overloaded(ErrorCode::kOverloaded, "restarted after its output began");
  count_request_end(s, true, nullptr);
  count_request_end(s, true, &cancelled);
  count_request_end(s, true, &crashed);
  count_request_end(s, true, &overloaded);
  EXPECT_EQ(s[CounterId::kCompleted], 1);
  EXPECT_EQ(s[CounterId::kCancelled], 1);
  EXPECT_EQ(s[CounterId::kFailed], 2);
  EXPECT_EQ(s[CounterId::kAdmitted], 0) << "its admission was counted where it started";
  EXPECT_EQ(s[CounterId::kCancelledQueued] + s[CounterId::kQueueTimeouts] + s[CounterId::kDeadlineExpired], 0);
}

TEST(GatewayCounting, ARequestNeverAdmittedEndsAsItWaited) {
  Counters s;
  const Error cancelled(ErrorCode::kCancelled, "gone");
  const Error deadline(ErrorCode::kTimeout, "deadline");
  const Error no_engine(ErrorCode::kOverloaded, "no engine took it again in time");
  count_request_end(s, false, &cancelled);
  count_request_end(s, false, &deadline);
  count_request_end(s, false, &no_engine);
  EXPECT_EQ(s[CounterId::kCancelledQueued], 1);
  EXPECT_EQ(s[CounterId::kDeadlineExpired], 1);
  EXPECT_EQ(s[CounterId::kQueueTimeouts], 1);
  EXPECT_EQ(finished(s), 0);
  EXPECT_EQ(s[CounterId::kAdmitted], 0);
}

TEST(GatewayCounting, ACrashFailureWhoseStartNeverGotOutIsAdmittedAndFailedSoTheBalanceHolds) {
  Counters s;
  const Error crashed(ErrorCode::kEngineCrashed, "crashed twice");
  count_request_end(s, false, &crashed);
  EXPECT_EQ(s[CounterId::kAdmitted], 1);
  EXPECT_EQ(s[CounterId::kFailed], 1);
  EXPECT_EQ(s[CounterId::kAdmitted], finished(s));
}

TEST(GatewayCounting, TheMetricLabelIsTheResolvedDeviceNames) {
  EXPECT_EQ(metric_device_label({"virt:0"}, "auto"), "virt:0");
  EXPECT_EQ(metric_device_label({"virt:0", "virt:1"}, "virt:0=64MiB,virt:1=64MiB"), "virt:0,virt:1");
  EXPECT_EQ(metric_device_label({}, "virt:0=64MiB"), "virt:0");
  EXPECT_EQ(metric_device_label({}, "virt:0=64MiB,virt:1"), "virt:0,virt:1");
  EXPECT_EQ(metric_device_label({"auto"}, "auto"), std::nullopt) << "unknown until the engine reports its devices";
  EXPECT_EQ(metric_device_label({}, ""), std::nullopt);
}

}  // namespace
}  // namespace vg::gateway
