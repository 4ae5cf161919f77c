// Engine process supervision (see engine_process.hpp).
#include "gateway/engine_process.hpp"

#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <sstream>
#include <thread>

#include "gateway/engine_link.hpp"
#include "wire/channel.hpp"
#include "wire/protocol.hpp"

extern char** environ;

namespace vg::gateway {

const char* state_name(EngineState state) {
  switch (state) {
    case EngineState::kStarting: return "starting";
    case EngineState::kReady: return "ready";
    case EngineState::kNotReady: return "not_ready";
    case EngineState::kRestarting: return "restarting";
    case EngineState::kGone: return "gone";
  }
  return "unknown";
}

std::string exit_text(int status) {
  if (WIFEXITED(status)) return "exit " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return "signal " + std::to_string(WTERMSIG(status));
  return "status " + std::to_string(status);
}

std::vector<std::pair<pid_t, int>> reap_exited() {
  std::vector<std::pair<pid_t, int>> out;
  while (true) {
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid <= 0) return out;
    out.emplace_back(pid, status);
  }
}

std::string take_start_failure(const std::string& socket_path) {
  std::string why;
  const std::string why_path = wire::start_failure_path(socket_path);
  if (std::ifstream in(why_path); in) std::getline(in, why);
  ::unlink(why_path.c_str());
  return why;
}

Result<pid_t> spawn_process(const std::vector<std::string>& command) {
  std::vector<char*> argv;
  for (const std::string& a : command) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = 0;
  // The engine gets stdin/stdout/stderr only: not the gateway's listening
  // socket or its connections (they would outlive the gateway in it).
  posix_spawn_file_actions_t files;
  ::posix_spawn_file_actions_init(&files);
  ::posix_spawn_file_actions_addclosefrom_np(&files, 3);
  const int rc = ::posix_spawn(&pid, argv[0], &files, nullptr, argv.data(), environ);
  ::posix_spawn_file_actions_destroy(&files);
  if (rc != 0) return Error(ErrorCode::kInternal, std::strerror(rc));
  return pid;
}

Status EngineProcess::spawn(const std::vector<std::string>& command, const std::string& socket_path, TimePoint now,
                            const BackoffOptions& backoff) {
  ::unlink(socket_path.c_str());
  // Why an earlier start failed is not this start's reason (an engine that
  // exits 2 before it can remove the file writes none).
  ::unlink(wire::start_failure_path(socket_path).c_str());
  Result<pid_t> started = spawn_process(command);
  if (!started.ok()) {
    next_start = now + from_seconds(backoff_s);
    backoff_s = std::min(backoff.max_s, backoff_s * 2);
    return started.error();
  }
  pid = *started;
  child = true;
  spawned = now;
  started_at = unix_seconds_now();
  return Status::Ok();
}

void EngineProcess::ended(int status) {
  pid = 0;
  child = false;
  // Killed for a missed heartbeat: that is why it ended (SIGKILL says less).
  if (!heartbeat_kill) last_exit = exit_text(status);
  heartbeat_kill = false;
}

bool EngineProcess::start_failed(int status, TimePoint connected) const {
  const bool unusable = WIFEXITED(status) && (WEXITSTATUS(status) == 1 || WEXITSTATUS(status) == 2);
  return unusable && connected == TimePoint{};
}

double EngineProcess::schedule_restart(TimePoint now, TimePoint connected, const BackoffOptions& backoff) {
  const bool stable = connected != TimePoint{} && now - connected > from_seconds(backoff.stable_after_s);
  if (stable) backoff_s = backoff.initial_s;
  const double delay = backoff_s;
  next_start = now + from_seconds(delay);
  ++restarts;
  backoff_s = std::min(backoff.max_s, backoff_s * 2);
  return delay;
}

void EngineProcess::replace_attached(TimePoint now) {
  ::kill(pid, SIGKILL);
  pid = 0;
  ++restarts;
  next_start = now + from_seconds(backoff_s);
}

void EngineProcess::kill_hung(bool supervised) {
  if (pid <= 0 || !supervised) return;
  heartbeat_kill = child;  // its exit, reaped here, keeps this reason
  ::kill(pid, SIGKILL);
}

