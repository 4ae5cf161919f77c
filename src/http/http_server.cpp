// HttpServer::create and its implementation: the io_context and its threads,
// the acceptor and its accept loop, and the shutdown order.
//
// Thread-safety: the public methods are called from the owner's thread (not
// from an I/O thread); the accept loop runs on the acceptor's strand.
#include <condition_variable>
#include <future>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include <spdlog/spdlog.h>

#include "common/origin.hpp"
#include "http/connection.hpp"

namespace vg {
namespace {

using namespace vg::httpd;

constexpr auto kAwait = net::as_tuple(net::use_awaitable);
constexpr auto kShutdownGrace = std::chrono::seconds(2);

void log_coroutine_exit(std::exception_ptr e, const char* what) {
  if (!e) return;
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    spdlog::error("http: {} ended with an exception: {}", what, ex.what());
  } catch (...) {
    spdlog::error("http: {} ended with an unknown exception", what);
  }
}

class HttpServerImpl final : public HttpServer {
 public:
  HttpServerImpl(const Options& options, Service& service)
      : work_(net::make_work_guard(ioc_)),
        acceptor_(net::make_strand(ioc_)),
        state_(std::make_shared<ServerState>(service, options)) {}

  ~HttpServerImpl() override { stop(); }

  Status listen() {
    const Options& opt = state_->options();
    const std::string where = opt.host + ":" + std::to_string(opt.port);
    beast::error_code ec;
    tcp::resolver resolver(ioc_);
    auto endpoints = resolver.resolve(opt.host, std::to_string(opt.port),
                                      tcp::resolver::passive | tcp::resolver::numeric_service, ec);
    if (ec || endpoints.empty()) {
      return Error(ErrorCode::kConfig, "cannot resolve " + where + ": " + ec.message());
    }
    const tcp::endpoint endpoint = endpoints.begin()->endpoint();
    acceptor_.open(endpoint.protocol(), ec);
    if (!ec) acceptor_.set_option(net::socket_base::reuse_address(true), ec);
    if (!ec) acceptor_.bind(endpoint, ec);
    if (!ec) acceptor_.listen(net::socket_base::max_listen_connections, ec);
    if (ec) return Error(ErrorCode::kConfig, "cannot listen on " + where + ": " + ec.message());
    port_ = acceptor_.local_endpoint().port();
    return {};
  }

  void start() {
    net::co_spawn(acceptor_.get_executor(), accept_loop(),
                  [](std::exception_ptr e) { log_coroutine_exit(e, "accept loop"); });
    for (int i = 0; i < state_->options().io_threads; ++i) {
      threads_.emplace_back([this] { run_io(); });
    }
    spdlog::info("http: listening on {}:{} ({} I/O threads)", state_->options().host, port_,
                 state_->options().io_threads);
  }

  std::uint16_t port() const override { return port_; }

  void stop_accepting() override {
    {
      std::lock_guard lock(mu_);
      if (stopped_) return;
    }
    auto closed = std::make_shared<std::promise<void>>();
    auto done = closed->get_future();
    net::post(acceptor_.get_executor(), [this, closed] {
      beast::error_code ignored;
      acceptor_.close(ignored);
      closed->set_value();
    });
    if (done.wait_for(kShutdownGrace) != std::future_status::ready) {
      spdlog::warn("http: stop_accepting: the I/O threads did not close the listener in time");
      return;
    }
    spdlog::info("http: stopped accepting connections");
  }

  int active_requests() const override { return state_->active_requests.load(); }

