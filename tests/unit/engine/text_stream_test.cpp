#include "engine/text_stream.hpp"

#include <gtest/gtest.h>

namespace vg {
namespace {

std::string feed_bytes(TextStream& ts, std::string_view s, std::vector<std::string>* chunks = nullptr) {
  std::string out;
  for (char c : s) {
    std::string piece = ts.push(std::string_view(&c, 1));
    if (chunks && !piece.empty()) chunks->push_back(piece);
    out += piece;
    if (ts.stopped()) break;
  }
  return out;
}

TEST(TextStream, PassesPlainTextThrough) {
  TextStream ts({});
  EXPECT_EQ(feed_bytes(ts, "hello"), "hello");
  EXPECT_EQ(ts.finish(), "");
  EXPECT_FALSE(ts.stopped());
}

TEST(TextStream, NeverEmitsHalfACharacter) {
  TextStream ts({});
  std::vector<std::string> chunks;
  const std::string text = "a\xE6\x97\xA5" "b\xF0\x9F\x98\x80";
  EXPECT_EQ(feed_bytes(ts, text, &chunks), text);
  ASSERT_EQ(chunks.size(), 4u);
  EXPECT_EQ(chunks[1], "\xE6\x97\xA5");
  EXPECT_EQ(chunks[3], "\xF0\x9F\x98\x80");
}

TEST(TextStream, StopStringEndsGenerationAndIsNotEmitted) {
  TextStream ts({"\n\n", "END"});
  std::vector<std::string> chunks;
  EXPECT_EQ(feed_bytes(ts, "one\ntwo\n\nthree", &chunks), "one\ntwo");
  EXPECT_TRUE(ts.stopped());
  for (const auto& c : chunks) EXPECT_EQ(c.find("\n\n"), std::string::npos);
  EXPECT_EQ(ts.push("more"), "");
  EXPECT_EQ(ts.finish(), "");
}

TEST(TextStream, HoldsBackAPossibleStopPrefixUntilRuledOut) {
  TextStream ts({"STOP"});
  EXPECT_EQ(ts.push("abc ST"), "abc ");
  EXPECT_EQ(ts.push("O"), "");
  EXPECT_EQ(ts.push("X"), "STOX");
  EXPECT_FALSE(ts.stopped());
}

TEST(TextStream, PartialStopAtEndIsPlainText) {
  TextStream ts({"STOP"});
  EXPECT_EQ(ts.push("abc STO"), "abc ");
  EXPECT_EQ(ts.finish(), "STO");
}

TEST(TextStream, IllFormedTailBecomesReplacementAtFinish) {
  TextStream ts({});
  EXPECT_EQ(ts.push("x\xE6\x97"), "x");
  EXPECT_EQ(ts.finish(), "\xEF\xBF\xBD");
}

TEST(TextStream, StopStringSpanningTokens) {
  TextStream ts({"world"});
  EXPECT_EQ(ts.push("hello wo"), "hello ");
  EXPECT_EQ(ts.push("rld and more"), "");
  EXPECT_TRUE(ts.stopped());
}

}  // namespace
}  // namespace vg
