// Model::decode_step against Model::step: the static-shape decode step of
// the tensor path (batch and key buckets, padding rows, the block table read
// on the device) and the device sampler give the tokens step() and
// Sampler::sample give, with logprobs within 1e-5, for GPT-2 and a
// grouped-query LLaMA, over prefix-shared blocks and across key buckets;
// the host kernel path's decode_step does too. A static-shape step
// dispatches as many ops at batch 2 as at batch 16. Decode graphs (emulated
// here: each replay runs the recorded step again on its buffers) give the
// same tokens, are recorded without touching a cache, recorded again when
// the pool moves, and leave larger batches to eager steps.
#include <ATen/record_function.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <vector>

#include "common/bytes.hpp"
#include "device/device.hpp"
#include "model/decoder.hpp"
#include "model/logprobs.hpp"
#include "model/model.hpp"
#include "model/sampler.hpp"
#include "model_test_util.hpp"

namespace vg {
namespace {

using testing::TempDir;

constexpr int kPositions = 64;
constexpr int kBlockTokens = 4;

std::unique_ptr<Model> load_static(const std::filesystem::path& dir, Device* device, bool host_kernel) {
  return testing::load_pooled(dir, device, host_kernel, kBlockTokens, 256);
}

/// Five prompts: two the same (the second shares the first's full blocks
/// through the prefix cache), lengths 1 to 13.
std::vector<std::vector<std::int32_t>> prompts(int vocab) {
  std::vector<std::vector<std::int32_t>> out;
  for (int len : {9, 1, 13, 6}) {
    std::vector<std::int32_t> p;
    for (int i = 0; i < len; ++i) p.push_back((i * 31 + len * 7 + 3) % vocab);
    out.push_back(p);
  }
  out.push_back(out[0]);
  return out;
}

/// A sequence of one model: its cache and its sampler.
struct Run {
  std::unique_ptr<KvCache> cache;
  std::unique_ptr<Sampler> sampler;
  std::int32_t next = 0;
};

/// Prefills every prompt alone on `model` and picks the first token on the host.
std::vector<Run> prefill(Model& model, const std::vector<std::vector<std::int32_t>>& ps,
                         const std::vector<SamplingParams>& params) {
  std::vector<Run> runs;
  for (std::size_t i = 0; i < ps.size(); ++i) {
    Run r;
    r.cache = std::move(model.new_cache_for_prompt(kPositions, ps[i])).value();
    r.sampler = std::make_unique<Sampler>(params[i], ps[i]);
    const StepInput in{r.cache.get(), std::span(ps[i]).subspan(static_cast<std::size_t>(r.cache->length()))};
    auto logits = model.step(std::span(&in, 1));
    EXPECT_TRUE(logits.ok()) << logits.error().message;
    r.next = r.sampler->sample(logits->at(0));
    runs.push_back(std::move(r));
  }
  return runs;
}

/// Decodes `steps` tokens with decode_step on `fast` and with step() plus
/// Sampler::sample on `reference`, every sequence in every step, and
/// checks they agree token for token, logprobs within 1e-5.
void expect_same_decode(Model& fast, Model& reference, const std::vector<SamplingParams>& params, int steps) {
  const auto ps = prompts(fast.config().vocab_size);
  std::vector<Run> a = prefill(fast, ps, params);
  std::vector<Run> b = prefill(reference, ps, params);
  EXPECT_GT(a[4].cache->length(), 0) << "the repeated prompt found its blocks in the prefix cache";
  for (int step = 0; step < steps; ++step) {
    std::vector<StepInput> fast_in, ref_in;
    std::vector<SampleSpec> specs;
    for (std::size_t i = 0; i < a.size(); ++i) {
      ASSERT_EQ(a[i].next, b[i].next) << "sequence " << i << ", step " << step;
      fast_in.push_back({a[i].cache.get(), std::span(&a[i].next, 1)});
      ref_in.push_back({b[i].cache.get(), std::span(&b[i].next, 1)});
      specs.push_back({a[i].sampler.get(), 2});
    }
    auto picks = fast.decode_step(fast_in, specs);
    ASSERT_TRUE(picks.ok()) << picks.error().message;
    auto logits = reference.step(ref_in);
    ASSERT_TRUE(logits.ok()) << logits.error().message;
    for (std::size_t i = 0; i < a.size(); ++i) {
      const SampledToken& got = picks->at(i);
      b[i].next = b[i].sampler->sample(logits->at(i));
      ASSERT_TRUE(got.logprobs.has_value());
      const LogprobResult want = token_logprobs(logits->at(i), b[i].next, 2);
      EXPECT_NEAR(got.logprobs->logprob, want.logprob, 1e-5) << "sequence " << i << ", step " << step;
      for (std::size_t k = 0; k < want.top.size(); ++k) {
        EXPECT_NEAR(got.logprobs->top[k].logprob, want.top[k].logprob, 1e-5) << i << ", " << step << ", " << k;
      }
      a[i].next = got.id;
    }
  }
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].next, b[i].next) << "sequence " << i;
    EXPECT_EQ(a[i].cache->length(), b[i].cache->length());
  }
}

