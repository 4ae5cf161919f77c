#include "engine/engine.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <condition_variable>
#include <mutex>

#include "device/device.hpp"
#include "engine_test_util.hpp"
#include "fake_model.hpp"

namespace vg {
namespace {

using testing::Collector;
using testing::EngineTest;
using testing::FakeModel;

TEST_F(EngineTest, GreedyGenerationFollowsTheModelAndStopsAtMaxTokens) {
  auto engine = make();
  auto sink = std::make_shared<Collector>();
  ASSERT_TRUE(engine->submit(req(5), sink).ok());
  ASSERT_TRUE(sink->wait_done());
  // Prompt "a" occupies position 0; the script continues from index 1.
  EXPECT_EQ(sink->text(), "ello ");
  auto fin = sink->finished();
  ASSERT_TRUE(fin);
  EXPECT_EQ(fin->finish_reason, "length");
  EXPECT_EQ(fin->usage.prompt_tokens, 1);
  EXPECT_EQ(fin->usage.completion_tokens, 5);
  EXPECT_EQ(sink->terminals(), 1);
  ASSERT_TRUE(std::holds_alternative<StartedEvent>(sink->events().front()));
}

TEST_F(EngineTest, StopStringEndsWithStopReason) {
  auto engine = make();
  auto sink = std::make_shared<Collector>();
  auto r = req(20);
  r.stop = {"wor"};
  ASSERT_TRUE(engine->submit(r, sink).ok());
  ASSERT_TRUE(sink->wait_done());
  EXPECT_EQ(sink->text(), "ello ");
  EXPECT_EQ(sink->finished()->finish_reason, "stop");
}

TEST_F(EngineTest, EndOfTextEndsWithStopReason) {
  model_.eos_at_length(3);
  auto engine = make();
  auto sink = std::make_shared<Collector>();
  ASSERT_TRUE(engine->submit(req(20), sink).ok());
  ASSERT_TRUE(sink->wait_done());
  EXPECT_EQ(sink->text(), "el");
  EXPECT_EQ(sink->finished()->finish_reason, "stop");
  EXPECT_EQ(sink->finished()->usage.completion_tokens, 3);
}

TEST_F(EngineTest, IgnoreEosGeneratesUntilMaxTokens) {
  model_.eos_at_length(3);
  auto engine = make();
  auto sink = std::make_shared<Collector>();
  auto r = req(6);
  r.ignore_eos = true;
  ASSERT_TRUE(engine->submit(r, sink).ok());
  ASSERT_TRUE(sink->wait_done());
  ASSERT_TRUE(sink->finished());
  EXPECT_EQ(sink->finished()->finish_reason, "length");
  EXPECT_EQ(sink->finished()->usage.completion_tokens, 6);
  EXPECT_EQ(sink->text(), "elo w");  // the third token, end-of-text, has no text
}

TEST_F(EngineTest, QueueFullIsRefusedWithRetryAfter) {
  model_.block();
  auto engine = make(options(1, 1));
  auto a = std::make_shared<Collector>();
  auto b = std::make_shared<Collector>();
  ASSERT_TRUE(engine->submit(req(3), a).ok());
  ASSERT_TRUE(model_.wait_in_step());  // a runs (blocked); queue is empty
  int pos = 0;
  ASSERT_TRUE(engine->submit(req(3), b, &pos).ok());
  EXPECT_EQ(pos, 1);
  auto c = engine->submit(req(3), std::make_shared<Collector>());
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.error().code, ErrorCode::kOverloaded);
  ASSERT_TRUE(c.error().retry_after_s.has_value());
  EXPECT_GE(*c.error().retry_after_s, 1.0);
  EXPECT_EQ(engine->stats().rejected, 1);
  model_.unblock();
  ASSERT_TRUE(a->wait_done());
  ASSERT_TRUE(b->wait_done());
  EXPECT_TRUE(a->finished());
  EXPECT_TRUE(b->finished());
}

TEST_F(EngineTest, CancelWhileQueuedDropsTheRequestBeforeItRuns) {
  model_.block();
  auto engine = make(options(1));
  auto a = std::make_shared<Collector>();
  auto b = std::make_shared<Collector>();
  ASSERT_TRUE(engine->submit(req(3), a).ok());
  ASSERT_TRUE(model_.wait_in_step());
  auto hb = engine->submit(req(3), b);
  ASSERT_TRUE(hb.ok());
  (*hb)->cancel();
  model_.unblock();
  ASSERT_TRUE(b->wait_done());
  ASSERT_TRUE(b->failed());
  EXPECT_EQ(b->failed()->code, ErrorCode::kCancelled);
  for (auto& e : b->events()) EXPECT_FALSE(std::holds_alternative<StartedEvent>(e));
  ASSERT_TRUE(a->wait_done());
  // a: 1 prefill + 2 decode steps; b never ran: admission counts it (it
  // never left the queue), the finished requests do not.
  EXPECT_EQ(model_.step_tokens(), 3);
  EXPECT_EQ(engine->admission().counters.cancelled, 1);
  EXPECT_EQ(engine->stats().counters[CounterId::kCancelled], 0);
  EXPECT_EQ(engine->stats().counters[CounterId::kCompleted], 1);
  EXPECT_EQ(engine->admission().counters.admitted, 1);
}

TEST_F(EngineTest, AQueuedRequestCanBeWithdrawnWithoutAnEventAndARunningOneCannot) {
  model_.block();
  auto engine = make(options(1));
  auto a = std::make_shared<Collector>();
  auto b = std::make_shared<Collector>();
  auto ha = engine->submit(req(3), a);
  ASSERT_TRUE(ha.ok());
  ASSERT_TRUE(model_.wait_in_step());
  auto hb = engine->submit(req(3), b);
  ASSERT_TRUE(hb.ok());
  EXPECT_FALSE((*ha)->withdraw());  // running
  EXPECT_TRUE((*hb)->withdraw());   // queued: taken back
  EXPECT_FALSE((*hb)->withdraw());  // not queued any more
  model_.unblock();
  ASSERT_TRUE(a->wait_done());
  ASSERT_TRUE(a->finished());
  EXPECT_TRUE(engine->wait_idle(Clock::now() + std::chrono::seconds(10)));
  // b never ran, never ended here, and is not counted as cancelled.
  EXPECT_EQ(model_.step_tokens(), 3);
  EXPECT_EQ(b->terminals(), 0);
  for (auto& e : b->events()) EXPECT_FALSE(std::holds_alternative<StartedEvent>(e));
  EXPECT_EQ(engine->stats().counters[CounterId::kCancelled], 0);
  EXPECT_EQ(engine->admission().queued, 0);
  EXPECT_EQ(engine->admission().reserved_bytes, 0);
  EXPECT_EQ(engine->admission().counters.withdrawn, 1);
  EXPECT_EQ(engine->admission().counters.cancelled, 0);
}

TEST_F(EngineTest, CancelWhileRunningStopsAtTheNextStep) {
  auto engine = make();
  auto a = std::make_shared<Collector>();
  model_.block();
  auto h = engine->submit(req(100), a);
  ASSERT_TRUE(h.ok());
  ASSERT_TRUE(model_.wait_in_step());  // inside prefill
  (*h)->cancel();
  model_.unblock();
  ASSERT_TRUE(a->wait_done());
  ASSERT_TRUE(a->failed());
  EXPECT_EQ(a->failed()->code, ErrorCode::kCancelled);
  EXPECT_LE(model_.steps(), 2);
  EXPECT_TRUE(engine->wait_idle(Clock::now() + std::chrono::seconds(10)));
  EXPECT_EQ(engine->stats().running, 0);
  EXPECT_EQ(engine->stats().kv_cache_bytes, 0);
  EXPECT_EQ(engine->admission().reserved_bytes, 0);
}

TEST_F(EngineTest, DeadlinePassedWhileRunningGives504Error) {
  auto engine = make();
  auto a = std::make_shared<Collector>();
  model_.block();
  auto r = req(100);
  // Far enough ahead that the request surely reaches its first step first.
  r.deadline = Clock::now() + std::chrono::milliseconds(500);
  ASSERT_TRUE(engine->submit(r, a).ok());
  ASSERT_TRUE(model_.wait_in_step());
  // The step is held until the deadline has passed (observed on the clock).
  while (Clock::now() < *r.deadline) std::this_thread::yield();
  model_.unblock();
  ASSERT_TRUE(a->wait_done());
  ASSERT_TRUE(a->failed());
  EXPECT_EQ(a->failed()->code, ErrorCode::kTimeout);
}

TEST_F(EngineTest, DeadlinePassedWhileQueuedNeverRuns) {
  model_.block();
  auto engine = make(options(1));
  auto a = std::make_shared<Collector>();
  auto b = std::make_shared<Collector>();
  ASSERT_TRUE(engine->submit(req(2), a).ok());
  ASSERT_TRUE(model_.wait_in_step());
  auto r = req(2);
  r.deadline = Clock::now();
  ASSERT_TRUE(engine->submit(r, b).ok());
  model_.unblock();
  ASSERT_TRUE(b->wait_done());
  EXPECT_EQ(b->failed()->code, ErrorCode::kTimeout);
  ASSERT_TRUE(a->wait_done());
  EXPECT_EQ(model_.step_tokens(), 2);
}

TEST_F(EngineTest, StepOutOfMemoryWithoutPreemptionsLeftIsA503AndTheEngineGoesOn) {
  model_.fail_at_step(2);
  auto o = options();
  o.max_preemptions = 0;
  auto engine = make(o);
  auto a = std::make_shared<Collector>();
  ASSERT_TRUE(engine->submit(req(5), a).ok());
  ASSERT_TRUE(a->wait_done());
  ASSERT_TRUE(a->failed());
  EXPECT_EQ(a->failed()->code, ErrorCode::kOverloaded);
  EXPECT_GE(a->failed()->retry_after_s.value_or(0), 1.0);
  EXPECT_EQ(engine->stats().counters[CounterId::kOutOfMemory], 1);
  EXPECT_EQ(engine->stats().counters[CounterId::kPreemptions], 0);
  // No OOM governor outside policy memory: the budget stays whole.
  EXPECT_EQ(engine->stats().counters[CounterId::kOomBudgetCuts], 0);
  EXPECT_EQ(engine->admission().effective_budget_bytes, engine->admission().budget_bytes);
  auto b = std::make_shared<Collector>();
  ASSERT_TRUE(engine->submit(req(5), b).ok());
  ASSERT_TRUE(b->wait_done());
  EXPECT_TRUE(b->finished());
}

TEST_F(EngineTest, StepOutOfMemoryUnderTheNaiveBaselineIsOutOfMemory) {
  model_.fail_at_step(2);
  auto engine = make(naive_options());
  auto a = run_to_end(*engine, req(5));
  ASSERT_TRUE(a->failed());
  EXPECT_EQ(a->failed()->code, ErrorCode::kOutOfMemory);
  EXPECT_TRUE(run_to_end(*engine, req(5))->finished());
}

TEST_F(EngineTest, AKvCacheOutOfMemoryUnderTheNaiveBaselineFailsTheRequestAndIsCounted) {
  model_.fail_next_caches(1);
  auto engine = make(naive_options());
  auto a = run_to_end(*engine, req(5));
  ASSERT_TRUE(a->failed());
  EXPECT_EQ(a->failed()->code, ErrorCode::kOutOfMemory);
  EXPECT_EQ(engine->stats().counters[CounterId::kOutOfMemory], 1);
}

TEST_F(EngineTest, AKvCacheOutOfMemoryIsCountedAndRecoveredByRequeueing) {
  model_.fail_next_caches(1);
  auto engine = make(options());
  EXPECT_TRUE(run_to_end(*engine, req(5))->finished());
  EXPECT_EQ(engine->stats().counters[CounterId::kOutOfMemory], 1);
  EXPECT_EQ(engine->stats().counters[CounterId::kPreemptions], 1);
}

TEST_F(EngineTest, ManyConcurrentRequestsEachGetExactlyOneTerminalEvent) {
  auto engine = make(options(4));
  std::vector<std::shared_ptr<Collector>> sinks;
  for (int i = 0; i < 24; ++i) {
    sinks.push_back(std::make_shared<Collector>());
    ASSERT_TRUE(engine->submit(req(1 + i % 7), sinks.back()).ok());
  }
  for (int i = 0; i < 24; ++i) {
    ASSERT_TRUE(sinks[static_cast<std::size_t>(i)]->wait_done());
    auto fin = sinks[static_cast<std::size_t>(i)]->finished();
    ASSERT_TRUE(fin);
    EXPECT_EQ(fin->usage.completion_tokens, 1 + i % 7);
    EXPECT_EQ(sinks[static_cast<std::size_t>(i)]->terminals(), 1);
  }
  EXPECT_TRUE(engine->wait_idle(Clock::now() + std::chrono::seconds(10)));
  EXPECT_EQ(engine->stats().counters[CounterId::kCompleted], 24);
}

TEST_F(EngineTest, DrainRefusesNewWorkAndShutdownCancelsWhatIsLeft) {
  model_.block();
  auto engine = make(options(1));
  auto a = std::make_shared<Collector>();
  auto b = std::make_shared<Collector>();
  ASSERT_TRUE(engine->submit(req(50), a).ok());
  ASSERT_TRUE(model_.wait_in_step());
  ASSERT_TRUE(engine->submit(req(50), b).ok());
  engine->begin_drain();
  auto c = engine->submit(req(1), std::make_shared<Collector>());
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.error().code, ErrorCode::kOverloaded);
  // The stop is requested while a's step is still held, so b cannot be
  // granted (a's whole generation running first) before the engine stops.
  engine->request_stop();
  model_.unblock();
  engine->shutdown();
  ASSERT_TRUE(a->wait_done());
  ASSERT_TRUE(b->wait_done());
  EXPECT_EQ(a->terminals() + b->terminals(), 2);
  EXPECT_TRUE(a->finished() || a->failed());
  ASSERT_TRUE(b->failed());
  EXPECT_EQ(b->failed()->code, ErrorCode::kOverloaded);
}

