// What the engine tells operators: the watchdog heartbeat (busy_for), the
// metrics it records from its thread (histograms, generated tokens) and the
// timings carried by FailedEvent.
#include <gtest/gtest.h>

#include <condition_variable>
#include <mutex>
#include <thread>

#include "device/device.hpp"
#include "engine/engine.hpp"
#include "metrics/registry.hpp"
#include "metrics/server_metrics.hpp"
#include "engine_test_util.hpp"
#include "fake_device.hpp"
#include "fake_model.hpp"

namespace vg {
namespace {

using testing::eventually;
using testing::FakeDevice;
using testing::FakeModel;
using namespace std::chrono_literals;

class Sink final : public EventSink {
 public:
  void push(EngineEvent e) override {
    std::lock_guard lk(mu_);
    if (is_terminal(e)) last_ = e;
    cv_.notify_all();
  }
  bool wait_done() {
    std::unique_lock lk(mu_);
    return cv_.wait_for(lk, 20s, [&] { return last_.has_value(); });
  }
  std::optional<EngineEvent> last() {
    std::lock_guard lk(mu_);
    return last_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::optional<EngineEvent> last_;
};

class EngineOpsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    device_ = std::make_unique<FakeDevice>();
  }
  std::unique_ptr<Engine> make(metrics::ServerMetrics* m = nullptr, int max_preemptions = 3) {
    Engine::Options o;
    o.max_preemptions = max_preemptions;
    o.max_batch = 4;
    o.admission.policy = AdmissionPolicy{AdmissionPolicy::Kind::kFixed, 4};
    o.admission.budget_bytes = 1 << 30;
    o.profile.kv_bytes_per_token = 100;
    o.profile.safety_factor = 1.0;
    o.metrics = m;
    auto e = Engine::create(o, model_, *device_);
    EXPECT_TRUE(e.ok());
    return std::move(e).value();
  }
  static GenerationRequest req(int max_tokens) {
    GenerationRequest r;
    r.id = "t";
    r.prompt = {'a'};
    r.max_tokens = max_tokens;
    r.sampling.temperature = 0;
    return r;
  }

  FakeModel model_;
  std::unique_ptr<FakeDevice> device_;
};

TEST_F(EngineOpsTest, HeartbeatShowsAStepInProgressAndIdleOtherwise) {
  auto engine = make();
  EXPECT_FALSE(engine->busy_for(Clock::now()).has_value());
  model_.block();
  auto sink = std::make_shared<Sink>();
  ASSERT_TRUE(engine->submit(req(3), sink).ok());
  ASSERT_TRUE(model_.wait_in_step());
  // The step blocks; judged 10 s later it has been running for at least 10 s.
  const auto busy = engine->busy_for(Clock::now() + 10s);
  ASSERT_TRUE(busy.has_value());
  EXPECT_GE(*busy, 10s);
  model_.unblock();
  ASSERT_TRUE(sink->wait_done());
  EXPECT_TRUE(eventually([&] { return !engine->busy_for(Clock::now()).has_value(); }));
}

TEST_F(EngineOpsTest, RecordsLatencyHistogramsTokensAndBatchSizes) {
  metrics::Registry registry;
  metrics::ServerMetrics m(registry);
  auto engine = make(&m);
  auto a = std::make_shared<Sink>();
  auto b = std::make_shared<Sink>();
  model_.block();
  ASSERT_TRUE(engine->submit(req(5), a).ok());
  ASSERT_TRUE(model_.wait_in_step());
  ASSERT_TRUE(engine->submit(req(5), b).ok());  // joins a's batch at the next step
  model_.unblock();
  ASSERT_TRUE(a->wait_done());
  ASSERT_TRUE(b->wait_done());
  EXPECT_EQ(m.generated_tokens_total.value(), 10);
  EXPECT_EQ(m.queue_wait_seconds.snapshot().count, 2u);
  EXPECT_EQ(m.time_to_first_token_seconds.snapshot().count, 2u);
  EXPECT_EQ(m.inter_token_latency_seconds.snapshot().count, 8u);
  EXPECT_EQ(m.request_duration_seconds.snapshot().count, 2u);
  const auto batches = m.batch_size.snapshot();
  EXPECT_EQ(batches.count, static_cast<std::uint64_t>(model_.steps()));
  EXPECT_EQ(batches.cumulative[0], 2u) << "one step of a alone, and b's last step alone";
  EXPECT_EQ(batches.sum, 10) << "each of the 10 tokens came from one sequence-step";
}

TEST_F(EngineOpsTest, FailedEventCarriesTimingsAndDurationIsRecorded) {
  metrics::Registry registry;
  metrics::ServerMetrics m(registry);
  model_.fail_at_step(2);
  auto engine = make(&m, /*max_preemptions=*/0);  // the out-of-memory step fails the request
  auto sink = std::make_shared<Sink>();
  ASSERT_TRUE(engine->submit(req(5), sink).ok());
  ASSERT_TRUE(sink->wait_done());
  auto last = sink->last();
  ASSERT_TRUE(last && std::holds_alternative<FailedEvent>(*last));
  const auto& f = std::get<FailedEvent>(*last);
  EXPECT_EQ(f.usage.completion_tokens, 1);
  EXPECT_GE(f.timings.prefill_ms, 0);
  EXPECT_GE(f.timings.decode_ms, 0);
  EXPECT_EQ(m.request_duration_seconds.snapshot().count, 1u);
  EXPECT_EQ(m.generated_tokens_total.value(), 1);
}

}  // namespace
}  // namespace vg
