#include "common/origin.hpp"

#include <gtest/gtest.h>

namespace vg {
namespace {

TEST(CheckOrigin, AcceptsWhatBrowsersSend) {
  for (const char* ok : {"*", "http://localhost:3000", "https://app.example.com", "http://127.0.0.1:8000",
                         "http://[::1]:8080"}) {
    EXPECT_TRUE(check_origin(ok).ok()) << ok;
  }
}

TEST(CheckOrigin, RefusesPathsSchemesAndJunkSayingWhy) {
  struct Case {
    const char* origin;
    const char* why;
  };
  for (const Case& c : {Case{"app.example.com", "scheme"}, Case{"ftp://app.example", "scheme"},
                        Case{"http://", "no host"}, Case{"http://app.example/", "no path"},
                        Case{"https://app.example/x", "no path"}, Case{"http://a b", "unexpected character"},
                        Case{"", "scheme"}}) {
    Status st = check_origin(c.origin);
    ASSERT_FALSE(st.ok()) << c.origin;
    EXPECT_EQ(st.error().code, ErrorCode::kConfig);
    EXPECT_NE(st.error().message.find(c.why), std::string::npos) << st.error().message;
    EXPECT_NE(st.error().message.find("not an origin"), std::string::npos);
  }
}

}  // namespace
}  // namespace vg
