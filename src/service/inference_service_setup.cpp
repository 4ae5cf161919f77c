// InferenceService::create (see inference_service.hpp): the devices and their
// model replicas, the model entries, the admission front and one engine per
// (device, model).
#include "service/inference_service.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "admission/admission_controller.hpp"
#include "admission/admission_policy.hpp"
#include "device/device.hpp"
#include "engine/engine.hpp"
#include "engine/tensor_engine.hpp"
#include "model/model.hpp"
#include "model/torchscript_model.hpp"
#include "service/engine_options.hpp"
#include "service/inference_service_entries.hpp"
#include "service/model_setup.hpp"
#include "service/step_profile_setup.hpp"
#include "tokenizer/tokenizer.hpp"

namespace vg {

struct InferenceService::EngineStart {
  const std::vector<ModelSource>& sources;
  const std::vector<DeviceEntry*>& serving;
  AdmissionOptions admission;
  std::shared_ptr<EngineFront> front;
  std::shared_ptr<TensorRegistry> registry;
  metrics::ServerMetrics* metrics = nullptr;
  std::function<void(const std::string&)> on_poisoned;
  StepProfileOptions step_profile;  ///< for the first language-model engine; the others record none
  int next_index = 0;               ///< the next engine's index in the front's topology
};

namespace {

/// Unix seconds now, whole (ModelInfo::created).
std::int64_t whole_unix_seconds_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

/// What /v1/models shows of a language model, its devices left out; `profile`
/// and `device` are its first device's.
ModelInfo language_model_info(const ModelSource& source, const Model& model, const MemoryProfile& profile,
                              const std::string& device) {
  const ModelConfig& mc = model.config();
  ModelInfo info;
  info.id = source.id;
  info.family = mc.family;
  info.dtype = mc.dtype;
  info.context_length = mc.n_positions;
  info.parameter_count = model.parameter_count();
  info.device = device;
  info.resident_bytes = profile.resident_bytes;
  info.workspace_bytes = profile.workspace_bytes;
  info.kv_bytes_per_token = profile.kv_bytes_per_token;
  info.sequence_overhead_bytes = profile.sequence_overhead_bytes;
  info.safety_factor = profile.safety_factor;
  std::error_code absolute_error;
  const std::filesystem::path absolute = std::filesystem::absolute(source.dir, absolute_error);
  info.dir = (absolute_error ? source.dir : absolute).lexically_normal().string();
  info.vocab_size = mc.vocab_size;
  info.eos_token_id = mc.eos_token_id;
  info.created = whole_unix_seconds_now();
  return info;
}

void log_language_model(const ModelInfo& info, const ModelConfig& mc) {
  std::string where;
  for (const std::string& name : info.devices) where += (where.empty() ? "" : ", ") + name;
  spdlog::info("model '{}' ({}, {} layers, {} wide, context {}, {} parameters) loaded on {}", info.id, mc.family,
               mc.n_layer, mc.n_embd, mc.n_positions, info.parameter_count, where);
}

/// The admission front's options: --admission, the queue and retry-booking
/// flags, and the step time of `step_s` (the slowest device's measured step).
AdmissionOptions admission_options(const ServeConfig& config, double step_s) {
  AdmissionOptions ao;
  ao.policy = config.admission_policy();
  ao.max_queue = config.max_queue;
  ao.queue_timeout = from_seconds(config.queue_timeout_s);
  ao.max_bypass = from_seconds(config.max_bypass_s);
  ao.priority_aging = from_seconds(config.priority_aging_s);
  ao.retry_booking.enabled = config.retry_bookings == "on";
  ao.retry_booking.max_bookings = static_cast<std::size_t>(config.max_retry_bookings);
  ao.retry_booking.early = from_seconds(config.retry_early_s);
  ao.retry_booking.grace = from_seconds(config.retry_grace_s);
  ao.retry_booking.max_after = from_seconds(config.max_retry_after_s);
  // The step delay test hook sleeps after every step, so it is part of the device time.
  ao.step_time = from_seconds(step_s + config.test_step_delay_ms / 1e3);
  return ao;
}

}  // namespace

Result<std::unique_ptr<InferenceService>> InferenceService::create(
    const ServeConfig& config, metrics::ServerMetrics* metrics, std::function<void(const std::string&)> on_poisoned) {
  std::unique_ptr<InferenceService> svc(new InferenceService(config));
  svc->started_at_ = unix_seconds_now();
  const std::vector<ModelSource> sources = find_model_sources(config);
  Result<std::vector<DeviceEntry*>> serving = svc->load_devices(sources);
  if (!serving.ok()) return std::move(serving).error();
  svc->choose_max_batch(*serving);
  if (Status st = svc->add_models(sources, *serving); !st.ok()) return st.error();

  // One admission front: every (device, model) engine draws from its queue.
  const AdmissionOptions ao = admission_options(config, slowest_step_seconds(*serving));
  auto front = make_engine_front(ao, svc->admission_topology(sources, *serving, ao.policy));
  if (!front.ok()) return std::move(front).error();

  // The step profile is recorded by the first language-model engine.
  auto step_profile = make_step_profile(config, *serving->front()->setup.device);
  if (!step_profile.ok()) return std::move(step_profile).error();
  svc->tensor_registry_ = make_tensor_registry(*front);
  EngineStart start{sources,
                    *serving,
                    ao,
                    *front,
                    svc->tensor_registry_,
                    metrics,
                    std::move(on_poisoned),
                    std::move(step_profile).value()};
  if (Status st = svc->start_engines(start); !st.ok()) return st.error();
  return svc;
}

Result<std::vector<InferenceService::DeviceEntry*>> InferenceService::load_devices(
    const std::vector<ModelSource>& sources) {
  // Each device loads every model; one that fails is left out.
  std::optional<Error> first_error;
  std::vector<DeviceEntry*> serving;
  const std::vector<DeviceSpec> specs = config_.device_specs();
  for (const DeviceSpec& spec : specs) {
    auto entry = std::make_unique<DeviceEntry>();
    auto setup = load_device(config_, spec, sources);
    if (setup.ok()) {
      entry->setup = std::move(setup).value();
      entry->name = entry->setup.device->name();
      entry->topology_index = static_cast<int>(serving.size());
      serving.push_back(entry.get());
    } else {
      entry->name = spec.kind == DeviceKind::kAuto ? spec.text : spec.name();
      entry->failure = setup.error().message;
      if (spec.kind == DeviceKind::kVirtual) entry->failed_capacity = spec.capacity;
      if (!first_error) first_error = setup.error();
      if (specs.size() > 1) spdlog::error("device {} left out: {}", spec.text, entry->failure);
    }
    devices_.push_back(std::move(entry));
  }
  if (serving.empty()) return *first_error;
  return serving;
}

void InferenceService::choose_max_batch(const std::vector<DeviceEntry*>& serving) {
  if (config_.max_batch != 0) return;
  // The smallest batch a device chose (each device's workspace was set aside
  // for its own, at least as large).
  int chosen = kLargestMaxBatch;
  for (DeviceEntry* d : serving) chosen = std::min(chosen, d->setup.max_batch);
  config_.max_batch = chosen;
}

Status InferenceService::add_models(const std::vector<ModelSource>& sources, const std::vector<DeviceEntry*>& serving) {
  for (std::size_t m = 0; m < sources.size(); ++m) {
    if (sources[m].torchscript) {
      add_tensor_model(sources[m], m, serving);
      continue;
    }
    if (Status st = add_language_model(sources[m], m, serving); !st.ok()) return st;
  }
  return Status::Ok();
}

void InferenceService::add_tensor_model(const ModelSource& source, std::size_t m,
                                        const std::vector<DeviceEntry*>& serving) {
  auto entry = std::make_unique<ModelEntry>();
  const DeviceSetup& first = serving.front()->setup;
  entry->tensor_model = first.tensor_models[m].get();
  TensorModelInfo& ti = entry->tensor_info;
  ti.id = source.id;
  ti.spec = entry->tensor_model->spec();
  ti.profile = first.tensor_profiles[m];
  ti.max_batch = ti.spec.batched ? std::min<int>(config_.max_batch, static_cast<int>(ti.spec.max_batch())) : 1;
  for (DeviceEntry* d : serving) {
    ti.devices.push_back(d->name);
    ti.budget_bytes = std::max(ti.budget_bytes, d->setup.budget_bytes);
  }
  ModelInfo& info = entry->info;
  info.id = source.id;
  info.family = "torchscript";
  info.dtype = "float32";
  info.parameter_count = 0;
  info.device = first.device->name();
  info.devices = ti.devices;
  info.resident_bytes = ti.profile.resident_bytes;
  info.safety_factor = ti.profile.safety_factor;
  info.created = whole_unix_seconds_now();
  models_.push_back(std::move(entry));
}

Status InferenceService::add_language_model(const ModelSource& source, std::size_t m,
                                            const std::vector<DeviceEntry*>& serving) {
  auto entry = std::make_unique<ModelEntry>();
  const DeviceSetup& first = serving.front()->setup;
  entry->model = first.models[m].get();
  // The model owns its tokenizer and outlives the entry: the encoder shares it without owning it.
  Result<PromptEncoder> prompts =
      PromptEncoder::load(std::shared_ptr<const Tokenizer>(std::shared_ptr<void>(), &entry->model->tokenizer()),
                          source.dir, config_.chat_template, source.id);
  if (!prompts.ok()) return std::move(prompts).error();
  entry->prompts.emplace(std::move(prompts).value());
  spdlog::info("chat format of '{}': {}", source.id, entry->prompts->chat_format_description());
  entry->info = language_model_info(source, *entry->model, first.profiles[m], first.device->name());
  for (DeviceEntry* d : serving) entry->info.devices.push_back(d->name);
  log_language_model(entry->info, entry->model->config());
  warn_full_context_unfit(entry->info, entry->model->config(), m, serving);
  models_.push_back(std::move(entry));
  return Status::Ok();
}

void InferenceService::warn_full_context_unfit(const ModelInfo& info, const ModelConfig& mc, std::size_t m,
                                               const std::vector<DeviceEntry*>& serving) {
  for (DeviceEntry* d : serving) {
    const std::int64_t full = request_cost(d->setup.profiles[m], mc.n_positions, 0);
    if (d->setup.budget_bytes < full) {
      spdlog::warn("a full-context request of '{}' ({} tokens) costs {} and does not fit the budget {} of {}", info.id,
                   mc.n_positions, format_bytes(full), format_bytes(d->setup.budget_bytes), d->name);
    }
  }
}

double InferenceService::slowest_step_seconds(const std::vector<DeviceEntry*>& serving) {
  double step_s = 0;
  for (DeviceEntry* d : serving) {
    for (const MemoryProfile& p : d->setup.profiles) step_s = std::max(step_s, p.step_seconds);
  }
  return step_s;
}

AdmissionTopology InferenceService::admission_topology(const std::vector<ModelSource>& sources,
                                                       const std::vector<DeviceEntry*>& serving,
                                                       const AdmissionPolicy& policy) const {
  const bool unlimited = policy.kind == AdmissionPolicy::Kind::kNone;
  const int max_running = unlimited ? kUnlimitedRunning : config_.max_batch;
  AdmissionTopology topology;
  for (DeviceEntry* d : serving) {
    topology.devices.push_back(AdmissionTopology::Device{d->name, d->setup.budget_bytes});
    for (std::size_t m = 0; m < sources.size(); ++m) {
      const int running = sources[m].torchscript && !unlimited ? models_[m]->tensor_info.max_batch : max_running;
      topology.engines.push_back(AdmissionTopology::Engine{d->topology_index, static_cast<int>(m), running});
    }
  }
  return topology;
}

Status InferenceService::start_engines(EngineStart& start) {
  for (DeviceEntry* d : start.serving) {
    for (std::size_t m = 0; m < start.sources.size(); ++m) {
      const Status st = start.sources[m].torchscript ? start_tensor_engine(start, *d, m) : start_engine(start, *d, m);
      if (!st.ok()) return st;
    }
  }
  return Status::Ok();
}

Status InferenceService::start_tensor_engine(EngineStart& start, DeviceEntry& d, std::size_t m) {
  TensorEngine::Options to = tensor_engine_options(config_);
  to.policy = start.admission.policy;
  to.budget_bytes = d.setup.budget_bytes;
  to.budget_inputs = d.setup.budget_inputs;
  // The largest fit over the devices, so a lease covers the request wherever it runs.
  to.profile = d.setup.tensor_profiles[m];
  for (DeviceEntry* other : start.serving) {
    const TensorMemoryProfile& q = other->setup.tensor_profiles[m];
    to.profile.fixed_bytes = std::max(to.profile.fixed_bytes, q.fixed_bytes);
    to.profile.bytes_per_element = std::max(to.profile.bytes_per_element, q.bytes_per_element);
  }
  to.max_batch = models_[m]->tensor_info.max_batch;
  to.metrics = start.metrics;
  to.model_name = models_[m]->info.id;
  auto engine = TensorEngine::create(to, *d.setup.tensor_models[m], *d.setup.device, start.front, start.registry,
                                     start.next_index++);
  if (!engine.ok()) return std::move(engine).error();
  models_[m]->tensor_engines.push_back(engine->get());
  d.tensor_engines.push_back(std::move(engine).value());
  return Status::Ok();
}

Status InferenceService::start_engine(EngineStart& start, DeviceEntry& d, std::size_t m) {
  std::vector<const MemoryProfile*> profiles;
  for (DeviceEntry* other : start.serving) profiles.push_back(&other->setup.profiles[m]);
  Engine::Options eo = engine_options(config_);
  eo.admission = start.admission;
  eo.admission.budget_bytes = d.setup.budget_bytes;
  eo.budget_inputs = d.setup.budget_inputs;
  eo.profile = cost_profile(profiles);
  if (d.setup.kv_pool) {
    eo.kv_pool = Engine::Options::KvPool{*d.setup.kv_pool, *parse_kv_reservation(config_.kv_reservation)};
  }
  eo.metrics = start.metrics;
  eo.on_poisoned = start.on_poisoned;
  eo.step_profile = std::exchange(start.step_profile, StepProfileOptions{});
  auto engine = Engine::create(eo, *d.setup.models[m], *d.setup.device, start.front, start.next_index++);
  if (!engine.ok()) return std::move(engine).error();
  models_[m]->engines.push_back(engine->get());
  d.engines.push_back(std::move(engine).value());
  return Status::Ok();
}

}  // namespace vg
