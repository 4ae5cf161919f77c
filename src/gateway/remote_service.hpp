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
// Threads: the Service methods from any thread; one monitor thread
// (supervision, reconnects, heartbeats, resubmission) and the channels'
// reader threads (events). One mutex (mu_) guards the slots and requests;
// events are pushed to their sinks outside it.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <boost/json.hpp>

#include "api/service.hpp"
#include "common/clock.hpp"
#include "gateway/placement.hpp"
#include "tokenizer/prompt_encoder.hpp"
#include "wire/codec.hpp"

namespace vg {
namespace metrics {
class ServerMetrics;
}

namespace gateway {

/// One engine process the gateway talks to.
struct EngineEndpoint {
  std::string socket_path;  ///< its Unix socket
  std::string secret_path;  ///< the file holding its secret; empty: socket_path + ".secret"
  std::string device;       ///< label for logs, metrics and /v1/engines (the hello's devices when empty)
  /// How to start it (argv; argv[0] an executable path) when this gateway
  /// supervises it; empty: an engine someone else runs (attach only).
  std::vector<std::string> command;
  /// Supervised: a running engine found at socket_path is re-attached only
  /// when its hello reports this digest of its settings; else it is stopped
  /// and a new one started.
  std::string config_digest;
};

/// Before a supervising serve starts its engines: an engine in
/// `runtime_dir` on a socket that is not one of `ours` (a serve with another
/// layout: --one-engine, or another device list or size) whose devices
/// overlap ours is stopped (SIGTERM, then SIGKILL after `grace_s`), and this
/// waits for it to exit, so that it does not hold device memory beside ours
/// until its --orphan-timeout. Engines on other devices, and sockets where
/// nothing accepts, are left alone. Errors: kConfig naming the engine when it
/// serves another gateway (never stopped from here). Calling thread; blocks
/// up to 5 s per socket for a hello, plus `grace_s` per engine stopped.
Status stop_engines_of_other_layouts(const std::string& runtime_dir, const std::vector<EngineEndpoint>& ours,
                                     double grace_s);

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
  void begin_drain();
  /// Blocks until no request is in flight, or `deadline`.
  bool wait_idle(TimePoint deadline) const;
  /// Cancels what is left, then releases (or leaves) the engines and stops
  /// the monitor. Idempotent.
  void shutdown();

  struct Slot;
  struct Req;

