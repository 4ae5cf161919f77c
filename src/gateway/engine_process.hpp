// The supervision of engine processes: each engine's state (an enum with its
// transitions below), starting a supervised engine (posix_spawn), reaping
// the ones that ended, the restart backoff, killing a hung one, and
// stopping engines of another serve's layout before this one starts.
// Connecting and the hello are the link's (engine_link.hpp); RemoteService
// decides when, from its monitor thread. Torch-free.
//
// Threads: EngineProcess is not synchronised (RemoteService::mu_ guards
// each); the free functions from any thread, each saying what it blocks on.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/clock.hpp"
#include "common/error.hpp"

namespace vg::gateway {

/// An engine's state as /v1/engines shows it. Transitions:
///   kStarting   --its hello accepted--------------------> kReady
///   kReady     <--its status says (not) ready-----------> kNotReady
///   any         --its process ended, or its connection
///                 closed, and it is supervised-----------> kRestarting
///   kRestarting --started again: kRestarting; hello------> kReady
///   any         --could not start (left out), its
///                 connection closed while stopping, or an
///                 engine someone else runs went away-----> kGone
enum class EngineState { kStarting, kReady, kNotReady, kRestarting, kGone };

/// Its name in /v1/engines and logs: "starting", "ready", "not_ready", "restarting", "gone".
const char* state_name(EngineState state);

/// How supervised engines restart.
struct BackoffOptions {
  double initial_s = 0.5;  ///< first restart delay; doubled per crash up to max_s
  double max_s = 30;
  double stable_after_s = 60;  ///< an engine connected this long restarts with initial_s again
};

/// One engine's process as its supervisor sees it.
struct EngineProcess {
  pid_t pid = 0;                ///< its process (0: none known)
  bool child = false;           ///< started by this gateway (reap_exited() reaps it)
  bool heartbeat_kill = false;  ///< killed for a missed heartbeat, not reaped yet
  int restarts = 0;
  std::string last_exit;            ///< why its last process ended ("exit 1", "signal 9", "no heartbeat ...")
  double started_at = 0;            ///< unix seconds its current process started
  TimePoint spawned{};              ///< when this gateway started its current process
  TimePoint next_start{};           ///< supervised, no process: start at this time
  double backoff_s = 0;             ///< the next restart's delay
  bool tried_attach = false;        ///< the first start looked for a running engine
  std::optional<double> startup_s;  ///< measured: process start -> connected (seconds)
  /// Supervised, one of several: why it could not start (exit 1 or 2 before
  /// it ever served). It is left out, never restarted; empty: not failed.
  std::string failed;

  /// Starts `command` (argv; argv[0] an executable path) for the engine at
  /// `socket_path`, removing the socket and start-failure files of an
  /// earlier process first; the engine gets stdin, stdout and stderr only.
  /// Errors: kInternal when posix_spawn fails (then it waits its backoff).
  Status spawn(const std::vector<std::string>& command, const std::string& socket_path, TimePoint now,
               const BackoffOptions& backoff);
  /// Its process was reaped with waitpid's `status`.
  void ended(int status);
  /// It exited 1 or 2 (its model or settings are unusable) before it ever
  /// connected (`connected` is the epoch): restarting cannot help.
  bool start_failed(int status, TimePoint connected) const;
  /// Schedules its restart after the backoff (reset when it had run
  /// stable_after_s since `connected`), which then doubles. Returns the delay (s).
  double schedule_restart(TimePoint now, TimePoint connected, const BackoffOptions& backoff);
  /// A re-attached engine (not this gateway's child) went away: kill it
  /// for sure and start ours after the current backoff.
  void replace_attached(TimePoint now);
  /// Kills a hung supervised engine (SIGKILL), remembering why it ends.
  void kill_hung(bool supervised);
  /// The process runs (or is loading): it has a pid.
  bool has_process() const { return pid > 0; }
};

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

/// Reaps every child process that ended (waitpid, WNOHANG): (pid, status). Never blocks.
std::vector<std::pair<pid_t, int>> reap_exited();

/// Waits (and reaps) until each of `children` exited, at most `grace_s`
/// seconds in all; polls every 10 ms.
void wait_for_children(const std::vector<pid_t>& children, double grace_s);

/// "exit N", "signal N" or "status N" of a waitpid status.
std::string exit_text(int status);

/// Why the engine at `socket_path` could not start, as it wrote it
/// (wire::start_failure_path), removing the file; empty when it wrote none.
std::string take_start_failure(const std::string& socket_path);

/// Starts `command` on its own (see EngineProcess::spawn): the new pid.
/// Errors: kInternal with strerror of posix_spawn's result.
Result<pid_t> spawn_process(const std::vector<std::string>& command);

}  // namespace vg::gateway
