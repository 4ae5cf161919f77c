// parse_bytes(): byte sizes as written in configuration ("2GiB", "1.5GB").
// Pure; any thread.
#include <array>
#include <cctype>
#include <charconv>
#include <cmath>
#include <string_view>

#include "device/device.hpp"

namespace vg {
namespace {

struct Unit {
  std::string_view suffix;
  double factor;
};

// Binary (IEC) and decimal (SI) units; the empty suffix means bytes.
constexpr std::array<Unit, 10> kUnits{{
    {"B", 1.0},
    {"KiB", 1024.0},
    {"MiB", 1024.0 * 1024},
    {"GiB", 1024.0 * 1024 * 1024},
    {"TiB", 1024.0 * 1024 * 1024 * 1024},
    {"KB", 1e3},
    {"MB", 1e6},
    {"GB", 1e9},
    {"TB", 1e12},
    {"", 1.0},
}};

Error bad(const std::string& text, const std::string& why) {
  return Error{ErrorCode::kConfig, "invalid byte size '" + text + "': " + why +
                                       " (expected e.g. 1000, 64KiB, 512MiB, 2GiB, 1.5GB)"};
}

}  // namespace

Result<std::int64_t> parse_bytes(const std::string& text) {
  std::string_view s = text;
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  std::size_t digits = 0;
  while (digits < s.size() && (std::isdigit(static_cast<unsigned char>(s[digits])) || s[digits] == '.')) ++digits;
  if (digits == 0) return bad(text, "no number");
  double number = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + digits, number);
  if (ec != std::errc() || end != s.data() + digits) return bad(text, "malformed number");
  std::string_view suffix = s.substr(digits);
  while (!suffix.empty() && suffix.front() == ' ') suffix.remove_prefix(1);
  for (const Unit& unit : kUnits) {
    if (suffix != unit.suffix) continue;
    const double bytes = number * unit.factor;
    if (!std::isfinite(bytes) || bytes >= 9.2e18) return bad(text, "too large");
    const double whole = std::floor(bytes);
    if (whole != bytes) return bad(text, "not a whole number of bytes");
    if (whole < 1) return bad(text, "must be > 0");
    return static_cast<std::int64_t>(whole);
  }
  return bad(text, "unknown unit '" + std::string(suffix) + "'");
}

}  // namespace vg
