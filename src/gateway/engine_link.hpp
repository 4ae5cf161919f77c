// The gateway's link to one engine process: the hello on a new connection
// (secret, protocol version, what the engine serves), then the protocol's
// typed messages (wire/protocol.hpp) over a wire::Channel both ways:
// submits, cancels, withdraws, state queries and releases out; status
// heartbeats, answers, events and tensor results in, each decoded into a
// wire::ToGateway (or the DecodeError saying why it could not be). Torch-free.
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

#include "api/types.hpp"
#include "common/error.hpp"
#include "wire/protocol.hpp"

namespace vg::wire {
class Channel;
}

namespace vg::gateway {

/// What came back from an engine for this gateway's hello.
struct HelloReply {
  bool gone = false;    ///< the engine closed before reading it (it is exiting)
  std::string refused;  ///< why there is no hello (empty when there is one)
  /// A hello came but could not be read ("bad hello: ..."); `hello` is then empty.
  std::string invalid;
  wire::EngineHello hello;
};

/// Sends this gateway's hello, with the secret read from `secret_path`, on
/// the connected socket `fd` and reads the engine's answer (5 s at most).
/// The caller keeps `fd`.
HelloReply say_hello(int fd, const std::string& secret_path);

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
  wire::Accepted accepted;  ///< kAccepted: what the engine said (its admission cost among it)
  Error error;              ///< kRejected: the refusal
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
  /// A message from the engine, or why one could not be read.
  using OnMessage = std::function<void(wire::Decoded<wire::ToGateway>)>;
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
