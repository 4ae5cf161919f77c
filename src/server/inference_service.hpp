// The Service behind the HTTP layer: owns the device, the loaded model and
// its engine; resolves the model of a request, tokenizes and range-checks it
// against the model, and submits it. Thread-safe (see Service).
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "common/clock.hpp"
#include "config/config.hpp"
#include "server/service.hpp"

namespace vg {

class Device;
class Engine;
class Model;
namespace metrics {
class ServerMetrics;
}

class InferenceService final : public Service {
 public:
  /// Creates the device, loads the model (errors: kConfig, kModelLoad) and
  /// starts its engine, which records into `metrics` (optional; must
  /// outlive the service).
  static Result<std::unique_ptr<InferenceService>> create(const ServeConfig& config,
                                                          metrics::ServerMetrics* metrics = nullptr);
  ~InferenceService() override;

  Result<Submission> submit(const CompletionRequest& request, std::shared_ptr<EventSink> sink) override;
  std::vector<ModelInfo> models() const override;
  bool healthy(std::string* reason) const override;
  bool ready() const override;
  std::string not_ready_reason() const override;
  AdmissionState admission_state() const override;

  /// Liveness at `now`: false (with `reason`) when an engine has been in one
  /// step longer than the watchdog timeout.
  bool healthy_at(TimePoint now, std::string* reason) const;

  /// Staged shutdown: readiness turns 503 and new requests get 503.
  void begin_drain();
  /// Waits until no work is queued or running, or until `deadline`.
  bool wait_idle(TimePoint deadline) const;
  /// Cancels what is left and stops the engines. Idempotent.
  void shutdown();

 private:
  struct Entry;
  explicit InferenceService(const ServeConfig& config);

  ServeConfig config_;
  std::unique_ptr<Device> device_;
  std::vector<std::unique_ptr<Entry>> entries_;
  std::atomic<bool> draining_{false};
  std::atomic<std::uint64_t> next_id_{1};
};

}  // namespace vg
