// HttpServer against a fake Service on a real loopback socket (port 0): routing
// and its errors, read deadlines and the body limit, health/ready, the
// completion flow (plain, streaming, failures, errors before headers) and
// client disconnects. Events are pushed from the test thread, as an engine
// thread would.
#include "http/http_server.hpp"

#include <gtest/gtest.h>

#include <boost/json.hpp>

#include "http_test_util.hpp"

namespace vg {
namespace {

using namespace vg::test;
namespace json = boost::json;

json::object parse(const std::string& s) {
  boost::system::error_code ec;
  json::value v = json::parse(s, ec);
  EXPECT_FALSE(ec) << s;
  return v.is_object() ? v.get_object() : json::object{};
}

std::string error_type_of(const Response& res) {
  json::object o = parse(res.body());
  if (!o.contains("error")) return "<no error in " + res.body() + ">";
  return std::string(o.at("error").at("type").as_string());
}

class HttpServerTest : public ::testing::Test {
 protected:
  void start(HttpServer::Options options = {}) {
    options.host = "127.0.0.1";
    options.port = 0;
    auto created = HttpServer::create(options, service_);
    ASSERT_TRUE(created.ok()) << created.error().message;
    server_ = std::move(created).value();
  }
  std::unique_ptr<TestClient> client() { return std::make_unique<TestClient>(server_->port()); }

  /// Sends a completion and returns the fake engine's view of it.
  FakeSubmission submit(TestClient& c, const std::string& body, std::string_view target = "/v1/completions") {
    c.send(bhttp::verb::post, target, body);
    auto sub = service_.next_submission();
    EXPECT_TRUE(sub.has_value()) << "the server never submitted " << body;
    return sub.value_or(FakeSubmission{});
  }

  void TearDown() override {
    if (server_) server_->stop();
  }