  void stop() override {
    {
      std::lock_guard lock(mu_);
      if (stopped_) return;
      stopped_ = true;
    }
    net::post(acceptor_.get_executor(), [this] {
      beast::error_code ignored;
      acceptor_.close(ignored);
    });
    // Close every connection; sessions cancel their requests and end once the
    // engines confirm, which we wait for only a short while.
    state_->close_all_connections();
    if (!state_->wait_no_connections(kShutdownGrace)) {
      spdlog::warn("http: connections still open after {} s; stopping anyway",
                   std::chrono::duration_cast<std::chrono::seconds>(kShutdownGrace).count());
    }
    work_.reset();
    ioc_.stop();
    for (std::thread& t : threads_) t.join();
    threads_.clear();
    // Engines may still hold our event queues: from now on their pushes are dropped.
    state_->detach_all_queues();
    state_->forget_connections();
    spdlog::info("http: stopped");
  }

 private:
  void run_io() {
    for (;;) {
      try {
        ioc_.run();
        return;
      } catch (const std::exception& e) {  // handlers should not throw; keep serving if one does
        spdlog::error("http: I/O thread caught an exception: {}", e.what());
      }
    }
  }

  net::awaitable<void> accept_loop() {
    net::steady_timer backoff(acceptor_.get_executor());
    for (;;) {
      auto [ec, socket] = co_await acceptor_.async_accept(net::any_io_executor(net::make_strand(ioc_)), kAwait);
      if (ec) {
        if (!acceptor_.is_open() || ec == net::error::operation_aborted) co_return;
        spdlog::warn("http: accept failed: {}", ec.message());
        backoff.expires_after(std::chrono::milliseconds(50));  // e.g. out of file descriptors
        co_await backoff.async_wait(kAwait);
        continue;
      }
      spawn_connection(std::move(socket));
    }
  }

  void spawn_connection(tcp::socket socket) {
    beast::error_code ignored;
    socket.set_option(tcp::no_delay(true), ignored);
    auto conn = std::make_shared<Connection>(state_, std::move(socket));
    auto exec = conn->executor();
    const std::uint64_t id = state_->add_connection([exec, weak = std::weak_ptr<Connection>(conn)] {
      net::post(exec, [weak] {
        if (auto c = weak.lock()) c->close();
      });
    });
    if (id == 0) {
      spdlog::warn("http: connection refused: {} connections open (max_connections)",
                   state_->options().max_connections);
      net::post(exec, [conn] { conn->close(); });
      return;
    }
    net::co_spawn(exec, Connection::run(conn),
                  [state = state_, id](std::exception_ptr e) {
                    log_coroutine_exit(e, "connection");
                    state->remove_connection(id);
                  });
  }

  net::io_context ioc_;
  net::executor_work_guard<net::io_context::executor_type> work_;
  tcp::acceptor acceptor_;
  std::shared_ptr<ServerState> state_;
  std::vector<std::thread> threads_;
  std::uint16_t port_ = 0;

  std::mutex mu_;
  bool stopped_ = false;
};

Status validate(const HttpServer::Options& o) {
  if (o.io_threads < 1) return Error(ErrorCode::kConfig, "io_threads must be >= 1");
  if (o.body_limit_bytes < 1) return Error(ErrorCode::kConfig, "body_limit_bytes must be >= 1");
  if (!(o.read_timeout_s > 0)) return Error(ErrorCode::kConfig, "read_timeout_s must be > 0");
  if (!(o.idle_timeout_s > 0)) return Error(ErrorCode::kConfig, "idle_timeout_s must be > 0");
  if (o.max_connections < 1) return Error(ErrorCode::kConfig, "max_connections must be >= 1");
  for (const std::string& origin : o.cors_allow_origins) {
    if (Status st = check_origin(origin); !st) return Error(ErrorCode::kConfig, "cors_allow_origin: " + st.error().message);
  }
  return {};
}

}  // namespace

Result<std::unique_ptr<HttpServer>> HttpServer::create(const Options& options, Service& service) {
  if (Status st = validate(options); !st) return st.error();
  auto server = std::make_unique<HttpServerImpl>(options, service);
  if (Status st = server->listen(); !st) return st.error();
  server->start();
  return std::unique_ptr<HttpServer>(std::move(server));
}

}  // namespace vg
