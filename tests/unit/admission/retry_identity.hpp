// Helpers of the booked-retry tests (retry_booking_test.cpp,
// retry_recognition_test.cpp): retry identities and seconds of a duration.
#pragma once

#include <chrono>
#include <string>

#include "admission/retry_booking.hpp"

namespace vg::testing {

/// The identity of a request of `client` with body `body`, sending `token`
/// and Idempotency-Key `idem` (empty: none); each is offered a new token.
inline RetryIdentity who(const std::string& client, const std::string& body, const std::string& token = "",
                         const std::string& idem = "") {
  static int next = 0;
  RetryIdentity id;
  id.client = client;
  id.fingerprint = "fp:" + body;
  id.token = token;
  id.idempotency_key = idem;
  id.offered_token = "tok" + std::to_string(++next);
  return id;
}

/// `id` saying which attempt it is.
inline RetryIdentity attempt(RetryIdentity id, RetryAttempt a) {
  id.attempt = a;
  return id;
}

inline double secs(Duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace vg::testing
