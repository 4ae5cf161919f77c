// The parts of the tokenizers on small hand-made inputs whose right answers
// can be worked out by hand: BPE merge order, byte fallback, unk, the GPT-2
// byte alphabet, the GPT-2 split pattern, added tokens.
#include <gtest/gtest.h>

#include "tokenizer/added_tokens.hpp"
#include "tokenizer/bpe.hpp"
#include "tokenizer/byte_level.hpp"
#include "tokenizer/regex_split.hpp"

namespace vg::tok {
namespace {

Bpe make(Bpe::Options o) {
  auto bpe = Bpe::create(std::move(o));
  EXPECT_TRUE(bpe.ok()) << (bpe.ok() ? "" : bpe.error().message);
  return std::move(bpe).value();
}

std::vector<std::int32_t> encode(const Bpe& bpe, std::string_view word) {
  std::vector<std::int32_t> out;
  bpe.encode_word(word, out);
  return out;
}

TEST(Bpe, LowestRankedPairMergesFirst) {
  Bpe::Options o;
  o.vocab = {{"a", 0}, {"b", 1}, {"c", 2}, {"ab", 3}, {"bc", 4}, {"abc", 5}};
  o.merges = {{"b", "c"}, {"a", "b"}, {"a", "bc"}};
  const Bpe bpe = make(o);
  // "bc" outranks "ab", so abc = a + bc -> abc.
  EXPECT_EQ(encode(bpe, "abc"), (std::vector<std::int32_t>{5}));
  EXPECT_EQ(encode(bpe, "ab"), (std::vector<std::int32_t>{3}));
  EXPECT_EQ(encode(bpe, "cab"), (std::vector<std::int32_t>{2, 3}));
  EXPECT_EQ(encode(bpe, "cba"), (std::vector<std::int32_t>{2, 1, 0}));
}

TEST(Bpe, TiesMergeLeftmostFirst) {
  Bpe::Options o;
  o.vocab = {{"a", 0}, {"aa", 1}};
  o.merges = {{"a", "a"}};
  const Bpe bpe = make(o);
  EXPECT_EQ(encode(bpe, "aaa"), (std::vector<std::int32_t>{1, 0}));
  EXPECT_EQ(encode(bpe, "aaaa"), (std::vector<std::int32_t>{1, 1}));
}

TEST(Bpe, ByteFallbackAndUnk) {
  Bpe::Options o;
  o.vocab = {{"<unk>", 0}, {"a", 1}, {"<0xC3>", 2}, {"<0xA9>", 3}};
  o.byte_fallback = true;
  o.unk_token = "<unk>";
  o.fuse_unk = true;
  const Bpe bpe = make(o);
  EXPECT_EQ(encode(bpe, "a\xC3\xA9"), (std::vector<std::int32_t>{1, 2, 3}));  // "aé": é as its two bytes
  // "日本" has no byte tokens here: one fused unk.
  EXPECT_EQ(encode(bpe, "\xE6\x97\xA5\xE6\x9C\xAC" "a"), (std::vector<std::int32_t>{0, 1}));
}

TEST(Bpe, IgnoreMergesTakesWholeWords) {
  Bpe::Options o;
  o.vocab = {{"a", 0}, {"b", 1}, {"ab", 2}, {"ba", 3}, {"aba", 4}};
  o.merges = {{"a", "b"}};
  o.ignore_merges = true;
  const Bpe bpe = make(o);
  EXPECT_EQ(encode(bpe, "aba"), (std::vector<std::int32_t>{4}));   // in the vocabulary as a whole
  EXPECT_EQ(encode(bpe, "abab"), (std::vector<std::int32_t>{2, 2}));
}

TEST(Bpe, MergeOfUnknownTokenIsAnError) {
  Bpe::Options o;
  o.vocab = {{"a", 0}, {"b", 1}};
  o.merges = {{"a", "b"}};
  auto bpe = Bpe::create(o);
  ASSERT_FALSE(bpe.ok());
  EXPECT_EQ(bpe.error().code, ErrorCode::kModelLoad);
  EXPECT_NE(bpe.error().message.find("merge 0"), std::string::npos);
}

TEST(ByteLevel, AllBytesRoundTrip) {
  std::string all;
  for (int b = 0; b < 256; ++b) all += static_cast<char>(b);
  const std::string text = byte_level_encode(all);
  EXPECT_EQ(byte_level_decode(text), all);
  EXPECT_EQ(byte_level_encode(" "), "\xC4\xA0");   // "Ġ", GPT-2's space
  EXPECT_EQ(byte_level_encode("\n"), "\xC4\x8A");  // "Ċ"
  EXPECT_EQ(byte_level_encode("A"), "A");
  EXPECT_FALSE(byte_level_decode("\xE6\x97\xA5").has_value());  // not a byte-level character
}

TEST(RegexSplit, Gpt2PatternPieces) {
  auto re = RegexSplitter::create(kGpt2Pattern);
  ASSERT_TRUE(re.ok()) << re.error().message;
  const auto pieces = re->split("I'm here  now, 123 caf\xC3\xA9 \xE6\x97\xA5\xE6\x9C\xAC!\n\n");
  const std::vector<std::string_view> want{"I", "'m", " here", " ", " now", ",", " 123", " caf\xC3\xA9",
                                           " \xE6\x97\xA5\xE6\x9C\xAC", "!", "\n\n"};
  EXPECT_EQ(pieces, want);
}

TEST(RegexSplit, GapsAreKeptOrDropped) {
  auto re = RegexSplitter::create("[0-9]+");
  ASSERT_TRUE(re.ok());
  EXPECT_EQ(re->split("ab12cd3"), (std::vector<std::string_view>{"ab", "12", "cd", "3"}));
  EXPECT_EQ(re->split("ab12cd3", false), (std::vector<std::string_view>{"12", "3"}));
  auto bad = RegexSplitter::create("(unclosed");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code, ErrorCode::kModelLoad);
}

TEST(AddedTokens, SplitsLongestLeftmost) {
  AddedTokens added;
  added.add({"<|im_start|>", 10, true, false, false});
  added.add({"<|im", 11, false, false, false});
  added.add({"</s>", 12, true, true, true});
  const auto segs = added.split("x<|im_start|>user  </s>  y<|im");
  ASSERT_EQ(segs.size(), 6u);
  EXPECT_EQ(segs[0].text, "x");
  EXPECT_EQ(segs[1].token, 10);
  EXPECT_EQ(segs[2].text, "user");  // </s> strips the spaces on both sides
  EXPECT_EQ(segs[2].offset, 13u);
  EXPECT_EQ(segs[3].token, 12);
  EXPECT_EQ(segs[4].text, "y");
  EXPECT_EQ(segs[5].token, 11);
}

}  // namespace
}  // namespace vg::tok
