// The gateway side of Redis mode: a Service that places completions in the
// shared queue (shared_queue.hpp) instead of sending them to an engine, so
// that any engine of the model on any host takes each one when it fits its
// free budget (queue_worker.hpp). The gateway keeps every request until
// its answer has arrived: it reads the events engines write to its reply
// stream, drops those of an older delivery than it has seen (fencing
// epochs), remembers the tokens sent, and re-adds (after those tokens) what
// Redis no longer holds while its answer has not arrived: Redis restarted
// without its data, failed over to a replica that lagged, or an engine
// dropped it while this gateway's alive key had lapsed. Its alive key lets
// engines stop the work of a gateway that died.
//
// Cost: the gateway has no tokenizer, so it places a request by an upper
// bound of its cost (prompt bytes as tokens, capped at the context
// length, from the memory profile engines register); the engine's own
// admission then charges the exact cost.
//
// Idempotency-Keys across gateways: a request with a key claims the key in
// Redis as it is added. The same key sent to another gateway, while the
// request runs, makes that gateway follow it (the engine writes its events
// to both gateways, and the follower is first sent what was written
// before); after it completed, the key's recorded events are replayed
// until --idempotency-ttl; with another body it is refused (422). A
// request whose own client left keeps running while followers remain.
//
// TorchScript requests, and the engines this gateway supervises, go to
// `local` (a RemoteService), when given.
//
// Threads: Service methods from any thread; a reader thread (blocking reads
// of the reply stream), a monitor thread (heartbeat, engine registry, queue
// timeouts, Redis restarts) and the Redis clients' io thread. One mutex
// guards the requests and the registry; events are pushed outside it, each
// request's by one thread at a time.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio/io_context.hpp>

#include "api/service.hpp"
#include "common/clock.hpp"
#include "common/error.hpp"
#include "queue/redis_client.hpp"
#include "queue/shared_queue.hpp"
#include "tracking/counter_carry.hpp"

namespace vg {
namespace metrics {
class ServerMetrics;
}

namespace queue {

class QueueService final : public Service {
 public:
  struct Options {
    RedisUrl url;
    Duration command_timeout = std::chrono::milliseconds(250);
    Duration heartbeat = std::chrono::milliseconds(250);
    double queue_timeout_s = 30;     ///< longest a request waits for an engine to take it (then 503)
    double request_timeout_s = 300;  ///< a request with no answer this long after it was added fails (504)
    /// An engine registration older than this is not counted (not ready, its models not offered).
    Duration engine_stale = std::chrono::seconds(1);
    /// How long a completed request's Idempotency-Key is replayed to other gateways (0: while it runs only).
    Duration idempotency_ttl = std::chrono::seconds(300);
    std::string gateway_id;  ///< unique per process; part of key names (valid_queue_id)
    SharedQueueKeys keys{};
    Service* local = nullptr;  ///< tensor models, and the supervised engines in /v1/engines; may be null
    metrics::ServerMetrics* metrics = nullptr;  ///< queue metrics are recorded here; may be null
  };

  struct Stats {
    std::uint64_t added = 0;
    std::uint64_t readded = 0;        ///< re-added after Redis came back without them
    std::uint64_t stale_events = 0;   ///< events of an older delivery, dropped
    std::uint64_t resumed = 0;        ///< requests another engine took over after output began
    std::uint64_t queue_timeouts = 0;
    std::uint64_t redis_restarts = 0;
    std::uint64_t attached = 0;       ///< Idempotency-Key retries that followed another gateway's running request
    std::uint64_t replayed = 0;       ///< ... that replayed another gateway's completed request
  };

  /// Connects (kConfig when Redis refuses the credentials; an unreachable
  /// Redis makes the service not ready until it answers) and starts the threads.
  static Result<std::unique_ptr<QueueService>> start(Options options);
  ~QueueService() override;

  Result<Submission> submit(const CompletionRequest& request, std::shared_ptr<EventSink> sink) override;
  std::vector<ModelInfo> models() const override;
  bool healthy(std::string* reason) const override;
  bool ready() const override;
  std::string not_ready_reason() const override;
  AdmissionState admission_state() const override;
  std::vector<EngineInfo> engine_processes() const override;
  Result<TensorSubmission> submit_tensor(TensorInferRequest request, TensorDone done) override;
  Result<TensorModelInfo> tensor_model(const std::string& name) const override;

  void begin_drain() override;
  bool wait_idle(TimePoint deadline) const override;
  /// Cancels what is left and stops the threads. Idempotent.
  void shutdown() override;
  Stats stats() const;

  struct Req;
  struct Engine;