void wait_for_children(const std::vector<pid_t>& children, double grace_s) {
  const TimePoint deadline = Clock::now() + from_seconds(grace_s);
  for (pid_t pid : children) {
    while (true) {
      int status = 0;
      const pid_t r = ::waitpid(pid, &status, WNOHANG);
      if (r == pid || r < 0) break;
      if (Clock::now() >= deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
}

namespace {

/// True while process `pid` runs: it exists and is not a zombie (an engine
/// whose parent died is reaped by whoever adopted it, maybe never).
bool process_runs(std::int64_t pid) {
  if (::kill(static_cast<pid_t>(pid), 0) != 0) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const std::size_t close = text.rfind(')');  // the state follows the command name
  if (close == std::string::npos) return true;
  const std::size_t state = text.find_first_not_of(' ', close + 1);
  return state == std::string::npos || text[state] != 'Z';
}

/// The device a --device entry names, index as a number: "virt:2" of
/// "virt:02=64MiB"; "auto" as it is; the text before any '=' when it is
/// neither (an engine's own spelling, compared as written).
std::string device_name(const std::string& spec) {
  const std::string name = spec.substr(0, spec.find('='));
  const std::size_t colon = name.find(':');
  if (colon == std::string::npos || colon + 1 >= name.size() || name.size() - colon > 10) return name;
  long index = 0;
  for (std::size_t i = colon + 1; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return name;
    index = index * 10 + (name[i] - '0');
  }
  return name.substr(0, colon) + ":" + std::to_string(index);
}

/// True when two device entries can be the same device ("auto" is cuda:0 or virt:0).
bool same_device(const std::string& a, const std::string& b) {
  const std::string x = device_name(a), y = device_name(b);
  if (x == y) return true;
  const auto auto_one = [](const std::string& n) { return n == "cuda:0" || n == "virt:0"; };
  return (x == "auto" && auto_one(y)) || (y == "auto" && auto_one(x));
}

/// The engine sockets in `runtime_dir` that are not one of `own` (normalised paths), sorted.
std::vector<std::string> other_sockets(const std::string& runtime_dir, const std::set<std::string>& own) {
  std::error_code ec;
  std::vector<std::string> sockets;
  for (const auto& entry : std::filesystem::directory_iterator(runtime_dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("engine-", 0) == 0 && entry.path().extension() == ".sock" &&
        !own.count(entry.path().lexically_normal().string())) {
      sockets.push_back(entry.path().string());
    }
  }
  std::sort(sockets.begin(), sockets.end());
  return sockets;
}

/// SIGTERM to `pid`, then SIGKILL when it still runs after `grace_s`.
void stop_process(std::int64_t pid, double grace_s) {
  ::kill(static_cast<pid_t>(pid), SIGTERM);
  // It holds device memory until it exits: wait for that before ours load.
  const TimePoint deadline = Clock::now() + from_seconds(grace_s);
  while (process_runs(pid) && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (process_runs(pid)) {
    spdlog::error("engine pid {} still runs {:.0f} s after SIGTERM; killing it", pid, grace_s);
    ::kill(static_cast<pid_t>(pid), SIGKILL);
  }
}

/// Stops the engine at `path` when it holds one of `our_devices` and no
/// gateway uses it. Errors: kConfig when another gateway uses it.
Status stop_if_on_our_devices(const std::string& path, const std::vector<std::string>& our_devices, double grace_s) {
  auto fd = wire::connect_unix(path);
  if (!fd.ok()) return Status::Ok();  // nothing accepts there: an engine that is gone
  ucred peer{};
  socklen_t peer_len = sizeof peer;
  if (::getsockopt(*fd, SOL_SOCKET, SO_PEERCRED, &peer, &peer_len) != 0) peer.pid = 0;
  HelloReply reply = say_hello(*fd, path + ".secret");
  ::close(*fd);
  if (reply.gone) return Status::Ok();
  if (!reply.refused.empty()) {
    // Which devices it holds is unknown without its hello: it may be on
    // none of ours, so it is not stopped; the operator is told its pid.
    spdlog::warn(
        "engine at unix:{} (pid {}, another layout's socket): {}; left as it is: if it holds one of "
        "this serve's devices, stop it (kill {})",
        path, peer.pid, reply.refused, peer.pid);
    return Status::Ok();
  }
  std::vector<std::string> shared;
  for (const std::string& theirs : reply.hello.devices) {
    for (const std::string& mine : our_devices) {
      if (same_device(theirs, mine)) shared.push_back(device_name(theirs));
    }
  }
  if (shared.empty()) return Status::Ok();  // other devices: another serve's, left alone
  const std::int64_t pid = reply.hello.pid, gateways = reply.hello.gateways;
  std::string names;
  for (const std::string& n : shared) names += (names.empty() ? "" : ", ") + n;
  if (gateways > 0) {
    return Error(ErrorCode::kConfig,
                 fmt::format("the engine at unix:{} (pid {}) runs on {} for {} other gateway(s) with another "
                             "layout of devices; not stopping it: stop that serve, or give this one other "
                             "--device or --runtime-dir",
                             path, pid, names, gateways));
  }
  if (pid <= 0 || pid == ::getpid()) return Status::Ok();
  spdlog::warn(
      "stopping the engine at unix:{} (pid {}): it holds {} with another layout of devices and no "
      "gateway uses it",
      path, pid, names);
  stop_process(pid, grace_s);
  return Status::Ok();
}

}  // namespace

Status stop_engines_of_other_layouts(const std::string& runtime_dir, const std::vector<EngineEndpoint>& ours,
                                     double grace_s) {
  std::set<std::string> own;
  std::vector<std::string> our_devices;
  for (const EngineEndpoint& ep : ours) {
    own.insert(std::filesystem::path(ep.socket_path).lexically_normal().string());
    std::stringstream list(ep.device);
    for (std::string d; std::getline(list, d, ',');) our_devices.push_back(d);
  }
  for (const std::string& path : other_sockets(runtime_dir, own)) {
    if (Status st = stop_if_on_our_devices(path, our_devices, grace_s); !st.ok()) return st;
  }
  return Status::Ok();
}

}  // namespace vg::gateway
