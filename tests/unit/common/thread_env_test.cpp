// missing_thread_waits: which wait settings vramgate adds to its environment
// before restarting itself, given what is already set.
#include "common/thread_env.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <optional>
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

// set_passive_thread_waits on the real environment (each variable as the
// test found it is put back afterwards).
class ProcessEnv : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* name : kNames) {
      const char* v = std::getenv(name);
      saved_[name] = v ? std::optional<std::string>(v) : std::nullopt;
      ::unsetenv(name);
    }
  }
  void TearDown() override {
    for (const auto& [name, value] : saved_) {
      if (value)
        ::setenv(name.c_str(), value->c_str(), 1);
      else
        ::unsetenv(name.c_str());
    }
  }
  static constexpr const char* kNames[] = {"OMP_WAIT_POLICY", "OPENBLAS_THREAD_TIMEOUT", "VRAMGATE_THREAD_ENV"};
  std::map<std::string, std::optional<std::string>> saved_;
};

TEST_F(ProcessEnv, SetsTheMissingWaitsForTheProcessesItStarts) {
  ::setenv("OPENBLAS_THREAD_TIMEOUT", "9", 1);
  set_passive_thread_waits();
  ASSERT_NE(std::getenv("OMP_WAIT_POLICY"), nullptr);
  EXPECT_STREQ(std::getenv("OMP_WAIT_POLICY"), "PASSIVE");
  EXPECT_STREQ(std::getenv("OPENBLAS_THREAD_TIMEOUT"), "9");  // the user's value stays
  ASSERT_NE(std::getenv("VRAMGATE_THREAD_ENV"), nullptr);
  // A child that re-checks finds nothing missing: it does not restart itself.
  EXPECT_TRUE(missing_thread_waits([](const char* n) -> const char* { return std::getenv(n); }).empty());
}

TEST_F(ProcessEnv, LeavesAnOptedOutEnvironmentAlone) {
  ::setenv("VRAMGATE_THREAD_ENV", "1", 1);
  set_passive_thread_waits();
  EXPECT_EQ(std::getenv("OMP_WAIT_POLICY"), nullptr);
  EXPECT_EQ(std::getenv("OPENBLAS_THREAD_TIMEOUT"), nullptr);
}

}  // namespace
}  // namespace vg
