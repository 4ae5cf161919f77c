// Memory arithmetic of tensor models (TorchScript): the peak device bytes of
// a forward pass as a function of its input size, fitted from profile runs,
// and the cost of a request or a batch from it. Pure functions; any thread.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace vg {

/// One profile run: a forward pass over `elements` input elements (summed
/// over the inputs, batch included) whose activations peaked at
/// `peak_bytes` above the device's allocated bytes before it.
struct PeakSample {
  std::vector<std::int64_t> shape;  ///< the first input's shape (for the log and /v2 metadata)
  std::int64_t elements = 0;
  std::int64_t peak_bytes = 0;
  bool held_out = false;  ///< not used by the fit; checks it
  std::int64_t predicted_bytes = 0;  ///< the fit's peak for `elements` (set by fit_peak)
};

/// peak(elements) = fixed_bytes + bytes_per_element × elements, the fit of
/// the samples that are not held out, raised so that none of them lies above it.
struct TensorMemoryProfile {
  std::int64_t resident_bytes = 0;  ///< the module's parameters and buffers on the device
  std::int64_t fixed_bytes = 0;     ///< intercept (bytes, >= 0)
  double bytes_per_element = 0;     ///< slope (bytes per input element, >= 0)
  double safety_factor = 1.0;       ///< --memory-safety (>= 1)
  /// Largest relative error of the fit on the held-out samples:
  /// (predicted − measured) / measured; negative when a sample lies above the
  /// prediction.
  double held_out_max_error = 0;
  double held_out_min_error = 0;
  std::vector<PeakSample> samples;
};

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
