// The Service behind the HTTP layer: owns the devices, a replica of every
// model on each device and one engine per (device, model), all drawing from
// one admission front (one queue; a request runs on the device where it fits
// with the most free budget). Resolves the model of a request, tokenizes and
// range-checks it against the model, and submits it. Thread-safe (see Service).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "api/service.hpp"
#include "common/clock.hpp"
#include "config/config.hpp"

namespace vg {

class Device;
class Engine;
class Model;
class TensorEngine;
struct AdmissionTopology;
struct GenerationRequest;
struct ModelConfig;
struct ModelSource;
struct TensorRegistry;
namespace metrics {
class ServerMetrics;
}

class InferenceService final : public Service {
 public:
  /// Creates the devices, loads every model of --model-dir on each and starts
  /// their engines, which record into `metrics` (optional; must outlive the
  /// service). A device that fails to start is logged and left out (unhealthy
  /// in /v1/admission and /ready); errors (kConfig, kModelLoad) only when
  /// every device fails, with the first device's error.
  /// `on_poisoned` (optional): what an engine calls when a step's logits are
  /// not finite or a step fails with a device fault (Engine::Options::on_poisoned);
  /// an engine process exits from it.
  static Result<std::unique_ptr<InferenceService>> create(
      const ServeConfig& config, metrics::ServerMetrics* metrics = nullptr,
      std::function<void(const std::string&)> on_poisoned = nullptr);
  ~InferenceService() override;

  Result<Submission> submit(const CompletionRequest& request, std::shared_ptr<EventSink> sink) override;
  Result<Submission> submit_resumed(const CompletionRequest& request, const ResumeFrom& resume,
                                    std::shared_ptr<EventSink> sink) override;
  /// The text of a prompt sent as token ids (a gateway encodes prompts),
  /// decoded with its model's tokenizer; a text prompt as it is; empty for
  /// an unknown model or a chat. For the --test-crash-on-prompt hook. Any thread.
  std::string prompt_text(const CompletionRequest& request) const;
  std::vector<ModelInfo> models() const override;
  /// Sequences each engine runs at once (--max-batch, or the batch chosen at start-up for 0). Any thread.
  int max_batch() const { return config_.max_batch; }
  bool healthy(std::string* reason) const override;
  bool ready() const override;
  std::string not_ready_reason() const override;
  AdmissionState admission_state() const override;
  /// One entry: this process ("in-process").
  std::vector<EngineInfo> engine_processes() const override;
  Result<TensorSubmission> submit_tensor(TensorInferRequest request, TensorDone done) override;
  Result<TensorModelInfo> tensor_model(const std::string& name) const override;

  /// Liveness at `now`: false (with `reason`) when an engine has been in one
  /// step longer than the watchdog timeout.
  bool healthy_at(TimePoint now, std::string* reason) const;

  /// Staged shutdown: readiness turns 503 and new requests get 503.
  void begin_drain() override;
  /// Waits until no work is queued or running, or until `deadline`.
  bool wait_idle(TimePoint deadline) const override;
  /// Cancels what is left and stops the engines. Idempotent.
  void shutdown() override;

 private:
  struct DeviceEntry;
  struct ModelEntry;
  /// What the engines that create() starts share (inference_service_setup.cpp).
  struct EngineStart;
  explicit InferenceService(const ServeConfig& config);

  // The steps of create(), in order.
  /// Loads every model on each device of --device (into devices_): the
  /// serving devices, or the first device's error when none serves. A device
  /// that fails is left out (logged where there are several).
  Result<std::vector<DeviceEntry*>> load_devices(const std::vector<ModelSource>& sources);
  /// --max-batch 0: the smallest batch a serving device chose.
  void choose_max_batch(const std::vector<DeviceEntry*>& serving);
  /// The entries of models_ (what /v1/models shows, the chat formats), one per source.
  Status add_models(const std::vector<ModelSource>& sources, const std::vector<DeviceEntry*>& serving);
  void add_tensor_model(const ModelSource& source, std::size_t m, const std::vector<DeviceEntry*>& serving);
  Status add_language_model(const ModelSource& source, std::size_t m, const std::vector<DeviceEntry*>& serving);
  /// Logs each device whose budget cannot hold a full-context request of model `m`.
  static void warn_full_context_unfit(const ModelInfo& info, const ModelConfig& mc, std::size_t m,
                                      const std::vector<DeviceEntry*>& serving);
  static double slowest_step_seconds(const std::vector<DeviceEntry*>& serving);
  /// One admission engine per (serving device, model), running at most its max batch.
  AdmissionTopology admission_topology(const std::vector<ModelSource>& sources,
                                       const std::vector<DeviceEntry*>& serving, const AdmissionPolicy& policy) const;
  /// One engine per (serving device, model), in the topology's order.
  Status start_engines(EngineStart& start);
  Status start_tensor_engine(EngineStart& start, DeviceEntry& d, std::size_t m);
  Status start_engine(EngineStart& start, DeviceEntry& d, std::size_t m);

  // The steps of submit_resumed().
  /// The prompt's token ids: a text or chat prompt encoded (its end-of-turn
  /// text added to `stop`), ids range-checked; an empty prompt is the end of
  /// text alone.
  static Result<std::vector<std::int32_t>> prompt_ids(const ModelEntry& entry, const CompletionRequest& request,
                                                      std::vector<std::string>& stop);
  /// The request against its model and the flags: n, logit_bias ids and
  /// what it resumes from (no more tokens than `max_tokens`, fitted to the
  /// context by fit_max_tokens()).
  Status check_request(const ModelEntry& entry, const CompletionRequest& request, int max_tokens,
                       const ResumeFrom& resume) const;
  /// n within --max-n, and within --max-batch where admission runs.
  Status check_choices(const CompletionRequest& request) const;
  /// The engine's request, generating up to `max_tokens` (a fresh id unless
  /// the client named one; the deadline of --request-timeout or the
  /// request's shorter timeout).
  GenerationRequest generation_request(const CompletionRequest& request, int max_tokens, const ResumeFrom& resume,
                                       std::vector<std::int32_t> prompt, std::vector<std::string> stop);
  /// The first ready engine of the model, else its first.
  static Engine* ready_engine(const ModelEntry& entry);

  /// Every engine, device by device.
  std::vector<Engine*> engines() const;
  std::vector<TensorEngine*> tensor_engines() const;
  /// The model named `name` (empty: the first language model), or kModelNotFound.
  Result<ModelEntry*> find_model(const std::string& name) const;

  ServeConfig config_;
  std::vector<std::unique_ptr<DeviceEntry>> devices_;  // destroyed after models_ (which point into them)
  std::vector<std::unique_ptr<ModelEntry>> models_;
  std::shared_ptr<TensorRegistry> tensor_registry_;  ///< the tensor requests queued in the front
  std::atomic<bool> draining_{false};
  std::atomic<std::uint64_t> next_id_{1};
  double started_at_ = 0;  ///< unix seconds when create() began
};

}  // namespace vg
