// What the completion and KServe infer routes share for one submitted
// request: its EventQueue, which rings the connection on its strand; the
// queue's registration with the server, which also cancels the request when
// the session leaves before its end; and its request log line. Internal to
// src/http; used on the connection's strand.
#pragma once

#include <memory>
#include <string>
#include <utility>

#include "common/clock.hpp"
#include "common/error.hpp"
#include "http/connection.hpp"
#include "http/event_queue.hpp"
#include "http/request_log.hpp"
#include "http/server_state.hpp"

namespace vg::httpd {

/// An EventQueue whose wakes ring `connection` on its strand, while it lives.
inline std::shared_ptr<EventQueue> ringing_queue(Connection& connection, EventQueue::Wake when) {
  return std::make_shared<EventQueue>(
      [exec = connection.executor(), weak = connection.weak_from_this()] {
        net::post(exec, [weak] {
          if (auto self = weak.lock()) self->ring();
        });
      },
      when);
}

/// Owns the request's EventQueue registration (so a server stop detaches
/// it) and, until the request has ended, its engine handle: leaving early
/// (exception, shutdown) cancels it.
template <class Handle>
struct RequestScope {
  ServerState& state;
  std::shared_ptr<EventQueue> queue;
  bool registered = false;
  std::shared_ptr<Handle> handle;
  bool ended = false;

  RequestScope(ServerState& s, std::shared_ptr<EventQueue> q) : state(s), queue(std::move(q)) {
    registered = state.add_queue(queue.get());
    if (!registered) queue->detach();
  }
  RequestScope(const RequestScope&) = delete;
  RequestScope& operator=(const RequestScope&) = delete;
  ~RequestScope() {
    if (handle && !ended) {
      try {
        handle->cancel();
      } catch (...) {  // a destructor must not throw; the engine reports its own failures
      }
    }
    queue->detach();
    if (registered) state.remove_queue(queue.get());
  }
};

/// A request's log line, written once, when the request ends.
struct RequestLog {
  RequestLogLine line;
  TimePoint start;  ///< the request's arrival

  /// Writes the line (log_request_end).
  void end(const char* outcome, std::string reason, int status) {
    log_request_end(line, start, outcome, std::move(reason), status);
  }
  /// A request that failed with `e` before it ran, with the bytes it needed.
  void failed(const Error& e) {
    if (e.needed_bytes) line.reserved_bytes = *e.needed_bytes;
    end("failed", error_type(e.code), http_status(e.code));
  }
};

}  // namespace vg::httpd
