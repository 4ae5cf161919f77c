// The engine wire protocol: every message of each direction as a struct, the
// two variants a side sends and receives, and the version both sides check
// in their hello. One gateway connection carries many requests, each named
// by a connection-local request number "rid" (the gateway's, >= 1).
//
//   gateway -> engine (ToEngine)             engine -> gateway (ToGateway)
//   hello  {v, secret, gateway?}             hello    {v, pid, models, tensor_models, devices,
//                                                      model_dir, config_digest, gateways,
//                                                      started_at, load_s, admission}
//                                            refused  {reason}  (instead of a hello; then closed)
//   submit {rid, request, resume?,           accepted {rid, submission} | rejected {rid, error}
//           admitted_before?}                event    {rid, event}     (until a terminal event)
//          (admitted_before: an engine that died admitted it; counted as granted again)
//   infer  {rid, request}                    accepted {rid, submission} | rejected {rid, error}
//          (a TorchScript tensor request)     infer_done {rid, result | error}   (once)
//   cancel {rid}                             (a FailedEvent cancelled, or an infer_done
//                                             with error cancelled, follows)
//   withdraw {rid}                           withdrawn {rid, ok}  (ok: it left the queue,
//          (a queued request, to place           no event follows; else it goes on)
//           it on another engine)
//   state  {qid}                             state    {qid, admission, histograms, counters,
//                                                      generated_tokens?}
//                                            status   {status, admission, histograms, counters,
//                                                      generated_tokens?} (every heartbeat)
//   release {}  (the supervising gateway's clean shutdown: exit once no gateway is connected)
//
// Each message is one frame (frame.hpp) whose payload is a JSON object with
// the message's type in "t"; wire/envelope.hpp encodes and decodes them. A
// frame that breaks the framing, a message that does not decode (unknown
// type, a missing or wrongly typed field), a wrong version or secret closes
// the connection with a logged reason; a gateway that cannot read a message
// about one of its requests fails that request instead. When a gateway's
// connection closes, the engine cancels that connection's requests.
//
// Pure data (no JSON here: a gateway header may name these); any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "api/events.hpp"
#include "api/service.hpp"
#include "api/types.hpp"
#include "common/error.hpp"
#include "wire/payloads.hpp"

