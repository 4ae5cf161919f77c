// libFuzzer target: JSON request decoding into typed requests
// (http/json_codec: decode_completion_request, decode_infer_request).
// Properties checked besides "no crash, no sanitizer report": a decoded
// request's values lie in their documented ranges, and every error encodes
// into a body that is itself valid JSON with a 4xx status.
#include <boost/json.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "common/error.hpp"
#include "http/json_codec.hpp"

namespace {

void check(const vg::Result<vg::CompletionRequest>& r) {
  if (!r.ok()) {
    const int status = vg::http_status(r.error().code);
    if (status < 400 || status >= 500) __builtin_trap();
    boost::system::error_code ec;
    const boost::json::value body = boost::json::parse(vg::encode_error(r.error()), ec);
    if (ec || !body.is_object() || !body.get_object().contains("error")) __builtin_trap();
    return;
  }
  const vg::CompletionRequest& req = r.value();
  if (req.max_tokens < 0 || (req.max_tokens == 0 && !req.echo)) __builtin_trap();
  if (req.n < 1 || req.n > 256) __builtin_trap();
  if (req.logprobs && (*req.logprobs < 0 || *req.logprobs > 20)) __builtin_trap();
  if (req.include_usage && !req.stream) __builtin_trap();
  const vg::SamplingParams& sp = req.sampling;
  if (!(std::fabs(sp.presence_penalty) <= 2) || !(std::fabs(sp.frequency_penalty) <= 2)) __builtin_trap();
  if (!(sp.repetition_penalty > 0)) __builtin_trap();
  for (const auto& [id, bias] : sp.logit_bias) {
    if (id < 0 || !(std::fabs(bias) <= 100)) __builtin_trap();
  }
  if (req.stop.size() > 4) __builtin_trap();
  for (const std::string& s : req.stop) {
    if (s.empty()) __builtin_trap();
  }
  if (req.timeout_s && !(*req.timeout_s > 0 && std::isfinite(*req.timeout_s))) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  check(vg::decode_completion_request(body));
  check(vg::decode_infer_request(body));
  return 0;
}
