// HTTP front end: Beast over Asio, one C++20 coroutine per connection, a
// timeout on every read, a body size limit. Decodes requests into plain
// structs (http/json_codec), calls the Service, and writes JSON or SSE.
// Nothing here blocks an I/O thread on compute.
//
// Thread-safety: create() and the lifecycle methods are called from the
// main thread; sessions run on the server's own io_context threads.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "api/service.hpp"
#include "common/error.hpp"
#include "traffic/traffic_options.hpp"

namespace vg {
namespace metrics {
class ServerMetrics;
}

class HttpServer {
 public:
  struct Options {
    std::string host = "127.0.0.1";
    std::uint16_t port = 8000;             ///< 0: pick a free port (see port())
    int io_threads = 2;                    ///< threads running the io_context
    std::size_t body_limit_bytes = 1 << 20;///< larger bodies -> 413 body_too_large
    std::uint32_t header_limit_bytes = 16 * 1024;  ///< request line + headers; larger -> 431 header_too_large
    std::size_t target_limit_bytes = 8 * 1024;     ///< request target (URL); longer -> 414 uri_too_long
    double read_timeout_s = 30;            ///< headers+body must arrive within this -> 408
    double idle_timeout_s = 60;            ///< keep-alive connection idle limit
    int max_connections = 1024;            ///< further connections are closed at once
    /// Request counters are recorded here and GET /metrics renders it; null:
    /// nothing is recorded and /metrics answers 404. Must outlive the server.
    metrics::ServerMetrics* metrics = nullptr;
    /// Request log lines include the prompt and the generated text.
    bool log_request_text = false;
    /// Test hook: GET /v1/admission first calls malloc_trim(0) (glibc), so
    /// that RSS read right after it counts live memory (tools/soak.py).
    bool trim_heap_on_admission = false;
    /// API keys, rate limits, Idempotency-Key replay (docs/admission-and-memory.md "Traffic policies").
    traffic::TrafficOptions traffic;
    /// Origins whose browser requests get CORS headers (exact
    /// scheme://host[:port] values, or "*" for any); empty: CORS off.
    /// create() refuses a value that is not an origin (kConfig).
    std::vector<std::string> cors_allow_origins;
  };

  /// Binds and listens (errors: kConfig naming host:port), starts the I/O threads.
  static Result<std::unique_ptr<HttpServer>> create(const Options& options, Service& service);
  virtual ~HttpServer() = default;

  /// The bound port (useful with port 0).
  virtual std::uint16_t port() const = 0;
  /// Closes the listener; open connections keep being served. During a
  /// staged shutdown the listener stays open while work drains (the Service
  /// refuses new completions with 503), then this closes it.
  virtual void stop_accepting() = 0;
  /// Requests in flight (being answered or streamed) right now.
  virtual int active_requests() const = 0;
  /// Closes every connection and joins the I/O threads. Idempotent.
  virtual void stop() = 0;
};

}  // namespace vg
