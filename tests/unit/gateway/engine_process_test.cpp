// An engine process's restart backoff on the manual clock, what ends its
// restarts (an unusable exit before it ever served), and the state names
// /v1/engines shows.
#include "gateway/engine_process.hpp"

#include <gtest/gtest.h>
#include <sys/wait.h>

#include "../admission/manual_clock.hpp"

namespace vg::gateway {
namespace {

using vg::testing::ManualClock;
using namespace std::chrono_literals;

/// A waitpid status of a process that exited with `code` (W_EXITCODE's layout).
int exited_with(int code) { return (code & 0xff) << 8; }

TEST(EngineProcess, TheBackoffDoublesUpToItsMaximum) {
  ManualClock clock;
  const BackoffOptions backoff{0.5, 2.0, 60};
  EngineProcess p;
  p.backoff_s = backoff.initial_s;
  EXPECT_DOUBLE_EQ(p.schedule_restart(clock.now(), TimePoint{}, backoff), 0.5);
  EXPECT_EQ(p.next_start, clock.now() + 500ms);
  EXPECT_DOUBLE_EQ(p.schedule_restart(clock.now(), TimePoint{}, backoff), 1.0);
  EXPECT_DOUBLE_EQ(p.schedule_restart(clock.now(), TimePoint{}, backoff), 2.0);
  EXPECT_DOUBLE_EQ(p.schedule_restart(clock.now(), TimePoint{}, backoff), 2.0);
  EXPECT_EQ(p.restarts, 4);
}

TEST(EngineProcess, AnEngineThatRanStableRestartsWithTheInitialDelay) {
  ManualClock clock;
  const BackoffOptions backoff{0.5, 30, 60};
  EngineProcess p;
  p.backoff_s = 8;
  const TimePoint connected = clock.now();
  clock.advance(30s);
  EXPECT_DOUBLE_EQ(p.schedule_restart(clock.now(), connected, backoff), 8.0) << "not stable yet";
  clock.advance(61s);
  EXPECT_DOUBLE_EQ(p.schedule_restart(clock.now(), connected, backoff), 0.5);
}

TEST(EngineProcess, AnUnusableExitBeforeItServedEndsItsRestarts) {
  ManualClock clock;
  EngineProcess p;
  EXPECT_TRUE(p.start_failed(exited_with(1), TimePoint{}));
  EXPECT_TRUE(p.start_failed(exited_with(2), TimePoint{}));
  EXPECT_FALSE(p.start_failed(exited_with(3), TimePoint{}));
  EXPECT_FALSE(p.start_failed(exited_with(1), clock.now())) << "it served once: restart it";
}

TEST(EngineProcess, ItsEndKeepsAHeartbeatKillsReason) {
  EngineProcess p;
  p.pid = 42;
  p.child = true;
  p.ended(exited_with(3));
  EXPECT_EQ(p.pid, 0);
  EXPECT_FALSE(p.child);
  EXPECT_EQ(p.last_exit, "exit 3");
  p.last_exit = "no heartbeat for 5.0 s";
  p.heartbeat_kill = true;
  p.ended(9);  // SIGKILL
  EXPECT_EQ(p.last_exit, "no heartbeat for 5.0 s");
  EXPECT_FALSE(p.heartbeat_kill);
}

TEST(EngineProcess, ExitTextsAndStateNames) {
  EXPECT_EQ(exit_text(exited_with(2)), "exit 2");
  EXPECT_EQ(exit_text(9), "signal 9");
  EXPECT_STREQ(state_name(EngineState::kNotReady), "not_ready");
  EXPECT_STREQ(state_name(EngineState::kRestarting), "restarting");
}

}  // namespace
}  // namespace vg::gateway
