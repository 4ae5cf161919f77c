#include "common/thread_env.hpp"

#include <unistd.h>

#include <cstdlib>

namespace vg {

std::vector<std::pair<std::string, std::string>> passive_thread_waits() {
  return {{"OMP_WAIT_POLICY", "PASSIVE"}, {"OPENBLAS_THREAD_TIMEOUT", "4"}};
}

std::vector<std::pair<std::string, std::string>> missing_thread_waits(const char* (*getenv)(const char*)) {
  std::vector<std::pair<std::string, std::string>> missing;
  if (getenv("VRAMGATE_THREAD_ENV") != nullptr) return missing;
  for (auto& [name, value] : passive_thread_waits()) {
    if (getenv(name.c_str()) == nullptr) missing.emplace_back(name, value);
  }
  return missing;
}

namespace {

/// Sets the missing variables and VRAMGATE_THREAD_ENV; false when none was missing.
bool set_missing_thread_waits() {
  const auto missing = missing_thread_waits([](const char* name) -> const char* { return std::getenv(name); });
  if (missing.empty()) return false;
  for (const auto& [name, value] : missing) ::setenv(name.c_str(), value.c_str(), 0);
  ::setenv("VRAMGATE_THREAD_ENV", "1", 1);
  return true;
}

}  // namespace

void set_passive_thread_waits() {
  (void)set_missing_thread_waits();
  ::setenv("VRAMGATE_THREAD_ENV", "1", 0);
}

void ensure_passive_thread_waits(char** argv) {
  if (!set_missing_thread_waits()) return;
  // The binary's own path, not /proc/self/exe: the process keeps its name
  // (ps, pgrep and killall find "vramgate", not "exe").
  char path[4096];
  const ssize_t n = ::readlink("/proc/self/exe", path, sizeof(path) - 1);
  if (n > 0) {
    path[n] = '\0';
    ::execv(path, argv);
  }
  ::execv("/proc/self/exe", argv);
  // exec failed: run on with the runtimes' own defaults.
}

}  // namespace vg
