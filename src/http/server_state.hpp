// State the HTTP server shares with its connections: options, the Service,
// counters, and the registries stop() uses to close connections and detach
// event queues. Internal to src/http.
//
// Thread-safety: every member function may be called from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include "http/cors.hpp"
#include "http/http_server.hpp"
#include "http/traffic_gate.hpp"

namespace vg::httpd {

class EventQueue;

class ServerState {
 public:
  ServerState(Service& service, const HttpServer::Options& options)
      : service_(service),
        options_(options),
        traffic_(options.traffic, options.metrics),
        cors_{options.cors_allow_origins} {}

  Service& service() const { return service_; }
  const HttpServer::Options& options() const { return options_; }
  /// API keys, rate limits, priorities and Idempotency-Keys of this server.
  TrafficGate& traffic() { return traffic_; }
  /// The allowed origins of cross-origin browser requests (immutable).
  const CorsPolicy& cors() const { return cors_; }

  /// Requests being answered right now.
  std::atomic<int> active_requests{0};

  /// Registers a connection with the function that closes it (it must post to
  /// the connection's strand). Returns 0 when the server is stopping or the
  /// max_connections limit is reached: the caller then closes the socket.
  std::uint64_t add_connection(std::function<void()> closer);
  /// Unregisters a connection when its coroutine ends.
  void remove_connection(std::uint64_t id);
  /// Runs every registered closer and refuses new connections from now on.
  void close_all_connections();
  /// Waits until no connection is registered or `limit` has passed.
  bool wait_no_connections(std::chrono::milliseconds limit);
  /// Drops the closers of connections that never ended (their executors must
  /// not outlive the io_context). Call after the I/O threads have stopped.
  void forget_connections();

  /// Registers a live event queue; false when the server is stopping (the
  /// caller then detaches it at once).
  bool add_queue(EventQueue* queue);
  void remove_queue(EventQueue* queue);
  /// Detaches every registered queue: later engine pushes touch nothing of ours.
  void detach_all_queues();

 private:
  Service& service_;
  const HttpServer::Options options_;
  TrafficGate traffic_;
  const CorsPolicy cors_;

  std::mutex mu_;
  std::condition_variable no_connections_;
  std::uint64_t next_id_ = 1;
  bool closing_ = false;
  std::unordered_map<std::uint64_t, std::function<void()>> connections_;
  std::unordered_set<EventQueue*> queues_;
};

}  // namespace vg::httpd
