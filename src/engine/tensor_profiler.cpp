// measure_tensor_profile() (see tensor_profiler.hpp).
#include "engine/tensor_profiler.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>

#include "admission/memory_profile.hpp"
#include "common/decimal.hpp"
#include "device/device.hpp"
#include "engine/tensor_batch.hpp"
#include "model/torchscript_model.hpp"

namespace vg {

std::vector<std::vector<std::int64_t>> profile_shapes(const TensorModelSpec& spec, double fraction,
                                                      std::int64_t batch) {
  std::vector<std::pair<std::string, std::int64_t>> bound;
  for (const DimRange& d : spec.dims) {
    if (d.name == "batch") {
      bound.emplace_back(d.name, std::clamp<std::int64_t>(batch, d.min, d.max));
    } else {
      const double v = static_cast<double>(d.min) + fraction * static_cast<double>(d.max - d.min);
      bound.emplace_back(d.name, std::clamp<std::int64_t>(std::llround(v), d.min, d.max));
    }
  }
  std::vector<std::vector<std::int64_t>> out;
  for (const TensorSpec& t : spec.inputs) out.push_back(bind_shape(spec, t, bound));
  return out;
}

Result<TensorMemoryProfile> measure_tensor_profile(TorchScriptModel& model, Device& device,
                                                   const TensorProfileOptions& options) {
  TensorMemoryProfile p;
  p.safety_factor = options.safety_factor;
  const TensorModelSpec& spec = model.spec();
  const std::int64_t top_batch = std::min<std::int64_t>({4, spec.max_batch(), std::max(1, options.max_batch)});
  struct Run {
    double fraction;
    std::int64_t batch;
    bool held_out;
  };
  // Fitted: sizes spread over the whole range, batch 1 and the largest
  // profiled batch; held out: sizes and batches between them.
  std::vector<Run> runs = {{0.0, 1, false},  {0.25, 1, false}, {0.5, 1, false},        {1.0, 1, false},
                           {0.5, top_batch, false}, {0.375, 1, true}, {0.75, 1, true}};
  if (top_batch >= 2) runs.push_back({0.3, std::max<std::int64_t>(2, top_batch - 1), true});
  for (const Run& run : runs) {
    const auto shapes = profile_shapes(spec, run.fraction, run.batch);
    device.reset_peak();
    const std::int64_t base = device.memory().allocated;
    Status st = model.forward_zeros(shapes);
    if (!st.ok()) {
      if (st.error().code == ErrorCode::kOutOfMemory) {
        spdlog::info("profile run at {} does not fit on {}: left out", shape_text(shapes.front()), device.name());
        continue;
      }
      return st.error();
    }
    PeakSample s;
    s.shape = shapes.front();
    s.elements = total_elements(shapes);
    s.peak_bytes = std::max<std::int64_t>(0, device.memory().peak_allocated - base);
    s.held_out = run.held_out;
    p.samples.push_back(std::move(s));
  }
  int fitted = 0;
  std::int64_t first = -1;
  bool distinct = false;
  for (const PeakSample& s : p.samples) {
    if (s.held_out) continue;
    ++fitted;
    if (first < 0) first = s.elements;
    if (s.elements != first) distinct = true;
  }
  if (fitted < 2 || !distinct) {
    return Error(ErrorCode::kConfig, "fewer than two input sizes could be profiled on " + device.name() +
                                         ": give the device more capacity");
  }
  fit_peak(p);
  spdlog::info("memory profile on {}: {} ({} runs); held-out runs: prediction {}% to {}% of the measured peak",
               device.name(), fit_text(p), p.samples.size(),
               format_decimal(std::round((1 + p.held_out_min_error) * 1000) / 10),
               format_decimal(std::round((1 + p.held_out_max_error) * 1000) / 10));
  if (p.held_out_min_error < 0 || p.held_out_max_error > 0.25) {
    spdlog::warn("memory profile on {}: the line does not describe this model well (held-out runs {}% to {}% of the "
                 "prediction's value): raise --memory-safety, or expect out-of-memory recovery to split batches",
                 device.name(), format_decimal(std::round((1 + p.held_out_min_error) * 1000) / 10),
                 format_decimal(std::round((1 + p.held_out_max_error) * 1000) / 10));
  }
  for (const PeakSample& s : p.samples) {
    spdlog::debug("  {} {} elements: peak {} measured, {} predicted{}", shape_text(s.shape), s.elements,
                  format_bytes(s.peak_bytes), format_bytes(predicted_peak(p, s.elements)),
                  s.held_out ? " (held out)" : "");
  }
  return p;
}

}  // namespace vg