namespace vg::wire {

inline constexpr std::int64_t kProtocolVersion = 3;  // 2: hello carries admission; withdraw. 3: exact logprobs

/// The largest frame payload either side sends or accepts (bytes). Tensor
/// data travels as base64 (4 bytes per 3), so one tensor request or result
/// carries at most about 48 MiB of float32 values; a larger one is refused
/// with 413 before it is sent (the gateway) or ends with that error (the
/// engine's outputs), and never breaks the connection.
inline constexpr std::size_t kMaxFrameBytes = 64u << 20;

/// The file beside its socket where an engine that cannot start (exit 1)
/// writes why, one line: its supervisor shows it as the reason the engine's
/// devices are left out. An engine removes it when it starts.
inline std::string start_failure_path(const std::string& socket_path) { return socket_path + ".failed"; }

// -- gateway -> engine

/// The gateway's first message. The engine checks `version` and `secret`
/// itself (a hello of another version still decodes).
struct GatewayHello {
  std::int64_t version = kProtocolVersion;
  std::string secret;
  std::string gateway;  ///< how the engine names it in its log; empty: not said
};

/// A completion request. `request.timeout_s` is what is left of its deadline.
struct Submit {
  std::uint64_t rid = 0;
  CompletionRequest request;
  std::optional<ResumeState> resume;  ///< after output was sent: continue after it
  bool admitted_before = false;       ///< an engine counted its start: grant it again, do not admit
};

/// A tensor request. `request.timeout_s` is what is left of its deadline.
struct Infer {
  std::uint64_t rid = 0;
  TensorInferRequest request;
};

struct Cancel {
  std::uint64_t rid = 0;
};

/// Take request `rid` back if it is still queued (to place it elsewhere).
struct Withdraw {
  std::uint64_t rid = 0;
};

/// Asks for a StateReport answering `qid`.
struct QueryState {
  std::uint64_t qid = 0;
};

/// The engine exits once no gateway is connected.
struct Release {};

using ToEngine = std::variant<GatewayHello, Submit, Infer, Cancel, Withdraw, QueryState, Release>;

// -- engine -> gateway

/// The engine's answer to a hello it accepts: what it serves.
struct EngineHello {
  std::int64_t version = kProtocolVersion;
  std::int64_t pid = 0;  ///< its process id; 0: not said
  std::vector<ModelInfo> models;
  std::vector<TensorModelInfo> tensor_models;  ///< its TorchScript models (also in `models`)
  std::vector<std::string> devices;            ///< the devices it serves, as it names them
  std::string model_dir;
  std::string config_digest;                ///< of the settings it runs with
  std::int64_t gateways = 0;                ///< other gateways it serves now
  double started_at = 0;                    ///< unix seconds of its start; 0: not said
  double load_s = 0;                        ///< seconds from its start to serving
  std::optional<AdmissionState> admission;  ///< its budgets and load from the start
};

/// The engine's answer to a hello it does not accept; the connection closes.
struct Refused {
  std::string reason;
};

/// A submit or infer taken.
struct SubmitAccepted {
  std::uint64_t rid = 0;
  Accepted submission;
};

/// A submit or infer refused; nothing of it goes on.
struct SubmitRejected {
  std::uint64_t rid = 0;
  Error error;
};

/// One of a request's events, in order; the last is terminal.
struct Event {
  std::uint64_t rid = 0;
  EngineEvent event;
};

/// A tensor request's end: its outputs or its error.
struct InferDone {
  std::uint64_t rid = 0;
  Result<TensorResult> result = Error(ErrorCode::kInternal, "no result");
};

/// The answer to a Withdraw: `ok` taken back (no event follows), else it goes on.
struct Withdrawn {
  std::uint64_t rid = 0;
  bool ok = false;
};

/// The answer to QueryState `qid`.
struct StateReport {
  std::uint64_t qid = 0;
  std::optional<AdmissionState> admission;
  EngineMetrics metrics;
};

/// The heartbeat: readiness, health, admission counters and metrics.
struct StatusReport {
  EngineStatus status;
  std::optional<AdmissionState> admission;
  EngineMetrics metrics;
};

using ToGateway = std::variant<EngineHello, Refused, SubmitAccepted, SubmitRejected, Event, InferDone, Withdrawn,
                               StateReport, StatusReport>;

// -- decoding errors

/// Why a frame's payload is not a message: its type ("t"; empty when even
/// that could not be read), the request it names ("rid"; 0 when none could
/// be read) and what is wrong ("bad submit: \"max_tokens\" = -5 is outside ...").
struct DecodeError {
  std::string type;
  std::uint64_t rid = 0;
  std::string message;
};

/// A decoded message of type M (ToEngine or ToGateway), or why there is none.
template <class M>
class [[nodiscard]] Decoded {
 public:
  Decoded(M message) : v_(std::in_place_index<0>, std::move(message)) {}        // NOLINT(google-explicit-constructor)
  Decoded(DecodeError error) : v_(std::in_place_index<1>, std::move(error)) {}  // NOLINT(google-explicit-constructor)
  bool ok() const { return v_.index() == 0; }
  M& value() & { return std::get<0>(v_); }
  const M& value() const& { return std::get<0>(v_); }
  M&& value() && { return std::get<0>(std::move(v_)); }
  M& operator*() & { return value(); }
  const M& operator*() const& { return value(); }
  M* operator->() { return &value(); }
  const M* operator->() const { return &value(); }
  const DecodeError& error() const& { return std::get<1>(v_); }

 private:
  std::variant<M, DecodeError> v_;
};

}  // namespace vg::wire
