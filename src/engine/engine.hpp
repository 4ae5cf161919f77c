// The per-device engine: one thread that owns a model replica and its KV
// caches, and runs the loop  take queued work -> prefill -> decode step over
// all running sequences -> emit -> retire  until shut down.
//
// Threads: submit(), drain(), stats(), busy_for() and RequestHandle::cancel() may be
// called from any thread and never block on compute. Everything that touches
// the model runs on the engine thread, inside a DeviceScope for its device.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "admission/admission_controller.hpp"
#include "admission/kv_reservation.hpp"
#include "admission/memory_profile.hpp"
#include "admission/oom_governor.hpp"
#include "api/counters.hpp"
#include "api/events.hpp"
#include "common/clock.hpp"
#include "common/error.hpp"
#include "device/foreign_bytes_hook.hpp"
#include "model/sampler.hpp"

namespace vg {
namespace metrics {
class ServerMetrics;
}

class Device;
class Model;
class StepProfiler;

/// What the engines of several devices (and several models) share: one
/// AdmissionController with each device's budget and one queue, and the
/// requests waiting in it. Opaque; made by make_engine_front(). A request
/// submitted through any engine of its model runs on whichever engine
/// admission places it (the device where it fits with the most free budget).
struct EngineFront;

/// Makes the front for `topology` (kConfig on bad options or topology).
/// Then create one Engine per topology engine, passing the front and that
/// engine's index; an engine's max_running in the topology should be its
/// max batch (see Engine::Options).
Result<std::shared_ptr<EngineFront>> make_engine_front(const AdmissionOptions& options, AdmissionTopology topology);

/// For engines of other kinds (tensor_engine.hpp) that draw from the same
/// front as the language-model engines. Any thread.
/// The front's admission controller (one queue and budget per device).
AdmissionController& front_admission(EngineFront& front);
/// A fresh admission id, unique among the front's requests.
RequestId next_front_id(EngineFront& front);
/// `wake` is called whenever work may be granted (a submit, a cancel, a
/// lease release); it must not block.
void add_front_listener(EngineFront& front, std::function<void()> wake);
/// Expiries the language-model engines take from the queue for requests they
/// do not hold go to `handler` (called on their thread, outside their locks).
void set_front_other_expiry(EngineFront& front, std::function<void(AdmissionExpiry)> handler);
/// Wakes every engine of the front.
void notify_front(EngineFront& front);
/// Engine `index` of the front's topology (its device and model); kConfig
/// when there is none.
Result<AdmissionTopology::Engine> front_engine(EngineFront& front, int index);
/// Language-model engines whose thread runs (they expire the queue).
int front_language_engines(EngineFront& front);

/// One generation request, tokenized and validated against the model.
struct GenerationRequest {
  std::string id;
  std::vector<std::int32_t> prompt;  ///< 1..context tokens
  /// prompt + max_tokens <= context length; 0: the prompt is only prefilled
  /// (a scoring request, with prompt_logprobs) and nothing is generated.
  int max_tokens = 16;
  SamplingParams sampling;
  /// Choices to generate (OpenAI `n`, >= 1): admitted together under one
  /// lease (cost n x one sequence); the prompt is prefilled once and its KV
  /// cache copied to the others (each prefills its own with a prefill
  /// worker). Choice i samples with seed + i. Events carry the choice.
  int n = 1;
  /// Alternatives to report per generated token (0..20) in TextEvent::logprobs;
  /// nullopt: no logprobs.
  std::optional<int> logprobs;
  /// Report the prompt's tokens with their logprobs (a PromptEvent; echo).
  bool prompt_logprobs = false;
  std::vector<std::string> stop;
  bool ignore_eos = false;  ///< end-of-text does not end generation
  /// Total deadline (-> 504 timeout); checked while queued and at every step.
  std::optional<TimePoint> deadline;
  /// Admission class: higher classes are granted first (with aging).
  Priority priority = Priority::kNormal;
  /// Recognises a retry of a booked refusal and books this request's retry
  /// if it is refused as overloaded (empty fingerprint: neither).
  RetryIdentity retry;
  /// Tokens already generated and delivered before this request's engine
  /// process died (n == 1 only): the sequence starts as a preempted one
  /// would resume, with the sampler and the text stream replayed over them
  /// (nothing of them is sent again). Fewer than max_tokens.
  std::vector<std::int32_t> resume_generated{};
  /// Admitted before by an engine process that died while it ran there (a
  /// gateway's resubmission): counted as granted again, not admitted again
  /// (AdmissionCounters), and its end counts among the finished requests
  /// even when it ends in the queue.
  bool admitted_before = false;
};

/// Counters and gauges an engine publishes (a snapshot).
/// A paged KV cache's blocks and what they saved (docs/admission-and-memory.md,
/// "KV blocks"). Blocks are counted at the last loop turn; tokens since start.
struct KvPoolStats {
  std::optional<KvReservation> reservation;  ///< nullopt: no pool
  int block_tokens = 0;                      ///< positions per block
  std::int64_t blocks_total = 0;        ///< blocks in the pool (it shrinks and grows with the effective budget)
  std::int64_t blocks_used = 0;         ///< held by running sequences
  std::int64_t blocks_cached = 0;       ///< held by none, kept for the prefix cache (given out when needed)
  std::int64_t block_bytes = 0;         ///< device bytes of one block
  std::int64_t blocks_evicted = 0;      ///< cached blocks given to other sequences
  std::int64_t prompt_tokens = 0;       ///< context tokens of the sequences started (prompt, + generated when resumed)
  std::int64_t prefix_hit_tokens = 0;   ///< of which found in the prefix cache, not computed
  std::int64_t recomputed_tokens = 0;   ///< context tokens computed again after a preemption
  std::int64_t growth_preemptions = 0;  ///< preemptions because a growing sequence found no block
};

struct EngineStats {
  int queue_depth = 0;
  int running = 0;
  int max_running = 0;            ///< sequences its steps may run at once (max_batch; no limit: 2^20)
  /// Its part of the service's counters (api/counters.hpp): requests
  /// admitted (granted a lease once, here or before a preemption or an engine
  /// process's end) that ended here, once each whatever their n (kCompleted,
  /// kFailed: incl. timeouts and OOM, kCancelled: the client went away);
  /// kOutOfMemory steps, kOomBudgetCuts, kPreemptions, kNotReadyTrips. Those
  /// that never left the queue are in AdmissionCounters instead.
  Counters counters;
  std::int64_t rejected = 0;  ///< refused at submit (never fits, queue full, draining)
  std::int64_t generated_tokens = 0;
  std::int64_t steps = 0;
  std::int64_t kv_cache_bytes = 0;  ///< KV cache bytes held by running sequences
  std::int64_t effective_budget_bytes = 0;  ///< budget after OOM-governor cuts (policy memory; else the budget)
  std::int64_t oom_budget_raises = 0;  ///< times it raised it back after a quiet period
  std::int64_t budget_foreign_grew = 0;    ///< times other processes' growth lowered it
  std::int64_t budget_foreign_shrank = 0;  ///< times their shrinking raised it back
  std::int64_t foreign_bytes = 0;  ///< bytes others held on the device at the last loop turn (DeviceMemory::foreign)
  int consecutive_oom_steps = 0;   ///< out-of-memory steps since the last step that succeeded
  /// The KV block pool (Engine::Options::kv_pool); all 0 without one.
  KvPoolStats kv_pool;
};

/// The step profile (--profile-steps): a trace of the first `steps` decode
/// steps (steps with no prefill chunk) of at least `min_batch` decoding
/// sequences, recorded by `profiler` on the engine thread: the session starts
/// before the first such step and ends after the last, each recorded step in
/// a kDecodeStepRange range (steps between them that do not qualify run in
/// the session unmarked). Then the trace is written to `trace` and one info
/// line logged. Off (steps 0) it costs one comparison per step.
struct StepProfileOptions {
  int steps = 0;          ///< decode steps to record; 0 = off
  int min_batch = 1;      ///< decoding sequences a step needs to be recorded (>= 1)
  std::filesystem::path trace;  ///< where the Chrome-trace JSON goes (needed when steps > 0)
  /// Records the steps; needed when steps > 0. Only the engine thread calls it.
  std::shared_ptr<StepProfiler> profiler;
};

class Engine {
 public:
  struct Options {
    /// Policy, budget (bytes), queue limit, queue wait limit and max bypass.
    /// Its max_running is set from max_batch by create().
    AdmissionOptions admission;
    /// Per-request cost model: cost = request_cost(profile, prompt, max_tokens).
    MemoryProfile profile;
    int max_batch = 8;            ///< sequences in one step (>= 1; ignored under policy none)
    int max_batch_tokens = 512;   ///< tokens in one step: prefill chunks + one per decoding sequence
    /// Disaggregated prefill: a second compute thread (the prefill worker)
    /// prefills newly admitted prompts, in chunks of max_batch_tokens, while
    /// the engine thread runs decode steps; a sequence joins the decode
    /// batch once its first token is out. Time to first token is then one
    /// prefill, not a decode step plus a prefill. Two steps may run at once,
    /// so the device must set aside twice the step workspace (the caller's
    /// budget).
    bool prefill_worker = false;
    /// OOM governor (policy memory only): how a step's out-of-memory error
    /// cuts the effective budget and how quiet periods restore it.
    OomGovernorOptions oom_governor;
    /// What the device's budget was worked out from at start-up
    /// (device_budget). With it, each loop turn measures the bytes other
    /// processes hold on the device and (policy memory) lowers the effective
    /// budget by what they took, preempting the youngest sequences when what
    /// runs no longer fits, and raises it back when they free it; nullopt:
    /// the budget stays admission.budget_bytes.
    std::optional<DeviceBudgetInputs> budget_inputs;
    /// Test hook: another process takes and frees device memory
    /// (device/foreign_bytes_hook.hpp); empty = off.
    ForeignBytesHook test_foreign_bytes;
    /// Test hook: extra milliseconds slept by the engine thread after each
    /// step, so tests can hold requests running without sleeping themselves.
    double step_delay_ms = 0;
    /// Test hook: step number (1-based, counted over the engine's life, the
    /// prefill worker's steps included) at whose start the device's next
    /// allocation is made to fail with out-of-memory; 0 = never.
    std::int64_t inject_oom_at_step = 0;
    /// Test hook: how many consecutive steps from inject_oom_at_step fail (>= 1).
    std::int64_t inject_oom_count = 1;
    /// Test hook: bytes each out-of-memory recovery leaves allocated on the
    /// device (Device::hold_test_bytes), a planted leak; 0 = none.
    std::int64_t test_leak_bytes_on_oom = 0;
    /// OOM recovery (policies memory and fixed): times one request may be
    /// preempted and recomputed; one more out-of-memory error fails it with
    /// kOverloaded + Retry-After (>= 0).
    int max_preemptions = 3;
    /// Consecutive out-of-memory steps (no step succeeding in between) after
    /// which the device is marked not ready for oom_governor.quiet_period:
    /// no grants, new requests refused with kOverloaded (>= 1).
    int oom_unready_after = 5;
    /// A step whose logits contain NaN or Inf, or a step (or KV cache
    /// allocation) that fails with a device fault (kDeviceFault: a CUDA
    /// error other than out of memory, device/device_error.hpp), means the
    /// device or the model state is broken (a poisoned CUDA context,
    /// corrupted weights): this is called on the engine thread with the
    /// reason, before the token is used or the step's requests fail. An
    /// engine process exits from it so that its supervisor restarts it (the
    /// only way to a clean CUDA context) and resumes its requests. Null (one
    /// process, --in-process): the sequences fail with 500 (internal_error
    /// for NaN logits, device_fault for a fault) and the engine goes on; a
    /// context that stays broken fails each later step the same way.
    std::function<void(const std::string& reason)> on_poisoned;
    /// Test hook: the step with this number (1-based, over the engine's
    /// life) counts as having produced non-finite logits; 0 = never.
    std::int64_t test_poison_logits_at_step = 0;
    /// Test hook: at the start of the step with this number (1-based, over
    /// the engine's life) the device's next allocation fails as a CUDA fault
    /// does (Device::inject_device_fault); 0 = never.
    std::int64_t test_device_fault_at_step = 0;
    /// The step profile; off by default.
    StepProfileOptions step_profile;
    /// The model holds its KV caches in a block pool (Model::use_kv_pool,
    /// made by the caller, sized to admission.budget_bytes): leases are whole
    /// blocks, reserved by `reservation` (kv_reservation.hpp); prompts start
    /// from the blocks the prefix cache holds; the pool follows the
    /// effective budget down and back up. nullopt: each sequence allocates
    /// its worst-case cache through the device's allocator. Not with
    /// prefill_worker.
    struct KvPool {
      KvBlockGeometry geometry;
      KvReservation reservation = KvReservation::kOnDemand;
    };
    std::optional<KvPool> kv_pool;
    /// Where the engine thread records its observations (histograms,
    /// generated tokens); null records nothing. Must outlive the engine.
    metrics::ServerMetrics* metrics = nullptr;
  };

