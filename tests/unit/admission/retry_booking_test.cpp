// Booked retries on a manual clock: the promise arithmetic, recognition by
// token / Idempotency-Key / body, the window (early, claimed, expired), the
// bounds (max, share, max_after, drain rate), and the controller's use of
// them (queue places held for booked retries, claimed retries ahead of later
// arrivals, queue_depth counting only waiting requests).
#include "admission/retry_booking.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "admission/admission_controller.hpp"
#include "manual_clock.hpp"
#include "retry_identity.hpp"

namespace vg {
namespace {

using namespace std::chrono_literals;
using testing::ManualClock;
using Match = RetryBookings::Match;
using testing::secs;
using testing::who;

TEST(PromiseSeconds, MeasuredRateCountsRequestsAndBytesAhead) {
  DrainView v;
  v.requests_ahead = 3;
  v.requests_per_s = 2.0;
  EXPECT_DOUBLE_EQ(promise_seconds(v), 2.0);  // (3 + 1) / 2
  // Bytes ahead worth 10 mean-cost requests at 2/s: the bytes bound wins.
  v.mean_cost_bytes = 100;
  v.bytes_ahead = 1000;
  EXPECT_DOUBLE_EQ(promise_seconds(v), 5.0);
  v.bytes_ahead = 100;
  EXPECT_DOUBLE_EQ(promise_seconds(v), 2.0);
  v.requests_per_s = 0.0;
  EXPECT_TRUE(std::isinf(promise_seconds(v)));
}

TEST(PromiseSeconds, BeforeAnyCompletionUsesTheStepTimeAndTokensAhead) {
  DrainView v;
  v.requests_ahead = 5;
  v.step_s = 0.05;
  v.tokens_ahead = 160;
  v.batch = 4;
  EXPECT_DOUBLE_EQ(promise_seconds(v), 0.05 * 160 / 4);  // 2 s, not a constant
  v.tokens_ahead = 320;
  EXPECT_DOUBLE_EQ(promise_seconds(v), 4.0);
  // Nothing measured at all: the assumed rate.
  v.step_s = 0;
  v.unmeasured_rate_per_s = 3;
  EXPECT_DOUBLE_EQ(promise_seconds(v), 2.0);
  // Never zero.
  DrainView quick;
  quick.requests_per_s = 1e9;
  EXPECT_GE(promise_seconds(quick), 0.001);
}

TEST(RetryBookings, OpenPlacesCountOnlyBookingsWhoseWindowIsOpen) {
  ManualClock c;
  RetryBookings b({true, 16, 500ms, 1s, 30s});
  ASSERT_TRUE(b.book(who("a", "1"), c.now(), 1.0, 1, 10, 1, 1).booked);
  ASSERT_TRUE(b.book(who("b", "2"), c.now(), 3.0, 2, 10, 1, 1).booked);
  EXPECT_EQ(b.open_places(c.now()), 0);
  EXPECT_EQ(b.next_change(c.now()), c.now() + 500ms);
  c.advance(500ms);
  EXPECT_EQ(b.open_places(c.now()), 1);
  c.advance(2s);  // 2.5 s: the first is past 1 + 1 s, the second opened at 2.5 s
  EXPECT_EQ(b.open_places(c.now()), 1);
  EXPECT_EQ(b.sweep(c.now()), 1);
  EXPECT_EQ(b.held().size(), 1u);
}

TEST(RetryBookings, BoundedByMaxShareMaxAfterAndDrainRate) {
  ManualClock c;
  RetryBookings b({true, 4, 250ms, 2s, 10s});
  // One client alone gets half (one share is kept for a newcomer).
  EXPECT_TRUE(b.book(who("key:a", "1"), c.now(), 1, 1, 100, 1, 1).booked);
  EXPECT_TRUE(b.book(who("key:a", "2"), c.now(), 1, 2, 100, 1, 1).booked);
  auto over = b.book(who("key:a", "3"), c.now(), 1, 3, 100, 1, 1);
  EXPECT_FALSE(over.booked);
  EXPECT_NE(over.reason.find("share"), std::string::npos) << over.reason;
  // Another key still gets its place.
  EXPECT_TRUE(b.book(who("key:b", "1"), c.now(), 1, 3, 100, 1, 1).booked);
  // 4 bookings held at most.
  EXPECT_TRUE(b.book(who("key:c", "1"), c.now(), 1, 4, 100, 1, 1).booked);
  auto full = b.book(who("key:d", "1"), c.now(), 1, 5, 100, 1, 1);
  EXPECT_FALSE(full.booked);
  EXPECT_NE(full.reason.find("all 4"), std::string::npos) << full.reason;

  RetryBookings far({true, 100, 250ms, 2s, 10s});
  auto too_far = far.book(who("a", "1"), c.now(), 10.5, 1, 100, 1, 1);
  EXPECT_FALSE(too_far.booked);
  EXPECT_NE(too_far.reason.find("longest promise"), std::string::npos) << too_far.reason;
  EXPECT_TRUE(far.book(who("a", "1"), c.now(), 10.0, 1, 100, 1, 1).booked);
  // 0.2 completions/s honour 2 bookings within 10 s, not a third.
  RetryBookings slow({true, 100, 250ms, 2s, 10s});
  EXPECT_TRUE(slow.book(who("a", "1"), c.now(), 5, 1, 0.2, 1, 1).booked);
  EXPECT_TRUE(slow.book(who("b", "1"), c.now(), 5, 1, 0.2, 1, 1).booked);
  EXPECT_FALSE(slow.book(who("c", "1"), c.now(), 5, 1, 0.2, 1, 1).booked);
  EXPECT_EQ(b.counters().refused, 2);

  RetryBookings off({false, 100, 250ms, 2s, 10s});
  auto none = off.book(who("a", "1"), c.now(), 1, 1, 100, 1, 1);
  EXPECT_FALSE(none.booked);
  EXPECT_TRUE(none.reason.empty());
  EXPECT_EQ(off.counters().refused, 0);
}

// --- the controller

AdmissionOptions booking_options(int max_queue) {
  AdmissionOptions o;
  o.budget_bytes = 1000;
  o.max_queue = max_queue;
  o.max_running = 1;
  o.queue_timeout = 30s;
  o.retry_booking = RetryBookingOptions{true, 16, 100ms, 1s, 30s};
  return o;
}

std::unique_ptr<AdmissionController> make_booking_controller(const AdmissionOptions& o) {
  auto c = AdmissionController::create(o);
  EXPECT_TRUE(c.ok()) << (c.ok() ? "" : c.error().message);
  return std::move(c).value();
}

EnqueueOptions with(const RetryIdentity& id, std::int64_t tokens = 10) {
  EnqueueOptions eo;
  eo.retry = &id;
  eo.tokens = tokens;
  return eo;
}

TEST(AdmissionBookings, CreateRejectsBadBookingOptions) {
  AdmissionOptions o = booking_options(1);
  o.retry_booking.max_bookings = 0;
  EXPECT_EQ(AdmissionController::create(o).error().code, ErrorCode::kConfig);
  o = booking_options(1);
  o.retry_booking.grace = 0s;
  EXPECT_FALSE(AdmissionController::create(o).ok());
  o = booking_options(1);
  o.retry_booking.early = -1s;
  EXPECT_FALSE(AdmissionController::create(o).ok());
  o = booking_options(1);
  o.retry_booking.max_after = 0s;
  EXPECT_FALSE(AdmissionController::create(o).ok());
}

TEST(AdmissionBookings, QueueFullBooksAPlacePromisedFromTheMeasuredDrainRate) {
  ManualClock c;
  auto ac = make_booking_controller(booking_options(1));
  // 2 completions/s measured.
  for (int i = 0; i < 4; ++i) {
    ac->record_completion(c.now());
    c.advance(500ms);
  }
  const RetryIdentity a = who("addr:x", "a"), b = who("addr:x", "b"), r = who("addr:y", "r");
  ASSERT_TRUE(ac->enqueue(1, 10, c.now(), with(a)).ok());  // runs
  auto grants = ac->grant(c.now());
  ASSERT_EQ(grants.size(), 1u);
  ASSERT_TRUE(ac->enqueue(2, 10, c.now(), with(b)).ok());  // waits (max_queue 1)
  auto refused = ac->enqueue(3, 10, c.now(), with(r));
  ASSERT_FALSE(refused.ok());
  const Error& e = refused.error();
  EXPECT_EQ(e.code, ErrorCode::kOverloaded);
  EXPECT_EQ(e.retry_token, r.offered_token);
  EXPECT_EQ(e.retry_position, 2);  // behind request 2
  ASSERT_TRUE(e.retry_after_s);
  // 4 completions in the last 2 s: 2/s; (1 waiting + 1) / 2 per s = 1 s,
  // not rounded to whole seconds.
  EXPECT_NEAR(*e.retry_after_s, 1.0, 1e-6);
  EXPECT_NE(e.message.find("retry booked"), std::string::npos) << e.message;
  EXPECT_EQ(ac->snapshot(c.now()).retry_bookings, 1);
}

TEST(AdmissionBookings, ABookedPlaceIsHeldAgainstNewArrivalsAndTheRetryGoesFirst) {
  ManualClock c;
  auto ac = make_booking_controller(booking_options(1));
  ac->record_completion(c.now());
  c.advance(1s);
  ac->record_completion(c.now());  // 2 in 1 s: 2/s
  const RetryIdentity a = who("addr:x", "a"), r = who("addr:y", "r");
  ASSERT_TRUE(ac->enqueue(1, 10, c.now(), with(a)).ok());
  auto running = ac->grant(c.now());  // request 1 holds the only slot
  ASSERT_EQ(running.size(), 1u);
  ASSERT_TRUE(ac->enqueue(2, 10, c.now(), with(who("addr:x", "b"))).ok());
  auto refused = ac->enqueue(3, 10, c.now(), with(r));
  ASSERT_FALSE(refused.ok());
  const double promise = *refused.error().retry_after_s;

  // Request 2 is granted; its place frees, but the booked retry's window is
  // open at its promise, so a newcomer cannot take it.
  running.clear();  // request 1 done
  auto second = ac->grant(c.now());
  ASSERT_EQ(second.size(), 1u);
  c.advance(std::chrono::duration_cast<Duration>(std::chrono::duration<double>(promise)) - 50ms);
  const RetryIdentity late = who("addr:z", "newcomer");
  auto blocked = ac->enqueue(4, 10, c.now(), with(late));
  ASSERT_FALSE(blocked.ok());
  EXPECT_NE(blocked.error().message.find("booked for retries"), std::string::npos) << blocked.error().message;
  EXPECT_EQ(blocked.error().retry_position, 2);  // nothing waits; behind the one booking

  // The retry (recognised by body) takes its place without the queue check,
  // and ahead of any request that arrived after its booking.
  auto claimed = ac->enqueue(5, 10, c.now(), with(who("addr:y", "r")));
  ASSERT_TRUE(claimed.ok()) << claimed.error().message;
  EXPECT_EQ(claimed->position, 1);
  auto snap = ac->snapshot(c.now());
  EXPECT_EQ(snap.retry_booking_counters.claimed, 1);
  EXPECT_EQ(snap.queue_depth, 1);  // waiting: the slot is held by request 2
}

TEST(AdmissionBookings, ASlotFreeAtThePromiseWaitsForTheRetryNotForALaterArrival) {
  ManualClock c;
  auto ac = make_booking_controller(booking_options(0));
  ac->record_completion(c.now());
  c.advance(1s);
  ac->record_completion(c.now());  // 2/s
  ASSERT_TRUE(ac->enqueue(1, 10, c.now(), with(who("x", "1"))).ok());
  auto running = ac->grant(c.now());
  ASSERT_EQ(running.size(), 1u);
  const RetryIdentity r = who("y", "r");
  auto refused = ac->enqueue(2, 10, c.now(), with(r));
  ASSERT_FALSE(refused.ok());
  const Duration promise =
      std::chrono::duration_cast<Duration>(std::chrono::duration<double>(*refused.error().retry_after_s));
  // Just after the promise, before the retry arrives, the running request
  // ends: its slot is the retry's turn, so a newcomer neither starts nor queues.
  c.advance(promise + 10ms);
  running.clear();
  auto newcomer = ac->enqueue(3, 10, c.now(), with(who("z", "3")));
  ASSERT_FALSE(newcomer.ok());
  EXPECT_EQ(newcomer.error().code, ErrorCode::kOverloaded);
  EXPECT_TRUE(ac->grant(c.now()).empty());  // nothing queued: the slot waits for the retry
  auto claimed = ac->enqueue(4, 10, c.now(), with(who("y", "r")));
  ASSERT_TRUE(claimed.ok()) << claimed.error().message;
  auto granted = ac->grant(c.now());
  ASSERT_EQ(granted.size(), 1u);
  EXPECT_EQ(granted[0].id, 4u);
  EXPECT_NEAR(secs(*granted[0].promise_error), 0.010, 1e-6);
}

TEST(AdmissionBookings, ARetryThatDoesNotComeHoldsItsTurnOnlyBriefly) {
  ManualClock c;
  AdmissionOptions o = booking_options(1);
  auto ac = make_booking_controller(o);
  ac->record_completion(c.now());
  c.advance(1s);
  ac->record_completion(c.now());
  ASSERT_TRUE(ac->enqueue(1, 10, c.now(), with(who("x", "1"))).ok());
  auto running = ac->grant(c.now());
  ASSERT_TRUE(ac->enqueue(2, 10, c.now(), with(who("x", "2"))).ok());
  auto refused = ac->enqueue(3, 10, c.now(), with(who("y", "r")));
  ASSERT_FALSE(refused.ok());
  const Duration promise =
      std::chrono::duration_cast<Duration>(std::chrono::duration<double>(*refused.error().retry_after_s));
  auto second = ac->grant(c.now());
  EXPECT_TRUE(second.empty());  // request 1 holds the slot
  running.clear();
  second = ac->grant(c.now());  // request 2 was queued before the booking: it goes first
  ASSERT_EQ(second.size(), 1u);
  EXPECT_EQ(second[0].id, 2u);
  // The retry does not come. A later arrival waits while the booking holds
  // its turn, then runs once the turn is over (min(grace, 500 ms) after the
  // promise), long before the grace deadline releases the booking.
  c.advance(promise);
  second.clear();
  ASSERT_TRUE(ac->enqueue(4, 10, c.now(), with(who("z", "4"))).ok());
  EXPECT_TRUE(ac->grant(c.now()).empty());
  const auto wake = ac->next_wakeup(c.now());
  ASSERT_TRUE(wake);
  EXPECT_LE(*wake, c.now() + 500ms + 1ms);
  c.advance(501ms);
  auto later = ac->grant(c.now());
  ASSERT_EQ(later.size(), 1u);
  EXPECT_EQ(later[0].id, 4u);
  EXPECT_EQ(ac->snapshot(c.now()).retry_bookings, 1);  // still claimable until promise + 1 s
}

TEST(AdmissionBookings, AClaimedRetryIsGrantedBeforeLaterArrivalsAndReportsItsPromiseError) {
  ManualClock c;
  AdmissionOptions o = booking_options(2);
  auto ac = make_booking_controller(o);
  ac->record_completion(c.now());
  c.advance(1s);
  ac->record_completion(c.now());
  ASSERT_TRUE(ac->enqueue(1, 10, c.now(), with(who("x", "1"))).ok());
  auto running = ac->grant(c.now());
  ASSERT_TRUE(ac->enqueue(2, 10, c.now(), with(who("x", "2"))).ok());
  ASSERT_TRUE(ac->enqueue(3, 10, c.now(), with(who("x", "3"))).ok());
  const RetryIdentity r = who("y", "r");
  auto refused = ac->enqueue(4, 10, c.now(), with(r));
  ASSERT_FALSE(refused.ok());
  // Later: the two waiting ones are granted, one newcomer arrives while the
  // booking is not yet open, then the retry comes.
  running.clear();
  auto second = ac->grant(c.now());
  ASSERT_EQ(second.size(), 1u);
  c.advance(100ms);
  ASSERT_TRUE(ac->enqueue(6, 10, c.now(), with(who("z", "6"))).ok());
  const Duration promise = std::chrono::duration_cast<Duration>(std::chrono::duration<double>(*refused.error().retry_after_s));
  c.advance(promise - 100ms);
  RetryIdentity retry = who("q", "r", r.offered_token);
  auto claimed = ac->enqueue(7, 10, c.now(), with(retry));
  ASSERT_TRUE(claimed.ok()) << claimed.error().message;
  // Queue: 3, then the retry (booked before 6 arrived), then 6.
  auto snap = ac->snapshot(c.now());
  ASSERT_EQ(snap.queue.size(), 3u);
  EXPECT_EQ(snap.queue[0].id, 3u);
  EXPECT_EQ(snap.queue[1].id, 7u);
  EXPECT_EQ(snap.queue[2].id, 6u);
  // Request 3 leaves, request 2 completes: the retry is granted before 6,
  // 30 ms after its promise.
  c.advance(30ms);
  EXPECT_TRUE(ac->cancel(3));
  second.clear();
  auto granted = ac->grant(c.now());
  ASSERT_EQ(granted.size(), 1u);
  EXPECT_EQ(granted[0].id, 7u);
  ASSERT_TRUE(granted[0].promise_error);
  EXPECT_NEAR(secs(*granted[0].promise_error), 0.030, 1e-6);
}

TEST(AdmissionBookings, EarlyRetryGetsTheTimeLeftAndTheSameToken) {
  ManualClock c;
  auto ac = make_booking_controller(booking_options(0));
  // Nothing measured: the step time and the tokens ahead give the promise.
  AdmissionOptions o = booking_options(0);
  o.step_time = 50ms;
  ac = make_booking_controller(o);
  ASSERT_TRUE(ac->enqueue(1, 10, c.now(), with(who("x", "1"), 40)).ok());
  auto running = ac->grant(c.now());
  ASSERT_EQ(running.size(), 1u);
  const RetryIdentity r = who("y", "r");
  auto refused = ac->enqueue(2, 10, c.now(), with(r, 20));
  ASSERT_FALSE(refused.ok());
  // 40 tokens left on the running one + 20 own, one per 50 ms step, batch 1: 3 s.
  EXPECT_NEAR(*refused.error().retry_after_s, 3.0, 1e-6);
  c.advance(1s);
  auto early = ac->enqueue(3, 10, c.now(), with(who("y", "r", r.offered_token)));
  ASSERT_FALSE(early.ok());
  EXPECT_EQ(early.error().code, ErrorCode::kOverloaded);
  EXPECT_NEAR(*early.error().retry_after_s, 2.0, 1e-6);
  EXPECT_EQ(early.error().retry_token, r.offered_token);
  EXPECT_EQ(ac->snapshot(c.now()).retry_booking_counters.early, 1);
  // A token sent with another body is refused as a bad request.
  auto wrong = ac->enqueue(4, 10, c.now(), with(who("y", "other", r.offered_token)));
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.error().code, ErrorCode::kInvalidRequest);
}

TEST(AdmissionBookings, TheUnmeasuredPromiseCountsOnlyTheSequencesMemoryHolds) {
  ManualClock c;
  AdmissionOptions o = booking_options(0);
  o.budget_bytes = 100;
  o.max_running = 4;
  o.step_time = 10ms;
  auto ac = make_booking_controller(o);
  ASSERT_TRUE(ac->enqueue(1, 60, c.now(), with(who("x", "1"), 50)).ok());
  auto running = ac->grant(c.now());
  ASSERT_EQ(running.size(), 1u);
  auto refused = ac->enqueue(2, 60, c.now(), with(who("y", "r"), 50));
  ASSERT_FALSE(refused.ok());
  // Four slots, but the budget holds one 60-byte request: 100 tokens one
  // step after another, not four at a time.
  EXPECT_NEAR(*refused.error().retry_after_s, 1.0, 1e-6);
}

TEST(AdmissionBookings, OffKeepsWholeSecondEstimatesAndBooksNothing) {
  ManualClock c;
  AdmissionOptions o = booking_options(0);
  o.retry_booking.enabled = false;
  auto ac = make_booking_controller(o);
  ASSERT_TRUE(ac->enqueue(1, 10, c.now(), with(who("x", "1"))).ok());
  auto running = ac->grant(c.now());
  ASSERT_EQ(running.size(), 1u);
  auto refused = ac->enqueue(2, 10, c.now(), with(who("y", "r")));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(*refused.error().retry_after_s, 1.0);  // unmeasured: 1 s per request
  EXPECT_TRUE(refused.error().retry_token.empty());
  EXPECT_EQ(ac->snapshot(c.now()).retry_bookings, 0);
}

TEST(AdmissionBookings, QueueWaitLimitBooksTheRetryToo) {
  ManualClock c;
  AdmissionOptions o = booking_options(4);
  o.queue_timeout = 2s;
  auto ac = make_booking_controller(o);
  ac->record_completion(c.now());
  c.advance(1s);
  ac->record_completion(c.now());
  ASSERT_TRUE(ac->enqueue(1, 10, c.now(), with(who("x", "1"))).ok());
  auto running = ac->grant(c.now());
  ASSERT_EQ(running.size(), 1u);
  const RetryIdentity r = who("y", "r");
  ASSERT_TRUE(ac->enqueue(2, 10, c.now(), with(r)).ok());
  c.advance(2s);
  auto expired = ac->expire(c.now());
  ASSERT_EQ(expired.size(), 1u);
  EXPECT_EQ(expired[0].error.code, ErrorCode::kOverloaded);
  EXPECT_EQ(expired[0].error.retry_token, r.offered_token);
  EXPECT_EQ(ac->snapshot(c.now()).retry_bookings, 1);
}

TEST(AdmissionSnapshot, QueueDepthCountsOnlyRequestsThatCannotStartNow) {
  ManualClock c;
  AdmissionOptions o = booking_options(2);
  o.max_running = 3;
  auto ac = make_booking_controller(o);
  // The engine has not called grant() yet: 3 of these 5 may start now.
  for (RequestId id = 1; id <= 5; ++id) ASSERT_TRUE(ac->enqueue(id, 10, c.now()).ok());
  auto snap = ac->snapshot(c.now());
  EXPECT_EQ(snap.queued, 5);
  EXPECT_EQ(snap.queue_depth, 2);
  EXPECT_LE(snap.queue_depth, o.max_queue);
  EXPECT_FALSE(ac->enqueue(6, 10, c.now()).ok());
}

}  // namespace
}  // namespace vg
