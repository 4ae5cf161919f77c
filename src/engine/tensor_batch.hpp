// Batch selection for tensor models (TorchScript): which granted requests
// share one forward pass, the pass's input shapes (paddable dimensions
// zero-padded to the batch's largest) and its cost. Pure functions of the
// requests' shapes and the memory profile; any thread. Used by the tensor
// engine's thread (tensor_engine.cpp).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "admission/tensor_cost.hpp"
#include "model/tensor_spec.hpp"

namespace vg {

/// A granted request as batch selection sees it.
struct BatchCandidate {
  /// Its inputs' shapes, in the declared order ([rows, ...] when batched).
  std::vector<std::vector<std::int64_t>> shapes;
  std::int64_t held_bytes = 0;  ///< its lease
};

struct BatchLimits {
  int max_requests = 1;       ///< --max-batch (1 for a model without a batch dimension)
  std::int64_t max_rows = 1;  ///< the batch dimension's max
  /// Bytes the pass may take beyond its requests' leases (the device's free
  /// budget now); nullopt: no byte check (policies fixed and none).
  std::optional<std::int64_t> extra_bytes;
};

struct BatchPlan {
  std::vector<std::size_t> members;  ///< indices into the candidates, ascending; empty for no candidates
  /// The forward pass's input shapes: rows summed along the batch dimension,
  /// each paddable dimension at its largest among the members.
  std::vector<std::vector<std::int64_t>> shapes;
  std::int64_t cost_bytes = 0;  ///< tensor_cost over `shapes`' elements (padding included)
  std::int64_t held_bytes = 0;  ///< the members' leases together
  /// True when max_requests or max_rows stopped it: waiting for more
  /// requests cannot make it larger.
  bool full = false;
};

/// The requests that batch with the first candidate: its non-batch
/// dimensions equal except the paddable ones (batch_key()). Each candidate in
/// order joins while the batch stays within max_requests and max_rows and its
/// padded cost stays within the members' leases + extra_bytes (a candidate
/// that would pass it is skipped, and a later, smaller one may still join).
/// The first candidate always runs, alone if need be (its lease is its own
/// cost). With equal shapes the cost never passes the leases (the fit's fixed
/// bytes are counted once, not per request), so only padding uses extra bytes.
BatchPlan plan_batch(const TensorModelSpec& spec, const TensorMemoryProfile& profile,
                     std::span<const BatchCandidate> candidates, const BatchLimits& limits);

/// What must be equal for two requests to share a pass: each input's rank
/// and its non-batch dimensions, the paddable ones as -1.
std::vector<std::int64_t> batch_key(const TensorModelSpec& spec, std::span<const std::vector<std::int64_t>> shapes);

/// The pass's shapes for requests of one batch_key (see BatchPlan::shapes).
std::vector<std::vector<std::int64_t>> batch_shapes(const TensorModelSpec& spec,
                                                    std::span<const std::vector<std::vector<std::int64_t>>* const> requests);

/// Elements over every input of `shapes`.
std::int64_t total_elements(std::span<const std::vector<std::int64_t>> shapes);

}  // namespace vg
