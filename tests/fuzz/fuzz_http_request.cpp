// libFuzzer target: the HTTP request parsing path. Raw bytes go through
// Beast's parser with the server's limits and head checks
// (http/request_parse: parse_request), request after request as a
// pipelining client would send them; each parsed request is routed by path
// and its body decoded into a typed request (http/json_codec), as the
// connection does. Property checked besides "no crash, no sanitizer report":
// every refusal is a 4xx, never a 5xx.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "common/error.hpp"
#include "http/json_codec.hpp"
#include "http/request_parse.hpp"

namespace {

void expect_client_error(const vg::Error& error) {
  const int status = vg::http_status(error.code);
  if (status < 400 || status >= 500) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string_view bytes(reinterpret_cast<const char*>(data), size);
  vg::httpd::HeadLimits limits;  // small limits, so that inputs reach them
  limits.header_bytes = 2048;
  limits.target_bytes = 512;
  limits.body_bytes = 16 * 1024;
  for (int i = 0; i < 8 && !bytes.empty(); ++i) {
    auto parsed = vg::httpd::parse_request(bytes, limits);
    if (!parsed.ok()) {
      expect_client_error(parsed.error());
      return 0;
    }
    if (parsed->consumed == 0 || parsed->consumed > bytes.size()) __builtin_trap();
    const std::string_view target = parsed->request.target();
    const std::string_view path = target.substr(0, target.find('?'));
    if (path == "/v1/completions" || path == "/infer") {
      const auto decoded = path == "/infer" ? vg::decode_infer_request(parsed->request.body())
                                            : vg::decode_completion_request(parsed->request.body());
      if (!decoded.ok()) expect_client_error(decoded.error());
    }
    bytes.remove_prefix(parsed->consumed);
  }
  return 0;
}