  FakeService service_;
  std::unique_ptr<HttpServer> server_;
};

TEST_F(HttpServerTest, UnknownPathIs404WithJsonError) {
  start();
  Response res = client()->request(bhttp::verb::get, "/nope");
  EXPECT_EQ(res.result_int(), 404);
  EXPECT_EQ(error_type_of(res), "not_found");
  EXPECT_EQ(res[bhttp::field::content_type], "application/json");
  EXPECT_FALSE(res["X-Request-Id"].empty());
}

TEST_F(HttpServerTest, KserveVersionedPathsRouteLikeTheUnversionedOnesForTheReportedVersion) {
  start();
  auto c = client();
  Response meta = c->request(bhttp::verb::get, "/v2/models/fake-tensor");
  ASSERT_EQ(meta.result_int(), 200) << meta.body();
  const json::array versions = parse(meta.body()).at("versions").as_array();
  ASSERT_EQ(versions.size(), 1u);
  const std::string v(versions[0].as_string());
  const std::string base = "/v2/models/fake-tensor/versions/" + v;

  Response versioned = c->request(bhttp::verb::get, base);
  EXPECT_EQ(versioned.result_int(), 200) << versioned.body();
  EXPECT_EQ(versioned.body(), meta.body());
  EXPECT_EQ(c->request(bhttp::verb::get, base + "/ready").result_int(), 200);
  const std::string body = R"({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}]})";
  Response infer = c->request(bhttp::verb::post, base + "/infer", body);
  ASSERT_EQ(infer.result_int(), 200) << infer.body();
  EXPECT_EQ(parse(infer.body()).at("model_version").as_string(), v);
  EXPECT_EQ(c->request(bhttp::verb::get, base + "/infer").result_int(), 405);

  for (const std::string other : {"2", "0", "latest"}) {
    for (const std::string suffix : {"", "/ready", "/infer"}) {
      const std::string path = "/v2/models/fake-tensor/versions/" + other + suffix;
      Response res = suffix == "/infer" ? c->request(bhttp::verb::post, path, body) : c->request(bhttp::verb::get, path);
      EXPECT_EQ(res.result_int(), 404) << path;
      EXPECT_EQ(error_type_of(res), "model_not_found") << path;
      EXPECT_NE(res.body().find("version '" + other + "'"), std::string::npos) << path << ": " << res.body();
    }
  }
  // An unknown model stays the model's 404; an empty or nested version is no route.
  Response unknown = c->request(bhttp::verb::get, "/v2/models/nope/versions/" + v);
  EXPECT_EQ(unknown.result_int(), 404);
  EXPECT_NE(unknown.body().find("'nope'"), std::string::npos) << unknown.body();
  EXPECT_EQ(c->request(bhttp::verb::get, "/v2/models/fake-tensor/versions/").result_int(), 404);
  EXPECT_EQ(c->request(bhttp::verb::get, "/v2/models/fake-tensor/versions/1/x").result_int(), 404);
}

TEST_F(HttpServerTest, WrongMethodIs405WithAllow) {
  start();
  auto c = client();
  Response get = c->request(bhttp::verb::get, "/v1/completions");
  EXPECT_EQ(get.result_int(), 405);
  EXPECT_EQ(error_type_of(get), "method_not_allowed");
  EXPECT_EQ(get[bhttp::field::allow], "POST");
  Response post = c->request(bhttp::verb::post, "/health", "{}");  // same connection: still usable
  EXPECT_EQ(post.result_int(), 405);
  EXPECT_EQ(post[bhttp::field::allow], "GET, HEAD");
}

TEST_F(HttpServerTest, BodyOverLimitIs413) {
  HttpServer::Options o;
  o.body_limit_bytes = 64;
  start(o);
  Response res = client()->request(bhttp::verb::post, "/v1/completions", std::string(200, ' '));
  EXPECT_EQ(res.result_int(), 413);
  EXPECT_EQ(error_type_of(res), "body_too_large");
  EXPECT_EQ(service_.submit_attempts(), 0);
}

TEST_F(HttpServerTest, DeclaredBodyOverLimitIs413BeforeTheBodyArrives) {
  HttpServer::Options o;
  o.body_limit_bytes = 1024;
  start(o);
  auto c = client();
  c->send_raw("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 10000000\r\n\r\n");
  Response res = c->read();
  EXPECT_EQ(res.result_int(), 413);
  EXPECT_TRUE(c->wait_closed());
}

TEST_F(HttpServerTest, StalledBodyGets408AndTheConnectionCloses) {
  HttpServer::Options o;
  o.read_timeout_s = 0.3;
  start(o);
  auto c = client();
  c->send_raw("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 10000\r\n\r\n" + std::string(1000, ' '));
  Response res = c->read();
  EXPECT_EQ(res.result_int(), 408);
  EXPECT_EQ(error_type_of(res), "request_timeout");
  EXPECT_FALSE(res.keep_alive());
  EXPECT_TRUE(c->wait_closed());
  EXPECT_EQ(service_.submit_attempts(), 0);  // nothing estimated or reserved
}

TEST_F(HttpServerTest, ClientThatClosesMidBodySubmitsNothing) {
  start();
  {
    auto c = client();
    c->send_raw("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 10000\r\n\r\n" + std::string(1000, ' '));
    c->close();
  }
  Response res = client()->request(bhttp::verb::get, "/health");  // still serving
  EXPECT_EQ(res.result_int(), 200);
  EXPECT_EQ(service_.submit_attempts(), 0);
}

TEST_F(HttpServerTest, ExpectContinueGets100ThenTheAnswer) {
  start();
  auto c = client();
  c->send_raw("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\n");
  EXPECT_EQ(c->read().result_int(), 100);
  c->send_raw("[]");
  Response res = c->read();
  EXPECT_EQ(res.result_int(), 400);
  EXPECT_NE(res.body().find("JSON object"), std::string::npos);
}

TEST_F(HttpServerTest, MalformedHttpIs400) {
  start();
  auto c = client();
  c->send_raw("THIS IS NOT HTTP\r\n\r\n");
  Response res = c->read();
  EXPECT_EQ(res.result_int(), 400);
  EXPECT_EQ(error_type_of(res), "invalid_request");
}

TEST_F(HttpServerTest, HealthAndReady) {
  start();
  auto c = client();
  Response ok = c->request(bhttp::verb::get, "/health");
  EXPECT_EQ(ok.result_int(), 200);
  EXPECT_EQ(parse(ok.body()).at("status").as_string(), "ok");
  service_.is_healthy = false;
  Response sick = c->request(bhttp::verb::get, "/health");
  EXPECT_EQ(sick.result_int(), 503);
  EXPECT_EQ(parse(sick.body()).at("reason").as_string(), "engine stuck");
  EXPECT_EQ(c->request(bhttp::verb::get, "/ready").result_int(), 200);
  service_.is_ready = false;
  EXPECT_EQ(c->request(bhttp::verb::get, "/ready?probe=1").result_int(), 503);
}

TEST_F(HttpServerTest, ReadyListsDevicesAndOneUnhealthyDeviceKeepsIt200) {
  DeviceState ok;
  ok.name = "virt:0";
  DeviceState sick;
  sick.name = "virt:1";
  sick.ready = false;
  sick.state = "unhealthy";
  sick.reason = "too small for the model";
  service_.set_devices({ok, sick});
  start();
  auto c = client();
  Response res = c->request(bhttp::verb::get, "/ready");
  EXPECT_EQ(res.result_int(), 200);
  json::object o = parse(res.body());
  EXPECT_EQ(o.at("status").as_string(), "ready");
  EXPECT_FALSE(o.contains("reason"));
  const json::array& devices = o.at("devices").as_array();
  ASSERT_EQ(devices.size(), 2u);
  EXPECT_EQ(devices[0].at("name").as_string(), "virt:0");
  EXPECT_EQ(devices[0].at("state").as_string(), "ready");
  EXPECT_FALSE(devices[0].as_object().contains("reason"));
  EXPECT_EQ(devices[1].at("name").as_string(), "virt:1");
  EXPECT_EQ(devices[1].at("state").as_string(), "unhealthy");
  EXPECT_EQ(devices[1].at("reason").as_string(), "too small for the model");

  service_.is_ready = false;
  Response down = c->request(bhttp::verb::get, "/ready");
  EXPECT_EQ(down.result_int(), 503);
  json::object d = parse(down.body());
  EXPECT_EQ(d.at("status").as_string(), "not_ready");
  EXPECT_EQ(d.at("reason").as_string(), "models loading or server draining");
  EXPECT_EQ(d.at("devices").as_array().size(), 2u);
}

TEST_F(HttpServerTest, ModelsAndAdmission) {
  start();
  auto c = client();
  Response models = c->request(bhttp::verb::get, "/v1/models");
  EXPECT_EQ(models.result_int(), 200);
  EXPECT_EQ(parse(models.body()).at("data").as_array().at(0).at("id").as_string(), "fake-model");
  Response adm = c->request(bhttp::verb::get, "/v1/admission");
  EXPECT_EQ(adm.result_int(), 200);
  EXPECT_EQ(parse(adm.body()).at("queue_depth").as_int64(), 2);
}

TEST_F(HttpServerTest, ExceptionInAHandlerIs500AndTheServerLives) {
  start();
  service_.throw_in_models = true;
  Response res = client()->request(bhttp::verb::get, "/v1/models");
  EXPECT_EQ(res.result_int(), 500);
  EXPECT_EQ(error_type_of(res), "internal_error");
  EXPECT_EQ(client()->request(bhttp::verb::get, "/health").result_int(), 200);
}

TEST_F(HttpServerTest, RequestIdIsEchoedSanitizedOrGenerated) {
  start();
  auto c = client();
  EXPECT_EQ(c->request(bhttp::verb::get, "/health", {}, {{"X-Request-Id", "abc-123"}})["X-Request-Id"], "abc-123");
  EXPECT_EQ(c->request(bhttp::verb::get, "/health", {}, {{"X-Request-Id", "a b<c>\"d"}})["X-Request-Id"], "abcd");
  const std::string longer(500, 'x');
  EXPECT_EQ(c->request(bhttp::verb::get, "/health", {}, {{"X-Request-Id", longer}})["X-Request-Id"].size(), 128u);
  const std::string a(c->request(bhttp::verb::get, "/health")["X-Request-Id"]);
  const std::string b(c->request(bhttp::verb::get, "/nope")["X-Request-Id"]);
  EXPECT_FALSE(a.empty());
  EXPECT_NE(a, b);
}

TEST_F(HttpServerTest, PipelinedRequestsAreAnsweredInOrder) {
  start();
  auto c = client();
  c->send_raw("GET /health HTTP/1.1\r\nHost: x\r\n\r\nGET /nope HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(c->read().result_int(), 200);
  EXPECT_EQ(c->read().result_int(), 404);
}

TEST_F(HttpServerTest, CompletionCollectsEventsPushedFromAnotherThread) {
  start();
  auto c = client();
  FakeSubmission sub = submit(*c, R"({"prompt":"hi","max_tokens":5,"temperature":0})");
  EXPECT_EQ(sub.request.max_tokens, 5);
  std::thread engine([sink = sub.sink] {
    sink->push(StartedEvent{12.4});
    sink->push(TextEvent{"Hel", 1});
    sink->push(TextEvent{"lo", 1});
    sink->push(FinishedEvent{"length", {3, 2}, {12.4, 1, 2}});
  });
  Response res = c->read();
  engine.join();
  ASSERT_EQ(res.result_int(), 200) << res.body();
  json::object o = parse(res.body());
  EXPECT_EQ(o.at("object").as_string(), "text_completion");
  EXPECT_EQ(o.at("id").as_string(), "cmpl-" + sub.handle->id());
  EXPECT_EQ(o.at("model").as_string(), "fake-model");
  EXPECT_EQ(o.at("choices").at(0).at("text").as_string(), "Hello");
  EXPECT_EQ(o.at("choices").at(0).at("finish_reason").as_string(), "length");
  EXPECT_EQ(o.at("usage").at("total_tokens").as_int64(), 5);
  EXPECT_EQ(res["X-Queue-Position"], "0");
  EXPECT_EQ(res["X-Queue-Wait-Ms"], "12");
  EXPECT_FALSE(sub.handle->cancelled());
  // The connection stays usable.
  EXPECT_EQ(c->request(bhttp::verb::get, "/health").result_int(), 200);
}

TEST_F(HttpServerTest, InferReturnsResultAndTimings) {
  start();
  auto c = client();
  FakeSubmission sub = submit(*c, R"({"prompt":"hi","max_tokens":2})", "/infer");
  sub.sink->push(TextEvent{"ok", 2});
  sub.sink->push(FinishedEvent{"stop", {3, 2}, {4.0, 1, 1}});
  Response res = c->read();
  ASSERT_EQ(res.result_int(), 200) << res.body();
  json::object o = parse(res.body());
  EXPECT_EQ(o.at("result").as_string(), "ok");
  EXPECT_GE(o.at("latency_ms").to_number<double>(), 0.0);
  EXPECT_DOUBLE_EQ(o.at("queue_ms").to_number<double>(), 4.0);
}

TEST_F(HttpServerTest, StreamingSendsChunksFinalChunkAndDone) {
  start();
  service_.set({.submit_error = std::nullopt, .push_queued_on_submit = true, .queue_position = 2});
  auto c = client();
  FakeSubmission sub = submit(*c, R"({"prompt":"hi","stream":true})");
  std::thread engine([sink = sub.sink] {
    sink->push(QueuedEvent{1});
    sink->push(StartedEvent{3});
    sink->push(TextEvent{"a\nb", 1});
    sink->push(TextEvent{"c", 1});
    sink->push(FinishedEvent{"stop", {3, 2}, {3, 1, 1}});
  });
  Response res = c->read();
  engine.join();
  ASSERT_EQ(res.result_int(), 200);
  EXPECT_EQ(res[bhttp::field::content_type], "text/event-stream");
  EXPECT_EQ(res["X-Queue-Position"], "2");
  const std::vector<std::string> events = sse_events(res.body());
  ASSERT_EQ(events.size(), 6u) << res.body();
  EXPECT_EQ(events[0], ": queue position 2");
  EXPECT_EQ(events[1], ": queue position 1");
  ASSERT_EQ(events[2].rfind("data: ", 0), 0u);
  EXPECT_EQ(parse(events[2].substr(6)).at("choices").at(0).at("text").as_string(), "a\nb");
  EXPECT_TRUE(parse(events[2].substr(6)).at("choices").at(0).at("finish_reason").is_null());
  EXPECT_EQ(parse(events[3].substr(6)).at("choices").at(0).at("text").as_string(), "c");
  json::object last = parse(events[4].substr(6));
  EXPECT_EQ(last.at("choices").at(0).at("finish_reason").as_string(), "stop");
  EXPECT_EQ(last.at("usage").at("completion_tokens").as_int64(), 2);
  EXPECT_EQ(events[5], "data: [DONE]");
  EXPECT_EQ(c->request(bhttp::verb::get, "/health").result_int(), 200);  // keep-alive after the stream
}

TEST_F(HttpServerTest, FailureBeforeHeadersIsAPlainJsonError) {
  start();
  auto c = client();
  FakeSubmission sub = submit(*c, R"({"prompt":"hi"})");
  sub.sink->push(FailedEvent{Error(ErrorCode::kTimeout, "deadline passed"), {}});
  Response res = c->read();
  EXPECT_EQ(res.result_int(), 504);
  EXPECT_EQ(error_type_of(res), "timeout");
}

TEST_F(HttpServerTest, FailureAfterSseHeadersIsAnSseErrorEventThenDone) {
  start();
  auto c = client();
  FakeSubmission sub = submit(*c, R"({"prompt":"hi","stream":true})");
  Error overloaded(ErrorCode::kOverloaded, "queue wait limit");
  overloaded.retry_after_s = 3;
  sub.sink->push(FailedEvent{overloaded, {}});
  Response res = c->read();
  ASSERT_EQ(res.result_int(), 200);
  const std::vector<std::string> events = sse_events(res.body());
  ASSERT_EQ(events.size(), 2u) << res.body();
  json::object err = parse(events[0].substr(6)).at("error").as_object();
  EXPECT_EQ(err.at("type").as_string(), "overloaded");
  EXPECT_EQ(err.at("retry_after_s").to_number<double>(), 3.0);
  EXPECT_EQ(events[1], "data: [DONE]");
}

TEST_F(HttpServerTest, SubmitErrorIsIdenticalForStreamAndNot) {
  start();
  Error busy(ErrorCode::kOverloaded, "queue full (8 waiting)");
  busy.retry_after_s = 1.2001;
  busy.retry_position = 4;
  busy.retry_token = "rt_abc";
  service_.set({.submit_error = busy});
  auto c = client();
  Response plain = c->request(bhttp::verb::post, "/v1/completions", R"({"prompt":"hi"})");
  Response streamed = c->request(bhttp::verb::post, "/v1/completions", R"({"prompt":"hi","stream":true})");
  EXPECT_EQ(plain.result_int(), 503);
  EXPECT_EQ(streamed.result_int(), 503);
  EXPECT_EQ(plain.body(), streamed.body());
  EXPECT_EQ(plain[bhttp::field::content_type], "application/json");
  EXPECT_EQ(streamed[bhttp::field::content_type], "application/json");
  EXPECT_EQ(plain[bhttp::field::retry_after], "2");
  EXPECT_EQ(streamed[bhttp::field::retry_after], "2");
  // The promise precisely, the token, and that retrying can help.
  EXPECT_EQ(plain["retry-after-ms"], "1201");
  EXPECT_EQ(plain["X-Retry-Token"], "rt_abc");
  EXPECT_EQ(plain["x-should-retry"], "true");
  EXPECT_EQ(error_type_of(plain), "overloaded");
  const auto err = json::parse(plain.body()).at("error").as_object();
  EXPECT_EQ(err.at("retry_after_ms").to_number<std::int64_t>(), 1201);
  EXPECT_EQ(err.at("retry_position").to_number<std::int64_t>(), 4);
  EXPECT_EQ(err.at("retry_token").as_string(), "rt_abc");
  EXPECT_TRUE(err.at("retry_booked").as_bool());
  // The service was told how to recognise this request as a retry.
  const std::optional<CompletionRequest> last = service_.last_request();
  ASSERT_TRUE(last.has_value());
  EXPECT_FALSE(last->retry.fingerprint.empty());
  EXPECT_EQ(last->retry.client, "addr:127.0.0.1");
  EXPECT_EQ(last->retry.offered_token.rfind("rt_", 0), 0u);

  Error huge(ErrorCode::kExceedsDeviceMemory, "needs 3 GiB");
  huge.needed_bytes = 3;
  huge.budget_bytes = 2;
  service_.set({.submit_error = huge});
  Response a = c->request(bhttp::verb::post, "/v1/completions", R"({"prompt":"hi"})");
  Response b = c->request(bhttp::verb::post, "/v1/completions", R"({"prompt":"hi","stream":true})");
  EXPECT_EQ(a.result_int(), 413);
  EXPECT_EQ(a.body(), b.body());
  EXPECT_EQ(b.result_int(), 413);
  EXPECT_EQ(a["x-should-retry"], "false");  // a retry cannot fix it
  EXPECT_EQ(a.count("retry-after-ms"), 0u);
}

TEST_F(HttpServerTest, InvalidRequestIsIdenticalForStreamAndNotAndNeverSubmitted) {
  start();
  auto c = client();
  Response plain = c->request(bhttp::verb::post, "/v1/completions", R"({"prompt":"hi","max_tokens":-1})");
  Response streamed =
      c->request(bhttp::verb::post, "/v1/completions", R"({"prompt":"hi","max_tokens":-1,"stream":true})");
  EXPECT_EQ(plain.result_int(), 400);
  EXPECT_EQ(streamed.result_int(), 400);
  EXPECT_EQ(plain.body(), streamed.body());
  EXPECT_NE(plain.body().find("max_tokens"), std::string::npos);
  EXPECT_EQ(service_.submit_attempts(), 0);
}

TEST_F(HttpServerTest, ClientCloseWhileWaitingCancelsTheRequest) {
  start();
  auto c = client();
  FakeSubmission sub = submit(*c, R"({"prompt":"hi","max_tokens":100})");
  sub.sink->push(QueuedEvent{3});
  c->close();
  ASSERT_TRUE(sub.handle->wait_cancelled()) << "the server did not notice the client close";
  sub.sink->push(FailedEvent{Error(ErrorCode::kCancelled, "cancelled"), {}});  // what the engine does next
  EXPECT_TRUE(eventually([&] { return server_->active_requests() == 0; }));
  EXPECT_EQ(client()->request(bhttp::verb::get, "/health").result_int(), 200);
}

TEST_F(HttpServerTest, ClientCloseDuringStreamCancelsTheRequest) {
  start();
  auto c = client();
  FakeSubmission sub = submit(*c, R"({"prompt":"hi","stream":true,"max_tokens":100})");
  auto& parser = c->read_header();
  EXPECT_EQ(parser.get().result_int(), 200);
  sub.sink->push(TextEvent{"one", 1});
  std::string body;
  while (body.find("\n\n") == std::string::npos) body = c->read_more();
  EXPECT_NE(body.find("one"), std::string::npos);
  c->close();
  ASSERT_TRUE(sub.handle->wait_cancelled()) << "the server did not notice the client close";
  sub.sink->push(FailedEvent{Error(ErrorCode::kCancelled, "cancelled"), {}});
  EXPECT_TRUE(eventually([&] { return server_->active_requests() == 0; }));
}

TEST_F(HttpServerTest, PushesAfterTheRequestEndedAreHarmless) {
  start();
  auto c = client();
  FakeSubmission sub = submit(*c, R"({"prompt":"hi"})");
  sub.sink->push(FinishedEvent{"stop", {}, {0, 0, 0}});
  EXPECT_EQ(c->read().result_int(), 200);
  sub.sink->push(TextEvent{"late", 1});  // a buggy engine: must not crash or write
  EXPECT_EQ(c->request(bhttp::verb::get, "/health").result_int(), 200);
}

TEST_F(HttpServerTest, MaxConnectionsClosesFurtherConnections) {
  HttpServer::Options o;
  o.max_connections = 1;
  start(o);
  auto first = client();
  EXPECT_EQ(first->request(bhttp::verb::get, "/health").result_int(), 200);
  auto second = client();
  EXPECT_TRUE(second->wait_closed());
  EXPECT_EQ(first->request(bhttp::verb::get, "/health").result_int(), 200);
}

TEST_F(HttpServerTest, StopCancelsWaitingRequestsAndIsIdempotent) {
  start();
  auto c = client();
  FakeSubmission sub = submit(*c, R"({"prompt":"hi"})");
  std::thread engine([&sub] {  // a well-behaved engine confirms a cancel
    if (sub.handle->wait_cancelled()) sub.sink->push(FailedEvent{Error(ErrorCode::kCancelled, "cancelled"), {}});
  });
  server_->stop();
  engine.join();
  EXPECT_TRUE(sub.handle->cancelled());
  EXPECT_EQ(server_->active_requests(), 0);
  server_->stop();
  sub.sink->push(FailedEvent{Error(ErrorCode::kCancelled, "late"), {}});  // after stop: dropped
}

TEST_F(HttpServerTest, StopReturnsEvenIfTheEngineNeverConfirms) {
  start();
  auto c = client();
  FakeSubmission sub = submit(*c, R"({"prompt":"hi","stream":true})");
  server_->stop();  // bounded by the shutdown grace, not by the engine
  EXPECT_TRUE(sub.handle->cancelled());
  server_.reset();  // destroys the waiting session
  sub.sink->push(TextEvent{"after the server is gone", 1});  // dropped, touches nothing freed
}

TEST_F(HttpServerTest, StopAcceptingRefusesNewConnectionsButServesOpenOnes) {
  start();
  auto open = client();
  EXPECT_EQ(open->request(bhttp::verb::get, "/health").result_int(), 200);
  server_->stop_accepting();
  EXPECT_THROW(TestClient late(server_->port()), boost::system::system_error);
  EXPECT_EQ(open->request(bhttp::verb::get, "/health").result_int(), 200);
}

TEST(HttpServerCreate, BadAddressIsAConfigError) {
  FakeService service;
  HttpServer::Options o;
  o.host = "256.1.1.1";
  o.port = 0;
  auto r = HttpServer::create(o, service);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::kConfig);
  HttpServer::Options bad;
  bad.io_threads = 0;
  auto r2 = HttpServer::create(bad, service);
  ASSERT_FALSE(r2.ok());
  EXPECT_EQ(r2.error().code, ErrorCode::kConfig);
}

}  // namespace
}  // namespace vg
