// The C++ LLaMA forward pass against tools/llama.py (PyTorch, float64, via
// tools/reference_forward.py) on tiny checkpoints written at test time by
// tools/make_random_llama.py in the Hugging Face layout: multi-head,
// grouped-query, BF16-stored, sharded and tied-embedding variants. Each is
// checked by forward_full, by prefill + one-token decode steps through the KV
// cache, and by batched steps over sequences of different lengths that join
// at different steps; the grouped-query and float64 variants also on the
// tensor path (the batched decode attention that CUDA and bfloat16 run).
// Needs /usr/bin/python3 with torch.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <iterator>

#include "device/device.hpp"
#include "model/model.hpp"
#include "tokenizer/tokenizer.hpp"
#include "model_test_util.hpp"

namespace vg {
namespace {

using testing::expect_sequential_match;
using testing::max_abs_diff;
using testing::TempDir;

constexpr float kFloat32Tolerance = 1e-4f;
constexpr float kFloat64Tolerance = 1e-9f;

/// Prompts of 1, 2, 7 and `longest` tokens below `vocab`.
std::vector<std::vector<std::int32_t>> llama_prompts(int longest, int vocab) {
  std::vector<std::vector<std::int32_t>> prompts = {{5}, {vocab - 1, 3}, {1, 17, 42, 99, 7, 7, 250 % vocab}};
  std::vector<std::int32_t> ids;
  for (int i = 0; i < longest; ++i) ids.push_back((i * 53 + 11) % vocab);
  prompts.push_back(ids);
  return prompts;
}

struct Checked {
  std::unique_ptr<VirtualDevice> device;
  std::unique_ptr<Model> model;
};

Checked load_checked(const std::filesystem::path& dir, const std::string& dtype = "float32", bool host_kernel = true) {
  Checked c{std::move(VirtualDevice::create(0, 1LL << 30)).value(), nullptr};
  auto m = Model::load({dir, c.device.get(), dtype, host_kernel});
  EXPECT_TRUE(m.ok()) << m.error().message;
  if (m.ok()) c.model = std::move(m).value();
  return c;
}

/// All prompts in one batch: prompt i joins at step i % 2 with a prefill of
/// its first (i + 1) tokens (at most all), then feeds one token per step;
/// so steps mix prefill chunks and decode tokens at different cache lengths.
void expect_batched_match(Model& model, const std::vector<std::vector<std::int32_t>>& prompts,
                          const std::vector<std::vector<float>>& reference, float tolerance) {
  const auto v = static_cast<std::size_t>(model.config().vocab_size);
  std::vector<std::unique_ptr<KvCache>> caches;
  std::vector<std::size_t> fed(prompts.size(), 0);
  for (const auto& ids : prompts) caches.push_back(std::move(model.new_cache(static_cast<int>(ids.size()))).value());
  int checked = 0;
  for (int step = 0;; ++step) {
    std::vector<StepInput> inputs;
    std::vector<std::size_t> who;
    for (std::size_t i = 0; i < prompts.size(); ++i) {
      if (step < static_cast<int>(i % 2) || fed[i] == prompts[i].size()) continue;
      const std::size_t n = fed[i] == 0 ? std::min(i + 1, prompts[i].size()) : 1;
      inputs.push_back({caches[i].get(), std::span(prompts[i]).subspan(fed[i], n)});
      who.push_back(i);
    }
    if (inputs.empty()) break;
    auto r = model.step(inputs);
    ASSERT_TRUE(r.ok()) << r.error().message;
    for (std::size_t j = 0; j < who.size(); ++j) {
      const std::size_t i = who[j];
      fed[i] += inputs[j].tokens.size();
      ASSERT_LE(max_abs_diff(r->at(j), std::span(reference[i]).subspan((fed[i] - 1) * v, v)), tolerance)
          << "batched step " << step << ", prompt " << i << ", position " << fed[i] - 1;
      ++checked;
    }
  }
  EXPECT_GT(checked, static_cast<int>(prompts.size()));
}

/// Writes a checkpoint with make_random_llama.py `args` and checks it.
void check_variant(const std::string& args, int positions = 40, int vocab = 300, bool host_kernel = true) {
  TempDir dir;
  ASSERT_EQ(testing::run_python_tool("make_random_llama.py", "--out '" + dir.path().string() + "' --positions " +
                                                                  std::to_string(positions) + " --vocab " +
                                                                  std::to_string(vocab) + " " + args),
            0);
  const auto prompts = llama_prompts(positions, vocab);
  const auto reference = testing::reference_logits(dir.path(), prompts);
  ASSERT_EQ(reference.size(), prompts.size());
  Checked c = load_checked(dir.path(), "float32", host_kernel);
  ASSERT_NE(c.model, nullptr);
  EXPECT_EQ(c.model->config().family, "llama");
  expect_sequential_match(*c.model, prompts, reference, kFloat32Tolerance);
  expect_batched_match(*c.model, prompts, reference, kFloat32Tolerance);
}

TEST(LlamaReference, MultiHeadMatchesPython) { check_variant("--seed 1 --layers 2 --heads 4 --hidden 64"); }

TEST(LlamaReference, GroupedQueryAttentionMatchesPython) {
  // 8 query heads share 2 KV heads; the KV cache holds the 2.
  check_variant("--seed 2 --layers 2 --heads 8 --kv-heads 2 --hidden 64 --rope-theta 500000");
}

TEST(LlamaReference, GroupedQueryAttentionOnTheTensorPathMatchesPython) {
  check_variant("--seed 2 --layers 2 --heads 8 --kv-heads 2 --hidden 64 --rope-theta 500000", 40, 300,
                /*host_kernel=*/false);
}

TEST(LlamaReference, Bf16StoredMatchesPython) {
  // BF16 weights, computed in float32 (the reference reads the same BF16 values).
  check_variant("--seed 3 --layers 2 --heads 4 --kv-heads 2 --hidden 48 --intermediate 96 --dtype BF16");
}

TEST(LlamaReference, ShardedMatchesPython) {
  check_variant("--seed 4 --layers 3 --heads 4 --kv-heads 1 --hidden 32 --intermediate 80 --shards 3");
}

TEST(LlamaReference, TiedEmbeddingsMatchPython) { check_variant("--seed 5 --layers 2 --heads 2 --hidden 32 --tie"); }

TEST(LlamaReference, Float64ModeMatchesPythonTightly) {
  TempDir dir;
  ASSERT_EQ(testing::run_python_tool("make_random_llama.py", "--out '" + dir.path().string() +
                                                                  "' --seed 6 --heads 4 --kv-heads 2 --positions 24"),
            0);
  const auto prompts = llama_prompts(24, 300);
  const auto reference = testing::reference_logits(dir.path(), prompts);
  ASSERT_EQ(reference.size(), prompts.size());
  for (const bool host_kernel : {true, false}) {
    Checked c = load_checked(dir.path(), "float64", host_kernel);
    ASSERT_NE(c.model, nullptr);
    EXPECT_EQ(c.model->config().dtype, "float64");
    expect_sequential_match(*c.model, prompts, reference, kFloat64Tolerance);
    expect_batched_match(*c.model, prompts, reference, kFloat64Tolerance);
  }
}

TEST(LlamaModel, ConfigParametersAndIdOnlyTokenizer) {
  TempDir dir;
  ASSERT_EQ(testing::run_python_tool("make_random_llama.py", "--out '" + dir.path().string() +
                                                                  "' --layers 2 --heads 4 --kv-heads 2 --hidden 64 "
                                                                  "--intermediate 160 --vocab 300 --positions 64"),
            0);
  Checked c = load_checked(dir.path());
  ASSERT_NE(c.model, nullptr);
  const ModelConfig& mc = c.model->config();
  EXPECT_EQ(mc.n_layer, 2);
  EXPECT_EQ(mc.n_head, 4);
  EXPECT_EQ(mc.n_kv_head, 2);
  EXPECT_EQ(mc.head_dim, 16);
  EXPECT_EQ(mc.n_positions, 64);
  EXPECT_EQ(mc.eos_token_id, 2);
  EXPECT_FALSE(mc.tie_word_embeddings);
  // embed + lm_head 2 x 300 x 64; per layer: norms 2 x 64, q and o 2 x 64 x 64,
  // k and v 2 x 32 x 64, gate, up, down 3 x 160 x 64; final norm 64.
  const std::int64_t per_layer = 2 * 64 + 2 * 64 * 64 + 2 * 32 * 64 + 3 * 160 * 64;
  EXPECT_EQ(c.model->parameter_count(), 2 * 300 * 64 + 2 * per_layer + 64);
  // No tokenizer file: prompts are token ids; generated ids read as " <id>".
  const Tokenizer& tok = c.model->tokenizer();
  EXPECT_FALSE(tok.encodes_text());
  EXPECT_EQ(tok.vocab_size(), 300);
  EXPECT_EQ(tok.eos_id(), std::optional<std::int32_t>(2));
  EXPECT_EQ(tok.token_bytes(17), " 17");
  EXPECT_EQ(tok.token_bytes(2), " 2");
  EXPECT_EQ(tok.token_bytes(300), "");
  // KV cache: [n_layer, 2, capacity, n_kv_head, head_dim] float32.
  auto cache = c.model->new_cache(10);
  ASSERT_TRUE(cache.ok());
  EXPECT_EQ((*cache)->bytes(), 2 * 2 * 2 * 10 * 16 * 4);
}

TEST(LlamaModel, MissingTensorIsNamed) {
  TempDir dir;
  ASSERT_EQ(testing::run_python_tool("make_random_llama.py", "--out '" + dir.path().string() + "' --tie"), 0);
  // The same weights read as untied need lm_head.weight, which is not there.
  std::string config;
  {
    std::ifstream in(dir / "config.json");
    config.assign(std::istreambuf_iterator<char>(in), {});
  }
  const std::string tied = "\"tie_word_embeddings\": true";
  ASSERT_NE(config.find(tied), std::string::npos);
  config.replace(config.find(tied), tied.size(), "\"tie_word_embeddings\": false");
  std::ofstream(dir / "config.json") << config;
  auto device = std::move(VirtualDevice::create(0, 1LL << 30)).value();
  auto m = Model::load({dir.path(), device.get()});
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.error().code, ErrorCode::kModelLoad);
  EXPECT_NE(m.error().message.find("lm_head.weight"), std::string::npos) << m.error().message;
}

}  // namespace
}  // namespace vg