TEST_F(EngineTest, RequestThatCanNeverFitIsRefusedWithTheNumbers) {
  auto o = options();
  o.admission.policy = AdmissionPolicy{};  // memory
  o.admission.budget_bytes = 1000;         // 10 tokens at 100 B/token
  auto engine = make(o);
  EXPECT_EQ(engine->cost(4, 6), 1000);
  auto exact = std::make_shared<Collector>();
  ASSERT_TRUE(engine->submit(req(6, "abcd"), exact).ok());  // cost == budget: fits an empty device
  ASSERT_TRUE(exact->wait_done());
  EXPECT_TRUE(exact->finished());
  auto r = engine->submit(req(7, "abcd"), std::make_shared<Collector>());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::kExceedsDeviceMemory);
  EXPECT_EQ(r.error().needed_bytes, 1100);
  EXPECT_EQ(r.error().budget_bytes, 1000);
}

TEST_F(EngineTest, MemoryBudgetLimitsHowManyRunTogether) {
  auto o = options();
  o.admission.policy = AdmissionPolicy{};  // memory
  o.admission.budget_bytes = 2 * 100 * 21;  // two requests of 1 + 20 tokens
  auto engine = make(o);
  std::vector<std::shared_ptr<Collector>> sinks;
  for (int i = 0; i < 6; ++i) {
    sinks.push_back(std::make_shared<Collector>());
    ASSERT_TRUE(engine->submit(req(20), sinks.back()).ok());
  }
  for (auto& s : sinks) {
    ASSERT_TRUE(s->wait_done());
    EXPECT_TRUE(s->finished());
  }
  EXPECT_LE(model_.max_inputs_per_step(), 2);
  EXPECT_TRUE(engine->wait_idle(Clock::now() + std::chrono::seconds(10)));
  auto snap = engine->admission();
  EXPECT_EQ(snap.reserved_bytes, 0);
  EXPECT_LE(snap.peak_reserved_bytes, o.admission.budget_bytes);
}

