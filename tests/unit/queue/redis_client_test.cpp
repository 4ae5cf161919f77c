// RedisClient against a real redis-server: round trips, AUTH, SELECT,
// deadlines (a SIGSTOPped server), reconnects (a restarted server), close.
#include <gtest/gtest.h>

#include <atomic>
#include <boost/asio/post.hpp>
#include <fstream>
#include <future>
#include <mutex>
#include <thread>

#include "redis_fixture.hpp"

namespace vg::queue {
namespace {

using namespace std::chrono_literals;
using testing::RedisFixture;

using Ms = std::chrono::milliseconds;

Ms since(TimePoint start) { return std::chrono::duration_cast<Ms>(Clock::now() - start); }

using testing::eventually;

// A callback that records its calls and hands the first result to a future.
struct Probe {
  std::atomic<int> calls{0};
  std::promise<std::pair<Result<RedisValue>, TimePoint>> first;
  std::future<std::pair<Result<RedisValue>, TimePoint>> result = first.get_future();
  RedisClient::Callback callback() {
    return [this](Result<RedisValue> r) {
      if (calls.fetch_add(1) == 0) first.set_value({std::move(r), Clock::now()});
    };
  }
  Result<RedisValue> get(Duration limit = 20s) {
    if (result.wait_for(limit) != std::future_status::ready) return Error(ErrorCode::kInternal, "no callback");
    auto [r, at] = result.get();
    at_ = at;
    return r;
  }
  TimePoint at_{};
};

using RedisClientTest = RedisFixture;

TEST_F(RedisClientTest, BinarySafeSetAndGet) {
  RedisClient& client = connect();
  const std::string key("k\0ey\xff", 5);
  const std::string value("\0\x01\xff\r\nend\0", 9);
  RedisValue set = run(client, {"SET", key, value});
  ASSERT_NE(set.as_status(), nullptr) << set.debug_string();
  EXPECT_EQ(*set.as_status(), "OK");
  RedisValue got = run(client, {"GET", key});
  ASSERT_NE(got.as_string(), nullptr) << got.debug_string();
  EXPECT_EQ(*got.as_string(), value);
  EXPECT_EQ(run(client, {"STRLEN", key}).as_integer(), std::optional<std::int64_t>(9));
  // The key with its NUL is not the key cut at the NUL.
  EXPECT_TRUE(run(client, {"GET", std::string("k")}).is_nil());
}

TEST_F(RedisClientTest, IntegersNilArraysAndErrorReplies) {
  RedisClient& client = connect();
  EXPECT_TRUE(run(client, {"GET", "missing"}).is_nil());
  EXPECT_EQ(run(client, {"INCR", "n"}).as_integer(), std::optional<std::int64_t>(1));
  EXPECT_EQ(run(client, {"INCRBY", "n", "41"}).as_integer(), std::optional<std::int64_t>(42));
  EXPECT_EQ(run(client, {"RPUSH", "list", "a", "", "c"}).as_integer(), std::optional<std::int64_t>(3));
  RedisValue range = run(client, {"LRANGE", "list", "0", "-1"});
  EXPECT_EQ(range, RedisValue::array({RedisValue::string("a"), RedisValue::string(""), RedisValue::string("c")}))
      << range.debug_string();
  RedisValue wrong = run(client, {"INCR", "list"});
  ASSERT_TRUE(wrong.is_error()) << wrong.debug_string();
  EXPECT_EQ(wrong.as_error()->rfind("WRONGTYPE", 0), 0u) << *wrong.as_error();
  RedisValue unknown = run(client, {"NOSUCHCOMMAND"});
  ASSERT_TRUE(unknown.is_error());
  // Nested arrays with integers and nil (Lua false) inside.
  RedisValue nested = run(client, {"EVAL", "return {7, {'x', -2}, false}", "0"});
  EXPECT_EQ(nested, RedisValue::array({RedisValue::integer(7),
                                       RedisValue::array({RedisValue::string("x"), RedisValue::integer(-2)}),
                                       RedisValue::nil()}))
      << nested.debug_string();
  // The connection still works after error replies.
  EXPECT_EQ(run(client, {"GET", "n"}), RedisValue::string("42"));
}

TEST_F(RedisClientTest, AsyncCommandsAnswerInOrderEachOnce) {
  RedisClient& client = connect();
  constexpr int kCount = 300;
  std::mutex mu;
  std::vector<std::int64_t> seen;
  std::atomic<int> errors{0};
  std::promise<void> all;
  for (int i = 0; i < kCount; ++i) {
    client.command({"INCR", "counter"}, [&](Result<RedisValue> r) {
      std::lock_guard<std::mutex> lock(mu);
      if (!r || !r->as_integer()) {
        ++errors;
      } else {
        seen.push_back(*r->as_integer());
      }
      if (seen.size() + errors == kCount) all.set_value();
    });
  }
  ASSERT_EQ(all.get_future().wait_for(20s), std::future_status::ready);
  EXPECT_EQ(errors.load(), 0);
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_EQ(seen.size(), static_cast<std::size_t>(kCount));
  for (int i = 0; i < kCount; ++i) EXPECT_EQ(seen[i], i + 1);
}

TEST_F(RedisClientTest, EmptyCommandIsRefused) {
  RedisClient& client = connect();
  auto r = client.command_sync({}, 1s);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::kInvalidRequest);
}

TEST_F(RedisClientTest, CommandSyncOnTheIoThreadIsRefused) {
  RedisClient& client = connect();
  std::promise<Result<RedisValue>> out;
  boost::asio::post(io_, [&] { out.set_value(client.command_sync({"PING"}, 1s)); });
  auto r = out.get_future().get();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::kInternal);
  EXPECT_EQ(run(client, {"PING"}), RedisValue::status("PONG"));
}