std::vector<SamplingParams> greedy(std::size_t n) {
  SamplingParams p;
  p.temperature = 0;
  return std::vector<SamplingParams>(n, p);
}

/// Greedy for most, seeded sampling for two (the same picks on the CPU).
std::vector<SamplingParams> mixed(std::size_t n) {
  std::vector<SamplingParams> out = greedy(n);
  out[1].temperature = 0.9;
  out[1].top_p = 0.9;
  out[1].seed = 5;
  out[3].temperature = 1.2;
  out[3].top_k = 10;
  out[3].seed = 6;
  out[3].repetition_penalty = 1.2;
  return out;
}

struct TwoModels {
  TempDir dir;
  std::unique_ptr<VirtualDevice> device = std::move(VirtualDevice::create(0, kGiB)).value();
  std::unique_ptr<Model> fast, reference;
  void load_both(bool host_kernel) {
    fast = load_static(dir.path(), device.get(), host_kernel);
    reference = load_static(dir.path(), device.get(), host_kernel);
  }
  /// A random GPT-2 of kPositions positions, loaded twice.
  void load_gpt2(bool host_kernel) {
    testing::RandomGpt2 spec;
    spec.n_positions = kPositions;
    testing::write_random_gpt2(dir.path(), spec);
    load_both(host_kernel);
  }
};

TEST(StaticDecode, Gpt2DecodeStepMatchesStepAcrossBatchAndKeyBuckets) {
  TwoModels m;
  m.load_gpt2(/*host_kernel=*/false);
  ASSERT_NE(m.fast, nullptr);
  ASSERT_NE(m.reference, nullptr);
  // 5 sequences pad to 8 rows; 13 + 40 tokens cross key buckets of 1 to 16 blocks.
  expect_same_decode(*m.fast, *m.reference, mixed(5), 40);
}

TEST(StaticDecode, GroupedQueryLlamaDecodeStepMatchesStep) {
  TwoModels m;
  ASSERT_EQ(testing::run_python_tool("make_random_llama.py", "--out '" + m.dir.path().string() + "' --positions " +
                                                                 std::to_string(kPositions) +
                                                                 " --vocab 300 --seed 2 --layers 2 --heads 8 "
                                                                 "--kv-heads 2 --hidden 64"),
            0);
  m.load_both(/*host_kernel=*/false);
  ASSERT_NE(m.fast, nullptr);
  ASSERT_NE(m.reference, nullptr);
  expect_same_decode(*m.fast, *m.reference, greedy(5), 30);
}

TEST(StaticDecode, HostKernelDecodeStepMatchesStep) {
  TwoModels m;
  m.load_gpt2(/*host_kernel=*/true);
  ASSERT_NE(m.fast, nullptr);
  expect_same_decode(*m.fast, *m.reference, mixed(5), 20);
}

TEST(StaticDecode, BatchBucketsArePowersOfTwo) {
  EXPECT_EQ(detail::DecoderModel::batch_bucket(1), 1);
  EXPECT_EQ(detail::DecoderModel::batch_bucket(3), 4);
  EXPECT_EQ(detail::DecoderModel::batch_bucket(5), 8);
  EXPECT_EQ(detail::DecoderModel::batch_bucket(64), 64);
  EXPECT_EQ(detail::DecoderModel::batch_bucket(65), 128);
}

TEST(StaticDecode, RefusesPrefillInputsAndLeavesCachesAlone) {
  TwoModels m;
  m.load_gpt2(/*host_kernel=*/false);
  ASSERT_NE(m.fast, nullptr);
  auto cache = std::move(m.fast->new_cache(kPositions)).value();
  const std::vector<std::int32_t> two{1, 2};
  Sampler sampler(greedy(1)[0]);
  const StepInput in{cache.get(), two};
  const SampleSpec spec_one{&sampler, -1};
  auto r = m.fast->decode_step(std::span(&in, 1), std::span(&spec_one, 1));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::kInvalidRequest);
  EXPECT_EQ(cache->length(), 0);
  const StepInput one{cache.get(), std::span(two).first(1)};
  auto none = m.fast->decode_step(std::span(&one, 1), {});
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.error().code, ErrorCode::kInvalidRequest);
  // An empty cache takes the layout of step() (no static step without a
  // first slot to pad with), and still decodes.
  auto first = m.fast->decode_step(std::span(&one, 1), std::span(&spec_one, 1));
  ASSERT_TRUE(first.ok()) << first.error().message;
  EXPECT_EQ(cache->length(), 1);
}

