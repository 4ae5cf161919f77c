// A redis-server of the tests' own: started on a free loopback port with a
// temporary folder and no persistence (--save '' --appendonly no), ready
// once it answers PING (polled with a deadline), stopped in the destructor.
// One test thread drives it.
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <string>
#include <vector>

namespace vg::queue::testing {

class RedisServer {
 public:
  /// redis-server's path found on PATH, or empty.
  static std::string find_binary();

  RedisServer() = default;
  ~RedisServer();
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  /// Starts it (on the port of the previous start, else on a free one) with
  /// `extra` arguments, and waits until it answers PING (10 s at most).
  /// Returns an empty string, or why it did not start (with its log's tail).
  std::string start(const std::vector<std::string>& extra = {});
  /// SIGTERM, then waits for the exit. No-op when not running.
  void stop();
  /// SIGKILL (as a crash), then waits for the exit.
  void kill();
  /// SIGSTOP / SIGCONT: the process keeps its port but answers nothing.
  void pause();
  void resume();

  bool running() const { return pid_ > 0; }
  int port() const { return port_; }
  /// redis://127.0.0.1:PORT plus `suffix` (e.g. "/3").
  std::string url(const std::string& suffix = "") const;
  /// redis://USER:PASSWORD@127.0.0.1:PORT (the arguments as given, not encoded).
  std::string url_as(const std::string& user_password) const;
  const std::filesystem::path& dir() const { return dir_; }

 private:
  void signal_and_wait(int sig);
  std::string log_tail() const;

  pid_t pid_ = -1;
  int port_ = 0;
  bool paused_ = false;
  std::filesystem::path dir_;
};

/// A port on 127.0.0.1 that was free a moment ago (bound to port 0 and released).
int free_port();

}  // namespace vg::queue::testing
