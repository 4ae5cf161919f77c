// The Redis gateway (QueueService) against a redis-server of its own, with
// engine registrations written as engines write them: what it shows of the
// engines' counters while their processes crash and restart under the same
// engine id, or leave the registry.
#include "queue/queue_service.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <boost/json.hpp>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "wire/codec.hpp"
#include "redis_fixture.hpp"

namespace vg::queue {
namespace {

using namespace std::chrono_literals;
using testing::RedisFixture;
namespace json = boost::json;

/// A state with every counter of both tables at `base` + its index, on one
/// device virt:0.
AdmissionState state_at(std::int64_t base) {
  AdmissionState s;
  for (std::size_t i = 0; i < kCounterCount; ++i) s.counters.values[i] = base + static_cast<std::int64_t>(i);
  DeviceState d;
  d.name = "virt:0";
  for (std::size_t i = 0; i < kDeviceCounterCount; ++i) d.counters.values[i] = 2 * base + static_cast<std::int64_t>(i);
  s.devices.push_back(d);
  return s;
}

/// Every counter of `s`, named: the service's, and those of the device
/// named `device` (-1 when it does not list it).
std::map<std::string, std::int64_t> every_counter(const AdmissionState& s, const std::string& device) {
  std::map<std::string, std::int64_t> out;
  for (const CounterInfo& c : kCounters) out[std::string(c.key)] = s.counters[c.id];
  const DeviceState* d = nullptr;
  for (const DeviceState& x : s.devices) {
    if (x.name == device) d = &x;
  }
  for (const DeviceCounterInfo& c : kDeviceCounters) {
    out["device." + std::string(c.key)] = d ? d->counters[c.id] : -1;
  }
  return out;
}

json::array encoded(const std::vector<ModelInfo>& models) {
  json::array out;
  for (const ModelInfo& m : models) out.push_back(wire::encode(m));
  return out;
}

/// Records the events a request's client receives.
class Recorder final : public EventSink {
 public:
  void push(EngineEvent e) override {
    std::lock_guard lk(mu_);
    events_.push_back(std::move(e));
    cv_.notify_all();
  }
  bool wait_terminal() {
    std::unique_lock lk(mu_);
    return cv_.wait_for(lk, 10s, [&] { return !events_.empty() && is_terminal(events_.back()); });
  }
  template <class T>
  int count() {
    std::lock_guard lk(mu_);
    return static_cast<int>(std::count_if(events_.begin(), events_.end(),
                                          [](const EngineEvent& e) { return std::holds_alternative<T>(e); }));
  }
  std::string text() {
    std::lock_guard lk(mu_);
    std::string out;
    for (const EngineEvent& e : events_) {
      if (const auto* t = std::get_if<TextEvent>(&e)) out += t->text;
    }
    return out;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<EngineEvent> events_;
};

class QueueServiceTest : public RedisFixture {
 protected:
  void SetUp() override {
    RedisFixture::SetUp();
    if (HasFatalFailure()) return;
    QueueService::Options o;
    auto url = parse_redis_url(server_.url());
    ASSERT_TRUE(url.ok());
    o.url = *url;
    o.gateway_id = "gw1";
    o.heartbeat = 20ms;
    o.engine_stale = 30s;  // the registrations the test writes stay fresh
    auto s = QueueService::start(o);
    ASSERT_TRUE(s.ok()) << s.error().message;
    gateway_ = std::move(s).value();
    redis_ = &connect();
  }
  void TearDown() override {
    if (gateway_) gateway_->shutdown();
    gateway_.reset();
    RedisFixture::TearDown();
  }

  /// Writes engine `id`'s registration, as its QueueWorker does: process
  /// `pid` started at `started_at` (unix seconds), its state `state`.
  void register_engine(const std::string& id, std::int64_t pid, double started_at, const AdmissionState& state,
                       const std::vector<ModelInfo>& models = {}) {
    const auto now_ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
            .count();
    json::object reg{{"id", id},
                     {"host", "test"},
                     {"pid", pid},
                     {"devices", json::array{"virt:0"}},
                     {"models", encoded(models)},
                     {"admission", wire::encode(state)},
                     {"ready", true},
                     {"started_at", started_at},
                     {"at_ms", now_ms}};
    run(*redis_, {"HSET", SharedQueueKeys{}.engines(), id, json::serialize(reg)});
  }

