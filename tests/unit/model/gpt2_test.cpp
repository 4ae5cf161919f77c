// Tests of Model::load and the GPT-2 forward pass on random C++-written
// checkpoints: load errors, resident bytes, cache behaviour, prefill + decode
// == full recompute, and out-of-memory recovery on a small virtual device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>

#include "common/bytes.hpp"
#include "device/device.hpp"
#include "model/model.hpp"
#include "tokenizer/tokenizer.hpp"
#include "model_test_util.hpp"

namespace vg {
namespace {

using testing::max_abs_diff;
using testing::RandomGpt2;
using testing::TempDir;


std::unique_ptr<VirtualDevice> make_device(std::int64_t capacity = kGiB) {
  return std::move(VirtualDevice::create(0, capacity)).value();
}

Result<std::unique_ptr<Model>> load_gpt2(const std::filesystem::path& dir, Device* device) {
  return Model::load({dir, device});
}

std::vector<std::int32_t> prompt(int n, int salt = 0) {
  std::vector<std::int32_t> ids;
  for (int i = 0; i < n; ++i) ids.push_back((i * 37 + salt * 11 + 5) % 257);
  return ids;
}

class Gpt2Test : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::write_random_gpt2(dir_.path(), spec_);
    device_ = make_device();
    auto m = load_gpt2(dir_.path(), device_.get());
    ASSERT_TRUE(m.ok()) << m.error().message;
    model_ = std::move(m).value();
  }
  /// Logits of every position of `ids`, one decode row per position.
  std::vector<float> full(std::span<const std::int32_t> ids) {
    auto r = model_->forward_full(ids);
    EXPECT_TRUE(r.ok()) << r.error().message;
    return r.ok() ? *r : std::vector<float>();
  }
  std::vector<float> run(KvCache* cache, std::span<const std::int32_t> ids) {
    const StepInput input{cache, ids};
    auto r = model_->step(std::span(&input, 1));
    EXPECT_TRUE(r.ok()) << r.error().message;
    return r.ok() ? r->at(0) : std::vector<float>();
  }

  RandomGpt2 spec_;
  TempDir dir_;
  std::unique_ptr<VirtualDevice> device_;
  std::unique_ptr<Model> model_;
};

TEST_F(Gpt2Test, ConfigAndParameterCount) {
  const ModelConfig& c = model_->config();
  EXPECT_EQ(c.family, "gpt2");
  EXPECT_EQ(c.n_layer, 2);
  EXPECT_EQ(c.n_head, 4);
  EXPECT_EQ(c.n_kv_head, 4);
  EXPECT_EQ(c.n_positions, 32);
  EXPECT_EQ(c.eos_token_id, 256);
  const std::int64_t d = 32, v = 257, p = 32;
  const std::int64_t per_layer = 2 * d + (d * 3 * d + 3 * d) + (d * d + d) + 2 * d + (d * 4 * d + 4 * d) + (4 * d * d + d);
  EXPECT_EQ(model_->parameter_count(), v * d + p * d + 2 * per_layer + 2 * d);
  EXPECT_EQ(model_->tokenizer().vocab_size(), 257);
}

TEST_F(Gpt2Test, ResidentBytesAreParameterBytes) {
  const std::int64_t params = model_->parameter_count() * 4;
  EXPECT_GE(device_->memory().used, params);
  EXPECT_LE(device_->memory().used, params + 4096);
}

TEST_F(Gpt2Test, CacheIsChargedInFullAndReleased) {
  const std::int64_t resident = device_->memory().used;
  {
    auto cache = model_->new_cache(20);
    ASSERT_TRUE(cache.ok());
    EXPECT_EQ((*cache)->capacity(), 20);
    EXPECT_EQ((*cache)->length(), 0);
    EXPECT_EQ((*cache)->bytes(), 2LL * 2 * 20 * 32 * 4);  // layers * {K,V} * tokens * n_embd * 4 bytes
    EXPECT_EQ(device_->memory().used, resident + (*cache)->bytes());
    run(cache->get(), prompt(5));
    EXPECT_EQ(device_->memory().used, resident + (*cache)->bytes());
  }
  EXPECT_EQ(device_->memory().used, resident);
}

