// EventQueue: the EventSink a session hands to Service::submit. The engine
// thread pushes; the session coroutine takes. push() never blocks on I/O: it
// appends under a short mutex and calls the session's wake function, which
// only posts a handler to the session's strand.
//
// Thread-safety: push() from any thread; take() and detach() from any thread
// (the session calls them on its strand; the server calls detach() at stop).
// Size: at most one event per decode step of one request plus a few, so the
// queue is bounded by the request's max_tokens.
#pragma once

#include <functional>
#include <mutex>
#include <vector>

#include "api/events.hpp"

namespace vg::httpd {

class EventQueue final : public EventSink {
 public:
  /// `wake` runs after a push into an empty queue, under the queue's lock,
  /// until detach().
  explicit EventQueue(std::function<void()> wake) : wake_(std::move(wake)) {}

  /// Appends the event and wakes the session; dropped once detached. Wakes
  /// are coalesced: while earlier events wait to be taken, a wake is already
  /// on its way and take() will return this event with them.
  void push(EngineEvent event) override {
    std::lock_guard lock(mu_);
    if (!wake_) return;
    const bool was_empty = events_.empty();
    events_.push_back(std::move(event));
    if (was_empty) wake_();
  }

  /// Removes and returns every event pushed so far, in order.
  std::vector<EngineEvent> take() {
    std::lock_guard lock(mu_);
    std::vector<EngineEvent> out;
    out.swap(events_);
    return out;
  }

  /// Stops waking the session and drops later events. Idempotent. After it
  /// returns, push() no longer touches the session or its executor.
  void detach() {
    std::function<void()> old;
    std::lock_guard lock(mu_);
    old.swap(wake_);
    events_.clear();
  }

 private:
  std::mutex mu_;
  std::vector<EngineEvent> events_;
  std::function<void()> wake_;  // empty once detached
};

}  // namespace vg::httpd
