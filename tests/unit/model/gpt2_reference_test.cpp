// The C++ GPT-2 forward pass against tools/reference_forward.py (PyTorch,
// float64) on checkpoints written at test time by tools/make_random_gpt2.py
// (single file or sharded, with or without the 'transformer.' prefix),
// and on models/tinylm when it has been trained. Needs /usr/bin/python3 with
// torch; logits must agree within 1e-4 for every position of every prompt.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>

#include "device/device.hpp"
#include "model/model.hpp"
#include "model_test_util.hpp"

namespace vg {
namespace {

using testing::TempDir;

constexpr float kTolerance = 1e-4f;

std::string json_prompts(const std::vector<std::vector<std::int32_t>>& prompts) {
  std::string s = "[";
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    s += i ? ",[" : "[";
    for (std::size_t j = 0; j < prompts[i].size(); ++j) s += (j ? "," : "") + std::to_string(prompts[i][j]);
    s += "]";
  }
  return s + "]";
}

std::vector<std::vector<std::int32_t>> test_prompts(int n_positions) {
  std::vector<std::vector<std::int32_t>> prompts = {{72}, {256}, {72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100}};
  std::vector<std::int32_t> longest;
  for (int i = 0; i < n_positions; ++i) longest.push_back((i * 53 + 7) % 257);
  prompts.push_back(longest);
  return prompts;
}

float max_abs_diff(std::span<const float> a, std::span<const float> b) {
  float m = a.size() == b.size() ? 0.0f : INFINITY;
  for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

/// Checks forward_full and prefill + one-token decode steps against the
/// Python reference for each prompt.
void expect_matches_reference(const std::filesystem::path& model_dir,
                              const std::vector<std::vector<std::int32_t>>& prompts) {
  TempDir work;
  {
    std::ofstream(work / "prompts.json") << json_prompts(prompts);
  }
  ASSERT_EQ(testing::run_python_tool("reference_forward.py",
                                     "--model '" + model_dir.string() + "' --prompts @'" +
                                         (work / "prompts.json").string() + "' --format text --out '" +
                                         (work / "logits.txt").string() + "'"),
            0);
  const auto reference = testing::read_reference_logits(work / "logits.txt");
  ASSERT_EQ(reference.size(), prompts.size());

  auto device = std::move(VirtualDevice::create(0, 1LL << 30)).value();
  auto loaded = Model::load({model_dir, device.get()});
  ASSERT_TRUE(loaded.ok()) << loaded.error().message;
  Model& model = **loaded;
  const auto v = static_cast<std::size_t>(model.config().vocab_size);
  for (std::size_t p = 0; p < prompts.size(); ++p) {
    const auto& ids = prompts[p];
    ASSERT_EQ(reference[p].size(), ids.size() * v) << "prompt " << p;
    auto full = model.forward_full(ids);
    ASSERT_TRUE(full.ok()) << full.error().message;
    EXPECT_LE(max_abs_diff(*full, reference[p]), kTolerance) << "forward_full, prompt " << p;

    // Prefill half the prompt, then decode the rest one token at a time.
    auto cache = std::move(model.new_cache(static_cast<int>(ids.size()))).value();
    const std::size_t prefill = std::max<std::size_t>(1, ids.size() / 2);
    for (std::size_t start = 0; start < ids.size();) {
      const std::size_t n = start == 0 ? prefill : 1;
      const StepInput input{cache.get(), std::span(ids).subspan(start, n)};
      auto step = model.step(std::span(&input, 1));
      ASSERT_TRUE(step.ok()) << step.error().message;
      start += n;
      ASSERT_LE(max_abs_diff(step->at(0), std::span(reference[p]).subspan((start - 1) * v, v)), kTolerance)
          << "step ending at position " << start - 1 << ", prompt " << p;
    }
  }
}

TEST(Gpt2Reference, RandomModelMatchesPython) {
  TempDir dir;
  ASSERT_EQ(testing::run_python_tool("make_random_gpt2.py", "--out '" + dir.path().string() +
                                                                 "' --seed 11 --layers 2 --heads 4 --embd 64 "
                                                                 "--positions 64 --vocab 257"),
            0);
  expect_matches_reference(dir.path(), test_prompts(64));
}

TEST(Gpt2Reference, HalfPrecisionPrefixedCheckpointMatchesPython) {
  // F16 storage, 'transformer.' names and attn.bias buffers, as older HF checkpoints have.
  TempDir dir;
  ASSERT_EQ(testing::run_python_tool("make_random_gpt2.py", "--out '" + dir.path().string() +
                                                                 "' --seed 5 --layers 3 --heads 2 --embd 48 "
                                                                 "--positions 40 --vocab 257 --dtype F16 "
                                                                 "--prefix transformer. --attn-bias-buffers"),
            0);
  expect_matches_reference(dir.path(), test_prompts(40));
}

TEST(Gpt2Reference, Gpt2VocabularyShardedPrefixedMatchesPython) {
  // GPT-2's own vocabulary size, 'transformer.' names, two shards with an index.
  TempDir dir;
  ASSERT_EQ(testing::run_python_tool("make_random_gpt2.py", "--out '" + dir.path().string() +
                                                                 "' --seed 7 --layers 2 --heads 4 --embd 32 "
                                                                 "--positions 16 --vocab 50257 "
                                                                 "--prefix transformer. --shards 2"),
            0);
  ASSERT_TRUE(std::filesystem::exists(dir / "model.safetensors.index.json"));
  expect_matches_reference(dir.path(), {{50256}, {464, 3290, 318, 257, 1000, 50000, 13}});
}

TEST(Gpt2Reference, TinylmMatchesPython) {
  const std::filesystem::path dir = std::filesystem::path(VG_SOURCE_DIR) / "models" / "tinylm";
  if (!std::filesystem::exists(dir / "config.json") || !std::filesystem::exists(dir / "model.safetensors")) {
    GTEST_SKIP() << dir << " has no trained model yet";
  }
  expect_matches_reference(dir, test_prompts(64));
}

}  // namespace
}  // namespace vg
