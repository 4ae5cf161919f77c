// How the engine counts requests: one admission and one end per request
// whatever its n, by outcome, through preemptions and resubmissions; the
// drain rate behind Retry-After counts requests; the per-request histograms
// take one sample per request. At rest, admitted (first grants) equals the
// finished requests (completed + failed + cancelled).
#include <gtest/gtest.h>

#include "engine/engine.hpp"
#include "engine_test_util.hpp"
#include "metrics/registry.hpp"
#include "metrics/server_metrics.hpp"

namespace vg {
namespace {

using testing::Collector;
using testing::EngineTest;

class EngineCountingTest : public EngineTest {
 protected:
  std::unique_ptr<Engine> make_counted(int max_batch = 8) {
    Engine::Options o = options(max_batch);
    o.metrics = &metrics_;
    return make(o);
  }
  /// admitted = completed + failed + cancelled, once the engine is idle.
  static void expect_balanced(Engine& engine) {
    ASSERT_TRUE(engine.wait_idle(Clock::now() + std::chrono::seconds(10)));
    const EngineStats st = engine.stats();
    EXPECT_EQ(
        engine.admission().counters.admitted,
        st.counters[CounterId::kCompleted] + st.counters[CounterId::kFailed] + st.counters[CounterId::kCancelled]);
  }