TEST_F(Gpt2Test, NewCacheRejectsBadCapacity) {
  for (int capacity : {0, -1, 33}) {
    auto cache = model_->new_cache(capacity);
    ASSERT_FALSE(cache.ok()) << capacity;
    EXPECT_EQ(cache.error().code, ErrorCode::kInvalidRequest);
  }
}

TEST_F(Gpt2Test, PrefillThenDecodeEqualsFullRecompute) {
  const std::vector<std::int32_t> ids = prompt(24);
  const std::vector<float> reference = full(ids);
  const std::size_t v = 257;
  auto cache = std::move(model_->new_cache(32)).value();
  const int prefill = 9;
  std::vector<float> logits = run(cache.get(), std::span(ids).first(prefill));
  EXPECT_LE(max_abs_diff(logits, std::span(reference).subspan((prefill - 1) * v, v)), 1e-5f);
  for (std::size_t i = prefill; i < ids.size(); ++i) {
    logits = run(cache.get(), std::span(ids).subspan(i, 1));
    ASSERT_LE(max_abs_diff(logits, std::span(reference).subspan(i * v, v)), 1e-5f) << "position " << i;
  }
  EXPECT_EQ(cache->length(), 24);
}

TEST_F(Gpt2Test, ChunkedPrefillEqualsFullRecompute) {
  const std::vector<std::int32_t> ids = prompt(30, 3);
  const std::vector<float> reference = full(ids);
  auto cache = std::move(model_->new_cache(30)).value();
  std::vector<float> logits;
  std::size_t start = 0;
  for (std::size_t chunk : {7u, 1u, 12u, 10u}) {
    logits = run(cache.get(), std::span(ids).subspan(start, chunk));
    start += chunk;
    ASSERT_LE(max_abs_diff(logits, std::span(reference).subspan((start - 1) * 257, 257)), 1e-5f) << start;
  }
  EXPECT_EQ(cache->length(), 30);
}

TEST_F(Gpt2Test, SeveralInputsInOneStepMatchSeparateRuns) {
  const auto a = prompt(6, 1), b = prompt(3, 2);
  auto ca = std::move(model_->new_cache(16)).value();
  auto cb = std::move(model_->new_cache(16)).value();
  run(ca.get(), a);
  const std::vector<StepInput> inputs = {{ca.get(), std::span(a).first(1)}, {cb.get(), b}};
  auto together = model_->step(inputs);
  ASSERT_TRUE(together.ok()) << together.error().message;
  ASSERT_EQ(together->size(), 2u);
  std::vector<std::int32_t> a_then = a;
  a_then.push_back(a[0]);
  const auto full_a = full(a_then), full_b = full(b);
  EXPECT_LE(max_abs_diff(together->at(0), std::span(full_a).last(257)), 1e-5f);
  EXPECT_LE(max_abs_diff(together->at(1), std::span(full_b).last(257)), 1e-5f);
  EXPECT_EQ(ca->length(), 7);
  EXPECT_EQ(cb->length(), 3);
}

TEST_F(Gpt2Test, CacheOverflowIsInvalidRequestAndChangesNothing) {
  auto cache = std::move(model_->new_cache(8)).value();
  run(cache.get(), prompt(6));
  const auto too_many = prompt(3);
  const StepInput input{cache.get(), too_many};
  auto r = model_->step(std::span(&input, 1));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::kInvalidRequest);
  EXPECT_NE(r.error().message.find("overflow"), std::string::npos) << r.error().message;
  EXPECT_EQ(cache->length(), 6);
  run(cache.get(), prompt(2));
  EXPECT_EQ(cache->length(), 8);
}

