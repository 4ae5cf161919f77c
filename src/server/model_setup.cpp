#include "server/model_setup.hpp"

#include "device/device.hpp"
#include "engine/memory_profiler.hpp"
#include "model/model.hpp"

namespace vg {

std::string model_id_for(const std::filesystem::path& dir) {
  auto p = dir.lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  return p.filename().string();
}

Result<ProfiledModel> load_profiled_model(const ServeConfig& config) {
  ProfiledModel out;
  auto spec = parse_device_spec(config.device);
  if (!spec.ok()) return Error(ErrorCode::kConfig, "--device: " + spec.error().message);
  auto device = create_device(spec->kind, spec->index, spec->capacity);
  if (!device.ok()) return std::move(device).error();
  out.device = std::move(device).value();
  {
    DeviceScope scope(out.device.get());
    auto model = Model::load(Model::Options{config.model_dir, out.device.get(), config.dtype});
    if (!model.ok()) return std::move(model).error();
    out.model = std::move(model).value();
    auto profile = measure_memory_profile(*out.model, *out.device,
                                          ProfileOptions{config.max_batch, config.max_batch_tokens,
                                                         config.memory_safety});
    if (!profile.ok()) {
      return Error(ErrorCode::kConfig, "memory profile of '" + config.model_dir + "' on " + out.device->name() +
                                           " failed: " + profile.error().message);
    }
    out.profile = *profile;
  }
  out.id = model_id_for(config.model_dir);
  out.reserve_bytes = config.memory_reserve == "0" ? 0 : *parse_bytes(config.memory_reserve);
  out.budget_bytes = device_budget(out.device->memory().capacity, config.memory_utilization,
                                   out.profile.resident_bytes, out.profile.workspace_bytes, out.reserve_bytes);
  return out;
}

}  // namespace vg
