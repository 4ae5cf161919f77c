// Test helpers for the HTTP server tests: a fake Service whose submissions
// the test drives (pushing engine events from the test thread), and a small
// Beast client with a deadline on every read so a server bug fails a test
// instead of hanging it.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <future>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "api/service.hpp"

namespace vg::test {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = net::ip::tcp;

constexpr auto kWait = std::chrono::seconds(10);  // generous: only a bug reaches it

class FakeHandle final : public RequestHandle {
 public:
  explicit FakeHandle(std::string id) : id_(std::move(id)), cancelled_future_(cancelled_.get_future().share()) {}
  void cancel() override {
    if (!was_cancelled_.exchange(true)) cancelled_.set_value();
  }
  const std::string& id() const override { return id_; }
  /// True once cancel() has been called, waiting up to kWait for it.
  bool wait_cancelled() const { return cancelled_future_.wait_for(kWait) == std::future_status::ready; }
  bool cancelled() const { return was_cancelled_; }

 private:
  std::string id_;
  std::atomic<bool> was_cancelled_{false};
  std::promise<void> cancelled_;
  std::shared_future<void> cancelled_future_;
};

struct FakeSubmission {
  CompletionRequest request;
  std::shared_ptr<EventSink> sink;
  std::shared_ptr<FakeHandle> handle;
};

class FakeService final : public Service {
 public:
  Result<Submission> submit(const CompletionRequest& request, std::shared_ptr<EventSink> sink) override {
    std::lock_guard lock(mu_);
    ++attempts_;
    last_request_ = request;
    if (knobs_.submit_error) return *knobs_.submit_error;
    auto handle = std::make_shared<FakeHandle>("req" + std::to_string(attempts_));
    if (knobs_.push_queued_on_submit) sink->push(QueuedEvent{knobs_.queue_position});  // on the I/O thread
    submissions_.push_back({request, sink, handle});
    cv_.notify_all();
    return Submission{handle, "fake-model", 3, knobs_.queue_position, 0, ""};
  }

  std::vector<ModelInfo> models() const override {
    if (throw_in_models) throw std::runtime_error("boom");
    ModelInfo m;
    m.id = "fake-model";
    m.family = "gpt2";
    return {m};
  }
  bool healthy(std::string* reason) const override {
    if (!is_healthy && reason != nullptr) *reason = "engine stuck";
    return is_healthy;
  }
  bool ready() const override { return is_ready; }
  /// One TorchScript model, "fake-tensor"; its infer answers at once with
  /// one output "y" = [1, 2].
  Result<TensorSubmission> submit_tensor(TensorInferRequest request, TensorDone done) override {
    if (request.model != "fake-tensor") return Service::submit_tensor(std::move(request), std::move(done));
    struct Handle final : TensorHandle {
      void cancel() override {}
    };
    TensorResult result;
    result.outputs.push_back(HostTensor{"y", {2}, {1.0f, 2.0f}});
    done(std::move(result));
    return TensorSubmission{std::make_shared<Handle>(), request.model, 0, 0};
  }
  Result<TensorModelInfo> tensor_model(const std::string& name) const override {
    if (name != "fake-tensor") return Service::tensor_model(name);
    TensorModelInfo info;
    info.id = name;
    return info;
  }
  // The HTTP tests drive no staged shutdown: there is nothing to drain.
  void begin_drain() override {}
  bool wait_idle(TimePoint) const override { return true; }
  void shutdown() override {}
  AdmissionState admission_state() const override {
    AdmissionState s;
    s.policy = "memory";
    s.queue_depth = 2;
    std::lock_guard lock(mu_);
    s.devices = devices_;
    return s;
  }
  /// What admission_state() reports as its devices (none by default).
  void set_devices(std::vector<DeviceState> devices) {
    std::lock_guard lock(mu_);
    devices_ = std::move(devices);
  }

  /// The next submission, waiting up to kWait for it.
  std::optional<FakeSubmission> next_submission() {
    std::unique_lock lock(mu_);
    if (!cv_.wait_for(lock, kWait, [this] { return !submissions_.empty(); })) return std::nullopt;
    FakeSubmission s = submissions_.front();
    submissions_.pop_front();
    return s;
  }
  /// The request of the last call to submit(), failed ones included.
  std::optional<CompletionRequest> last_request() const {
    std::lock_guard lock(mu_);
    return last_request_;
  }
  /// Calls to submit() so far, failed ones included.
  int submit_attempts() const {
    std::lock_guard lock(mu_);
    return attempts_;
  }

