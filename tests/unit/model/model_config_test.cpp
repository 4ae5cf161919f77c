// read_model_config() for the llama family (gpt2 keys are covered in
// gpt2_test.cpp): Hugging Face key names and defaults, eos lists, and clear
// errors for what the forward pass does not implement.
#include <gtest/gtest.h>

#include <fstream>

#include "model/model_config.hpp"
#include "model_test_util.hpp"

namespace vg {
namespace {

using testing::TempDir;

constexpr const char* kLlama = R"("model_type":"llama","num_hidden_layers":2,"num_attention_heads":8,
    "hidden_size":64,"intermediate_size":172,"max_position_embeddings":128,"vocab_size":500)";

Result<ModelConfig> read(const std::string& json) {
  TempDir dir;
  std::ofstream(dir / "config.json") << json;
  return read_model_config(dir / "config.json");
}

TEST(LlamaConfig, KeysAndDefaults) {
  auto c = read(std::string("{") + kLlama + "}");
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->family, "llama");
  EXPECT_EQ(c->n_layer, 2);
  EXPECT_EQ(c->n_head, 8);
  EXPECT_EQ(c->n_kv_head, 8);  // num_key_value_heads absent: multi-head attention
  EXPECT_EQ(c->n_embd, 64);
  EXPECT_EQ(c->head_dim, 8);
  EXPECT_EQ(c->intermediate_size, 172);
  EXPECT_EQ(c->n_positions, 128);
  EXPECT_EQ(c->vocab_size, 500);
  EXPECT_EQ(c->eos_token_id, -1);
  EXPECT_DOUBLE_EQ(c->layer_norm_epsilon, 1e-6);
  EXPECT_DOUBLE_EQ(c->rope_theta, 10000.0);
  EXPECT_FALSE(c->tie_word_embeddings);
  EXPECT_EQ(c->dtype, "float32");
}

TEST(LlamaConfig, ExplicitValuesAsHuggingFaceWritesThem) {
  auto c = read(std::string("{") + kLlama +
                R"(,"num_key_value_heads":2,"head_dim":16,"rms_norm_eps":1e-05,"rope_theta":500000.0,
                   "tie_word_embeddings":true,"eos_token_id":[7,9],"hidden_act":"silu","rope_scaling":null,
                   "attention_bias":false,"mlp_bias":false,"pretraining_tp":1,"torch_dtype":"bfloat16"})");
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->n_kv_head, 2);
  EXPECT_EQ(c->head_dim, 16);
  EXPECT_DOUBLE_EQ(c->layer_norm_epsilon, 1e-5);
  EXPECT_DOUBLE_EQ(c->rope_theta, 500000.0);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_EQ(c->eos_token_id, 7);  // the first of the list
}

TEST(LlamaConfig, ErrorsNameTheKey) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"("num_key_value_heads":3)", "num_attention_heads 8 is not a multiple of num_key_value_heads 3"},
      {R"("rope_scaling":{"type":"linear","factor":2.0})", "'rope_scaling' {\"type\":\"linear\""},
      {R"("hidden_act":"gelu")", "'hidden_act' \"gelu\" is not supported (supported: silu)"},
      {R"("attention_bias":true)", "'attention_bias' true is not supported"},
      {R"("head_dim":7)", "head_dim 7 is odd"},
      {R"("rope_theta":"big")", "'rope_theta' must be a number"},
      {R"("tie_word_embeddings":1)", "'tie_word_embeddings' must be true or false"},
      {R"("eos_token_id":[])", "'eos_token_id' must be an integer or a list"},
      {R"("eos_token_id":500)", "eos_token_id 500 is not below vocab_size 500"},
  };
  for (const auto& [extra, detail] : cases) {
    auto c = read(std::string("{") + kLlama + "," + extra + "}");
    ASSERT_FALSE(c.ok()) << extra;
    EXPECT_EQ(c.error().code, ErrorCode::kModelLoad);
    EXPECT_NE(c.error().message.find(detail), std::string::npos) << extra << " -> " << c.error().message;
    EXPECT_NE(c.error().message.find("config.json"), std::string::npos) << c.error().message;
  }
  auto missing = read(R"({"model_type":"llama","num_hidden_layers":2})");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message.find("missing integer 'num_attention_heads'"), std::string::npos)
      << missing.error().message;
}

TEST(ModelConfig, UnknownModelTypeNamesItAndTheSupportedOnes) {
  auto c = read(R"({"model_type":"mistral","hidden_size":64})");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.error().code, ErrorCode::kModelLoad);
  EXPECT_NE(c.error().message.find("model_type 'mistral' is not supported (supported: gpt2, llama)"),
            std::string::npos)
      << c.error().message;
}

}  // namespace
}  // namespace vg