  metrics::Registry registry_;
  metrics::ServerMetrics metrics_{registry_};
};

TEST_F(EngineCountingTest, ARequestOfFourChoicesIsOneAdmissionOneCompletionAndOneSample) {
  auto engine = make_counted();
  auto sink = std::make_shared<Collector>();
  GenerationRequest r = req(5);
  r.n = 4;
  ASSERT_TRUE(engine->submit(r, sink).ok());
  ASSERT_TRUE(sink->wait_done());
  ASSERT_TRUE(sink->finished());
  ASSERT_TRUE(engine->wait_idle(Clock::now() + std::chrono::seconds(10)));
  EXPECT_EQ(engine->stats().counters[CounterId::kCompleted], 1);
  EXPECT_EQ(engine->admission().counters.admitted, 1);
  EXPECT_EQ(metrics_.time_to_first_token_seconds.snapshot().count, 1u);
  EXPECT_EQ(metrics_.request_duration_seconds.snapshot().count, 1u);
  EXPECT_EQ(metrics_.generated_tokens_total.value(), 20);  // tokens still count per choice
  // One completion in the drain window: at most 1 a second (four choices
  // counted apart would make it 4).
  const std::optional<double> rate = engine->admission().drain_rate_per_s;
  ASSERT_TRUE(rate);
  EXPECT_LE(*rate, 1.0);
  expect_balanced(*engine);
}

TEST_F(EngineCountingTest, ACancelledRequestOfThreeChoicesIsCancelledOnce) {
  model_.block();
  auto engine = make_counted();
  auto sink = std::make_shared<Collector>();
  GenerationRequest r = req(50);
  r.n = 3;
  auto h = engine->submit(r, sink);
  ASSERT_TRUE(h.ok());
  ASSERT_TRUE(model_.wait_in_step());
  (*h)->cancel();
  model_.unblock();
  ASSERT_TRUE(sink->wait_done());
  ASSERT_TRUE(sink->failed());
  ASSERT_TRUE(engine->wait_idle(Clock::now() + std::chrono::seconds(10)));
  const EngineStats st = engine->stats();
  EXPECT_EQ(st.counters[CounterId::kCancelled], 1);
  EXPECT_EQ(st.counters[CounterId::kCompleted] + st.counters[CounterId::kFailed], 0);
  EXPECT_EQ(metrics_.request_duration_seconds.snapshot().count, 1u);
  EXPECT_FALSE(engine->admission().drain_rate_per_s) << "nothing completed";
  expect_balanced(*engine);
}

TEST_F(EngineCountingTest, APreemptedRequestIsAdmittedOnceAndGrantedAgain) {
  model_.fail_at_step(4);  // prefill, two decode steps, then out-of-memory
  auto engine = make_counted();
  auto sink = std::make_shared<Collector>();
  ASSERT_TRUE(engine->submit(req(12), sink).ok());
  ASSERT_TRUE(sink->wait_done());
  ASSERT_TRUE(sink->finished());
  ASSERT_TRUE(engine->wait_idle(Clock::now() + std::chrono::seconds(10)));
  EXPECT_EQ(engine->stats().counters[CounterId::kPreemptions], 1);
  const AdmissionCounters n = engine->admission().counters;
  EXPECT_EQ(n.admitted, 1);
  EXPECT_EQ(n.regranted, 1);
  EXPECT_EQ(engine->stats().counters[CounterId::kCompleted], 1);
  expect_balanced(*engine);
}

TEST_F(EngineCountingTest, APreemptedChoiceLeavesItsRequestCountedOnce) {
  model_.fail_at_step(4);
  auto engine = make_counted();
  auto sink = std::make_shared<Collector>();
  GenerationRequest r = req(10);
  r.n = 2;
  ASSERT_TRUE(engine->submit(r, sink).ok());
  ASSERT_TRUE(sink->wait_done());
  ASSERT_TRUE(sink->finished());
  ASSERT_TRUE(engine->wait_idle(Clock::now() + std::chrono::seconds(10)));
  EXPECT_GE(engine->stats().counters[CounterId::kPreemptions], 1);
  EXPECT_EQ(engine->admission().counters.admitted, 1);
  EXPECT_EQ(engine->stats().counters[CounterId::kCompleted], 1);
  EXPECT_EQ(metrics_.time_to_first_token_seconds.snapshot().count, 1u);
  expect_balanced(*engine);
}

TEST_F(EngineCountingTest, ARequestAdmittedBeforeIsGrantedAgainNotAdmittedAgain) {
  auto engine = make_counted();
  auto sink = std::make_shared<Collector>();
  GenerationRequest r = req(4);
  r.admitted_before = true;  // an engine process that died had admitted it
  ASSERT_TRUE(engine->submit(r, sink).ok());
  ASSERT_TRUE(sink->wait_done());
  ASSERT_TRUE(engine->wait_idle(Clock::now() + std::chrono::seconds(10)));
  const AdmissionCounters n = engine->admission().counters;
  EXPECT_EQ(n.admitted, 0);
  EXPECT_EQ(n.regranted, 1);
  EXPECT_EQ(engine->stats().counters[CounterId::kCompleted], 1);  // it ends here: counted here
}

TEST_F(EngineCountingTest, OnlyARequestAdmittedBeforeCountsAmongTheFinishedWhenItLeavesTheQueue) {
  model_.block();
  auto engine = make_counted(1);
  auto running = std::make_shared<Collector>();
  ASSERT_TRUE(engine->submit(req(3), running).ok());
  ASSERT_TRUE(model_.wait_in_step());
  auto fresh = std::make_shared<Collector>();
  auto resumed = std::make_shared<Collector>();
  GenerationRequest again = req(3);
  again.admitted_before = true;
  auto hf = engine->submit(req(3), fresh);
  auto hr = engine->submit(again, resumed);
  ASSERT_TRUE(hf.ok() && hr.ok());
  (*hf)->cancel();
  (*hr)->cancel();
  model_.unblock();
  ASSERT_TRUE(fresh->wait_done());
  ASSERT_TRUE(resumed->wait_done());
  ASSERT_TRUE(running->wait_done());
  ASSERT_TRUE(engine->wait_idle(Clock::now() + std::chrono::seconds(10)));
  const AdmissionCounters n = engine->admission().counters;
  EXPECT_EQ(n.cancelled, 1);                   // the fresh one: it never left the queue
  EXPECT_EQ(engine->stats().counters[CounterId::kCancelled], 1);  // the one admitted before
  EXPECT_EQ(engine->stats().counters[CounterId::kCompleted], 1);  // the running one
  EXPECT_EQ(n.admitted, 1);
}

}  // namespace
}  // namespace vg
