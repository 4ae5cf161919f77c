// Out-of-memory recovery in the engine: preemption with recompute, the
// preemption limit, and the readiness breaker. The FakeModel's next token
// depends only on the cache length, so a recomputed sequence continues
// exactly where it stopped if (and only if) its context was rebuilt right.
#include <gtest/gtest.h>

#include <algorithm>
#include <mutex>

#include "engine/engine.hpp"
#include "engine_test_util.hpp"

namespace vg {
namespace {

using testing::Collector;
using testing::EngineTest;

// Script "hello world. ", prompt "a" at position 0: greedy text continues
// the script from index 1.
std::string expected_text(int n) {
  const std::string script = "hello world. ";
  std::string out;
  for (int i = 1; i <= n; ++i) out += script[static_cast<std::size_t>(i) % script.size()];
  return out;
}

int count_started(Collector& c) {
  auto ev = c.events();
  return static_cast<int>(std::count_if(ev.begin(), ev.end(),
                                        [](const EngineEvent& e) { return std::holds_alternative<StartedEvent>(e); }));
}

int tokens_announced(Collector& c) {
  int n = 0;
  for (auto& e : c.events()) {
    if (auto* t = std::get_if<TextEvent>(&e)) n += t->tokens;
  }
  return n;
}

TEST_F(EngineTest, APreemptedRequestIsRecomputedAndItsTextIsSentOnce) {
  model_.fail_at_step(4);  // prefill, two decode steps, then out-of-memory
  auto engine = make();
  auto a = std::make_shared<Collector>();
  ASSERT_TRUE(engine->submit(req(12), a).ok());
  ASSERT_TRUE(a->wait_done());
  ASSERT_TRUE(a->finished());
  EXPECT_EQ(a->text(), expected_text(12));
  EXPECT_EQ(a->finished()->usage.completion_tokens, 12);
  EXPECT_EQ(tokens_announced(*a), 12);
  EXPECT_EQ(count_started(*a), 1);
  EXPECT_EQ(a->terminals(), 1);
  EXPECT_EQ(engine->stats().counters[CounterId::kPreemptions], 1);
  EXPECT_EQ(engine->stats().counters[CounterId::kOutOfMemory], 1);
  EXPECT_EQ(engine->stats().counters[CounterId::kFailed], 0);
  // Recompute: one prefill of prompt + the 3 tokens generated before the OOM.
  const std::vector<int> inputs = model_.inputs_log();
  EXPECT_NE(std::find(inputs.begin(), inputs.end(), 1 + 3), inputs.end());
  EXPECT_EQ(engine->admission().reserved_bytes, 0);
}

TEST_F(EngineTest, TheLeakTestHookHoldsItsBytesAtEachOutOfMemoryRecoveryOnly) {
  model_.fail_at_step(2, 2);  // two recoveries
  Engine::Options o = options();
  o.test_leak_bytes_on_oom = 4096;
  auto engine = make(o);
  auto a = std::make_shared<Collector>();
  ASSERT_TRUE(engine->submit(req(6), a).ok());
  ASSERT_TRUE(a->wait_done());
  ASSERT_TRUE(a->finished());
  EXPECT_EQ(engine->stats().counters[CounterId::kOutOfMemory], 2);
  EXPECT_EQ(device_->held(), 2 * 4096);
}

TEST_F(EngineTest, WithoutTheLeakTestHookARecoveryHoldsNothing) {
  model_.fail_at_step(2);
  auto engine = make();
  auto a = std::make_shared<Collector>();
  ASSERT_TRUE(engine->submit(req(6), a).ok());
  ASSERT_TRUE(a->wait_done());
  ASSERT_TRUE(a->finished());
  EXPECT_EQ(engine->stats().counters[CounterId::kOutOfMemory], 1);
  EXPECT_EQ(device_->held(), 0);
}

TEST_F(EngineTest, ARequestPreemptedMoreThanTheLimitGetsA503) {
  model_.fail_at_step(2, 3);
  auto o = options();
  o.max_preemptions = 2;
  o.oom_unready_after = 100;
  auto engine = make(o);
  auto a = std::make_shared<Collector>();
  ASSERT_TRUE(engine->submit(req(12), a).ok());
  ASSERT_TRUE(a->wait_done());
  ASSERT_TRUE(a->failed());
  EXPECT_EQ(a->failed()->code, ErrorCode::kOverloaded);
  EXPECT_GE(a->failed()->retry_after_s.value_or(0), 1.0);
  EXPECT_EQ(engine->stats().counters[CounterId::kPreemptions], 2);
  EXPECT_EQ(engine->stats().counters[CounterId::kOutOfMemory], 3);
  EXPECT_EQ(engine->admission().reserved_bytes, 0);
  // The next request runs.
  auto b = std::make_shared<Collector>();
  ASSERT_TRUE(engine->submit(req(5), b).ok());
  ASSERT_TRUE(b->wait_done());
  EXPECT_EQ(b->text(), expected_text(5));
}

/// Two requests of 30 tokens under policy memory (budget_tokens x 100
/// bytes, the OOM governor's cut kept): a prefills in step 1 while b is
/// submitted, step 2 decodes a and prefills b, then `failures` steps from
/// step 3 run out of memory. Both end with their whole text.
class TwoSequencesTest : public EngineTest {
 protected:
  void run_two(std::int64_t budget_tokens, int failures) {
    auto o = options();
    o.admission.policy = AdmissionPolicy{};  // memory
    o.admission.budget_bytes = budget_tokens * 100;
    o.oom_governor.quiet_period = std::chrono::hours(1);
    engine_ = make(o);
    model_.block();
    ASSERT_TRUE(engine_->submit(req(30), a_).ok());
    ASSERT_TRUE(model_.wait_in_step());  // step 1: a's prefill, held
    ASSERT_TRUE(engine_->submit(req(30), b_).ok());
    model_.fail_at_step(3, failures);
    model_.unblock();
    ASSERT_TRUE(a_->wait_done());
    ASSERT_TRUE(b_->wait_done());
    ASSERT_TRUE(a_->finished());
    ASSERT_TRUE(b_->finished());
    EXPECT_EQ(a_->text(), expected_text(30));
    EXPECT_EQ(b_->text(), expected_text(30));
    EXPECT_EQ(engine_->admission().reserved_bytes, 0);
  }
  std::unique_ptr<Engine> engine_;
  std::shared_ptr<Collector> a_ = std::make_shared<Collector>(), b_ = std::make_shared<Collector>();
};

// Budget 100 tokens: the OOM halves the effective budget to 50 tokens, so
// the younger one is preempted and waits until the older one finishes.
TEST_F(TwoSequencesTest, TheYoungestSequenceIsPreemptedAndWaitsWhileTheOlderOneFinishes) {
  run_two(100, 1);
  EXPECT_EQ(engine_->stats().counters[CounterId::kPreemptions], 1);
  // b went back to the queue (position 1) after it had started; a never did.
  auto b_events = b_->events();
  auto started = std::find_if(b_events.begin(), b_events.end(),
                              [](const EngineEvent& e) { return std::holds_alternative<StartedEvent>(e); });
  ASSERT_NE(started, b_events.end());
  EXPECT_TRUE(std::any_of(started, b_events.end(),
                          [](const EngineEvent& e) { return std::holds_alternative<QueuedEvent>(e); }));
  for (auto& e : a_->events()) EXPECT_FALSE(std::holds_alternative<QueuedEvent>(e));
  EXPECT_EQ(count_started(*b_), 1);
  EXPECT_EQ(engine_->admission().effective_budget_bytes, 50 * 100);
}

// Budget 1000 tokens, two out-of-memory steps in a row, each preempting one
// sequence (the cut budget still holds both): the first takes the younger,
// b, after the one token it generated; b is granted again at once and so
// becomes the youngest, but the second takes a, which was never preempted,
// rather than b a second time: a is recomputed from its prompt and its 2
// tokens (a prefill of 3), b's recompute (a prefill of 2) runs twice (failed
// at step 4, then run).
TEST_F(TwoSequencesTest, ASequencePreemptedOnceIsNotPreemptedAgainBeforeOneThatNeverWas) {
  run_two(1000, 2);
  EXPECT_EQ(engine_->stats().counters[CounterId::kPreemptions], 2);
  const std::vector<int> inputs = model_.inputs_log();
  EXPECT_EQ(std::count(inputs.begin(), inputs.end(), 3), 1) << "a recomputed once";
  EXPECT_EQ(std::count(inputs.begin(), inputs.end(), 2), 2) << "b recomputed once";
}

TEST_F(EngineTest, RepeatedOutOfMemoryMarksTheDeviceNotReadyAndRefusesNewWork) {
  model_.fail_at_step(2, 1000);
  auto o = options();
  o.max_preemptions = 100;
  o.oom_unready_after = 3;
  o.oom_governor.quiet_period = std::chrono::hours(1);
  auto engine = make(o);
  ASSERT_TRUE(engine->ready(Clock::now()));
  auto a = std::make_shared<Collector>();
  ASSERT_TRUE(engine->submit(req(12), a).ok());
  // Requeued after the third out-of-memory step, with grants paused, a waits.
  ASSERT_TRUE(a->wait_queued());
  std::string reason;
  EXPECT_FALSE(engine->ready(Clock::now(), &reason));
  EXPECT_NE(reason.find("out-of-memory"), std::string::npos) << reason;
  EXPECT_EQ(engine->stats().consecutive_oom_steps, 3);
  EXPECT_EQ(engine->stats().counters[CounterId::kOutOfMemory], 3);
  EXPECT_EQ(a->terminals(), 0);
  auto b = std::make_shared<Collector>();
  auto refused = engine->submit(req(5), b);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().code, ErrorCode::kOverloaded);
  EXPECT_GT(refused.error().retry_after_s.value_or(0), 60.0);
  engine->shutdown();
  ASSERT_TRUE(a->failed());
  EXPECT_EQ(engine->admission().reserved_bytes, 0);
}

TEST_F(EngineTest, AfterTheQuietPeriodTheDeviceServesAgainAndOneGoodStepClosesTheBreaker) {
  model_.fail_at_step(2, 3);
  auto o = options();
  o.max_preemptions = 100;
  o.oom_unready_after = 3;
  o.oom_governor.quiet_period = std::chrono::milliseconds(20);
  auto engine = make(o);
  auto a = std::make_shared<Collector>();
  ASSERT_TRUE(engine->submit(req(12), a).ok());
  ASSERT_TRUE(a->wait_done());
  ASSERT_TRUE(a->finished());
  EXPECT_EQ(a->text(), expected_text(12));
  EXPECT_EQ(engine->stats().counters[CounterId::kPreemptions], 3);
  EXPECT_EQ(engine->stats().consecutive_oom_steps, 0);
  EXPECT_EQ(engine->stats().counters[CounterId::kNotReadyTrips], 1);
  EXPECT_TRUE(engine->ready(Clock::now()));
}

TEST_F(EngineTest, NonFiniteLogitsCallOnPoisonedAndFailTheRequest) {
  model_.nan_at_length(4);  // the prompt "a" + 3 tokens
  std::mutex mu;
  std::vector<std::string> reasons;
  Engine::Options o = options();
  o.on_poisoned = [&](const std::string& why) {
    std::lock_guard lk(mu);
    reasons.push_back(why);
  };
  auto engine = make(o);
  auto a = std::make_shared<Collector>();
  ASSERT_TRUE(engine->submit(req(12), a).ok());
  ASSERT_TRUE(a->wait_done());
  ASSERT_TRUE(a->failed());
  EXPECT_EQ(a->failed()->code, ErrorCode::kInternal);
  EXPECT_EQ(a->text(), expected_text(3));  // the poisoned token is never sent
  std::lock_guard lk(mu);
  ASSERT_EQ(reasons.size(), 1u);
  EXPECT_NE(reasons[0].find("not finite"), std::string::npos);
  EXPECT_EQ(engine->admission().reserved_bytes, 0);
}

TEST_F(EngineTest, ADeviceFaultCallsOnPoisonedAndFailsTheStepsRequestsWithoutRecovery) {
  model_.fault_at_step(3);
  std::mutex mu;
  std::vector<std::string> reasons;
  Engine::Options o = options();
  o.on_poisoned = [&](const std::string& why) {
    std::lock_guard lk(mu);
    reasons.push_back(why);
  };
  auto engine = make(o);
  auto a = std::make_shared<Collector>();
  ASSERT_TRUE(engine->submit(req(12), a).ok());
  ASSERT_TRUE(a->wait_done());
  ASSERT_TRUE(a->failed());
  EXPECT_EQ(a->failed()->code, ErrorCode::kDeviceFault);
  EXPECT_NE(a->failed()->message.find("illegal memory access"), std::string::npos) << a->failed()->message;
  // Not an out-of-memory error: nothing preempted, no budget cut.
  EXPECT_EQ(engine->stats().counters[CounterId::kPreemptions], 0);
  EXPECT_EQ(engine->stats().counters[CounterId::kOutOfMemory], 0);
  EXPECT_EQ(device_->released(), 0);
  EXPECT_EQ(engine->admission().reserved_bytes, 0);
  std::lock_guard lk(mu);
  ASSERT_EQ(reasons.size(), 1u);
  EXPECT_NE(reasons[0].find("device fault in step 3"), std::string::npos) << reasons[0];
  EXPECT_NE(reasons[0].find("illegal memory access"), std::string::npos) << reasons[0];
}

TEST_F(EngineTest, WithoutOnPoisonedADeviceFaultFailsItsRequestsAndTheEngineGoesOn) {
  // One process (--in-process): no restart; the step's requests end with
  // 500 device_fault and the next request is served.
  model_.fault_at_step(2);
  auto engine = make();
  auto a = std::make_shared<Collector>();
  ASSERT_TRUE(engine->submit(req(12), a).ok());
  ASSERT_TRUE(a->wait_done());
  ASSERT_TRUE(a->failed());
  EXPECT_EQ(a->failed()->code, ErrorCode::kDeviceFault);
  auto b = std::make_shared<Collector>();
  ASSERT_TRUE(engine->submit(req(4), b).ok());
  ASSERT_TRUE(b->wait_done());
  ASSERT_TRUE(b->finished());
  EXPECT_EQ(b->text(), expected_text(4));
}

TEST_F(EngineTest, TheDeviceFaultTestHookArmsTheDeviceAtItsStep) {
  Engine::Options o = options();
  o.test_device_fault_at_step = 3;
  auto engine = make(o);
  auto a = std::make_shared<Collector>();
  ASSERT_TRUE(engine->submit(req(6), a).ok());
  ASSERT_TRUE(a->wait_done());
  EXPECT_EQ(device_->faults(), 1);  // once, at step 3 (the fake device fails nothing)
}

TEST_F(EngineTest, AResumedRequestPrefillsWhatWasSentAndGoesOnWithoutResendingIt) {
  auto engine = make();
  GenerationRequest r = req(12);
  const std::string sent = expected_text(5);
  for (char c : sent) r.resume_generated.push_back(static_cast<unsigned char>(c));
  auto a = std::make_shared<Collector>();
  ASSERT_TRUE(engine->submit(r, a).ok());
  ASSERT_TRUE(a->wait_done());
  ASSERT_TRUE(a->finished());
  EXPECT_EQ(sent + a->text(), expected_text(12));
  EXPECT_EQ(a->finished()->usage.completion_tokens, 12);
  EXPECT_EQ(tokens_announced(*a), 7);
  // One prefill of prompt + the 5 tokens sent.
  const std::vector<int> inputs = model_.inputs_log();
  EXPECT_NE(std::find(inputs.begin(), inputs.end(), 1 + 5), inputs.end());
}

}  // namespace
}  // namespace vg
