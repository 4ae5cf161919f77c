// Internals of Engine, shared by its source files: engine.cpp (the public,
// any-thread API), engine_loop.cpp (the engine thread's loop: admit, step,
// retire), engine_tokens.cpp (emit: a generated token's events, a sequence's
// end) and engine_recovery.cpp (out-of-memory recovery: preemption with
// recompute, and the readiness breaker). Not a public header.
//
// Ownership: `EngineFront` (the admission controller and the requests queued
// in it, shared by every engine of a front) is guarded by its mutex (annotated:
// clang checks every access); `Shared`
// (wake flag, counters, readiness of one engine) by its own; the
// AdmissionController has its own lock. No two of these are ever held at
// once. `running`, every Sequence (with its KV cache and lease) and
// Request::resume belong to the engine thread that runs it; a Sequence handed
// to the engine's prefill worker belongs to the worker until it is handed
// back (the worker's lists have their own mutex, never held with another).
// Leases are never released while a mutex is held: a release wakes the
// engines.
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "api/types.hpp"
#include "common/thread_annotations.hpp"
#include "engine/engine.hpp"
#include "engine/oom_budget.hpp"
#include "engine/step_profile.hpp"
#include "engine/text_stream.hpp"
#include "model/model.hpp"
#include "model/sampler.hpp"

namespace vg {
namespace engine_detail {

struct Shared;
struct Request;

/// What a sequence has produced so far. It outlives a preemption: the
/// engine moves it into the Request while the request waits to be recomputed,
/// so sampling, held-back text and counts continue where they stopped and no
/// streamed token is sent twice.
struct Progress {
  Sampler sampler;
  TextStream text;
  std::vector<std::int32_t> generated;  ///< every token generated so far, in order
  int unsent_tokens = 0;                ///< generated but not yet announced in a TextEvent
  TimePoint started;                    ///< first start (lease granted)
  TimePoint prefill_done;               ///< end of the first prefill; {} before
  TimePoint last_token;
  double queue_ms = 0;                  ///< wait before the first start
  std::vector<TokenLogprobs> unsent_logprobs;  ///< logprobs of the unsent tokens (logprobs requested)
  bool prompt_logprobs_sent = false;    ///< the PromptEvent is out (a recompute does not send it again)

  Progress(const SamplingParams& sampling, std::span<const std::int32_t> prompt, std::vector<std::string> stop,
           TimePoint now, double queued_ms)
      : sampler(sampling, prompt), text(std::move(stop)), started(now), queue_ms(queued_ms) {}
};

/// The n > 1 choices of one request, seen by its owner as one request: the
/// choices' events are forwarded with their choice index, the first
/// StartedEvent and PromptEvent only, each choice's end as a ChoiceEndEvent
/// and the last one's as the terminal FinishedEvent (usage summed). The
/// first failure ends the request: it is forwarded as the terminal event,
/// the other choices are cancelled (aborted) and their events dropped.
/// Thread-safe: choices may run on different threads (engine, prefill worker).
class ChoiceGroup : public std::enable_shared_from_this<ChoiceGroup> {
 public:
  /// `on_abort` wakes the engines (a choice may wait in the queue).
  ChoiceGroup(std::shared_ptr<EventSink> sink, int n, std::function<void()> on_abort)
      : sink_(std::move(sink)), remaining_(n), to_complete_(n), on_abort_(std::move(on_abort)) {}
  /// The sink of choice `choice`.
  std::shared_ptr<EventSink> sink_for(int choice);
  void push(int choice, EngineEvent event);
  bool aborted() const { return aborted_.load(); }
  /// Counting the request once: a choice ended (`completed`: normally);
  /// true when that end is the request's (the last choice to complete, or
  /// the first to end otherwise), false for every other and after it.
  bool ends_request(bool completed);
  /// True for the group's first generated token only (time to first token).
  bool first_token();

