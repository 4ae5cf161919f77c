#include "service/model_setup.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <optional>

#include "admission/admission_policy.hpp"
#include "admission/batch_size.hpp"
#include "common/decimal.hpp"
#include "device/device.hpp"
#include "device/foreign_bytes_hook.hpp"
#include "engine/memory_profiler.hpp"
#include "engine/tensor_profiler.hpp"
#include "model/model.hpp"
#include "model/model_dirs.hpp"
#include "model/torchscript_model.hpp"

namespace vg {

std::string model_id_for(const std::filesystem::path& dir) {
  auto p = dir.lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  return p.filename().string();
}

std::vector<ModelSource> find_model_sources(const ServeConfig& config) {
  std::vector<ModelSource> out;
  for (const auto& dir : find_model_dirs(config.model_dir)) {
    out.push_back(ModelSource{model_id_for(dir), dir, is_torchscript_model_dir(dir)});
  }
  if (out.empty()) {
    // Let the loader say what is wrong with the folder (missing, no config.json, ...).
    out.push_back(ModelSource{model_id_for(config.model_dir), config.model_dir, false});
  }
  return out;
}

namespace {
// Where the device's memory went, for a start-up refusal: what others hold
// binds, or the models' own bytes do.
std::string budget_shortfall(const DeviceSetup& setup) {
  const DeviceBudgetInputs& in = setup.budget_inputs;
  return format_bytes(in.capacity_bytes) + " capacity, " + format_bytes(in.foreign_bytes) +
         " held by other processes (free at start: " + format_bytes(in.capacity_bytes - in.foreign_bytes) +
         " with the models' own " + format_bytes(in.resident_bytes) + " resident and " +
         format_bytes(in.workspace_bytes) + " workspace), utilization " + format_decimal(in.utilization) + ", " +
         format_bytes(in.reserve_bytes) + " reserve";
}

// For a start-up failure on a shared device: what others hold.
std::string held_by_others(const Device& device) {
  const DeviceMemory m = device.memory();
  if (m.foreign <= 0) return {};
  return "; other processes hold " + format_bytes(m.foreign) + " of its " + format_bytes(m.capacity) +
         " (this process holds " + format_bytes(m.own) + ", " + format_bytes(m.capacity - m.used) + " free)";
}

// A model that could not load: weights that do not fit mean the device, as
// configured, cannot serve it (kConfig, with what others hold); any other
// failure stays the model's.
Error load_failure(Error error, const Device& device) {
  if (error.code != ErrorCode::kOutOfMemory) return error;
  return Error(ErrorCode::kConfig, error.message + held_by_others(device));
}
// The KV block pool of a device with one language model under policy
// memory and no prefill worker: as many blocks as the budget holds (the
// whole budget is KV bytes: the workspace is set aside apart). Elsewhere the
// caches stay per sequence: several models would share one budget, and the
// baselines (fixed, none) let the allocator see every cache.
bool kv_pool_wanted(const ServeConfig& config, const DeviceSetup& setup) {
  const bool alone = setup.models.size() == 1 && setup.models.front() != nullptr;
  return alone && config.kv_pool == "on" && !config.prefill_worker &&
         config.admission_policy().kind == AdmissionPolicy::Kind::kMemory;
}

// --max-batch 0 on a device that will have a KV block pool: the batch
// choose_max_batch allows, with the workspaces and the budget of that batch.
void choose_pool_batch(const ServeConfig& config, DeviceSetup& setup) {
  const int chosen = choose_max_batch(setup.profiles, setup.budget_bytes, config.max_batch_tokens);
  if (chosen != setup.max_batch) {
    setup.workspace_bytes = 0;
    for (MemoryProfile& p : setup.profiles) {
      p = at_batch(p, std::min(chosen, config.max_batch_tokens));
      setup.workspace_bytes += p.workspace_bytes;
    }
    setup.budget_inputs.workspace_bytes = setup.workspace_bytes;
    setup.budget_bytes = device_budget(setup.budget_inputs);
    setup.max_batch = chosen;
  }
  spdlog::info(
      "--max-batch 0 on {}: {} sequences, workspace {}, budget {} (a batch of up to 256 whose step "
      "workspace takes at most an eighth of the KV blocks)",
      setup.device->name(), chosen, format_bytes(setup.workspace_bytes), format_bytes(setup.budget_bytes));
}

// Decode graphs where the model gets a KV block pool on a CUDA device with
// --cuda-graphs on (or, as a test hook, emulated on the CPU's tensor path).
std::optional<DecodeGraphOptions> decode_graphs_wanted(const ServeConfig& config, const DeviceSetup& setup) {
  if (config.cuda_graphs == "off") return std::nullopt;
  if (config.test_emulate_cuda_graphs) return DecodeGraphOptions{DecodeGraphKind::kEmulated, setup.max_batch};
  const bool cuda = setup.device->torch_device().starts_with("cuda");
  if (cuda) return DecodeGraphOptions{DecodeGraphKind::kCuda, setup.max_batch};
  return std::nullopt;
}

// Says so where decode graphs were wanted but the device has no KV block
// pool for them to read.
void log_graphs_without_pool(const ServeConfig& config, const DeviceSetup& setup) {
  if (setup.kv_pool || !decode_graphs_wanted(config, setup)) return;
  spdlog::info(
      "decode graphs on {}: none (they read a KV block pool, which a device has only with --kv-pool on, "
      "--admission memory, one language model and no --prefill-worker); decode steps run eagerly",
      setup.device->name());
}

Error graphs_failed(const DeviceSetup& setup, const Error& error) {
  return Error(ErrorCode::kConfig, "recording the decode graphs on " + setup.device->name() +
                                       " failed: " + error.message + held_by_others(*setup.device) +
                                       "; start with --cuda-graphs off to run decode steps eagerly");
}

// The graphs' bytes, measured over the one-block pool (the graphs' shapes
// do not depend on the pool's size) and charged as resident bytes before
// the budget sizes the pool; the graphs are then dropped. What appeared
// outside the allocator while they were recorded (graph executables,
// kernels loaded at their first use) is measured with them alive and taken
// as foreign bytes into the budget, as the engine will measure it while
// the graphs live: the start-up budget then already holds what the engine
// sees, instead of the pool shrinking (and every graph being recorded
// again) at its first turn.
Result<std::int64_t> measure_decode_graphs(Model& model, const DecodeGraphOptions& options, DeviceSetup& setup) {
  Result<DecodeGraphStats> trial = model.record_decode_graphs(options);
  if (!trial.ok()) return graphs_failed(setup, trial.error());
  const std::int64_t foreign = setup.device->memory().foreign;
  model.drop_decode_graphs();
  setup.resident_bytes += trial->bytes;
  setup.budget_inputs.resident_bytes = setup.resident_bytes;
  const std::int64_t before = setup.budget_inputs.foreign_bytes;
  setup.budget_inputs.foreign_bytes = foreign;
  setup.budget_bytes = device_budget(setup.budget_inputs);
  spdlog::info(
      "decode graphs on {}: {} from the allocator (charged as resident), {} outside it; foreign bytes "
      "{} before they were recorded, {} with them (the budget's, now {})",
      setup.device->name(), format_bytes(trial->bytes), format_bytes(trial->outside_bytes), format_bytes(before),
      format_bytes(foreign), format_bytes(setup.budget_bytes));
  return trial->bytes;
}

// Records the graphs over the pool now allocated; they keep the bytes the
// measure charged (a larger count is logged: the budget does not move).
Status record_decode_graphs(Model& model, const DecodeGraphOptions& options, std::int64_t charged,
                            const DeviceSetup& setup) {
  Result<DecodeGraphStats> recorded = model.record_decode_graphs(options);
  if (!recorded.ok()) return graphs_failed(setup, recorded.error());
  spdlog::info("decode graphs on {} ({}): {} graphs for batches up to {}, {} (charged {})", setup.device->name(),
               options.kind == DecodeGraphKind::kCuda ? "CUDA" : "emulated", recorded->graphs, options.max_batch,
               format_bytes(recorded->bytes), format_bytes(charged));
  if (recorded->bytes > charged) {
    spdlog::warn("decode graphs on {} hold {}, more than the {} charged to the budget", setup.device->name(),
                 format_bytes(recorded->bytes), format_bytes(charged));
  }
  return Status::Ok();
}

Status make_kv_pool(const ServeConfig& config, DeviceSetup& setup) {
  if (!kv_pool_wanted(config, setup)) return Status::Ok();
  Model& model = *setup.models.front();
  const bool prefix = config.prefix_cache == "on";
  // One block first, to learn a block's bytes.
  if (Status st = model.use_kv_pool(KvPoolOptions{config.kv_block_tokens, 1, prefix}); !st.ok()) return st;
  KvBlockGeometry g{config.kv_block_tokens, model.kv_block_bytes()};
  const std::optional<DecodeGraphOptions> graphs = decode_graphs_wanted(config, setup);
  std::int64_t graph_bytes = 0;
  if (graphs) {
    Result<std::int64_t> measured = measure_decode_graphs(model, *graphs, setup);
    if (!measured.ok()) return measured.error();
    graph_bytes = *measured;
  }
  const std::int64_t blocks = g.block_bytes > 0 ? setup.budget_bytes / g.block_bytes : 0;
  if (blocks < 1) {
    return Error(ErrorCode::kConfig, "the budget of " + setup.device->name() + " (" + format_bytes(setup.budget_bytes) +
                                         ") cannot hold one KV cache block of " + std::to_string(g.block_tokens) +
                                         " tokens (" + format_bytes(g.block_bytes) + "): " + budget_shortfall(setup));
  }
  if (Status st = model.use_kv_pool(KvPoolOptions{config.kv_block_tokens, blocks, prefix}); !st.ok()) {
    return Error(ErrorCode::kConfig, "the KV block pool of " + setup.device->name() + " (" + std::to_string(blocks) +
                                         " blocks of " + format_bytes(g.block_bytes) + ") could not be allocated: " +
                                         st.error().message + held_by_others(*setup.device));
  }
  spdlog::info("KV block pool on {}: {} blocks of {} tokens, {} each ({} in all), reservation {}, prefix cache {}",
               setup.device->name(), blocks, g.block_tokens, format_bytes(g.block_bytes),
               format_bytes(blocks * g.block_bytes), config.kv_reservation, config.prefix_cache);
  setup.kv_pool = g;
  if (graphs) return record_decode_graphs(model, *graphs, graph_bytes, setup);
  return Status::Ok();
}

// The batch (--max-batch 0: chosen now), then the KV block pool and its
// decode graphs where the device gets them.
Status size_batch_and_pool(const ServeConfig& config, DeviceSetup& setup) {
  setup.max_batch = config.max_batch_or_default();
  if (config.max_batch == 0 && kv_pool_wanted(config, setup)) choose_pool_batch(config, setup);
  if (Status st = make_kv_pool(config, setup); !st.ok()) return st;
  log_graphs_without_pool(config, setup);
  return Status::Ok();
}

// Loads a TorchScript model onto `setup`'s device and measures its fit.
Status load_tensor_model(const ServeConfig& config, const ModelSource& source, DeviceSetup& setup) {
  Device& device = *setup.device;
  const std::int64_t before = device.memory().own;
  auto tensor = TorchScriptModel::load(TorchScriptModel::Options{source.dir, &device});
  if (!tensor.ok()) return load_failure(std::move(tensor).error(), device);
  const std::int64_t resident = device.memory().own - before;
  auto fit = measure_tensor_profile(**tensor, device,
                                    TensorProfileOptions{config.max_batch_or_default(), config.memory_safety});
  if (!fit.ok()) {
    return Error(ErrorCode::kConfig, "memory profile of '" + source.dir.string() + "' on " + device.name() +
                                         " failed: " + fit.error().message + held_by_others(device));
  }
  fit->resident_bytes = resident;
  spdlog::info("model '{}' (torchscript) on {}: {} resident; {}", source.id, device.name(), format_bytes(resident),
               fit_text(*fit));
  MemoryProfile p;
  p.resident_bytes = resident;
  p.safety_factor = config.memory_safety;
  setup.resident_bytes += resident;
  setup.profiles.push_back(p);
  setup.tensor_profiles.push_back(*fit);
  setup.models.push_back(nullptr);
  setup.tensor_models.push_back(std::move(tensor).value());
  return Status::Ok();
}

// Loads a language model onto `setup`'s device and measures its memory profile.
Status load_language_model(const ServeConfig& config, const ModelSource& source, DeviceSetup& setup) {
  Device& device = *setup.device;
  const std::int64_t before = device.memory().own;
  auto model = Model::load(Model::Options{source.dir.string(), &device, config.dtype, config.host_kernels == "on"});
  if (!model.ok()) return load_failure(std::move(model).error(), device);
  const std::int64_t resident = device.memory().own - before;
  auto profile = measure_memory_profile(
      **model, device, ProfileOptions{config.max_batch_or_default(), config.max_batch_tokens, config.memory_safety});
  if (!profile.ok()) {
    return Error(ErrorCode::kConfig, "memory profile of '" + source.dir.string() + "' on " + device.name() +
                                         " failed: " + profile.error().message + held_by_others(device));
  }
  profile->resident_bytes = resident;
  // With a prefill worker a prefill step and a decode step may run at once.
  if (config.prefill_worker) {
    profile->workspace_bytes *= 2;
    spdlog::info("--prefill-worker: workspace of '{}' set aside twice: {} B", source.id, profile->workspace_bytes);
  }
  setup.resident_bytes += resident;
  setup.workspace_bytes += profile->workspace_bytes;
  setup.profiles.push_back(*profile);
  setup.tensor_profiles.emplace_back();
  setup.models.push_back(std::move(model).value());
  setup.tensor_models.push_back(nullptr);
  return Status::Ok();
}

// The device's budget: its memory now, less what the models hold and set
// aside and the reserve (logged).
void set_budget(const ServeConfig& config, DeviceSetup& setup) {
  setup.reserve_bytes = config.memory_reserve_bytes();
  const DeviceMemory mem = setup.device->memory();
  setup.budget_inputs = DeviceBudgetInputs{mem.capacity,         config.memory_utilization, mem.foreign,
                                           setup.resident_bytes, setup.workspace_bytes,     setup.reserve_bytes};
  setup.budget_bytes = device_budget(setup.budget_inputs);
  spdlog::info(
      "budget of {}: {} = min({} capacity x {}, {} capacity - {} held by others) - {} resident - {} "
      "workspace - {} reserve ({} free now)",
      setup.device->name(), format_bytes(setup.budget_bytes), format_bytes(mem.capacity),
      format_decimal(config.memory_utilization), format_bytes(mem.capacity), format_bytes(mem.foreign),
      format_bytes(setup.resident_bytes), format_bytes(setup.workspace_bytes), format_bytes(setup.reserve_bytes),
      format_bytes(mem.capacity - mem.used));
}

// Where admission runs, the budget must hold each model's smallest work: a
// forward pass at the smallest shapes, or a 2-token request (kConfig).
Status check_smallest_fits(const ServeConfig& config, std::span<const ModelSource> models, const DeviceSetup& setup) {
  if (config.admission_policy().kind == AdmissionPolicy::Kind::kNone) return Status::Ok();
  for (std::size_t i = 0; i < models.size(); ++i) {
    if (setup.tensor_models[i]) {
      const TensorModelSpec& ts_spec = setup.tensor_models[i]->spec();
      const std::int64_t smallest =
          tensor_cost(setup.tensor_profiles[i], total_elements(profile_shapes(ts_spec, 0, 1)));
      if (setup.budget_bytes < smallest) {
        return Error(ErrorCode::kConfig,
                     "the budget of " + setup.device->name() + " (" + format_bytes(setup.budget_bytes) +
                         ") cannot hold even a forward pass of '" + models[i].id + "' at its smallest shapes (" +
                         format_bytes(smallest) + "): " + budget_shortfall(setup) + "; give the device more capacity");
      }
      continue;
    }
    const std::int64_t smallest = request_cost(setup.profiles[i], 1, 1);
    if (setup.budget_bytes < smallest) {
      return Error(ErrorCode::kConfig,
                   "the budget of " + setup.device->name() + " (" + format_bytes(setup.budget_bytes) +
                       ") cannot hold even a 2-token request of '" + models[i].id + "' (" + format_bytes(smallest) +
                       "): " + budget_shortfall(setup) +
                       "; give the device more capacity, or lower --memory-reserve or raise --memory-utilization");
    }
  }
  return Status::Ok();
}

}  // namespace

Result<DeviceSetup> load_device(const ServeConfig& config, const DeviceSpec& spec,
                                std::span<const ModelSource> models) {
  DeviceSetup out;
  auto device = create_device(spec.kind, spec.index, spec.capacity);
  if (!device.ok()) return std::move(device).error();
  out.device = std::move(device).value();
  // Test hook: another process holds device memory before the models load.
  if (auto hook = parse_foreign_bytes_hook(config.test_foreign_bytes); hook.ok()) {
    if (auto bytes = hook->read_file()) out.device->set_test_foreign_bytes(*bytes);
  }
  DeviceScope scope(out.device.get());
  for (const ModelSource& source : models) {
    const Status st =
        source.torchscript ? load_tensor_model(config, source, out) : load_language_model(config, source, out);
    if (!st.ok()) return st.error();
  }
  set_budget(config, out);
  if (Status st = check_smallest_fits(config, models, out); !st.ok()) return st.error();
  if (Status st = size_batch_and_pool(config, out); !st.ok()) return st.error();
  return out;
}

Result<ProfiledModel> load_profiled_model(const ServeConfig& config) {
  const std::vector<ModelSource> first{find_model_sources(config).front()};
  ServeConfig one = config;
  one.admission = "none";   // the plan reports what fits; it does not refuse to start
  one.cuda_graphs = "off";  // no pool, so no graphs: their bytes are serve's to measure
  one.test_emulate_cuda_graphs = false;
  auto setup = load_device(one, config.device_specs().front(), first);
  if (!setup.ok()) return std::move(setup).error();
  // The batch `serve` would choose (the plan allocates no pool).
  if (config.max_batch == 0 && kv_pool_wanted(config, *setup)) choose_pool_batch(config, *setup);
  ProfiledModel out;
  out.device = std::move(setup->device);
  out.model = std::move(setup->models.front());
  out.tensor_model = std::move(setup->tensor_models.front());
  out.tensor_profile = setup->tensor_profiles.front();
  out.id = first.front().id;
  out.profile = setup->profiles.front();
  out.reserve_bytes = setup->reserve_bytes;
  out.budget_bytes = setup->budget_bytes;
  out.max_batch = setup->max_batch;
  return out;
}

}  // namespace vg
