// The engine process's side of the wire protocol (protocol.hpp): listens on
// a Unix socket, admits gateways that present the engine's secret (and run
// as the same user), and serves each connection's messages from `service`
// (the in-process engines: admission, the byte ledger and the models live
// behind it). Sends a status heartbeat to every gateway each `heartbeat`.
//
// Threads: an accept thread, a heartbeat thread, and a reader and a writer
// thread per connection (wire/channel.hpp). Public methods: any thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "api/service.hpp"
#include "common/clock.hpp"
#include "common/error.hpp"
#include "wire/protocol.hpp"

namespace vg {
namespace metrics {
class ServerMetrics;
}

namespace wire {

class Channel;

class EngineServer {
 public:
  struct Options {
    std::string socket_path;  ///< listens here (mode 0600; its folder should be 0700)
    std::string secret;       ///< a gateway's hello must carry it
    Duration heartbeat = std::chrono::milliseconds(250);
    // What the hello tells a gateway about this engine.
    std::vector<std::string> devices;
    std::string model_dir;
    std::string config_digest;  ///< of the settings it runs with: a supervisor re-attaches only on a match
    double load_s = 0;          ///< seconds from process start to serving
    double started_at = 0;      ///< unix seconds of the process start
    /// Test hook: abort the process when a request whose prompt (or a chat
    /// message) contains this text starts running. Empty: off.
    std::string crash_on_prompt;
    /// With crash_on_prompt: the text of a request's prompt (a gateway sends
    /// token ids); unset: only a prompt sent as text is matched.
    std::function<std::string(const CompletionRequest&)> prompt_text;
    /// Engine-recorded metrics sent to gateways (histograms, generated tokens); null: none.
    metrics::ServerMetrics* metrics = nullptr;
  };

  /// Binds the socket and starts serving. Errors: kConfig (cannot listen).
  static Result<std::unique_ptr<EngineServer>> start(Options options, Service& service);
  ~EngineServer();

  /// Gateways connected and past their hello.
  int connections() const;
  /// When the last gateway left (or the server started, if none came yet);
  /// nullopt while one is connected.
  std::optional<TimePoint> alone_since() const;
  /// True once a supervising gateway released this engine (on its clean
  /// shutdown): the engine should exit when no gateway is connected.
  bool released() const { return released_.load(); }
  /// Waits until every frame queued on the connections (events already
  /// pushed) has been written, at most `timeout_s` in all; true when all
  /// were. For an engine about to exit, so its gateways keep every token it
  /// computed before.
  bool flush(double timeout_s);
  /// Stops accepting and closes every connection (their requests are cancelled).
  void stop();

 /// One gateway connection (internal to engine_server.cpp).
  struct Conn;

 private:
  EngineServer(Options options, Service& service, int listen_fd);
  void accept_loop();
  void heartbeat_loop();
  void serve(std::shared_ptr<Conn> conn);
  /// One message of a gateway's connection, on its reader thread.
  void handle(const std::shared_ptr<Conn>& conn, ToEngine message);
  /// A completion request: accepted (then its events) or rejected.
  void on_submit(const std::shared_ptr<Conn>& conn, Submit m);
  /// A tensor request: accepted (then one InferDone) or rejected.
  void on_infer(const std::shared_ptr<Conn>& conn, Infer m);
  void on_cancel(Conn& conn, std::uint64_t rid);
  void on_withdraw(Conn& conn, std::uint64_t rid);
  void on_closed(const std::shared_ptr<Conn>& conn, const std::string& reason);
  /// Whether `r` trips the crash_on_prompt test hook.
  bool poisoned(const CompletionRequest& r) const;
  /// What this engine's hello tells a gateway.
  EngineHello hello_reply() const;

  Options options_;
  Service& service_;
  int listen_fd_;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> released_{false};
  std::uint64_t socket_inode_ = 0;  // of the socket it created (stop() removes only that one)
  mutable std::mutex mu_;
  std::vector<std::shared_ptr<Conn>> conns_;  // guarded by mu_
  TimePoint alone_since_;                     // guarded by mu_
  int hellos_ = 0;                            // guarded by mu_: connections still in their hello
  std::condition_variable conns_cv_;          // with mu_: conns_ or hellos_ went down
  std::thread accept_thread_;
  std::thread heartbeat_thread_;
  std::mutex hb_mu_;
  std::condition_variable hb_cv_;
};

}  // namespace wire
}  // namespace vg
