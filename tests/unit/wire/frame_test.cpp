// Framing of the engine wire protocol: whole, split and broken frames.
#include "wire/frame.hpp"

#include <gtest/gtest.h>

namespace vg::wire {
namespace {

namespace json = boost::json;

TEST(Frame, RoundTripsWholeAndByteByByte) {
  const std::string a = encode_frame(json::object{{"t", "submit"}, {"rid", 7}});
  const std::string b = encode_frame(json::object{{"t", "cancel"}, {"rid", 8}});
  FrameReader whole(1024);
  whole.append(a + b);
  auto m1 = whole.next();
  ASSERT_TRUE(m1 && m1->ok());
  EXPECT_EQ(message_type(**m1), "submit");
  auto m2 = whole.next();
  ASSERT_TRUE(m2 && m2->ok());
  EXPECT_EQ((**m2).at("rid").as_int64(), 8);
  EXPECT_FALSE(whole.next().has_value());

  FrameReader bytes(1024);
  int got = 0;
  for (char c : a + b) {
    bytes.append(std::string_view(&c, 1));
    while (auto m = bytes.next()) {
      ASSERT_TRUE(m->ok());
      ++got;
    }
  }
  EXPECT_EQ(got, 2);
  EXPECT_EQ(bytes.buffered(), 0u);
}

TEST(Frame, LargeFramesFollowedByMoreDecodeIntact) {
  // A frame of more than 1 MiB followed by another: the reader compacts its
  // buffer after the first, which must not move the bytes being parsed.
  const std::string big(3u << 19, 'x');
  std::string bytes;
  for (int i = 0; i < 3; ++i) bytes += encode_frame(json::object{{"t", "event"}, {"rid", i}, {"data", big}});
  bytes += encode_frame(json::object{{"t", "cancel"}, {"rid", 9}});
  FrameReader reader(8u << 20);
  reader.append(bytes.substr(0, bytes.size() - 5));
  for (int i = 0; i < 3; ++i) {
    auto m = reader.next();
    ASSERT_TRUE(m && m->ok()) << (m ? (*m).error().message : "no frame");
    EXPECT_EQ((**m).at("rid").as_int64(), i);
    EXPECT_EQ((**m).at("data").as_string(), big);
  }
  EXPECT_FALSE(reader.next().has_value());
  reader.append(bytes.substr(bytes.size() - 5));
  auto last = reader.next();
  ASSERT_TRUE(last && last->ok());
  EXPECT_EQ((**last).at("rid").as_int64(), 9);
}

TEST(Frame, RefusesOversizedBeforeItsPayloadArrives) {
  FrameReader r(100);
  r.append(std::string("\x00\x00\x10\x00", 4));  // 4096 bytes announced
  auto m = r.next();
  ASSERT_TRUE(m.has_value());
  ASSERT_FALSE(m->ok());
  EXPECT_NE(m->error().message.find("exceeds the limit"), std::string::npos);
}

TEST(Frame, RefusesEmptyNonJsonNonObjectAndUntyped) {
  for (const std::string& payload : {std::string("not json"), std::string("[1,2]"), std::string("{\"rid\":1}"),
                                     std::string("{\"t\":3}")}) {
    const auto n = static_cast<std::uint32_t>(payload.size());
    std::string frame{static_cast<char>(n >> 24), static_cast<char>(n >> 16), static_cast<char>(n >> 8),
                      static_cast<char>(n)};
    FrameReader r(1024);
    r.append(frame + payload);
    auto m = r.next();
    ASSERT_TRUE(m.has_value()) << payload;
    EXPECT_FALSE(m->ok()) << payload;
  }
  FrameReader empty(1024);
  empty.append(std::string(4, '\0'));
  auto m = empty.next();
  ASSERT_TRUE(m.has_value());
  EXPECT_FALSE(m->ok());
}

TEST(Frame, TruncatedFrameWaitsForMore) {
  const std::string a = encode_frame(json::object{{"t", "state"}, {"qid", 1}});
  FrameReader r(1024);
  r.append(a.substr(0, a.size() - 1));
  EXPECT_FALSE(r.next().has_value());
  r.append(a.substr(a.size() - 1));
  auto m = r.next();
  ASSERT_TRUE(m && m->ok());
}

TEST(Frame, CarriesBytesThatAreNotUtf8) {
  // A token may be part of a UTF-8 character.
  const std::string partial = "\xe2\x82";
  FrameReader r(1024);
  r.append(encode_frame(json::object{{"t", "event"}, {"text", partial}}));
  auto m = r.next();
  ASSERT_TRUE(m && m->ok());
  EXPECT_EQ(std::string((**m).at("text").as_string()), partial);
}

}  // namespace
}  // namespace vg::wire
