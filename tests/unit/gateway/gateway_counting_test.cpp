// The gateway's own counting: a request's end by outcome when an engine's
// start of it was counted, else by how it ended waiting; the device label
// of an engine's metrics.
#include "gateway/gateway_counting.hpp"

#include <gtest/gtest.h>

namespace vg::gateway {
namespace {

std::int64_t finished(const AdmissionState& s) { return s.completed + s.failed + s.cancelled; }

TEST(GatewayCounting, AnAdmittedRequestEndsByOutcome) {
  AdmissionState s;
  const Error cancelled(ErrorCode::kCancelled, "gone");
  const Error crashed(ErrorCode::kEngineCrashed, "crashed twice");
  const Error overloaded(ErrorCode::kOverloaded, "restarted after its output began");
  count_request_end(s, true, nullptr);
  count_request_end(s, true, &cancelled);
  count_request_end(s, true, &crashed);
  count_request_end(s, true, &overloaded);
  EXPECT_EQ(s.completed, 1);
  EXPECT_EQ(s.cancelled, 1);
  EXPECT_EQ(s.failed, 2);
  EXPECT_EQ(s.admitted, 0) << "its admission was counted where it started";
  EXPECT_EQ(s.cancelled_queued + s.queue_timeouts + s.deadline_expired, 0);
}

TEST(GatewayCounting, ARequestNeverAdmittedEndsAsItWaited) {
  AdmissionState s;
  const Error cancelled(ErrorCode::kCancelled, "gone");
  const Error deadline(ErrorCode::kTimeout, "deadline");
  const Error no_engine(ErrorCode::kOverloaded, "no engine took it again in time");
  count_request_end(s, false, &cancelled);
  count_request_end(s, false, &deadline);
  count_request_end(s, false, &no_engine);
  EXPECT_EQ(s.cancelled_queued, 1);
  EXPECT_EQ(s.deadline_expired, 1);
  EXPECT_EQ(s.queue_timeouts, 1);
  EXPECT_EQ(finished(s), 0);
  EXPECT_EQ(s.admitted, 0);
}

TEST(GatewayCounting, ACrashFailureWhoseStartNeverGotOutIsAdmittedAndFailedSoTheBalanceHolds) {
  AdmissionState s;
  const Error crashed(ErrorCode::kEngineCrashed, "crashed twice");
  count_request_end(s, false, &crashed);
  EXPECT_EQ(s.admitted, 1);
  EXPECT_EQ(s.failed, 1);
  EXPECT_EQ(s.admitted, finished(s));
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
