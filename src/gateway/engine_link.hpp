// The gateway's link to one engine process: the hello on a new connection
// (secret, protocol version, what the engine serves), then typed messages
// over a wire::Channel both ways: submits, cancels, withdraws, state
// queries and releases out; status heartbeats, answers, events and tensor
// results in, decoded here so that the JSON of the wire stays in this file's
// .cpp. Torch-free.
//
// Threads: say_hello() on the calling thread (it blocks up to 5 s). An
// EngineLink's send methods, flush() and close() from any thread; its
// callbacks run on the channel's reader thread, one at a time, and
// on_close once after the last message (wire/channel.hpp).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "api/events.hpp"
#include "api/service.hpp"
#include "api/types.hpp"
#include "common/error.hpp"
#include "wire/payloads.hpp"

namespace vg::wire {
class Channel;
}

namespace vg::gateway {

/// What an engine's hello says about it.
struct EngineHello {
  std::vector<ModelInfo> models;
  std::vector<TensorModelInfo> tensor_models;  ///< its TorchScript models (also in `models`)
  std::vector<std::string> devices;            ///< the devices it serves, as it names them
  std::int64_t pid = 0;                        ///< its process id; 0: not said
  std::string config_digest;                   ///< the digest of its settings
  std::int64_t gateways = 0;                   ///< other gateways it serves now
  double started_at = 0;                       ///< unix seconds; 0: not said
  std::optional<AdmissionState> admission;     ///< its admission state, when it sent one
};

/// What came back from an engine for this gateway's hello.
struct HelloReply {
  bool gone = false;    ///< the engine closed before reading it (it is exiting)
  std::string refused;  ///< why there is no hello (empty when there is one)
  /// A hello came but parts of it could not be read ("bad hello: ..."):
  /// `hello` holds what could; empty when all could.
  std::string invalid;
  EngineHello hello;
};

/// Sends this gateway's hello, with the secret read from `secret_path`, on
/// the connected socket `fd` and reads the engine's answer (5 s at most).
/// The caller keeps `fd`.
HelloReply say_hello(int fd, const std::string& secret_path);

/// Metrics an engine reports cumulatively with its status and state replies.
struct EngineMetrics {
  std::vector<wire::HistogramSample> histograms;  ///< the ones that could be read
  struct Counter {
    std::vector<std::string> labels;  ///< its label values, up to the first that is not a string
    double value = 0;
  };
  std::vector<Counter> tensor_requests;  ///< tensor_requests_total by label values
  std::optional<double> generated_tokens;
};

/// A heartbeat: its status and admission state, each when it sent one
/// (`admission_sent` with an `admission` that could not be read is nullopt).
struct StatusMessage {
  std::optional<wire::EngineStatus> status;
  bool admission_sent = false;
  std::optional<AdmissionState> admission;
  EngineMetrics metrics;
};

/// The answer to a state query `qid` (nullopt: the reply named none).
struct StateReply {
  std::optional<std::uint64_t> qid;
  std::optional<AdmissionState> admission;
  EngineMetrics metrics;
};

/// An engine's answer to a submit, or the gateway's own answer for a
/// submit whose engine went away before answering.
struct SubmitAnswer {
  enum class Kind {
    kAccepted,
    kRejected,
    kClosed,   ///< the engine went away before it answered: send it elsewhere
    kCrashed,  ///< the same, for the last time it may (--max-crash-retries)
  };
  Kind kind = Kind::kRejected;
  /// Accepted: what it said (an error when its submission could not be read).
  Result<wire::Accepted> accepted = Error(ErrorCode::kInternal, "no submission");
  /// Accepted: the admission cost it gave, when it gave one (bytes).
  std::optional<std::int64_t> cost_bytes;
  /// Rejected: the refusal (kInternal when it gave none, or one that could not be read).
  Error error;
};

/// The answer to a withdraw: `ok` taken back, else admitted meanwhile.
struct WithdrawnMessage {
  bool ok = false;
};

/// A tensor request's end. `unreadable`: its result could not be read
/// (`result` then holds the kInternal error the client gets).
struct InferDoneMessage {
  Result<TensorResult> result = Error(ErrorCode::kInternal, "the engine sent no tensor result");
  std::string unreadable;
};

/// A request's event (an error when it could not be read).
struct EventMessage {
  Result<EngineEvent> event = Error(ErrorCode::kInvalidRequest, "no event");
};

/// A message from an engine, decoded. `rid`: the request it is about (0: none).
struct EngineMessage {
  std::uint64_t rid = 0;
  std::variant<std::monostate, StatusMessage, StateReply, SubmitAnswer, WithdrawnMessage, InferDoneMessage,
               EventMessage>
      body;
};

/// What a submit carries: the request, or a tensor request (then `request`
/// is ignored), the seconds left of its deadline and how it resumes.
struct SubmitOrder {
  std::uint64_t rid = 0;
  const CompletionRequest* request = nullptr;
  const TensorInferRequest* tensor = nullptr;
  double timeout_s = 0;
  std::optional<wire::ResumeState> resume;  ///< after output was sent: continue after it
  bool admitted_before = false;             ///< an engine counted its start: grant it again, do not admit
};

class EngineLink {
 public:
  using OnMessage = std::function<void(EngineMessage)>;
  using OnClose = std::function<void(const std::string& reason)>;

  /// Takes the connected socket `fd` (after its hello); nothing is read until start().
  static std::shared_ptr<EngineLink> adopt(int fd);
  /// Starts the reader: `on_message` per message, `on_close` once at the end.
  void start(OnMessage on_message, OnClose on_close);

  /// `direct`: written on the caller's thread when the socket takes it
  /// (wire::Send::kDirect), for a submit a caller waits on; else queued.
  void submit(const SubmitOrder& order, bool direct);
  void cancel(std::uint64_t rid);
  void withdraw(std::uint64_t rid);
  void query_state(std::uint64_t qid);
  /// Asks the engine to exit once no other gateway uses it.
  void release();
  /// Waits until everything sent was written, at most `timeout_s`.
  bool flush(double timeout_s);
  /// Closes the connection; on_close follows with `reason`. Idempotent.
  void close(const std::string& reason);

 private:
  explicit EngineLink(std::shared_ptr<wire::Channel> channel) : channel_(std::move(channel)) {}
  std::shared_ptr<wire::Channel> channel_;
};

/// The gateway's own answer to a submit whose engine closed before answering.
SubmitAnswer closed_answer(bool last_crash);

}  // namespace vg::gateway
