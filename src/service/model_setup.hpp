// Start-up of the models on their devices, shared by `vramgate serve` and
// `vramgate plan`: find the model folders of --model-dir, create each
// device from the config, load every model onto it, measure each model's
// memory profile there (the profile runs double as warm-up), and work out
// the device's budget. Main thread, before any engine starts.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "admission/batch_size.hpp"
#include "admission/kv_reservation.hpp"
#include "admission/memory_profile.hpp"
#include "admission/tensor_cost.hpp"
#include "common/error.hpp"
#include "config/config.hpp"

namespace vg {

class Model;
class Device;
class TorchScriptModel;

/// One model folder of --model-dir.
struct ModelSource {
  std::string id;  ///< the folder's name, as /v1/models shows it
  std::filesystem::path dir;
  bool torchscript = false;  ///< config.json says "model_type": "torchscript" (a TorchScriptModel)
};

/// The model folders of config.model_dir: the folder itself when it holds a
/// config.json, else each sub-folder that does, sorted by name. When there is
/// none, the folder itself, so that loading it says what is wrong (missing
/// folder, no config.json, ...). Never empty.
std::vector<ModelSource> find_model_sources(const ServeConfig& config);

/// One device with every model loaded and profiled on it.
struct DeviceSetup {
  std::unique_ptr<Device> device;
  /// One per ModelSource, in the same order; destroyed before `device`
  /// (their weights live there). Null for a TorchScript source.
  std::vector<std::unique_ptr<Model>> models;
  /// One per ModelSource: the TorchScript model, null for a language model.
  std::vector<std::unique_ptr<TorchScriptModel>> tensor_models;
  /// Each model's profile on this device; resident_bytes are that model's
  /// own (the device's used bytes after its load minus before). For a
  /// TorchScript source only resident_bytes is set; see tensor_profiles.
  std::vector<MemoryProfile> profiles;
  /// One per ModelSource: the peak-memory fit of a TorchScript model (empty
  /// samples for a language model).
  std::vector<TensorMemoryProfile> tensor_profiles;
  std::int64_t resident_bytes = 0;   ///< sum over the models
  std::int64_t workspace_bytes = 0;  ///< sum over the models (their engines step concurrently)
  std::int64_t reserve_bytes = 0;    ///< --memory-reserve
  /// What the budget was worked out from once every model was profiled: the
  /// device's capacity and its foreign bytes then (other processes; on CUDA
  /// also this process's context), the sums above, the settings.
  DeviceBudgetInputs budget_inputs;
  /// device_budget(budget_inputs): at most what was free plus what the models hold.
  std::int64_t budget_bytes = 0;
  /// The block pool of the device's one language model (models[0]), as
  /// many blocks as the budget holds, when the policy is memory, there is no
  /// prefill worker and no other model shares the device; nullopt: its KV
  /// caches are allocated per sequence.
  std::optional<KvBlockGeometry> kv_pool;
  /// Sequences its engines run at once: --max-batch, or for 0 the batch
  /// choose_max_batch allows where the device has a block pool (profiles,
  /// workspace_bytes and budget_bytes are then those of that batch), else kDefaultMaxBatch.
  int max_batch = kDefaultMaxBatch;
};

/// Creates device `spec` and loads and profiles `models` on it. Errors:
/// kConfig (bad device, the profile runs do not fit, the budget cannot hold
/// a 2-token request of some language model, or a forward pass at the
/// smallest shapes of some TorchScript model, under a limiting policy),
/// kModelLoad.
Result<DeviceSetup> load_device(const ServeConfig& config, const DeviceSpec& spec, std::span<const ModelSource> models);

/// A model loaded and profiled on its own device (`vramgate plan`).
struct ProfiledModel {
  std::unique_ptr<Device> device;
  std::unique_ptr<Model> model;  ///< destroy before `device` (its weights live there); null for TorchScript
  std::unique_ptr<TorchScriptModel> tensor_model;  ///< a TorchScript model (then `model` is null)
  TensorMemoryProfile tensor_profile;              ///< its peak-memory fit
  std::string id;
  MemoryProfile profile;
  std::int64_t reserve_bytes = 0;
  std::int64_t budget_bytes = 0;
  int max_batch = kDefaultMaxBatch;  ///< DeviceSetup::max_batch
};

/// The first model of --model-dir on the first --device. Errors as load_device().
Result<ProfiledModel> load_profiled_model(const ServeConfig& config);

/// "models/tinylm/" -> "tinylm".
std::string model_id_for(const std::filesystem::path& dir);

}  // namespace vg
