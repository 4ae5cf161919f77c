// What a GPU would show of the decode graphs and the static-shape step,
// caught on the CPU: graphs recorded again from another thread (the engine
// thread, after the KV pool moved) make no second workspace, since every
// recording runs on the recorder's one thread; a recording that fails is
// not tried again (decode steps stay eager); an eager static-shape step
// dispatches the ops, with the shapes, of a replayed one (cuBLAS picks its
// kernels by shape, so the two agree only if the shapes do); and a
// grouped-query decode step copies each layer's keys and values once, not
// once per query head.
#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/bytes.hpp"
#include "device/device.hpp"
#include "model/model.hpp"
#include "model/sampler.hpp"
#include "model_test_util.hpp"
#include "op_inputs.hpp"

namespace vg {
namespace {

using testing::TempDir;

constexpr int kGraphPositions = 64;
constexpr int kGraphBlockTokens = 4;

/// The tensor path (CUDA's), with a pool of `blocks` blocks.
std::unique_ptr<Model> load_pooled(const std::filesystem::path& dir, Device* device, std::int64_t blocks) {
  return testing::load_pooled(dir, device, /*host_kernel=*/false, kGraphBlockTokens, blocks);
}

void write_gpt2(const std::filesystem::path& dir) {
  testing::RandomGpt2 spec;
  spec.n_positions = kGraphPositions;
  testing::write_random_gpt2(dir, spec);
}

DecodeGraphOptions emulated_graphs(int max_batch) { return {DecodeGraphKind::kEmulated, max_batch}; }

TEST(DecodeGraphRecording, AgainFromAnotherThreadMakesNoSecondWorkspace) {
  TempDir dir;
  write_gpt2(dir.path());
  auto device = std::move(VirtualDevice::create(0, kGiB)).value();
  auto model = load_pooled(dir.path(), device.get(), 64);
  ASSERT_NE(model, nullptr);
  auto first = model->record_decode_graphs(emulated_graphs(4));
  ASSERT_TRUE(first.ok()) << first.error().message;
  EXPECT_GT(first->outside_bytes, 0) << "the emulated executables, outside the allocator";
  // What the model holds besides its pool, with the graphs recorded.
  const auto beside_pool = [&] {
    return device->memory().own - model->kv_pool_counts()->total * model->kv_block_bytes();
  };
  const std::int64_t before = beside_pool();
  // The engine thread moves the pool: the graphs are recorded again there.
  Status resized = Status::Ok();
  std::thread([&] { resized = model->resize_kv_pool(48); }).join();
  ASSERT_TRUE(resized.ok()) << resized.error().message;
  EXPECT_EQ(model->decode_graph_stats().records, 2);
  EXPECT_EQ(beside_pool(), before) << "a second recording thread would hold a workspace of its own";
  std::thread([&] { resized = model->resize_kv_pool(64); }).join();
  ASSERT_TRUE(resized.ok());
  EXPECT_EQ(beside_pool(), before);
}

TEST(DecodeGraphRecording, ARecordingThatFailsIsNotTriedAgain) {
  TempDir dir;
  write_gpt2(dir.path());
  auto device = std::move(VirtualDevice::create(0, 64 << 20)).value();
  auto model = load_pooled(dir.path(), device.get(), 64);
  ASSERT_NE(model, nullptr);
  ASSERT_TRUE(model->record_decode_graphs(emulated_graphs(4)).ok());
  // Nothing left beside the pool: the pool is allocated again (its own
  // bytes, freed first), the graphs' buffers are not.
  device->hold_test_bytes(device->memory().capacity - device->memory().used);
  ASSERT_TRUE(model->resize_kv_pool(64).ok()) << "the pool moved; only its graphs could not follow";
  EXPECT_EQ(model->decode_graph_stats().graphs, 0);
  EXPECT_EQ(model->decode_graph_stats().records, 1);
  auto again = model->record_decode_graphs(emulated_graphs(4));
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.error().code, ErrorCode::kInternal);
  EXPECT_NE(again.error().message.find("an earlier recording failed"), std::string::npos) << again.error().message;
}

/// The (op, input shapes) a thread dispatches while installed, counted.
std::mutex g_shapes_mutex;
std::map<std::string, int> g_shapes;
std::unique_ptr<at::ObserverContext> note_shapes(const at::RecordFunction& fn) {
  std::string key = fn.name();
  for (const c10::IValue& v : testing::op_inputs(fn)) {
    if (!v.isTensor()) continue;
    key += " [";
    for (const std::int64_t d : v.toTensor().sizes()) key += std::to_string(d) + ",";
    key += "]";
  }
  const std::lock_guard lock(g_shapes_mutex);
  ++g_shapes[key];
  return nullptr;
}

/// The ops of one greedy decode_step of 3 sequences (padded to 4 rows) on `model`.
std::map<std::string, int> decode_step_ops(Model& model) {
  std::vector<std::unique_ptr<KvCache>> caches;
  std::vector<std::int32_t> next;
  SamplingParams greedy;
  greedy.temperature = 0;
  std::vector<Sampler> samplers(3, Sampler(greedy));
  std::vector<SampleSpec> specs;
  for (int i = 0; i < 3; ++i) {
    caches.push_back(std::move(model.new_cache(kGraphPositions)).value());
    std::vector<std::int32_t> prompt(static_cast<std::size_t>(5 + 3 * i), 7 + i);
    const StepInput in{caches.back().get(), prompt};
    EXPECT_TRUE(model.step(std::span(&in, 1)).ok());
    next.push_back(11 + i);
    specs.push_back({&samplers[static_cast<std::size_t>(i)], -1});
  }
  std::vector<StepInput> inputs;
  for (int i = 0; i < 3; ++i)
    inputs.push_back({caches[static_cast<std::size_t>(i)].get(), std::span(&next[static_cast<std::size_t>(i)], 1)});
  {
    const std::lock_guard lock(g_shapes_mutex);
    g_shapes.clear();
  }
  const at::CallbackHandle handle = at::addThreadLocalCallback(
      at::RecordFunctionCallback(note_shapes).needsInputs(true).scopes({at::RecordScope::FUNCTION}));
  const bool ok = model.decode_step(inputs, specs).ok();
  at::removeCallback(handle);
  EXPECT_TRUE(ok);
  const std::lock_guard lock(g_shapes_mutex);
  return g_shapes;
}

/// The ops whose name starts with one of `prefixes` (the products).
std::map<std::string, int> products(const std::map<std::string, int>& ops) {
  std::map<std::string, int> out;
  for (const auto& [key, n] : ops) {
    for (const char* p : {"aten::mm ", "aten::addmm ", "aten::bmm ", "aten::linear ", "aten::matmul "}) {
      if (key.rfind(p, 0) == 0) out[key] = n;
    }
  }
  return out;
}

TEST(DecodeGraphRecording, AnEagerStaticStepRunsTheProductsOfAReplay) {
  TempDir dir;
  write_gpt2(dir.path());
  auto device = std::move(VirtualDevice::create(0, kGiB)).value();
  auto eager = load_pooled(dir.path(), device.get(), 64);
  auto replayed = load_pooled(dir.path(), device.get(), 64);
  ASSERT_NE(eager, nullptr);
  ASSERT_NE(replayed, nullptr);
  ASSERT_TRUE(replayed->record_decode_graphs(emulated_graphs(4)).ok());
  const std::map<std::string, int> a = products(decode_step_ops(*eager));
  const std::map<std::string, int> b = products(decode_step_ops(*replayed));
  EXPECT_EQ(replayed->decode_graph_stats().replays, 1);
  ASSERT_FALSE(a.empty());
  EXPECT_EQ(a, b) << "the same products with the same shapes, the LM head's on every padded row";
}

/// Bytes written by aten::copy_ on the installed thread (the copies a step
/// makes: gathers laid out head-major, and any broadcast a product expands).
std::atomic<std::int64_t> g_copied{0};
std::unique_ptr<at::ObserverContext> count_copy(const at::RecordFunction& fn) {
  if (std::string(fn.name()) != "aten::copy_") return nullptr;
  const auto inputs = testing::op_inputs(fn);
  if (!inputs.empty() && inputs[0].isTensor()) g_copied.fetch_add(inputs[0].toTensor().nbytes());
  return nullptr;
}

/// Bytes copied by one static-shape greedy decode step of 4 sequences of 120
/// tokens on a LLaMA of `heads` query heads over 2 KV heads of 16.
std::int64_t copied_by_a_decode_step(int heads) {
  TempDir dir;
  EXPECT_EQ(testing::run_python_tool("make_random_llama.py",
                                     "--out '" + dir.path().string() + "' --positions 128 --vocab 300 --seed 3 " +
                                         "--layers 2 --kv-heads 2 --heads " + std::to_string(heads) + " --hidden " +
                                         std::to_string(16 * heads)),
            0);
  auto device = std::move(VirtualDevice::create(0, kGiB)).value();
  auto model = load_pooled(dir.path(), device.get(), 128);
  if (model == nullptr) return -1;
  std::vector<std::unique_ptr<KvCache>> caches;
  std::vector<std::int32_t> next(4, 5);
  SamplingParams greedy;
  greedy.temperature = 0;
  std::vector<Sampler> samplers(4, Sampler(greedy));
  std::vector<SampleSpec> specs;
  std::vector<StepInput> inputs;
  for (std::size_t i = 0; i < 4; ++i) {
    caches.push_back(std::move(model->new_cache(128)).value());
    const std::vector<std::int32_t> prompt(120, static_cast<std::int32_t>(3 + i));
    const StepInput in{caches.back().get(), prompt};
    EXPECT_TRUE(model->step(std::span(&in, 1)).ok());
    specs.push_back({&samplers[i], -1});
    inputs.push_back({caches.back().get(), std::span(&next[i], 1)});
  }
  g_copied = 0;
  const at::CallbackHandle handle = at::addThreadLocalCallback(
      at::RecordFunctionCallback(count_copy).needsInputs(true).scopes({at::RecordScope::FUNCTION}));
  const bool ok = model->decode_step(inputs, specs).ok();
  at::removeCallback(handle);
  EXPECT_TRUE(ok);
  return g_copied.load();
}

TEST(StaticDecodeAttention, GroupedQueryHeadsReadEachLayersKeysAndValuesOnce) {
  // Keys padded to 32 blocks of 4 (121 positions): K and V of one layer laid
  // out head-major are 2 x 4 rows x 128 keys x 2 heads x 16 x 4 bytes = 128 KiB.
  constexpr std::int64_t kGathered = 2LL * 4 * 128 * 2 * 16 * 4;
  const std::int64_t one = copied_by_a_decode_step(2);   // one query head per KV head
  const std::int64_t four = copied_by_a_decode_step(8);  // four
  ASSERT_GT(one, 0);
  ASSERT_GT(four, 0);
  EXPECT_GE(one, 2 * kGathered) << "two layers' keys and values, gathered";
  // Four query heads per KV head add only their queries and outputs (a few
  // KiB), not three more copies of every layer's keys and values.
  EXPECT_LT(four - one, kGathered / 4) << one << " B copied with 1 query head per KV head, " << four << " with 4";
}

}  // namespace
}  // namespace vg
