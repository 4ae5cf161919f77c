// Lease (see lease.hpp): exactly-once release through the owning ledger.
// The thread that owns the Lease object calls these; the ledger is thread-safe.
#include "admission/lease.hpp"

#include <algorithm>
#include <utility>

namespace vg {

Lease::Lease(std::shared_ptr<LeaseLedger> ledger, RequestId id, std::int64_t bytes) noexcept
    : ledger_(std::move(ledger)), id_(id), bytes_(bytes) {}

Lease::~Lease() { release(); }

Lease::Lease(Lease&& other) noexcept
    : ledger_(std::exchange(other.ledger_, nullptr)), id_(other.id_), bytes_(std::exchange(other.bytes_, 0)) {}

Lease& Lease::operator=(Lease&& other) noexcept {
  if (this != &other) {
    release();
    ledger_ = std::exchange(other.ledger_, nullptr);
    id_ = other.id_;
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void Lease::release() noexcept {
  // Take the ledger first so a re-entrant call (e.g. from the wake callback)
  // finds the lease already empty.
  std::shared_ptr<LeaseLedger> ledger = std::exchange(ledger_, nullptr);
  if (ledger) ledger->return_lease(id_, std::exchange(bytes_, 0));
}

Lease Lease::split(RequestId id, std::int64_t bytes) noexcept {
  if (!ledger_) return Lease();
  const std::int64_t moved = std::clamp<std::int64_t>(bytes, 0, bytes_);
  bytes_ -= moved;
  ledger_->split_lease(id_, id);
  return Lease(ledger_, id, moved);
}

}  // namespace vg

namespace vg {

bool Lease::resize(std::int64_t bytes, bool force) noexcept {
  if (!ledger_ || bytes < 0) return false;
  if (bytes == bytes_) return true;
  if (!ledger_->resize_lease(id_, bytes_, bytes, force)) return false;
  bytes_ = bytes;
  return true;
}

}  // namespace vg
