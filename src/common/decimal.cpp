// Plain decimal text of doubles (see decimal.hpp).
#include "common/decimal.hpp"

#include <charconv>
#include <cmath>
#include <cstdio>

namespace vg {

std::string format_decimal(double x) {
  if (std::isnan(x)) return "NaN";
  if (std::isinf(x)) return x > 0 ? "+Inf" : "-Inf";
  if (x == 0) return "0";
  const double a = std::fabs(x);
  const std::chars_format form =
      a >= 1e-6 && a < 1e21 ? std::chars_format::fixed : std::chars_format::scientific;
  // Fixed form in that range: at most 17 significant digits, 6 leading
  // zeros after the point, or 21 digits before it, plus sign and point.
  char buf[64];
  const std::to_chars_result r = std::to_chars(buf, buf + sizeof buf, x, form);
  return std::string(buf, r.ptr);
}

std::string format_bytes(std::int64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double v = static_cast<double>(bytes);
  int unit = 0;
  while (std::fabs(v) >= 1024.0 && unit < 6) {
    v /= 1024.0;
    ++unit;
  }
  char buf[48];
  if (unit == 0) {
    std::snprintf(buf, sizeof buf, "%lld B", static_cast<long long>(bytes));
  } else {
    std::snprintf(buf, sizeof buf, "%.1f %s", v, kUnits[unit]);
  }
  return buf;
}

}  // namespace vg
