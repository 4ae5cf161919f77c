// A request's end as its gateway counts it: by outcome when an engine's
// start of it was counted, else by how it ended waiting.
#include "tracking/request_counting.hpp"

#include <gtest/gtest.h>

namespace vg::tracking {
namespace {

std::int64_t finished(const Counters& s) {
  return s[CounterId::kCompleted] + s[CounterId::kFailed] + s[CounterId::kCancelled];
}

TEST(RequestCounting, AnAdmittedRequestEndsByOutcome) {
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

TEST(RequestCounting, ARequestNeverAdmittedEndsAsItWaited) {
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

TEST(RequestCounting, ACrashFailureWhoseStartNeverGotOutIsAdmittedAndFailedSoTheBalanceHolds) {
  Counters s;
  const Error crashed(ErrorCode::kEngineCrashed, "crashed twice");
  count_request_end(s, false, &crashed);
  EXPECT_EQ(s[CounterId::kAdmitted], 1);
  EXPECT_EQ(s[CounterId::kFailed], 1);
  EXPECT_EQ(s[CounterId::kAdmitted], finished(s));
}

}  // namespace
}  // namespace vg::tracking
