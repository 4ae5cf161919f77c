// Registry and text exposition: escaping, value formatting, cumulative
// histogram buckets with _sum/_count, label handling and registration checks.
#include "metrics/registry.hpp"

#include <gtest/gtest.h>

#include <sstream>
#include <thread>

#include "metrics/server_metrics.hpp"

namespace vg::metrics {
namespace {

bool has_line(const std::string& text, const std::string& line) {
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) {
    if (l == line) return true;
  }
  return false;
}

TEST(Registry, CounterAndGaugeWithHelpAndType) {
  Registry r;
  auto& c = r.counter("x_requests_total", "Requests.");
  auto& g = r.gauge("x_depth", "Depth.");
  c.with({}).inc();
  c.with({}).inc(2);
  g.with({}).set(7.5);
  const std::string text = r.expose();
  EXPECT_TRUE(has_line(text, "# HELP x_requests_total Requests."));
  EXPECT_TRUE(has_line(text, "# TYPE x_requests_total counter"));
  EXPECT_TRUE(has_line(text, "x_requests_total 3"));
  EXPECT_TRUE(has_line(text, "# TYPE x_depth gauge"));
  EXPECT_TRUE(has_line(text, "x_depth 7.5"));
}

TEST(Registry, LabelValuesAndHelpAreEscaped) {
  Registry r;
  auto& c = r.counter("x_total", "Line one\nback\\slash", {"path"});
  c.with({"a\"b\\c\nd"}).inc();
  const std::string text = r.expose();
  EXPECT_TRUE(has_line(text, "# HELP x_total Line one\\nback\\\\slash")) << text;
  EXPECT_TRUE(has_line(text, "x_total{path=\"a\\\"b\\\\c\\nd\"} 1")) << text;
}

TEST(Registry, LabelledFamilyWithoutChildrenShowsOnlyHelpAndType) {
  Registry r;
  r.counter("x_total", "X.", {"route", "status"});
  EXPECT_EQ(r.expose(), "# HELP x_total X.\n# TYPE x_total counter\n");
}

TEST(Registry, ChildrenAreSortedByLabelValuesAndStable) {
  Registry r;
  auto& c = r.counter("x_total", "X.", {"route", "status"});
  Counter& b = c.with({"/b", "200"});
  c.with({"/a", "404"}).inc();
  b.inc();
  EXPECT_EQ(&b, &c.with({"/b", "200"}));
  const std::string text = r.expose();
  EXPECT_LT(text.find("route=\"/a\""), text.find("route=\"/b\""));
  EXPECT_TRUE(has_line(text, "x_total{route=\"/b\",status=\"200\"} 1"));
}

TEST(Registry, HistogramBucketsAreCumulativeWithSumAndCount) {
  Registry r;
  auto& h = r.histogram("x_seconds", "X.", {0.1, 1, 10}, {"kind"});
  Histogram& a = h.with({"a"});
  a.observe(0.05);
  a.observe(0.1);  // upper bounds are inclusive
  a.observe(0.5);
  a.observe(100);
  const std::string text = r.expose();
  EXPECT_TRUE(has_line(text, "# TYPE x_seconds histogram"));
  EXPECT_TRUE(has_line(text, "x_seconds_bucket{kind=\"a\",le=\"0.1\"} 2")) << text;
  EXPECT_TRUE(has_line(text, "x_seconds_bucket{kind=\"a\",le=\"1\"} 3"));
  EXPECT_TRUE(has_line(text, "x_seconds_bucket{kind=\"a\",le=\"10\"} 3"));
  EXPECT_TRUE(has_line(text, "x_seconds_bucket{kind=\"a\",le=\"+Inf\"} 4"));
  EXPECT_TRUE(has_line(text, "x_seconds_sum{kind=\"a\"} 100.65"));
  EXPECT_TRUE(has_line(text, "x_seconds_count{kind=\"a\"} 4"));
}

TEST(Registry, UnlabelledHistogramStartsAtZero) {
  Registry r;
  r.histogram("x_seconds", "X.", {1});
  const std::string text = r.expose();
  EXPECT_TRUE(has_line(text, "x_seconds_bucket{le=\"1\"} 0"));
  EXPECT_TRUE(has_line(text, "x_seconds_bucket{le=\"+Inf\"} 0"));
  EXPECT_TRUE(has_line(text, "x_seconds_sum 0"));
  EXPECT_TRUE(has_line(text, "x_seconds_count 0"));
}

TEST(Registry, ConcurrentObservationsAreAllCounted) {
  Registry r;
  Histogram& h = r.histogram("x_seconds", "X.", {0.5}).with({});
  Counter& c = r.counter("x_total", "X.").with({});
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 10000; ++i) {
        h.observe(i % 2 ? 1.0 : 0.25);
        c.inc();
      }
    });
  }
  for (auto& t : threads) t.join();
  const auto s = h.snapshot();
  EXPECT_EQ(s.count, 40000u);
  EXPECT_EQ(s.cumulative[0], 20000u);
  EXPECT_DOUBLE_EQ(s.sum, 20000 * 1.25);
  EXPECT_EQ(c.value(), 40000);
}

