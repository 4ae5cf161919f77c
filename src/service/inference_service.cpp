// InferenceService (see inference_service.hpp): request validation and
// submission, watchdog health, readiness, drain and shutdown. Start-up is in
// inference_service_setup.cpp.
#include "service/inference_service.hpp"

#include <unistd.h>

#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <thread>
#include <utility>

#include "admission/admission_policy.hpp"
#include "device/device.hpp"
#include "engine/engine.hpp"
#include "engine/tensor_engine.hpp"
#include "engine/text_stream.hpp"
#include "model/model.hpp"
#include "model/torchscript_model.hpp"
#include "service/inference_service_entries.hpp"
#include "service/model_setup.hpp"
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

/// "`what` token id `id` is outside the vocabulary 0..`vocab_size - 1`".
Error outside_vocabulary(const char* what, std::int32_t id, int vocab_size) {
  return Error(ErrorCode::kInvalidRequest, std::string(what) + " token id " + std::to_string(id) +
                                               " is outside the vocabulary 0.." + std::to_string(vocab_size - 1));
}

/// A resumed request has one choice, and its tokens are in the vocabulary
/// and no more than `max_tokens`.
Status check_resume(const CompletionRequest& request, int max_tokens, const ResumeFrom& resume, int vocab_size) {
  if (resume.tokens.empty()) return Status::Ok();
  if (request.n != 1) return Error(ErrorCode::kInvalidRequest, "a resumed request has one choice");
  for (std::int32_t id : resume.tokens) {
    if (id < 0 || id >= vocab_size) {
      return Error(ErrorCode::kInvalidRequest, "resumed token id " + std::to_string(id) + " is outside the vocabulary");
    }
  }
  if (static_cast<long>(resume.tokens.size()) > max_tokens) {
    return Error(ErrorCode::kInvalidRequest, "a resumed request has more tokens than its max_tokens");
  }
  return Status::Ok();
}

/// How a resumed request whose delivered tokens already end it (its end was
/// lost with the engine that ran it) finished: "stop" or "length"; null when
/// it goes on, or was not resumed.
const char* resumed_finish_reason(const Tokenizer& tok, const GenerationRequest& gen) {
  if (gen.resume_generated.empty()) return nullptr;
  TextStream replay(gen.stop);
  for (std::int32_t t : gen.resume_generated) (void)replay.push(tok.token_bytes(t));
  if (replay.stopped() || (tok.is_eos(gen.resume_generated.back()) && !gen.ignore_eos)) return "stop";
  if (static_cast<int>(gen.resume_generated.size()) >= gen.max_tokens) return "length";
  return nullptr;
}

/// Ends `gen` at submit with `reason`, nothing resent: `sink` gets its start and its end.
Submission finished_at_submit(Submission sub, const GenerationRequest& gen, const char* reason, EventSink& sink) {
  sub.handle = std::make_shared<FinishedHandle>(gen.id);
  FinishedEvent done;
  done.finish_reason = reason;
  done.usage = {sub.prompt_tokens, static_cast<int>(gen.resume_generated.size())};
  sink.push(StartedEvent{});
  sink.push(std::move(done));
  return sub;
}

}  // namespace

InferenceService::InferenceService(const ServeConfig& config) : config_(config) {}

InferenceService::~InferenceService() { shutdown(); }

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
  const Tokenizer& tok = entry->model->tokenizer();
  std::vector<std::string> stop = request.stop;
  Result<std::vector<std::int32_t>> prompt = prompt_ids(*entry, request, stop);
  if (!prompt.ok()) return std::move(prompt).error();
  const Result<int> max_tokens = fit_max_tokens(request, static_cast<std::int64_t>(prompt->size()),
                                                entry->model->config().n_positions, entry->info.id);
  if (!max_tokens.ok()) return max_tokens.error();
  if (Status st = check_request(*entry, request, *max_tokens, resume); !st.ok()) return st.error();
  GenerationRequest gen = generation_request(request, *max_tokens, resume, std::move(prompt).value(), std::move(stop));

  Engine* engine = ready_engine(*entry);
  Submission sub;
  sub.model = entry->info.id;
  sub.prompt_tokens = static_cast<int>(gen.prompt.size());
  if (const char* reason = resumed_finish_reason(tok, gen)) {
    return finished_at_submit(std::move(sub), gen, reason, *sink);
  }
  sub.cost_bytes = engine->cost(gen);
  const std::string* text = std::get_if<std::string>(&request.prompt);
  if (request.echo) sub.echo_text = text ? *text : tok.decode(gen.prompt);
  auto handle = engine->submit(std::move(gen), std::move(sink), &sub.queue_position, &sub.retry_claimed_by);
  if (!handle.ok()) return std::move(handle).error();
  sub.handle = std::move(handle).value();
  return sub;
}