TEST_F(Gpt2Test, RejectsBadStepInputs) {
  auto cache = std::move(model_->new_cache(8)).value();
  const std::vector<std::int32_t> bad_id = {1, 257}, empty, ok = {1};
  TempDir other_dir;
  testing::write_random_gpt2(other_dir.path(), spec_);
  auto other = std::move(load_gpt2(other_dir.path(), device_.get())).value();
  auto foreign = std::move(other->new_cache(8)).value();
  const std::vector<std::vector<StepInput>> cases = {
      {{cache.get(), bad_id}},
      {{cache.get(), empty}},
      {{nullptr, ok}},
      {{foreign.get(), ok}},
      {{cache.get(), ok}, {cache.get(), ok}},
  };
  for (const auto& inputs : cases) {
    auto r = model_->step(inputs);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().code, ErrorCode::kInvalidRequest) << r.error().message;
  }
  EXPECT_EQ(cache->length(), 0);
  auto too_long = model_->forward_full(prompt(33));
  ASSERT_FALSE(too_long.ok());
  EXPECT_EQ(too_long.error().code, ErrorCode::kInvalidRequest);
}

TEST_F(Gpt2Test, StepOutOfMemoryLeavesCachesAndRecovers) {
  // A device with room for the weights, two caches and little else.
  const std::int64_t resident = device_->memory().used;
  auto small = make_device(resident + 2 * (2LL * 2 * 32 * 32 * 4) + 20'000);
  auto m = load_gpt2(dir_.path(), small.get());
  ASSERT_TRUE(m.ok()) << m.error().message;
  auto model = std::move(m).value();
  const std::int64_t small_resident = small->memory().used;
  EXPECT_EQ(small_resident, resident);
  auto ca = std::move(model->new_cache(32)).value();
  auto cb = std::move(model->new_cache(32)).value();
  const std::int64_t with_caches = small->memory().used;
  const auto one = prompt(1, 4), many = prompt(32, 5);
  // Input 0 succeeds on its own; input 1's 32-token prefill does not fit.
  const std::vector<StepInput> inputs = {{ca.get(), one}, {cb.get(), many}};
  auto r = model->step(inputs);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::kOutOfMemory) << r.error().message;
  EXPECT_NE(r.error().message.find("virt:0"), std::string::npos) << r.error().message;
  EXPECT_EQ(ca->length(), 0);
  EXPECT_EQ(cb->length(), 0);
  EXPECT_EQ(small->memory().used, with_caches);
  // Smaller steps still fit and give the same logits as the roomy model.
  const std::vector<StepInput> retry = {{ca.get(), one}};
  auto ok = model->step(retry);
  ASSERT_TRUE(ok.ok()) << ok.error().message;
  EXPECT_LE(max_abs_diff(ok->at(0), full(one)), 1e-5f);
  EXPECT_EQ(ca->length(), 1);
}

TEST_F(Gpt2Test, NewCacheOutOfMemory) {
  const std::int64_t resident = device_->memory().used;
  auto small = make_device(resident + 1000);
  auto model = std::move(load_gpt2(dir_.path(), small.get())).value();
  auto cache = model->new_cache(32);
  ASSERT_FALSE(cache.ok());
  EXPECT_EQ(cache.error().code, ErrorCode::kOutOfMemory);
  EXPECT_EQ(small->memory().used, resident);
}

TEST_F(Gpt2Test, WeightsThatDoNotFitAreOutOfMemoryNotABadCheckpoint) {
  auto tiny = make_device(100'000);
  auto r = load_gpt2(dir_.path(), tiny.get());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::kOutOfMemory);
  EXPECT_NE(r.error().message.find("out of memory"), std::string::npos) << r.error().message;
  EXPECT_EQ(tiny->memory().used, 0);
}

// ---- load errors ------------------------------------------------------------

Error gpt2_load_error(const RandomGpt2& spec, const std::string& edit_config = "") {
  TempDir dir;
  testing::write_random_gpt2(dir.path(), spec);
  if (!edit_config.empty()) std::ofstream(dir / "config.json") << edit_config;
  auto device = make_device();
  auto r = load_gpt2(dir.path(), device.get());
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(device->memory().used, 0);
  if (r.ok()) return {};
  return std::move(r).error();
}

TEST(Gpt2Load, UnknownModelTypeNamesItAndTheSupportedOnes) {
  RandomGpt2 spec;
  spec.model_type = "mamba";
  const Error e = gpt2_load_error(spec);
  EXPECT_EQ(e.code, ErrorCode::kModelLoad);
  EXPECT_NE(e.message.find("model_type 'mamba' is not supported"), std::string::npos) << e.message;
  EXPECT_NE(e.message.find("(supported: gpt2, llama)"), std::string::npos) << e.message;
  EXPECT_NE(e.message.find("config.json"), std::string::npos) << e.message;
}

