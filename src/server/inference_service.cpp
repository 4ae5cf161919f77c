// InferenceService (see inference_service.hpp): device, model, memory profile,
// engine wiring, request validation, watchdog health and admission state.
#include "server/inference_service.hpp"

#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>

#include "device/device.hpp"
#include "admission/admission_policy.hpp"
#include "engine/engine.hpp"
#include "model/model.hpp"
#include "model/tokenizer.hpp"
#include "server/model_setup.hpp"
#include "tokenizer/chat_template.hpp"

namespace vg {

struct InferenceService::Entry {
  ModelInfo info;
  std::unique_ptr<Model> model;
  std::unique_ptr<Engine> engine;
  /// Chat format of /v1/chat/completions (--chat-template, else the model's
  /// tokenizer_config.json) and the BOS/EOS texts its templates write.
  std::optional<ChatFormat> chat_format;
  ChatTokens chat_tokens;
};

InferenceService::InferenceService(const ServeConfig& config) : config_(config) {}

InferenceService::~InferenceService() { shutdown(); }

Result<std::unique_ptr<InferenceService>> InferenceService::create(const ServeConfig& config,
                                                                  metrics::ServerMetrics* metrics) {
  std::unique_ptr<InferenceService> svc(new InferenceService(config));
  auto setup = load_profiled_model(config);
  if (!setup.ok()) return std::move(setup).error();
  svc->device_ = std::move(setup->device);
  auto entry = std::make_unique<Entry>();
  entry->model = std::move(setup->model);
  Result<ChatTemplateFile> chat_file = read_chat_template(config.model_dir);
  if (!chat_file.ok()) return std::move(chat_file).error();
  entry->chat_tokens = chat_file->tokens;
  entry->chat_format = config.chat_template.empty() ? detect_chat_format(chat_file->jinja)
                                                    : parse_chat_format(config.chat_template);
  if (entry->chat_format) {
    spdlog::info("chat format: {}", chat_format_name(*entry->chat_format));
  } else {
    spdlog::info("chat format: none known (/v1/chat/completions needs a request chat_template){}",
                 chat_file->jinja.empty() ? "" : "; the model's chat_template is not one of chatml, llama-2, llama-3, zephyr");
  }
  const MemoryProfile& profile = setup->profile;
  const std::int64_t budget = setup->budget_bytes;
  const std::int64_t reserve = setup->reserve_bytes;
  const ModelConfig& mc = entry->model->config();
  const DeviceMemory mem = svc->device_->memory();
  entry->info.id = setup->id;
  entry->info.family = mc.family;
  entry->info.dtype = mc.dtype;
  entry->info.context_length = mc.n_positions;
  entry->info.parameter_count = entry->model->parameter_count();
  entry->info.device = svc->device_->name();
  entry->info.resident_bytes = profile.resident_bytes;
  entry->info.workspace_bytes = profile.workspace_bytes;
  entry->info.kv_bytes_per_token = profile.kv_bytes_per_token;
  entry->info.sequence_overhead_bytes = profile.sequence_overhead_bytes;
  entry->info.safety_factor = profile.safety_factor;
  entry->info.created = std::chrono::duration_cast<std::chrono::seconds>(
                            std::chrono::system_clock::now().time_since_epoch())
                            .count();
  spdlog::info("model '{}' ({}, {} layers, {} wide, context {}, {} parameters) loaded on {}", entry->info.id,
               mc.family, mc.n_layer, mc.n_embd, mc.n_positions, entry->info.parameter_count, svc->device_->name());
  spdlog::info("budget of {}: {} = {} capacity x {} - {} resident - {} workspace - {} reserve", svc->device_->name(),
               format_bytes(budget), format_bytes(mem.capacity), config.memory_utilization,
               format_bytes(profile.resident_bytes), format_bytes(profile.workspace_bytes), format_bytes(reserve));
  const std::int64_t smallest = request_cost(profile, 1, 1);
  if (budget < smallest && config.admission != "none") {
    return Error(ErrorCode::kConfig,
                 "the budget of " + svc->device_->name() + " (" + format_bytes(budget) +
                     ") cannot hold even a 2-token request (" + format_bytes(smallest) +
                     "): give the device more capacity, or lower --memory-reserve or raise --memory-utilization");
  }
  const std::int64_t full = request_cost(profile, mc.n_positions, 0);
  if (budget < full) {
    spdlog::warn("a full-context request ({} tokens) costs {} and does not fit the budget {}: such requests get 413",
                 mc.n_positions, format_bytes(full), format_bytes(budget));
  }

  Engine::Options eo;
  eo.admission.policy = *parse_admission_policy(config.admission);
  eo.admission.budget_bytes = budget;
  eo.admission.max_queue = config.max_queue;
  eo.admission.queue_timeout = std::chrono::duration_cast<Duration>(std::chrono::duration<double>(config.queue_timeout_s));
  eo.admission.max_bypass = std::chrono::duration_cast<Duration>(std::chrono::duration<double>(config.max_bypass_s));
  eo.admission.priority_aging =
      std::chrono::duration_cast<Duration>(std::chrono::duration<double>(config.priority_aging_s));
  eo.profile = profile;
  eo.max_batch = config.max_batch;
  eo.max_batch_tokens = config.max_batch_tokens;
  eo.oom_governor.decrease_factor = config.oom_decrease_factor;
  eo.oom_governor.floor_fraction = config.oom_budget_floor;
  eo.oom_governor.quiet_period =
      std::chrono::duration_cast<Duration>(std::chrono::duration<double>(config.oom_quiet_period_s));
  eo.oom_governor.increase_step = config.oom_increase_step;
  eo.step_delay_ms = config.test_step_delay_ms;
  eo.inject_oom_at_step = config.test_inject_oom_step;
  eo.inject_oom_count = config.test_inject_oom_count;
  eo.max_preemptions = config.max_preemptions;
  eo.oom_unready_after = config.oom_unready_after;
  eo.metrics = metrics;
  auto engine = Engine::create(eo, *entry->model, *svc->device_);
  if (!engine.ok()) return std::move(engine).error();
  entry->engine = std::move(engine).value();
  svc->entries_.push_back(std::move(entry));
  return svc;
}

Result<Submission> InferenceService::submit(const CompletionRequest& request, std::shared_ptr<EventSink> sink) {
  Entry* entry = nullptr;
  if (request.model.empty()) {
    entry = entries_.front().get();
  } else {
    for (auto& e : entries_) {
      if (e->info.id == request.model) entry = e.get();
    }
  }
  if (!entry) {
    std::string names;
    for (auto& e : entries_) names += (names.empty() ? "" : ", ") + e->info.id;
    return Error(ErrorCode::kModelNotFound, "model '" + request.model + "' not found; available: " + names);
  }
  if (draining_.load()) {
    Error e(ErrorCode::kOverloaded, "server is shutting down");
    e.retry_after_s = 1.0;
    return e;
  }
  const ModelConfig& mc = entry->model->config();
  const Tokenizer& tok = entry->model->tokenizer();

  GenerationRequest gen;
  std::vector<std::string> stop = request.stop;
  std::string chat_prompt;
  if (request.chat) {
    Result<RenderedChat> chat = render_chat_request(request.chat->messages, request.chat->chat_template,
                                                    entry->chat_format, entry->chat_tokens, entry->info.id);
    if (!chat.ok()) return std::move(chat).error();
    chat_prompt = std::move(chat->prompt);
    // The end-of-turn text stops generation where the vocabulary has no such
    // special token (then the template is plain text); a special token ends it
    // through the tokenizer's end ids.
    if (std::find(stop.begin(), stop.end(), chat->stop) == stop.end()) stop.push_back(chat->stop);
  }
  if (const auto* text = request.chat ? &chat_prompt : std::get_if<std::string>(&request.prompt)) {
    if (!tok.encodes_text()) {
      return Error(ErrorCode::kInvalidRequest, "model '" + entry->info.id +
                                                   "' has no tokenizer vramgate can read: send prompt as a list of "
                                                   "token ids");
    }
    gen.prompt = tok.encode(*text);
    // A chat template writes its own BOS text; a plain text prompt gets the BOS
    // the tokenizer asks for (LLaMA), as Hugging Face's encode does.
    if (!request.chat && tok.adds_bos() && tok.bos_id()) gen.prompt.insert(gen.prompt.begin(), *tok.bos_id());
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
    return Error(ErrorCode::kInvalidRequest,
                 "prompt (" + std::to_string(gen.prompt.size()) + " tokens) + max_tokens (" +
                     std::to_string(request.max_tokens) + ") = " + std::to_string(total) +
                     " exceeds the context length of model '" + entry->info.id + "' (" +
                     std::to_string(mc.n_positions) + " tokens)");
  }
  gen.id = request.request_id.empty() ? "req-" + std::to_string(next_id_.fetch_add(1)) : request.request_id;
  gen.max_tokens = request.max_tokens;
  gen.sampling = request.sampling;
  gen.stop = std::move(stop);
  gen.ignore_eos = request.ignore_eos;
  gen.priority = request.priority.value_or(Priority::kNormal);
  double timeout = config_.request_timeout_s;
  if (request.timeout_s) timeout = std::min(timeout, *request.timeout_s);
  gen.deadline = Clock::now() + std::chrono::duration_cast<Duration>(std::chrono::duration<double>(timeout));

  Submission sub;
  sub.model = entry->info.id;
  sub.prompt_tokens = static_cast<int>(gen.prompt.size());
  sub.cost_bytes = entry->engine->cost(sub.prompt_tokens, gen.max_tokens);
  auto handle = entry->engine->submit(std::move(gen), std::move(sink), &sub.queue_position);
  if (!handle.ok()) return std::move(handle).error();
  sub.handle = std::move(handle).value();
  return sub;
}

std::vector<ModelInfo> InferenceService::models() const {
  std::vector<ModelInfo> out;
  for (auto& e : entries_) out.push_back(e->info);
  return out;
}

bool InferenceService::healthy(std::string* reason) const { return healthy_at(Clock::now(), reason); }

bool InferenceService::healthy_at(TimePoint now, std::string* reason) const {
  const auto limit = std::chrono::duration<double>(config_.watchdog_timeout_s);
  for (auto& e : entries_) {
    const std::optional<Duration> busy = e->engine->busy_for(now);
    if (!busy || *busy <= limit) continue;
    if (reason) {
      *reason = fmt::format("engine on {} stuck in a step for {:.0f} s", e->info.device,
                            std::floor(std::chrono::duration<double>(*busy).count()));
    }
    return false;
  }
  return true;
}

bool InferenceService::ready() const { return not_ready_reason().empty(); }

std::string InferenceService::not_ready_reason() const {
  if (entries_.empty()) return "models loading";
  if (draining_.load()) return "server draining";
  const TimePoint now = Clock::now();
  std::string reason;
  for (auto& e : entries_) {
    if (!e->engine->ready(now, &reason)) return reason;
  }
  return {};
}

AdmissionState InferenceService::admission_state() const {
  AdmissionState st;
  st.policy = config_.admission;
  st.draining = draining_.load();
  const DeviceMemory mem = device_->memory();
  DeviceState ds;
  ds.name = device_->name();
  ds.capacity_bytes = mem.capacity;
  ds.used_bytes = mem.used;
  ds.peak_bytes = mem.peak;
  ds.allocated_bytes = mem.allocated;
  ds.cache_reserved_bytes = mem.cache_reserved;
  for (auto& e : entries_) {
    const EngineStats es = e->engine->stats();
    const AdmissionSnapshot as = e->engine->admission();
    st.queue_depth += as.queue_depth;
    st.running += es.running;
    st.admitted += as.counters.admitted;
    st.rejected_never_fits += as.counters.rejected_never_fits;
    st.rejected_queue_full += as.counters.rejected_queue_full;
    st.queue_timeouts += as.counters.queue_timeout;
    st.deadline_expired += as.counters.deadline_expired;
    st.cancelled_queued += as.counters.cancelled;
    st.cancelled += es.cancelled;
    st.completed += es.completed;
    st.failed += es.failed;
    st.out_of_memory += es.out_of_memory;
    st.oom_budget_cuts += es.oom_budget_cuts;
    st.preemptions += es.preemptions;
    st.not_ready_trips += es.not_ready_trips;
    ds.ready = ds.ready && e->engine->ready(Clock::now());
    ds.budget_bytes += as.budget_bytes;
    ds.effective_budget_bytes += as.effective_budget_bytes;
    ds.reserved_bytes += as.reserved_bytes;
    ds.peak_reserved_bytes += as.peak_reserved_bytes;
    ds.resident_bytes += e->info.resident_bytes;
    ds.workspace_bytes += e->info.workspace_bytes;
  }
  st.devices.push_back(ds);
  return st;
}

void InferenceService::begin_drain() {
  draining_.store(true);
  for (auto& e : entries_) e->engine->begin_drain();
}

bool InferenceService::wait_idle(TimePoint deadline) const {
  bool idle = true;
  for (auto& e : entries_) idle = e->engine->wait_idle(deadline) && idle;
  return idle;
}

void InferenceService::shutdown() {
  for (auto& e : entries_) {
    if (e->engine) e->engine->shutdown();
  }
}

}  // namespace vg
