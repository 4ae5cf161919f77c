// libFuzzer target: the engine wire protocol's receiving side (wire/frame:
// FrameReader; wire/codec: every message decoder). The bytes are fed in
// chunks (sizes from the input's first byte) the way a socket delivers
// them. Properties checked besides "no crash, no sanitizer report": a
// frame error stops the stream for good (the connection would be closed);
// whatever decodes re-encodes into something that decodes again, with the
// ranges the engine relies on.
#include <boost/json.hpp>

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "wire/codec.hpp"
#include "wire/frame.hpp"

namespace {

namespace json = boost::json;
using namespace vg;

void check_request(const json::value& v) {
  auto r = wire::decode_completion_request(v);
  if (!r.ok()) return;
  if (r->max_tokens < 0 || r->n < 1 || r->n > 256) __builtin_trap();
  if (r->logprobs && (*r->logprobs < 0 || *r->logprobs > 20)) __builtin_trap();
  if (!(r->sampling.temperature >= 0 && r->sampling.temperature <= 2)) __builtin_trap();
  if (r->stop.size() > 16) __builtin_trap();
  if (!wire::decode_completion_request(json::value(wire::encode(*r))).ok()) __builtin_trap();
}

void check_message(const json::object& m) {
  const std::string_view t = wire::message_type(m);
  if (t.empty()) __builtin_trap();  // FrameReader returns typed messages only
  for (const char* key : {"request", "resume", "event", "admission", "status", "submission", "error"}) {
    const json::value* v = m.if_contains(key);
    if (!v) continue;
    const std::string_view k(key);
    if (k == "request") check_request(*v);
    if (k == "resume") (void)wire::decode_resume(*v);
    if (k == "submission") (void)wire::decode_accepted(*v);
    if (k == "status") (void)wire::decode_status(*v);
    if (k == "error") {
      Error e;
      if (wire::decode_error(*v, &e).ok()) {
        Error again;
        if (!wire::decode_error(json::value(wire::encode(e)), &again).ok()) __builtin_trap();
      }
    }
    if (k == "event") {
      auto e = wire::decode_event(*v);
      if (e.ok() && !wire::decode_event(json::value(wire::encode(*e))).ok()) __builtin_trap();
    }
    if (k == "admission") {
      auto s = wire::decode_admission_state(*v);
      if (s.ok() && s->waiting.size() > AdmissionState::kMaxWaitingShown) __builtin_trap();
    }
  }
  if (const json::value* hs = m.if_contains("histograms"); hs && hs->is_array()) {
    for (const json::value& h : hs->as_array()) {
      auto d = wire::decode_histogram(h);
      if (d.ok() && d->buckets.size() != d->bounds.size() + 1) __builtin_trap();
    }
  }
  if (const json::value* ms = m.if_contains("models"); ms && ms->is_array()) {
    for (const json::value& x : ms->as_array()) (void)wire::decode_model_info(x);
  }
  if (const json::value* ts = m.if_contains("tensor_models"); ts && ts->is_array()) {
    for (const json::value& x : ts->as_array()) {
      auto info = wire::decode_tensor_model_info(x);
      if (info.ok() && !wire::decode_tensor_model_info(json::value(wire::encode(*info))).ok()) __builtin_trap();
    }
  }
  if (wire::message_type(m) == "infer") {
    if (const json::value* v = m.if_contains("request")) {
      auto r = wire::decode_tensor_request(*v);
      if (r.ok()) {
        if (r->dtypes.size() != r->inputs.size()) __builtin_trap();
        if (!wire::decode_tensor_request(json::value(wire::encode(*r))).ok()) __builtin_trap();
      }
    }
  }
  if (const json::value* v = m.if_contains("result")) {
    auto r = wire::decode_tensor_result(*v);
    if (r.ok() && !wire::decode_tensor_result(json::value(wire::encode(*r))).ok()) __builtin_trap();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::size_t chunk = 1 + data[0] % 64;
  std::string_view bytes(reinterpret_cast<const char*>(data + 1), size - 1);
  wire::FrameReader reader(1 << 16);
  bool broken = false;
  while (!bytes.empty() && !broken) {
    const std::size_t n = std::min(chunk, bytes.size());
    reader.append(bytes.substr(0, n));
    bytes.remove_prefix(n);
    while (auto m = reader.next()) {
      if (!m->ok()) {
        broken = true;
        break;
      }
      check_message(m->value());
    }
  }
  return 0;
}
