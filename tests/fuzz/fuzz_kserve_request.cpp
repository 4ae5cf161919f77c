// libFuzzer target: KServe v2 infer request decoding
// (http/kserve_codec: decode_tensor_infer_request), JSON bodies and the
// binary tensor data extension. The first input byte chooses the
// Inference-Header-Content-Length header: none (even), or the next two bytes
// as its value (odd; it may lie past the body), or those bytes as text
// (odd, third bit set). Properties checked besides "no crash, no sanitizer
// report": every error encodes into a body that is valid JSON with a 4xx
// status; an accepted request has one dtype per input, finite data, and a
// binary input's values fit in the body.
#include <boost/json.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "common/error.hpp"
#include "http/json_codec.hpp"
#include "http/kserve_codec.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 3) return 0;
  std::optional<std::string> header;
  if (data[0] & 1) {
    if (data[0] & 4) header = std::string(reinterpret_cast<const char*>(data + 1), 2);
    else header = std::to_string(data[1] | (data[2] << 8));
  }
  const std::string_view body(reinterpret_cast<const char*>(data + 3), size - 3);
  std::optional<std::string_view> value;
  if (header) value = *header;
  const auto r = vg::httpd::decode_tensor_infer_request(body, "m", value);
  if (!r.ok()) {
    const int status = vg::http_status(r.error().code);
    if (status < 400 || status >= 500) __builtin_trap();
    boost::system::error_code ec;
    const boost::json::value v = boost::json::parse(vg::encode_error(r.error()), ec);
    if (ec || !v.is_object() || !v.get_object().contains("error")) __builtin_trap();
    return 0;
  }
  if (r->inputs.empty() || r->inputs.size() != r->dtypes.size()) __builtin_trap();
  std::size_t values = 0;
  for (const vg::HostTensor& t : r->inputs) {
    for (float x : t.data) {
      if (!std::isfinite(x)) __builtin_trap();
    }
    values += t.data.size();
  }
  // JSON numbers take at least two bytes each ("1,"), binary ones four.
  if (values > body.size()) __builtin_trap();
  return 0;
}
