// Booked retries (see retry_booking.hpp). Pure arithmetic over caller-provided
// time points; no clock reads.
#include "admission/retry_booking.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <string_view>

namespace vg {
namespace {

constexpr double kMinPromiseS = 0.001;

}  // namespace

Status validate(const RetryBookingOptions& o) {
  if (o.max_bookings < 1 || o.early < Duration::zero() || o.grace <= Duration::zero() ||
      o.max_after <= Duration::zero()) {
    return Error(ErrorCode::kConfig,
                 "retry bookings need max_retry_bookings >= 1, retry_early >= 0, retry_grace > 0 and "
                 "max_retry_after > 0");
  }
  return Status::Ok();
}

double promise_seconds(const DrainView& v) {
  const double ahead = static_cast<double>(std::max<std::int64_t>(v.requests_ahead, 0)) + 1;
  double s = 0;
  if (v.requests_per_s) {
    const double r = *v.requests_per_s;
    if (!(r > 0)) return std::numeric_limits<double>::infinity();
    s = ahead / r;
    if (v.mean_cost_bytes > 0) s = std::max(s, static_cast<double>(v.bytes_ahead) / (r * v.mean_cost_bytes));
  } else if (v.step_s > 0) {
    s = v.step_s * static_cast<double>(std::max<std::int64_t>(v.tokens_ahead, 1)) /
        static_cast<double>(std::max<std::int64_t>(v.batch, 1));
  } else {
    if (!(v.unmeasured_rate_per_s > 0)) return std::numeric_limits<double>::infinity();
    s = ahead / v.unmeasured_rate_per_s;
  }
  return std::max(s, kMinPromiseS);
}

double implied_rate_per_s(std::int64_t requests_ahead, double promise_s) {
  if (!(promise_s > 0) || !std::isfinite(promise_s)) return 0;
  return static_cast<double>(std::max<std::int64_t>(requests_ahead, 0) + 1) / promise_s;
}

std::int64_t RetryBookings::sweep(TimePoint now) {
  const auto before = bookings_.size();
  std::erase_if(bookings_, [&](const RetryBooking& b) { return now > b.promised_at + options_.grace; });
  std::erase_if(lent_, [&](const RetryBooking& b) { return now > b.promised_at + options_.grace; });
  const auto released = static_cast<std::int64_t>(before - bookings_.size());
  counters_.expired += released;
  return released;
}

RetryBookings::Lookup RetryBookings::answer(const RetryBooking& booking, const char* by, TimePoint now) {
  Lookup out;
  out.booking = booking;
  out.by = by;
  if (now < booking.promised_at - options_.early) {
    out.match = Match::kEarly;
    out.left = booking.promised_at - now;
    ++counters_.early;
  } else {
    out.match = Match::kClaimed;
  }
  return out;
}

RetryBookings::Lookup RetryBookings::recognise(const RetryIdentity& id, TimePoint now) {
  sweep(now);
  if (id.fingerprint.empty()) return {};
  if (!id.token.empty()) {
    // Its booking, held or taken by a body match (lent): the promise was made to the token's holder.
    const auto held =
        std::find_if(bookings_.begin(), bookings_.end(), [&](const RetryBooking& b) { return b.token == id.token; });
    const auto lent = held == bookings_.end() ? find_lent(id.token) : lent_.end();
    const RetryBooking* booking = held != bookings_.end() ? &*held : lent != lent_.end() ? &*lent : nullptr;
    if (booking && booking->fingerprint != id.fingerprint) {
      Lookup mismatch;
      mismatch.match = Match::kMismatch;
      return mismatch;
    }
    if (booking) {
      Lookup out = answer(*booking, "token", now);
      if (out.match != Match::kClaimed) return out;
      if (held != bookings_.end()) {
        bookings_.erase(held);
        ++counters_.claimed;
      } else {
        lent_.erase(lent);
        ++counters_.reclaimed;
      }
      return out;
    }
  }
  const char* by = "idempotency_key";
  auto found = bookings_.end();
  if (!id.idempotency_key.empty()) {
    found = std::find_if(bookings_.begin(), bookings_.end(), [&](const RetryBooking& b) {
      return b.idempotency_key == id.idempotency_key && b.fingerprint == id.fingerprint;
    });
  }
  if (found == bookings_.end()) {
    found = find_by_body(id, now);
    by = "body";
  }
  if (found == bookings_.end()) return {};
  Lookup out = answer(*found, by, now);
  if (out.match != Match::kClaimed) return out;
  if (out.by == std::string_view("body") && !found->token.empty()) {
    if (lent_.size() >= options_.max_bookings) lent_.erase(lent_.begin());
    lent_.push_back(*found);
  }
  bookings_.erase(found);
  ++counters_.claimed;
  return out;
}

std::vector<RetryBooking>::iterator RetryBookings::find_lent(const std::string& token) {
  return std::find_if(lent_.begin(), lent_.end(), [&](const RetryBooking& b) { return b.token == token; });
}

std::vector<RetryBooking>::iterator RetryBookings::find_by_body(const RetryIdentity& id, TimePoint now) {
  if (id.attempt == RetryAttempt::kFirst) return bookings_.end();
  const auto same = [&](const RetryBooking& b) { return b.client == id.client && b.fingerprint == id.fingerprint; };
  // The client's bookings of this body are interchangeable: one whose window is open, if any.
  const auto open = std::find_if(bookings_.begin(), bookings_.end(), [&](const RetryBooking& b) {
    return same(b) && now >= b.promised_at - options_.early;
  });
  if (open != bookings_.end()) return open;
  // Said to be a retry: the oldest (told the time left when early). A request
  // that does not say is not told to wait for another request's place: it
  // is new unless a place of its body is open.
  if (id.attempt == RetryAttempt::kRetry) return std::find_if(bookings_.begin(), bookings_.end(), same);
  return bookings_.end();
}

std::size_t RetryBookings::held_by(const std::string& client) const {
  return static_cast<std::size_t>(
      std::count_if(bookings_.begin(), bookings_.end(), [&](const RetryBooking& b) { return b.client == client; }));
}

std::size_t RetryBookings::clients_with(const std::string& client) const {
  std::set<std::string> clients{client};
  for (const RetryBooking& b : bookings_) clients.insert(b.client);
  return clients.size();
}

RetryBookings::Decision RetryBookings::book(const RetryIdentity& id, TimePoint now, double promise_s,
                                            std::int64_t position, double rate_per_s, std::int64_t cost_bytes,
                                            std::int64_t tokens, int model, Priority priority) {
  Decision d;
  if (!options_.enabled || !id.bookable()) return d;
  sweep(now);
  const auto refuse = [&](std::string why) {
    ++counters_.refused;
    d.reason = std::move(why);
    return d;
  };
  const std::size_t max = std::max<std::size_t>(options_.max_bookings, 1);
  if (bookings_.size() >= max) {
    return refuse("not booked: all " + std::to_string(max) + " retry bookings are held");
  }
  const std::size_t share = std::max<std::size_t>(1, max / (clients_with(id.client) + 1));
  if (held_by(id.client) >= share) {
    return refuse("not booked: this client holds its share of retry bookings (" + std::to_string(share) + " of " +
                  std::to_string(max) + ")");
  }
  const double max_after = to_seconds(options_.max_after);
  if (!(promise_s <= max_after)) {
    return refuse("not booked: the estimate is beyond the longest promise (" + std::to_string(std::lround(max_after)) +
                  " s)");
  }
  if (static_cast<double>(bookings_.size() + 1) > rate_per_s * max_after) {
    return refuse("not booked: the drain rate cannot honour more retry bookings");
  }
  RetryBooking b;
  b.token = id.offered_token;
  b.client = id.client;
  b.fingerprint = id.fingerprint;
  b.idempotency_key = id.idempotency_key;
  b.booked_at = now;
  b.promised_at = now + from_seconds(promise_s);
  b.position = position;
  b.cost_bytes = cost_bytes;
  b.tokens = tokens;
  b.model = model;
  b.priority = priority;
  bookings_.push_back(b);
  ++counters_.booked;
  d.booked = true;
  d.booking = std::move(b);
  return d;
}

std::int64_t RetryBookings::open_places(TimePoint now) const {
  return static_cast<std::int64_t>(std::count_if(bookings_.begin(), bookings_.end(), [&](const RetryBooking& b) {
    return now >= b.promised_at - options_.early && now <= b.promised_at + options_.grace;
  }));
}

Duration RetryBookings::slot_hold() const { return std::min<Duration>(options_.grace, std::chrono::milliseconds(500)); }

std::vector<const RetryBooking*> RetryBookings::holding(TimePoint now) const {
  std::vector<const RetryBooking*> out;
  for (const RetryBooking& b : bookings_) {
    if (now >= b.promised_at && now <= b.promised_at + slot_hold()) out.push_back(&b);
  }
  return out;
}

QueueWithTurns with_held_turns(std::span<const QueuedRequest> queue, const std::vector<const RetryBooking*>& holding) {
  QueueWithTurns out;
  out.entries.reserve(queue.size() + holding.size());
  out.origin.reserve(queue.size() + holding.size());
  std::size_t h = 0;
  const auto add_turns_before = [&](std::optional<TimePoint> t) {
    for (; h < holding.size() && (!t || holding[h]->booked_at < *t); ++h) {
      const RetryBooking& b = *holding[h];
      out.entries.push_back(QueuedRequest{0, b.cost_bytes, b.booked_at, b.priority, b.model});
      out.origin.push_back(-1);
    }
  };
  for (std::size_t i = 0; i < queue.size(); ++i) {
    add_turns_before(queue[i].enqueued_at);
    out.entries.push_back(queue[i]);
    out.origin.push_back(static_cast<std::ptrdiff_t>(i));
  }
  add_turns_before(std::nullopt);
  return out;
}

std::optional<TimePoint> RetryBookings::next_change(TimePoint now) const {
  std::optional<TimePoint> t;
  const auto consider = [&](TimePoint x) {
    if (x > now && (!t || x < *t)) t = x;
  };
  for (const RetryBooking& b : bookings_) {
    consider(b.promised_at - options_.early);
    consider(b.promised_at);
    consider(b.promised_at + slot_hold() + Duration(1));
    consider(b.promised_at + options_.grace + Duration(1));
  }
  return t;
}

}  // namespace vg
