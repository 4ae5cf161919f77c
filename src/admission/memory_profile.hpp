// Memory arithmetic of admission: the memory profile of a model on a device,
// the cost of one request and the budget of a device (docs/design.md, "Terms").
// Pure functions on int64 bytes, saturating instead of overflowing; any thread.
#pragma once

#include <cstdint>
#include <string>

#include "common/decimal.hpp"  // format_bytes
#include "common/error.hpp"

namespace vg {

/// Measured at start-up, per model and device (docs/design.md "memory profile").
struct MemoryProfile {
  std::int64_t resident_bytes = 0;           ///< weights, buffers, runtime context (held for the model's life)
  std::int64_t workspace_bytes = 0;          ///< activations of the largest step (set aside once, not per request)
  std::int64_t kv_bytes_per_token = 0;       ///< KV cache bytes per token of one sequence
  std::int64_t sequence_overhead_bytes = 0;  ///< fixed bytes per sequence (cache headers, sampler state)
  double safety_factor = 1.0;                ///< multiplier >= 1 on the per-request cost (applied at 1e-6 resolution)
  /// Measured seconds of one decode step of a full batch (max_batch
  /// sequences) at full context; 0 = not measured. Retry-After promises use
  /// it before the first completion is measured.
  double step_seconds = 0;

  /// How the workspace and the decode step grow with the batch, measured
  /// before the safety factor (the profiler's decode runs at 1 and 2
  /// sequences); all 0 when not measured (then at_batch changes nothing).
  struct BatchScaling {
    std::int64_t prefill_workspace_bytes = 0;       ///< the largest prefill chunk's step
    std::int64_t decode_workspace_bytes = 0;        ///< a decode step of 1 sequence at full context
    std::int64_t workspace_per_sequence_bytes = 0;  ///< each further sequence of a decode step
    double decode_step_seconds = 0;                 ///< a decode step of 1 sequence at full context
    double step_seconds_per_sequence = 0;           ///< each further sequence
    /// Decode steps pad their batch to the next power of two (the static
    /// shapes of Model::decode_step on the tensor path): a batch costs the
    /// workspace and time of its padded rows.
    bool pads_to_power_of_two = false;
  };
  BatchScaling batch;
};

/// `profile` with workspace_bytes and step_seconds of a batch of `batch`
/// sequences (>= 1), extrapolated linearly from profile.batch over the rows
/// a step computes (rows = batch, or its next power of two where
/// pads_to_power_of_two):
///   workspace = max(prefill, decode + per_sequence × (rows − 1)) × safety_factor
///   step      = decode_step + per_sequence_step × (rows − 1)
/// Unchanged when profile.batch was not measured.
MemoryProfile at_batch(const MemoryProfile& profile, int batch);

/// Ok when every byte count is >= 0 and 1 <= safety_factor <= 16; else kConfig
/// with a message naming the field.
Status validate(const MemoryProfile& profile);

/// Bytes one request may hold at its peak (docs/design.md "cost"):
///   cost = ceil(((prompt_tokens + max_tokens) × kv_bytes_per_token + sequence_overhead_bytes) × safety_factor)
/// Negative token counts count as 0. Saturates at INT64_MAX (such a request
/// never fits). The safety factor is rounded to millionths and applied in
/// integer arithmetic, so e.g. 1000 bytes × 1.1 is exactly 1100.
std::int64_t request_cost(const MemoryProfile& profile, std::int64_t prompt_tokens, std::int64_t max_tokens);

/// What a device's budget is worked out from (bytes; `utilization` a share).
struct DeviceBudgetInputs {
  std::int64_t capacity_bytes = 0;   ///< the device's total memory
  double utilization = 1.0;          ///< share of capacity vramgate may use (--memory-utilization)
  std::int64_t foreign_bytes = 0;    ///< held by others now (DeviceMemory::foreign)
  std::int64_t resident_bytes = 0;   ///< the models' weights and buffers (sum over the models on it)
  std::int64_t workspace_bytes = 0;  ///< their step workspaces (sum)
  std::int64_t reserve_bytes = 0;    ///< --memory-reserve
};

/// Bytes admission may hand to requests on one device (design notes, "budget"):
///   usable = min(floor(capacity × utilization), capacity − foreign)
///   budget = usable − resident − workspace − reserve, clamped to >= 0.
/// So the budget never counts memory another process holds: it is at most
/// what is free plus what the models hold. `foreign` is first rounded up to
/// a multiple of capacity / 4096 (kForeignGrain), so that others' small
/// changes do not move the budget at every measurement. `utilization` is
/// clamped to [0, 1] and rounded to millionths; negative byte inputs count
/// as 0.
std::int64_t device_budget(const DeviceBudgetInputs& in);

/// The grain foreign bytes are rounded up to: capacity / kForeignGrain.
inline constexpr std::int64_t kForeignGrain = 4096;

}  // namespace vg
