// The parts of QueueWorker that its source files share: a taken request's
// record (Held) and the sink its engine events go through. queue_worker.cpp
// (pulling, claiming, heartbeat) and queue_worker_events.cpp (writing each
// request's events to its gateway) include it; nothing outside queue/ does.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "queue/queue_worker.hpp"

namespace vg::queue {

/// Entries of a gateway's reply stream kept at most (approximate bound, MAXLEN ~).
inline constexpr std::int64_t kReplyMaxLen = 100000;

/// One request this engine took, and how to report it.
struct QueueWorker::Held {
  std::string model;
  std::string rid;
  std::string request_id;  // its X-Request-Id, for logs
  std::string gateway;
  std::string stream;
  std::string entry;
  std::int64_t epoch = 0;
  bool poison = false;

  /// An event waiting to be written.
  struct Out {
    std::string event;  // JSON
    std::string ids;    // "id,id," of choice 0 it adds
    std::string flags;  // "p", "o", "t", "c" (see kEmitScript)
  };
  std::mutex mu;
  std::shared_ptr<RequestHandle> handle;     // guarded by mu
  bool stopped = false;                      // guarded by mu: fenced, cancelled or lost: write nothing more
  bool terminal_pushed = false;              // guarded by mu: its last event is in the outbox (or written)
  std::deque<Out> outbox;                    // guarded by mu: events not yet written, in order
  std::size_t in_flight = 0;                 // guarded by mu: events of the outbox's head being written
  std::int64_t next_seq = 1;                 // guarded by mu: sequence number of outbox.front()
  std::optional<TimePoint> gateway_missing;  // guarded by mu: since when its gateway's alive key is missing
};

/// Pushes a held request's events into its outbox (QueueWorker::send writes them).
/// Pushes a held request's events into its outbox (QueueWorker::send writes them).
class QueueSink final : public EventSink {
 public:
  QueueSink(QueueWorker* worker, std::shared_ptr<QueueWorker::Held> held) : worker_(worker), held_(std::move(held)) {}
  void push(EngineEvent event) override { worker_->enqueue(held_, std::move(event)); }

 private:
  QueueWorker* worker_;
  std::shared_ptr<QueueWorker::Held> held_;
};

}  // namespace vg::queue
