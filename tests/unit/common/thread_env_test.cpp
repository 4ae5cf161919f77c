// missing_thread_waits: which wait settings vramgate adds to its environment
// before restarting itself, given what is already set.
#include "common/thread_env.hpp"

#include <gtest/gtest.h>

#include <map>
#include <string>

namespace vg {
namespace {

std::map<std::string, std::string> g_env;

const char* fake_getenv(const char* name) {
  auto it = g_env.find(name);
  return it == g_env.end() ? nullptr : it->second.c_str();
}

TEST(ThreadEnv, AddsEveryPassiveWaitToAnEmptyEnvironment) {
  g_env = {};
  const auto missing = missing_thread_waits(fake_getenv);
  ASSERT_EQ(missing.size(), 2u);
  EXPECT_EQ(missing[0], (std::pair<std::string, std::string>{"OMP_WAIT_POLICY", "PASSIVE"}));
  EXPECT_EQ(missing[1], (std::pair<std::string, std::string>{"OPENBLAS_THREAD_TIMEOUT", "4"}));
}

TEST(ThreadEnv, KeepsWhatTheUserSet) {
  g_env = {{"OMP_WAIT_POLICY", "ACTIVE"}};
  const auto missing = missing_thread_waits(fake_getenv);
  ASSERT_EQ(missing.size(), 1u);
  EXPECT_EQ(missing[0].first, "OPENBLAS_THREAD_TIMEOUT");
}

TEST(ThreadEnv, NothingWhenAllAreSet) {
  g_env = {{"OMP_WAIT_POLICY", "PASSIVE"}, {"OPENBLAS_THREAD_TIMEOUT", "10"}};
  EXPECT_TRUE(missing_thread_waits(fake_getenv).empty());
}

TEST(ThreadEnv, NothingInTheRestartedProcessOrWhenOptedOut) {
  g_env = {{"VRAMGATE_THREAD_ENV", "1"}};
  EXPECT_TRUE(missing_thread_waits(fake_getenv).empty());
}

}  // namespace
}  // namespace vg
