// Framing of the engine wire protocol: whole, split and broken frames.
#include "wire/frame.hpp"

#include <gtest/gtest.h>

namespace vg::wire {
namespace {

TEST(Frame, RoundTripsWholeAndByteByByte) {
  const std::string a = frame_of("first");
  const std::string b = frame_of("second");
  EXPECT_EQ(a.substr(0, kHeaderBytes), std::string("\0\0\0\5", 4));
  FrameReader whole(1024);
  whole.append(a + b);
  auto m1 = whole.next();
  ASSERT_TRUE(m1 && m1->ok());
  EXPECT_EQ(**m1, "first");
  auto m2 = whole.next();
  ASSERT_TRUE(m2 && m2->ok());
  EXPECT_EQ(**m2, "second");
  EXPECT_FALSE(whole.next().has_value());

  FrameReader bytes(1024);
  std::vector<std::string> got;
  for (char c : a + b) {
    bytes.append(std::string_view(&c, 1));
    while (auto m = bytes.next()) {
      ASSERT_TRUE(m->ok());
      got.emplace_back(**m);
    }
  }
  EXPECT_EQ(got, (std::vector<std::string>{"first", "second"}));
  EXPECT_EQ(bytes.buffered(), 0u);
}

TEST(Frame, LargeFramesFollowedByMoreArriveIntact) {
  // Frames of more than 1 MiB followed by another: the reader compacts its
  // buffer after the first, which must not move the bytes of a payload
  // before the next call.
  std::string bytes;
  for (char c : {'a', 'b', 'c'}) bytes += frame_of(std::string(3u << 19, c));
  bytes += frame_of("last");
  FrameReader reader(8u << 20);
  reader.append(bytes.substr(0, bytes.size() - 5));
  for (char c : {'a', 'b', 'c'}) {
    auto m = reader.next();
    ASSERT_TRUE(m && m->ok()) << (m ? (*m).error().message : "no frame");
    EXPECT_EQ(**m, std::string(3u << 19, c));
  }
  EXPECT_FALSE(reader.next().has_value());
  reader.append(bytes.substr(bytes.size() - 5));
  auto last = reader.next();
  ASSERT_TRUE(last && last->ok());
  EXPECT_EQ(**last, "last");
}

TEST(Frame, RefusesOversizedBeforeItsPayloadArrives) {
  FrameReader r(100);
  r.append(std::string("\x00\x00\x10\x00", 4));  // 4096 bytes announced
  auto m = r.next();
  ASSERT_TRUE(m.has_value());
  ASSERT_FALSE(m->ok());
  EXPECT_NE(m->error().message.find("exceeds the limit"), std::string::npos);
}

TEST(Frame, RefusesAnEmptyPayload) {
  FrameReader empty(1024);
  empty.append(std::string(4, '\0'));
  auto m = empty.next();
  ASSERT_TRUE(m.has_value());
  EXPECT_FALSE(m->ok());
}

TEST(Frame, TruncatedFrameWaitsForMore) {
  const std::string a = frame_of("payload");
  FrameReader r(1024);
  r.append(a.substr(0, a.size() - 1));
  EXPECT_FALSE(r.next().has_value());
  r.append(a.substr(a.size() - 1));
  auto m = r.next();
  ASSERT_TRUE(m && m->ok());
  EXPECT_EQ(**m, "payload");
}

TEST(Frame, SealWritesTheLengthOfWhatFollowsTheHeader) {
  std::string frame(kHeaderBytes, 'x');
  frame += std::string(300, 'y');
  seal_frame(frame);
  EXPECT_EQ(frame.substr(0, kHeaderBytes), std::string("\0\0\x01\x2c", 4));
}

}  // namespace
}  // namespace vg::wire
