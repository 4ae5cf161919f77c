// A helper of the JSON codec tests (json_codec_test.cpp, error_body_test.cpp).
#pragma once

#include <gtest/gtest.h>

#include <string>

#include <boost/json.hpp>

namespace vg::test {

/// The JSON object in `s`; a test failure (and an empty object) when `s` is not one.
inline boost::json::object parse_object(const std::string& s) {
  boost::system::error_code ec;
  boost::json::value v = boost::json::parse(s, ec);
  EXPECT_FALSE(ec) << s;
  EXPECT_TRUE(v.is_object()) << s;
  return v.is_object() ? v.get_object() : boost::json::object{};
}

}  // namespace vg::test
