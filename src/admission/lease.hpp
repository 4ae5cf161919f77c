// Lease: the RAII reservation of one request's bytes on one device budget
// (docs/design.md "lease"). A Lease is owned by one thread at a
// time (the engine thread, normally) and may be moved between threads; its
// release is thread-safe against the AdmissionController that granted it.
#pragma once

#include <cstdint>
#include <memory>

namespace vg {

/// Caller-chosen identifier of one request inside one AdmissionController.
using RequestId = std::uint64_t;

/// Where a lease returns its bytes. Implemented by AdmissionController's
/// shared state; thread-safe. return_lease() is called exactly once per lease.
class LeaseLedger {
 public:
  virtual ~LeaseLedger() = default;
  virtual void return_lease(RequestId id, std::int64_t bytes) noexcept = 0;
  /// Lease `to` was split off lease `from` (Lease::split): from now on each
  /// is returned on its own, as one lease. Default: nothing to record.
  virtual void split_lease(RequestId /*from*/, RequestId /*to*/) noexcept {}
  /// Lease `id` is to hold `to` bytes instead of `from` (Lease::resize).
  /// A smaller lease always succeeds; a larger one only where the budget has
  /// room, unless `force` (bytes already in use, such as KV blocks whose
  /// payer ended while other sequences still read them). Default: granted.
  virtual bool resize_lease(RequestId /*id*/, std::int64_t /*from*/, std::int64_t /*to*/, bool /*force*/) noexcept {
    return true;
  }
};

/// Move-only ownership of `bytes()` reserved for one request. Released exactly
/// once: by release() or by the destructor, whichever comes first; a moved-from
/// Lease releases nothing. Release the lease only when the compute that used
/// the bytes has stopped (the KV cache is freed).
class Lease {
 public:
  /// An empty lease (holds nothing, releases nothing).
  Lease() = default;
  /// Takes over bytes the ledger has already counted as reserved. Made by
  /// AdmissionController::grant(); tests may build one on a fake ledger.
  Lease(std::shared_ptr<LeaseLedger> ledger, RequestId id, std::int64_t bytes) noexcept;
  ~Lease();

  Lease(Lease&& other) noexcept;
  /// Releases what this lease held, then takes over `other`'s reservation.
  Lease& operator=(Lease&& other) noexcept;
  Lease(const Lease&) = delete;
  Lease& operator=(const Lease&) = delete;

  /// Returns the bytes to the budget and wakes the granting side. Idempotent.
  void release() noexcept;

  /// Moves min(bytes, bytes()) of this lease into a new lease of request
  /// `id` (one of the sequences of a request granted for several, such as
  /// its n choices); each is then released on its own. An empty lease gives
  /// an empty one.
  Lease split(RequestId id, std::int64_t bytes) noexcept;

  /// Makes the lease hold `bytes` (>= 0): less returns the difference to
  /// the budget (and wakes the granting side); more is taken from the
  /// budget where it fits (or always, with `force`; see
  /// LeaseLedger::resize_lease). False, and nothing changes, when it does
  /// not fit or the lease is empty. A paged KV cache's lease follows the
  /// blocks its sequence holds this way (docs/admission-and-memory.md).
  bool resize(std::int64_t bytes, bool force = false) noexcept;

  /// True while the lease still holds its reservation.
  bool held() const { return ledger_ != nullptr; }
  explicit operator bool() const { return held(); }
  /// Reserved bytes (0 once released or moved from).
  std::int64_t bytes() const { return held() ? bytes_ : 0; }
  RequestId request_id() const { return id_; }

 private:
  std::shared_ptr<LeaseLedger> ledger_;
  RequestId id_ = 0;
  std::int64_t bytes_ = 0;
};

}  // namespace vg