TEST(Gpt2Load, MissingTensorNamesFileAndTensor) {
  RandomGpt2 spec;
  spec.skip = {"h.1.mlp.c_fc.bias"};
  const Error e = gpt2_load_error(spec);
  EXPECT_EQ(e.code, ErrorCode::kModelLoad);
  EXPECT_NE(e.message.find("model.safetensors"), std::string::npos) << e.message;
  EXPECT_NE(e.message.find("'h.1.mlp.c_fc.bias'"), std::string::npos) << e.message;
}

TEST(Gpt2Load, WrongShapeNamesTensor) {
  RandomGpt2 spec;
  const Error e = gpt2_load_error(spec, R"({"model_type":"gpt2","n_layer":2,"n_head":4,"n_embd":32,
      "n_positions":16,"vocab_size":257})");  // wpe has 32 rows in the file
  EXPECT_EQ(e.code, ErrorCode::kModelLoad);
  EXPECT_NE(e.message.find("'wpe.weight'"), std::string::npos) << e.message;
  EXPECT_NE(e.message.find("[32, 32], expected [16, 32]"), std::string::npos) << e.message;
}

TEST(Gpt2Load, ConfigErrorsNameTheKey) {
  RandomGpt2 spec;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"model_type":"gpt2","n_head":4,"n_embd":32,"n_positions":32,"vocab_size":257})", "'n_layer'"},
      {R"({"model_type":"gpt2","n_layer":2,"n_head":4,"n_embd":32,"vocab_size":257})", "'n_ctx'"},
      {R"({"model_type":"gpt2","n_layer":2,"n_head":5,"n_embd":32,"n_positions":32,"vocab_size":257})", "n_head 5"},
      {R"({"model_type":"gpt2","n_layer":"2","n_head":4,"n_embd":32,"n_positions":32,"vocab_size":257})",
       "'n_layer' must be an integer"},
      {R"({"n_layer":2})", "'model_type'"},
      {R"({"model_type":"gpt2","n_layer":2,"n_head":4,"n_embd":32,"n_positions":32,"vocab_size":257,
          "activation_function":"relu"})", "'activation_function' \"relu\" is not supported"},
      {R"({"model_type": "gpt2",)", "not valid JSON"},
  };
  for (const auto& [config, detail] : cases) {
    const Error e = gpt2_load_error(spec, config);
    EXPECT_EQ(e.code, ErrorCode::kModelLoad);
    EXPECT_NE(e.message.find(detail), std::string::npos) << e.message;
  }
}

TEST(Gpt2Load, OtherVocabularyTakesTokenIdsOnly) {
  // Without a tokenizer vramgate can read, the model is served through token ids.
  TempDir dir;
  RandomGpt2 spec;
  spec.vocab_size = 300;
  testing::write_random_gpt2(dir.path(), spec);
  auto device = make_device();
  auto r = load_gpt2(dir.path(), device.get());
  ASSERT_TRUE(r.ok()) << r.error().message;
  const Tokenizer& tok = (*r)->tokenizer();
  EXPECT_FALSE(tok.encodes_text());
  EXPECT_EQ(tok.vocab_size(), 300);
  EXPECT_EQ(tok.eos_id(), std::optional<std::int32_t>(299));
  EXPECT_EQ(tok.token_bytes(257), " 257");
  EXPECT_TRUE(ByteTokenizer().encodes_text());
}

TEST(Gpt2Load, MissingFolderAndNoDevice) {
  TempDir dir;
  auto device = make_device();
  auto r = load_gpt2(dir / "absent", device.get());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::kModelLoad);
  EXPECT_NE(r.error().message.find("config.json"), std::string::npos);
  auto no_device = load_gpt2(dir.path(), nullptr);
  ASSERT_FALSE(no_device.ok());
  EXPECT_EQ(no_device.error().code, ErrorCode::kModelLoad);
}

}  // namespace
}  // namespace vg
