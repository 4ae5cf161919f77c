// What an Origin (RFC 6454, as browsers send it in the Origin header) looks
// like, for the --cors-allow-origin values. Pure function; any thread.
#pragma once

#include <string_view>

#include "common/error.hpp"

namespace vg {

/// Checks one allowed-origin value: "*" (any origin) or scheme://host[:port]
/// with scheme http or https and nothing after the host and port (no path,
/// no trailing slash). Errors: kConfig saying why, with an example.
Status check_origin(std::string_view origin);

}  // namespace vg
