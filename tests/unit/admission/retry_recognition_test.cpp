// How a retry is recognised on a manual clock: by its token, Idempotency-Key
// or body (same client), first attempts and said retries, a booking a body
// match took that is still its token's, and the window (early, claimed,
// released).
#include <gtest/gtest.h>

#include "admission/retry_booking.hpp"
#include "manual_clock.hpp"
#include "retry_identity.hpp"

namespace vg {
namespace {

using namespace std::chrono_literals;
using testing::attempt;
using testing::ManualClock;
using testing::secs;
using testing::who;
using Match = RetryBookings::Match;

TEST(RetryBookings, RecognisedByTokenIdempotencyKeyOrBodyOfTheSameClient) {
  ManualClock c;
  RetryBookings b({true, 16, 250ms, 2s, 30s});
  const RetryIdentity first = who("addr:a", "one");
  auto d = b.book(first, c.now(), 1.0, 3, 10, 100, 8);
  ASSERT_TRUE(d.booked);
  EXPECT_EQ(d.booking.token, first.offered_token);
  EXPECT_EQ(d.booking.position, 3);
  c.advance(1s);

  // Another client with the same body is not this booking's retry.
  EXPECT_EQ(b.recognise(who("addr:b", "one"), c.now()).match, Match::kNone);
  // The same client, another body: not either.
  EXPECT_EQ(b.recognise(who("addr:a", "two"), c.now()).match, Match::kNone);
  // By token, even from another address (a client behind a new NAT port).
  auto by_token = b.recognise(who("addr:z", "one", first.offered_token), c.now());
  EXPECT_EQ(by_token.match, Match::kClaimed);
  EXPECT_STREQ(by_token.by, "token");
  EXPECT_EQ(b.held().size(), 0u);

  // By body: same client, same fingerprint, no headers (the OpenAI SDKs).
  ASSERT_TRUE(b.book(who("key:k1", "q"), c.now(), 1.0, 1, 10, 100, 8).booked);
  c.advance(1s);
  auto by_body = b.recognise(who("key:k1", "q"), c.now());
  EXPECT_EQ(by_body.match, Match::kClaimed);
  EXPECT_STREQ(by_body.by, "body");

  // By Idempotency-Key, from another client identity.
  ASSERT_TRUE(b.book(who("addr:a", "w", "", "k\nid-1"), c.now(), 1.0, 1, 10, 100, 8).booked);
  c.advance(1s);
  auto by_key = b.recognise(who("addr:q", "w", "", "k\nid-1"), c.now());
  EXPECT_EQ(by_key.match, Match::kClaimed);
  EXPECT_STREQ(by_key.by, "idempotency_key");
  EXPECT_EQ(b.counters().claimed, 3);
}

TEST(RetryBookings, AFirstAttemptNeverTakesABookingByItsBody) {
  ManualClock c;
  RetryBookings b({true, 16, 250ms, 2s, 30s});
  const RetryIdentity refused = who("addr:proxy", "same");
  ASSERT_TRUE(b.book(refused, c.now(), 1.0, 1, 10, 100, 8).booked);
  c.advance(1s);
  // An identical fresh request from the same client (x-stainless-retry-count: 0):
  // not the retry, and the booking stays for it.
  EXPECT_EQ(b.recognise(attempt(who("addr:proxy", "same"), RetryAttempt::kFirst), c.now()).match, Match::kNone);
  EXPECT_EQ(b.held().size(), 1u);
  EXPECT_EQ(b.counters().claimed, 0);
  // The client's retry (count >= 1) takes it by body.
  const auto retry = b.recognise(attempt(who("addr:proxy", "same"), RetryAttempt::kRetry), c.now());
  EXPECT_EQ(retry.match, Match::kClaimed);
  EXPECT_STREQ(retry.by, "body");
}

TEST(RetryBookings, ASaidRetryTakesAnOpenBookingOfItsBodyBeforeAnOlderOneNotYetOpen) {
  // Two refusals of one client and body; the later one was promised sooner
  // (the drain rate rose in between). Its retry comes at its promise.
  ManualClock c;
  RetryBookings b({true, 16, 250ms, 2s, 30s});
  ASSERT_TRUE(b.book(who("addr:proxy", "same"), c.now(), 3.0, 2, 10, 100, 8).booked);
  c.advance(100ms);
  ASSERT_TRUE(b.book(who("addr:proxy", "same"), c.now(), 1.0, 1, 10, 100, 8).booked);
  c.advance(1s);
  // Said to be a retry: the open one, interchangeable with the older.
  const auto retry = b.recognise(attempt(who("addr:proxy", "same"), RetryAttempt::kRetry), c.now());
  EXPECT_EQ(retry.match, Match::kClaimed);
  EXPECT_EQ(retry.booking.position, 1);
  ASSERT_EQ(b.held().size(), 1u);
  EXPECT_EQ(b.held()[0].position, 2);
  // With none open it is early for the oldest, as before.
  EXPECT_EQ(b.recognise(attempt(who("addr:proxy", "same"), RetryAttempt::kRetry), c.now()).match, Match::kEarly);
  // Without the count it is a new request: not told to wait for another request's place.
  EXPECT_EQ(b.recognise(who("addr:proxy", "same"), c.now()).match, Match::kNone);
  EXPECT_EQ(b.held().size(), 1u);
}

TEST(RetryBookings, ARequestThatDoesNotSayItIsARetryTakesOnlyAnOpenBookingOfItsBody) {
  // 24 clients behind one address sending one body: a fresh request
  // matched by body is never refused as early for another's booking.
  ManualClock c;
  RetryBookings b({true, 16, 250ms, 2s, 30s});
  ASSERT_TRUE(b.book(who("addr:proxy", "same"), c.now(), 2.0, 1, 10, 100, 8).booked);
  c.advance(1s);
  EXPECT_EQ(b.recognise(who("addr:proxy", "same"), c.now()).match, Match::kNone);
  EXPECT_EQ(b.counters().early, 0);
  c.advance(900ms);  // inside the window
  EXPECT_EQ(b.recognise(who("addr:proxy", "same"), c.now()).match, Match::kClaimed);
}

TEST(RetryBookings, ATokensRetryStillClaimsItsPlaceAfterARequestMatchedByBodyTookTheBooking) {
  // The promise was made to the token's holder: a request of the same client
  // and body that took the booking first does not void it.
  ManualClock c;
  RetryBookings b({true, 16, 250ms, 2s, 30s});
  const RetryIdentity refused = who("addr:proxy", "same");
  ASSERT_TRUE(b.book(refused, c.now(), 1.0, 1, 10, 100, 8).booked);
  c.advance(1s);
  const auto taker = b.recognise(who("addr:proxy", "same"), c.now());
  ASSERT_EQ(taker.match, Match::kClaimed);
  EXPECT_STREQ(taker.by, "body");
  const auto retry = b.recognise(who("addr:proxy", "same", refused.offered_token), c.now());
  EXPECT_EQ(retry.match, Match::kClaimed);
  EXPECT_STREQ(retry.by, "token");
  EXPECT_EQ(retry.booking.position, 1);
  EXPECT_EQ(b.counters().claimed, 1);
  EXPECT_EQ(b.counters().reclaimed, 1);
  // Once: the same token again is a new request; another body with it a mismatch.
  EXPECT_EQ(b.recognise(who("addr:proxy", "same", refused.offered_token), c.now()).match, Match::kNone);
  // And only until the grace deadline.
  ASSERT_TRUE(b.book(refused, c.now(), 1.0, 1, 10, 100, 8).booked);
  const std::string token2 = refused.offered_token;
  c.advance(1s);
  ASSERT_EQ(b.recognise(who("addr:proxy", "same"), c.now()).match, Match::kClaimed);
  c.advance(2001ms);
  EXPECT_EQ(b.recognise(who("addr:proxy", "same", token2), c.now()).match, Match::kNone);
  EXPECT_EQ(b.counters().reclaimed, 1);
}

TEST(RetryBookings, AFirstAttemptStillClaimsItsOwnBookingByTokenOrIdempotencyKey) {
  // A client retrying by hand with SDK retries off says "first attempt" each
  // time; its token or Idempotency-Key names its own booking.
  ManualClock c;
  RetryBookings b({true, 16, 250ms, 2s, 30s});
  const RetryIdentity by_token = who("addr:a", "t");
  const RetryIdentity by_key = who("addr:a", "k", "", "\nord-1");
  ASSERT_TRUE(b.book(by_token, c.now(), 1.0, 1, 10, 100, 8).booked);
  ASSERT_TRUE(b.book(by_key, c.now(), 1.0, 2, 10, 100, 8).booked);
  c.advance(1s);
  const auto t = b.recognise(attempt(who("addr:a", "t", by_token.offered_token), RetryAttempt::kFirst), c.now());
  EXPECT_EQ(t.match, Match::kClaimed);
  EXPECT_STREQ(t.by, "token");
  const auto k = b.recognise(attempt(who("addr:a", "k", "", "\nord-1"), RetryAttempt::kFirst), c.now());
  EXPECT_EQ(k.match, Match::kClaimed);
  EXPECT_STREQ(k.by, "idempotency_key");
}

TEST(RetryBookings, ATokenOfAnotherRequestIsAMismatch) {
  ManualClock c;
  RetryBookings b;
  const RetryIdentity id = who("addr:a", "one");
  ASSERT_TRUE(b.book(id, c.now(), 1.0, 1, 10, 1, 1).booked);
  c.advance(1s);
  EXPECT_EQ(b.recognise(who("addr:a", "other body", id.offered_token), c.now()).match, Match::kMismatch);
  EXPECT_EQ(b.held().size(), 1u);  // kept for the real retry
}

TEST(RetryBookings, EarlyRetriesKeepTheBookingLateOnesFindItReleased) {
  ManualClock c;
  RetryBookings b({true, 16, 200ms, 1s, 30s});
  RetryIdentity id = who("addr:a", "x");
  ASSERT_TRUE(b.book(id, c.now(), 2.0, 1, 10, 1, 1).booked);
  id.token = id.offered_token;  // the retry sends its token
  c.advance(1s);                // 1 s before the promise, beyond the 200 ms early window
  auto early = b.recognise(id, c.now());
  EXPECT_EQ(early.match, Match::kEarly);
  EXPECT_NEAR(secs(early.left), 1.0, 1e-9);
  EXPECT_EQ(b.held().size(), 1u);
  EXPECT_EQ(b.counters().early, 1);
  c.advance(850ms);  // 150 ms before: inside the window
  EXPECT_EQ(b.recognise(id, c.now()).match, Match::kClaimed);

  ASSERT_TRUE(b.book(id, c.now(), 2.0, 1, 10, 1, 1).booked);
  id.token = id.offered_token;
  c.advance(3s);                         // promise + grace passed at 2 + 1 s
  EXPECT_EQ(b.open_places(c.now()), 1);  // exactly at the deadline it still holds
  c.advance(1ms);
  EXPECT_EQ(b.recognise(id, c.now()).match, Match::kNone);
  EXPECT_EQ(b.counters().expired, 1);
  EXPECT_TRUE(b.held().empty());
}

}  // namespace
}  // namespace vg
