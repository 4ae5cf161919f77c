// KV caches in a shared block pool (Model::use_kv_pool): a step over caches
// whose blocks are scattered over the pool gives the logits of caches of
// their own, bit for bit, on every attention path (host decode kernel,
// tensor path, prefill chunks), dtype and grouped-query attention; n > 1
// choices share the full blocks of their prompt; the pool hands out, grows
// and takes back blocks, and refuses what it cannot hold; the prefix cache
// gives a later prompt the blocks an earlier sequence computed.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "common/bytes.hpp"
#include "device/device.hpp"
#include "model/model.hpp"
#include "model_test_util.hpp"

namespace vg {
namespace {

using testing::run_batched;
using testing::Schedule;
using testing::TempDir;

std::unique_ptr<Model> load_pooled(const std::filesystem::path& dir, Device* device, const std::string& dtype,
                                   bool host_kernel) {
  auto m = Model::load({dir, device, dtype, host_kernel});
  EXPECT_TRUE(m.ok()) << m.error().message;
  return m.ok() ? std::move(m).value() : nullptr;
}

/// `sequences` schedules: a prompt of 3..29 tokens (odd ones in two chunks),
/// then `decode` single tokens; sequence i joins at step i % 3.
std::vector<Schedule> schedules(int sequences, int decode, int vocab) {
  std::vector<Schedule> out;
  for (int i = 0; i < sequences; ++i) {
    Schedule s;
    s.join = i % 3;
    std::vector<std::int32_t> prompt;
    for (int j = 0; j < 3 + (i * 11) % 27; ++j) prompt.push_back((j * 37 + i * 101 + 5) % vocab);
    if (i % 2 == 1) {
      const auto half = static_cast<std::ptrdiff_t>(prompt.size() / 2);
      s.chunks.emplace_back(prompt.begin(), prompt.begin() + half);
      s.chunks.emplace_back(prompt.begin() + half, prompt.end());
    } else {
      s.chunks.push_back(prompt);
    }
    for (int j = 0; j < decode; ++j) s.chunks.push_back({(i * 7 + j * 3) % vocab});
    out.push_back(std::move(s));
  }
  return out;
}

/// Leaves every other block of a fresh pool free between held ones, so that
/// the caches made next get blocks that are not consecutive.
std::vector<std::unique_ptr<KvCache>> scatter(Model& model, int block_tokens, int pairs) {
  std::vector<std::unique_ptr<KvCache>> all, kept;
  for (int i = 0; i < 2 * pairs; ++i) all.push_back(std::move(model.new_cache(block_tokens)).value());
  for (int i = 0; i < 2 * pairs; i += 2) kept.push_back(std::move(all[static_cast<std::size_t>(i)]));
  return kept;  // the odd ones are freed as `all` goes
}

/// The logits of `plan` with caches of their own and with caches scattered
/// over a pool of 4-token blocks are the same bits.
void expect_pool_matches_own_caches(const std::filesystem::path& dir, const std::string& dtype, bool host_kernel) {
  SCOPED_TRACE(dtype + (host_kernel ? ", host decode kernel" : ", tensor path"));
  auto device = std::move(VirtualDevice::create(0, kGiB)).value();
  auto own = load_pooled(dir, device.get(), dtype, host_kernel);
  auto pooled = load_pooled(dir, device.get(), dtype, host_kernel);
  ASSERT_NE(own, nullptr);
  ASSERT_NE(pooled, nullptr);
  ASSERT_TRUE(pooled->use_kv_pool({4, 400}).ok());
  const auto held = scatter(*pooled, 4, 60);
  const auto plan = schedules(12, 8, own->config().vocab_size);
  const auto expected = run_batched(*own, plan);
  const auto got = run_batched(*pooled, plan);
  ASSERT_EQ(got.size(), expected.size());
  for (std::size_t i = 0; i < plan.size(); ++i) {
    ASSERT_EQ(got[i].size(), plan[i].chunks.size()) << "sequence " << i;
    for (std::size_t c = 0; c < got[i].size(); ++c) EXPECT_EQ(got[i][c], expected[i][c]) << "sequence " << i << ", chunk " << c;
  }
  // The caches of the run gave their blocks back; the scattered ones hold theirs.
  EXPECT_EQ(pooled->kv_pool_counts()->used, static_cast<std::int64_t>(held.size()));
}

TEST(KvPool, Gpt2InScatteredBlocksGivesTheLogitsOfOwnCachesOnEveryPath) {
  TempDir dir;
  testing::RandomGpt2 spec;
  spec.n_positions = 64;
  testing::write_random_gpt2(dir.path(), spec);
  for (const bool host_kernel : {true, false}) {
    for (const char* dtype : {"float32", "bfloat16", "float64"}) expect_pool_matches_own_caches(dir.path(), dtype, host_kernel);
  }
}

TEST(KvPool, GroupedQueryLlamaInScatteredBlocksGivesTheLogitsOfOwnCaches) {
  TempDir dir;
  ASSERT_EQ(testing::run_python_tool("make_random_llama.py", "--out '" + dir.path().string() +
                                                                  "' --seed 2 --layers 2 --heads 8 --kv-heads 2 "
                                                                  "--hidden 64 --positions 64"),
            0);
  for (const bool host_kernel : {true, false}) expect_pool_matches_own_caches(dir.path(), "float32", host_kernel);
}

struct PooledGpt2 {
  TempDir dir;
  std::unique_ptr<VirtualDevice> device = std::move(VirtualDevice::create(0, kGiB)).value();
  std::unique_ptr<Model> model;
  explicit PooledGpt2(bool host_kernel = true, std::int64_t blocks = 16, bool prefix_cache = true) {
    testing::RandomGpt2 spec;
    spec.n_positions = 64;
    testing::write_random_gpt2(dir.path(), spec);
    model = load_pooled(dir.path(), device.get(), "float32", host_kernel);
    EXPECT_TRUE(model->use_kv_pool({4, blocks, prefix_cache}).ok());
  }
  /// Steps `tokens` into `cache` in one chunk; the logits of the last one.
  std::vector<float> feed(KvCache& cache, std::span<const std::int32_t> tokens) {
    const StepInput in{&cache, tokens};
    auto r = model->step(std::span(&in, 1));
    EXPECT_TRUE(r.ok()) << r.error().message;
    return r.ok() ? r->at(0) : std::vector<float>();
  }
};

// A choice made with copy_cache shares the prompt's full blocks (the pool
// hands out only the partly filled last one again), decodes the same logits
// as the leader, and neither cache's writes reach the other.
TEST(KvPool, CopiedCachesShareFullBlocksAndDecodeAlike) {
  for (const bool host_kernel : {true, false}) {
    SCOPED_TRACE(host_kernel ? "host decode kernel" : "tensor path");
    PooledGpt2 m(host_kernel);
    auto leader = std::move(m.model->new_cache(20)).value();  // 5 blocks
    const std::vector<std::int32_t> prompt = {5, 9, 13, 17, 21, 25, 29, 33, 37, 41};  // 2 full blocks + 2 tokens
    const StepInput prefill{leader.get(), prompt};
    ASSERT_TRUE(m.model->step(std::span(&prefill, 1)).ok());
    EXPECT_EQ(m.model->kv_pool_counts()->used, 5);
    auto choice = std::move(m.model->new_cache(20)).value();
    EXPECT_EQ(m.model->kv_pool_counts()->used, 10);
    ASSERT_TRUE(m.model->copy_cache(*leader, *choice).ok());
    EXPECT_EQ(choice->length(), 10);
    EXPECT_EQ(m.model->kv_pool_counts()->used, 8) << "the choice's first two blocks went back to the pool";
    // Same next token: same logits (the choice reads the shared blocks).
    const std::int32_t same = 7;
    const StepInput both[2] = {{leader.get(), std::span(&same, 1)}, {choice.get(), std::span(&same, 1)}};
    auto first = m.model->step(both);
    ASSERT_TRUE(first.ok()) << first.error().message;
    EXPECT_EQ(first->at(0), first->at(1));
    // Different tokens at position 11, in the copied last block: each cache keeps its own.
    const std::int32_t a = 3, b = 200, c = 11;
    const StepInput diverge[2] = {{leader.get(), std::span(&a, 1)}, {choice.get(), std::span(&b, 1)}};
    ASSERT_TRUE(m.model->step(diverge).ok());
    const StepInput again[2] = {{leader.get(), std::span(&c, 1)}, {choice.get(), std::span(&c, 1)}};
    auto r = m.model->step(again);
    ASSERT_TRUE(r.ok());
    EXPECT_NE(r->at(0), r->at(1));
    // A fresh cache prefilled with the leader's tokens gets the leader's
    // logits (up to prefill-versus-decode rounding): no block of the leader's
    // was written by the choice.
    auto fresh = std::move(m.model->new_cache(20)).value();
    std::vector<std::int32_t> tokens = prompt;
    tokens.insert(tokens.end(), {7, 3, 11});
    const StepInput all{fresh.get(), tokens};
    auto f = m.model->step(std::span(&all, 1));
    ASSERT_TRUE(f.ok());
    EXPECT_LE(testing::max_abs_diff(f->at(0), r->at(0)), 1e-5f);
    choice.reset();
    leader.reset();
    EXPECT_EQ(m.model->kv_pool_counts()->used, 5) << "shared blocks freed with their last holder";
  }
}

std::vector<std::int32_t> counting(int n, int from) {
  std::vector<std::int32_t> out;
  for (int i = 0; i < n; ++i) out.push_back((from + i * 29) % 257);
  return out;
}

// A sequence's full blocks stay cached after it ends; a later prompt that
// starts with the same tokens gets them (shared, not recomputed) and leaves
// at least its last token to compute; the logits after it are those of a
// cache that computed every token.
TEST(KvPool, ALaterPromptGetsTheCachedBlocksOfItsPrefix) {
  for (const bool host_kernel : {true, false}) {
    SCOPED_TRACE(host_kernel ? "host decode kernel" : "tensor path");
    PooledGpt2 m(host_kernel, 16);
    const std::vector<std::int32_t> system = counting(13, 3);  // 3 full blocks + 1 token
    {
      auto first = std::move(m.model->new_cache_for_prompt(20, system)).value();
      EXPECT_EQ(first->length(), 0) << "nothing is cached yet";
      m.feed(*first, system);
    }
    EXPECT_EQ(m.model->kv_pool_counts()->cached, 3) << "its full blocks outlive it";
    std::vector<std::int32_t> prompt = system;
    prompt.insert(prompt.end(), {200, 201, 202});  // 16 tokens: blocks 0-2 cached, block 3 differs
    auto later = std::move(m.model->new_cache_for_prompt(24, prompt)).value();
    EXPECT_EQ(later->length(), 12);
    EXPECT_EQ(later->capacity(), 24);
    EXPECT_EQ(m.model->kv_pool_counts()->cached, 0);
    EXPECT_EQ(m.model->kv_pool_counts()->used, 6);
    const auto rest = std::span<const std::int32_t>(prompt).subspan(12);
    const std::vector<float> got = m.feed(*later, rest);
    PooledGpt2 cold(host_kernel, 16, /*prefix_cache=*/false);
    auto full = std::move(cold.model->new_cache_for_prompt(24, prompt)).value();
    EXPECT_EQ(full->length(), 0) << "no prefix cache";
    cold.feed(*full, std::span<const std::int32_t>(prompt).first(12));
    EXPECT_LE(testing::max_abs_diff(got, cold.feed(*full, rest)), 1e-5f);
    // A prompt of exactly the cached blocks still computes its last token.
    auto exact = std::move(m.model->new_cache_for_prompt(16, std::span<const std::int32_t>(prompt).first(12))).value();
    EXPECT_EQ(exact->length(), 8);
  }
}

// Blocks a sequence fills while decoding are published too, and a cached
// block is evicted, least recently released first, only when no block is free.
TEST(KvPool, DecodedBlocksArePublishedAndCachedBlocksAreEvictedWhenThePoolIsShort) {
  PooledGpt2 m(true, 6);
  const std::vector<std::int32_t> prompt = counting(6, 1);
  std::vector<std::int32_t> all = prompt;
  {
    auto a = std::move(m.model->new_cache(12)).value();
    m.feed(*a, prompt);
    for (const std::int32_t t : {40, 41, 42}) {  // positions 6-8: block 1 fills
      m.feed(*a, std::span(&t, 1));
      all.push_back(t);
    }
  }
  EXPECT_EQ(m.model->kv_pool_counts()->cached, 2);
  std::vector<std::int32_t> again = all;
  again.push_back(7);
  EXPECT_EQ(std::move(m.model->new_cache_for_prompt(12, again)).value()->length(), 8);
  // Back in the cache; now 5 blocks for another prompt: one cached block is evicted.
  EXPECT_EQ(m.model->kv_pool_counts()->cached, 2);
  auto other = m.model->new_cache(20);
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(m.model->kv_blocks_evicted(), 1);
  EXPECT_EQ(m.model->kv_pool_counts()->cached, 1);
  other = Result<std::unique_ptr<KvCache>>(Error{ErrorCode::kInternal, "gone"});
  EXPECT_EQ(std::move(m.model->new_cache_for_prompt(12, again)).value()->length(), 4)
      << "block 1 (positions 4-7, released last, so least recently) was evicted; block 0 is still found";
}

// A pool made smaller keeps every cache's keys and values (renumbered into
// the blocks that remain) and as many cached blocks as fit; its caches go on
// decoding the logits they would have; larger again, it has room for more.
TEST(KvPool, AResizedPoolKeepsItsCachesAndTheirLogits) {
  for (const bool host_kernel : {true, false}) {
    SCOPED_TRACE(host_kernel ? "host decode kernel" : "tensor path");
    PooledGpt2 m(host_kernel, 16);
    PooledGpt2 reference(host_kernel, 16);
    // Blocks 0-9 taken first, so the caches below hold high ids.
    std::vector<std::unique_ptr<KvCache>> filler;
    for (int i = 0; i < 10; ++i) filler.push_back(std::move(m.model->new_cache(4)).value());
    const std::vector<std::int32_t> a_prompt = counting(9, 2), b_prompt = counting(5, 8);
    auto a = std::move(m.model->new_cache(12)).value();  // blocks 10-12
    auto b = std::move(m.model->new_cache(8)).value();   // blocks 13-14
    auto ra = std::move(reference.model->new_cache(12)).value();
    auto rb = std::move(reference.model->new_cache(8)).value();
    EXPECT_EQ(m.feed(*a, a_prompt), reference.feed(*ra, a_prompt));
    EXPECT_EQ(m.feed(*b, b_prompt), reference.feed(*rb, b_prompt));
    filler.clear();  // 10 free blocks; nothing published in them
    const std::int64_t bytes_before = m.device->memory().own;
    ASSERT_TRUE(m.model->resize_kv_pool(5).ok());
    EXPECT_EQ(m.model->kv_pool_counts()->total, 5);
    EXPECT_EQ(m.model->kv_pool_counts()->used, 5);
    EXPECT_EQ(bytes_before - m.device->memory().own, 11 * m.model->kv_block_bytes()) << "the memory went back";
    for (const std::int32_t t : {11, 12, 13}) {
      const StepInput steps[2] = {{a.get(), std::span(&t, 1)}, {b.get(), std::span(&t, 1)}};
      const StepInput ref[2] = {{ra.get(), std::span(&t, 1)}, {rb.get(), std::span(&t, 1)}};
      auto got = m.model->step(steps);
      auto want = reference.model->step(ref);
      ASSERT_TRUE(got.ok()) << got.error().message;
      EXPECT_EQ(*got, *want);
    }
    EXPECT_FALSE(m.model->new_cache(1).ok()) << "the pool is full";
    ASSERT_TRUE(m.model->resize_kv_pool(8).ok());
    EXPECT_EQ(m.model->kv_pool_counts()->free, 3);
    EXPECT_TRUE(m.model->new_cache(12).ok());
  }
}

TEST(KvPool, AResizeThatCannotHoldTheBlocksInUseOrTheDeviceCannotHoldChangesNothing) {
  PooledGpt2 m(true, 8);
  auto a = std::move(m.model->new_cache(16)).value();  // 4 blocks
  const std::vector<std::int32_t> prompt = counting(10, 4);
  const std::vector<float> before = m.feed(*a, prompt);
  const Status too_small = m.model->resize_kv_pool(3);
  ASSERT_FALSE(too_small.ok());
  EXPECT_EQ(too_small.error().code, ErrorCode::kInvalidRequest);
  EXPECT_NE(too_small.error().message.find("4 blocks in use"), std::string::npos) << too_small.error().message;
  const Status too_big = m.model->resize_kv_pool(1 << 20);  // 2 GiB on a 1 GiB device
  ASSERT_FALSE(too_big.ok());
  EXPECT_EQ(too_big.error().code, ErrorCode::kOutOfMemory);
  EXPECT_EQ(m.model->kv_pool_counts()->total, 8);
  // The cache still holds its prompt: the next token's logits are those of a fresh run.
  PooledGpt2 reference(true, 8);
  auto r = std::move(reference.model->new_cache(16)).value();
  reference.feed(*r, prompt);
  const std::int32_t next = 77;
  EXPECT_EQ(m.feed(*a, std::span(&next, 1)), reference.feed(*r, std::span(&next, 1)));
}

TEST(KvPool, AResizeKeepsTheMostRecentlyCachedBlocksThatFit) {
  PooledGpt2 m(true, 8);
  const std::vector<std::int32_t> first = counting(5, 1), second = counting(5, 100);
  for (const auto* prompt : {&first, &second}) {
    auto c = std::move(m.model->new_cache(8)).value();
    m.feed(*c, *prompt);  // publishes block 0
  }
  EXPECT_EQ(m.model->kv_pool_counts()->cached, 2);
  auto held = std::move(m.model->new_cache(4)).value();
  ASSERT_TRUE(m.model->resize_kv_pool(2).ok());
  EXPECT_EQ(m.model->kv_pool_counts()->cached, 1);
  EXPECT_EQ(m.model->kv_blocks_evicted(), 1);
  auto kept = m.model->new_cache_for_prompt(4, counting(6, 100));
  ASSERT_TRUE(kept.ok()) << kept.error().message;
  EXPECT_EQ((*kept)->length(), 4) << "the second prompt's block was kept";
  kept = Result<std::unique_ptr<KvCache>>(Error{ErrorCode::kInternal, "gone"});
  auto evicted = m.model->new_cache_for_prompt(4, counting(6, 1));
  ASSERT_TRUE(evicted.ok()) << evicted.error().message;
  EXPECT_EQ((*evicted)->length(), 0) << "the first prompt's block was evicted";
}

TEST(KvPool, CachesTakeBlocksAndGiveThemBack) {
  PooledGpt2 m(true, 10);
  EXPECT_EQ(m.model->kv_pool_counts()->total, 10);
  EXPECT_EQ(m.model->kv_block_bytes(), 2LL * 2 * 4 * 32 * 4) << "2 layers x K and V x 4 tokens x 32 wide x 4 bytes";
  auto a = m.model->new_cache(13);  // 4 blocks
  ASSERT_TRUE(a.ok());
  EXPECT_EQ((*a)->capacity(), 16);
  EXPECT_EQ((*a)->bytes(), 4 * m.model->kv_block_bytes());
  auto b = m.model->new_cache(24);  // 6 blocks: the pool is full
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(m.model->kv_pool_counts()->free, 0);
  auto c = m.model->new_cache(1);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.error().code, ErrorCode::kOutOfMemory);
  EXPECT_NE(c.error().message.find("0 of 10 are free"), std::string::npos) << c.error().message;
  a = Result<std::unique_ptr<KvCache>>(Error{ErrorCode::kInternal, "gone"});  // drops the 4-block cache
  EXPECT_EQ(m.model->kv_pool_counts()->free, 4);
  EXPECT_TRUE(m.model->new_cache(16).ok());
}

// grow_cache takes blocks on demand: a cache made for its prompt grows as it
// decodes; when the pool is short the cache is left as it was, and a step
// past its capacity is refused without changing it.
TEST(KvPool, CachesGrowOnDemandAndAShortPoolChangesNothing) {
  PooledGpt2 m(true, 4);
  auto cache = std::move(m.model->new_cache(4)).value();
  const std::vector<std::int32_t> prompt = {1, 2, 3, 4};
  const StepInput in{cache.get(), prompt};
  ASSERT_TRUE(m.model->step(std::span(&in, 1)).ok());
  const std::int32_t next = 5;
  const StepInput decode{cache.get(), std::span(&next, 1)};
  auto over = m.model->step(std::span(&decode, 1));
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.error().code, ErrorCode::kInvalidRequest);
  ASSERT_TRUE(m.model->grow_cache(*cache, 5).ok());
  EXPECT_EQ(cache->capacity(), 8);
  EXPECT_EQ(m.model->kv_pool_counts()->used, 2);
  EXPECT_TRUE(m.model->step(std::span(&decode, 1)).ok());
  EXPECT_TRUE(m.model->grow_cache(*cache, 6).ok()) << "already holds 8";
  EXPECT_EQ(m.model->kv_pool_counts()->used, 2);
  const Status short_pool = m.model->grow_cache(*cache, 17);  // 5 blocks: 3 more than the 2 free
  ASSERT_FALSE(short_pool.ok());
  EXPECT_EQ(short_pool.error().code, ErrorCode::kOutOfMemory);
  EXPECT_EQ(cache->capacity(), 8);
  EXPECT_EQ(m.model->kv_pool_counts()->used, 2);
  EXPECT_EQ(m.model->grow_cache(*cache, 65).error().code, ErrorCode::kInvalidRequest) << "past n_positions";
}

