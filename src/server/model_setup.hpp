// Start-up of one model on its device, shared by `vramgate serve` and
// `vramgate plan`: create the device from the config, load the model onto
// it, measure its memory profile (the profile runs double as warm-up), and
// work out the device budget. Main thread, before any engine starts.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include "admission/memory_profile.hpp"
#include "common/error.hpp"
#include "config/config.hpp"

namespace vg {

class Model;
class Device;

/// A model loaded and profiled on its own device.
struct ProfiledModel {
  std::unique_ptr<Device> device;
  std::unique_ptr<Model> model;  ///< destroy before `device` (its weights live there)
  std::string id;                ///< the model folder's name, as /v1/models shows it
  MemoryProfile profile;
  std::int64_t reserve_bytes = 0;  ///< --memory-reserve
  /// device_budget(capacity, utilization, resident, workspace, reserve)
  std::int64_t budget_bytes = 0;
};

/// Errors: kConfig (bad device, the profile runs do not fit), kModelLoad.
Result<ProfiledModel> load_profiled_model(const ServeConfig& config);

/// "models/tinylm/" -> "tinylm".
std::string model_id_for(const std::filesystem::path& dir);

}  // namespace vg
