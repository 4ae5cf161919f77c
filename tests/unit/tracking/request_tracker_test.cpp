// A gateway request's phase transitions, what its client was sent (and
// what a resume continues after), its crashes and its cancel.
#include "tracking/request_tracker.hpp"

#include <gtest/gtest.h>

#include <vector>

namespace vg::tracking {
namespace {

TextEvent text(std::vector<std::int32_t> ids, int choice = 0) {
  TextEvent t;
  t.choice = choice;
  t.token_ids = std::move(ids);
  return t;
}

TEST(RequestTracker, AnAcceptedRequestIsQueuedThenRunning) {
  RequestTracker t;
  t.sent(true);
  EXPECT_EQ(t.phase(), RequestPhase::kSent);
  EXPECT_TRUE(t.awaited());
  EXPECT_FALSE(t.movable()) << "not answered yet";
  EXPECT_TRUE(t.answered(true)) << "the submit that waits takes the answer";
  EXPECT_FALSE(t.awaited());
  EXPECT_EQ(t.phase(), RequestPhase::kQueued);
  EXPECT_TRUE(t.movable());
  t.on_event(StartedEvent{});
  EXPECT_EQ(t.phase(), RequestPhase::kRunning);
  EXPECT_FALSE(t.movable());
}

TEST(RequestTracker, AStartThatOvertakesTheAnswerIsNotUndoneByIt) {
  RequestTracker t;
  t.sent(true);
  t.on_event(StartedEvent{});
  EXPECT_TRUE(t.awaited()) << "its submit still waits for the answer";
  EXPECT_TRUE(t.answered(true));
  EXPECT_EQ(t.phase(), RequestPhase::kRunning);
  EXPECT_FALSE(t.movable());
}

TEST(RequestTracker, ARefusalLeavesItSentForTheCallerToDecide) {
  RequestTracker t;
  t.sent(false);  // sent again by the gateway: nobody waits
  EXPECT_FALSE(t.answered(false));
  EXPECT_EQ(t.phase(), RequestPhase::kSent);
  t.held();
  EXPECT_EQ(t.phase(), RequestPhase::kHeld);
}

TEST(RequestTracker, AQueuedRequestIsWithdrawnAndMoved) {
  RequestTracker t;
  t.sent(true);
  t.answered(true);
  EXPECT_TRUE(t.withdraw(false, 100));
  EXPECT_EQ(t.phase(), RequestPhase::kWithdrawing);
  EXPECT_FALSE(t.withdraw(false, 100)) << "asked back once";
  t.withdrawn(true);
  EXPECT_TRUE(t.moving());
  t.sent(false);
  EXPECT_EQ(t.phase(), RequestPhase::kSent);
  EXPECT_FALSE(t.moving());
}

TEST(RequestTracker, AWithdrawTheEngineRefusedLeavesItRunningWhereItIs) {
  RequestTracker t;
  t.sent(true);
  t.answered(true);
  ASSERT_TRUE(t.withdraw(false, 100));
  t.withdrawn(false);
  EXPECT_EQ(t.phase(), RequestPhase::kRunning);
  EXPECT_FALSE(t.movable()) << "it stays: never asked back again";
}

TEST(RequestTracker, TensorsSuspectsCancelledAndUnknownCostsDoNotMove) {
  const auto queued = [] {
    RequestTracker t;
    t.sent(true);
    t.answered(true);
    return t;
  };
  RequestTracker a = queued();
  EXPECT_FALSE(a.withdraw(true, 100));
  EXPECT_FALSE(a.withdraw(false, 0));
  RequestTracker b = queued();
  b.crashed();
  EXPECT_FALSE(b.withdraw(false, 100));
  RequestTracker c = queued();
  c.cancel();
  EXPECT_FALSE(c.withdraw(false, 100));
  EXPECT_EQ(c.phase(), RequestPhase::kQueued);
}

TEST(RequestTracker, NothingLeavesTheEnd) {
  RequestTracker t;
  t.sent(true);
  EXPECT_TRUE(t.end());
  EXPECT_FALSE(t.end()) << "ended once";
  t.sent(true);
  t.answered(true);
  t.held();
  t.withdrawn(true);
  t.on_event(StartedEvent{});
  EXPECT_EQ(t.phase(), RequestPhase::kEnded);
  EXPECT_FALSE(t.cancel()) << "an ended request is not cancelled";
}

TEST(RequestTracker, RepeatsAfterAResumeAreNotForwarded) {
  RequestTracker t;
  t.sent(true);
  EXPECT_TRUE(t.on_event(QueuedEvent{}).forward);
  EventEffect start = t.on_event(StartedEvent{});
  EXPECT_TRUE(start.forward);
  EXPECT_TRUE(start.first_start);
  EXPECT_TRUE(t.on_event(PromptEvent{}).forward);
  t.on_event(text({1, 2}));
  // Resumed on another engine: it queues, starts and sends the prompt again.
  t.held();
  t.sent(false);
  EXPECT_FALSE(t.on_event(QueuedEvent{}).forward);
  start = t.on_event(StartedEvent{});
  EXPECT_FALSE(start.forward);
  EXPECT_FALSE(start.first_start) << "its admission was counted once";
  EXPECT_FALSE(t.on_event(PromptEvent{}).forward);
  EXPECT_TRUE(t.on_event(text({3})).forward);
  EXPECT_EQ(t.delivered(), (std::vector<std::int32_t>{1, 2, 3}));
}

TEST(RequestTracker, AnEmptyTextEventIsNoOutput) {
  // Nothing reached the client: a request of several choices may still
  // start again elsewhere.
  RequestTracker t;
  t.sent(true);
  t.on_event(text({}, 1));
  EXPECT_FALSE(t.output_began());
  TextEvent held_back = text({4}, 1);  // a token whose text is held back: its text follows, so it is output
  t.on_event(held_back);
  EXPECT_TRUE(t.output_began());
}

TEST(RequestTracker, ResumesAfterChoiceZerosTokensAndThePrompt) {
  RequestTracker t;
  t.sent(true);
  EXPECT_FALSE(t.resumes()) << "nothing sent: a fresh start";
  t.on_event(text({7}, 1));
  EXPECT_FALSE(t.resumes()) << "only choice 0's tokens are resumed after";
  EXPECT_TRUE(t.output_began());
  t.on_event(PromptEvent{});
  EXPECT_TRUE(t.resumes());
  EXPECT_TRUE(t.prompt_sent());
  EXPECT_TRUE(t.delivered().empty());
}

TEST(RequestTracker, ASuspectIsClearedByItsFirstToken) {
  RequestTracker t;
  t.sent(true);
  t.answered(true);
  EXPECT_EQ(t.crashed(), 1);
  EXPECT_TRUE(t.suspect());
  EXPECT_EQ(t.crashed(), 2);
  t.on_event(text({5}));
  EXPECT_FALSE(t.suspect());
  EXPECT_EQ(t.crashes(), 0) << "a later crash counts afresh";
  EXPECT_EQ(t.crashed(), 1);
}

TEST(RequestTracker, CrashesBeforeTheAnswerAreCountedApart) {
  RequestTracker t;
  t.sent(true);
  EXPECT_EQ(t.crashed_unanswered(), 1);
  EXPECT_EQ(t.crashed_unanswered(), 2);
  EXPECT_EQ(t.crashes(), 0);
  EXPECT_FALSE(t.suspect());
}

TEST(RequestTracker, CancelOnce) {
  RequestTracker t;
  t.sent(true);
  EXPECT_TRUE(t.cancel());
  EXPECT_FALSE(t.cancel());
  EXPECT_TRUE(t.cancelled());
  EXPECT_EQ(t.phase(), RequestPhase::kSent) << "the engine ends it";
}

TEST(RequestTracker, ItsEndCountsAsAdmittedOnceItsStartWasSent) {
  RequestTracker t;
  Counters counters;
  const Error cancelled(ErrorCode::kCancelled, "gone");
  t.count_end(counters, &cancelled);
  EXPECT_EQ(counters[CounterId::kCancelledQueued], 1);
  t.on_event(StartedEvent{});
  t.count_end(counters, &cancelled);
  EXPECT_EQ(counters[CounterId::kCancelled], 1);
}

TEST(RequestTracker, PhasesHaveNames) {
  EXPECT_STREQ(phase_name(RequestPhase::kWithdrawing), "withdrawing");
  EXPECT_STREQ(phase_name(RequestPhase::kEnded), "ended");
}

}  // namespace
}  // namespace vg::tracking
