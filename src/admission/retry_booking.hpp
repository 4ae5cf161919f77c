// Booked retries (docs/admission-and-memory.md "Booked retries"): when a request is refused because
// the server is overloaded, a place is booked for its retry at the time the
// answer promises, and the retry, recognised by its token, its
// Idempotency-Key or (same client, same body) its fingerprint, takes that
// place ahead of requests that arrived after the booking. A request its
// client calls a first attempt (RetryAttempt::kFirst) is never recognised by
// its body: an identical fresh request must not take a retry's place.
//
// Pure policy: promise_seconds() is a function of the work ahead; the
// RetryBookings value type takes `now` in every call and reads no clock.
// Not thread-safe: AdmissionController owns one and guards it with its mutex.
//
// A booking's window is [promised − early, promised + grace]:
//   - a retry recognised before the window gets kEarly (booking kept);
//   - inside it, kClaimed (the booking is removed; the caller queues the
//     retry with the booking's queue-entry time, skipping the queue limit);
//   - at promised + grace an unclaimed booking is released (expired).
// From the start of its window until it is claimed or released a booking
// occupies one place of the queue (open_places()), so new arrivals cannot
// take the place its retry was promised; and from its promise until
// slot_hold() after it, it also holds its turn in the grant order
// (holding()): the admission controller places it, at its booking time,
// among the queued requests, so a slot free at the promise is not given to a
// request that arrived after the booking while the retry is on its way. (A
// slot that frees before the promise goes to whoever is first: holding it
// would idle the device.)
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "admission/admission_policy.hpp"
#include "api/retry.hpp"
#include "common/clock.hpp"
#include "common/error.hpp"
#include "common/priority.hpp"

namespace vg {

struct RetryBookingOptions {
  bool enabled = true;             ///< false: refusals book nothing (the baseline)
  std::size_t max_bookings = 256;  ///< bookings held at once (>= 1)
  Duration early = std::chrono::milliseconds(250);  ///< a retry may come this much before its promise (>= 0)
  Duration grace = std::chrono::seconds(2);         ///< and this much after it (> 0)
  Duration max_after = std::chrono::seconds(30);    ///< a longer promise books nothing (> 0)
};

/// Ok when the bounds above hold; else kConfig naming them.
Status validate(const RetryBookingOptions& options);

/// One booked place.
struct RetryBooking {
  std::string token;
  std::string client;
  std::string fingerprint;
  std::string idempotency_key;
  TimePoint booked_at{};    ///< the refusal: the retry is queued with this entry time
  TimePoint promised_at{};  ///< when the retry is expected to be granted
  std::int64_t position = 0;  ///< 1-based place in line when booked (1 = next grant)
  std::int64_t cost_bytes = 0;
  std::int64_t tokens = 0;  ///< tokens it will produce (the unmeasured estimate counts them)
  int model = 0;            ///< the model it runs on
  Priority priority = Priority::kNormal;
};

/// The work that must be granted before a new place (the refused request's)
/// and the rates it drains at.
struct DrainView {
  std::int64_t requests_ahead = 0;  ///< waiting requests and earlier open bookings (>= 0)
  std::int64_t bytes_ahead = 0;     ///< their cost bytes plus the request's own
  std::optional<double> requests_per_s;  ///< measured completions/s; nullopt before the first
  double mean_cost_bytes = 0;            ///< mean cost of recent grants (0: unknown; bytes not counted)
  // Before any completion was measured:
  double step_s = 0;                ///< the memory profile's measured step time (0: unknown)
  std::int64_t tokens_ahead = 0;    ///< tokens running and queued work still has to produce, own included
  std::int64_t batch = 1;           ///< sequences one step decodes (>= 1): the batch, or fewer when memory holds fewer
  double unmeasured_rate_per_s = 1;  ///< last resort: completions/s assumed
};

/// Seconds from now until the new place would be granted:
///  - measured rate r: max((requests_ahead + 1) / r, bytes_ahead / (r × mean_cost_bytes)),
///    the second term only when mean_cost_bytes > 0;
///  - else with a step time: step_s × max(tokens_ahead, 1) / batch;
///  - else (requests_ahead + 1) / unmeasured_rate_per_s.
/// A rate <= 0 gives +infinity. Never below 0.001 s.
double promise_seconds(const DrainView& view);

/// Completions per second implied by a promise of `promise_s` for a place
/// with `requests_ahead` ahead: (requests_ahead + 1) / promise_s.
double implied_rate_per_s(std::int64_t requests_ahead, double promise_s);

struct RetryBookingCounters {
  std::int64_t booked = 0;   ///< places booked
  std::int64_t claimed = 0;  ///< retries that took their place inside the window
  std::int64_t expired = 0;  ///< bookings released unclaimed at their grace deadline
  std::int64_t early = 0;    ///< retries refused again for coming before their window
  std::int64_t refused = 0;  ///< refusals that booked nothing (limits, share, promise too far)
  /// Retries by token whose booking another request of the same client and
  /// body had claimed (recognise()): admitted all the same, inside the window.
  std::int64_t reclaimed = 0;
};

class RetryBookings {
 public:
  RetryBookings() : RetryBookings(RetryBookingOptions{}) {}
  explicit RetryBookings(RetryBookingOptions options) : options_(options) {}

