// The engine with a paged KV cache (Engine::Options::kv_pool) on the
// FakeModel's block pool: leases in whole blocks that always cover the
// blocks in use, on-demand reservations that hold more sequences than full
// ones, growth with preemption and recompute, the prefix cache, n > 1
// choices sharing their prompt's blocks, and a pool that follows the
// effective budget. The FakeModel's next token depends only on the cache
// length, so every answer is known in advance, however it was computed.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "engine/engine.hpp"
#include "engine_test_util.hpp"

namespace vg {
namespace {

using testing::Collector;
using testing::EngineTest;
using testing::eventually;

constexpr int kBlockTokens = 4;
constexpr std::int64_t kBlockBytes = kBlockTokens * testing::FakePool::kBytesPerToken;
const std::string kScript = "hello world. ";

// The greedy text after a prompt of `prompt` tokens: the script from there on.
std::string continuation(int prompt, int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out += kScript[static_cast<std::size_t>(prompt + i) % kScript.size()];
  return out;
}

class KvPoolEngineTest : public EngineTest {
 protected:
  Engine::Options pool_options(std::int64_t blocks, KvReservation reservation, bool prefix_cache = true) {
    EXPECT_TRUE(model_.use_kv_pool(KvPoolOptions{kBlockTokens, blocks, prefix_cache}).ok());
    Engine::Options o = options(16, 64);
    o.admission.policy = AdmissionPolicy{AdmissionPolicy::Kind::kMemory, 0};
    o.admission.budget_bytes = blocks * kBlockBytes;
    o.max_preemptions = 20;
    o.kv_pool = Engine::Options::KvPool{KvBlockGeometry{kBlockTokens, kBlockBytes}, reservation};
    return o;
  }
  // Runs `n` requests of prompt "abc" to their end at once and checks their texts.
  void run_all(Engine& engine, int n, int max_tokens, int expected_tokens) {
    std::vector<std::shared_ptr<Collector>> cs;
    model_.block();
    for (int i = 0; i < n; ++i) {
      cs.push_back(std::make_shared<Collector>());
      ASSERT_TRUE(engine.submit(req(max_tokens, "abc"), cs.back()).ok());
    }
    model_.unblock();
    for (auto& c : cs) {
      ASSERT_TRUE(c->wait_done());
      ASSERT_TRUE(c->finished()) << (c->failed() ? c->failed()->message : "");
      EXPECT_EQ(c->text(), continuation(3, expected_tokens));
    }
  }
  // Completes kMinSamples requests that stop after 6 generated tokens (the
  // sixth an end of text, at cache length 8), which the estimate learns from.
  void learn_short_answers(Engine& engine) {
    model_.eos_at_length(8);
    run_all(engine, static_cast<int>(OutputLengthEstimate::kMinSamples), 20, 5);
  }
  std::int64_t used_blocks() { return model_.kv_pool_counts()->used; }
};

TEST_F(KvPoolEngineTest, OnDemandLeasesPayExactlyForTheBlocksInUse) {
  auto engine = make(pool_options(64, KvReservation::kOnDemand));
  model_.block_decode();
  auto a = std::make_shared<Collector>();
  ASSERT_TRUE(engine->submit(req(30, "abcdefghij"), a).ok());
  ASSERT_TRUE(model_.wait_in_decode());
  // Before any completion the reserve is max_tokens: 10 + 29 positions (the
  // last token is never fed back), 10 blocks.
  EXPECT_EQ(used_blocks(), 10);
  EXPECT_EQ(engine->admission().reserved_bytes, used_blocks() * kBlockBytes);
  model_.unblock_decode();
  ASSERT_TRUE(a->wait_done());
  ASSERT_TRUE(a->finished());
  EXPECT_EQ(a->text(), continuation(10, 30));
  EXPECT_EQ(engine->admission().reserved_bytes, 0);
  EXPECT_EQ(used_blocks(), 0);
  EXPECT_GT(model_.kv_pool_counts()->cached, 0);  // its full blocks stay for the prefix cache
}

// 12 blocks; "abc" + max_tokens 20 is 3 + 19 positions, 6 blocks, at
// worst: full holds 2. Answers stop after 6 tokens (5 and an end of text):
// on demand reserves 3 + 5 positions, 2 blocks.
TEST_F(KvPoolEngineTest, FullReservesTheWorstCaseOfEverySequence) {
  auto engine = make(pool_options(12, KvReservation::kFull));
  learn_short_answers(*engine);
  run_all(*engine, 6, 20, 5);
  EXPECT_EQ(model_.max_inputs_per_step(), 2);
  EXPECT_EQ(engine->stats().counters[CounterId::kPreemptions], 0);
  EXPECT_EQ(engine->admission().reserved_bytes, 0);
}

TEST_F(KvPoolEngineTest, OnDemandHoldsMoreSequencesOnceItLearnedThatAnswersAreShort) {
  auto engine = make(pool_options(12, KvReservation::kOnDemand));
  learn_short_answers(*engine);
  EXPECT_EQ(model_.max_inputs_per_step(), 2);  // while it learned, it reserved the worst case
  run_all(*engine, 6, 20, 5);
  EXPECT_EQ(model_.max_inputs_per_step(), 6);
  EXPECT_EQ(engine->stats().counters[CounterId::kPreemptions], 0);
  EXPECT_EQ(engine->admission().reserved_bytes, 0);
}

TEST_F(KvPoolEngineTest, SequencesThatOutgrowTheEstimateArePreemptedAndRecomputedToTheSameText) {
  auto engine = make(pool_options(12, KvReservation::kOnDemand));
  learn_short_answers(*engine);
  model_.eos_at_length(1000);  // now every answer runs to max_tokens
  run_all(*engine, 5, 20, 20);
  const EngineStats st = engine->stats();
  EXPECT_GT(st.counters[CounterId::kPreemptions], 0);
  EXPECT_GT(st.kv_pool.growth_preemptions, 0);
  EXPECT_GT(st.kv_pool.recomputed_tokens, 0);
  EXPECT_EQ(st.counters[CounterId::kFailed], 0);
  EXPECT_EQ(engine->admission().reserved_bytes, 0);
  EXPECT_EQ(used_blocks(), 0);
}

TEST_F(KvPoolEngineTest, APromptStartsFromTheBlocksAnEarlierPromptLeftInThePrefixCache) {
  auto engine = make(pool_options(64, KvReservation::kOnDemand));
  const std::string prompt = "twenty tokens long!!";  // 20 tokens: 4 whole blocks before its last token
  for (int i = 0; i < 2; ++i) {
    auto c = std::make_shared<Collector>();
    ASSERT_TRUE(engine->submit(req(6, prompt), c).ok());
    ASSERT_TRUE(c->wait_done());
    ASSERT_TRUE(c->finished());
    EXPECT_EQ(c->text(), continuation(20, 6));
  }
  const std::vector<int> inputs = model_.inputs_log();
  EXPECT_EQ(std::count(inputs.begin(), inputs.end(), 20), 1);  // the first prompt in full
  EXPECT_EQ(std::count(inputs.begin(), inputs.end(), 4), 1);   // the second: its last block only
  ASSERT_TRUE(eventually([&] { return engine->stats().kv_pool.prefix_hit_tokens == 16; }));
  EXPECT_EQ(engine->stats().kv_pool.prompt_tokens, 40);
}

TEST_F(KvPoolEngineTest, WithThePrefixCacheOffEveryPromptIsComputedInFull) {
  auto engine = make(pool_options(64, KvReservation::kOnDemand, /*prefix_cache=*/false));
  for (int i = 0; i < 2; ++i) {
    auto c = std::make_shared<Collector>();
    ASSERT_TRUE(engine->submit(req(6, "twenty tokens long!!"), c).ok());
    ASSERT_TRUE(c->wait_done());
  }
  const std::vector<int> inputs = model_.inputs_log();
  EXPECT_EQ(std::count(inputs.begin(), inputs.end(), 20), 2);
  EXPECT_EQ(engine->stats().kv_pool.prefix_hit_tokens, 0);
}

TEST_F(KvPoolEngineTest, ChoicesShareTheirPromptBlocksAndTheLeasesStillCoverEveryBlock) {
  auto engine = make(pool_options(64, KvReservation::kOnDemand));
  model_.block_decode();
  GenerationRequest r = req(8, "abcdefghi");  // 9 tokens: 2 whole blocks shared by the choices
  r.n = 3;
  auto c = std::make_shared<Collector>();
  ASSERT_TRUE(engine->submit(r, c).ok());
  ASSERT_TRUE(model_.wait_in_decode());
  // Leader: 9 + 7 positions, 4 blocks; each follower shares 2 and holds 2.
  EXPECT_EQ(used_blocks(), 4 + 2 * 2);
  EXPECT_EQ(engine->admission().reserved_bytes, used_blocks() * kBlockBytes);
  model_.unblock_decode();
  ASSERT_TRUE(c->wait_done());
  ASSERT_TRUE(c->finished());
  EXPECT_EQ(c->finished()->usage.completion_tokens, 24);
  EXPECT_EQ(engine->admission().reserved_bytes, 0);
}

TEST_F(KvPoolEngineTest, OnDemandRefusesARequestWhoseWorstCaseCanNeverFitThePool) {
  auto engine = make(pool_options(8, KvReservation::kOnDemand));  // 32 tokens
  auto c = std::make_shared<Collector>();
  auto r = engine->submit(req(40, "abc"), c);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::kExceedsDeviceMemory);
  EXPECT_TRUE(engine->submit(req(29, "abc"), c).ok());
  ASSERT_TRUE(c->wait_done());
  EXPECT_TRUE(c->finished());
}

TEST_F(KvPoolEngineTest, ThePoolShrinksWithAnOutOfMemoryCutAndGrowsBackAfterTheQuietPeriod) {
  Engine::Options o = pool_options(16, KvReservation::kOnDemand);
  o.oom_governor.quiet_period = std::chrono::milliseconds(20);
  o.oom_governor.increase_step = 1.0;
  auto engine = make(o);
  model_.fail_at_step(3);
  auto c = std::make_shared<Collector>();
  ASSERT_TRUE(engine->submit(req(10, "abc"), c).ok());
  ASSERT_TRUE(c->wait_done());
  ASSERT_TRUE(c->finished());
  EXPECT_EQ(c->text(), continuation(3, 10));
  EXPECT_GE(model_.pool_resizes(), 1);  // cut to half: 8 blocks
  ASSERT_TRUE(eventually([&] { return model_.kv_pool_counts()->total == 16; }));
  EXPECT_GE(model_.pool_resizes(), 2);
  ASSERT_TRUE(eventually([&] { return engine->admission().effective_budget_bytes == 16 * kBlockBytes; }));
}

// A resize that loses the pool's storage (not even its old size could be
// allocated again): nothing steps on it, every sequence starts again from
// its tokens, and a new storage is allocated at a later turn.
TEST_F(KvPoolEngineTest, APoolThatLostItsStorageStepsNothingAndItsSequencesStartAgain) {
  Engine::Options o = pool_options(16, KvReservation::kOnDemand);
  o.oom_governor.quiet_period = std::chrono::milliseconds(20);
  o.oom_governor.increase_step = 1.0;
  auto engine = make(o);
  model_.pool()->lose_at_next_resize();
  model_.fail_at_step(3);  // the cut moves the pool, and the move loses it
  auto c = std::make_shared<Collector>();
  ASSERT_TRUE(engine->submit(req(10, "abc"), c).ok());
  ASSERT_TRUE(c->wait_done());
  ASSERT_TRUE(c->finished()) << (c->failed() ? c->failed()->message : "");
  EXPECT_EQ(c->text(), continuation(3, 10));
  EXPECT_EQ(model_.steps_on_lost_pool(), 0);
  EXPECT_FALSE(model_.pool()->lost());
  EXPECT_GE(model_.pool_resizes(), 2);
  EXPECT_EQ(engine->admission().reserved_bytes, 0);
}

}  // namespace
}  // namespace vg