  struct Knobs {
    std::optional<Error> submit_error;
    bool push_queued_on_submit = false;
    int queue_position = 0;
  };
  void set(Knobs knobs) {
    std::lock_guard lock(mu_);
    knobs_ = std::move(knobs);
  }
  std::atomic<bool> throw_in_models{false};
  std::atomic<bool> is_healthy{true};
  std::atomic<bool> is_ready{true};

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<FakeSubmission> submissions_;
  Knobs knobs_;
  std::vector<DeviceState> devices_;
  int attempts_ = 0;
  std::optional<CompletionRequest> last_request_;
};

using Response = bhttp::response<bhttp::string_body>;

/// A blocking HTTP client whose reads give up after kWait.
class TestClient {
 public:
  explicit TestClient(std::uint16_t port) : stream_(ioc_) {
    stream_.connect(tcp::endpoint(net::ip::address_v4::loopback(), port));
  }

  void send_raw(std::string_view bytes) { net::write(stream_.socket(), net::buffer(bytes)); }

  void send(bhttp::verb verb, std::string_view target, std::string body = {},
            std::vector<std::pair<std::string, std::string>> headers = {}) {
    bhttp::request<bhttp::string_body> req{verb, target, 11};
    req.set(bhttp::field::host, "localhost");
    for (auto& [k, v] : headers) req.set(k, v);
    if (!body.empty() || verb == bhttp::verb::post) {
      req.set(bhttp::field::content_type, "application/json");
      req.body() = std::move(body);
    }
    req.prepare_payload();
    bhttp::write(stream_.socket(), req);
  }

  /// Reads one whole response; throws on a read error or after kWait.
  Response read() {
    Response res;
    const beast::error_code ec = run([&](auto handler) { bhttp::async_read(stream_, buffer_, res, handler); });
    if (ec) throw beast::system_error(ec);
    return res;
  }

  Response request(bhttp::verb verb, std::string_view target, std::string body = {},
                   std::vector<std::pair<std::string, std::string>> headers = {}) {
    send(verb, target, std::move(body), std::move(headers));
    return read();
  }

  /// Starts reading a response: headers only, then read_more() for body bytes.
  bhttp::response_parser<bhttp::string_body>& read_header() {
    parser_.emplace();
    parser_->body_limit(64 << 20);
    const beast::error_code ec = run([&](auto handler) { bhttp::async_read_header(stream_, buffer_, *parser_, handler); });
    if (ec) throw beast::system_error(ec);
    return *parser_;
  }
  /// Reads more of the body started by read_header(); returns the body so far.
  std::string read_more() {
    const beast::error_code ec = run([&](auto handler) { bhttp::async_read_some(stream_, buffer_, *parser_, handler); });
    if (ec) throw beast::system_error(ec);
    return parser_->get().body();
  }

  /// Waits until the server closes the connection; true if it did within kWait.
  bool wait_closed() {
    char byte;
    beast::error_code result;
    for (;;) {
      result = run([&](auto handler) { stream_.async_read_some(net::buffer(&byte, 1), handler); });
      if (result) break;
    }
    return result != beast::error::timeout;
  }

  void close() {
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.socket().close(ignored);
  }

 private:
  template <class Start>
  beast::error_code run(Start start) {
    beast::error_code result = net::error::would_block;
    stream_.expires_after(kWait);
    start([&](beast::error_code ec, std::size_t) { result = ec; });
    ioc_.restart();
    ioc_.run();
    return result;
  }

  net::io_context ioc_;
  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  std::optional<bhttp::response_parser<bhttp::string_body>> parser_;
};

/// The "data: ..." payloads and ": comment" lines of an SSE body, in order.
inline std::vector<std::string> sse_events(const std::string& body) {
  std::vector<std::string> out;
  std::size_t pos = 0;
  while (pos < body.size()) {
    const std::size_t end = body.find("\n\n", pos);
    if (end == std::string::npos) {
      out.push_back("<unterminated>" + body.substr(pos));
      break;
    }
    out.push_back(body.substr(pos, end - pos));
    pos = end + 2;
  }
  return out;
}

/// Polls `pred` until it holds or kWait passes (for state with no event to wait on).
template <class Pred>
bool eventually(Pred pred) {
  const auto until = std::chrono::steady_clock::now() + kWait;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::yield();
  }
  return true;
}

}  // namespace vg::test
