// vramgate's tokenizers against references written by others, on the corpus
// of tricky strings in corpus.json: js-tiktoken (OpenAI's GPT-2 encoding),
// @huggingface/tokenizers (tokenizer.json: byte-level, LLaMA-3 Split,
// Metaspace + byte fallback) and python3-sentencepiece. The reference
// vocabularies and expected ids are made at test time by
// tools/tokenizer/make_references.sh (the ctest fixture tokenizer_refs).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <boost/json.hpp>

#include "common/utf8.hpp"
#include "tokenizer/load_tokenizer.hpp"
#include "tokenizer/tokenizers.hpp"

namespace vg {
namespace {

namespace fs = std::filesystem;

const fs::path kRefs = VG_TOKENIZER_REFS_DIR;

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<std::string> corpus() {
  std::vector<std::string> out;
  const boost::json::value doc = boost::json::parse(slurp(fs::path(VG_SOURCE_DIR) / "tests/unit/tokenizer/corpus.json"));
  for (const auto& v : doc.as_array()) out.emplace_back(v.as_string());
  return out;
}

struct Expected {
  std::vector<std::vector<std::int32_t>> ids;
  std::vector<std::string> decoded;
};

Expected expected(const fs::path& file) {
  Expected e;
  const boost::json::value parsed = boost::json::parse(slurp(file));
  const boost::json::object& doc = parsed.as_object();
  for (const auto& row : doc.at("ids").as_array()) {
    std::vector<std::int32_t> ids;
    for (const auto& id : row.as_array()) ids.push_back(static_cast<std::int32_t>(id.to_number<std::int64_t>()));
    e.ids.push_back(std::move(ids));
  }
  for (const auto& d : doc.at("decoded").as_array()) e.decoded.emplace_back(d.as_string());
  return e;
}

/// Skips (node missing) or fails (references never made) unless `file` exists.
#define REQUIRE_REFERENCE(file, needs_node)                                                                \
  do {                                                                                                     \
    if ((needs_node) && fs::exists(kRefs / "SKIP-node")) GTEST_SKIP() << slurp(kRefs / "SKIP-node");       \
    ASSERT_TRUE(fs::exists(file)) << (file) << " is missing: run the ctest fixture tokenizer_references, " \
                                  << "or tools/tokenizer/make_references.sh " << kRefs;                    \
  } while (0)

/// Every corpus string encodes to the reference ids; decoding those ids
/// gives the reference's decoded text (less special tokens).
void expect_same(const Tokenizer& tok, const Expected& ref, const std::string& what) {
  const std::vector<std::string> texts = corpus();
  ASSERT_EQ(ref.ids.size(), texts.size());
  for (std::size_t i = 0; i < texts.size(); ++i) {
    EXPECT_EQ(tok.encode(texts[i]), ref.ids[i]) << what << ": corpus[" << i << "] = '" << texts[i] << "'";
    // Special tokens decode to no text in vramgate (the references spell them out).
    std::string want = ref.decoded[i];
    const bool special_eot = tok.special_token_id("<|endoftext|>").has_value();
    for (std::size_t p; special_eot && (p = want.find("<|endoftext|>")) != std::string::npos;) want.erase(p, 13);
    EXPECT_EQ(sanitize_utf8(tok.decode(ref.ids[i])), want) << what << ": decoding corpus[" << i << "]";
  }
}

/// decode(encode(text)) == text for every corpus string.
void expect_round_trip(const Tokenizer& tok, const std::string& what) {
  for (const std::string& text : corpus()) {
    const std::vector<std::int32_t> ids = tok.encode(text);
    std::string bytes;
    for (std::int32_t id : ids) bytes += tok.token_bytes(id);
    if (text.find("<|endoftext|>") != std::string::npos) continue;  // special tokens decode to nothing
    EXPECT_EQ(tok.decode(ids), text) << what;
    EXPECT_EQ(bytes, text) << what << ": token_bytes concatenated";
  }
}

TEST(TokenizerReference, Gpt2VocabMergesEqualsJsTiktoken) {
  REQUIRE_REFERENCE(kRefs / "gpt2/expected_tiktoken.json", true);
  auto tok = tok::load_vocab_merges(kRefs / "gpt2/vocab.json", kRefs / "gpt2/merges.txt", {});
  ASSERT_TRUE(tok.ok()) << tok.error().message;
  expect_same(**tok, expected(kRefs / "gpt2/expected_tiktoken.json"), "gpt2 vocab.json+merges.txt vs js-tiktoken");
  expect_round_trip(**tok, "gpt2 vocab.json+merges.txt");
  EXPECT_EQ((*tok)->vocab_size(), 50257);
  EXPECT_EQ((*tok)->eos_id(), 50256);
}

TEST(TokenizerReference, Gpt2TokenizerJsonEqualsJsTiktokenAndHuggingFace) {
  REQUIRE_REFERENCE(kRefs / "gpt2/expected_hf.json", true);
  // The folder also has vocab.json + merges.txt: tokenizer.json wins.
  auto tok = load_tokenizer(kRefs / "gpt2");
  ASSERT_TRUE(tok.ok()) << tok.error().message;
  ASSERT_NE(*tok, nullptr);
  expect_same(**tok, expected(kRefs / "gpt2/expected_tiktoken.json"), "gpt2 tokenizer.json vs js-tiktoken");
  expect_same(**tok, expected(kRefs / "gpt2/expected_hf.json"), "gpt2 tokenizer.json vs @huggingface/tokenizers");
  expect_round_trip(**tok, "gpt2 tokenizer.json");
}

TEST(TokenizerReference, Llama3StyleSplitEqualsHuggingFace) {
  REQUIRE_REFERENCE(kRefs / "gpt2-split/expected_hf.json", true);
  auto tok = load_tokenizer(kRefs / "gpt2-split");
  ASSERT_TRUE(tok.ok()) << tok.error().message;
  expect_same(**tok, expected(kRefs / "gpt2-split/expected_hf.json"), "Split + ByteLevel vs @huggingface/tokenizers");
  expect_round_trip(**tok, "Split + ByteLevel");
}

TEST(TokenizerReference, MetaspaceByteFallbackEqualsHuggingFace) {
  for (const char* layout : {"metaspace", "metaspace-norm"}) {
    REQUIRE_REFERENCE(kRefs / layout / "expected_hf.json", true);
    auto tok = load_tokenizer(kRefs / layout);
    ASSERT_TRUE(tok.ok()) << tok.error().message;
    expect_same(**tok, expected(kRefs / layout / "expected_hf.json"), std::string(layout) + " vs @huggingface/tokenizers");
    // Characters outside the 1000-piece vocabulary (CJK, emoji) went through byte fallback.
    const std::vector<std::int32_t> ids = (*tok)->encode("日本");
    EXPECT_GE(ids.size(), 6u);
    EXPECT_EQ((*tok)->decode(ids), "日本");
  }
}

TEST(TokenizerReference, SentencePieceEqualsPythonSentencePiece) {
  REQUIRE_REFERENCE(kRefs / "spm/expected.json", false);
  // Alone in a folder, tokenizer.model is what load_tokenizer finds.
  const fs::path dir = fs::temp_directory_path() / ("vg_spm_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  fs::copy_file(kRefs / "spm/tokenizer.model", dir / "tokenizer.model", fs::copy_options::overwrite_existing);
  auto tok = load_tokenizer(dir);
  fs::remove_all(dir);
  ASSERT_TRUE(tok.ok()) << tok.error().message;
  ASSERT_NE(*tok, nullptr);
  expect_same(**tok, expected(kRefs / "spm/expected.json"), "tokenizer.model vs python3-sentencepiece");
  EXPECT_EQ((*tok)->vocab_size(), 1000);
  EXPECT_EQ((*tok)->bos_id(), 1);
  EXPECT_EQ((*tok)->eos_id(), 2);
  EXPECT_TRUE((*tok)->adds_bos());
  // Control pieces written in text are the control tokens (chat templates rely on it).
  const std::vector<std::int32_t> ids = (*tok)->encode("<s>hi</s>");
  ASSERT_GE(ids.size(), 3u);
  EXPECT_EQ(ids.front(), 1);
  EXPECT_EQ(ids.back(), 2);
}

}  // namespace
}  // namespace vg
