// An asynchronous Redis client of our own: one connection (hiredis 0.14's
// redisAsyncContext) driven by an Asio io_context through an adapter of the
// five hiredis event hooks, with what hiredis 0.14 lacks: a deadline on every
// command, a deadline on connecting (TCP + AUTH + SELECT + PING), and
// reconnection with backoff. hiredis stays in redis_client.cpp.
//
// Threads. The client runs on a strand of the io_context it is given: the
// connection, every timer, and every callback. Callbacks passed to command()
// run on that strand, one at a time, never inside the call that passed them.
// command(), state(), connected(), last_error(), stats() may be called from
// any thread. command_sync() and wait_connected() block: call them only from
// a thread that is not running the io_context (they refuse, with kInternal,
// on one that is). Destroy the client (or call close()) from a thread that
// is not running the io_context, from inside one of its callbacks, or once
// no thread runs the io_context; the io_context must outlive the client.
//
// Errors a command's callback gets (each callback is called exactly once):
//   kTimeout     the command had no reply within its deadline. hiredis 0.14
//                cannot drop one pending reply, so the connection is then
//                torn down and re-established; every other command pending
//                on it fails with kOverloaded.
//   kOverloaded  not connected (connecting, reconnecting, or the server
//                refused us), or the connection was lost with the command
//                pending. Fails at once, never waits for a reconnect.
//   kCancelled   the client was closed with the command pending.
//   kInvalidRequest  an empty command.
// A command failed with kTimeout or kOverloaded may still have run on the
// server (it was sent; only its reply was lost): callers make such commands
// idempotent or look before retrying. An error *reply* from Redis (e.g.
// WRONGTYPE) is not an Error: it is a RedisValue of kind kError, since the
// command did run.
//
// Signals: hiredis 0.14 writes with write(2), not send(MSG_NOSIGNAL), so a
// write to a connection already known to be reset raises SIGPIPE. hiredis
// drops a connection at its first write or read error, which makes this
// rare, but a process using the client should ignore SIGPIPE (main's job).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <boost/asio/io_context.hpp>

#include "common/clock.hpp"
#include "common/error.hpp"
#include "queue/redis_url.hpp"
#include "queue/redis_value.hpp"

namespace vg::queue {

class RedisClient {
 public:
  struct Options {
    RedisUrl url;  ///< host, port, credentials (AUTH [user] password on connect) and db (SELECT on connect)
    /// One connection attempt: TCP connect, AUTH, SELECT and a PING all answered within it.
    Duration connect_timeout = std::chrono::seconds(2);
    /// The deadline of a command given none of its own.
    Duration command_timeout = std::chrono::seconds(1);
    /// Wait before the first reconnect; doubled after each failed attempt up
    /// to reconnect_max; back to reconnect_min once connected.
    Duration reconnect_min = std::chrono::milliseconds(50);
    Duration reconnect_max = std::chrono::seconds(2);
  };

  enum class State {
    kConnecting,    ///< an attempt is under way (TCP or the AUTH/SELECT/PING handshake)
    kReady,         ///< commands are sent
    kDisconnected,  ///< waiting for the next attempt (backoff)
    kClosed,        ///< close() was called
  };

  /// Counters since creation (any thread).
  struct Stats {
    std::uint64_t connects = 0;         ///< attempts that reached kReady
    std::uint64_t failed_attempts = 0;  ///< attempts that did not
    std::uint64_t disconnects = 0;      ///< ready connections lost (torn down or closed by the server)
    std::uint64_t timeouts = 0;         ///< commands failed with kTimeout
  };

  using Args = std::vector<std::string>;
  using Callback = std::function<void(Result<RedisValue>)>;

  /// A client that starts connecting at once (on `io`'s threads) and keeps
  /// reconnecting until closed. Errors: kConfig for a non-positive timeout,
  /// an empty host, a user without a password, or reconnect_min >
  /// reconnect_max. A host name is resolved (getaddrinfo, blocking) on the
  /// strand at each attempt: prefer an IP address.
  static Result<std::unique_ptr<RedisClient>> create(boost::asio::io_context& io, Options options);
  ~RedisClient();
  RedisClient(const RedisClient&) = delete;
  RedisClient& operator=(const RedisClient&) = delete;

  /// Sends `args` (argv form, binary safe: any bytes, NULs included) with
  /// the default deadline, or with `timeout` from now. `done` is called once
  /// on the client's strand with the reply or an error (see the top of this
  /// file). Commands from one thread are sent in the order given.
  void command(Args args, Callback done);
  void command(Args args, Duration timeout, Callback done);

  /// command() that waits for its reply. Not on an io_context thread
  /// (kInternal there, since it would wait for itself).
  Result<RedisValue> command_sync(Args args, Duration timeout);

  /// Waits until connected, at most `timeout`. Returns at once with the
  /// server's refusal when an attempt was refused for good reason (kConfig:
  /// wrong password, unknown user, bad db); kOverloaded naming the last
  /// attempt's failure when the timeout passes. Not on an io_context thread.
  Status wait_connected(Duration timeout);

  State state() const { return state_->load(); }
  bool connected() const { return state() == State::kReady; }
  /// Why the last attempt failed or the last connection was lost (empty
  /// once connected, until the next loss).
  Error last_error() const;
  Stats stats() const;
  /// The endpoint without its password, for logs.
  const std::string& endpoint() const { return endpoint_; }

  /// Closes the connection; commands pending fail with kCancelled, later
  /// ones too. Idempotent; see the top of this file for where to call it.
  void close();

 private:
  struct Impl;
  explicit RedisClient(std::shared_ptr<Impl> impl);

  std::shared_ptr<Impl> impl_;
  std::shared_ptr<std::atomic<State>> state_;
  std::string endpoint_;
};

/// The name of a State, e.g. "ready".
const char* state_name(RedisClient::State state);

}  // namespace vg::queue
