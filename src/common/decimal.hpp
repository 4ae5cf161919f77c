// Numbers as people write them: doubles in plain decimal ("4.19", "0.0005",
// "2"), never in the exponent form Boost.JSON and std::to_chars may choose
// ("4.19E0", "5e-04"). Used for JSON bodies, the Prometheus exposition,
// --print-config and log lines. Pure functions; any thread.
#pragma once

#include <cstdint>
#include <string>

namespace vg {

/// The shortest decimal text that reads back as the same double, without an
/// exponent for 1e-6 <= |x| < 1e21 (the range in which JavaScript's
/// Number.prototype.toString writes plain decimals too); outside it, the
/// shortest scientific form ("1e-07", "1e+21"). Integral values carry no
/// fraction ("2", not "2.0"); -0 is "0". Non-finite values are written in
/// Prometheus' spelling: "NaN", "+Inf", "-Inf" (JSON writers map them to null).
std::string format_decimal(double x);

/// A byte count for people: "512 B", "1.5 KiB", "660.0 KiB", "2.0 GiB"
/// (binary units, one decimal).
std::string format_bytes(std::int64_t bytes);

}  // namespace vg
