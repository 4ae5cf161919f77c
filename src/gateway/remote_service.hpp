// The gateway's Service (multi-process mode): requests go to engine
// processes over their Unix sockets (wire/protocol.hpp) and their events come
// back; the engines admit, so the device limit holds however many gateways
// share them. It supervises the engines it is given a command for: starts
// each, restarts one that exits, is killed by a signal or misses its
// heartbeat (with exponential backoff), and re-attaches to one that is
// already running with the same settings. When an engine dies, its requests
// move to the restarted (or another) engine: those with no token sent are
// resubmitted; streams are resumed after the tokens already sent (the new
// engine prefills prompt + those tokens and replays the sampler), so no token
// is repeated or lost; a request running at each of --max-crash-retries
// crashes fails with 500 engine_crashed. With several engines of a model
// (one per device), each request goes to the one with the most free budget,
// one too large for an engine's devices to an engine with a larger budget,
// and one waiting in an engine's queue is taken back (withdraw) and placed
// on an engine where room freed, so it runs where room frees first. Torch-free.
//
// It composes: engine_process.hpp (supervision: spawn, reap, backoff, the
// engine state), engine_link.hpp (hello and typed messages over the wire),
// placement.hpp (pure placement over engine snapshots), tracking/ (each
// request's phase, what its client was sent, resume; each engine's counters
// across its processes), prompt_encoders.hpp, metrics_mirror.hpp and
// gateway_counting.hpp. Its methods are in four
// files: remote_service.cpp (construction, views, shutdown), remote_engines.cpp
// (the monitor thread: supervision, connections), remote_requests.cpp (the
// request path: place, crashes, resubmission, moves) and remote_messages.cpp
// (the engines' messages).
//
// Threads: the Service methods from any thread; one monitor thread
// (supervision, reconnects, heartbeats, resubmission) and the links' reader
// threads (engine messages). One mutex (mu_) guards the engines and the
// requests; events are pushed to their sinks outside it.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "api/service.hpp"
#include "common/clock.hpp"
#include "common/thread_annotations.hpp"
#include "gateway/engine_link.hpp"
#include "gateway/engine_process.hpp"
#include "gateway/placement.hpp"
#include "gateway/prompt_encoders.hpp"

namespace vg {
namespace metrics {
class ServerMetrics;
}

namespace gateway {

class RemoteService final : public Service {
 public:
  struct Options {
    std::vector<EngineEndpoint> engines;
    double heartbeat_timeout_s = 5;   ///< no message from a connected engine for this long: it is hung
    int max_crash_retries = 2;        ///< crashes with a request running that fail it (engine_crashed)
    double request_timeout_s = 300;   ///< longest a request waits for an engine to take it again
    double submit_timeout_s = 10;     ///< longest wait for an engine's answer to a submit
    double backoff_initial_s = 0.5;   ///< first restart delay; doubled per crash up to backoff_max_s
    double backoff_max_s = 30;
    double stable_after_s = 60;       ///< an engine that ran this long restarts with the initial delay again
    double default_startup_s = 5;     ///< Retry-After while no start-up has been measured
    /// The server's --chat-template (empty: each model's own): the gateway
    /// renders chat requests and tokenizes prompts itself, with each model's
    /// tokenizer read from the folder its engine's hello names.
    std::string chat_template;
    /// On shutdown(): ask the engines to exit once no other gateway uses
    /// them (false: leave them running for the next gateway, --keep-engines).
    bool release_engines = true;
    double shutdown_grace_s = 10;     ///< how long shutdown() waits for supervised engines to exit
    metrics::ServerMetrics* metrics = nullptr;  ///< engine metrics are mirrored here; may be null
  };

  /// Errors: kConfig (no engines). Nothing starts before start().
  static Result<std::unique_ptr<RemoteService>> create(Options options);
  /// Starts the monitor thread, which starts or attaches the engines. Once.
  void start();
  ~RemoteService() override;

