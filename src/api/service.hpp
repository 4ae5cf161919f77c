// The interface the HTTP layer calls: submit a completion, list models,
// report health/readiness, and the lifecycle every server mode drives the
// same way (begin_drain, wait_idle, shutdown). Implemented in one process by
// server/inference_service (the engines), across processes by
// gateway/remote_service (engine processes over their sockets) and by
// queue/queue_service (Redis); faked in HTTP unit tests. All methods are
// thread-safe and never block on compute.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "api/events.hpp"
#include "api/types.hpp"
#include "common/clock.hpp"
#include "common/error.hpp"

namespace vg {

/// A submitted request as the HTTP layer sees it.
struct Submission {
  std::shared_ptr<RequestHandle> handle;
  std::string model;      ///< resolved model id
  int prompt_tokens = 0;
  int queue_position = 0; ///< on entry (0 = started at once)
  std::int64_t cost_bytes = 0;  ///< device bytes the request reserves (admission cost)
  /// With echo: the prompt as text (a text prompt as sent; token ids decoded).
  std::string echo_text{};
  /// A retry that took its booked place: "token", "idempotency_key" or "body".
  std::string retry_claimed_by{};
  /// Redis mode: "attached" or "replayed" when another gateway's request
  /// with the same Idempotency-Key answers this one; empty otherwise.
  std::string idempotency{};
  /// A stream's headers wait for the request's first event other than a
  /// failure (an engine accepted it, queued or running): set when an error
  /// the service only learns later (an engine taking the request from a
  /// shared queue refuses it, or none takes it in time) must still be an
  /// HTTP status, not an SSE event.
  bool defer_stream_start = false;
};

/// A submitted tensor inference request.
struct TensorSubmission {
  std::shared_ptr<TensorHandle> handle;
  std::string model;
  int queue_position = 0;
  std::int64_t cost_bytes = 0;  ///< device bytes reserved: the predicted peak of its forward pass x --memory-safety
};

class Service {
 public:
  virtual ~Service() = default;
  /// Validates against the model (context length), tokenizes and queues the
  /// request. Events then arrive on `sink`. Errors (nothing queued):
  /// kModelNotFound, kInvalidRequest, kExceedsDeviceMemory, kOverloaded.
  virtual Result<Submission> submit(const CompletionRequest& request, std::shared_ptr<EventSink> sink) = 0;
  /// submit() of a request that continues from `resume`. Errors as
  /// submit(), and kInvalidRequest for resumed tokens outside the
  /// vocabulary or more than max_tokens, or n > 1. Only engines resume: this
  /// default refuses anything but a fresh start (kInvalidRequest).
  virtual Result<Submission> submit_resumed(const CompletionRequest& request, const ResumeFrom& resume,
                                            std::shared_ptr<EventSink> sink) {
    if (!resume.tokens.empty() || resume.prompt_sent || resume.admitted_before) {
      return Error(ErrorCode::kInvalidRequest, "this service does not resume requests");
    }
    return submit(request, std::move(sink));
  }
  virtual std::vector<ModelInfo> models() const = 0;
  /// Liveness: false with a reason when an engine is stuck.
  virtual bool healthy(std::string* reason) const = 0;
  /// Readiness: models loaded and not draining.
  virtual bool ready() const = 0;
  /// Why ready() is false (for the /ready body); empty when ready.
  virtual std::string not_ready_reason() const { return ready() ? std::string() : "models loading or server draining"; }
  /// Live admission state for GET /v1/admission.
  virtual AdmissionState admission_state() const = 0;
  /// The engine processes behind the service (GET /v1/engines).
  virtual std::vector<EngineInfo> engine_processes() const { return {}; }
  /// Checks a tensor request against its TorchScript model and queues it;
  /// `done` is called once with the outputs or the error. Errors (nothing
  /// queued, `done` never called): kModelNotFound (also for a language
  /// model), kInvalidRequest naming the input, kExceedsDeviceMemory,
  /// kOverloaded.
  virtual Result<TensorSubmission> submit_tensor(TensorInferRequest request, TensorDone done) {
    (void)done;
    return Error(ErrorCode::kModelNotFound, "model '" + request.model + "' is not a tensor model");
  }
  /// The TorchScript model `name`, or kModelNotFound.
  virtual Result<TensorModelInfo> tensor_model(const std::string& name) const {
    return Error(ErrorCode::kModelNotFound, "model '" + name + "' is not a tensor model");
  }

  // Lifecycle: the staged shutdown (server/http_front.hpp) calls these in
  // order, from its own thread, once each.
  /// Stage 1: not ready from now on, and new requests are refused with 503
  /// and Retry-After; work already accepted goes on.
  virtual void begin_drain() = 0;
  /// Stage 2: true once nothing accepted is still running; false at
  /// `deadline` otherwise. May be called repeatedly (in slices).
  virtual bool wait_idle(TimePoint deadline) const = 0;
  /// Stage 4: cancels what is left (each request gets its terminal error
  /// event) and stops the service's threads. Idempotent.
  virtual void shutdown() = 0;
};

}  // namespace vg