/// ATen ops dispatched on this thread while a counter is installed.
std::atomic<std::int64_t> g_ops{0};
std::unique_ptr<at::ObserverContext> count_op(const at::RecordFunction&) {
  g_ops.fetch_add(1, std::memory_order_relaxed);
  return nullptr;
}

/// The ATen ops one greedy decode_step of `batch` sequences, each holding
/// `length` tokens, dispatches.
std::int64_t ops_per_decode_step(Model& model, int batch, int length) {
  std::vector<std::unique_ptr<KvCache>> caches;
  std::vector<std::vector<std::int32_t>> prompt_ids;
  std::vector<StepInput> decode;
  Sampler sampler(greedy(1)[0]);
  std::vector<Sampler> samplers(static_cast<std::size_t>(batch), sampler);
  std::vector<SampleSpec> specs;
  for (int i = 0; i < batch; ++i) {
    caches.push_back(std::move(model.new_cache(kPositions)).value());
    std::vector<std::int32_t> p;
    for (int t = 0; t < length; ++t) p.push_back((i * 13 + t * 7 + 1) % model.config().vocab_size);
    const StepInput in{caches.back().get(), p};
    EXPECT_TRUE(model.step(std::span(&in, 1)).ok());
    prompt_ids.push_back({p.back()});
  }
  for (int i = 0; i < batch; ++i) {
    decode.push_back({caches[static_cast<std::size_t>(i)].get(), prompt_ids[static_cast<std::size_t>(i)]});
    specs.push_back({&samplers[static_cast<std::size_t>(i)], -1});
  }
  g_ops = 0;
  const at::CallbackHandle handle =
      at::addThreadLocalCallback(at::RecordFunctionCallback(count_op).scopes({at::RecordScope::FUNCTION}));
  const bool ok = model.decode_step(decode, specs).ok();
  at::removeCallback(handle);
  EXPECT_TRUE(ok);
  return g_ops.load();
}

TEST(StaticDecode, OpsPerStepDoNotGrowWithTheBatch) {
  TwoModels m;
  m.load_gpt2(/*host_kernel=*/false);
  ASSERT_NE(m.fast, nullptr);
  const std::int64_t two = ops_per_decode_step(*m.fast, 2, 10);
  const std::int64_t sixteen = ops_per_decode_step(*m.fast, 16, 10);
  const std::int64_t thirteen = ops_per_decode_step(*m.fast, 13, 10);  // 16 rows, 3 of them padding
  EXPECT_GT(two, 0);
  EXPECT_EQ(sixteen, two);
  EXPECT_EQ(thirteen, two);
}

DecodeGraphOptions emulated(int max_batch) { return {DecodeGraphKind::kEmulated, max_batch}; }

TEST(DecodeGraphs, EmulatedGraphsGiveTheTokensOfStep) {
  TwoModels m;
  m.load_gpt2(/*host_kernel=*/false);
  ASSERT_NE(m.fast, nullptr);
  auto recorded = m.fast->record_decode_graphs(emulated(8));
  ASSERT_TRUE(recorded.ok()) << recorded.error().message;
  // Batch buckets 8, 4, 2, 1 x key buckets 16, 8, 4, 2, 1 blocks (a full context is 16).
  EXPECT_EQ(recorded->graphs, 20);
  EXPECT_GT(recorded->bytes, 0) << "the logits buffer and the input buffers";
  expect_same_decode(*m.fast, *m.reference, mixed(5), 40);
  const DecodeGraphStats stats = m.fast->decode_graph_stats();
  EXPECT_EQ(stats.replays, 40);
  EXPECT_EQ(stats.eager, 0);
}

