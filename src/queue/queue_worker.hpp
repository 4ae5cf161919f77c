// The engine side of Redis mode: pulls requests from the shared queue
// (shared_queue.hpp) into this engine's own admission, only while nothing
// waits in it and only from cost classes its free budget holds, and sends
// their events back to the gateway that owns each client. It registers the
// engine (models, devices, free budget, running) every heartbeat, keeps the
// claim of what it holds alive, stops what a gateway cancelled or lost, and
// claims requests of an engine that died or stalled past `claim_idle`
// (resuming after the tokens already sent, as preemption does).
//
// The engine's ledger is still the only guarantee: a request whose real
// cost is above the class bound the gateway computed waits in the local
// queue like any other.
//
// Threads: a puller thread (blocking reads on one connection), a
// heartbeat thread, and the Redis client's io thread (events go out from
// the engine's threads through asynchronous commands, in the order pushed).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio/io_context.hpp>

#include "api/service.hpp"
#include "common/clock.hpp"
#include "common/error.hpp"
#include "queue/redis_client.hpp"
#include "queue/shared_queue.hpp"

namespace vg::queue {

/// Connects once to `url` and closes: kConfig when Redis refuses the
/// credentials or the database (so a process can stop before loading
/// anything); ok when connected, or when Redis was merely unreachable within
/// `timeout` (the caller starts anyway and connects later). Blocks.
Status check_credentials(const RedisUrl& url, Duration timeout);

class QueueWorker {
 public:
  struct Options {
    RedisUrl url;
    Duration command_timeout = std::chrono::milliseconds(250);
    Duration heartbeat = std::chrono::milliseconds(250);
    /// A request whose holder has not touched it for this long is claimed.
    Duration claim_idle = std::chrono::seconds(2);
    /// A held request whose gateway's alive key stays missing this long is
    /// stopped (its gateway died); shorter gaps (a Redis restart) are waited out.
    Duration gateway_grace = std::chrono::seconds(3);
    /// A request claimed after this many of its engines crashed or stalled
    /// is dead-lettered instead (its client gets engine_crashed).
    int max_crash_retries = 2;
    /// Sequences the engine runs at once (its max batch over its devices and
    /// models; 0: no limit): at that many it takes nothing more, so an entry
    /// it could only queue stays for another engine.
    int max_running = 0;
    std::string engine_id;   ///< unique per process (host-pid-random); a consumer name
    std::string host;        ///< for /v1/engines
    std::vector<std::string> devices;
    /// Test hook: abort when a request whose prompt contains this starts. Empty: off.
    std::string crash_on_prompt;
    SharedQueueKeys keys{};
  };

  struct Stats {
    std::uint64_t taken = 0;
    std::uint64_t claimed = 0;
    std::uint64_t dead_lettered = 0;
    std::uint64_t fenced = 0;  ///< requests stopped because another delivery, a cancel or a gone gateway took them
  };

  /// Connects (waits up to the connect deadline: kConfig for refused
  /// credentials; an unreachable Redis is retried in the background) and
  /// starts the threads.
  static Result<std::unique_ptr<QueueWorker>> start(Options options, Service& service);
  ~QueueWorker();

  /// Stops pulling; what is held goes on and reports as usual.
  void stop_pulling();
  /// Stops everything (requests still held are cancelled). Idempotent.
  void stop();
  Stats stats() const;
  bool connected() const;

  struct Held;
  /// Appends `event` to the request's outbox and writes it (QueueSink::push). Any thread.
  void enqueue(const std::shared_ptr<Held>& held, EngineEvent event);

 private:
  /// Writes the head of the outbox (one batch in flight per request).
  void send(const std::shared_ptr<Held>& held);
  void on_sent(const std::shared_ptr<Held>& held, std::size_t n, Result<RedisValue> reply);
  /// Stops a request that is no longer this engine's (cancels it here, writes nothing more).
  void stop_held(const std::shared_ptr<Held>& held, const std::string& why);
  /// Forgets a request whose last event was written (or that was stopped).
  void release(const std::shared_ptr<Held>& held);
  QueueWorker(Options options, Service& service);
  void pull_loop();
  void heartbeat_loop();
  /// Takes one entry of `model` that fits `free_bytes`; false when there was none.
  bool pull_once_model(const std::string& model, std::int64_t free_bytes);
  void claim_round(std::int64_t free_bytes);
  void handle_taken(const std::string& model, TakenEntry entry, bool claimed);
  void dead_letter(const std::string& model, const TakenEntry& entry, const std::string& reason);
  void heartbeat();
  std::int64_t free_budget(bool* may_pull) const;
  std::vector<std::string> class_streams(const std::string& model, std::int64_t free_bytes) const;
  /// Deletes the consumers of gone engines (nothing pending, idle 10 min),
  /// or with `only` that consumer if nothing is pending for it.
  void prune_consumers(const std::string& only);

  Options options_;
  Service& service_;
  boost::asio::io_context io_;
  std::unique_ptr<RedisClient> client_;    // events, takes, heartbeats
  std::unique_ptr<RedisClient> blocking_;  // BLPOP on the bells
  std::thread io_thread_;
  std::thread pull_thread_;
  std::thread heartbeat_thread_;
  std::atomic<bool> pulling_{true};
  std::atomic<bool> stopping_{false};
  mutable std::mutex mu_;
  std::condition_variable cv_;                            // with mu_: stopping
  std::map<std::string, std::shared_ptr<Held>> held_;     // guarded by mu_: rid -> what this engine runs
  Stats stats_{};                                         // guarded by mu_
  TimePoint last_claim_{};                                // pull thread only
  TimePoint last_prune_{};                                // pull thread only: consumers of gone engines removed
  bool was_connected_ = false;                            // heartbeat thread (after start)
  double started_at_ = 0;                                 // unix seconds
  std::uint64_t connects_seen_ = 0;                       // pull thread only: RedisClient connects
  TimePoint no_claims_until_{};                           // pull thread only: a grace after (re)connecting
};

}  // namespace vg::queue
