// Engines of two devices drawing from one front (shared admission queue):
// placement by free budget, a busy device does not hold up work another can
// take, a device that stops granting hands its work over, and no request is
// lost or answered twice.
#include <gtest/gtest.h>

#include "engine/engine.hpp"
#include "engine_test_util.hpp"

namespace vg {
namespace {

using testing::Collector;
using testing::FakeModel;

// Cost: 100 bytes per token (prompt + max_tokens); each device's budget
// holds one 5-token request (500 bytes) but not two.
constexpr std::int64_t kDeviceBudget = 900;

class MultiDeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int i = 0; i < 2; ++i) devices_[i] = std::make_unique<testing::FakeDevice>(i);
  }

  Engine::Options options() const {
    Engine::Options o;
    o.max_batch = 4;
    o.admission.policy = AdmissionPolicy{AdmissionPolicy::Kind::kMemory, 0};
    o.admission.budget_bytes = kDeviceBudget;
    o.admission.max_queue = 16;
    o.profile.kv_bytes_per_token = 100;
    o.profile.safety_factor = 1.0;
    o.oom_governor.floor_fraction = 1.0;  // keep the budget: these tests are about placement
    return o;
  }

  void start(Engine::Options o) {
    AdmissionTopology t;
    t.devices = {{"virt:0", kDeviceBudget}, {"virt:1", kDeviceBudget}};
    t.engines = {{0, 0, o.max_batch}, {1, 0, o.max_batch}};
    auto front = make_engine_front(o.admission, t);
    ASSERT_TRUE(front.ok());
    for (int i = 0; i < 2; ++i) {
      auto e = Engine::create(o, models_[i], *devices_[i], *front, i);
      ASSERT_TRUE(e.ok()) << e.error().message;
      engines_[i] = std::move(e).value();
    }
  }

  static GenerationRequest req(int max_tokens) {
    GenerationRequest r;
    r.id = "m";
    r.prompt = {'a'};
    r.max_tokens = max_tokens;
    r.sampling.temperature = 0;
    return r;
  }

  FakeModel models_[2];
  std::unique_ptr<testing::FakeDevice> devices_[2];
  std::unique_ptr<Engine> engines_[2];  // declared last: stopped before the models go
};

TEST_F(MultiDeviceTest, ABusyDeviceDoesNotHoldUpWorkTheOtherCanTake) {
  start(options());
  models_[0].block();
  auto a = std::make_shared<Collector>();
  ASSERT_TRUE(engines_[0]->submit(req(4), a).ok());  // both empty: the tie goes to device 0
  ASSERT_TRUE(models_[0].wait_in_step());
  // Device 0 now holds 500 of 900 bytes; the next request goes to device 1,
  // whichever engine it is submitted through, and finishes while device 0 is stuck.
  auto b = std::make_shared<Collector>();
  ASSERT_TRUE(engines_[0]->submit(req(4), b).ok());
  ASSERT_TRUE(b->wait_done());
  ASSERT_TRUE(b->finished());
  EXPECT_FALSE(a->finished());
  EXPECT_GT(models_[1].steps(), 0);
  models_[0].unblock();
  ASSERT_TRUE(a->wait_done());
  ASSERT_TRUE(a->finished());
  EXPECT_EQ(a->terminals(), 1);
  EXPECT_EQ(b->terminals(), 1);
  EXPECT_EQ(engines_[0]->stats().counters[CounterId::kCompleted] + engines_[1]->stats().counters[CounterId::kCompleted],
            2);
  const AdmissionSnapshot snap = engines_[1]->admission();
  ASSERT_EQ(snap.devices.size(), 2u);
  EXPECT_EQ(snap.devices[0].peak_reserved_bytes, 500);
  EXPECT_EQ(snap.devices[1].peak_reserved_bytes, 500);
  EXPECT_EQ(snap.reserved_bytes, 0);
}

