// CORS policy and headers (see cors.hpp).
#include "http/cors.hpp"

#include <algorithm>
#include <cctype>

#include "common/text.hpp"

namespace vg::httpd {
namespace {

// The response headers a page may read: the retry headers of a 503 (the delay,
// the booked retry's token to send back, and the two the OpenAI SDKs read), the
// request id and the queue headers.
constexpr std::string_view kExposed =
    "Retry-After, retry-after-ms, x-should-retry, X-Retry-Token, X-Request-Id, X-Queue-Position, X-Queue-Wait-Ms";
constexpr std::string_view kMethods = "GET, POST, OPTIONS";
constexpr std::size_t kMaxHeaderName = 64;
constexpr std::size_t kMaxHeaders = 32;

bool iequal(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
         });
}

bool header_name_ok(std::string_view name) {
  return !name.empty() && name.size() <= kMaxHeaderName && std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-';
  });
}

/// The requested header names that pass header_name_ok, comma-separated.
std::string allowed_header_list(std::string_view requested) {
  std::string out;
  std::size_t count = 0;
  while (!requested.empty() && count < kMaxHeaders) {
    const std::size_t comma = requested.find(',');
    const std::string_view name = trim_whitespace(requested.substr(0, comma));
    requested = comma == std::string_view::npos ? std::string_view() : requested.substr(comma + 1);
    if (!header_name_ok(name)) continue;
    if (!out.empty()) out += ", ";
    out += name;
    ++count;
  }
  return out;
}

}  // namespace

bool CorsPolicy::allows(std::string_view origin) const {
  if (origin.empty()) return false;
  return std::any_of(allowed_origins.begin(), allowed_origins.end(),
                     [origin](const std::string& a) { return a == "*" || iequal(a, origin); });
}

HeaderList cors_response_headers(const CorsPolicy& policy, std::string_view origin) {
  HeaderList h;
  if (!policy.enabled()) return h;
  h.emplace_back("Vary", "Origin");
  if (!policy.allows(origin)) return h;
  h.emplace_back("Access-Control-Allow-Origin", std::string(origin));
  h.emplace_back("Access-Control-Expose-Headers", std::string(kExposed));
  return h;
}

PreflightAnswer cors_preflight(const CorsPolicy& policy, std::string_view origin, std::string_view requested_headers) {
  PreflightAnswer a;
  if (!policy.allows(origin)) {
    a.status = 403;
    const std::string shown = origin.empty() ? std::string("(none)") : std::string(origin.substr(0, 200));
    a.error = Error(ErrorCode::kForbidden, "cross-origin requests from origin " + shown +
                                               " are not allowed (see --cors-allow-origin)");
    if (policy.enabled()) a.headers.emplace_back("Vary", "Origin");
    return a;
  }
  a.headers = cors_response_headers(policy, origin);
  a.headers.emplace_back("Access-Control-Allow-Methods", std::string(kMethods));
  if (std::string list = allowed_header_list(requested_headers); !list.empty()) {
    a.headers.emplace_back("Access-Control-Allow-Headers", std::move(list));
  }
  a.headers.emplace_back("Access-Control-Max-Age", std::to_string(kCorsMaxAgeS));
  return a;
}

}  // namespace vg::httpd