TEST(Registry, BadRegistrationsThrow) {
  Registry r;
  r.counter("ok_total", "X.");
  EXPECT_THROW(r.counter("ok_total", "again"), std::invalid_argument);
  EXPECT_THROW(r.gauge("1bad", "X."), std::invalid_argument);
  EXPECT_THROW(r.gauge("has-dash", "X."), std::invalid_argument);
  EXPECT_THROW(r.gauge("g", "X.", {"__reserved"}), std::invalid_argument);
  EXPECT_THROW(r.histogram("h_seconds", "X.", {1}, {"le"}), std::invalid_argument);
  EXPECT_THROW(r.histogram("h2_seconds", "X.", {2, 1}), std::invalid_argument);
  EXPECT_THROW(r.counter("c_total", "X.", {"a"}).with({"x", "y"}), std::invalid_argument);
}

TEST(FormatValue, IntegersShortestFloatsAndSpecials) {
  EXPECT_EQ(format_value(0), "0");
  EXPECT_EQ(format_value(42), "42");
  EXPECT_EQ(format_value(-3), "-3");
  EXPECT_EQ(format_value(0.1), "0.1");
  EXPECT_EQ(format_value(0.001), "0.001");
  EXPECT_EQ(format_value(0.0005), "0.0005");  // a bucket bound: not "5e-04"
  EXPECT_EQ(format_value(1e17), "100000000000000000");
  EXPECT_EQ(format_value(1.0 / 0.0), "+Inf");
  EXPECT_EQ(format_value(-1.0 / 0.0), "-Inf");
  EXPECT_EQ(format_value(0.0 / 0.0), "NaN");
}

