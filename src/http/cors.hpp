// Cross-origin resource sharing (the Fetch standard's CORS protocol) for
// browser clients on other origins: which Origin values are allowed, the
// headers an allowed origin's responses carry, and the answer to a preflight
// (OPTIONS with Access-Control-Request-Method). Pure functions of strings, no
// Beast types, no state: any thread.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/error.hpp"

namespace vg::httpd {

using HeaderList = std::vector<std::pair<std::string, std::string>>;

/// The origins allowed to call the API (--cors-allow-origin). Empty: CORS is
/// off and no response carries CORS headers.
struct CorsPolicy {
  /// Exact origins ("https://app.example.com", "http://localhost:3000"),
  /// compared case-insensitively; "*" allows every origin.
  std::vector<std::string> allowed_origins;

  bool enabled() const { return !allowed_origins.empty(); }
  /// Whether a request with this Origin header value gets CORS headers.
  /// An absent (empty) Origin never does.
  bool allows(std::string_view origin) const;
};

/// Headers for any response (errors and streams too) to a request whose
/// Origin is `origin`: for an allowed origin Access-Control-Allow-Origin (the
/// origin itself) and Access-Control-Expose-Headers (the retry headers
/// Retry-After, retry-after-ms, x-should-retry and X-Retry-Token, then
/// X-Request-Id, X-Queue-Position, X-Queue-Wait-Ms); `Vary: Origin` whenever
/// CORS is enabled, since the answer depends on the Origin; nothing otherwise.
HeaderList cors_response_headers(const CorsPolicy& policy, std::string_view origin);

/// A preflight answer: status 204 with headers, or a 403 kForbidden error.
struct PreflightAnswer {
  int status = 204;
  HeaderList headers;
  std::optional<Error> error;  ///< set for 403: the origin is not allowed
};

/// The answer to OPTIONS with Access-Control-Request-Method from `origin`:
/// allowed → 204 with the response headers above plus
/// Access-Control-Allow-Methods (GET, POST, OPTIONS),
/// Access-Control-Allow-Headers (the names of `requested_headers`, the
/// comma-separated Access-Control-Request-Headers, that are HTTP tokens of
/// at most 64 letters, digits and '-'; at most 32 of them) and
/// Access-Control-Max-Age; not allowed (or CORS off) → 403 `forbidden` naming
/// the origin, with no CORS headers.
PreflightAnswer cors_preflight(const CorsPolicy& policy, std::string_view origin, std::string_view requested_headers);

/// Seconds a browser may cache a preflight answer.
inline constexpr int kCorsMaxAgeS = 600;

}  // namespace vg::httpd
