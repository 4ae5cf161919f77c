// libFuzzer target: the engine wire protocol's receiving side on both ends
// (wire/frame: FrameReader; wire/envelope: the decoders of each direction,
// with every payload codec under them). The bytes are fed in chunks (sizes
// from the input's first byte) the way a socket delivers them, and each
// payload is decoded as a message to the engine and as one to a gateway,
// then dispatched with std::visit as the two sides do. Properties checked
// besides "no crash, no sanitizer report": a frame error stops the stream
// for good (the connection would be closed); a decode error says why; what
// decodes has the ranges the receiver relies on, and re-encodes into a
// frame that decodes again to the same message type and request.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <variant>

#include "common/overloaded.hpp"
#include "wire/envelope.hpp"
#include "wire/frame.hpp"

namespace {

using namespace vg;
using namespace vg::wire;

void check_request(const CompletionRequest& r) {
  if (r.max_tokens < 0 || r.n < 1 || r.n > 256) __builtin_trap();
  if (r.logprobs && (*r.logprobs < 0 || *r.logprobs > 20)) __builtin_trap();
  if (!(r.sampling.temperature >= 0 && r.sampling.temperature <= 2)) __builtin_trap();
  if (r.stop.size() > 16) __builtin_trap();
}

void check_metrics(const EngineMetrics& m) {
  for (const HistogramSample& h : m.histograms) {
    if (h.buckets.size() != h.bounds.size() + 1) __builtin_trap();
  }
}

void check_admission(const std::optional<AdmissionState>& s) {
  if (s && s->waiting.size() > AdmissionState::kMaxWaitingShown) __builtin_trap();
}

/// The request number a message names (0: none), as a receiver dispatches it.
std::uint64_t dispatch(const ToEngine& m) {
  return std::visit(Overloaded{
                        [](const GatewayHello&) -> std::uint64_t { return 0; },
                        [](const Submit& s) -> std::uint64_t {
                          check_request(s.request);
                          if (s.rid == 0) __builtin_trap();
                          return s.rid;
                        },
                        [](const Infer& i) -> std::uint64_t {
                          if (i.request.dtypes.size() != i.request.inputs.size() || i.rid == 0) __builtin_trap();
                          return i.rid;
                        },
                        [](const Cancel& c) { return c.rid; },
                        [](const Withdraw& w) { return w.rid; },
                        [](const QueryState& q) { return q.qid; },
                        [](const Release&) -> std::uint64_t { return 0; },
                    },
                    m);
}

std::uint64_t dispatch(const ToGateway& m) {
  return std::visit(Overloaded{
                        [](const EngineHello& h) -> std::uint64_t {
                          check_admission(h.admission);
                          return 0;
                        },
                        [](const Refused&) -> std::uint64_t { return 0; },
                        [](const SubmitAccepted& a) { return a.rid; },
                        [](const SubmitRejected& r) { return r.rid; },
                        [](const Event& e) { return e.rid; },
                        [](const InferDone& d) { return d.rid; },
                        [](const Withdrawn& w) { return w.rid; },
                        [](const StateReport& s) {
                          check_admission(s.admission);
                          check_metrics(s.metrics);
                          return s.qid;
                        },
                        [](const StatusReport& s) -> std::uint64_t {
                          check_admission(s.admission);
                          check_metrics(s.metrics);
                          return 0;
                        },
                    },
                    m);
}

/// The payload of `frame` (one whole frame).
std::string payload_of(const std::string& frame) {
  FrameReader r(kMaxFrameBytes);
  r.append(frame);
  auto p = r.next();
  if (!p || !p->ok() || r.next()) __builtin_trap();
  return std::string(**p);
}

template <class V>
void check(Decoded<V> (*decode)(std::string_view), std::string_view payload) {
  Decoded<V> m = decode(payload);
  if (!m.ok()) {
    if (m.error().message.empty()) __builtin_trap();
    return;
  }
  const std::uint64_t id = dispatch(*m);
  Decoded<V> again = decode(payload_of(encode_frame(*m)));
  if (!again.ok() || again->index() != m->index() || dispatch(*again) != id) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::size_t chunk = 1 + data[0] % 64;
  std::string_view bytes(reinterpret_cast<const char*>(data + 1), size - 1);
  FrameReader reader(1 << 16);
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
      // The view lives until the reader's next call: both decoders read it first.
      const std::string_view payload = **m;
      check<ToEngine>(&decode_to_engine, payload);
      check<ToGateway>(&decode_to_gateway, payload);
    }
  }
  return 0;
}
