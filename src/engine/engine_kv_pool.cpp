// The engine with a paged KV cache (Engine::Options::kv_pool): leases in
// whole blocks, prompts that start from the prefix cache's blocks, growth on
// demand with preemption when the budget has no block left, and a pool that
// follows the effective budget. Engine thread only; see engine_impl.hpp and
// docs/admission-and-memory.md "KV blocks".
//
// The ledger stays exact: on demand, each sequence's lease pays for the
// blocks it brought into use (measured as the change in the pool's used
// blocks around each of its operations), and kv_orphans pays for the blocks
// still read after their payer ended, so the leases of a device always sum
// to its used blocks. Under full, each lease pays for its worst case, which
// covers every block its sequence can hold.
#include <spdlog/spdlog.h>

#include <algorithm>

#include "device/device.hpp"
#include "engine/engine_impl.hpp"
#include "engine/kv_pool_fit.hpp"

namespace vg {

namespace {
// The admission source id of the pool's bound on a device's effective
// budget (set_effective_budget): apart from the engines' own OOM governors.
constexpr int kPoolSource = 1 << 20;
// How long a pool that could not be resized waits before it tries again.
constexpr Duration kPoolGrowRetry = std::chrono::seconds(1);
// How soon a pool that lost its storage tries to allocate one again (the
// engine takes no work meanwhile).
constexpr Duration kPoolLostRetry = std::chrono::milliseconds(20);
}  // namespace

std::int64_t Engine::Impl::pool_cost(int context_tokens, int max_more) const {
  const KvBlockGeometry& g = options.kv_pool->geometry;
  const int more =
      options.kv_pool->reservation == KvReservation::kFull ? max_more : output_lengths.reserve_tokens(max_more);
  return kv_blocks_bytes(g, cached_positions(context_tokens, more));
}

std::int64_t Engine::Impl::cached_positions(int context_tokens, int more) {
  // The last token generated is never fed back, so it takes no position.
  return static_cast<std::int64_t>(context_tokens) + std::max(0, more - 1);
}

void Engine::Impl::start_kv_pool() {
  const std::optional<KvBlockCounts> counts = model.kv_pool_counts();
  kv_pool_max_blocks = counts ? counts->total : 0;
  admission->set_effective_budget(kv_pool_max_blocks * options.kv_pool->geometry.block_bytes, device_index,
                                  kPoolSource + index);
  kv_orphans = admission->hold_extra(index, front->next_id.fetch_add(1));
}

std::int64_t Engine::Impl::kv_used_blocks() const {
  const std::optional<KvBlockCounts> counts = model.kv_pool_counts();
  return counts ? counts->used : 0;
}

void Engine::Impl::charge_blocks(Sequence& s, std::int64_t before) {
  if (!on_demand()) return;
  s.kv_blocks += kv_used_blocks() - before;
  // Forced: the blocks are in use already, inside the pool (and so the budget).
  s.lease.resize(std::max<std::int64_t>(0, s.kv_blocks) * options.kv_pool->geometry.block_bytes, /*force=*/true);
}

std::optional<Error> Engine::Impl::open_pooled(Sequence& s) {
  const KvBlockGeometry& g = options.kv_pool->geometry;
  const int context = static_cast<int>(s.context.size());
  const auto worst = static_cast<int>(cached_positions(s.req->prompt_tokens(), s.req->gen.max_tokens));
  int capacity = worst;
  if (on_demand()) {
    // What the lease paid for, at least room for the context.
    const std::int64_t paid = g.block_bytes > 0 ? s.lease.bytes() / g.block_bytes * g.block_tokens : worst;
    capacity = static_cast<int>(std::min<std::int64_t>(worst, std::max<std::int64_t>(context, paid)));
  }
  const std::int64_t before = kv_used_blocks();
  // Prompt logprobs need every prompt token's logits, and a follower gets
  // its leader's blocks (copy_cache): neither starts from the prefix cache.
  const bool own_prefill = !s.wants_prompt_logprobs() && !s.awaiting_fork();
  auto cache = own_prefill ? model.new_cache_for_prompt(capacity, s.context) : model.new_cache(capacity);
  if (!cache.ok()) return std::move(cache).error();
  s.cache = std::move(cache).value();
  s.prefilled = s.cache->length();
  charge_blocks(s, before);
  std::lock_guard lk(shared->mu);
  KvPoolStats& k = shared->stats.kv_pool;
  k.prompt_tokens += context;
  k.prefix_hit_tokens += s.prefilled;
  if (s.generated() > 0) k.recomputed_tokens += context - s.prefilled;
  return std::nullopt;
}

void Engine::Impl::release_kv(Sequence& s) {
  if (!on_demand() || !s.cache) {
    s.cache.reset();
    s.lease.release();
    return;
  }
  const std::int64_t before = kv_used_blocks();
  s.cache.reset();
  const std::int64_t freed = before - kv_used_blocks();
  // Blocks it paid for that others still read (negative: it freed blocks
  // whose payer had ended) are paid by kv_orphans from now on.
  const std::int64_t orphaned = s.kv_blocks - freed;
  if (orphaned != 0 && kv_orphans) {
    const std::int64_t bytes = kv_orphans->bytes() + orphaned * options.kv_pool->geometry.block_bytes;
    kv_orphans->resize(std::max<std::int64_t>(0, bytes), /*force=*/true);
  }
  s.kv_blocks = 0;
  s.lease.release();
}

void Engine::Impl::grow_for_step(TimePoint now) {
  const KvBlockGeometry& g = options.kv_pool->geometry;
  for (auto& owned : running) {
    Sequence& s = *owned;
    while (!s.done && !s.prefilling() && s.cache->length() >= s.cache->capacity()) {
      const std::int64_t before = kv_used_blocks();
      if (s.lease.resize(s.lease.bytes() + g.block_bytes)) {
        // One block more, asked only up to the context (a last block may end past it).
        const int grown = std::min(s.cache->capacity() + g.block_tokens, model.config().n_positions);
        const Status st = model.grow_cache(*s.cache, grown);
        if (st.ok()) {
          charge_blocks(s, before);
          break;
        }
        s.lease.resize(s.lease.bytes() - g.block_bytes);
        if (st.error().code != ErrorCode::kOutOfMemory) {
          fail(s, st.error());
          break;
        }
      }
      // No block in the budget (or, rarely, in the pool): the first in
      // preemption order makes room, which may be `s` itself.
      const std::vector<Sequence*> order = preemption_order();
      if (order.empty()) break;
      {
        std::lock_guard lk(shared->mu);
        ++shared->stats.kv_pool.growth_preemptions;
      }
      preempt_or_refuse(*order.front(), now, "the KV cache blocks of the device are all in use");
    }
  }
}

bool Engine::Impl::fit_kv_pool(TimePoint now) {
  const std::optional<KvBlockCounts> counts = model.kv_pool_counts();
  const std::int64_t block_bytes = options.kv_pool->geometry.block_bytes;
  if (!counts || block_bytes <= 0) return true;
  const std::int64_t to = kv_pool_target(
      KvPoolFitInputs{*counts, kv_pool_max_blocks, oom_budget->effective() / block_bytes, now < kv_pool_grow_after});
  if (to == counts->total && !counts->lost) return true;
  const Status st = model.resize_kv_pool(to);
  if (!st.ok()) {
    spdlog::warn("{}: the KV block pool stays at {} blocks (resizing to {} failed: {})", device.name(), counts->total,
                 to, st.error().message);
    const std::optional<KvBlockCounts> after = model.kv_pool_counts();
    if (!after || !after->lost) {
      kv_pool_grow_after = now + kPoolGrowRetry;  // its blocks as they were: tried again in a while
      return true;
    }
    // The storage is lost: every sequence starts again from its tokens,
    // and the turn after a short wait allocates a new one.
    for (Sequence* s : preemption_order()) preempt_or_refuse(*s, now, "the KV cache pool lost its storage");
    kv_pool_lost_retry = now + kPoolLostRetry;
    return false;
  }
  kv_pool_lost_retry.reset();
  if (to < counts->total) device.release_cached_memory();
  spdlog::info("{}: KV block pool resized from {} to {} blocks ({} bytes each) for an effective budget of {} bytes",
               device.name(), counts->total, to, block_bytes, oom_budget->effective());
  admission->set_effective_budget(to * block_bytes, device_index, kPoolSource + index);
  return true;
}

void Engine::Impl::publish_kv_pool(EngineStats& stats) const {
  if (!pooled()) return;
  const std::optional<KvBlockCounts> counts = model.kv_pool_counts();
  if (!counts) return;
  stats.kv_pool.reservation = options.kv_pool->reservation;
  stats.kv_pool.block_tokens = options.kv_pool->geometry.block_tokens;
  stats.kv_pool.blocks_total = counts->total;
  stats.kv_pool.blocks_used = counts->used;
  stats.kv_pool.blocks_cached = counts->cached;
  stats.kv_pool.block_bytes = options.kv_pool->geometry.block_bytes;
  stats.kv_pool.blocks_evicted = model.kv_blocks_evicted();
}

}  // namespace vg