  /// Starts the engine thread. `model` and `device` must outlive the engine;
  /// from now on only the engine thread touches the model. Without `front`
  /// the engine has its own admission (one device, options.admission); with
  /// one it is engine `index` of the front's topology: the front's options
  /// apply, and options.admission.budget_bytes must be its device's budget
  /// (the OOM governor's base).
  static Result<std::unique_ptr<Engine>> create(const Options& options, Model& model, Device& device,
                                                std::shared_ptr<EngineFront> front = nullptr, int index = 0);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  /// Estimates the request's cost and queues it for admission (with a
  /// front: in the shared queue, for any engine of this engine's model). Errors
  /// (nothing queued, no event sent): kExceedsDeviceMemory when it can never
  /// fit (needed_bytes, budget_bytes); kOverloaded when the queue is full or
  /// the engine is draining (retry_after_s). On success `*queue_position` is
  /// the position on entry (1 = next), and `*retry_claimed_by` says how a
  /// retry that took its booked place was recognised ("" otherwise).
  Result<std::shared_ptr<RequestHandle>> submit(GenerationRequest request, std::shared_ptr<EventSink> sink,
                                                int* queue_position = nullptr,
                                                std::string* retry_claimed_by = nullptr);

  /// Refuses new requests from now on; queued and running work goes on.
  void begin_drain();
  /// Blocks until nothing is queued or running, or until `deadline`; returns
  /// whether that state was reached.
  bool wait_idle(TimePoint deadline) const;
  /// Cancels everything left (FailedEvent kOverloaded "shutting down") and
  /// joins the engine thread. Idempotent.
  void shutdown();
  /// The first half of shutdown(), without waiting: the engine thread stops
  /// after the step in progress and cancels what is left.
  void request_stop();

  EngineStats stats() const;
  /// Watchdog heartbeat: how long the engine thread has been in its current
  /// step at `now` (the step delay test hook counts as part of the step);
  /// nullopt while it waits for work. Any thread.
  std::optional<Duration> busy_for(TimePoint now) const;
  /// False while the device is marked not ready after repeated out-of-memory
  /// errors; `reason` (optional) then says why. Any thread.
  bool ready(TimePoint now, std::string* reason = nullptr) const;
  /// Admission state (budget, reserved, queue): of the whole front when the
  /// engine shares one (AdmissionSnapshot::devices per device).
  AdmissionSnapshot admission() const;
  /// This engine's device index in the admission topology (0 without a front).
  int device_index() const;
  /// Bytes the request would reserve (the admission cost) with one choice
  /// and no prompt logprobs.
  std::int64_t cost(int prompt_tokens, int max_tokens) const;
  /// Bytes `request` would reserve: n x (cost(prompt, max_tokens), plus with
  /// prompt_logprobs the float32 logits of one prefill chunk (two copies:
  /// on the device and on the host) times the profile's safety factor).
  std::int64_t cost(const GenerationRequest& request) const;

 private:
  struct Impl;
  explicit Engine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace vg
