// Flight: one computation shared by every client that sent the same
// Idempotency-Key (docs/admission-and-memory.md "Traffic policies"). It is the EventSink the
// engine pushes into: it records the events and forwards each to every
// attached client's sink. A client that attaches late is first replayed
// what was recorded, then follows, so a streaming retry sees the same token
// stream and a plain one gets the same result. The work is cancelled only
// when every attached client has gone.
//
// Thread-safety: every member is thread-safe. push() runs on the engine
// thread; attach() and the attachments' cancel() on I/O threads. One
// internal mutex orders recording, replay and forwarding; the work's
// cancel() and the end callback are called outside it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "api/events.hpp"

namespace vg::traffic {

/// What the client that started the work learned at submission; attached
/// clients answer with the same values.
struct FlightOrigin {
  std::string model;
  int prompt_tokens = 0;
  int queue_position = 0;
  std::int64_t cost_bytes = 0;
};

class Flight final : public EventSink, public std::enable_shared_from_this<Flight> {
 public:
  /// `id` is the work's request id (RequestHandle::id() of every attachment).
  /// `on_end(flight, completed)` runs once, after the terminal event was
  /// forwarded, on the pushing thread: completed is true for a FinishedEvent.
  using EndCallback = std::function<void(const Flight& flight, bool completed)>;
  static std::shared_ptr<Flight> create(std::string id, EndCallback on_end = {});

  /// Engine side: records `event` and forwards it to every attached sink.
  /// Events after the terminal one are dropped.
  void push(EngineEvent event) override;

  /// Attaches `sink`: replays the recorded events into it (under the lock, so
  /// none is missed or doubled), then forwards later ones. The returned
  /// handle's cancel() (or its destruction) detaches it; the last detach
  /// before the end cancels the work.
  std::shared_ptr<RequestHandle> attach(std::shared_ptr<EventSink> sink);

  /// The work started: its handle and what its submission said. If every
  /// client has already gone, the work is cancelled at once.
  void start(std::shared_ptr<RequestHandle> work, FlightOrigin origin);
  /// The work could not be submitted: ends the flight with `error` (every
  /// attached client receives it as a FailedEvent).
  void fail(Error error);

  FlightOrigin origin() const;
  bool ended() const;
  /// Clients attached now.
  int attached() const;
  const std::string& id() const { return id_; }

 private:
  class Attachment;
  Flight(std::string id, EndCallback on_end) : id_(std::move(id)), on_end_(std::move(on_end)) {}
  void detach(std::uint64_t token);

  const std::string id_;
  EndCallback on_end_;  // called once, outside mu_

  mutable std::mutex mu_;
  std::vector<EngineEvent> recorded_;  // guarded by mu_; consecutive QueuedEvents collapse
  std::vector<std::pair<std::uint64_t, std::shared_ptr<EventSink>>> sinks_;  // guarded by mu_
  std::uint64_t next_token_ = 1;            // guarded by mu_
  bool ended_ = false;                      // guarded by mu_
  bool abandoned_ = false;                  // guarded by mu_: every client left before start()
  std::shared_ptr<RequestHandle> work_;     // guarded by mu_
  FlightOrigin origin_;                     // guarded by mu_
};

}  // namespace vg::traffic