  Result<Submission> submit(const CompletionRequest& request, std::shared_ptr<EventSink> sink) override;
  std::vector<ModelInfo> models() const override;
  bool healthy(std::string* reason) const override;
  bool ready() const override;
  std::string not_ready_reason() const override;
  AdmissionState admission_state() const override;
  std::vector<EngineInfo> engine_processes() const override;
  /// TorchScript requests go to an engine of the model as "infer"; after a
  /// crash they are resubmitted like a completion that sent nothing yet,
  /// and an accepted one counts as running at each crash (--max-crash-retries).
  Result<TensorSubmission> submit_tensor(TensorInferRequest request, TensorDone done) override;
  Result<TensorModelInfo> tensor_model(const std::string& name) const override;

  /// Set when a supervised engine exited with status 1 or 2 (its model or
  /// settings are unusable) before it ever served: restarting cannot help,
  /// and the server should exit. Any thread.
  std::optional<std::string> fatal_start_failure() const;
  /// The exit status for fatal_start_failure(): 2 when every engine exited
  /// 2 (its settings or device cannot serve), else 1.
  int fatal_start_exit_status() const;
  /// Blocks until every engine is connected and ready (or left out: it could not start), or `deadline`.
  bool wait_ready(TimePoint deadline) const;
  /// New requests get 503 from now on; running ones go on.
  void begin_drain() override;
  /// Blocks until no request is in flight, or `deadline`.
  bool wait_idle(TimePoint deadline) const override;
  /// Cancels what is left, then releases (or leaves) the engines and stops
  /// the monitor. Idempotent.
  void shutdown() override;

  struct Slot;   ///< one engine (remote_slot.hpp)
  struct Req;    ///< one request (remote_slot.hpp)
  class Outbox;  ///< what a handler does once mu_ is released (remote_slot.hpp)

 private:
  explicit RemoteService(Options options);
  BackoffOptions backoff() const;

  // -- supervision (remote_engines.cpp; the monitor thread)
  void monitor_loop() VG_EXCLUDES(mu_);
  void supervise(Slot& slot, TimePoint now) VG_REQUIRES(mu_);
  /// Starts a supervised engine that has no process, unless one accepts on
  /// its socket (then it attaches, or waits for it to go).
  void start_engine(Slot& slot, TimePoint now) VG_REQUIRES(mu_);
  void reap_children(TimePoint now) VG_EXCLUDES(mu_);
  /// Its process `pid` ended with waitpid's `status`: restarted after its backoff, or left out.
  void process_ended(Slot& slot, pid_t pid, int status, TimePoint now) VG_REQUIRES(mu_);
  /// Connects and says hello; false when the engine refused (try again later).
  bool try_connect(Slot& slot) VG_EXCLUDES(mu_);
  /// An accepted hello: the slot takes `fd` as its link and starts reading.
  /// True (as try_connect), also when stopping: then `fd` is closed instead.
  bool attach(Slot& slot, int fd, wire::EngineHello hello) VG_EXCLUDES(mu_);
  /// try_connect with mu_ released around it (held on entry and return).
  bool connect_off_lock(Slot& slot) VG_REQUIRES(mu_);