 private:
  explicit QueueService(Options options);
  void reader_loop();
  void monitor_loop();
  void refresh_registry();
  /// Records each registered engine's counters (mu_ held) in its carry
  /// (tracking/counter_carry.hpp): a process replaced under its id retires
  /// its counts there; an id that left the registry moves its counters into
  /// retired_counters_, so the sums never go back.
  void tally_engines(const std::vector<Engine>& registered);
  void check_run_id();
  /// Re-adds requests Redis no longer has and whose answer did not arrive.
  void verify_requests(TimePoint now);
  /// The requests verify_requests checks (added over a second ago, not
  /// replaying), with kVerifyScript's KEYS and ARGV for them.
  struct VerifyCommand {
    std::vector<std::shared_ptr<Req>> check;
    RedisClient::Args keys;
    RedisClient::Args args;
  };
  VerifyCommand verify_command(TimePoint now) const;
  /// Fails the followers in `check` whose followed request's gateway has
  /// been gone (`orphaned`: their indexes) for over 5 s.
  void fail_lost_followers(const std::vector<std::shared_ptr<Req>>& check, const std::vector<RedisValue>& orphaned,
                           TimePoint now);
  /// Waits (up to 1 s) until the reader has handled the reply entry `newest`; false when it has not.
  bool wait_processed(const std::pair<std::uint64_t, std::uint64_t>& newest);
  /// Adds `r` again after Redis lost it (resuming after what was sent), or
  /// fails it where it cannot resume; nothing when its answer arrived.
  void readd_missing(const std::shared_ptr<Req>& r, TimePoint now);
  /// The queue gauges: entries per model and class, waiting per model.
  void sample_depth();
  void count(const char* kind, double n = 1);
  /// How long the gateway's alive key lives after each refresh (ms, as text).
  std::string alive_ms() const;
  /// Retry-After for a request refused while `waiting` wait: the shared
  /// queue over the measured drain rate of every engine, in [1, 59] s.
  double retry_after_s(std::int64_t waiting) const;
  void expire_waiting(TimePoint now);
  void on_reply(const std::string& rid, std::int64_t epoch, const std::string& event_json);
  /// Records and pushes one event of `r` (the reader thread, or submit() while it replays).
  void deliver(const std::shared_ptr<Req>& r, std::int64_t epoch, const std::string& event_json);
  /// Ends `r`'s replay: pushes the events that arrived meanwhile, in order.
  void end_replay(const std::shared_ptr<Req>& r);
  /// KEYS and ARGV of kCancelScript for `r` (a follower's keys, set in
  /// submit(), are read under mu_, which this takes).
  struct CancelCommand {
    RedisClient::Args keys;
    RedisClient::Args args;
  };
  CancelCommand cancel_command(const Req& r, bool only_if_not_taken) const;
  /// Removes `r` and pushes its last event (under no lock). False: it had ended already.
  bool finish(const std::shared_ptr<Req>& r, EngineEvent last);
  Status add(Req& r, std::int64_t* waiting);
  /// The request's model, cost and cost class, and its id, from the
  /// registered engines (under mu_). Errors: 503 draining or no engine of
  /// the model now, 404 unknown model, 400 what Redis mode cannot serve.
  Status price(const CompletionRequest& request, Req& r);
  /// Another gateway's request that holds the same Idempotency-Key.
  struct Follow {
    std::string followed;             ///< its request hash key
    bool done = false;                ///< it completed: its history is replayed
    std::vector<RedisValue> history;  ///< its events so far
    std::string owner;                ///< its gateway's id ("" unknown)
    std::string waiting_key, stream_key;
  };
  /// What adding a request gave: its place in the queue, or a request to follow.
  struct Placed {
    std::int64_t waiting = 0;
    std::optional<Follow> follow;
  };
  /// Adds `r` to the shared queue (kAddScript). Errors: 422 a reused
  /// Idempotency-Key, 503 what Redis did not take.
  Result<Placed> place(Req& r);
  /// Makes `r` a follower of `f` and sends it what `f` recorded so far.
  void follow(const std::shared_ptr<Req>& r, const CompletionRequest& request, const Follow& f);
  Result<RedisValue> add_raw(const Req& r);
  void cancel(const std::shared_ptr<Req>& r);

  friend class QueueHandle;

  Options options_;
  boost::asio::io_context io_;
  std::unique_ptr<RedisClient> client_;  // commands
  std::unique_ptr<RedisClient> reader_;  // XREAD BLOCK on the reply stream
  std::thread io_thread_;
  std::thread reader_thread_;
  std::thread monitor_thread_;
  std::atomic<bool> stopping_{false};
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;                  // with mu_: requests ended, stopping
  std::map<std::string, std::shared_ptr<Req>> reqs_;    // guarded by mu_: rid -> unfinished request
  std::vector<Engine> engines_;                         // guarded by mu_: fresh registrations, by id
  std::set<std::string> seen_models_;                   // guarded by mu_: every model an engine ever registered
  std::map<std::string, std::map<std::string, std::int64_t>> engine_counts_;  // monitor thread: engine -> kind -> last
  std::set<std::pair<std::string, int>> nonzero_classes_;  // monitor thread: gauges last set above 0
  std::int64_t finished_total_ = 0;                      // monitor thread: requests the engines ended, summed
  std::deque<std::pair<TimePoint, std::int64_t>> finished_samples_;  // monitor thread: (when, finished_total_)
  double drain_rate_ = 0;                                // guarded by mu_: requests/s the engines end (10 s window)
  /// Each registered engine's counters across the processes under its id.
  std::map<std::string, tracking::CounterCarry> carries_;  // guarded by mu_: engine id -> its counters
  Counters retired_counters_;                              // guarded by mu_: of engine ids no longer registered
  std::string run_id_;                                  // monitor thread only
  std::pair<std::uint64_t, std::uint64_t> processed_{};  // guarded by mu_: newest reply entry handled
  std::uint64_t next_rid_ = 1;                          // guarded by mu_
  bool draining_ = false;                               // guarded by mu_
  Stats stats_{};                                       // guarded by mu_
};

}  // namespace queue
}  // namespace vg