TEST(KvPool, RefusesOptionsOutsideTheirRangesAndCachesOutsideAPoolKeepTheirCapacity) {
  TempDir dir;
  testing::RandomGpt2 spec;
  testing::write_random_gpt2(dir.path(), spec);  // 32 positions
  auto device = std::move(VirtualDevice::create(0, 64LL << 20)).value();
  auto model = load_pooled(dir.path(), device.get(), "float32", true);
  ASSERT_NE(model, nullptr);
  EXPECT_FALSE(model->kv_pool_counts().has_value());
  auto own = std::move(model->new_cache(10)).value();
  EXPECT_EQ(own->capacity(), 10) << "a cache of its own holds exactly what it was made for";
  EXPECT_EQ(model->grow_cache(*own, 12).error().code, ErrorCode::kInvalidRequest);
  EXPECT_EQ(model->use_kv_pool({0, 10}).error().code, ErrorCode::kInvalidRequest);
  EXPECT_EQ(model->use_kv_pool({33, 10}).error().code, ErrorCode::kInvalidRequest);
  EXPECT_EQ(model->use_kv_pool({16, 0}).error().code, ErrorCode::kInvalidRequest);
  const Status too_big = model->use_kv_pool({16, 1 << 20});  // 2 GiB on a 64 MiB device
  ASSERT_FALSE(too_big.ok());
  EXPECT_EQ(too_big.error().code, ErrorCode::kOutOfMemory) << too_big.error().message;
  EXPECT_FALSE(model->kv_pool_counts().has_value());
}

}  // namespace
}  // namespace vg