TEST_F(MultiDeviceTest, WhatFitsNowhereWaitsInOneQueueForTheFirstDeviceThatFrees) {
  start(options());
  models_[0].block();
  models_[1].block();
  auto a = std::make_shared<Collector>();
  auto b = std::make_shared<Collector>();
  ASSERT_TRUE(engines_[0]->submit(req(4), a).ok());
  ASSERT_TRUE(engines_[1]->submit(req(4), b).ok());
  ASSERT_TRUE(models_[0].wait_in_step());
  ASSERT_TRUE(models_[1].wait_in_step());
  // Both devices hold one request; the third fits on neither and waits.
  auto c = std::make_shared<Collector>();
  int position = 0;
  ASSERT_TRUE(engines_[0]->submit(req(4), c, &position).ok());
  EXPECT_EQ(position, 1);
  EXPECT_EQ(engines_[0]->stats().queue_depth, 1);
  EXPECT_EQ(engines_[1]->stats().queue_depth, 1);  // one queue, seen by both
  // Device 1 finishes first: the waiting request runs there, though it was
  // submitted through device 0's engine.
  models_[1].unblock();
  ASSERT_TRUE(b->wait_done());
  ASSERT_TRUE(c->wait_done());
  ASSERT_TRUE(c->finished());
  EXPECT_FALSE(a->finished());
  models_[0].unblock();
  ASSERT_TRUE(a->wait_done());
  for (auto* x : {a.get(), b.get(), c.get()}) EXPECT_EQ(x->terminals(), 1);
  EXPECT_EQ(engines_[0]->stats().counters[CounterId::kCompleted], 1);
  EXPECT_EQ(engines_[1]->stats().counters[CounterId::kCompleted], 2);
}

TEST_F(MultiDeviceTest, ADeviceMarkedNotReadyHandsItsWorkToTheOther) {
  Engine::Options o = options();
  o.oom_unready_after = 1;  // one out-of-memory step marks the device not ready
  o.oom_governor.quiet_period = std::chrono::hours(1);
  models_[0].fail_at_step(3, 1000);  // device 0 fails from its third step on
  start(o);
  auto a = std::make_shared<Collector>();
  ASSERT_TRUE(engines_[0]->submit(req(7), a).ok());  // goes to device 0 (tie)
  ASSERT_TRUE(a->wait_done());
  ASSERT_TRUE(a->finished()) << (a->failed() ? a->failed()->message : "");
  // Preempted on device 0 after 2 tokens, recomputed and finished on device 1,
  // with the same text as an undisturbed run and each token sent once.
  EXPECT_EQ(a->text(), "ello wo");
  EXPECT_EQ(a->terminals(), 1);
  EXPECT_EQ(engines_[0]->stats().counters[CounterId::kPreemptions], 1);
  EXPECT_EQ(engines_[1]->stats().counters[CounterId::kCompleted], 1);
  std::string reason;
  EXPECT_FALSE(engines_[0]->ready(Clock::now(), &reason));
  EXPECT_NE(reason.find("virt:0"), std::string::npos);
  // Device 0 refuses new work through its own engine; device 1 serves it.
  EXPECT_FALSE(engines_[0]->submit(req(2), std::make_shared<Collector>()).ok());
  auto b = std::make_shared<Collector>();
  ASSERT_TRUE(engines_[1]->submit(req(2), b).ok());
  ASSERT_TRUE(b->wait_done());
  EXPECT_TRUE(b->finished());
}

TEST_F(MultiDeviceTest, ShutdownAnswersWhatWaitsOnce) {
  start(options());
  models_[0].block();
  models_[1].block();
  std::vector<std::shared_ptr<Collector>> all;
  for (int i = 0; i < 4; ++i) {
    all.push_back(std::make_shared<Collector>());
    ASSERT_TRUE(engines_[i % 2]->submit(req(4), all.back()).ok());
  }
  ASSERT_TRUE(models_[0].wait_in_step());
  ASSERT_TRUE(models_[1].wait_in_step());
  engines_[0]->request_stop();
  engines_[1]->request_stop();
  models_[0].unblock();
  models_[1].unblock();
  engines_[0]->shutdown();
  engines_[1]->shutdown();
  for (auto& c : all) {
    ASSERT_TRUE(c->wait_done());
    EXPECT_EQ(c->terminals(), 1);
  }
}

}  // namespace
}  // namespace vg
