// The Service behind the HTTP layer: owns the devices, a replica of every
// model on each device and one engine per (device, model), all drawing from
// one admission front (one queue; a request runs on the device where it fits
// with the most free budget). Resolves the model of a request, tokenizes and
// range-checks it against the model, and submits it. Thread-safe (see Service).
#pragma once

#include <atomic>
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
  explicit InferenceService(const ServeConfig& config);
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
