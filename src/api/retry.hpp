// What a request carries to be recognised as the retry of a refused one
// (admission/retry_booking.hpp books and claims places by it). Plain data;
// any thread.
#pragma once

#include <string>

namespace vg {

/// What the client says of a request's attempt (the OpenAI SDKs send
/// x-stainless-retry-count: 0 on a first attempt, the retry's number after).
enum class RetryAttempt {
  kUnknown,  ///< the client does not say: a body match may make it a retry
  kFirst,    ///< a fresh request: never recognised by its body as another request's retry
  kRetry,    ///< the client's retry of a request it sent before
};

/// What identifies a request as the retry of a refused one. Opaque strings,
/// compared for equality only; built by the HTTP layer.
struct RetryIdentity {
  std::string client;           ///< "key:<scope>" or "addr:<ip>": fairness, and body matching within a client
  std::string fingerprint;      ///< digest of route + body; empty: not a bookable request
  std::string idempotency_key;  ///< scoped Idempotency-Key; empty when none
  std::string token;            ///< X-Retry-Token presented; empty when none
  std::string offered_token;    ///< the token a booking made for this request gets (unique, unguessable)
  RetryAttempt attempt = RetryAttempt::kUnknown;

  bool bookable() const { return !fingerprint.empty() && !offered_token.empty(); }
};

}  // namespace vg
