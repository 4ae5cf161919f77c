// Small text helpers shared by the parsers of headers and files. Pure: any
// thread.
#pragma once

#include <string_view>

namespace vg {

/// `s` without leading and trailing spaces, tabs, CR and LF (HTTP's optional
/// whitespace, and the line ends of a file read by lines).
inline std::string_view trim_whitespace(std::string_view s) {
  const auto space = [](char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; };
  while (!s.empty() && space(s.front())) s.remove_prefix(1);
  while (!s.empty() && space(s.back())) s.remove_suffix(1);
  return s;
}

}  // namespace vg