// Policy memory, a budget of 100 tokens (100 bytes each); the first step fails
// with out-of-memory, which halves the effective budget.
class EngineOomGovernorTest : public EngineTest {
 protected:
  static constexpr std::int64_t kBudget = 100 * 100;
  static Engine::Options governed(Duration quiet_period) {
    auto o = options();
    o.admission.policy = AdmissionPolicy{};  // memory
    o.admission.budget_bytes = kBudget;
    o.admission.max_bypass = std::chrono::hours(1);  // small requests may always pass a waiting large one
    o.oom_governor.quiet_period = quiet_period;
    o.oom_governor.increase_step = 1.0;  // one quiet period restores the whole budget
    return o;
  }
  // Runs a small request into the injected OOM; it is preempted, recomputed
  // and completes. Returns once it finished.
  void run_into_oom(Engine& engine) {
    model_.fail_at_step(1);
    auto a = std::make_shared<Collector>();
    ASSERT_TRUE(engine.submit(req(4), a).ok());
    ASSERT_TRUE(a->wait_done());
    ASSERT_TRUE(a->finished());
    EXPECT_EQ(a->text(), "ello");
    EXPECT_EQ(engine.stats().counters[CounterId::kPreemptions], 1);
  }
};

TEST_F(EngineOomGovernorTest, AnOomCutsTheBudgetAndALargeRequestWaitsInsteadOfBeingRefused) {
  auto engine = make(governed(std::chrono::hours(1)));
  run_into_oom(*engine);
  EXPECT_EQ(engine->admission().effective_budget_bytes, kBudget / 2);
  EXPECT_EQ(engine->admission().budget_bytes, kBudget);
  EXPECT_EQ(engine->stats().counters[CounterId::kOomBudgetCuts], 1);
  // 70 tokens: over the cut budget, within the configured one.
  auto big = std::make_shared<Collector>();
  ASSERT_TRUE(engine->submit(req(69), big).ok());
  ASSERT_TRUE(big->wait_queued());
  EXPECT_FALSE(big->started());
  EXPECT_EQ(big->terminals(), 0);
  EXPECT_EQ(engine->stats().queue_depth, 1);
  EXPECT_EQ(engine->stats().effective_budget_bytes, kBudget / 2);
  // Work that fits the cut budget still runs.
  auto small = std::make_shared<Collector>();
  ASSERT_TRUE(engine->submit(req(9), small).ok());
  ASSERT_TRUE(small->wait_done());
  EXPECT_TRUE(small->finished());
  EXPECT_FALSE(big->started());
}

