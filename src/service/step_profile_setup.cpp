// make_step_profile (see step_profile_setup.hpp).
#include "service/step_profile_setup.hpp"

#include <spdlog/spdlog.h>

#include <filesystem>
#include <system_error>

#include "device/device.hpp"
#include "model/torch_step_profiler.hpp"

namespace vg {

Result<StepProfileOptions> make_step_profile(const ServeConfig& config, const Device& device) {
  StepProfileOptions o;
  if (config.profile_steps == 0) return o;
  const std::filesystem::path trace = std::filesystem::absolute(config.profile_trace);
  std::error_code ec;
  if (!std::filesystem::is_directory(trace.parent_path(), ec)) {
    return Error(ErrorCode::kConfig, "--profile-trace: folder " + trace.parent_path().string() + " does not exist");
  }
  auto spec = parse_device_spec(device.name());
  const DeviceKind kind = spec.ok() && spec->kind == DeviceKind::kCuda ? DeviceKind::kCuda : DeviceKind::kVirtual;
  const TraceSource source = available_trace_source();
  o.steps = config.profile_steps;
  o.min_batch = config.profile_min_batch;
  o.trace = trace;
  o.profiler = make_torch_step_profiler(source, kind);
  spdlog::info("profile: recording {} decode steps of batch >= {} on {} ({}), trace to {}", o.steps, o.min_batch,
               device.name(), source == TraceSource::kKineto ? "Kineto: ops and kernels" : "host ops, no Kineto",
               trace.string());
  return o;
}

}  // namespace vg
