// InferenceService (see inference_service.hpp): device, model, memory profile,
// engine wiring, request validation, watchdog health and admission state.
#include "server/inference_service.hpp"

#include <unistd.h>

#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <thread>
#include <utility>

#include "admission/admission_policy.hpp"
#include "device/device.hpp"
#include "engine/engine.hpp"
#include "engine/tensor_engine.hpp"
#include "engine/text_stream.hpp"
#include "model/model.hpp"
#include "model/torchscript_model.hpp"
#include "server/engine_options.hpp"
#include "server/inference_service_entries.hpp"
#include "server/model_setup.hpp"
#include "server/step_profile_setup.hpp"
#include "tokenizer/tokenizer.hpp"

namespace vg {


namespace {

/// The handle of a request that ended at submit (nothing to cancel).
class FinishedHandle final : public RequestHandle {
 public:
  explicit FinishedHandle(std::string id) : id_(std::move(id)) {}
  void cancel() override {}
  const std::string& id() const override { return id_; }

 private:
  std::string id_;
};

}  // namespace

InferenceService::InferenceService(const ServeConfig& config) : config_(config) {}

InferenceService::~InferenceService() { shutdown(); }

Result<std::unique_ptr<InferenceService>> InferenceService::create(
    const ServeConfig& config, metrics::ServerMetrics* metrics, std::function<void(const std::string&)> on_poisoned) {
  std::unique_ptr<InferenceService> svc(new InferenceService(config));
  svc->started_at_ = unix_seconds_now();
  const std::vector<ModelSource> sources = find_model_sources(config);

  // Devices: each loads every model; one that fails is left out.
  std::optional<Error> first_error;
  std::vector<DeviceEntry*> serving;
  const std::vector<DeviceSpec> specs = config.device_specs();
  for (const DeviceSpec& spec : specs) {
    auto entry = std::make_unique<DeviceEntry>();
    auto setup = load_device(config, spec, sources);
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
    svc->devices_.push_back(std::move(entry));
  }
  if (serving.empty()) return *first_error;
  // --max-batch 0: the smallest batch a device chose (each device's
  // workspace was set aside for its own, at least as large).
  if (config.max_batch == 0) {
    int chosen = kLargestMaxBatch;
    for (DeviceEntry* d : serving) chosen = std::min(chosen, d->setup.max_batch);
    svc->config_.max_batch = chosen;
  }
  const int max_batch = svc->config_.max_batch;

  // Models: what /v1/models shows, and the chat format.
  for (std::size_t m = 0; m < sources.size(); ++m) {
    const ModelSource& source = sources[m];
    auto entry = std::make_unique<ModelEntry>();
    const DeviceSetup& first = serving.front()->setup;
    if (source.torchscript) {
      entry->tensor_model = first.tensor_models[m].get();
      TensorModelInfo& ti = entry->tensor_info;
      ti.id = source.id;
      ti.spec = entry->tensor_model->spec();
      ti.profile = first.tensor_profiles[m];
      ti.max_batch = ti.spec.batched ? std::min<int>(max_batch, static_cast<int>(ti.spec.max_batch())) : 1;
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
      info.created = std::chrono::duration_cast<std::chrono::seconds>(
                         std::chrono::system_clock::now().time_since_epoch())
                         .count();
      svc->models_.push_back(std::move(entry));
      continue;
    }
    entry->model = first.models[m].get();
    // The model owns its tokenizer and outlives the entry: the encoder shares it without owning it.
    Result<PromptEncoder> prompts = PromptEncoder::load(
        std::shared_ptr<const Tokenizer>(std::shared_ptr<void>(), &entry->model->tokenizer()), source.dir,
        config.chat_template, source.id);
    if (!prompts.ok()) return std::move(prompts).error();
    entry->prompts.emplace(std::move(prompts).value());
    spdlog::info("chat format of '{}': {}", source.id, entry->prompts->chat_format_description());
    const ModelConfig& mc = entry->model->config();
    const MemoryProfile& profile = first.profiles[m];
    ModelInfo& info = entry->info;
    info.id = source.id;
    info.family = mc.family;
    info.dtype = mc.dtype;
    info.context_length = mc.n_positions;
    info.parameter_count = entry->model->parameter_count();
    info.device = first.device->name();
    for (DeviceEntry* d : serving) info.devices.push_back(d->name);
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
    info.created = std::chrono::duration_cast<std::chrono::seconds>(
                       std::chrono::system_clock::now().time_since_epoch())
                       .count();
    std::string where;
    for (const std::string& name : info.devices) where += (where.empty() ? "" : ", ") + name;
    spdlog::info("model '{}' ({}, {} layers, {} wide, context {}, {} parameters) loaded on {}", info.id, mc.family,
                 mc.n_layer, mc.n_embd, mc.n_positions, info.parameter_count, where);
    for (DeviceEntry* d : serving) {
      const std::int64_t full = request_cost(d->setup.profiles[m], mc.n_positions, 0);
      if (d->setup.budget_bytes < full) {
        spdlog::warn("a full-context request of '{}' ({} tokens) costs {} and does not fit the budget {} of {}",
                     info.id, mc.n_positions, format_bytes(full), format_bytes(d->setup.budget_bytes), d->name);
      }
    }
    svc->models_.push_back(std::move(entry));
  }

  // One admission front: every (device, model) engine draws from its queue.
  const AdmissionPolicy policy = config.admission_policy();
  const int max_running = policy.kind == AdmissionPolicy::Kind::kNone ? kUnlimitedRunning : max_batch;
  AdmissionOptions ao;
  ao.policy = policy;
  ao.max_queue = config.max_queue;
  ao.queue_timeout = from_seconds(config.queue_timeout_s);
  ao.max_bypass = from_seconds(config.max_bypass_s);
  ao.priority_aging = from_seconds(config.priority_aging_s);
  ao.retry_booking.enabled = config.retry_bookings == "on";
  ao.retry_booking.max_bookings = static_cast<std::size_t>(config.max_retry_bookings);
  ao.retry_booking.early = from_seconds(config.retry_early_s);
  ao.retry_booking.grace = from_seconds(config.retry_grace_s);
  ao.retry_booking.max_after = from_seconds(config.max_retry_after_s);
  // The slowest device's measured step, plus the step delay test hook (it
  // sleeps after every step, so it is part of the device time).
  double step_s = 0;
  for (DeviceEntry* d : serving) {
    for (const MemoryProfile& p : d->setup.profiles) step_s = std::max(step_s, p.step_seconds);
  }
  ao.step_time = from_seconds(step_s + config.test_step_delay_ms / 1e3);
  AdmissionTopology topology;
  for (DeviceEntry* d : serving) {
    topology.devices.push_back(AdmissionTopology::Device{d->name, d->setup.budget_bytes});
    for (std::size_t m = 0; m < sources.size(); ++m) {
      const int running = sources[m].torchscript && policy.kind != AdmissionPolicy::Kind::kNone
                              ? svc->models_[m]->tensor_info.max_batch
                              : max_running;
      topology.engines.push_back(AdmissionTopology::Engine{d->topology_index, static_cast<int>(m), running});
    }
  }
  auto front = make_engine_front(ao, topology);
  if (!front.ok()) return std::move(front).error();

  // The step profile is recorded by the first language-model engine.
  auto step_profile = make_step_profile(config, *serving.front()->setup.device);
  if (!step_profile.ok()) return std::move(step_profile).error();
  std::shared_ptr<TensorRegistry> registry = make_tensor_registry(*front);
  svc->tensor_registry_ = registry;
  int index = 0;
  for (DeviceEntry* d : serving) {
    for (std::size_t m = 0; m < sources.size(); ++m) {
      if (sources[m].torchscript) {
        TensorEngine::Options to = tensor_engine_options(config);
        to.policy = policy;
        to.budget_bytes = d->setup.budget_bytes;
        to.budget_inputs = d->setup.budget_inputs;
        // The largest fit over the devices, so a lease covers the request wherever it runs.
        to.profile = d->setup.tensor_profiles[m];
        for (DeviceEntry* other : serving) {
          const TensorMemoryProfile& q = other->setup.tensor_profiles[m];
          to.profile.fixed_bytes = std::max(to.profile.fixed_bytes, q.fixed_bytes);
          to.profile.bytes_per_element = std::max(to.profile.bytes_per_element, q.bytes_per_element);
        }
        to.max_batch = svc->models_[m]->tensor_info.max_batch;
        to.metrics = metrics;
        to.model_name = svc->models_[m]->info.id;
        auto engine = TensorEngine::create(to, *d->setup.tensor_models[m], *d->setup.device, *front, registry, index++);
        if (!engine.ok()) return std::move(engine).error();
        svc->models_[m]->tensor_engines.push_back(engine->get());
        d->tensor_engines.push_back(std::move(engine).value());
        continue;
      }
      std::vector<const MemoryProfile*> profiles;
      for (DeviceEntry* other : serving) profiles.push_back(&other->setup.profiles[m]);
      Engine::Options eo = engine_options(svc->config_);
      eo.admission = ao;
      eo.admission.budget_bytes = d->setup.budget_bytes;
      eo.budget_inputs = d->setup.budget_inputs;
      eo.profile = cost_profile(profiles);
      if (d->setup.kv_pool) {
        eo.kv_pool = Engine::Options::KvPool{*d->setup.kv_pool, *parse_kv_reservation(config.kv_reservation)};
      }
      eo.metrics = metrics;
      eo.on_poisoned = on_poisoned;
      eo.step_profile = std::exchange(*step_profile, StepProfileOptions{});
      auto engine = Engine::create(eo, *d->setup.models[m], *d->setup.device, *front, index++);
      if (!engine.ok()) return std::move(engine).error();
      svc->models_[m]->engines.push_back(engine->get());
      d->engines.push_back(std::move(engine).value());
    }
  }
  return svc;
}

std::vector<Engine*> InferenceService::engines() const {
  std::vector<Engine*> out;
  for (auto& d : devices_) {
    for (auto& e : d->engines) out.push_back(e.get());
  }
  return out;
}

Result<InferenceService::ModelEntry*> InferenceService::find_model(const std::string& name) const {
  for (auto& e : models_) {
    if (name.empty() ? e->model != nullptr : e->info.id == name) return e.get();
  }
  std::string names;
  for (auto& e : models_) names += (names.empty() ? "" : ", ") + e->info.id;
  if (name.empty()) return Error(ErrorCode::kModelNotFound, "no language model is served; available: " + names);
  return Error(ErrorCode::kModelNotFound, "model '" + name + "' not found; available: " + names);
}

std::string InferenceService::prompt_text(const CompletionRequest& request) const {
  if (const auto* text = std::get_if<std::string>(&request.prompt)) return *text;
  auto found = find_model(request.model);
  if (!found.ok() || !(*found)->model) return {};
  return (*found)->model->tokenizer().decode(std::get<std::vector<std::int32_t>>(request.prompt));
}

Result<Submission> InferenceService::submit(const CompletionRequest& request, std::shared_ptr<EventSink> sink) {
  return submit_resumed(request, ResumeFrom{}, std::move(sink));
}

Result<Submission> InferenceService::submit_resumed(const CompletionRequest& request, const ResumeFrom& resume,
                                                    std::shared_ptr<EventSink> sink) {
  auto found = find_model(request.model);
  if (!found.ok()) return std::move(found).error();
  ModelEntry* entry = *found;
  if (!entry->model) {
    return Error(ErrorCode::kInvalidRequest, "model '" + entry->info.id + "' is a TorchScript model: POST /v2/models/" +
                                                 entry->info.id + "/infer with its input tensors");
  }
  if (draining_.load()) {
    return shutting_down();
  }
  const ModelConfig& mc = entry->model->config();
  const Tokenizer& tok = entry->model->tokenizer();

  GenerationRequest gen;
  std::vector<std::string> stop = request.stop;
  const std::string* text = std::get_if<std::string>(&request.prompt);
  if (request.chat || text) {
    Result<EncodedPrompt> encoded = request.chat
                                        ? entry->prompts->encode_chat(request.chat->messages, request.chat->chat_template)
                                        : entry->prompts->encode_text(*text);
    if (!encoded.ok()) return std::move(encoded).error();
    gen.prompt = std::move(encoded->ids);
    // The end-of-turn text stops generation where the vocabulary has no such
    // special token (then the template is plain text); a special token ends it
    // through the tokenizer's end ids.
    if (!encoded->stop.empty() && std::find(stop.begin(), stop.end(), encoded->stop) == stop.end()) {
      stop.push_back(std::move(encoded->stop));
    }
  } else {
    gen.prompt = std::get<std::vector<std::int32_t>>(request.prompt);
    for (std::int32_t id : gen.prompt) {
      if (id < 0 || id >= mc.vocab_size) {
        return Error(ErrorCode::kInvalidRequest, "prompt token id " + std::to_string(id) + " is outside the vocabulary 0.." +
                                                     std::to_string(mc.vocab_size - 1));
      }
    }
  }
  if (gen.prompt.empty()) {
    // An empty prompt starts a new document, as GPT-2 does with <|endoftext|>.
    if (!tok.eos_id()) return Error(ErrorCode::kInvalidRequest, "prompt must not be empty");
    gen.prompt.push_back(*tok.eos_id());
  }
  const long total = static_cast<long>(gen.prompt.size()) + request.max_tokens;
  if (total > mc.n_positions) {
    return exceeds_context_length(static_cast<std::int64_t>(gen.prompt.size()), request.max_tokens, entry->info.id,
                                  mc.n_positions);
  }
  if (request.n < 1 || request.n > config_.max_n) {
    return Error(ErrorCode::kInvalidRequest, "n must be between 1 and " + std::to_string(config_.max_n) +
                                                 " (--max-n); got " + std::to_string(request.n));
  }
  if (request.n > config_.max_batch && config_.admission_policy().kind != AdmissionPolicy::Kind::kNone) {
    return Error(ErrorCode::kInvalidRequest, "n (" + std::to_string(request.n) +
                                                 ") exceeds --max-batch (" + std::to_string(config_.max_batch) +
                                                 "): the choices of a request run together");
  }
  for (const auto& [id, bias] : request.sampling.logit_bias) {
    if (id < 0 || id >= mc.vocab_size) {
      return Error(ErrorCode::kInvalidRequest, "logit_bias token id " + std::to_string(id) +
                                                   " is outside the vocabulary 0.." + std::to_string(mc.vocab_size - 1));
    }
  }
  if (!resume.tokens.empty()) {
    if (request.n != 1) return Error(ErrorCode::kInvalidRequest, "a resumed request has one choice");
    for (std::int32_t id : resume.tokens) {
      if (id < 0 || id >= mc.vocab_size) {
        return Error(ErrorCode::kInvalidRequest, "resumed token id " + std::to_string(id) + " is outside the vocabulary");
      }
    }
    if (static_cast<long>(resume.tokens.size()) > request.max_tokens) {
      return Error(ErrorCode::kInvalidRequest, "a resumed request has more tokens than its max_tokens");
    }
  }
  gen.id = request.request_id.empty() ? "req-" + std::to_string(next_id_.fetch_add(1)) : request.request_id;
  gen.max_tokens = request.max_tokens;
  gen.sampling = request.sampling;
  gen.stop = std::move(stop);
  gen.ignore_eos = request.ignore_eos;
  gen.priority = request.priority.value_or(Priority::kNormal);
  gen.n = request.n;
  gen.logprobs = request.logprobs;
  gen.prompt_logprobs = request.echo && request.logprobs.has_value();
  gen.retry = request.retry;
  gen.resume_generated = resume.tokens;
  gen.admitted_before = resume.admitted_before;
  if (resume.prompt_sent) gen.prompt_logprobs = false;
  double timeout = config_.request_timeout_s;
  if (request.timeout_s) timeout = std::min(timeout, *request.timeout_s);
  gen.deadline = Clock::now() + from_seconds(timeout);

  // Any ready engine of the model takes the submission into the shared
  // queue; admission then places it. With none ready, the first engine's
  // refusal (503 + Retry-After) answers.
  Engine* engine = entry->engines.front();
  const TimePoint now = Clock::now();
  for (Engine* e : entry->engines) {
    if (e->ready(now)) {
      engine = e;
      break;
    }
  }
  Submission sub;
  sub.model = entry->info.id;
  sub.prompt_tokens = static_cast<int>(gen.prompt.size());
  if (!gen.resume_generated.empty()) {
    // A resumed request whose delivered tokens already end it (its end was
    // lost with the engine that ran it) finishes here, with nothing resent.
    const char* reason = nullptr;
    TextStream replay(gen.stop);
    for (std::int32_t t : gen.resume_generated) (void)replay.push(tok.token_bytes(t));
    if (replay.stopped() || (tok.is_eos(gen.resume_generated.back()) && !gen.ignore_eos)) {
      reason = "stop";
    } else if (static_cast<int>(gen.resume_generated.size()) >= gen.max_tokens) {
      reason = "length";
    }
    if (reason) {
      sub.handle = std::make_shared<FinishedHandle>(gen.id);
      FinishedEvent done;
      done.finish_reason = reason;
      done.usage = {sub.prompt_tokens, static_cast<int>(gen.resume_generated.size())};
      sink->push(StartedEvent{});
      sink->push(std::move(done));
      return sub;
    }
  }
  sub.cost_bytes = engine->cost(gen);
  if (request.echo) sub.echo_text = text ? *text : tok.decode(gen.prompt);
  auto handle = engine->submit(std::move(gen), std::move(sink), &sub.queue_position, &sub.retry_claimed_by);
  if (!handle.ok()) return std::move(handle).error();
  sub.handle = std::move(handle).value();
  return sub;
}

std::vector<ModelInfo> InferenceService::models() const {
  std::vector<ModelInfo> out;
  for (auto& e : models_) out.push_back(e->info);
  return out;
}

bool InferenceService::healthy(std::string* reason) const { return healthy_at(Clock::now(), reason); }

bool InferenceService::healthy_at(TimePoint now, std::string* reason) const {
  const auto limit = std::chrono::duration<double>(config_.watchdog_timeout_s);
  for (auto& d : devices_) {
    for (auto& e : d->engines) {
      const std::optional<Duration> busy = e->busy_for(now);
      if (!busy || *busy <= limit) continue;
      if (reason) {
        *reason = fmt::format("engine on {} stuck in a step for {:.0f} s", d->name,
                              std::floor(to_seconds(*busy)));
      }
      return false;
    }
  }
  return true;
}

bool InferenceService::ready() const { return not_ready_reason().empty(); }

// Ready while every model has at least one device that serves it.
std::string InferenceService::not_ready_reason() const {
  if (models_.empty()) return "models loading";
  if (draining_.load()) return "server draining";
  const TimePoint now = Clock::now();
  for (auto& m : models_) {
    std::string reasons;
    bool served = false;
    if (m->tensor_model && !m->tensor_engines.empty()) continue;
    for (Engine* e : m->engines) {
      std::string why;
      if (e->ready(now, &why)) {
        served = true;
        break;
      }
      reasons += (reasons.empty() ? "" : "; ") + why;
    }
    if (!served) return m->engines.size() == 1 ? reasons : "no device serves model '" + m->info.id + "': " + reasons;
  }
  return {};
}

std::vector<EngineInfo> InferenceService::engine_processes() const {
  EngineInfo e;
  e.address = "in-process";
  for (auto& d : devices_) e.device += (e.device.empty() ? "" : ",") + d->name;
  for (auto& m : models_) e.models.push_back(m->info.id);
  e.pid = static_cast<std::int64_t>(::getpid());
  e.reason = not_ready_reason();
  e.state = e.reason.empty() ? "ready" : "not_ready";
  e.started_at = started_at_;
  return {e};
}

void InferenceService::begin_drain() {
  draining_.store(true);
  for (Engine* e : engines()) e->begin_drain();
  for (TensorEngine* e : tensor_engines()) e->begin_drain();
}

bool InferenceService::wait_idle(TimePoint deadline) const {
  bool idle = true;
  for (Engine* e : engines()) idle = e->wait_idle(deadline) && idle;
  for (TensorEngine* e : tensor_engines()) idle = e->wait_idle(deadline) && idle;
  if (!engines().empty() || tensor_engines().empty()) return idle;
  // Only tensor engines: wait for the shared queue to empty too.
  // (every entry: one an engine will take next is work still to do)
  while (tensor_engines().front()->admission().queued > 0 && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  idle = tensor_engines().front()->admission().queued == 0 && idle;
  return idle;
}

void InferenceService::shutdown() {
  // Every engine is told to stop before any is joined, so none takes the
  // shared queue's work while the others wind down.
  for (Engine* e : engines()) e->request_stop();
  for (TensorEngine* e : tensor_engines()) e->request_stop();
  for (Engine* e : engines()) e->shutdown();
  for (TensorEngine* e : tensor_engines()) e->shutdown();
}

}  // namespace vg