 private:
  std::shared_ptr<EventSink> sink_;
  std::atomic<bool> aborted_{false};
  std::mutex mu_;
  int remaining_;           // guarded by mu_
  Usage usage_;             // guarded by mu_
  bool started_ = false;    // guarded by mu_
  bool prompt_sent_ = false;  // guarded by mu_
  bool ended_ = false;      // guarded by mu_
  int to_complete_;          // guarded by mu_: choices that must still complete (ends_request)
  bool counted_ = false;     // guarded by mu_: ends_request() returned true
  std::atomic<bool> first_token_{true};
  std::function<void()> on_abort_;
};

/// A request between submit and its terminal event. Shared by the submitter
/// (through RequestHandle) and the engine.
struct Request final : RequestHandle {
  GenerationRequest gen;
  RequestId admission_id = 0;
  std::int64_t cost = 0;
  std::shared_ptr<EventSink> sink;
  TimePoint enqueued;
  std::atomic<bool> cancelled{false};
  std::weak_ptr<EngineFront> front;
  /// Last QueuedEvent sent. While queued, guarded by EngineFront::mu (any
  /// engine of the front reports positions); otherwise the thread that runs it.
  int reported_position = 0;
  int model_index = 0;              ///< the model it runs on (admission topology)
  /// Granted a lease once (here, or by an engine process that died:
  /// GenerationRequest::admitted_before): its end counts among the finished
  /// requests (EngineStats), even from the queue after a preemption. Set
  /// before it is shared with another thread (submit), or by the thread that
  /// runs it when granted; read by whichever thread ends it.
  bool admitted = false;
  int preemptions = 0;              ///< the thread that runs it only
  std::optional<Progress> resume;   ///< the thread that runs it only: set while requeued after preemption
  /// A choice of an n > 1 request: the request the client holds (its
  /// cancel() cancels every choice), the group that merges the choices'
  /// events, and which choice this is. Set when the request is granted.
  std::shared_ptr<Request> parent;
  std::shared_ptr<ChoiceGroup> group;
  int choice = 0;

  const std::string& id() const override { return gen.id; }
  void cancel() override;
  /// Out of admission's queue and the front's, if still there.
  bool withdraw() override;
  int prompt_tokens() const { return static_cast<int>(gen.prompt.size()); }
  /// Cancelled by its client (or, for a choice, its request's client), or
  /// a sibling choice failed.
  bool is_cancelled() const {
    return cancelled.load() || (parent && parent->cancelled.load()) || (group && group->aborted());
  }
};

struct Shared {
  std::mutex mu;
  std::condition_variable cv;
  bool wake = false;       // guarded by mu: something to do (submit, cancel, release)
  bool draining = false;   // guarded by mu
  bool stopping = false;   // guarded by mu
  /// Guarded by mu: while now < unready_until the device is not ready
  /// (repeated out-of-memory errors); new requests are refused.
  TimePoint unready_until{};
  EngineStats stats;       // guarded by mu
  std::condition_variable idle_cv;

  void notify() {
    std::lock_guard lk(mu);
    wake = true;
    cv.notify_all();
  }
};

}  // namespace engine_detail

struct EngineFront {
  using Request = engine_detail::Request;

  AdmissionTopology topology;
  std::unique_ptr<AdmissionController> admission;
  std::atomic<RequestId> next_id{1};

  Mutex mu;
  /// Requests queued in admission, by admission id.
  std::unordered_map<RequestId, std::shared_ptr<Request>> queued VG_GUARDED_BY(mu);
  /// What to wake when work may be granted: the engines drawing from this
  /// front and their prefill workers.
  std::vector<std::weak_ptr<engine_detail::Shared>> engines VG_GUARDED_BY(mu);
  int live_engines VG_GUARDED_BY(mu) = 0;  ///< engines whose thread has not stopped
  /// Other engines drawing from this front (tensor engines): woken with the
  /// engines above.
  std::vector<std::function<void()>> listeners VG_GUARDED_BY(mu);
  /// Where expiries of requests these engines do not hold go (the tensor
  /// engines' requests); empty: dropped.
  std::function<void(AdmissionExpiry)> other_expiry VG_GUARDED_BY(mu);
  std::atomic<int> queued_count{0};  // queued.size(), readable without mu