TEST_F(EngineOomGovernorTest, TheWaitingRequestRunsOnceAQuietPeriodRestoresTheBudget) {
  auto engine = make(governed(std::chrono::milliseconds(1)));
  run_into_oom(*engine);
  EXPECT_EQ(engine->stats().counters[CounterId::kOomBudgetCuts], 1);
  auto big = std::make_shared<Collector>();
  ASSERT_TRUE(engine->submit(req(69), big).ok());
  ASSERT_TRUE(big->wait_done());
  EXPECT_TRUE(big->finished());
  EXPECT_EQ(engine->admission().effective_budget_bytes, kBudget);
  EXPECT_TRUE(engine->wait_idle(Clock::now() + std::chrono::seconds(10)));
  EXPECT_EQ(engine->stats().oom_budget_raises, 1);
  EXPECT_EQ(engine->stats().effective_budget_bytes, kBudget);
}

TEST_F(EngineTest, BadOomGovernorOptionsAreAConfigError) {
  auto o = options();
  o.oom_governor.decrease_factor = 1.5;
  auto e = Engine::create(o, model_, *device_);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.error().code, ErrorCode::kConfig);
}

TEST_F(EngineTest, LongPromptsArePrefilledInChunks) {
  auto o = options();
  o.max_batch_tokens = 4;
  auto engine = make(o);
  auto a = std::make_shared<Collector>();
  ASSERT_TRUE(engine->submit(req(3, "abcdefghij"), a).ok());  // 10 prompt tokens -> chunks 4+4+2
  ASSERT_TRUE(a->wait_done());
  ASSERT_TRUE(a->finished());
  EXPECT_EQ(a->finished()->usage.completion_tokens, 3);
  EXPECT_EQ(model_.max_tokens_per_step(), 4);
  EXPECT_EQ(model_.steps(), 3 + 2);
}

}  // namespace
}  // namespace vg
