// A KV block pool that is resized when memory is short (detail::KvPool::
// resize): every copy between its storage and host memory is one layer's K
// or V of a run of blocks, contiguous on both sides (on a GPU a copy of a
// strided slice makes a device temporary as large as the blocks kept); a
// failure while the new storage is filled leaves the old one with its
// contents; a storage that cannot even be allocated again is reported as
// lost, its blocks no longer found in the prefix cache, until a resize
// allocates a new one.
#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/decoder.hpp"
#include "model/model.hpp"
#include "op_inputs.hpp"

namespace vg {
namespace {

using detail::KvPool;

constexpr std::int64_t kLayers = 3;
constexpr std::int64_t kResizeBlockTokens = 4;
constexpr std::int64_t kHeads = 2;
constexpr std::int64_t kHeadDim = 3;

/// A pool's storage of `slots` positions (KvPool::resize's `allocate`).
at::Tensor storage(std::int64_t slots) { return at::zeros({kLayers, 2, slots, kHeads, kHeadDim}); }

/// A pool of `blocks` blocks whose every value is distinct.
std::unique_ptr<KvPool> numbered_pool(std::int64_t blocks) {
  at::Tensor s = at::arange(kLayers * 2 * blocks * kResizeBlockTokens * kHeads * kHeadDim, at::kFloat)
                     .view({kLayers, 2, blocks * kResizeBlockTokens, kHeads, kHeadDim});
  return std::make_unique<KvPool>(s, kResizeBlockTokens, /*shared=*/true, /*prefix_cache=*/true);
}

/// Block `b` of every layer's K and V.
at::Tensor block(const at::Tensor& s, std::int64_t b) {
  return s.narrow(2, b * kResizeBlockTokens, kResizeBlockTokens).clone();
}

/// Copies the RecordFunction observer saw whose source or destination was
/// not contiguous, and copies seen.
std::atomic<int> g_strided{0};
std::atomic<int> g_copies{0};
std::unique_ptr<at::ObserverContext> on_copy(const at::RecordFunction& fn) {
  if (std::string(fn.name()) != "aten::copy_") return nullptr;
  g_copies.fetch_add(1);
  const auto inputs = testing::op_inputs(fn);
  if (inputs.size() >= 2 && inputs[0].isTensor() && inputs[1].isTensor() &&
      (!inputs[0].toTensor().is_contiguous() || !inputs[1].toTensor().is_contiguous())) {
    g_strided.fetch_add(1);
  }
  return nullptr;
}

TEST(KvPoolResize, CopiesOnlyContiguousRunsBetweenTheStorageAndTheHost) {
  auto pool = numbered_pool(8);
  std::vector<std::int32_t> held;
  ASSERT_TRUE(pool->take(6, held));
  pool->release(std::span(held).subspan(1, 2));  // blocks 1 and 2 free: the kept ones are in two runs
  const at::Tensor before = pool->storage().clone();
  g_strided = 0;
  g_copies = 0;
  const at::CallbackHandle handle = at::addThreadLocalCallback(
      at::RecordFunctionCallback(on_copy).needsInputs(true).scopes({at::RecordScope::FUNCTION}));
  const Status st = pool->resize(5, storage);
  at::removeCallback(handle);
  ASSERT_TRUE(st.ok()) << st.error().message;
  // Out: two runs (block 0; blocks 3-5); in: one (new blocks 0-3); per layer and K/V.
  EXPECT_EQ(g_copies.load(), 3 * kLayers * 2);
  EXPECT_EQ(g_strided.load(), 0) << "a strided copy makes a device temporary on a GPU";
  const at::Tensor after = pool->storage();
  EXPECT_TRUE(at::equal(block(after, 0), block(before, 0)));
  for (std::int64_t b = 1; b < 4; ++b) EXPECT_TRUE(at::equal(block(after, b), block(before, b + 2))) << b;
}

TEST(KvPoolResize, AFailureWhileFillingTheNewStorageKeepsTheOldOneAndItsContents) {
  auto pool = numbered_pool(8);
  std::vector<std::int32_t> held;
  ASSERT_TRUE(pool->take(3, held));
  const at::Tensor before = pool->storage().clone();
  int calls = 0;
  // The first storage has the wrong shape: the copy into it fails after the
  // old storage was freed (as a copy that runs out of memory would).
  const auto allocate = [&](std::int64_t slots) {
    return ++calls == 1 ? at::zeros({kLayers, 2, slots, kHeads, kHeadDim + 1}) : storage(slots);
  };
  EXPECT_ANY_THROW((void)pool->resize(6, allocate));
  EXPECT_EQ(calls, 2) << "the old size allocated again";
  EXPECT_FALSE(pool->lost());
  EXPECT_EQ(pool->counts().total, 8);
  EXPECT_EQ(pool->counts().used, 3);
  EXPECT_EQ(pool->storage().sizes(), before.sizes());
  for (std::int64_t b = 0; b < 3; ++b) EXPECT_TRUE(at::equal(block(pool->storage(), b), block(before, b))) << b;
}

TEST(KvPoolResize, AStorageThatCannotBeAllocatedAgainIsLostUntilTheNextResize) {
  auto pool = numbered_pool(8);
  std::vector<std::int32_t> first;
  ASSERT_TRUE(pool->take(1, first));
  const std::vector<std::int32_t> tokens{1, 2, 3, 4};
  const std::uint64_t key = pool->publish(first[0], kRootKey, tokens);
  (void)key;
  pool->release(first);  // cached: found by a later prompt
  std::vector<std::int32_t> held;
  ASSERT_TRUE(pool->take(2, held));
  EXPECT_EQ(pool->counts().cached, 1);
  const auto fail = [](std::int64_t) -> at::Tensor { throw std::runtime_error("out of memory"); };
  EXPECT_ANY_THROW((void)pool->resize(6, fail));
  EXPECT_TRUE(pool->lost());
  EXPECT_TRUE(pool->counts().lost);
  EXPECT_FALSE(pool->storage().defined());
  EXPECT_EQ(pool->counts().cached, 0) << "nothing it held can be found again";
  EXPECT_FALSE(pool->find(kRootKey, tokens).has_value());
  EXPECT_EQ(pool->counts().used, 2) << "its holders release their blocks themselves";
  pool->release(held);
  ASSERT_TRUE(pool->resize(6, storage).ok());
  EXPECT_FALSE(pool->lost());
  EXPECT_EQ(pool->counts().total, 6);
  EXPECT_EQ(pool->storage().size(2), 6 * kResizeBlockTokens);
}

}  // namespace
}  // namespace vg
