// The batch size `--max-batch 0` (the default) chooses at start-up for a
// device whose KV cache is a block pool (docs/admission-and-memory.md
// "Choosing --max-batch"). With blocks, sequences take memory as they grow,
// so the pool, not a fixed batch, should bound how many run; the batch is
// kept only from taking the pool's memory for its activations. Pure; any
// thread.
#pragma once

#include <cstdint>
#include <span>

#include "admission/memory_profile.hpp"

namespace vg {

/// The batch without a block pool (worst-case reservations bind first
/// there), and the smallest batch the rule below chooses.
inline constexpr int kDefaultMaxBatch = 8;
/// The largest batch it chooses (as vLLM's default of 256 sequences).
inline constexpr int kLargestMaxBatch = 256;

/// The largest of 256, 128, ..., kDefaultMaxBatch that is at most
/// `max_batch_tokens` (a decode step holds a token per sequence) and whose
/// step workspaces exceed those at kDefaultMaxBatch sequences by at most an
/// eighth of `budget_bytes`, the device's budget (bytes) with the workspaces
/// at kDefaultMaxBatch: a larger batch never takes more than an eighth of
/// the KV blocks it would schedule. `profiles`: the device's models (their
/// workspaces add up; a profile without batch scaling never grows).
/// kDefaultMaxBatch when max_batch_tokens < kDefaultMaxBatch.
int choose_max_batch(std::span<const MemoryProfile> profiles, std::int64_t budget_bytes, int max_batch_tokens);

}  // namespace vg
