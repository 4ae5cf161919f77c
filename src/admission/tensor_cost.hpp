// Memory arithmetic of tensor models (TorchScript): the peak device bytes of
// a forward pass as a function of its input size, fitted from profile runs,
// and the cost of a request or a batch from it (the profile itself:
// TensorMemoryProfile, api/tensor.hpp). Pure functions; any thread.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "api/tensor.hpp"

namespace vg {

/// Least-squares line through the samples that are not held out (at least two
/// distinct sizes), raised by the largest residual so that it bounds them,
/// both terms clamped to >= 0; then each sample's predicted_bytes and the
/// held-out errors. `profile`'s
/// resident_bytes and safety_factor are kept.
void fit_peak(TensorMemoryProfile& profile);

/// The fit's peak for `elements`, bytes (ceil, saturating).
std::int64_t predicted_peak(const TensorMemoryProfile& profile, std::int64_t elements);

/// The cost of a forward pass over `elements`: predicted_peak × safety_factor
/// (ceil, saturating at INT64_MAX).
std::int64_t tensor_cost(const TensorMemoryProfile& profile, std::int64_t elements);

/// How many requests of `elements` each one forward pass may batch within
/// `free_bytes`: the largest n <= max_batch with tensor_cost(n × elements) <=
/// free_bytes (0 when not even one fits).
int batch_that_fits(const TensorMemoryProfile& profile, std::int64_t elements, std::int64_t free_bytes,
                    int max_batch);

/// "peak = 12.0 KiB + 148.2 B x elements" (the log line and `vramgate plan`).
std::string fit_text(const TensorMemoryProfile& profile);

}  // namespace vg