TEST(ServerMetrics, FillStateMirrorsCountersAndDeviceGauges) {
  Registry r;
  ServerMetrics m(r);
  StateSample s;
  s.queue_depth = 3;
  s.running = 2;
  s.ready = true;
  s.counters[CounterId::kAdmitted] = 5;
  s.counters[CounterId::kRejectedQueueFull] = 1;
  s.counters[CounterId::kOutOfMemory] = 4;
  s.devices.push_back({"virt:0", {{"capacity", 1024}, {"budget", 512}}, 0, true, 0, {}, {}, 0, {}, 0});
  m.count_http_request("/v1/completions", 200);
  m.count_http_request("/v1/completions", 200);
  m.generated_tokens_total.inc(9);
  const std::string text = m.scrape(s);
  EXPECT_TRUE(has_line(text, "vramgate_queue_depth 3"));
  EXPECT_TRUE(has_line(text, "vramgate_running_sequences 2"));
  EXPECT_TRUE(has_line(text, "vramgate_ready 1"));
  EXPECT_TRUE(has_line(text, "vramgate_admission_outcomes_total{reason=\"admitted\"} 5"));
  EXPECT_TRUE(has_line(text, "vramgate_admission_outcomes_total{reason=\"queue_full\"} 1"));
  EXPECT_TRUE(has_line(text, "vramgate_out_of_memory_total 4"));
  EXPECT_TRUE(has_line(text, "vramgate_preemptions_total 0"));
  EXPECT_TRUE(has_line(text, "vramgate_device_bytes{device=\"virt:0\",kind=\"capacity\"} 1024"));
  EXPECT_TRUE(has_line(text, "vramgate_http_requests_total{route=\"/v1/completions\",status=\"200\"} 2"));
  EXPECT_TRUE(has_line(text, "vramgate_generated_tokens_total 9"));
  EXPECT_TRUE(has_line(text, "# TYPE vramgate_time_to_first_token_seconds histogram"));
  // Per-device gauges default to 0 running and ready.
  EXPECT_TRUE(has_line(text, "vramgate_device_running_sequences{device=\"virt:0\"} 0"));
  EXPECT_TRUE(has_line(text, "vramgate_device_ready{device=\"virt:0\"} 1"));
}

TEST(ServerMetrics, ForeignBytesAndBudgetChangesPerDevice) {
  Registry r;
  ServerMetrics m(r);
  StateSample s;
  s.devices.push_back(
      {"virt:0", {{"capacity", 1024}}, 0, true, 600, {{"foreign_grew", 2}, {"foreign_shrank", 1}}, {}, 0, {}, 0});
  const std::string text = m.scrape(s);
  EXPECT_TRUE(has_line(text, "vramgate_device_foreign_bytes{device=\"virt:0\"} 600")) << text;
  EXPECT_TRUE(has_line(text, "vramgate_budget_changes_total{device=\"virt:0\",reason=\"foreign_grew\"} 2")) << text;
  EXPECT_TRUE(has_line(text, "vramgate_budget_changes_total{device=\"virt:0\",reason=\"foreign_shrank\"} 1")) << text;
}

TEST(ServerMetrics, PerDeviceRunningAndReadyGauges) {
  Registry r;
  ServerMetrics m(r);
  StateSample s;
  s.ready = true;
  s.running = 3;
  s.devices.push_back({"virt:0", {{"capacity", 1024}}, 3, true, 0, {}, {}, 0, {}, 0});
  s.devices.push_back({"virt:1", {{"capacity", 0}}, 0, false, 0, {}, {}, 0, {}, 0});
  std::string text = m.scrape(s);
  EXPECT_TRUE(has_line(text, "# TYPE vramgate_device_running_sequences gauge")) << text;
  EXPECT_TRUE(has_line(text, "# TYPE vramgate_device_ready gauge")) << text;
  EXPECT_TRUE(has_line(text, "vramgate_device_running_sequences{device=\"virt:0\"} 3")) << text;
  EXPECT_TRUE(has_line(text, "vramgate_device_running_sequences{device=\"virt:1\"} 0")) << text;
  EXPECT_TRUE(has_line(text, "vramgate_device_ready{device=\"virt:0\"} 1")) << text;
  EXPECT_TRUE(has_line(text, "vramgate_device_ready{device=\"virt:1\"} 0")) << text;
  // The next scrape follows the state: virt:0 trips, virt:1 is unchanged.
  s.devices[0].running = 0;
  s.devices[0].ready = false;
  text = m.scrape(s);
  EXPECT_TRUE(has_line(text, "vramgate_device_running_sequences{device=\"virt:0\"} 0")) << text;
  EXPECT_TRUE(has_line(text, "vramgate_device_ready{device=\"virt:0\"} 0")) << text;
  EXPECT_TRUE(has_line(text, "vramgate_device_ready{device=\"virt:1\"} 0")) << text;
}

}  // namespace
}  // namespace vg::metrics
