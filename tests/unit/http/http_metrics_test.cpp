// GET /metrics and request counting against a fake Service, and the request
// log line's JSON.
#include <gtest/gtest.h>

#include <boost/json.hpp>

#include "http/http_server.hpp"
#include "http/request_log.hpp"
#include "http_test_util.hpp"
#include "metrics/registry.hpp"
#include "metrics/server_metrics.hpp"

namespace vg {
namespace {

using namespace vg::test;
namespace json = boost::json;

bool has_line(const std::string& text, const std::string& line) {
  return ("\n" + text).find("\n" + line + "\n") != std::string::npos;
}

class HttpMetricsTest : public ::testing::Test {
 protected:
  void start(bool with_metrics = true) {
    HttpServer::Options options;
    options.host = "127.0.0.1";
    options.port = 0;
    if (with_metrics) options.metrics = &metrics_;
    auto created = HttpServer::create(options, service_);
    ASSERT_TRUE(created.ok()) << created.error().message;
    server_ = std::move(created).value();
  }
  void TearDown() override {
    if (server_) server_->stop();
  }

  FakeService service_;
  metrics::Registry registry_;
  metrics::ServerMetrics metrics_{registry_};
  std::unique_ptr<HttpServer> server_;
};

TEST_F(HttpMetricsTest, ExpositionHasStateGaugesAndCountsRequestsByRouteAndStatus) {
  start();
  TestClient c(server_->port());
  EXPECT_EQ(c.request(bhttp::verb::get, "/health").result_int(), 200);
  EXPECT_EQ(c.request(bhttp::verb::get, "/nope").result_int(), 404);
  EXPECT_EQ(c.request(bhttp::verb::post, "/health").result_int(), 405);
  EXPECT_EQ(c.request(bhttp::verb::post, "/v1/completions", "{").result_int(), 400);
  Response res = c.request(bhttp::verb::get, "/metrics");
  EXPECT_EQ(res.result_int(), 200);
  EXPECT_EQ(res[bhttp::field::content_type], metrics::kExpositionContentType);
  const std::string& text = res.body();
  EXPECT_TRUE(has_line(text, "vramgate_queue_depth 2")) << text;
  EXPECT_TRUE(has_line(text, "vramgate_ready 1")) << text;
  EXPECT_TRUE(has_line(text, "vramgate_http_requests_total{route=\"/health\",status=\"200\"} 1")) << text;
  EXPECT_TRUE(has_line(text, "vramgate_http_requests_total{route=\"/health\",status=\"405\"} 1")) << text;
  EXPECT_TRUE(has_line(text, "vramgate_http_requests_total{route=\"other\",status=\"404\"} 1")) << text;
  EXPECT_TRUE(has_line(text, "vramgate_http_requests_total{route=\"/v1/completions\",status=\"400\"} 1")) << text;
}

TEST_F(HttpMetricsTest, StreamsAreCountedWhenTheirHeadersGoOut) {
  start();
  TestClient c(server_->port());
  c.send(bhttp::verb::post, "/v1/completions", R"({"prompt":"hi","stream":true})");
  auto sub = service_.next_submission();
  ASSERT_TRUE(sub);
  c.read_header();
  sub->sink->push(FinishedEvent{"length", {3, 0}, {0, 0, 0}});
  TestClient scrape(server_->port());
  const std::string text = scrape.request(bhttp::verb::get, "/metrics").body();
  EXPECT_TRUE(has_line(text, "vramgate_http_requests_total{route=\"/v1/completions\",status=\"200\"} 1")) << text;
}

TEST_F(HttpMetricsTest, PerDeviceRunningAndReadyComeFromTheAdmissionState) {
  DeviceState busy;
  busy.name = "virt:0";
  busy.capacity_bytes = 4096;
  busy.running = 2;
  DeviceState sick;
  sick.name = "virt:1";
  sick.ready = false;
  sick.state = "unhealthy";
  sick.reason = "too small";
  service_.set_devices({busy, sick});
  start();
  TestClient c(server_->port());
  const std::string text = c.request(bhttp::verb::get, "/metrics").body();
  EXPECT_TRUE(has_line(text, "vramgate_device_running_sequences{device=\"virt:0\"} 2")) << text;
  EXPECT_TRUE(has_line(text, "vramgate_device_running_sequences{device=\"virt:1\"} 0")) << text;
  EXPECT_TRUE(has_line(text, "vramgate_device_ready{device=\"virt:0\"} 1")) << text;
  EXPECT_TRUE(has_line(text, "vramgate_device_ready{device=\"virt:1\"} 0")) << text;
  EXPECT_TRUE(has_line(text, "vramgate_device_bytes{device=\"virt:0\",kind=\"capacity\"} 4096")) << text;
  EXPECT_TRUE(has_line(text, "vramgate_ready 1")) << text;  // one unhealthy device: the server stays ready
}

TEST_F(HttpMetricsTest, AKvBlockPoolIsReportedByStateAndItsPromptTokensBySource) {
  DeviceState paged;
  paged.name = "virt:0";
  paged.kv_reservation = "on-demand";
  paged.kv_blocks_total = 100;
  paged.kv_blocks_used = 30;
  paged.kv_blocks_cached = 20;
  paged.counters[DeviceCounterId::kKvBlocksEvicted] = 4;
  paged.counters[DeviceCounterId::kKvPromptTokens] = 500;
  paged.counters[DeviceCounterId::kKvPrefixHitTokens] = 320;
  paged.counters[DeviceCounterId::kKvRecomputedTokens] = 9;
  DeviceState plain;
  plain.name = "virt:1";
  service_.set_devices({paged, plain});
  start();
  TestClient c(server_->port());
  const std::string text = c.request(bhttp::verb::get, "/metrics").body();
  EXPECT_TRUE(has_line(text, "vramgate_kv_blocks{device=\"virt:0\",state=\"used\"} 30")) << text;
  EXPECT_TRUE(has_line(text, "vramgate_kv_blocks{device=\"virt:0\",state=\"cached\"} 20")) << text;
  EXPECT_TRUE(has_line(text, "vramgate_kv_blocks{device=\"virt:0\",state=\"free\"} 50")) << text;
  EXPECT_TRUE(has_line(text, "vramgate_kv_blocks_evicted_total{device=\"virt:0\"} 4")) << text;
  EXPECT_TRUE(has_line(text, "vramgate_prompt_tokens_total{device=\"virt:0\",source=\"prefix_cache\"} 320")) << text;
  EXPECT_TRUE(has_line(text, "vramgate_prompt_tokens_total{device=\"virt:0\",source=\"computed\"} 180")) << text;
  EXPECT_TRUE(has_line(text, "vramgate_recomputed_tokens_total{device=\"virt:0\"} 9")) << text;
  EXPECT_EQ(text.find("vramgate_kv_blocks{device=\"virt:1\""), std::string::npos) << text;  // no pool there
}

TEST_F(HttpMetricsTest, WithoutARegistryMetricsIsNotFound) {
  start(false);
  TestClient c(server_->port());
  EXPECT_EQ(c.request(bhttp::verb::get, "/metrics").result_int(), 404);
}

TEST(RequestLog, LineIsValidJsonAndTextOnlyWhenGiven) {
  httpd::RequestLogLine l;
  l.id = "abc\"\n";
  l.model = "tinylm";
  l.route = "/v1/completions";
  l.status = 200;
  l.prompt_tokens = 4;
  l.completion_tokens = 7;
  l.reserved_bytes = 12345;
  l.queue_ms = 1.23456;
  l.outcome = "completed";
  l.reason = "length";
  json::value v = json::parse(httpd::encode_request_log(l));
  const json::object& o = v.as_object();
  EXPECT_EQ(o.at("id").as_string(), "abc\"\n");
  EXPECT_EQ(o.at("completion_tokens").as_int64(), 7);
  EXPECT_EQ(o.at("reserved_bytes").as_int64(), 12345);
  EXPECT_DOUBLE_EQ(o.at("queue_ms").as_double(), 1.235);
  EXPECT_EQ(o.at("outcome").as_string(), "completed");
  EXPECT_FALSE(o.contains("prompt"));
  EXPECT_FALSE(o.contains("output"));

  l.prompt = std::string("caf\xc3");  // truncated UTF-8 is sanitized, not copied
  l.output = "done";
  json::value w = json::parse(httpd::encode_request_log(l));
  EXPECT_TRUE(w.as_object().at("prompt").is_string());
  EXPECT_EQ(w.as_object().at("output").as_string(), "done");
  l.prompt = std::vector<std::int32_t>{1, 2};
  json::value t = json::parse(httpd::encode_request_log(l));
  EXPECT_EQ(t.as_object().at("prompt").as_array().size(), 2u);
}

}  // namespace
}  // namespace vg
