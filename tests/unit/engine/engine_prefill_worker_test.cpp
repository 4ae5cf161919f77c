// Engine::Options::prefill_worker: new prompts are prefilled on a second
// thread while the engine thread's decode steps go on.
#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "engine/engine.hpp"
#include "engine_test_util.hpp"

namespace vg {
namespace {

using testing::Collector;
using testing::EngineTest;

class PrefillWorkerTest : public EngineTest {
 protected:
  static Engine::Options worker_options(int max_batch = 8) {
    Engine::Options o = options(max_batch);
    o.prefill_worker = true;
    return o;
  }
  // What the fake model's greedy continuation of `prompt` is: the script
  // from position prompt.size() on.
  static std::string expected(const std::string& prompt, int tokens) {
    const std::string script = "hello world. ";
    std::string out;
    for (int i = 0; i < tokens; ++i) {
      out += script[(prompt.size() + static_cast<std::size_t>(i)) % script.size()];
    }
    return out;
  }
};

TEST_F(PrefillWorkerTest, BothComputeThreadsArePreparedOnTheDeviceBeforeCreateReturns) {
  auto engine = make(worker_options());
  // Prepared before create returned: nothing ran yet, nothing waits here.
  const std::vector<std::thread::id> prepared = device_->prepared();
  ASSERT_EQ(prepared.size(), 2u);
  EXPECT_NE(prepared[0], prepared[1]);
  for (const std::thread::id id : prepared) EXPECT_NE(id, std::this_thread::get_id());
  EXPECT_TRUE(model_.steps_log().empty());
}

TEST_F(PrefillWorkerTest, EveryRequestGetsItsTextAndPrefillsNeverShareAStepWithDecodes) {
  auto engine = make(worker_options(4));
  std::vector<std::shared_ptr<Collector>> sinks;
  std::vector<std::string> prompts;
  for (int i = 0; i < 16; ++i) {
    prompts.push_back(std::string(static_cast<std::size_t>(2 + i % 5), 'p'));
    sinks.push_back(std::make_shared<Collector>());
    ASSERT_TRUE(engine->submit(req(3 + i % 6, prompts.back()), sinks.back()).ok());
  }
  for (std::size_t i = 0; i < sinks.size(); ++i) {
    ASSERT_TRUE(sinks[i]->wait_done());
    ASSERT_TRUE(sinks[i]->finished()) << i;
    EXPECT_EQ(sinks[i]->text(), expected(prompts[i], 3 + static_cast<int>(i) % 6)) << i;
    EXPECT_EQ(sinks[i]->terminals(), 1);
  }
  ASSERT_TRUE(engine->wait_idle(Clock::now() + std::chrono::seconds(10)));
  EXPECT_EQ(engine->stats().counters[CounterId::kCompleted], 16);
  EXPECT_EQ(engine->stats().running, 0);
  EXPECT_EQ(engine->admission().reserved_bytes, 0);
  // Every prompt has 2+ tokens: a step holds prefill chunks or decode
  // tokens, never both.
  for (const std::vector<int>& step : model_.steps_log()) {
    const bool has_prefill = std::any_of(step.begin(), step.end(), [](int n) { return n > 1; });
    const bool has_decode = std::any_of(step.begin(), step.end(), [](int n) { return n == 1; });
    EXPECT_FALSE(has_prefill && has_decode);
  }
}

TEST_F(PrefillWorkerTest, ANewPromptIsPrefilledDuringADecodeStepAndDecodingGoesOnDuringItsPrefill) {
  auto engine = make(worker_options());
  auto b = std::make_shared<Collector>();
  auto c = std::make_shared<Collector>();
  // b is prefilled, then held inside its first decode step: the engine
  // thread is busy.
  model_.block_decode();
  ASSERT_TRUE(engine->submit(req(30, "ab"), b).ok());
  ASSERT_TRUE(model_.wait_in_decode());
  ASSERT_EQ(b->terminals(), 0);
  model_.block_prefill();
  // c is granted and its prefill starts while that step is still held.
  ASSERT_TRUE(engine->submit(req(5, "abcd"), c).ok());
  ASSERT_TRUE(model_.wait_in_prefill());
  // Decoding goes on while c's prefill is held: b finishes first.
  model_.unblock_decode();
  ASSERT_TRUE(b->wait_done());
  ASSERT_TRUE(b->finished());
  EXPECT_EQ(b->text(), expected("ab", 30));
  EXPECT_EQ(c->terminals(), 0);
  model_.unblock_prefill();
  ASSERT_TRUE(c->wait_done());
  ASSERT_TRUE(c->finished());
  EXPECT_EQ(c->text(), expected("abcd", 5));
}

TEST_F(PrefillWorkerTest, AMaxTokensOfOneFinishesOnTheWorker) {
  auto engine = make(worker_options());
  auto a = std::make_shared<Collector>();
  ASSERT_TRUE(engine->submit(req(1, "abc"), a).ok());
  ASSERT_TRUE(a->wait_done());
  ASSERT_TRUE(a->finished());
  EXPECT_EQ(a->text(), expected("abc", 1));
  EXPECT_EQ(a->finished()->usage.completion_tokens, 1);
  ASSERT_TRUE(engine->wait_idle(Clock::now() + std::chrono::seconds(10)));
  EXPECT_EQ(engine->admission().reserved_bytes, 0);
  EXPECT_EQ(model_.steps(), 1);
}

TEST_F(PrefillWorkerTest, CancelDuringAHeldPrefillAnswersOnceAndFreesTheLease) {
  auto engine = make(worker_options());
  model_.block_prefill();
  auto a = std::make_shared<Collector>();
  auto handle = engine->submit(req(40, "abcd"), a);
  ASSERT_TRUE(handle.ok());
  ASSERT_TRUE(model_.wait_in_prefill());
  (*handle)->cancel();
  model_.unblock_prefill();
  ASSERT_TRUE(a->wait_done());
  ASSERT_TRUE(a->failed());
  EXPECT_EQ(a->failed()->code, ErrorCode::kCancelled);
  EXPECT_EQ(a->terminals(), 1);
  ASSERT_TRUE(engine->wait_idle(Clock::now() + std::chrono::seconds(10)));
  EXPECT_EQ(engine->admission().reserved_bytes, 0);
  EXPECT_EQ(engine->stats().counters[CounterId::kCancelled], 1);
}

TEST_F(PrefillWorkerTest, OutOfMemoryInAPrefillStepPreemptsAndTheRequestStillCompletes) {
  model_.fail_at_step(1);  // the first step is the worker's prefill of a
  auto engine = make(worker_options());
  auto a = std::make_shared<Collector>();
  ASSERT_TRUE(engine->submit(req(6, "abc"), a).ok());
  ASSERT_TRUE(a->wait_done());
  ASSERT_TRUE(a->finished());
  EXPECT_EQ(a->text(), expected("abc", 6));
  EXPECT_EQ(a->terminals(), 1);
  const EngineStats st = engine->stats();
  EXPECT_EQ(st.counters[CounterId::kOutOfMemory], 1);
  EXPECT_EQ(st.counters[CounterId::kPreemptions], 1);
  EXPECT_EQ(st.counters[CounterId::kCompleted], 1);
  ASSERT_TRUE(engine->wait_idle(Clock::now() + std::chrono::seconds(10)));
  EXPECT_EQ(engine->admission().reserved_bytes, 0);
}

TEST_F(PrefillWorkerTest, ShutdownWithAPrefillHeldAnswersEveryRequestOnce) {
  auto engine = make(worker_options(1));
  model_.block_prefill();
  auto a = std::make_shared<Collector>();
  auto b = std::make_shared<Collector>();
  ASSERT_TRUE(engine->submit(req(40, "abcd"), a).ok());
  ASSERT_TRUE(model_.wait_in_prefill());
  ASSERT_TRUE(engine->submit(req(40, "abcd"), b).ok());  // queued: max_batch 1
  engine->request_stop();
  model_.unblock_prefill();
  engine->shutdown();
  ASSERT_TRUE(a->wait_done());
  ASSERT_TRUE(b->wait_done());
  EXPECT_EQ(a->terminals(), 1);
  EXPECT_EQ(b->terminals(), 1);
  ASSERT_TRUE(b->failed());
  EXPECT_EQ(b->failed()->code, ErrorCode::kOverloaded);
  EXPECT_EQ(engine->admission().reserved_bytes, 0);
}

TEST_F(PrefillWorkerTest, ADeadlineThatPassesDuringAChunkedPrefillStopsItAtTheNextChunk) {
  auto o = worker_options();
  o.max_batch_tokens = 2;  // 8 prompt tokens: 4 chunks
  auto engine = make(o);
  model_.block_prefill();
  auto a = std::make_shared<Collector>();
  auto r = req(5, "abcdefgh");
  // Far enough ahead that the request surely reaches its first chunk first.
  r.deadline = Clock::now() + std::chrono::milliseconds(500);
  ASSERT_TRUE(engine->submit(r, a).ok());
  ASSERT_TRUE(model_.wait_in_prefill());
  // The first chunk is held until the deadline has passed (observed on the clock).
  while (Clock::now() < *r.deadline) std::this_thread::yield();
  model_.unblock_prefill();
  ASSERT_TRUE(a->wait_done());
  ASSERT_TRUE(a->failed());
  EXPECT_EQ(a->failed()->code, ErrorCode::kTimeout);
  EXPECT_EQ(a->text(), "");
  EXPECT_EQ(model_.steps(), 1);  // no chunk after the deadline
  ASSERT_TRUE(engine->wait_idle(Clock::now() + std::chrono::seconds(10)));
  EXPECT_EQ(engine->admission().reserved_bytes, 0);
}

TEST_F(PrefillWorkerTest, TheWatchdogSeesAPrefillStepInProgress) {
  auto engine = make(worker_options());
  EXPECT_FALSE(engine->busy_for(Clock::now()));
  model_.block_prefill();
  auto a = std::make_shared<Collector>();
  ASSERT_TRUE(engine->submit(req(3, "abcd"), a).ok());
  ASSERT_TRUE(model_.wait_in_prefill());
  // Only the worker is in a step: the engine thread has nothing to decode.
  EXPECT_TRUE(engine->busy_for(Clock::now()));
  model_.unblock_prefill();
  ASSERT_TRUE(a->wait_done());
  EXPECT_TRUE(a->finished());
}

}  // namespace
}  // namespace vg