TEST_F(RedisClientTest, SelectsTheDatabaseOfTheUrl) {
  RedisClient& db3 = connect(server_.url("/3"));
  RedisClient& db0 = connect();
  EXPECT_EQ(*run(db3, {"SET", "where", "three"}).as_status(), "OK");
  EXPECT_TRUE(run(db0, {"GET", "where"}).is_nil());
  EXPECT_EQ(run(db3, {"GET", "where"}), RedisValue::string("three"));
  // Database 999 does not exist (16 by default): a clear refusal, at once.
  RedisClient& bad = make_client(options_for(server_.url("/999")));
  auto start = Clock::now();
  Status s = bad.wait_connected(10s);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code, ErrorCode::kConfig);
  EXPECT_NE(s.error().message.find("SELECT 999"), std::string::npos) << s.error().message;
  EXPECT_LT(since(start), 5s);
}

TEST_F(RedisClientTest, AuthenticatesAnAclUser) {
  RedisClient& admin = connect();
  RedisValue set = run(admin, {"ACL", "SETUSER", "alice", "on", ">s3cret", "~*", "&*", "+@all"});
  ASSERT_EQ(set, RedisValue::status("OK")) << set.debug_string();
  RedisClient& alice = connect(server_.url_as("alice:s3cret"));
  EXPECT_EQ(run(alice, {"ACL", "WHOAMI"}), RedisValue::string("alice"));
  EXPECT_EQ(run(admin, {"ACL", "WHOAMI"}), RedisValue::string("default"));

  // A password with reserved characters, percent-encoded in the URL.
  ASSERT_EQ(run(admin, {"ACL", "SETUSER", "bob", "on", ">p@ss:w/rd% x", "~*", "+@all"}), RedisValue::status("OK"));
  RedisClient& bob = connect(server_.url_as("bob:p%40ss%3Aw%2Frd%25%20x"));
  EXPECT_EQ(run(bob, {"ACL", "WHOAMI"}), RedisValue::string("bob"));
}

TEST_F(RedisClientTest, PasswordFromAFile) {
  RedisClient& admin = connect();
  ASSERT_EQ(run(admin, {"ACL", "SETUSER", "carol", "on", ">from-a-file", "~*", "+@all"}), RedisValue::status("OK"));
  auto path = server_.dir() / "carol.password";
  std::ofstream(path) << "from-a-file\n";
  auto url = parse_redis_url(server_.url_as("carol"));
  ASSERT_TRUE(url.ok());
  PasswordSource from_file;
  from_file.file = path.string();
  auto with = with_password(*url, from_file, nullptr);
  ASSERT_TRUE(with.ok()) << with.error().message;
  RedisClient::Options options = options_for(server_.url());
  options.url = *with;
  RedisClient& carol = make_client(options);
  Status s = carol.wait_connected(10s);
  ASSERT_TRUE(s.ok()) << s.error().message;
  EXPECT_EQ(run(carol, {"ACL", "WHOAMI"}), RedisValue::string("carol"));
}