  /// Wakes every engine (a submit, a cancel, a release, an engine becoming
  /// available: any of them may now grant).
  void notify_all() VG_EXCLUDES(mu) {
    std::vector<std::weak_ptr<engine_detail::Shared>> copy;
    std::vector<std::function<void()>> others;
    {
      MutexLock lk(mu);
      copy = engines;
      others = listeners;
    }
    for (auto& w : copy) {
      if (auto s = w.lock()) s->notify();
    }
    for (auto& wake : others) wake();
  }
  /// The queued request with admission id `id`, removed; null when absent.
  std::shared_ptr<Request> take(RequestId id) VG_EXCLUDES(mu) {
    MutexLock lk(mu);
    auto it = queued.find(id);
    if (it == queued.end()) return nullptr;
    auto r = std::move(it->second);
    queued.erase(it);
    queued_count.store(static_cast<int>(queued.size()));
    return r;
  }
  /// Registers a request as queued (before admission can grant it).
  void put(std::shared_ptr<Request> r) VG_EXCLUDES(mu) {
    MutexLock lk(mu);
    const RequestId id = r->admission_id;
    queued.emplace(id, std::move(r));
    queued_count.store(static_cast<int>(queued.size()));
  }
};

namespace engine_detail {

/// A running sequence: engine thread only.
struct Sequence {
  std::shared_ptr<Request> req;
  Lease lease;
  std::unique_ptr<KvCache> cache;
  Progress p;
  /// Tokens to prefill: the prompt, plus the tokens generated before a
  /// preemption when the sequence is recomputed.
  std::vector<std::int32_t> context;
  int prefilled = 0;             // context tokens already in the cache
  std::int64_t kv_bytes = 0;     // bytes of its KV cache (0 without one)
  /// In a pool reserving on demand: the blocks its lease pays for, those it
  /// brought into use (taken free or from the prefix cache's idle blocks).
  std::int64_t kv_blocks = 0;
  std::int32_t next_token = -1;  // fed to the next decode step
  bool done = false;
  TimePoint admitted;            // this start (preemption takes the youngest first)
  /// Choices of one request: the first choice (the leader) holds fork_token
  /// until its prompt is prefilled; the others (followers) hold it weakly
  /// and wait, then get a copy of the leader's KV cache and sample their
  /// first token from the same logits. A follower whose leader went away
  /// (preempted, failed) before that prefills its own prompt.
  std::shared_ptr<int> fork_token;
  std::weak_ptr<int> fork_from;
  std::vector<TokenLogprobs> prompt_logprobs;  // collected over the prefill chunks

  Sequence(std::shared_ptr<Request> r, Lease l, Progress progress, TimePoint now)
      : req(std::move(r)), lease(std::move(l)), p(std::move(progress)), admitted(now) {
    context = req->gen.prompt;
    context.insert(context.end(), p.generated.begin(), p.generated.end());
  }
  bool prefilling() const { return prefilled < static_cast<int>(context.size()); }
  /// A follower whose leader is still prefilling the shared prompt.
  bool awaiting_fork() const { return !fork_from.expired(); }
  /// Whether its prefill chunks return the logits of every token.
  bool wants_prompt_logprobs() const { return req->gen.prompt_logprobs && !p.prompt_logprobs_sent; }
  /// Its next prefill chunk: at most `budget` context tokens not yet in the cache.
  StepInput next_chunk(int budget) const {
    const int n = std::min(budget, static_cast<int>(context.size()) - prefilled);
    return StepInput{cache.get(),
                     std::span<const std::int32_t>(context).subspan(static_cast<std::size_t>(prefilled),
                                                                    static_cast<std::size_t>(n)),
                     wants_prompt_logprobs()};
  }
  /// A chunk of `tokens` is in the cache at `now`; true when the prefill is
  /// complete (the first completion stamps prefill_done).
  bool chunk_done(int tokens, TimePoint now) {
    prefilled += tokens;
    if (prefilling()) return false;
    if (p.prefill_done == TimePoint{}) p.prefill_done = now;
    return true;
  }
  int generated() const { return static_cast<int>(p.generated.size()); }
  /// The ids of the tokens not yet announced in a TextEvent (the last unsent_tokens generated).
  std::vector<std::int32_t> unsent_ids() const {
    const auto n = static_cast<std::ptrdiff_t>(std::min<std::size_t>(static_cast<std::size_t>(p.unsent_tokens), p.generated.size()));
    return std::vector<std::int32_t>(p.generated.end() - n, p.generated.end());
  }
  /// Queue, prefill and decode time up to `now` (decode 0 until prefilled).
  Timings timings(TimePoint now) const {
    const bool decoding = p.prefill_done != TimePoint{};
    return {p.queue_ms, ms_between(p.started, decoding ? p.prefill_done : now),
            decoding ? ms_between(p.prefill_done, now) : 0.0};
  }
};

/// The terminal event of a request that is not running (queued, or
/// requeued after a preemption: then its usage counts what it generated).
inline FailedEvent failed(const Request& r, Error e) {
  const int generated = r.resume ? static_cast<int>(r.resume->generated.size()) : 0;
  return FailedEvent{std::move(e), {r.prompt_tokens(), generated}};
}

constexpr std::int64_t kIdle = std::numeric_limits<std::int64_t>::min();

}  // namespace engine_detail

struct Engine::Impl {
  using Request = engine_detail::Request;
  using Sequence = engine_detail::Sequence;
  using Shared = engine_detail::Shared;

