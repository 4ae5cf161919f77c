// Tests of the capacity planner's arithmetic (server/planner make_plan and
// formatters), on a hand-made memory profile: no model is loaded.
#include "server/planner.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace vg {
namespace {

using ::testing::HasSubstr;

PlanInputs inputs() {
  PlanInputs in;
  in.model_id = "tiny";
  in.device = "virt:0";
  in.context_length = 256;
  in.capacity_bytes = 1'000'000;
  in.utilization = 0.5;
  in.reserve_bytes = 10'000;
  in.max_batch = 8;
  in.profile.resident_bytes = 100'000;
  in.profile.workspace_bytes = 40'000;
  in.profile.kv_bytes_per_token = 1'000;
  in.profile.sequence_overhead_bytes = 0;
  in.profile.safety_factor = 1.0;
  return in;
}

const int kPrompts[] = {16, 64, 256};
const int kMaxTokens[] = {16, 64};

TEST(Planner, BudgetIsCapacityTimesUtilizationLessResidentWorkspaceReserve) {
  Plan plan = make_plan(inputs(), kPrompts, kMaxTokens);
  EXPECT_EQ(plan.budget_bytes, 500'000 - 100'000 - 40'000 - 10'000);
}

TEST(Planner, RowsSkipSizesBeyondTheContextAndCapConcurrency) {
  Plan plan = make_plan(inputs(), kPrompts, kMaxTokens);
  ASSERT_EQ(plan.rows.size(), 4u);  // 256 + anything > 256 tokens
  const PlanRow& small = plan.rows[0];
  EXPECT_EQ(small.prompt_tokens, 16);
  EXPECT_EQ(small.max_tokens, 16);
  EXPECT_EQ(small.cost_bytes, 32'000);
  EXPECT_EQ(small.memory_fit, 350'000 / 32'000);  // 10
  EXPECT_EQ(small.concurrent, 8);
  EXPECT_EQ(small.bound_by, "max_batch");
  const PlanRow& big = plan.rows[3];
  EXPECT_EQ(big.prompt_tokens, 64);
  EXPECT_EQ(big.max_tokens, 64);
  EXPECT_EQ(big.cost_bytes, 128'000);
  EXPECT_EQ(big.memory_fit, 2);
  EXPECT_EQ(big.concurrent, 2);
  EXPECT_EQ(big.bound_by, "memory");
}

TEST(Planner, ARequestLargerThanTheBudgetNeverFits) {
  PlanInputs in = inputs();
  in.profile.kv_bytes_per_token = 20'000;
  const int prompts[] = {16};
  const int gens[] = {16};
  Plan plan = make_plan(in, prompts, gens);
  ASSERT_EQ(plan.rows.size(), 1u);
  EXPECT_EQ(plan.rows[0].concurrent, 0);
  EXPECT_EQ(plan.rows[0].bound_by, "never fits (413)");
}

TEST(Planner, FixedSlotsCapConcurrencyWithoutAMemoryCheck) {
  PlanInputs in = inputs();
  in.admission = "fixed:3";
  Plan plan = make_plan(in, kPrompts, kMaxTokens);
  EXPECT_EQ(plan.rows[0].concurrent, 3);
  EXPECT_EQ(plan.rows[0].bound_by, "fixed:3");
  EXPECT_EQ(plan.rows[3].concurrent, 3);  // memory_fit is 2, but fixed:N does not check memory
  EXPECT_THAT(format_plan_text(plan), HasSubstr("does not check memory"));
}

TEST(Planner, TextShowsTheBudgetArithmeticAndTheTable) {
  const std::string text = format_plan_text(make_plan(inputs(), kPrompts, kMaxTokens));
  EXPECT_THAT(text, HasSubstr("budget = capacity x utilization - resident - workspace - reserve"));
  EXPECT_THAT(text, HasSubstr("= 1000000 x 0.5 - 100000 - 40000 - 10000 = 350000 bytes"));
  EXPECT_THAT(text, HasSubstr("      64         64         128000"));
}

TEST(Planner, JsonCarriesTheNumbers) {
  const std::string json = format_plan_json(make_plan(inputs(), kPrompts, kMaxTokens));
  EXPECT_THAT(json, HasSubstr("\"budget_bytes\":350000"));
  EXPECT_THAT(json, HasSubstr("{\"prompt_tokens\":64,\"max_tokens\":64,\"cost_bytes\":128000,\"memory_fit\":2,"
                              "\"concurrent\":2,\"bound_by\":\"memory\"}"));
}

TEST(Planner, JsonWritesTheShortestDecimalThatReadsBack) {
  PlanInputs in = inputs();
  in.utilization = 0.9;  // %.17g would write 0.90000000000000002
  in.profile.safety_factor = 1.1;
  const std::string json = format_plan_json(make_plan(in, kPrompts, kMaxTokens));
  EXPECT_THAT(json, HasSubstr("\"memory_utilization\":0.9,"));
  EXPECT_THAT(json, HasSubstr("\"safety_factor\":1.1,"));
}

}  // namespace
}  // namespace vg
