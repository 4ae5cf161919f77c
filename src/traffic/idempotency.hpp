// The Idempotency-Key registry (docs/admission-and-memory.md "Traffic policies"): which flight a
// key names, and for how long. A key seen for the first time starts a new
// flight; a key whose flight is still running attaches to it; a key whose
// flight completed is replayed until `ttl` after its end; the same key with
// a different request (route + body) is a conflict (422). A flight that
// failed or was cancelled is forgotten at its end, so a retry runs again.
// Policy only: `now` is passed in, so tests drive it with a manual clock.
//
// Bounded: at most `max_entries` keys. When full, expired entries go first,
// then the completed entry closest to expiry; running flights are never
// evicted, and a new key finding only running ones gets kFull (-> 503).
//
// Thread-safety: every member is thread-safe (one internal mutex, never held
// while calling into a flight).
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "common/clock.hpp"
#include "traffic/digest.hpp"
#include "traffic/flight.hpp"

namespace vg::traffic {

struct IdempotencyOptions {
  Duration ttl = std::chrono::seconds(300);  ///< replay window after a completed flight ends (>= 0)
  std::size_t max_entries = 10000;           ///< keys held at most (>= 1)
};

class IdempotencyRegistry : public std::enable_shared_from_this<IdempotencyRegistry> {
 public:
  enum class Outcome {
    kNew,       ///< a new flight: the caller submits the work and calls flight->start() or fail()
    kAttached,  ///< the key's flight is running: attach to it
    kReplayed,  ///< the key's flight completed within ttl: attach to replay it
    kConflict,  ///< same key, different request: 422 idempotency_key_reused
    kFull,      ///< no room for a new key: 503
  };
  struct Claim {
    Outcome outcome = Outcome::kNew;
    std::shared_ptr<Flight> flight;  ///< null for kConflict and kFull
  };

  static std::shared_ptr<IdempotencyRegistry> create(const IdempotencyOptions& options);

  /// Looks up `key` (already scoped by the caller, e.g. by API key id) for a
  /// request with `fingerprint`. kNew creates the flight (its request id is
  /// `work_id`), wired to call finished() at its end with `clock`'s time.
  Claim claim(const std::string& key, const Digest& fingerprint, const std::string& work_id, TimePoint now,
              TimePoint (*clock)() = &real_now);

  /// `key`'s flight ended at `now`: completed → replayable until now + ttl;
  /// otherwise forgotten. Ignored when the key now names another flight.
  void finished(const std::string& key, const Flight* flight, bool completed, TimePoint now);

  /// Keys held now (running and replayable, expired ones not yet swept).
  std::size_t size() const;

  static TimePoint real_now() { return Clock::now(); }

 private:
  struct Entry {
    Digest fingerprint{};
    std::shared_ptr<Flight> flight;
    bool done = false;       // completed; replayable until expires_at
    TimePoint expires_at{};
  };
  explicit IdempotencyRegistry(const IdempotencyOptions& options) : options_(options) {}
  bool make_room(TimePoint now);  // requires mu_

  const IdempotencyOptions options_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, Entry> entries_;  // guarded by mu_
};

}  // namespace vg::traffic