  // -- the request path (remote_requests.cpp; the engines' messages: remote_messages.cpp)
  /// Sends held requests to an engine that can take them; ends those
  /// cancelled or past their deadline (their failures go to `ends`).
  void resubmit_pending(TimePoint now, Outbox& ends) VG_REQUIRES(mu_);
  /// Sends held request `r` to `s` again (after a crash, a refusal, a move).
  void resend(const std::shared_ptr<Req>& r, Slot* s) VG_REQUIRES(mu_);
  /// Moves requests waiting in one engine's queue to another engine of
  /// their model with room for them and nothing waiting (withdraw, then
  /// placed again).
  void rebalance() VG_REQUIRES(mu_);
  /// The ready engine of `r`'s model, other than `except`, with nothing
  /// waiting, a free sequence slot and free budget for `r`'s cost (the most
  /// free budget among them); null when none.
  Slot* room_now(const Req& r, const Slot* except) const VG_REQUIRES(mu_);
  /// Every engine as placement sees it for a request of `model`, in slots_' order.
  std::vector<EngineSnapshot> snapshots(const std::string& model) const VG_REQUIRES(mu_);
  /// Encodes the text or chat prompt of `request` into token ids, with its
  /// chat stop text, when its model's encoder is known (a request naming no
  /// model: the engines' default, the first language model each names, when
  /// they agree); leaves it as it is otherwise (the engine encodes it).
  /// Errors (400): the encoder's, and a prompt + max_tokens over the
  /// model's context length.
  Status encode_prompt(CompletionRequest& request) const VG_EXCLUDES(mu_);
  void on_message(Slot* slot, std::uint64_t epoch, wire::Decoded<wire::ToGateway> message) VG_EXCLUDES(mu_);
  /// One message of `slot`'s engine, dispatched by its type.
  void dispatch(Slot& slot, wire::ToGateway message, Outbox& out) VG_REQUIRES(mu_);
  void on_status(Slot& slot, const wire::StatusReport& m) VG_REQUIRES(mu_);
  void on_state(Slot& slot, wire::StateReport m) VG_REQUIRES(mu_);
  /// A message that could not be read: one about a request fails that
  /// request (the engine is told to cancel it); any other closes the link.
  void on_unreadable(Slot& slot, const wire::DecodeError& e, Outbox& out) VG_REQUIRES(mu_);
  // The handlers of one engine message about request `rid` on `slot`; what
  // they push to sinks goes to `out`, delivered once mu_ is released.
  /// The answer to submit `rid`: to its request, or to the submit() that waits for it.
  void route_answer(Slot& slot, std::uint64_t rid, SubmitAnswer answer, Outbox& out) VG_REQUIRES(mu_);
  void on_answer(Slot& slot, const std::shared_ptr<Req>& r, std::uint64_t rid, SubmitAnswer answer, Outbox& out)
      VG_REQUIRES(mu_);
  void on_withdrawn(Slot& slot, const std::shared_ptr<Req>& r, std::uint64_t rid, bool ok) VG_REQUIRES(mu_);
  void on_infer_done(Slot& slot, const std::shared_ptr<Req>& r, std::uint64_t rid, Result<TensorResult> result,
                     Outbox& out) VG_REQUIRES(mu_);
  void on_event(Slot& slot, const std::shared_ptr<Req>& r, EngineEvent event, Outbox& out) VG_REQUIRES(mu_);
  /// Request `r` cannot go on from what its engine sent (`why`): it fails
  /// here with kInternal, and the engine is told to cancel it.
  void fail_unreadable(Slot& slot, const std::shared_ptr<Req>& r, std::uint64_t rid, const std::string& why,
                       Outbox& out) VG_REQUIRES(mu_);
  void on_close(Slot* slot, std::uint64_t epoch, const std::string& reason) VG_EXCLUDES(mu_);
  /// A request of a closed engine: ended (its failure event in `ends`),
  /// answered (a submit waits), or held for another engine (true).
  bool requeue_after_close(const std::shared_ptr<Req>& r, std::uint64_t rid, Outbox& ends) VG_REQUIRES(mu_);
  void cancel(Req& req) VG_EXCLUDES(mu_);
  /// Sends `r` (request, sink set) to an engine of its model and waits for
  /// the engine's answer. Errors: the engine's refusal, or kOverloaded with
  /// a Retry-After (no engine ready, no answer in time, shutting down).
  Result<wire::Accepted> place(std::shared_ptr<Req> r) VG_EXCLUDES(mu_);
  /// The end of a placement that did not get accepted: the error its submit returns.
  Error placement_failed(Req& r, std::uint64_t rid, const SubmitAnswer* answer, std::int64_t largest_refusing_budget)
      VG_REQUIRES(mu_);
  /// Placement: the ready slot for `model` with a free sequence slot (a
  /// batch place), then the most free budget (its last status, less what it
  /// accepted since); ties go to fewer requests in flight, then to the
  /// earlier --device. Leaves out `skip` and slots whose
  /// largest device budget is under `min_budget` (bytes). Null when none.
  Slot* pick(const std::string& model, const std::set<const Slot*>& skip = {}, std::int64_t min_budget = 0) const
      VG_REQUIRES(mu_);
  double retry_after_s() const VG_REQUIRES(mu_);
  std::string slot_reason(const Slot& slot) const VG_REQUIRES(mu_);
  /// Sets its state and publishes its metrics.
  void set_state(Slot& slot, EngineState state) VG_REQUIRES(mu_);
  /// Its vramgate_engine_up and _restarts_total, labelled with its resolved
  /// device names (none while they are unknown).
  void publish_engine_metrics(const Slot& slot) VG_REQUIRES(mu_);
  /// Wakes cv_'s waiters and the monitor: an engine connected, went or
  /// changed state, a request was cancelled, or shutdown began. With or without mu_.
  void notify_changed();
  /// Flushes and closes the links, then waits for their reader threads.
  void close_links() VG_EXCLUDES(mu_);
  /// Stores the answer to submit `rid` and wakes its waiter.
  void answer(std::uint64_t rid, SubmitAnswer answer) VG_REQUIRES(mu_);
  /// A request got its terminal event: one fewer in flight (wait_idle() wakes at none).
  void request_ended() VG_REQUIRES(mu_);