TEST_F(RedisClientTest, WrongPasswordIsAClearErrorAtOnce) {
  RedisClient& admin = connect();
  ASSERT_EQ(run(admin, {"ACL", "SETUSER", "alice", "on", ">s3cret", "~*", "+@all"}), RedisValue::status("OK"));
  RedisClient& bad = make_client(options_for(server_.url_as("alice:not-the-one")));
  auto start = Clock::now();
  Status s = bad.wait_connected(10s);
  ASSERT_FALSE(s.ok());
  EXPECT_LT(since(start), 5s) << "a refusal should not wait for the timeout";
  EXPECT_EQ(s.error().code, ErrorCode::kConfig);
  EXPECT_NE(s.error().message.find("user 'alice'"), std::string::npos) << s.error().message;
  EXPECT_NE(s.error().message.find("WRONGPASS"), std::string::npos) << s.error().message;
  EXPECT_EQ(s.error().message.find("not-the-one"), std::string::npos) << "the password leaked: " << s.error().message;
  EXPECT_FALSE(bad.connected());
  auto r = bad.command_sync({"PING"}, 1s);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::kOverloaded);
  EXPECT_GE(bad.stats().failed_attempts, 1u);
  EXPECT_EQ(bad.stats().connects, 0u);
}

TEST_F(RedisClientTest, MissingPasswordIsAClearError) {
  RedisClient& admin = connect();
  ASSERT_EQ(run(admin, {"CONFIG", "SET", "requirepass", "pw"}), RedisValue::status("OK"));
  RedisClient& none = make_client(options_for(server_.url()));
  Status s = none.wait_connected(10s);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code, ErrorCode::kConfig);
  EXPECT_NE(s.error().message.find("needs a password"), std::string::npos) << s.error().message;
  RedisClient& with = connect(server_.url_as(":pw"));
  EXPECT_EQ(run(with, {"PING"}), RedisValue::status("PONG"));
}

TEST_F(RedisClientTest, DeadlineOnAStoppedServerThenRecovers) {
  RedisClient::Options options = options_for(server_.url());
  options.connect_timeout = 300ms;
  RedisClient& client = make_client(options);
  ASSERT_TRUE(client.wait_connected(10s).ok());
  ASSERT_EQ(run(client, {"SET", "k", "v"}), RedisValue::status("OK"));

  server_.pause();  // SIGSTOP: the socket stays open, nothing answers
  Probe early[3];   // pending with the one that times out, with long deadlines
  Probe timed;
  auto start = Clock::now();
  client.command({"GET", "k"}, 30s, early[0].callback());
  client.command({"GET", "k"}, 300ms, timed.callback());
  client.command({"SET", "k", "w"}, 30s, early[1].callback());
  client.command({"INCR", "n"}, 20s, early[2].callback());

  auto t = timed.get();
  ASSERT_FALSE(t.ok()) << t->debug_string();
  EXPECT_EQ(t.error().code, ErrorCode::kTimeout) << t.error().message;
  EXPECT_NE(t.error().message.find("GET"), std::string::npos) << t.error().message;
  auto waited = std::chrono::duration_cast<Ms>(timed.at_ - start);
  EXPECT_GE(waited, 300ms);
  EXPECT_LT(waited, 3s);
  // The connection was torn down: the other pending command failed with a
  // connection error, at once (not at its own 30 s deadline).
  for (auto& probe : early) {
    auto e = probe.get(10s);
    ASSERT_FALSE(e.ok());
    EXPECT_EQ(e.error().code, ErrorCode::kOverloaded) << e.error().message;
    EXPECT_NE(e.error().message.find("timed out"), std::string::npos) << e.error().message;
  }
  EXPECT_LT(since(start), 10s);
  EXPECT_FALSE(client.connected());
  EXPECT_EQ(client.stats().timeouts, 1u);
  // While the server is stopped, commands fail at once instead of waiting.
  auto fast_start = Clock::now();
  auto r = client.command_sync({"PING"}, 5s);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::kOverloaded) << r.error().message;
  EXPECT_LT(since(fast_start), 2s);

  server_.resume();
  Status s = client.wait_connected(20s);
  ASSERT_TRUE(s.ok()) << s.error().message;
  // The SET failed by the reset had already been written: the server ran
  // it once it woke up. A failed command may have run.
  EXPECT_EQ(run(client, {"GET", "k"}), RedisValue::string("w"));
  EXPECT_GE(client.stats().connects, 2u);
  EXPECT_EQ(timed.calls.load(), 1);
  for (auto& probe : early) EXPECT_EQ(probe.calls.load(), 1);
}

