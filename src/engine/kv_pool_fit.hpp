// The size a KV block pool follows the effective budget to (Engine, in
// engine_kv_pool.cpp): a pure decision, tested without a model.
#pragma once

#include <cstdint>

#include "model/kv_blocks.hpp"

namespace vg {

/// The pool grows (below its full size) by at least its full size over
/// this: the hysteresis that keeps a budget which moves by a few blocks
/// (foreign bytes that come and go, the OOM governor's small raises) from
/// moving the pool, and recording every decode graph again, back and forth.
inline constexpr std::int64_t kKvPoolGrowStepDivisor = 64;

/// What fit_kv_pool() sees of the pool and the budget at one turn.
struct KvPoolFitInputs {
  KvBlockCounts counts;            ///< the pool now
  std::int64_t max_blocks = 0;     ///< its size at start-up: it never grows past it
  std::int64_t budget_blocks = 0;  ///< whole blocks the effective budget holds
  bool retry_wait = false;         ///< a resize failed less than a retry interval ago
};

/// The blocks the pool is resized to: what the budget holds, at least the
/// blocks in use and one, at most max_blocks; but the current size while a
/// failed resize waits to be tried again, or for growth short of the full
/// size by less than max_blocks / kKvPoolGrowStepDivisor (at least one
/// block). Shrinking is never held back (the budget says the memory is
/// gone), and a lost storage (KvBlockCounts::lost) is sized at once. Equal
/// to counts.total: no resize (unless the storage is lost).
inline std::int64_t kv_pool_target(const KvPoolFitInputs& in) {
  std::int64_t to = in.budget_blocks < in.max_blocks ? in.budget_blocks : in.max_blocks;
  if (to < in.counts.used) to = in.counts.used;
  if (to < 1) to = 1;
  if (in.counts.lost) return to;
  if (in.retry_wait) return in.counts.total;
  const std::int64_t step = in.max_blocks / kKvPoolGrowStepDivisor > 1 ? in.max_blocks / kKvPoolGrowStepDivisor : 1;
  if (to > in.counts.total && to < in.max_blocks && to - in.counts.total < step) return in.counts.total;
  return to;
}

}  // namespace vg
