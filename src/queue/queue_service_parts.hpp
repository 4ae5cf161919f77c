// The parts of QueueService that its source files share: the records of
// an engine and of a request, the request handle, and small helpers.
// queue_service.cpp (start, views, lifecycle), queue_submit.cpp (adding
// and cancelling requests), queue_replies.cpp (the reply stream) and
// queue_monitor.cpp (registry, re-adds, queue timeouts) include it; nothing
// outside queue/ does. The same threads and lock as QueueService.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "queue/queue_service.hpp"
#include "tracking/request_tracker.hpp"

namespace vg::queue {

/// An engine registration larger than this is ignored (bytes).
inline constexpr std::int64_t kMaxRegistrationBytes = 1 << 20;

/// Milliseconds since the Unix epoch (system clock).
std::int64_t unix_ms();

/// kOverloaded (503) with its Retry-After (seconds).
Error overloaded(std::string message, double retry_after_s);

/// Tokens a prompt can have at most: byte-level tokenizers give at most one
/// token per byte; a chat template adds its markers around each message.
std::int64_t prompt_tokens_bound(const CompletionRequest& r);

/// One entry of a reply stream (fields rid, epoch, ev) or of a request's
/// history (epoch, ev). id is null when the entry itself is malformed; ok
/// when it has an ev and an integer epoch. Points into the parsed value.
struct EventEntry {
  const std::string* id = nullptr;
  const std::string* rid = nullptr;
  const std::string* ev = nullptr;
  std::int64_t epoch = 0;
  bool ok = false;
};
EventEntry parse_event_entry(const RedisValue& entry);

/// The 503 of a follower whose followed request left the shared queue.
Error lost_follower();

/// One engine's registration, as last read.
struct QueueService::Engine {
  std::string id;
  std::string host;
  std::int64_t pid = 0;
  std::vector<std::string> devices;
  std::vector<ModelInfo> models;
  AdmissionState admission;
  bool ready = false;
  bool stale = false;  // no registration for --engine-stale: listed, never used
  double started_at = 0;
  std::int64_t at_ms = 0;
};

/// A request placed in the shared queue, until its answer has arrived.
struct QueueService::Req {
  std::string rid;
  std::string model;
  std::string stream;
  int cost_class = 0;
  std::int64_t cost_bytes = 0;
  CompletionRequest request;
  std::shared_ptr<EventSink> sink;
  tracking::RequestTracker track;  // what its client was sent: what a resume continues after
  bool taken = false;      // an engine's event arrived, or a cancel found it taken
  std::int64_t epoch = 0;  // the newest delivery seen
  TimePoint added_at{};
  std::string idem_key;  // P:idem:<sha256 of the scoped Idempotency-Key>; "" without one
  bool readd = false;    // an add after Redis lost it (a copy's flag, in verify_requests)
  // Guarded by the service's mu_ (set in submit() once the add answered):
  bool follower = false;                   // follows another gateway's request with the same key
  std::string member;                      // "gw|rid": its name in that request's follower set
  std::vector<std::string> followed;       // that request's hash, ids, waiting counter, class stream
  std::string owner_alive;                 // that request's gateway's alive key
  std::optional<TimePoint> owner_missing;  // since when that key is missing (monitor thread)
  bool replaying = false;                  // submit() still pushes recorded events: live ones wait in `early`
  std::vector<std::pair<std::int64_t, std::string>> early;
};

class QueueHandle final : public RequestHandle {
 public:
  QueueHandle(QueueService* service, std::shared_ptr<QueueService::Req> req, std::string id)
      : service_(service), req_(std::move(req)), id_(std::move(id)) {}
  void cancel() override {
    if (auto r = req_.lock()) service_->cancel(r);
  }
  const std::string& id() const override { return id_; }

 private:
  QueueService* service_;
  std::weak_ptr<QueueService::Req> req_;
  std::string id_;
};

}  // namespace vg::queue