 private:
  explicit RemoteService(Options options);
  void monitor_loop();
  void supervise(Slot& slot, TimePoint now);
  /// Connects and says hello; false when the engine refused (try again later).
  bool try_connect(Slot& slot);
  /// try_connect with mu_ released around it (held on entry and return).
  bool connect_off_lock(Slot& slot);
  void reap_children(TimePoint now);
  void resubmit_pending(TimePoint now);
  /// Moves requests waiting in one engine's queue to another engine of
  /// their model with room for them and nothing waiting (withdraw, then
  /// placed again). Requires mu_.
  void rebalance();
  /// The ready engine of `r`'s model, other than `except`, with nothing
  /// waiting, a free sequence slot and free budget for `r`'s cost (the most
  /// free budget among them); null when none. Requires mu_.
  Slot* room_now(const Req& r, const Slot* except) const;
  /// Every engine as placement sees it for a request of `model`, in slots_'
  /// order. Requires mu_.
  std::vector<EngineSnapshot> snapshots(const std::string& model) const;
  /// Loads the prompt encoder of each language model in `models` (an
  /// accepted engine's hello) from the folder the engine loaded it from,
  /// unless one for the same folder, vocabulary and EOS id is loaded. A
  /// folder the gateway cannot read (no config.json it can open) leaves that
  /// model's prompts to its engines, which encode a text prompt themselves;
  /// the next hello tries again. Without mu_ (tokenizer files are read off it).
  void learn_prompts(const std::vector<ModelInfo>& models);
  /// Encodes the text or chat prompt of `request` into token ids, with its
  /// chat stop text, when its model's encoder is known (a request naming no
  /// model: the engines' default, the first language model each names, when
  /// they agree); leaves it as it is otherwise (the engine encodes it).
  /// Errors (400): the encoder's, and a prompt + max_tokens over the
  /// model's context length.
  Status encode_prompt(CompletionRequest& request) const;
  void on_message(Slot* slot, std::uint64_t epoch, boost::json::object message);
  void on_close(Slot* slot, std::uint64_t epoch, const std::string& reason);
  void cancel(Req& req);
  /// Sends `r` (request, sink set) to an engine of its model and waits for
  /// the engine's answer. Errors: the engine's refusal, or kOverloaded with
  /// a Retry-After (no engine ready, no answer in time, shutting down).
  Result<wire::Accepted> place(std::shared_ptr<Req> r);
  /// Placement: the ready slot for `model` with a free sequence slot (a
  /// batch place), then the most free budget (its last status, less what it
  /// accepted since); ties go to fewer requests in flight, then to the
  /// earlier --device. Leaves out `skip` and slots whose
  /// largest device budget is under `min_budget` (bytes). Null when none. Requires mu_.
  Slot* pick(const std::string& model, const std::set<const Slot*>& skip = {}, std::int64_t min_budget = 0) const;
  double retry_after_s() const;
  std::string slot_reason(const Slot& slot) const;
  void mirror_metrics(Slot& slot, const boost::json::object& message);
  /// Sets its state and publishes its metrics. Requires mu_.
  void set_state(Slot& slot, const char* state);
  /// Its vramgate_engine_up and _restarts_total, labelled with its resolved
  /// device names (none while they are unknown). Requires mu_.
  void publish_engine_metrics(const Slot& slot);
  /// Wakes cv_'s waiters and the monitor: an engine connected, went or
  /// changed state, a request was cancelled, or shutdown began. With or without mu_.
  void notify_changed();
  /// Stores the answer to submit or state query `id` and wakes its waiter. Requires mu_.
  void answer(std::uint64_t id, boost::json::object message);

  Options options_;
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;  // with mu_: waiters (submit answers, state replies, idle)
  std::condition_variable monitor_cv_;  // with mu_: wakes the monitor early (an engine connected, gone or
                                        // ready; a cancel; shutdown); it also runs every 20 ms
  std::vector<std::unique_ptr<Slot>> slots_;        // fixed after create()
  std::vector<std::shared_ptr<Req>> pending_;       // guarded by mu_: waiting for an engine
  mutable std::map<std::uint64_t, boost::json::object> answers_;  // guarded by mu_: rid/qid -> answer
  mutable std::uint64_t next_rid_ = 1;              // guarded by mu_
  /// guarded by mu_: fresh submits waiting for their answer, each on its own
  /// condition variable (with mu_), so an answer wakes its submit alone.
  std::map<std::uint64_t, std::condition_variable*> awaiting_;
  int active_ = 0;                                  // guarded by mu_: requests without their terminal event
  /// Guarded by mu_: ends of requests no engine will report (their engine
  /// died with them, or they ended while held here for an engine to take
  /// them again), counted into /v1/admission (gateway_counting.hpp).
  AdmissionState ended_here_;
  bool draining_ = false;                           // guarded by mu_
  bool stopping_ = false;                           // guarded by mu_
  std::optional<std::string> fatal_;                // guarded by mu_
  int fatal_exit_status_ = 1;                       // guarded by mu_
  int open_channels_ = 0;                           // guarded by mu_: connections whose on_close has not run
  /// A model's prompt encoder and the hello facts it was loaded for.
  struct PromptEncoding {
    std::shared_ptr<const PromptEncoder> encoder;
    std::string dir;
    VocabularyFacts facts;
    int context_length = 0;  ///< tokens; 0: unknown (the engine checks)
  };
  /// guarded by mu_: model id -> its encoding; a model not here is encoded by its engines.
  std::map<std::string, PromptEncoding> encoders_;
  std::thread monitor_;
};

}  // namespace gateway
}  // namespace vg
