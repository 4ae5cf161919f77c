// Memory the engine does not own: when "another process" takes device
// memory (the foreign-bytes test hook at given steps), the effective budget
// follows it down before anything more is admitted, the youngest sequences
// are preempted when what runs no longer fits, and the budget comes back
// when the bytes are freed. No out-of-memory error is ever needed.
#include <gtest/gtest.h>

#include <algorithm>

#include "engine/engine.hpp"
#include "engine_test_util.hpp"

namespace vg {
namespace {

using testing::Collector;
using testing::EngineTest;

constexpr std::int64_t kBudget = 100 * 100;  // 3 requests of 1 + 30 tokens at 100 bytes a token

class ForeignBytesTest : public EngineTest {
 protected:
  // Policy memory over a device of kBudget bytes whose budget follows what
  // others hold; `hook` says when they take and free it.
  static Engine::Options foreign_options(const std::string& hook);
  // a (30 tokens) starts alone; b (30 tokens) is submitted while a's
  // prefill step is held, so it joins at step 2; both must finish.
  void run_two(Engine& engine, const std::shared_ptr<Collector>& a, const std::shared_ptr<Collector>& b);
};

void ForeignBytesTest::run_two(Engine& engine, const std::shared_ptr<Collector>& a,
                               const std::shared_ptr<Collector>& b) {
  model_.block();
  ASSERT_TRUE(engine.submit(req(30), a).ok());
  ASSERT_TRUE(model_.wait_in_step());
  ASSERT_TRUE(engine.submit(req(30), b).ok());
  model_.unblock();
  ASSERT_TRUE(a->wait_done());
  ASSERT_TRUE(b->wait_done());
  ASSERT_TRUE(a->finished());
  ASSERT_TRUE(b->finished());
}

Engine::Options ForeignBytesTest::foreign_options(const std::string& hook) {
  Engine::Options o = options();
  o.admission.policy = AdmissionPolicy{};  // memory
  o.admission.budget_bytes = kBudget;
  o.budget_inputs = DeviceBudgetInputs{kBudget, 1.0, 0, 0, 0, 0};
  o.oom_governor.quiet_period = std::chrono::hours(1);
  o.oom_governor.foreign_raise_hold = Duration::zero();  // raised back at the next turn
  auto parsed = parse_foreign_bytes_hook(hook);
  EXPECT_TRUE(parsed.ok());
  o.test_foreign_bytes = *parsed;
  return o;
}

bool requeued_after_start(Collector& c) {
  auto ev = c.events();
  auto started = std::find_if(ev.begin(), ev.end(), [](const EngineEvent& e) {
    return std::holds_alternative<StartedEvent>(e);
  });
  return started != ev.end() &&
         std::any_of(started, ev.end(), [](const EngineEvent& e) { return std::holds_alternative<QueuedEvent>(e); });
}

TEST_F(ForeignBytesTest, ForeignGrowthLowersTheBudgetPreemptsTheYoungestAndItsReleaseRestoresIt) {
  // Step 1: a's prefill (held); step 2: a decodes, b prefills; at step 3
  // another process takes 6000 of the 10000 bytes; at step 12 it frees them.
  auto engine = make(foreign_options("3=6000,12=0"));
  auto a = std::make_shared<Collector>();
  auto b = std::make_shared<Collector>();
  run_two(*engine, a, b);
  EXPECT_EQ(a->text(), b->text());  // b was recomputed: same greedy text
  const EngineStats st = engine->stats();
  EXPECT_EQ(st.counters[CounterId::kOutOfMemory], 0);
  EXPECT_EQ(st.counters[CounterId::kFailed], 0);
  EXPECT_EQ(st.counters[CounterId::kPreemptions], 1);  // 2 x 3100 bytes do not fit in 4000; one does
  EXPECT_TRUE(requeued_after_start(*b));
  EXPECT_FALSE(requeued_after_start(*a));
  EXPECT_EQ(st.budget_foreign_grew, 1);
  EXPECT_EQ(st.budget_foreign_shrank, 1);
  EXPECT_EQ(st.foreign_bytes, 0);
  EXPECT_EQ(engine->admission().effective_budget_bytes, kBudget);
  EXPECT_EQ(engine->admission().reserved_bytes, 0);
}

TEST_F(ForeignBytesTest, ForeignGrowthThatLeavesRoomForWhatRunsPreemptsNothingButHoldsNewWork) {
  // At step 2 others take 5000 bytes: a (3200) still fits in 5000, b (3100)
  // does not fit beside it, so b waits in the queue until they free them at
  // step 8. a's two-token prompt makes step 1 a prefill, so the decode step
  // held is step 2.
  auto engine = make(foreign_options("2=5000,8=0"));
  model_.block_decode();
  auto a = std::make_shared<Collector>();
  ASSERT_TRUE(engine->submit(req(30, "ab"), a).ok());
  ASSERT_TRUE(model_.wait_in_decode());  // step 2: the bytes are taken
  auto b = std::make_shared<Collector>();
  ASSERT_TRUE(engine->submit(req(30), b).ok());
  model_.unblock_decode();
  ASSERT_TRUE(a->wait_done());
  ASSERT_TRUE(b->wait_done());
  ASSERT_TRUE(b->finished());
  // b started only once the bytes were freed (step 8): after a's 8th step.
  const auto log = model_.steps_log();
  const auto b_prefill = std::find_if(log.begin() + 2, log.end(), [](const std::vector<int>& step) {
    return step.size() == 2;
  });
  EXPECT_GE(b_prefill - log.begin(), 8);
  const EngineStats st = engine->stats();
  EXPECT_EQ(st.counters[CounterId::kPreemptions], 0);
  EXPECT_EQ(st.counters[CounterId::kOutOfMemory], 0);
  EXPECT_EQ(st.budget_foreign_grew, 1);
  EXPECT_EQ(st.budget_foreign_shrank, 1);
}

TEST_F(ForeignBytesTest, GrowthDuringAChunkedPrefillPreemptsThePrefillingSequence) {
  // b decodes; a's 12-token prompt is prefilled 3 tokens a step beside it.
  // At step 3, a mid-prefill, others take 6000 bytes: b (3100) fits in the
  // 4000 left, a (2200) not beside it, and a is the younger: it is
  // preempted before its next chunk and recomputed once the bytes are freed.
  Engine::Options o = foreign_options("3=6000,12=0");
  o.max_batch_tokens = 4;
  auto engine = make(o);
  model_.block();
  auto b = std::make_shared<Collector>();
  ASSERT_TRUE(engine->submit(req(30), b).ok());
  ASSERT_TRUE(model_.wait_in_step());  // step 1: b's prefill
  auto a = std::make_shared<Collector>();
  ASSERT_TRUE(engine->submit(req(10, "abcdefghijkl"), a).ok());
  model_.unblock();
  ASSERT_TRUE(a->wait_done());
  ASSERT_TRUE(b->wait_done());
  ASSERT_TRUE(a->finished());
  ASSERT_TRUE(b->finished());
  EXPECT_EQ(a->finished()->usage.completion_tokens, 10);
  EXPECT_TRUE(requeued_after_start(*a));
  EXPECT_FALSE(requeued_after_start(*b));
  const EngineStats st = engine->stats();
  EXPECT_EQ(st.counters[CounterId::kPreemptions], 1);
  EXPECT_EQ(st.counters[CounterId::kOutOfMemory], 0);
  EXPECT_EQ(st.counters[CounterId::kFailed], 0);
  // a's prompt went in over more than one step before the preemption.
  const std::vector<int> inputs = model_.inputs_log();
  EXPECT_NE(std::find(inputs.begin(), inputs.end(), 3), inputs.end());
}

TEST_F(ForeignBytesTest, MemoryThatComesAndGoesLowersTheBudgetOnceAndPreemptsOnce) {
  // Others take 6000 bytes at step 3 and free them at every other step
  // after, taking them again in between. Raises wait for the bytes to stay
  // freed for an hour: the budget is lowered once and b preempted once,
  // not every time the bytes come and go.
  Engine::Options o = foreign_options("3=6000,4=0,5=6000,6=0,7=6000,8=0,9=6000");
  o.oom_governor.foreign_raise_hold = std::chrono::hours(1);
  auto engine = make(o);
  auto a = std::make_shared<Collector>();
  auto b = std::make_shared<Collector>();
  run_two(*engine, a, b);  // b granted again once a's lease was released
  const EngineStats st = engine->stats();
  EXPECT_EQ(st.counters[CounterId::kPreemptions], 1);
  EXPECT_EQ(st.budget_foreign_grew, 1);
  EXPECT_EQ(st.budget_foreign_shrank, 0);
  EXPECT_EQ(engine->admission().effective_budget_bytes, kBudget - 6000);
}

TEST_F(ForeignBytesTest, OutsidePolicyMemoryForeignBytesAreMeasuredButMoveNoBudget) {
  Engine::Options o = foreign_options("2=6000");
  o.admission.policy = AdmissionPolicy{AdmissionPolicy::Kind::kFixed, 8};
  auto engine = make(o);
  auto a = std::make_shared<Collector>();
  ASSERT_TRUE(engine->submit(req(5), a).ok());
  ASSERT_TRUE(a->wait_done());
  ASSERT_TRUE(a->finished());
  const EngineStats st = engine->stats();
  EXPECT_EQ(st.foreign_bytes, 6000);
  EXPECT_EQ(st.budget_foreign_grew, 0);
  EXPECT_EQ(engine->admission().effective_budget_bytes, kBudget);
}

}  // namespace
}  // namespace vg