TEST_F(RedisClientTest, ConnectAttemptsHaveADeadline) {
  server_.pause();  // the kernel accepts the TCP connection; the PING gets no answer
  RedisClient::Options options = options_for(server_.url());
  options.connect_timeout = 200ms;
  RedisClient& client = make_client(options);
  auto start = Clock::now();
  Status s = client.wait_connected(1500ms);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code, ErrorCode::kOverloaded);
  EXPECT_NE(s.error().message.find("within 200 ms"), std::string::npos) << s.error().message;
  EXPECT_GE(client.stats().failed_attempts, 2u) << "attempts are retried after their deadline";
  EXPECT_GE(since(start), 1500ms);
  server_.resume();
  s = client.wait_connected(20s);
  ASSERT_TRUE(s.ok()) << s.error().message;
  EXPECT_EQ(run(client, {"PING"}), RedisValue::status("PONG"));
}

TEST_F(RedisClientTest, ReconnectsAfterTheServerRestarts) {
  RedisClient& client = connect();
  ASSERT_EQ(run(client, {"SET", "k", "before"}), RedisValue::status("OK"));
  server_.kill();  // kill -9: the kernel closes its sockets
  ASSERT_TRUE(eventually([&] { return !client.connected(); })) << "the loss was not seen";
  auto r = client.command_sync({"GET", "k"}, 5s);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::kOverloaded) << r.error().message;
  EXPECT_NE(client.last_error().message.find("lost"), std::string::npos) << client.last_error().message;

  std::string why = server_.start();  // same port, empty data (no persistence)
  ASSERT_EQ(why, "") << why;
  Status s = client.wait_connected(20s);
  ASSERT_TRUE(s.ok()) << s.error().message;
  EXPECT_TRUE(run(client, {"GET", "k"}).is_nil()) << "not the new server";
  ASSERT_EQ(run(client, {"SET", "k", "after"}), RedisValue::status("OK"));
  EXPECT_EQ(run(client, {"GET", "k"}), RedisValue::string("after"));
  EXPECT_GE(client.stats().disconnects, 1u);
  EXPECT_GE(client.stats().connects, 2u);
}

TEST_F(RedisClientTest, ConnectsOnceAServerAppears) {
  server_.stop();
  RedisClient& client = make_client(options_for(server_.url()));
  Status s = client.wait_connected(300ms);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code, ErrorCode::kOverloaded);
  EXPECT_NE(s.error().message.find("refused"), std::string::npos) << s.error().message;
  std::string why = server_.start();
  ASSERT_EQ(why, "") << why;
  s = client.wait_connected(20s);
  ASSERT_TRUE(s.ok()) << s.error().message;
  EXPECT_EQ(run(client, {"PING"}), RedisValue::status("PONG"));
}

TEST_F(RedisClientTest, CloseCancelsPendingCommandsOnce) {
  RedisClient& client = connect();
  server_.pause();  // the command stays pending: no reply comes
  Probe pending;
  client.command({"GET", "k"}, 30s, pending.callback());
  client.close();  // runs on the strand after the command was sent (same thread, posted in order)
  auto r = pending.get(10s);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::kCancelled) << r.error().message;
  EXPECT_EQ(client.state(), RedisClient::State::kClosed);
  auto after = client.command_sync({"PING"}, 1s);
  ASSERT_FALSE(after.ok());
  EXPECT_EQ(after.error().code, ErrorCode::kCancelled);
  EXPECT_EQ(pending.calls.load(), 1);
  server_.resume();
}

}  // namespace
}  // namespace vg::queue