TEST(DecodeGraphs, RecordingLeavesTheCachesAlone) {
  TwoModels m;
  m.load_gpt2(/*host_kernel=*/false);
  ASSERT_NE(m.fast, nullptr);
  const auto ps = prompts(m.fast->config().vocab_size);
  auto b = prefill(*m.reference, ps, greedy(ps.size()));
  // A pool of exactly the blocks the prompts take: every block, block 0
  // (where a recorded run would write) included, holds a cache's keys when
  // the graphs are recorded.
  ASSERT_TRUE(m.fast->use_kv_pool({kBlockTokens, m.reference->kv_pool_counts()->used, true}).ok());
  auto a = prefill(*m.fast, ps, greedy(ps.size()));
  ASSERT_EQ(m.fast->kv_pool_counts()->available(), 0);
  ASSERT_TRUE(m.fast->record_decode_graphs(emulated(8)).ok());
  for (int step = 0; step < 3; ++step) {
    std::vector<StepInput> fast_in, ref_in;
    std::vector<SampleSpec> specs;
    for (std::size_t i = 0; i < a.size(); ++i) {
      fast_in.push_back({a[i].cache.get(), std::span(&a[i].next, 1)});
      ref_in.push_back({b[i].cache.get(), std::span(&b[i].next, 1)});
      specs.push_back({a[i].sampler.get(), 0});
    }
    auto picks = m.fast->decode_step(fast_in, specs);
    ASSERT_TRUE(picks.ok()) << picks.error().message;
    auto logits = m.reference->step(ref_in);
    ASSERT_TRUE(logits.ok());
    for (std::size_t i = 0; i < a.size(); ++i) {
      a[i].next = picks->at(i).id;
      b[i].next = b[i].sampler->sample(logits->at(i));
      ASSERT_EQ(a[i].next, b[i].next) << "sequence " << i << ", step " << step;
      EXPECT_NEAR(picks->at(i).logprobs->logprob, token_logprobs(logits->at(i), b[i].next, 0).logprob, 1e-5)
          << "sequence " << i << ", step " << step;
    }
  }
  EXPECT_EQ(m.fast->decode_graph_stats().replays, 3);
}

TEST(DecodeGraphs, ThePoolMovingRecordsThemAgain) {
  TwoModels m;
  m.load_gpt2(/*host_kernel=*/false);
  ASSERT_NE(m.fast, nullptr);
  ASSERT_TRUE(m.fast->record_decode_graphs(emulated(4)).ok());
  ASSERT_TRUE(m.fast->resize_kv_pool(200).ok());
  DecodeGraphStats stats = m.fast->decode_graph_stats();
  EXPECT_EQ(stats.records, 2);
  EXPECT_EQ(stats.graphs, 15);  // 4, 2, 1 x 16, 8, 4, 2, 1
  // A new pool frees them (they read the old one); the next move of the
  // pool records them again, as asked last.
  ASSERT_TRUE(m.fast->use_kv_pool({kBlockTokens, 100, true}).ok());
  stats = m.fast->decode_graph_stats();
  EXPECT_EQ(stats.graphs, 0);
  EXPECT_EQ(stats.bytes, 0);
  ASSERT_TRUE(m.fast->resize_kv_pool(80).ok());
  EXPECT_EQ(m.fast->decode_graph_stats().records, 3);
  EXPECT_EQ(m.fast->decode_graph_stats().graphs, 15);
  // Dropped, they stay dropped.
  m.fast->drop_decode_graphs();
  ASSERT_TRUE(m.fast->resize_kv_pool(60).ok());
  EXPECT_EQ(m.fast->decode_graph_stats().records, 3);
  EXPECT_EQ(m.fast->decode_graph_stats().graphs, 0);
}

TEST(DecodeGraphs, BatchesPastTheLargestBucketRunEagerly) {
  TwoModels m;
  m.load_gpt2(/*host_kernel=*/false);
  ASSERT_NE(m.fast, nullptr);
  ASSERT_TRUE(m.fast->record_decode_graphs(emulated(2)).ok());
  expect_same_decode(*m.fast, *m.reference, greedy(5), 6);  // 5 rows: bucket 8, no graph
  const DecodeGraphStats stats = m.fast->decode_graph_stats();
  EXPECT_EQ(stats.replays, 0);
  EXPECT_EQ(stats.eager, 6);
}

TEST(DecodeGraphs, RecordingIsRefusedOffTheTensorPathAndForCudaOnACpu) {
  TwoModels m;
  m.load_gpt2(/*host_kernel=*/true);
  ASSERT_NE(m.fast, nullptr);
  auto host = m.fast->record_decode_graphs(emulated(4));
  ASSERT_FALSE(host.ok());
  EXPECT_EQ(host.error().code, ErrorCode::kInvalidRequest);
  auto tensor = load_static(m.dir.path(), m.device.get(), /*host_kernel=*/false);
  ASSERT_NE(tensor, nullptr);
  auto cuda = tensor->record_decode_graphs({DecodeGraphKind::kCuda, 4});
  ASSERT_FALSE(cuda.ok());
  EXPECT_NE(cuda.error().message.find("CUDA"), std::string::npos) << cuda.error().message;
  EXPECT_FALSE(tensor->record_decode_graphs(emulated(0)).ok());
  EXPECT_EQ(tensor->decode_graph_stats().graphs, 0);
}

}  // namespace
}  // namespace vg
