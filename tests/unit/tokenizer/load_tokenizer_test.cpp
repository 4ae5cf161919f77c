// load_tokenizer on small model folders written by the test: which file
// wins, "none found", special-token ids from the JSON files, errors, and a
// SentencePiece-style tokenizer.json whose byte-fallback tokens stream as
// whole UTF-8 characters.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "common/utf8.hpp"
#include "tokenizer/load_tokenizer.hpp"
#include "tokenizer/prompt_encoder.hpp"

namespace vg {
namespace {

namespace fs = std::filesystem;

class Folder : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("vg_tok_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  void write(const std::string& name, const std::string& text) { std::ofstream(dir_ / name) << text; }
  fs::path dir_;
};

/// A SentencePiece-style BPE: Metaspace, byte fallback, <s> and </s>.
std::string metaspace_json() {
  std::string vocab = R"("<unk>": 0, "<s>": 1, "</s>": 2)";
  for (int b = 0; b < 256; ++b) {
    char name[32];
    std::snprintf(name, sizeof name, "\"<0x%02X>\": %d", b, 3 + b);
    vocab += std::string(", ") + name;
  }
  vocab += R"(, "▁": 259, "h": 260, "i": 261, "▁h": 262, "▁hi": 263)";
  return R"({"added_tokens": [{"id": 0, "content": "<unk>", "special": true},
                              {"id": 1, "content": "<s>", "special": true},
                              {"id": 2, "content": "</s>", "special": true}],
            "normalizer": null,
            "pre_tokenizer": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": false},
            "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                                                      {"Sequence": {"id": "A", "type_id": 0}}]},
            "decoder": {"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
                        {"type": "ByteFallback"}, {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
            "model": {"type": "BPE", "unk_token": "<unk>", "byte_fallback": true, "fuse_unk": true,
                      "vocab": {)" + vocab + R"(}, "merges": ["▁ h", "▁h i"]}})";
}

TEST_F(Folder, NoTokenizerFilesIsNotAnError) {
  write("config.json", R"({"model_type": "gpt2", "eos_token_id": 256})");
  auto tok = load_tokenizer(dir_);
  ASSERT_TRUE(tok.ok()) << tok.error().message;
  EXPECT_EQ(*tok, nullptr);
}

TEST_F(Folder, MetaspaceByteFallbackAndSpecialIds) {
  write("tokenizer.json", metaspace_json());
  auto tok = load_tokenizer(dir_);
  ASSERT_TRUE(tok.ok()) << tok.error().message;
  const Tokenizer& t = **tok;
  EXPECT_EQ(t.encode("hi hi"), (std::vector<std::int32_t>{263, 263}));
  // "é" is not in the vocabulary: its two bytes <0xC3> <0xA9>.
  EXPECT_EQ(t.encode("hé"), (std::vector<std::int32_t>{262, 3 + 0xC3, 3 + 0xA9}));
  // Special tokens in the text; "first" prepends ▁ only at the start of the text.
  EXPECT_EQ(t.encode("<s>hi</s>"), (std::vector<std::int32_t>{1, 260, 261, 2}));
  EXPECT_EQ(t.bos_id(), 1);
  EXPECT_EQ(t.eos_id(), std::nullopt);  // no config says which token ends text
  EXPECT_TRUE(t.adds_bos());           // the post-processor puts <s> first
  EXPECT_EQ(t.token_bytes(263), " hi");
  EXPECT_EQ(t.token_bytes(1), "");
  EXPECT_EQ(t.decode(t.encode("hi hé")), "hi hé");  // the prepended space is dropped again
  EXPECT_EQ(t.special_token_id("</s>"), 2);
  EXPECT_EQ(t.special_token_id("hi"), std::nullopt);
}

TEST_F(Folder, EosIdsFromGenerationConfigConfigAndTokenizerConfig) {
  write("tokenizer.json", metaspace_json());
  write("config.json", R"({"bos_token_id": 1, "eos_token_id": 2})");
  write("generation_config.json", R"({"eos_token_id": [263, 2]})");
  write("tokenizer_config.json", R"({"eos_token": {"content": "<unk>"}, "add_bos_token": false})");
  auto tok = load_tokenizer(dir_);
  ASSERT_TRUE(tok.ok()) << tok.error().message;
  const Tokenizer& t = **tok;
  EXPECT_EQ(t.eos_id(), 263);  // generation_config.json first
  EXPECT_TRUE(t.is_eos(263));
  EXPECT_TRUE(t.is_eos(2));
  EXPECT_TRUE(t.is_eos(0));   // tokenizer_config.json eos_token
  EXPECT_FALSE(t.is_eos(1));
  EXPECT_EQ(t.bos_id(), 1);
  EXPECT_FALSE(t.adds_bos());  // tokenizer_config.json says so
}

TEST_F(Folder, ByteFallbackTokensStreamAsWholeCharacters) {
  write("tokenizer.json", metaspace_json());
  auto tok = load_tokenizer(dir_);
  ASSERT_TRUE(tok.ok()) << tok.error().message;
  const std::string text = "hi \xF0\x9F\x98\x80\xE6\x97\xA5 h\xC3\xA9";  // "hi 😀日 hé"
  const std::vector<std::int32_t> ids = (*tok)->encode(text);
  EXPECT_GT(ids.size(), 9u);  // the emoji, 日 and é went through byte fallback
  // What the engine's TextStream does: send the complete UTF-8 prefix only.
  std::string pending, sent;
  for (std::int32_t id : ids) {
    pending += (*tok)->token_bytes(id);
    const std::size_t n = complete_utf8_prefix(pending);
    const std::string chunk = pending.substr(0, n);
    EXPECT_EQ(sanitize_utf8(chunk), chunk) << "a chunk is not whole UTF-8";
    sent += chunk;
    pending.erase(0, n);
  }
  EXPECT_TRUE(pending.empty());
  EXPECT_EQ(sent, " " + text);
  // A lone continuation byte (a model can generate any byte token) becomes U+FFFD.
  EXPECT_EQ(sanitize_utf8((*tok)->token_bytes(3 + 0xA9)), "\xEF\xBF\xBD");
}

TEST_F(Folder, TokenizerJsonWinsAndItsErrorsNameTheFile) {
  write("tokenizer.json", R"({"model": {"type": "WordPiece", "vocab": {}}})");
  write("vocab.json", R"({"a": 0})");
  write("merges.txt", "#version: 0.2\n");
  auto tok = load_tokenizer(dir_);
  ASSERT_FALSE(tok.ok());
  EXPECT_EQ(tok.error().code, ErrorCode::kModelLoad);
  EXPECT_NE(tok.error().message.find("tokenizer.json"), std::string::npos);
  EXPECT_NE(tok.error().message.find("WordPiece"), std::string::npos);
}

TEST_F(Folder, VocabMergesWithoutTokenizerJson) {
  write("vocab.json", R"({"h": 0, "i": 1, "hi": 2, "\u0120": 3, "\u0120hi": 4, "<|endoftext|>": 5})");
  write("merges.txt", "#version: 0.2\nh i\n\u0120 hi\n");
  auto tok = load_tokenizer(dir_);
  ASSERT_TRUE(tok.ok()) << tok.error().message;
  EXPECT_EQ((*tok)->encode("hi hi<|endoftext|>"), (std::vector<std::int32_t>{2, 4, 5}));
  EXPECT_EQ((*tok)->eos_id(), 5);
  EXPECT_EQ((*tok)->token_bytes(4), " hi");
  EXPECT_FALSE((*tok)->adds_bos());
}

TEST_F(Folder, MalformedFilesAreErrors) {
  write("tokenizer.json", "{\"model\": ");
  auto tok = load_tokenizer(dir_);
  ASSERT_FALSE(tok.ok());
  EXPECT_NE(tok.error().message.find("not valid JSON"), std::string::npos);
  fs::remove(dir_ / "tokenizer.json");
  write("tokenizer.model", "not a sentencepiece model");
  tok = load_tokenizer(dir_);
  ASSERT_FALSE(tok.ok());
  EXPECT_NE(tok.error().message.find("tokenizer.model"), std::string::npos);
}

TEST_F(Folder, ChooseTokenizerFallsBackToBytesForTheByteVocabularyElseToIds) {
  auto bytes = choose_tokenizer(dir_, VocabularyFacts{"gpt2", 257, 256});
  ASSERT_TRUE(bytes.ok()) << bytes.error().message;
  EXPECT_EQ((*bytes)->encode("ab"), (std::vector<std::int32_t>{'a', 'b'}));
  auto ids = choose_tokenizer(dir_, VocabularyFacts{"llama", 300, 2});
  ASSERT_TRUE(ids.ok());
  EXPECT_FALSE((*ids)->encodes_text());
  write("tokenizer.json", metaspace_json());
  auto small = choose_tokenizer(dir_, VocabularyFacts{"llama", 100, 2});  // 264 tokens do not fit 100
  ASSERT_FALSE(small.ok());
  EXPECT_NE(small.error().message.find("more than the model's vocab_size 100"), std::string::npos);
}

TEST_F(Folder, PromptEncoderPutsTheTokenizersBosBeforeTextButNotBeforeAChat) {
  write("tokenizer.json", metaspace_json());
  write("tokenizer_config.json", R"({"chat_template": "{{ '<|user|>' }}{{ '<|assistant|>' }}{{ eos_token }}", "eos_token": "</s>"})");
  auto enc = PromptEncoder::load(dir_, VocabularyFacts{"llama", 300, 2}, "", "m");
  ASSERT_TRUE(enc.ok()) << enc.error().message;
  EXPECT_EQ(enc->chat_format(), ChatFormat::kZephyr);  // recognised from tokenizer_config.json
  auto text = enc->encode_text("hi hi");
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(text->ids, (std::vector<std::int32_t>{1, 263, 263}));  // <s> first, as the tokenizer asks
  EXPECT_TRUE(text->stop.empty());
  const ChatMessage hi{"user", "hi"};
  auto chat = enc->encode_chat(std::span(&hi, 1), "");
  ASSERT_TRUE(chat.ok()) << chat.error().message;
  Result<std::string> rendered = render_chat(ChatFormat::kZephyr, std::span(&hi, 1), ChatTokens{"", "</s>"});
  ASSERT_TRUE(rendered.ok());
  EXPECT_EQ(chat->ids, enc->tokenizer().encode(*rendered));  // the template's own text, no BOS added
  EXPECT_EQ(chat->stop, "</s>");
  // A request's chat_template wins; --chat-template (the load argument) wins over the model's.
  auto chatml = enc->encode_chat(std::span(&hi, 1), "chatml");
  ASSERT_TRUE(chatml.ok());
  EXPECT_EQ(chatml->stop, "<|im_end|>");
  auto configured = PromptEncoder::load(dir_, VocabularyFacts{"llama", 300, 2}, "llama-3", "m");
  ASSERT_TRUE(configured.ok());
  EXPECT_EQ(configured->chat_format(), ChatFormat::kLlama3);
}

TEST_F(Folder, PromptEncoderErrorsNameTheModel) {
  auto ids_only = PromptEncoder::load(dir_, VocabularyFacts{"llama", 300, 2}, "", "ids-model");
  ASSERT_TRUE(ids_only.ok());
  auto text = ids_only->encode_text("hi");
  ASSERT_FALSE(text.ok());
  EXPECT_EQ(text.error().code, ErrorCode::kInvalidRequest);
  EXPECT_NE(text.error().message.find("model 'ids-model' has no tokenizer"), std::string::npos);
  const ChatMessage hi{"user", "hi"};
  auto chat = ids_only->encode_chat(std::span(&hi, 1), "");  // no chat format known, none requested
  ASSERT_FALSE(chat.ok());
  EXPECT_EQ(chat.error().code, ErrorCode::kInvalidRequest);
  EXPECT_NE(chat.error().message.find("ids-model"), std::string::npos);
}

}  // namespace
}  // namespace vg