  enum class Match {
    kNone,      ///< not the retry of a booking (or its booking expired)
    kClaimed,   ///< inside its window: the booking was removed and is returned
    kEarly,     ///< before its window: booking kept; `left` until the promise
    kMismatch,  ///< its X-Retry-Token names a booking of a different request
  };
  struct Lookup {
    Match match = Match::kNone;
    RetryBooking booking;        ///< kClaimed, kEarly: the booking
    const char* by = "";         ///< "token", "idempotency_key" or "body"
    Duration left{};             ///< kEarly: promised_at − now
  };

  /// Releases expired bookings, then looks `id` up: by token (which must
  /// also carry the booking's fingerprint, else kMismatch; a booking that a
  /// request matched by body claimed before its token came is still the
  /// token's until its grace deadline: the promise was made to the token's
  /// holder, so its retry is claimed too, counted as reclaimed), else by the same
  /// Idempotency-Key and fingerprint, else, unless `id` is a first
  /// attempt, by the same client and fingerprint: the oldest such booking
  /// whose window is open, else, for a request that says it is a retry, the
  /// oldest such booking (one that does not say is then a new request). A token or
  /// Idempotency-Key names the request's own booking, so a first attempt is
  /// recognised by them (a client that retries by hand with SDK retries off
  /// sends x-stainless-retry-count: 0 every time).
  Lookup recognise(const RetryIdentity& id, TimePoint now);

  struct Decision {
    bool booked = false;
    RetryBooking booking;  ///< booked: the place
    std::string reason;    ///< not booked: why (for the refusal's message); empty when bookings are off
  };

  /// Books a place for the retry of refused request `id` promised at
  /// now + promise_s, at 1-based `position` in line, unless: bookings are off
  /// or `id` is not bookable; max_bookings are held; the client holds its
  /// share (max(1, max_bookings / (clients holding bookings, this one
  /// included, + 1)): one share is always left for a newcomer); the promise
  /// is beyond max_after; or the drain rate `rate_per_s` cannot honour one
  /// more (bookings + 1 > rate × max_after). Releases expired bookings first.
  Decision book(const RetryIdentity& id, TimePoint now, double promise_s, std::int64_t position,
                double rate_per_s, std::int64_t cost_bytes, std::int64_t tokens, int model = 0,
                Priority priority = Priority::kNormal);

  /// Releases the bookings whose grace deadline has passed; returns how many.
  std::int64_t sweep(TimePoint now);

  /// Bookings whose window has opened at `now` and are not yet claimed or
  /// released: each occupies a queue place.
  std::int64_t open_places(TimePoint now) const;

  /// Bookings that hold their turn at `now` (promised <= now <= promised +
  /// slot_hold()), in booking order.
  std::vector<const RetryBooking*> holding(TimePoint now) const;
  /// How long after its promise a booking still holds its turn: min(grace,
  /// 500 ms), so a retry that never comes idles a slot only briefly (it stays
  /// claimable, with its queue place, until the grace deadline).
  Duration slot_hold() const;

  /// Bookings held (open or not yet open), in booking order.
  const std::vector<RetryBooking>& held() const { return bookings_; }

  /// Earliest time after `now` at which a booking's window opens or closes
  /// (the place count changes); nullopt when none is held.
  std::optional<TimePoint> next_change(TimePoint now) const;

  const RetryBookingCounters& counters() const { return counters_; }
  const RetryBookingOptions& options() const { return options_; }

 private:
  /// The booking `id` matches by client and body (see recognise()); end() when none.
  std::vector<RetryBooking>::iterator find_by_body(const RetryIdentity& id, TimePoint now);
  std::size_t held_by(const std::string& client) const;
  std::size_t clients_with(const std::string& client) const;

  /// The retry of `booking` (recognised by `by`) at `now`: kEarly before its
  /// window (counted), else kClaimed; the caller removes a claimed booking.
  Lookup answer(const RetryBooking& booking, const char* by, TimePoint now);
  /// The booking lent_ holds for `token`; end() when none.
  std::vector<RetryBooking>::iterator find_lent(const std::string& token);

  RetryBookingOptions options_;
  std::vector<RetryBooking> bookings_;  // booking order = promise order
  /// Bookings claimed by body while their token was out, until their grace
  /// deadline (at most max_bookings, oldest dropped first).
  std::vector<RetryBooking> lent_;
  RetryBookingCounters counters_;
};

/// `queue` (queue order) with the `holding` bookings (booking order) placed
/// among its entries at their booking time, for assign_grants(): a booking
/// is a request of its cost, model and class that entered the queue when it
/// was booked. origin[i] is the index in `queue` of entry i, or -1 for a
/// booking (whose placement, if any, holds a slot and is not a grant).
struct QueueWithTurns {
  std::vector<QueuedRequest> entries;
  std::vector<std::ptrdiff_t> origin;
};
QueueWithTurns with_held_turns(std::span<const QueuedRequest> queue, const std::vector<const RetryBooking*>& holding);

}  // namespace vg
