// Allowed-origin values (see origin.hpp).
#include "common/origin.hpp"

#include <cctype>
#include <string>

namespace vg {

Status check_origin(std::string_view origin) {
  if (origin == "*") return {};
  const auto bad = [origin](std::string_view why) {
    return Error(ErrorCode::kConfig, "'" + std::string(origin) + "' is not an origin (" + std::string(why) +
                                         "); write scheme://host[:port], e.g. http://localhost:3000, or *");
  };
  std::string_view rest;
  if (origin.starts_with("http://")) {
    rest = origin.substr(7);
  } else if (origin.starts_with("https://")) {
    rest = origin.substr(8);
  } else {
    return bad("the scheme must be http or https");
  }
  if (rest.empty()) return bad("no host");
  for (char c : rest) {
    const bool ok = std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' || c == ':' || c == '[' ||
                    c == ']';
    if (!ok) return bad(c == '/' ? "no path or trailing slash" : "unexpected character");
  }
  return {};
}

}  // namespace vg
