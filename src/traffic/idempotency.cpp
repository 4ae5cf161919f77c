// The Idempotency-Key registry (see idempotency.hpp).
#include "traffic/idempotency.hpp"

namespace vg::traffic {

std::shared_ptr<IdempotencyRegistry> IdempotencyRegistry::create(const IdempotencyOptions& options) {
  IdempotencyOptions o = options;
  if (o.max_entries < 1) o.max_entries = 1;
  if (o.ttl < Duration::zero()) o.ttl = Duration::zero();
  return std::shared_ptr<IdempotencyRegistry>(new IdempotencyRegistry(o));
}

IdempotencyRegistry::Claim IdempotencyRegistry::claim(const std::string& key, const Digest& fingerprint,
                                                      const std::string& work_id, TimePoint now,
                                                      TimePoint (*clock)()) {
  std::lock_guard lock(mu_);
  if (auto it = entries_.find(key); it != entries_.end()) {
    Entry& e = it->second;
    if (e.done && e.expires_at <= now) {
      entries_.erase(it);  // expired: the key is free again
    } else if (e.fingerprint != fingerprint) {
      return Claim{Outcome::kConflict, nullptr};
    } else {
      return Claim{e.done ? Outcome::kReplayed : Outcome::kAttached, e.flight};
    }
  }
  if (entries_.size() >= options_.max_entries && !make_room(now)) return Claim{Outcome::kFull, nullptr};
  std::weak_ptr<IdempotencyRegistry> weak = weak_from_this();
  auto flight = Flight::create(work_id, [weak, key, clock](const Flight& f, bool completed) {
    if (auto registry = weak.lock()) registry->finished(key, &f, completed, clock());
  });
  entries_.emplace(key, Entry{fingerprint, flight, false, TimePoint::max()});
  return Claim{Outcome::kNew, flight};
}

void IdempotencyRegistry::finished(const std::string& key, const Flight* flight, bool completed, TimePoint now) {
  std::lock_guard lock(mu_);
  const auto it = entries_.find(key);
  if (it == entries_.end() || it->second.flight.get() != flight) return;
  if (!completed || options_.ttl <= Duration::zero()) {
    entries_.erase(it);
    return;
  }
  it->second.done = true;
  it->second.expires_at = now + options_.ttl;
}

bool IdempotencyRegistry::make_room(TimePoint now) {
  auto oldest = entries_.end();
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (it->second.done && it->second.expires_at <= now) {
      it = entries_.erase(it);
      continue;
    }
    if (it->second.done && (oldest == entries_.end() || it->second.expires_at < oldest->second.expires_at)) {
      oldest = it;
    }
    ++it;
  }
  if (entries_.size() < options_.max_entries) return true;
  if (oldest == entries_.end()) return false;  // every key names a running flight
  entries_.erase(oldest);
  return true;
}

std::size_t IdempotencyRegistry::size() const {
  std::lock_guard lock(mu_);
  return entries_.size();
}

}  // namespace vg::traffic