  /// Sequences the prefill worker hands back: prefilled with their first
  /// token out (or finished by it), returned unprefilled (cancelled, or the
  /// worker stopping), or the sequences of a failed step (`error`; their
  /// caches are as before that step).
  struct PrefillBatch {
    std::vector<std::unique_ptr<Sequence>> sequences;
    std::optional<Error> error;
    bool step_ok = false;       ///< they come from a step that succeeded
    bool cache_failed = false;  ///< error is the KV cache allocation of the one sequence
  };
  /// The prefill worker (Options::prefill_worker). It starts sequences
  /// itself (grants for this engine, like the engine thread) and takes
  /// prefilling ones the engine thread hands over. A sequence belongs to the
  /// engine thread while in `running`, to the worker from the inbox (or its
  /// grant) until the outbox; the two threads share only these lists and the
  /// in_prefill counters.
  struct PrefillWorker {
    /// mu guards inbox and outbox too; wake and stopping are its flags. Its
    /// notify() is called by the front (submits, cancels, releases) like an
    /// engine's.
    std::shared_ptr<engine_detail::Shared> signal = std::make_shared<engine_detail::Shared>();
    std::vector<std::unique_ptr<Sequence>> inbox;  // handed over, oldest first
    std::vector<PrefillBatch> outbox;              // handed back
    std::thread thread;
  };

  Options options;
  Model& model;
  Device& device;
  std::shared_ptr<Shared> shared = std::make_shared<Shared>();
  std::shared_ptr<EngineFront> front;
  AdmissionController* admission = nullptr;  // front->admission
  int index = 0;         // this engine in the front's topology
  int device_index = 0;  // its device there
  int model_index = 0;   // its model there
  std::optional<OomBudget> oom_budget;  // engine thread only, after create()
  std::vector<std::unique_ptr<Sequence>> running;  // engine thread only
  std::atomic<std::int64_t> steps_run{0};           // steps started, the prefill worker's included
  std::unique_ptr<PrefillWorker> prefill;           // null without options.prefill_worker
  engine_detail::StepProfile step_profile;          // engine thread only
  // Sequences the prefill worker holds, their KV cache bytes and their
  // leases' bytes: raised by whichever thread gives the worker a sequence,
  // lowered by the engine thread when it comes back.
  std::atomic<int> in_prefill{0};
  std::atomic<std::int64_t> in_prefill_kv_bytes{0};
  std::atomic<std::int64_t> in_prefill_cost{0};
  int consecutive_oom_steps = 0;                    // engine thread only; reset by a step that succeeds
  std::int64_t shed_checked_budget = -1;            // engine thread only: effective budget shed_over_budget last saw
  std::optional<std::int64_t> foreign_file_bytes;   // engine thread only: the hook file's last byte size
  // The KV block pool (options.kv_pool), engine thread only, except
  // output_lengths (thread-safe: submit() reads it for the cost).
  OutputLengthEstimate output_lengths;
  /// Blocks still read by running sequences after the sequence that paid
  /// for them ended: held here, so that leases always cover the blocks in use.
  std::optional<Lease> kv_orphans;
  std::int64_t kv_pool_max_blocks = 0;  // the pool at start-up: it never grows past it
  TimePoint kv_pool_grow_after{};       // after a failed resize, the pool is resized again only after this
  std::optional<TimePoint> kv_pool_lost_retry;  // the pool lost its storage: the next turn, at the latest
  // Watchdog heartbeats: start of the step in progress (Clock ticks), or
  // kIdle; of the engine thread and of the prefill worker.
  std::atomic<std::int64_t> step_started{engine_detail::kIdle};
  std::atomic<std::int64_t> prefill_step_started{engine_detail::kIdle};
  std::thread thread;

  Impl(const Options& o, Model& m, Device& d) : options(o), model(m), device(d), step_profile(o.step_profile) {}

