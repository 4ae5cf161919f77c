// The gateways' shared rate limits on Redis (docs/redis.md "Redis mode"): a
// traffic::SharedRateLimits whose buckets are StreamQueue::take_tokens
// buckets (one Lua script on Redis's clock), so every gateway on the same
// Redis takes from the same bucket of a client.
//
// Keys: PREFIX:rate:{H}, H the first 32 hex characters of the SHA-256 of the
// client identity the local limiter uses ("key:<scope>" or "addr:<ip>"), so
// Redis holds no address or key digest in the clear and every key is one
// Cluster slot. A bucket expires once it would have refilled (the script's
// PEXPIRE), so idle clients cost nothing.
//
// Threads. The client runs on an io_context of its own, on one thread
// started here. take() is called from HTTP threads and waits there for the
// answer (RedisClient's deadline bounds the wait; a Redis that is not
// connected fails at once), so a stalled Redis holds an HTTP thread for at
// most one command deadline, after which the connection is torn down and
// further takes fail at once until it is back. Between requests a PING
// every `health_interval` keeps the state fresh, so /ready turns 503 within
// about health_interval + command_timeout of Redis stalling, and a PING
// that comes back (after a reconnect) turns it 200 again.
//
// Any method may be called from any thread but the client's own; destroy
// it from a thread that is not its own (it joins that thread).
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>

#include "queue/redis_client.hpp"
#include "queue/stream_queue.hpp"
#include "traffic/shared_rate_limits.hpp"

namespace vg::queue {

class RedisRateLimits final : public traffic::SharedRateLimits {
 public:
  struct Options {
    RedisUrl url;                                                ///< with its password resolved
    Duration command_timeout = std::chrono::milliseconds(250);  ///< deadline of one take (all its round trips)
    Duration connect_timeout = std::chrono::seconds(1);         ///< one connection attempt (TCP, AUTH, SELECT, PING)
    Duration health_interval = std::chrono::milliseconds(250);  ///< PING period
    std::string prefix = "vg:q";                                 ///< key prefix (StreamQueue's)
  };

  /// Starts the thread and the client (which connects in the background).
  /// Errors: kConfig as RedisClient::create.
  static Result<std::unique_ptr<RedisRateLimits>> create(Options options);
  ~RedisRateLimits() override;
  RedisRateLimits(const RedisRateLimits&) = delete;
  RedisRateLimits& operator=(const RedisRateLimits&) = delete;

  /// Waits for the first connection, at most `timeout` (RedisClient::wait_connected):
  /// kConfig at once when Redis refused our credentials or database.
  Status wait_connected(Duration timeout);

  Result<traffic::RateDecision> take(std::string_view client, const traffic::RateLimit& limit) override;
  std::string unavailable_reason() const override;

  /// The bucket key of a client identity (see the top of this file).
  static std::string bucket_name(std::string_view client);

  RedisClient::State state() const { return client_->state(); }
  const std::string& endpoint() const { return client_->endpoint(); }

 private:
  explicit RedisRateLimits(Options options);
  void schedule_ping();
  void ping();
  void note(bool reachable, const std::string& why);
  /// "Redis at ENDPOINT is STATE: why", from the client's state and last error.
  std::string describe() const;

  const Options options_;
  boost::asio::io_context io_;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work_;
  boost::asio::steady_timer ping_timer_;  // on io_'s one thread
  std::unique_ptr<RedisClient> client_;
  std::unique_ptr<StreamQueue> queue_;
  std::thread thread_;
  std::atomic<bool> stopping_{false};
  std::mutex log_mu_;
  bool logged_unreachable_ = false;  // guarded by log_mu_: a warning is logged once per outage
};

}  // namespace vg::queue
