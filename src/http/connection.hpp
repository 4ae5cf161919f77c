// One client connection: a coroutine that reads HTTP/1.1 requests (with a
// deadline on every read and write), routes them, and writes JSON or SSE.
// Internal to src/http.
//
// Thread-safety: a Connection lives on its own strand; every member function
// runs there (close() is posted there by the server). Only the EventQueue it
// hands to the Service is touched from engine threads.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "common/clock.hpp"
#include "http/page.hpp"
#include "http/server_state.hpp"
#include "http/traffic_gate.hpp"

// GCC 12 reports a false -Wmismatched-new-delete at the end of every
// asio::awaitable coroutine when built with sanitizers (a known GCC false
// positive with class-specific coroutine frame allocators): the frame's
// operator new and delete are asio's matching pair. This header is
// included only by the .cpp files of src/http that define coroutines.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

namespace vg::httpd {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;

/// The completion token of the coroutines: (error_code, result) tuples, no throws.
inline constexpr auto kAwait = net::as_tuple(net::use_awaitable);

using tcp = net::ip::tcp;
using Request = bhttp::request<bhttp::string_body>;

/// A complete non-streaming response.
struct Reply {
  int status = 200;
  std::string body;
  std::string content_type = "application/json";  ///< empty: no Content-Type (a 204)
  std::vector<std::pair<std::string, std::string>> headers;
  bool close = false;  ///< close the connection after it
};

/// The error body and status for `error`, with Retry-After when it has one.
Reply error_reply(const Error& error);

/// What a handler knows about the request it answers.
struct Exchange {
  unsigned version = 11;
  bool keep_alive = true;
  std::string request_id;
  std::string_view route = "other";  ///< the matched route's path, for metrics
  TimePoint start;
  bool response_started = false;  ///< status line sent: errors must go in-band
  bool chunked = false;           ///< streaming with chunked transfer encoding
  bool head = false;              ///< HEAD on a GET route: headers only
  TrafficTicket traffic;          ///< API key, X-Priority, Idempotency-Key (traffic_gate.hpp)
  HeaderList cors;                ///< CORS headers every response to this request carries (cors.hpp)
};

/// The API a completion request came through (decoding and response shape).
enum class CompletionApi { kCompletions, kInfer, kChat };

struct CompletionFlow;   // completion.cpp
struct TensorInferFlow;  // kserve_route.cpp
struct RequestLog;       // request_flow.hpp

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(std::shared_ptr<ServerState> state, tcp::socket socket);

  /// The connection's coroutine: serves requests until the connection closes.
  static net::awaitable<void> run(std::shared_ptr<Connection> self);
  /// Closes the socket and wakes the coroutine (server shutdown).
  void close();
  /// Wakes a coroutine waiting for engine events.
  void ring();
  /// The connection's strand.
  net::any_io_executor executor() { return socket_.get_executor(); }

 private:
  enum class Peer { kPresent, kPipelining, kGone };

  net::awaitable<void> serve_loop();
  net::awaitable<bool> serve(Request& request);
  net::awaitable<bool> dispatch(Exchange& ex, Request& request);
  /// Answers a failed read (see read_error()); `target`: the parser's target so far.
  net::awaitable<void> reply_read_error(beast::error_code ec, std::string target);
  /// Answers `error` with Connection: close, then lingers (see linger()).
  net::awaitable<void> reply_error_and_close(Error error);
  net::awaitable<bool> send(Exchange& ex, Reply reply);
  /// GET / (and /index.html) and the page's script and style sheet.
  net::awaitable<bool> serve_page_file(Exchange& ex, const Request& request, std::string_view path,
                                       const PageFile& file);
  /// connection_traffic.cpp: API key, rate limit and traffic headers; the
  /// refusal (401/429/400) to send, or nullopt to go on. Fills ex.traffic.
  std::optional<Reply> check_traffic(Exchange& ex, const Request& request, bool metered);
  void count_response(const Exchange& ex, int status);
  net::awaitable<void> linger();

  // kserve_route.cpp: the KServe v2 routes under /v2.
  net::awaitable<bool> serve_v2(Exchange& ex, Request& request, std::string_view path);
  /// POST /v2/models/{model}/infer: decodes the request, then runs it (run_v2_infer).
  net::awaitable<bool> serve_v2_infer(Exchange& ex, const Request& request, const std::string& model);
  /// Submits a decoded infer request, waits for its answer and sends it.
  net::awaitable<bool> run_v2_infer(Exchange& ex, TensorInferRequest& infer, RequestLog& log);
  /// Waits until the answer is in flow.result, or until the client leaves (which cancels the request).
  net::awaitable<void> wait_tensor_result(TensorInferFlow& flow);

  // completion.cpp
  net::awaitable<bool> serve_completion(Exchange& ex, const std::string& body, CompletionApi api);
  /// Relays the request's events until it ends, or until its client leaves.
  net::awaitable<void> relay_completion(CompletionFlow& flow);
  /// Applies the events that arrived; streaming, sends them as SSE.
  net::awaitable<void> relay_events(CompletionFlow& flow);
  /// Acts on what the socket said while the request waited for events.
  void note_peer(CompletionFlow& flow, Peer peer);
  /// The answer to a request that failed: an error reply, or in a stream an SSE error event.
  net::awaitable<bool> answer_failure(CompletionFlow& flow);
  /// The answer to a request that finished: the JSON body, or the stream's last chunks.
  net::awaitable<bool> answer_completion(CompletionFlow& flow);
  net::awaitable<bool> begin_stream(Exchange& ex, int queue_position);
  net::awaitable<bool> write_stream(Exchange& ex, std::string data);
  net::awaitable<bool> end_stream(Exchange& ex);
  /// Waits for a ring; with `watch` also returns when the client socket turns
  /// readable, and then says whether the client is gone.
  net::awaitable<Peer> wait_events(bool watch);
  net::awaitable<void> wait_ring();
  Peer peek_peer();

  void arm(double seconds);
  void disarm();

  std::shared_ptr<ServerState> state_;
  tcp::socket socket_;
  beast::flat_buffer buffer_;
  net::steady_timer deadline_;
  std::uint64_t deadline_gen_ = 0;
  bool timed_out_ = false;
  net::steady_timer doorbell_;
  bool rung_ = false;
  bool closing_ = false;
  bool linger_ = false;
};

}  // namespace vg::httpd
