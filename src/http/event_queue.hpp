// EventQueue: the EventSink a session hands to Service::submit. The engine
// thread pushes; the session coroutine takes. push() never blocks on I/O: it
// appends under a short mutex and calls the session's wake function, which
// only posts a handler to the session's strand. A session that answers only
// at the end (a non-streaming completion) asks to be woken only by the
// request's terminal event: one wake-up per request instead of one per
// decode step.
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
  /// When to wake the session.
  enum class Wake {
    kEachEvent,  ///< at the first event after each take()
    kTerminal,   ///< only at the terminal event (FinishedEvent, FailedEvent); the others wait for it
  };

  /// `wake` runs, under the queue's lock, when `when` says, until detach().
  explicit EventQueue(std::function<void()> wake, Wake when = Wake::kEachEvent)
      : wake_(std::move(wake)), when_(when) {}

  /// Appends the event and wakes the session; dropped once detached. Wakes
  /// are coalesced: while a wake is on its way and not yet followed by a
  /// take(), take() will return this event with the earlier ones.
  void push(EngineEvent event) override {
    std::lock_guard lock(mu_);
    if (!wake_) return;
    const bool terminal = is_terminal(event);
    events_.push_back(std::move(event));
    if (woken_ || (when_ == Wake::kTerminal && !terminal)) return;
    woken_ = true;
    wake_();
  }

  /// Removes and returns every event pushed so far, in order.
  std::vector<EngineEvent> take() {
    std::lock_guard lock(mu_);
    std::vector<EngineEvent> out;
    out.swap(events_);
    woken_ = false;
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
  const Wake when_;
  bool woken_ = false;  // a wake is on its way: no other until the next take()
};

}  // namespace vg::httpd
