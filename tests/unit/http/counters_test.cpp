// Every counter of api/counters.hpp's table reaches GET /v1/admission and
// /metrics under the names its row gives, with its own value.
#include <sstream>
#include <string>

#include <boost/json.hpp>
#include <gtest/gtest.h>

#include "api/counters.hpp"
#include "http/json_codec.hpp"
#include "metrics/server_metrics.hpp"

namespace vg {
namespace {

namespace json = boost::json;

// Each counter a value of its own: 100 + its index.
Counters distinct_counters() {
  Counters c;
  for (const CounterInfo& info : kCounters) c[info.id] = 100 + static_cast<std::int64_t>(info.id);
  return c;
}

bool has_metric_line(const std::string& text, const std::string& line) {
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) {
    if (l == line) return true;
  }
  return false;
}

TEST(Counters, EveryCounterIsInTheAdmissionBodyUnderItsName) {
  AdmissionState st;
  st.counters = distinct_counters();
  const json::object body = json::parse(encode_admission(st)).as_object();
  const json::object& retry = body.at("retry_bookings").as_object();
  for (const CounterInfo& c : kCounters) {
    const json::object& where = c.section == CounterSection::kTop ? body : retry;
    ASSERT_TRUE(where.contains(c.api_key)) << c.key;
    EXPECT_EQ(where.at(c.api_key).as_int64(), st.counters[c.id]) << c.key;
  }
}

TEST(Counters, EveryExposedCounterIsInTheMetricsUnderItsFamilyAndLabel) {
  metrics::Registry registry;
  metrics::ServerMetrics m(registry);
  metrics::StateSample s;
  s.counters = distinct_counters();
  const std::string text = m.scrape(s);
  int exposed = 0;
  for (const CounterInfo& c : kCounters) {
    if (!c.metric) continue;
    ++exposed;
    std::string series(c.metric->name);
    if (!c.metric->label.empty()) series += "{" + std::string(c.metric->label) + "=\"" + std::string(c.label) + "\"}";
    EXPECT_TRUE(has_metric_line(text, series + " " + std::to_string(s.counters[c.id]))) << series << "\n" << text;
    EXPECT_TRUE(has_metric_line(text, "# TYPE " + std::string(c.metric->name) + " counter")) << c.metric->name;
  }
  EXPECT_GT(exposed, 0);
}

TEST(Counters, AddUpElementwise) {
  Counters a = distinct_counters();
  Counters b;
  b[CounterId::kCompleted] = 5;
  a += b;
  EXPECT_EQ(a[CounterId::kCompleted], 100 + static_cast<std::int64_t>(CounterId::kCompleted) + 5);
  EXPECT_EQ(a[CounterId::kAdmitted], 100 + static_cast<std::int64_t>(CounterId::kAdmitted));
}

}  // namespace
}  // namespace vg
