// The tests' redis-server (see redis_server.hpp).
#include "redis_server.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

extern char** environ;

namespace vg::queue::testing {
namespace {

// One PING over a fresh TCP connection; true on "+PONG".
bool answers_ping(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  timeval tv{0, 500000};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bool ok = false;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
    const char ping[] = "PING\r\n";
    if (::send(fd, ping, sizeof ping - 1, MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof ping - 1)) {
      char buf[16] = {};
      ssize_t n = ::recv(fd, buf, sizeof buf - 1, 0);
      ok = n >= 5 && std::strncmp(buf, "+PONG", 5) == 0;
    }
  }
  ::close(fd);
  return ok;
}

}  // namespace

int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = 0;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int port = 0;
  if (fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
    socklen_t len = sizeof addr;
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) port = ntohs(addr.sin_port);
  }
  if (fd >= 0) ::close(fd);
  return port;
}

std::string RedisServer::find_binary() {
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path != nullptr ? path : "/usr/bin:/bin");
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    if (dir.empty()) continue;
    std::string candidate = dir + "/redis-server";
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

RedisServer::~RedisServer() {
  kill();
  if (!dir_.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
}

std::string RedisServer::url(const std::string& suffix) const {
  return "redis://127.0.0.1:" + std::to_string(port_) + suffix;
}

std::string RedisServer::url_as(const std::string& user_password) const {
  return "redis://" + user_password + "@127.0.0.1:" + std::to_string(port_);
}

std::string RedisServer::log_tail() const {
  std::ifstream in(dir_ / "redis.log");
  std::stringstream all;
  all << in.rdbuf();
  std::string text = all.str();
  return text.size() > 2000 ? text.substr(text.size() - 2000) : text;
}

std::string RedisServer::start(const std::vector<std::string>& extra) {
  if (running()) return "already running";
  std::string binary = find_binary();
  if (binary.empty()) {
    return "redis-server is not on PATH (Debian package redis-server; scripts/install-deps --test installs it)";
  }
  if (dir_.empty()) {
    std::string tmpl = (std::filesystem::temp_directory_path() / "vg-redis-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) return "mkdtemp failed: " + std::string(std::strerror(errno));
    dir_ = tmpl;
  }
  if (port_ == 0) port_ = free_port();
  if (port_ == 0) return "no free port";

  std::vector<std::string> args = {binary,        "--port",      std::to_string(port_),
                                   "--bind",      "127.0.0.1",   "--dir",
                                   dir_.string(), "--save",      "",
                                   "--appendonly", "no",         "--daemonize",
                                   "no",          "--logfile",   (dir_ / "redis.log").string()};
  args.insert(args.end(), extra.begin(), extra.end());
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  int rc = ::posix_spawn(&pid, binary.c_str(), nullptr, nullptr, argv.data(), environ);
  if (rc != 0) return "posix_spawn redis-server: " + std::string(std::strerror(rc));
  pid_ = pid;
  paused_ = false;

  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return "redis-server exited at start-up (port " + std::to_string(port_) + "); its log:\n" + log_tail();
    }
    if (answers_ping(port_)) return "";
    std::this_thread::sleep_for(std::chrono::milliseconds(10));  // polling, bounded by the deadline
  }
  kill();
  return "redis-server did not answer PING on port " + std::to_string(port_) + " within 10 s; its log:\n" + log_tail();
}

void RedisServer::signal_and_wait(int sig) {
  if (!running()) return;
  if (paused_ && sig != SIGKILL) ::kill(pid_, SIGCONT);
  ::kill(pid_, sig);
  int status = 0;
  while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  pid_ = -1;
  paused_ = false;
}

void RedisServer::stop() { signal_and_wait(SIGTERM); }
void RedisServer::kill() { signal_and_wait(SIGKILL); }

void RedisServer::pause() {
  if (running() && !paused_ && ::kill(pid_, SIGSTOP) == 0) paused_ = true;
}

void RedisServer::resume() {
  if (running() && paused_ && ::kill(pid_, SIGCONT) == 0) paused_ = false;
}

}  // namespace vg::queue::testing
