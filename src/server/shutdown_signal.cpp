#include "server/shutdown_signal.hpp"

#include <semaphore.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <ctime>

namespace vg {
namespace {

// One semaphore count per signal received; the last signal's number.
sem_t g_signals;
std::atomic<int> g_last_signal{0};
std::atomic<bool> g_installed{false};

extern "C" void on_shutdown_signal(int sig) {
  g_last_signal.store(sig);
  sem_post(&g_signals);
}

}  // namespace

void install_shutdown_signal_handlers() {
  if (g_installed.exchange(true)) return;
  sem_init(&g_signals, 0, 0);
  struct sigaction sa = {};
  sa.sa_handler = on_shutdown_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

int wait_for_shutdown_signal() {
  while (sem_wait(&g_signals) != 0 && errno == EINTR) {
  }
  return g_last_signal.load();
}

int take_shutdown_signal() { return sem_trywait(&g_signals) == 0 ? g_last_signal.load() : 0; }

int wait_for_shutdown_signal_until(TimePoint deadline) {
  // sem_timedwait takes CLOCK_REALTIME: convert the remaining steady time.
  const auto left = std::max(Duration::zero(), deadline - Clock::now());
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count() + ts.tv_nsec;
  ts.tv_sec += static_cast<time_t>(ns / 1000000000);
  ts.tv_nsec = static_cast<long>(ns % 1000000000);
  while (true) {
    if (sem_timedwait(&g_signals, &ts) == 0) return g_last_signal.load();
    if (errno != EINTR) return 0;
  }
}

}  // namespace vg