  // engine_loop.cpp
  void run();
  bool wait_for_work();
  void drop_queued(TimePoint now);
  void admit(TimePoint now);
  void report_queue_positions(TimePoint now);
  void start_sequence(std::shared_ptr<Request> req, Lease lease, TimePoint now);
  /// A granted request as a Sequence (resumed when it was preempted); sends
  /// StartedEvent the first time. Either thread.
  std::unique_ptr<Sequence> make_sequence(std::shared_ptr<Request> req, Lease lease, TimePoint now);
  /// A granted request as its sequences: one, or for n > 1 one per choice
  /// (child requests, the lease split among them); with `fork` the first
  /// prefills the prompt for all. Either thread.
  std::vector<std::unique_ptr<Sequence>> make_sequences(std::shared_ptr<Request> req, Lease lease, TimePoint now,
                                                        bool fork);
  /// A prefill chunk of `s` (`input`) ran with `logits`: records it, sends
  /// the prompt logprobs when asked, and once the prompt is in, gives the
  /// followers their copy and samples the first token (or finishes a
  /// max_tokens 0 request). Returns whether the prefill is complete. Either thread.
  bool on_chunk(Sequence& s, const StepInput& input, const std::vector<float>& logits, TimePoint now);
  /// Engine thread: the waiting followers of `leader` get its KV cache and
  /// their first token from `logits`.
  void fork_followers(Sequence& leader, std::span<const float> logits, TimePoint now);
  /// Gives `s` its KV cache (prompt + max_tokens); the error when it is
  /// cancelled already or the allocation fails. Either thread.
  std::optional<Error> open_sequence(Sequence& s);
  /// Engine thread: `s` (in `running`) could not be opened: out of memory is
  /// recovered with `s` as the first victim where the policy allows;
  /// otherwise it fails.
  void not_opened(TimePoint now, Sequence& s, Error error);
  void run_step();
  /// A step of decode inputs only (owners[i] owns inputs[i]): Model::decode_step,
  /// which picks each token (on the device for decoder models).
  void run_decode_step(std::span<const StepInput> inputs, std::span<Sequence* const> owners, std::int64_t step);
  /// Counts a step that ran (stats.steps).
  void count_step();
  /// A step failed with `error` (the engine thread's own, or one the prefill
  /// worker handed back, `step` naming it in the log); `owners` are its
  /// sequences, their caches as before it. Out of memory is recovered by
  /// preemption where the policy allows; otherwise the sequences fail.
  void on_failed_step(TimePoint now, const Error& error, std::span<Sequence* const> owners, const std::string& step);
  /// Counts one out-of-memory (a step, or a KV cache opened outside the pool). Engine thread.
  void count_out_of_memory();
  /// Engine thread: a device fault (kDeviceFault) in `where` (a step, a KV
  /// cache allocation): logs it and calls options.on_poisoned (an engine
  /// process exits there); the caller then fails the sequences concerned.
  void on_device_fault(const Error& error, const std::string& where);
  /// Counts a step about to run (either thread) and arms the test hooks'
  /// injected out-of-memory error or device fault when its number is due;
  /// returns the number.
  std::int64_t begin_step();

  // engine_tokens.cpp
  /// `s` generated `token` from `logits` (its last row; for the logprobs).
  void on_token(Sequence& s, std::int32_t token, TimePoint now, std::span<const float> logits);
  /// A token picked with its finiteness and logprobs known (a decode step's
  /// pick, or the one above from host logits).
  void on_token(Sequence& s, SampledToken pick, TimePoint now);
  void finish(Sequence& s, const char* reason);
  void fail(Sequence& s, Error error);
  /// `r` (a request, or one choice of an n > 1 request) ended at `now`,
  /// normally (`error` null) or with `error`, having generated `generated`
  /// tokens. The request is counted once, at the end that is its own
  /// (ChoiceGroup::ends_request): in the duration histogram, by outcome in
  /// the stats when it was admitted, and when completed in the drain rate
  /// behind Retry-After. Either thread.
  void count_end(const Request& r, const Error* error, int generated, TimePoint now);

  // engine_loop.cpp
  void sweep_running(TimePoint now);
  void retire_done();
  void publish();
  void cancel_everything();
  void observe_end(const Request& r, TimePoint now);
  void log_memory(const Request& r, const char* stage) const;
  /// The admission cost of one choice of `request` (Engine::cost).
  std::int64_t choice_cost(const GenerationRequest& request) const;
  int max_running() const {
    return options.admission.policy.kind == AdmissionPolicy::Kind::kNone ? kUnlimitedRunning : options.max_batch;
  }
  bool recovers() const { return options.admission.policy.kind != AdmissionPolicy::Kind::kNone; }