  /// Polls the gateway's counters until they equal `expected`, checking at
  /// each poll that none is below its value at the poll before. True when
  /// they came to `expected`.
  bool counters_come_to(const std::map<std::string, std::int64_t>& expected) {
    auto last = every_counter(gateway_->admission_state(), "e1/virt:0");
    return testing::eventually([&] {
      const auto now = every_counter(gateway_->admission_state(), "e1/virt:0");
      for (const auto& [name, value] : now) {
        if (value < last.at(name)) ADD_FAILURE() << name << " went back from " << last.at(name) << " to " << value;
      }
      last = now;
      return now == expected;
    });
  }

  /// Writes `event` of request `rid` to the gateway's reply stream, as the
  /// engine holding its delivery `epoch` does.
  void reply(const std::string& rid, std::int64_t epoch, const EngineEvent& event) {
    run(*redis_, {"XADD", SharedQueueKeys{}.reply("gw1"), "*", "rid", rid, "epoch", std::to_string(epoch), "ev",
                  json::serialize(wire::encode(event))});
  }

  std::unique_ptr<QueueService> gateway_;
  RedisClient* redis_ = nullptr;
};

TEST_F(QueueServiceTest, EveryCounterIsCarriedWhenAnEnginesProcessIsReplacedUnderItsId) {
  register_engine("e1", 100, 1.0, state_at(100));
  const auto first = every_counter(state_at(100), "virt:0");
  ASSERT_TRUE(counters_come_to(first));
  // The process crashed; another registers under the same engine id and
  // counts from its own start.
  register_engine("e1", 200, 2.0, state_at(1000));
  auto expected = every_counter(state_at(1000), "virt:0");
  for (auto& [name, value] : expected) value += first.at(name);
  EXPECT_TRUE(counters_come_to(expected));
  // Its next registration, counts grown: the first process's stay under them.
  register_engine("e1", 200, 2.0, state_at(1001));
  expected = every_counter(state_at(1001), "virt:0");
  for (auto& [name, value] : expected) value += first.at(name);
  EXPECT_TRUE(counters_come_to(expected));
}

TEST_F(QueueServiceTest, TheSameProcessRegisteringAgainIsNotCountedTwice) {
  register_engine("e1", 100, 1.0, state_at(100));
  ASSERT_TRUE(counters_come_to(every_counter(state_at(100), "virt:0")));
  register_engine("e1", 100, 1.0, state_at(100));
  register_engine("e1", 100, 1.0, state_at(105));
  EXPECT_TRUE(counters_come_to(every_counter(state_at(105), "virt:0")));
}

TEST_F(QueueServiceTest, AnEngineThatLeavesTheRegistryKeepsItsServiceCounters) {
  register_engine("e1", 100, 1.0, state_at(100));
  ASSERT_TRUE(counters_come_to(every_counter(state_at(100), "virt:0")));
  run(*redis_, {"HDEL", SharedQueueKeys{}.engines(), "e1"});
  ASSERT_TRUE(testing::eventually([&] { return gateway_->admission_state().devices.empty(); }));
  EXPECT_EQ(gateway_->admission_state().counters, state_at(100).counters);
}

TEST_F(QueueServiceTest, WhatTheEngineThatTookARequestOverSendsAgainReachesItsClientOnce) {
  // The engine holding delivery 1 starts the request and sends a token,
  // then crashes; the engine that claims it (delivery 2) starts it again
  // and goes on after that token. Its client sees one start and the text
  // of both, in order.
  ModelInfo m;
  m.id = "m";
  m.context_length = 64;
  m.kv_bytes_per_token = 1024;
  AdmissionState st = state_at(0);
  st.devices[0].budget_bytes = st.devices[0].effective_budget_bytes = 1 << 30;
  register_engine("e1", 100, 1.0, st, {m});
  ASSERT_TRUE(testing::eventually([&] { return !gateway_->models().empty(); }));
  CompletionRequest r;
  r.model = "m";
  r.prompt = std::string("hello");
  r.max_tokens = 4;
  auto rec = std::make_shared<Recorder>();
  auto sub = gateway_->submit(r, rec);
  ASSERT_TRUE(sub.ok()) << sub.error().message;
  const std::string rid = "gw1-1";  // the gateway's first request
  reply(rid, 1, StartedEvent{});
  reply(rid, 1, TextEvent{"a", 1, 0, {}, {5}});
  reply(rid, 2, StartedEvent{});
  reply(rid, 2, TextEvent{"b", 1, 0, {}, {6}});
  reply(rid, 2, FinishedEvent{"length", {5, 2}, {}, 0});
  ASSERT_TRUE(rec->wait_terminal());
  EXPECT_EQ(rec->count<StartedEvent>(), 1);
  EXPECT_EQ(rec->text(), "ab");
  EXPECT_EQ(gateway_->stats().resumed, 1u);
}

}  // namespace
}  // namespace vg::queue
