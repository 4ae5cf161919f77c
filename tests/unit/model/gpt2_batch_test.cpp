// Batched Model::step: one step over many sequences (prefill chunks and
// decode tokens at different cache lengths) gives each sequence the logits
// it gets alone; float64 greedy generation is token-for-token the same
// batched and alone; an out-of-memory batched step changes no cache. Each
// runs on the host decode kernel and on the tensor path (the batched decode
// attention of CUDA and bfloat16), and the two paths give the same logits.
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "common/bytes.hpp"
#include "device/device.hpp"
#include "model/host_gemm.hpp"
#include "model/model.hpp"
#include "model/runtime.hpp"
#include "model_test_util.hpp"
#include "parallel_regions.hpp"

namespace vg {
namespace {

using testing::max_abs_diff;
using testing::run_batched;
using testing::Schedule;
using testing::TempDir;

constexpr int kSequences = 16;

std::unique_ptr<VirtualDevice> make_batch_device(std::int64_t capacity = kGiB) {
  return std::move(VirtualDevice::create(0, capacity)).value();
}

std::unique_ptr<Model> load_batched(const std::filesystem::path& dir, Device* device,
                                    const std::string& dtype = "float32", bool host_kernel = true) {
  auto m = Model::load({dir, device, dtype, host_kernel});
  EXPECT_TRUE(m.ok()) << m.error().message;
  return m.ok() ? std::move(m).value() : nullptr;
}

std::int32_t argmax(const std::vector<float>& logits) {
  return static_cast<std::int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

std::vector<std::int32_t> batch_prompt(int n, int salt) {
  std::vector<std::int32_t> ids;
  for (int i = 0; i < n; ++i) ids.push_back((i * 37 + salt * 101 + 5) % 256);
  return ids;
}

/// 16 sequences with prompts of 1..31 tokens joining at steps 0..3; odd ones
/// prefill in two chunks; all then decode `decode` tokens. So most steps mix
/// prefill chunks with decode tokens at different cache lengths.
std::vector<Schedule> mixed_schedules(int decode) {
  std::vector<Schedule> out;
  for (int i = 0; i < kSequences; ++i) {
    Schedule s;
    s.join = i % 4;
    const std::vector<std::int32_t> p = batch_prompt(1 + (i * 13) % 31, i);
    if (i % 2 == 1 && p.size() > 1) {
      const auto half = static_cast<std::ptrdiff_t>(p.size() / 2);
      s.chunks.emplace_back(p.begin(), p.begin() + half);
      s.chunks.emplace_back(p.begin() + half, p.end());
    } else {
      s.chunks.push_back(p);
    }
    for (int j = 0; j < decode; ++j) s.chunks.push_back({(i * 7 + j * 3) % 256});
    out.push_back(std::move(s));
  }
  return out;
}

/// Runs every schedule alone: per sequence, the logits of each chunk.
std::vector<std::vector<std::vector<float>>> run_alone(Model& model, const std::vector<Schedule>& schedules) {
  std::vector<std::vector<std::vector<float>>> out;
  for (const Schedule& s : schedules) {
    auto cache = std::move(model.new_cache(s.tokens())).value();
    out.emplace_back();
    for (const auto& chunk : s.chunks) {
      const StepInput input{cache.get(), chunk};
      auto r = model.step(std::span(&input, 1));
      EXPECT_TRUE(r.ok()) << r.error().message;
      out.back().push_back(r.ok() ? r->at(0) : std::vector<float>());
    }
  }
  return out;
}

TEST(Gpt2Batch, EachSequenceGetsTheLogitsItGetsAlone) {
  TempDir dir;
  testing::RandomGpt2 spec;
  spec.n_positions = 64;
  testing::write_random_gpt2(dir.path(), spec);
  auto device = make_batch_device();
  const auto schedules = mixed_schedules(6);
  std::vector<std::vector<std::vector<float>>> host_batched;
  for (const bool host_kernel : {true, false}) {
    SCOPED_TRACE(host_kernel ? "host decode kernel" : "tensor path");
    auto model = load_batched(dir.path(), device.get(), "float32", host_kernel);
    ASSERT_NE(model, nullptr);
    std::size_t largest = 0;
    const auto batched = run_batched(*model, schedules, &largest);
    const auto alone = run_alone(*model, schedules);
    EXPECT_EQ(largest, static_cast<std::size_t>(kSequences));
    for (std::size_t i = 0; i < schedules.size(); ++i) {
      ASSERT_EQ(batched[i].size(), schedules[i].chunks.size()) << i;
      ASSERT_EQ(alone[i].size(), schedules[i].chunks.size()) << i;
      for (std::size_t c = 0; c < alone[i].size(); ++c) {
        ASSERT_EQ(batched[i][c].size(), 257u);
        EXPECT_LE(max_abs_diff(batched[i][c], alone[i][c]), 1e-4f) << "sequence " << i << ", chunk " << c;
        // On the host path in float32 (host_gemm.hpp's batch-invariant
        // products, the host attention kernel) they are the same bits.
        if (host_kernel && host_cpu_has_avx2_fma()) {
          EXPECT_EQ(batched[i][c], alone[i][c]) << "sequence " << i << ", chunk " << c;
        }
        // The tensor path's batched logits are the host kernel's.
        if (!host_kernel) {
          EXPECT_LE(max_abs_diff(batched[i][c], host_batched[i][c]), 1e-4f) << "sequence " << i << ", chunk " << c;
        }
      }
    }
    if (host_kernel) host_batched = batched;
  }
}

/// A random float32 GPT-2 (2 layers, 4 heads) `n_embd` wide, on its own
/// virtual device; `model` is null when it failed to load.
struct RandomModel {
  TempDir dir;
  std::unique_ptr<VirtualDevice> device = make_batch_device();
  std::unique_ptr<Model> model;
  RandomModel(int n_embd, int n_positions) {
    testing::RandomGpt2 spec;
    spec.n_embd = n_embd;
    spec.n_positions = n_positions;
    testing::write_random_gpt2(dir.path(), spec);
    model = load_batched(dir.path(), device.get());
  }
};

// The host kernels split a product's columns over the compute threads
// (host_linear); each column is summed by one thread in one fixed order, so
// the logits are the same bits on one thread and on two. 256 wide, so that
// the products of a 16-sequence step are large enough to be split.
TEST(Gpt2Batch, HostKernelLogitsAreTheSameBitsOnOneComputeThreadAndOnTwo) {
  if (!host_cpu_has_avx2_fma()) GTEST_SKIP() << "the host products need AVX2 and FMA";
  const RandomModel random(256, 64);
  ASSERT_NE(random.model, nullptr);
  Model* model = random.model.get();
  const auto schedules = mixed_schedules(6);
  const int threads_before = at::get_num_threads();
  set_compute_threads(1);
  EXPECT_EQ(host_kernel_threads(), 1);
  const auto one = run_batched(*model, schedules);
  set_compute_threads(2);
#ifdef VG_HOST_KERNELS_OPENMP  // vg_model built with OpenMP (src/CMakeLists.txt)
  EXPECT_EQ(host_kernel_threads(), 2);
#endif
  const auto two = run_batched(*model, schedules);
  // Layer norms of a few rows run on this thread alone, and give the others back.
  EXPECT_EQ(at::get_num_threads(), 2);
  set_compute_threads(threads_before);
  ASSERT_EQ(one.size(), two.size());
  for (std::size_t i = 0; i < one.size(); ++i) EXPECT_EQ(one[i], two[i]) << "sequence " << i;
}

// Waking a compute thread costs more than a small step's layer norms or
// products take: a decode step of 8 short sequences of a 128-wide model
// enters no OpenMP parallel region on two threads (libtorch's layer norm
// alone used to enter one per norm), while a 96-token prefill, whose
// products are worth splitting, does (so the counter counts).
TEST(Gpt2Batch, ASmallDecodeStepWakesNoComputeThread) {
  if (!host_cpu_has_avx2_fma()) GTEST_SKIP() << "the host products need AVX2 and FMA";
#ifndef VG_HOST_KERNELS_OPENMP
  GTEST_SKIP() << "vg_model is built without OpenMP: its kernels and guards run on one thread";
#endif
  const int positions = 128;
  const RandomModel random(128, positions);
  ASSERT_NE(random.model, nullptr);
  Model* model = random.model.get();
  const int threads_before = at::get_num_threads();
  set_compute_threads(2);
  std::vector<std::unique_ptr<KvCache>> caches;
  std::vector<std::vector<std::int32_t>> next;
  std::vector<StepInput> decode;
  for (int i = 0; i < 8; ++i) {
    caches.push_back(std::move(model->new_cache(positions)).value());
    const std::vector<std::int32_t> p = batch_prompt(5 + i, i);
    const StepInput input{caches.back().get(), p};
    ASSERT_TRUE(model->step(std::span(&input, 1)).ok());
    next.push_back({static_cast<std::int32_t>(i)});
  }
  for (int i = 0; i < 8; ++i) decode.push_back({caches[static_cast<std::size_t>(i)].get(), next[static_cast<std::size_t>(i)]});
  const std::int64_t before_decode = bench::parallel_regions();
  ASSERT_TRUE(model->step(decode).ok());
  const std::int64_t decode_regions = bench::parallel_regions() - before_decode;
  auto long_cache = std::move(model->new_cache(positions)).value();
  const std::vector<std::int32_t> long_prompt = batch_prompt(96, 9);
  const StepInput prefill{long_cache.get(), long_prompt};
  const std::int64_t before_prefill = bench::parallel_regions();
  ASSERT_TRUE(model->step(std::span(&prefill, 1)).ok());
  const std::int64_t prefill_regions = bench::parallel_regions() - before_prefill;
  set_compute_threads(threads_before);
  EXPECT_EQ(decode_regions, 0);
  EXPECT_GT(prefill_regions, 0);
}

/// Greedy generation of `max_new` tokens after `prompt`, step by step.
struct Generation {
  std::vector<std::int32_t> prompt;
  int max_new = 0;
  std::vector<std::int32_t> tokens;
};

void generate_alone(Model& model, Generation& g) {
  auto cache = std::move(model.new_cache(static_cast<int>(g.prompt.size()) + g.max_new)).value();
  std::vector<std::int32_t> next = g.prompt;
  for (int n = 0; n < g.max_new; ++n) {
    const StepInput input{cache.get(), next};
    auto r = model.step(std::span(&input, 1));
    ASSERT_TRUE(r.ok()) << r.error().message;
    g.tokens.push_back(argmax(r->at(0)));
    next = {g.tokens.back()};
  }
}

/// Sequences join one per step, so prefills run next to decodes at
/// different cache lengths.
void generate_batched(Model& model, std::vector<Generation>& gs) {
  std::vector<std::unique_ptr<KvCache>> caches;
  std::vector<std::vector<std::int32_t>> next;
  for (const Generation& g : gs) {
    caches.push_back(std::move(model.new_cache(static_cast<int>(g.prompt.size()) + g.max_new)).value());
    next.push_back(g.prompt);
  }
  for (int step = 0;; ++step) {
    std::vector<StepInput> inputs;
    std::vector<std::size_t> who;
    for (std::size_t i = 0; i < gs.size() && static_cast<int>(i) <= step; ++i) {
      if (static_cast<int>(gs[i].tokens.size()) < gs[i].max_new) {
        inputs.push_back({caches[i].get(), next[i]});
        who.push_back(i);
      }
    }
    if (inputs.empty()) break;
    auto r = model.step(inputs);
    ASSERT_TRUE(r.ok()) << r.error().message;
    for (std::size_t j = 0; j < who.size(); ++j) {
      gs[who[j]].tokens.push_back(argmax(r->at(j)));
      next[who[j]] = {gs[who[j]].tokens.back()};
    }
  }
}

void expect_greedy_batched_equals_alone(const std::filesystem::path& dir, bool host_kernel = true,
                                        const std::string& dtype = "float64") {
  auto device = make_batch_device();
  auto model = load_batched(dir, device.get(), dtype, host_kernel);
  ASSERT_NE(model, nullptr);
  EXPECT_EQ(model->config().dtype, dtype);
  const int positions = model->config().n_positions;
  std::vector<Generation> batched, alone;
  for (int i = 0; i < kSequences; ++i) {
    const int length = 1 + (i * 11) % (positions / 2);
    Generation g{batch_prompt(length, i + 3), std::min(24, positions - length), {}};
    batched.push_back(g);
    alone.push_back(g);
  }
  generate_batched(*model, batched);
  for (std::size_t i = 0; i < alone.size(); ++i) {
    generate_alone(*model, alone[i]);
    ASSERT_EQ(batched[i].tokens.size(), static_cast<std::size_t>(batched[i].max_new)) << i;
    EXPECT_EQ(batched[i].tokens, alone[i].tokens) << "sequence " << i;
  }
}

/// A random 2-layer, 64-wide GPT-2 (4 heads, 64 positions) in `dir`; the
/// tool's exit status.
int write_two_layer_gpt2(const std::filesystem::path& dir) {
  return testing::run_python_tool("make_random_gpt2.py", "--out '" + dir.string() +
                                                             "' --seed 7 --layers 2 --heads 4 --embd 64 "
                                                             "--positions 64 --vocab 257");
}

TEST(Gpt2Batch, Float64GreedyBatchedIsTokenForTokenAlone) {
  TempDir dir;
  ASSERT_EQ(write_two_layer_gpt2(dir.path()), 0);
  expect_greedy_batched_equals_alone(dir.path());
}

// float32 on the host path: batch-invariant by construction (host_gemm.hpp).
TEST(Gpt2Batch, Float32GreedyBatchedIsTokenForTokenAlone) {
  TempDir dir;
  ASSERT_EQ(write_two_layer_gpt2(dir.path()), 0);
  expect_greedy_batched_equals_alone(dir.path(), /*host_kernel=*/true, "float32");
}

TEST(Gpt2Batch, Float32GreedyBatchedIsTokenForTokenAloneOnTinylm) {
  const std::filesystem::path dir = testing::trained_tinylm();
  if (dir.empty()) GTEST_SKIP() << "models/tinylm has no trained model yet";
  expect_greedy_batched_equals_alone(dir, /*host_kernel=*/true, "float32");
}

TEST(Gpt2Batch, Float64GreedyBatchedIsTokenForTokenAloneOnTheTensorPath) {
  TempDir dir;
  ASSERT_EQ(write_two_layer_gpt2(dir.path()), 0);
  expect_greedy_batched_equals_alone(dir.path(), /*host_kernel=*/false);
}

// bfloat16 rounds every product, so this holds only because a batched decode
// step gives each sequence the arithmetic it gets alone (prompts of 1..32
// tokens: short and long ones for libtorch's CPU matrix-product kernels).
TEST(Gpt2Batch, Bfloat16GreedyBatchedIsTokenForTokenAloneOnTheTensorPath) {
  TempDir dir;
  ASSERT_EQ(write_two_layer_gpt2(dir.path()), 0);
  expect_greedy_batched_equals_alone(dir.path(), /*host_kernel=*/false, "bfloat16");
}

// bfloat16 with the host kernels: the products read the bfloat16 weights in
// place through host_gemm.hpp and the decode attention reads the bfloat16
// caches in place through decode_attention (both batch-invariant on any CPU;
// libtorch's bfloat16 products through oneDNN, on CPUs with AVX-512, are not).
TEST(Gpt2Batch, Bfloat16GreedyBatchedIsTokenForTokenAloneWithHostKernels) {
  TempDir dir;
  ASSERT_EQ(write_two_layer_gpt2(dir.path()), 0);
  expect_greedy_batched_equals_alone(dir.path(), /*host_kernel=*/true, "bfloat16");
}

TEST(Gpt2Batch, Float64GreedyBatchedIsTokenForTokenAloneOnTinylm) {
  const std::filesystem::path dir = testing::trained_tinylm();
  if (dir.empty()) GTEST_SKIP() << "models/tinylm has no trained model yet";
  expect_greedy_batched_equals_alone(dir);
}

TEST(Gpt2Batch, Float64KeepsWeightsAndCachesInFloat64) {
  TempDir dir;
  testing::write_random_gpt2(dir.path(), {});
  auto device = make_batch_device();
  auto model = load_batched(dir.path(), device.get(), "float64");
  ASSERT_NE(model, nullptr);
  EXPECT_EQ(model->config().dtype, "float64");
  const std::int64_t params = model->parameter_count() * 8;
  EXPECT_GE(device->memory().used, params);
  EXPECT_LE(device->memory().used, params + 4096);
  auto cache = std::move(model->new_cache(20)).value();
  EXPECT_EQ(cache->bytes(), 2LL * 2 * 20 * 32 * 8);  // layers * {K,V} * tokens * n_embd * 8 bytes
  // Same weights in float32 and float64 give logits within float32 rounding.
  auto model32 = load_batched(dir.path(), device.get());
  ASSERT_NE(model32, nullptr);
  EXPECT_EQ(model32->config().dtype, "float32");
  const std::vector<std::int32_t> ids = batch_prompt(12, 1);
  auto a = model->forward_full(ids);
  auto b = model32->forward_full(ids);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_LE(max_abs_diff(*a, *b), 1e-4f);
}

TEST(Gpt2Batch, UnsupportedDtypeIsALoadError) {
  TempDir dir;
  testing::write_random_gpt2(dir.path(), {});
  auto device = make_batch_device();
  auto r = Model::load({dir.path(), device.get(), "int8"});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::kModelLoad);
  EXPECT_NE(r.error().message.find("'int8'"), std::string::npos) << r.error().message;
  EXPECT_EQ(device->memory().used, 0);
}

TEST(Gpt2Batch, OutOfMemoryInABatchedStepChangesNoCache) {
  TempDir dir;
  testing::RandomGpt2 spec;
  spec.n_positions = 64;
  testing::write_random_gpt2(dir.path(), spec);
  const auto length = [](int i) { return 3 + i % 8; };  // prefills smaller than the decode step
  const auto history = [&](int i) { return batch_prompt(length(i), i); };
  const std::vector<std::int32_t> big = batch_prompt(48, 99);
  // Caches of 16 sequences at lengths 3..10, plus one empty cache for a big prefill.
  struct Run {
    std::unique_ptr<VirtualDevice> device;
    std::unique_ptr<Model> model;
    std::vector<std::unique_ptr<KvCache>> caches;
    std::vector<std::int32_t> next;
    std::vector<StepInput> decode() {
      std::vector<StepInput> inputs;
      for (std::size_t i = 0; i < kSequences; ++i) inputs.push_back({caches[i].get(), std::span(&next[i], 1)});
      return inputs;
    }
  };
  auto start = [&](std::int64_t capacity) {
    Run run{make_batch_device(capacity), nullptr, {}, {}};
    run.model = load_batched(dir.path(), run.device.get());
    for (int i = 0; i <= kSequences; ++i) {
      run.caches.push_back(std::move(run.model->new_cache(64)).value());
      if (i == kSequences) break;
      const auto h = history(i);
      const StepInput input{run.caches.back().get(), h};
      EXPECT_TRUE(run.model->step(std::span(&input, 1)).ok());
      run.next.push_back((i * 5) % 256);
    }
    return run;
  };

  // On a roomy device: the extra bytes a decode step and a decode + big prefill step need.
  Run roomy = start(kGiB);
  roomy.device->reset_peak();
  const std::int64_t before = roomy.device->memory().used;
  auto reference = roomy.model->step(roomy.decode());
  ASSERT_TRUE(reference.ok()) << reference.error().message;
  const std::int64_t decode_bytes = roomy.device->memory().peak - before;
  ASSERT_GT(decode_bytes, 0);

  // A device with room for exactly that decode step, not for the big prefill too.
  Run small = start(before + decode_bytes);
  const std::int64_t used = small.device->memory().used;
  ASSERT_EQ(used, before);
  std::vector<StepInput> with_big = small.decode();
  with_big.push_back({small.caches.back().get(), big});
  auto failed = small.model->step(with_big);
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.error().code, ErrorCode::kOutOfMemory) << failed.error().message;
  for (int i = 0; i < kSequences; ++i) EXPECT_EQ(small.caches[static_cast<std::size_t>(i)]->length(), length(i)) << i;
  EXPECT_EQ(small.caches.back()->length(), 0);
  EXPECT_EQ(small.device->memory().used, used);

  // The decode step alone still fits and gives the roomy device's logits.
  auto retry = small.model->step(small.decode());
  ASSERT_TRUE(retry.ok()) << retry.error().message;
  ASSERT_EQ(retry->size(), reference->size());
  for (std::size_t i = 0; i < retry->size(); ++i) {
    EXPECT_LE(max_abs_diff(retry->at(i), reference->at(i)), 1e-6f) << i;
    EXPECT_EQ(small.caches[i]->length(), length(static_cast<int>(i)) + 1);
  }
}

}  // namespace
}  // namespace vg
