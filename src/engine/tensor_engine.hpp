// TensorEngine: serves one TorchScript model on one device with dynamic
// batching by bytes. Requests are admitted through the same admission front
// as the language-model engines (one queue, each device's budget, deadlines,
// 503 + Retry-After, leases): each request reserves the cost of its own
// forward pass (predicted peak x --memory-safety, tensor_cost.hpp), so the
// requests granted at once, and hence a batch, never pass the free budget.
// The engine thread batches granted requests of equal shape (every
// non-batch dimension equal, except the model's paddable ones, which are
// zero-padded to the batch's largest) up to --max-batch; a partial batch
// waits at most --max-batch-delay-ms for more. A padded batch may be
// predicted to peak above its requests' leases together: it runs only when
// the device's free budget holds the difference, reserved for the pass
// (AdmissionController::reserve_extra); otherwise fewer requests join it
// (tensor_batch.hpp). A batch that runs out of memory is split in
// halves and retried (the OOM governor cuts the budget); a single request
// that still fails gets kOverloaded + Retry-After.
//
// Threads: submit(), cancel (TensorHandle), stats() and the drain calls from
// any thread, never blocking on compute. The model is touched only by the
// engine thread, inside a DeviceScope for its device.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "admission/admission_controller.hpp"
#include "admission/memory_profile.hpp"
#include "admission/oom_governor.hpp"
#include "admission/tensor_cost.hpp"
#include "api/counters.hpp"
#include "api/types.hpp"
#include "common/clock.hpp"
#include "common/error.hpp"
#include "common/priority.hpp"
#include "engine/engine.hpp"
#include "model/tensor_spec.hpp"

namespace vg {

class Device;
class TorchScriptModel;
namespace metrics {
class ServerMetrics;
}
struct TensorRegistry;

/// One inference request, its inputs checked (check_inputs) and in the
/// declared order.
struct TensorRequest {
  std::string id;
  std::vector<HostTensor> inputs;
  std::optional<TimePoint> deadline;  ///< total limit (-> kTimeout), queued or granted
  Priority priority = Priority::kNormal;
};

struct TensorEngineStats {
  /// Its part of the service's counters (api/counters.hpp): kCompleted,
  /// kFailed, kCancelled, kOutOfMemory (forward passes), kOomBudgetCuts.
  Counters counters;
  std::int64_t batches = 0;        ///< forward passes that succeeded
  std::int64_t batched_requests = 0;  ///< requests those passes computed
  int largest_batch = 0;
  int running = 0;  ///< granted, not yet finished
};

/// The tensor requests queued in one front (shared by its tensor engines).
/// Made once per front by make_tensor_registry().
std::shared_ptr<TensorRegistry> make_tensor_registry(std::shared_ptr<EngineFront> front);

class TensorEngine {
 public:
  struct Options {
    AdmissionPolicy policy;
    std::int64_t budget_bytes = 0;   ///< its device's budget (the OOM governor's base)
    /// What that budget was worked out from (device_budget): with it the
    /// effective budget follows the bytes other processes hold, measured
    /// before each grant; nullopt: it stays budget_bytes.
    std::optional<DeviceBudgetInputs> budget_inputs;
    TensorMemoryProfile profile;     ///< cost = tensor_cost(profile, elements of the request)
    int max_batch = 8;               ///< requests in one forward pass (>= 1)
    double max_batch_delay_ms = 2;   ///< wait for more before a partial batch (>= 0)
    OomGovernorOptions oom_governor;
    double step_delay_ms = 0;        ///< test hook: sleep after each forward pass
    /// Test hook: forward pass number (1-based, every attempt counted) at
    /// which the device's next allocation fails with out-of-memory; 0 = never.
    std::int64_t inject_oom_at_pass = 0;
    std::int64_t inject_oom_count = 1;  ///< test hook: consecutive passes that fail so (>= 1)
    /// Where the engine thread records queue wait, duration, batch size and
    /// outcomes (labelled `model_name`); null: nothing recorded. Must
    /// outlive the engine.
    metrics::ServerMetrics* metrics = nullptr;
    std::string model_name;
  };

  /// Starts the engine thread for engine `index` of the front's topology.
  /// `model` and `device` must outlive the engine. Errors: kConfig.
  static Result<std::unique_ptr<TensorEngine>> create(const Options& options, TorchScriptModel& model, Device& device,
                                                      std::shared_ptr<EngineFront> front,
                                                      std::shared_ptr<TensorRegistry> registry, int index);
  ~TensorEngine();
  TensorEngine(const TensorEngine&) = delete;
  TensorEngine& operator=(const TensorEngine&) = delete;

  /// Bytes `request` reserves: tensor_cost of its input elements.
  std::int64_t cost(const TensorRequest& request) const;

  /// Queues the request (for any engine of this engine's model). Errors,
  /// nothing queued and `done` never called: kExceedsDeviceMemory (needed and
  /// budget bytes), kOverloaded (queue full or draining; retry_after_s).
  /// `*queue_position`: the position on entry (1 = next).
  Result<std::shared_ptr<TensorHandle>> submit(TensorRequest request, TensorDone done, int* queue_position = nullptr);

  void begin_drain();
  /// True once nothing of this engine is granted or running (queued requests
  /// are the front's), or false at `deadline`.
  bool wait_idle(TimePoint deadline) const;
  /// Stops the thread after the pass in progress; what it holds fails with
  /// kOverloaded "shutting down". Idempotent.
  void request_stop();
  void shutdown();
  TensorEngineStats stats() const;
  /// The front's admission state (every device, the one queue).
  AdmissionSnapshot admission() const;

 private:
  struct Impl;
  explicit TensorEngine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace vg