  // engine_kv_pool.cpp
  bool pooled() const { return options.kv_pool.has_value(); }
  bool on_demand() const { return pooled() && options.kv_pool->reservation == KvReservation::kOnDemand; }
  /// Pool mode: the admission cost of one choice whose context is
  /// `context_tokens` and that may generate `max_more` more tokens.
  std::int64_t pool_cost(int context_tokens, int max_more) const;
  /// KV positions a sequence with `context_tokens` that generates `more` tokens fills.
  static std::int64_t cached_positions(int context_tokens, int more);
  /// Pool mode, at create(): the pool's size becomes a bound of the device's
  /// effective budget, and the lease of orphaned blocks is opened.
  void start_kv_pool();
  /// Gives `s` its KV cache from the pool (prefix-cache hits included);
  /// the error when the pool is short.
  std::optional<Error> open_pooled(Sequence& s);
  /// Frees `s`'s KV cache and releases its lease (with a pool, the blocks
  /// others still read move to kv_orphans first).
  void release_kv(Sequence& s);
  /// On demand: gives every decoding sequence whose cache is full one more
  /// block, preempting in preemption_order() when the budget has none.
  void grow_for_step(TimePoint now);
  /// Makes the pool as large as the effective budget (smaller after a cut,
  /// once shedding freed the blocks; larger again, up to its start-up size,
  /// when it rises by enough: kv_pool_target). A failed resize is tried
  /// again a second later; one that lost the pool's storage preempts every
  /// sequence (their keys and values are gone) and is tried again at the
  /// next turn. False while the pool has no storage: nothing may step.
  bool fit_kv_pool(TimePoint now);
  /// One turn's work once the pool (if any) can be stepped: admission,
  /// prefill hand-offs, growth, the step, and retiring what ended.
  void admit_and_step();
  std::int64_t kv_used_blocks() const;
  /// `s`'s blocks changed from `before` used blocks in the pool: its lease follows.
  void charge_blocks(Sequence& s, std::int64_t before);
  void publish_kv_pool(EngineStats& stats) const;

  // prefill_worker.cpp
  void prefill_loop();                   // the worker thread
  /// Worker: starts what admission grants this engine now into `work`.
  void prefill_admit(std::vector<std::unique_ptr<Sequence>>& work, std::vector<PrefillBatch>& back);
  /// One worker step over `work` (oldest first, chunks within
  /// max_batch_tokens); what leaves the worker is moved into `back`.
  void prefill_step(std::vector<std::unique_ptr<Sequence>>& work, std::vector<PrefillBatch>& back);
  void hand_off_prefills();              // engine thread: prefilling sequences -> worker
  void collect_prefills(TimePoint now);  // engine thread: worker -> running (errors handled as a failed step)
  void stop_prefill_worker();            // engine thread: joins the worker; all its sequences back in running
  int holding() const { return static_cast<int>(running.size()) + in_prefill.load(); }

  // engine_recovery.cpp
  /// An out-of-memory error at `now` (a failed step, or `victim`'s KV cache
  /// allocation): cut the budget, release cached memory, preempt.
  void recover_from_oom(TimePoint now, const Error& error, Sequence* victim = nullptr);
  /// Running sequences in preemption order: the lowest priority class
  /// first, the youngest first within a class.
  std::vector<Sequence*> preemption_order() const;
  /// Preempts `s` to be recomputed, or, once it was preempted
  /// max_preemptions times, fails it with kOverloaded + Retry-After (`why`).
  void preempt_or_refuse(Sequence& s, TimePoint now, const std::string& why);
  void preempt(Sequence& s, TimePoint now);
  /// Policy memory: when the effective budget fell under what this device's
  /// leases hold (other processes took memory), preempts running sequences
  /// in preemption_order() until the excess is gone, before anything is
  /// admitted.
  void shed_over_budget(TimePoint now);
  /// Test hook (options.test_foreign_bytes): the file's byte size, when it
  /// changed, becomes what "another process" holds on the device.
  void follow_foreign_bytes_file();
  /// A step succeeded: the out-of-memory streak ends.
  void on_step_ok();
  /// Whether grants are paused because the device is marked not ready.
  bool paused(TimePoint now) const;
};

}  // namespace vg
