#include "common/decimal.hpp"

#include <charconv>
#include <cmath>
#include <limits>
#include <random>
#include <string>

#include <gtest/gtest.h>

namespace vg {
namespace {

double read_back(const std::string& s) {
  double d = 0;
  const auto r = std::from_chars(s.data(), s.data() + s.size(), d);
  EXPECT_EQ(r.ptr, s.data() + s.size()) << s;
  return d;
}

TEST(FormatDecimal, OrdinaryValuesArePlainDecimals) {
  EXPECT_EQ(format_decimal(4.19), "4.19");
  EXPECT_EQ(format_decimal(1.1), "1.1");
  EXPECT_EQ(format_decimal(0.5), "0.5");
  EXPECT_EQ(format_decimal(0.0005), "0.0005");  // to_chars' shortest form is "5e-04"
  EXPECT_EQ(format_decimal(0.000001), "0.000001");
  EXPECT_EQ(format_decimal(-2.25), "-2.25");
  EXPECT_EQ(format_decimal(123456.789), "123456.789");
  EXPECT_EQ(format_decimal(0.1 + 0.2), "0.30000000000000004");
}

TEST(FormatDecimal, IntegersStayIntegers) {
  EXPECT_EQ(format_decimal(0.0), "0");
  EXPECT_EQ(format_decimal(-0.0), "0");
  EXPECT_EQ(format_decimal(2.0), "2");
  EXPECT_EQ(format_decimal(-7.0), "-7");
  EXPECT_EQ(format_decimal(2147483648.0), "2147483648");
  EXPECT_EQ(format_decimal(1e20), "100000000000000000000");  // "1e+20" from to_chars
}

TEST(FormatDecimal, ExtremesUseTheExponentAndNonFiniteThePrometheusSpelling) {
  EXPECT_EQ(format_decimal(1e-7), "1e-07");
  EXPECT_EQ(format_decimal(1e21), "1e+21");
  EXPECT_EQ(format_decimal(std::numeric_limits<double>::max()), "1.7976931348623157e+308");
  EXPECT_EQ(format_decimal(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(format_decimal(-std::numeric_limits<double>::infinity()), "-Inf");
  EXPECT_EQ(format_decimal(std::nan("")), "NaN");
}

TEST(FormatDecimal, EveryValueReadsBackExactly) {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> exponent(-8, 23);
  std::uniform_real_distribution<double> mantissa(-10, 10);
  for (int i = 0; i < 20000; ++i) {
    const double x = mantissa(rng) * std::pow(10.0, exponent(rng));
    const std::string s = format_decimal(x);
    EXPECT_EQ(read_back(s), x) << s;
    const double a = std::fabs(x);
    if (a >= 1e-6 && a < 1e21) {
      EXPECT_EQ(s.find_first_of("eE"), std::string::npos) << s;
    }
  }
}

}  // namespace
}  // namespace vg