Result<std::vector<std::int32_t>> InferenceService::prompt_ids(const ModelEntry& entry,
                                                               const CompletionRequest& request,
                                                               std::vector<std::string>& stop) {
  std::vector<std::int32_t> ids;
  const std::string* text = std::get_if<std::string>(&request.prompt);
  if (request.chat || text) {
    Result<EncodedPrompt> encoded =
        request.chat ? entry.prompts->encode_chat(request.chat->messages, request.chat->chat_template)
                     : entry.prompts->encode_text(*text);
    if (!encoded.ok()) return std::move(encoded).error();
    ids = std::move(encoded->ids);
    // The end-of-turn text stops generation where the vocabulary has no such
    // special token (then the template is plain text); a special token ends it
    // through the tokenizer's end ids.
    if (!encoded->stop.empty() && std::find(stop.begin(), stop.end(), encoded->stop) == stop.end()) {
      stop.push_back(std::move(encoded->stop));
    }
  } else {
    ids = std::get<std::vector<std::int32_t>>(request.prompt);
    const int vocab_size = entry.model->config().vocab_size;
    for (std::int32_t id : ids) {
      if (id < 0 || id >= vocab_size) return outside_vocabulary("prompt", id, vocab_size);
    }
  }
  if (ids.empty()) {
    // An empty prompt starts a new document, as GPT-2 does with <|endoftext|>.
    const Tokenizer& tok = entry.model->tokenizer();
    if (!tok.eos_id()) return Error(ErrorCode::kInvalidRequest, "prompt must not be empty");
    ids.push_back(*tok.eos_id());
  }
  return ids;
}

Status InferenceService::check_request(const ModelEntry& entry, const CompletionRequest& request, int max_tokens,
                                       const ResumeFrom& resume) const {
  const ModelConfig& mc = entry.model->config();
  if (Status st = check_choices(request); !st.ok()) return st;
  for (const auto& [id, bias] : request.sampling.logit_bias) {
    if (id < 0 || id >= mc.vocab_size) return outside_vocabulary("logit_bias", id, mc.vocab_size);
  }
  return check_resume(request, max_tokens, resume, mc.vocab_size);
}

Status InferenceService::check_choices(const CompletionRequest& request) const {
  if (request.n < 1 || request.n > config_.max_n) {
    return Error(ErrorCode::kInvalidRequest, "n must be between 1 and " + std::to_string(config_.max_n) +
                                                 " (--max-n); got " + std::to_string(request.n));
  }
  if (request.n > config_.max_batch && config_.admission_policy().kind != AdmissionPolicy::Kind::kNone) {
    return Error(ErrorCode::kInvalidRequest, "n (" + std::to_string(request.n) + ") exceeds --max-batch (" +
                                                 std::to_string(config_.max_batch) +
                                                 "): the choices of a request run together");
  }
  return Status::Ok();
}

GenerationRequest InferenceService::generation_request(const CompletionRequest& request, int max_tokens,
                                                       const ResumeFrom& resume, std::vector<std::int32_t> prompt,
                                                       std::vector<std::string> stop) {
  GenerationRequest gen;
  gen.prompt = std::move(prompt);
  gen.id = request.request_id.empty() ? "req-" + std::to_string(next_id_.fetch_add(1)) : request.request_id;
  gen.max_tokens = max_tokens;
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
  return gen;
}

Engine* InferenceService::ready_engine(const ModelEntry& entry) {
  // Any ready engine of the model takes the submission into the shared
  // queue; admission then places it. With none ready, the first engine's
  // refusal (503 + Retry-After) answers.
  const TimePoint now = Clock::now();
  for (Engine* e : entry.engines) {
    if (e->ready(now)) return e;
  }
  return entry.engines.front();
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
        *reason = fmt::format("engine on {} stuck in a step for {:.0f} s", d->name, std::floor(to_seconds(*busy)));
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
