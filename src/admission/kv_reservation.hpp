// What a request reserves in a paged KV cache (docs/admission-and-memory.md,
// "KV blocks"): whole blocks of a pool allocated once at start-up, so a
// lease is blocks x bytes per block, exactly. Two policies:
//   - full: every sequence reserves the blocks of its worst case
//     (prompt + max_tokens) when it starts; it never grows, and only an
//     out-of-memory error or other processes taking memory preempt it;
//   - on-demand: a sequence reserves the blocks of its prompt plus a growth
//     reserve, the tokens it is expected to generate (OutputLengthEstimate),
//     and takes one more block each time it crosses a block boundary; when
//     the budget has none, sequences are preempted (preemption order) and
//     recomputed later.
// Pure functions and one small thread-safe estimator; torch-free.
#pragma once

#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <string_view>

namespace vg {

enum class KvReservation {
  kFull,      ///< the worst case, up front
  kOnDemand,  ///< prompt + expected output; blocks as the sequence grows
};
/// "full" or "on-demand".
const char* kv_reservation_name(KvReservation reservation);
/// The policy named `name` ("full", "on-demand"); nullopt otherwise.
std::optional<KvReservation> parse_kv_reservation(std::string_view name);

/// The block geometry of one model's pool on one device.
struct KvBlockGeometry {
  int block_tokens = 16;         ///< positions per block (>= 1)
  std::int64_t block_bytes = 0;  ///< device bytes of one block, every layer's K and V (>= 0)
};

/// Blocks that hold `tokens` positions: ceil(tokens / block_tokens); 0 for
/// tokens <= 0.
std::int64_t kv_blocks_for(const KvBlockGeometry& geometry, std::int64_t tokens);
/// Their bytes: kv_blocks_for(tokens) x block_bytes (saturating).
std::int64_t kv_blocks_bytes(const KvBlockGeometry& geometry, std::int64_t tokens);

/// The tokens a new sequence is expected to generate, learned from the
/// sequences this engine completed: the 95th percentile of the last
/// kWindow completions' generated tokens, at least one token; a request's
/// own max_tokens until kMinSamples have completed, and whenever it is
/// smaller. A wrong guess costs a preemption, not memory: a sequence that
/// outgrows it takes more blocks as it goes. Thread-safe (any thread asks;
/// the engine thread records).
class OutputLengthEstimate {
 public:
  static constexpr std::size_t kWindow = 64;
  static constexpr std::size_t kMinSamples = 8;

  /// A sequence completed (stop, end of text or max_tokens) with `tokens` generated.
  void record(int tokens);
  /// Tokens to reserve for a sequence that may generate up to `max_tokens` more.
  int reserve_tokens(int max_tokens) const;
  /// Completions recorded so far (capped at kWindow).
  std::size_t samples() const;

 private:
  mutable std::mutex mu_;
  std::deque<int> recent_;  // guarded by mu_: newest last
  int p95_ = 0;             // guarded by mu_: of recent_, updated by record()
};

}  // namespace vg