  Options options_;
  PromptEncoders encoders_;  // its own lock
  mutable Mutex mu_;
  /// With mu_: waiters (submit answers, state replies, idle).
  mutable std::condition_variable_any cv_;
  /// With mu_: wakes the monitor early (an engine connected, gone or ready;
  /// a cancel; shutdown); it also runs every 20 ms.
  std::condition_variable_any monitor_cv_;
  /// Fixed after create(); each Slot's fields are guarded by mu_.
  std::vector<std::unique_ptr<Slot>> slots_;
  /// Held here, waiting for an engine to take them (again).
  std::vector<std::shared_ptr<Req>> pending_ VG_GUARDED_BY(mu_);
  std::map<std::uint64_t, SubmitAnswer> answers_ VG_GUARDED_BY(mu_);              // rid -> its answer
  mutable std::map<std::uint64_t, wire::StateReport> state_replies_ VG_GUARDED_BY(mu_);  // qid -> the reply
  mutable std::uint64_t next_rid_ VG_GUARDED_BY(mu_) = 1;                         // ids of submits and state queries
  /// Fresh submits waiting for their answer, each on its own condition
  /// variable (with mu_), so an answer wakes its submit alone.
  std::map<std::uint64_t, std::condition_variable_any*> awaiting_ VG_GUARDED_BY(mu_);
  int active_ VG_GUARDED_BY(mu_) = 0;  // requests without their terminal event
  /// Ends of requests no engine will report (their engine died with them,
  /// or they ended while held here for an engine to take them again),
  /// counted into /v1/admission (gateway_counting.hpp).
  Counters ended_here_ VG_GUARDED_BY(mu_);
  bool draining_ VG_GUARDED_BY(mu_) = false;
  bool stopping_ VG_GUARDED_BY(mu_) = false;
  std::optional<std::string> fatal_ VG_GUARDED_BY(mu_);
  int fatal_exit_status_ VG_GUARDED_BY(mu_) = 1;
  int open_channels_ VG_GUARDED_BY(mu_) = 0;  // connections whose on_close has not run
  std::thread monitor_;
};

}  // namespace gateway
}  // namespace vg
