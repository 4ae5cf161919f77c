// A test fixture with a redis-server of its own (redis_server.hpp) and an
// io_context run by one thread, on which the clients it makes run. The test
// body is another thread: it uses command_sync() and wait_connected().
#pragma once

#include <gtest/gtest.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "queue/redis_client.hpp"
#include "redis_server.hpp"

namespace vg::queue::testing {

/// Polls `done` until it holds or `limit` passes (polling with a deadline,
/// not a sleep used as synchronisation); true when it held.
template <class F>
bool eventually(F done, Duration limit = std::chrono::seconds(10)) {
  const TimePoint deadline = Clock::now() + limit;
  while (!done()) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

class RedisFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(RedisServer::find_binary().empty())
        << "redis-server is not on PATH: the queue tests start their own Redis. Install the Debian package "
           "redis-server (scripts/install-deps --test does).";
    std::string why = server_.start(server_args());
    ASSERT_EQ(why, "") << why;
    io_thread_ = std::thread([this] { io_.run(); });
  }

  void TearDown() override {
    for (auto& c : clients_) c->close();
    clients_.clear();
    guard_.reset();
    io_.stop();
    if (io_thread_.joinable()) io_thread_.join();
    server_.kill();
  }

  virtual std::vector<std::string> server_args() { return {}; }

  static RedisClient::Options options_for(const std::string& url_text) {
    auto url = parse_redis_url(url_text);
    EXPECT_TRUE(url.ok()) << url_text;
    RedisClient::Options options;
    if (url) options.url = *url;
    options.connect_timeout = std::chrono::seconds(2);
    options.command_timeout = std::chrono::seconds(5);
    options.reconnect_min = std::chrono::milliseconds(20);
    options.reconnect_max = std::chrono::milliseconds(200);
    return options;
  }

  /// A client (owned by the fixture, closed in TearDown), not waited for.
  RedisClient& make_client(const RedisClient::Options& options) {
    auto client = RedisClient::create(io_, options);
    EXPECT_TRUE(client.ok()) << (client ? "" : client.error().message);
    clients_.push_back(std::move(*client));
    return *clients_.back();
  }

  /// A client on `url` (default: the server's), connected.
  RedisClient& connect(const std::string& url = "") {
    RedisClient& client = make_client(options_for(url.empty() ? server_.url() : url));
    Status s = client.wait_connected(std::chrono::seconds(10));
    EXPECT_TRUE(s.ok()) << s.error().message;
    return client;
  }

  /// One command, waited for; fails the test on a transport error.
  static RedisValue run(RedisClient& client, RedisClient::Args args) {
    auto reply = client.command_sync(std::move(args), std::chrono::seconds(5));
    EXPECT_TRUE(reply.ok()) << reply.error().message;
    return reply ? *reply : RedisValue::error("(transport error)");
  }

  RedisServer server_;
  boost::asio::io_context io_;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> guard_ =
      boost::asio::make_work_guard(io_);
  std::thread io_thread_;
  std::vector<std::unique_ptr<RedisClient>> clients_;
};

}  // namespace vg::queue::testing
