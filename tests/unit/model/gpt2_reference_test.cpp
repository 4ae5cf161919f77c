// The C++ GPT-2 forward pass against tools/reference_forward.py (PyTorch,
// float64) on checkpoints written at test time by tools/make_random_gpt2.py
// (single file or sharded, with or without the 'transformer.' prefix),
// and on models/tinylm when it has been trained. Needs /usr/bin/python3 with
// torch; logits must agree within 1e-4 for every position of every prompt.
#include <gtest/gtest.h>

#include "device/device.hpp"
#include "model/model.hpp"
#include "model_test_util.hpp"

namespace vg {
namespace {

using testing::TempDir;

constexpr float kTolerance = 1e-4f;

std::vector<std::vector<std::int32_t>> test_prompts(int n_positions) {
  std::vector<std::vector<std::int32_t>> prompts = {{72}, {256}, {72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100}};
  std::vector<std::int32_t> longest;
  for (int i = 0; i < n_positions; ++i) longest.push_back((i * 53 + 7) % 257);
  prompts.push_back(longest);
  return prompts;
}

/// Checks forward_full and prefill + one-token decode steps against the
/// Python reference for each prompt.
void expect_matches_reference(const std::filesystem::path& model_dir,
                              const std::vector<std::vector<std::int32_t>>& prompts) {
  const auto reference = testing::reference_logits(model_dir, prompts);
  ASSERT_EQ(reference.size(), prompts.size());
  auto device = std::move(VirtualDevice::create(0, 1LL << 30)).value();
  auto loaded = Model::load({model_dir, device.get()});
  ASSERT_TRUE(loaded.ok()) << loaded.error().message;
  testing::expect_sequential_match(**loaded, prompts, reference, kTolerance);
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
  const std::filesystem::path dir = testing::trained_tinylm();
  if (dir.empty()) GTEST_SKIP() << "models/tinylm has no trained model yet";
  expect_matches_reference(dir, test_prompts(64));
}

}  // namespace
}  // namespace vg
