// Idempotency-Key flights and their registry on a manual clock
// (traffic/flight.hpp, traffic/idempotency.hpp).
#include "traffic/idempotency.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <thread>
#include <vector>

#include "../admission/manual_clock.hpp"

namespace vg::traffic {
namespace {

using namespace std::chrono_literals;
using vg::testing::ManualClock;

/// Records what a client receives.
struct Recorder final : EventSink {
  std::mutex mu;
  std::vector<EngineEvent> events;
  void push(EngineEvent e) override {
    std::lock_guard lock(mu);
    events.push_back(std::move(e));
  }
  std::string text() {
    std::lock_guard lock(mu);
    std::string s;
    for (auto& e : events) {
      if (auto* t = std::get_if<TextEvent>(&e)) s += t->text;
    }
    return s;
  }
  int terminals() {
    std::lock_guard lock(mu);
    int n = 0;
    for (auto& e : events) n += is_terminal(e) ? 1 : 0;
    return n;
  }
};

/// The work: counts cancels.
struct Work final : RequestHandle {
  std::atomic<int> cancels{0};
  std::string name = "req-1";
  void cancel() override { ++cancels; }
  const std::string& id() const override { return name; }
};

TEST(Flight, LateClientIsReplayedThenFollows) {
  auto flight = Flight::create("req-1");
  auto first = std::make_shared<Recorder>();
  auto h1 = flight->attach(first);
  auto work = std::make_shared<Work>();
  flight->start(work, FlightOrigin{"tinylm", 5, 2, 1000});
  flight->push(QueuedEvent{2});
  flight->push(QueuedEvent{1});
  flight->push(StartedEvent{3.0});
  flight->push(TextEvent{"Hello", 1});
  auto late = std::make_shared<Recorder>();
  auto h2 = flight->attach(late);
  EXPECT_EQ(h2->id(), "req-1");
  EXPECT_EQ(flight->attached(), 2);
  flight->push(TextEvent{" world", 1});
  flight->push(FinishedEvent{"length", Usage{5, 2}, {}});
  EXPECT_EQ(first->text(), "Hello world");
  EXPECT_EQ(late->text(), "Hello world");
  EXPECT_EQ(first->terminals(), 1);
  EXPECT_EQ(late->terminals(), 1);
  // Queue positions collapse in the record: the late client saw only the last.
  EXPECT_EQ(std::get<QueuedEvent>(late->events.front()).position, 1);
  EXPECT_EQ(flight->origin().queue_position, 2);
  // After the end: a replay gets everything, and nothing is cancelled.
  auto replay = std::make_shared<Recorder>();
  auto h3 = flight->attach(replay);
  EXPECT_EQ(replay->text(), "Hello world");
  EXPECT_EQ(replay->terminals(), 1);
  h1->cancel();
  h2.reset();
  h3->cancel();
  EXPECT_EQ(work->cancels.load(), 0);
  flight->push(TextEvent{"late", 1});  // after the terminal: dropped
  EXPECT_EQ(replay->text(), "Hello world");
}

TEST(Flight, WorkIsCancelledOnlyWhenEveryClientHasGone) {
  auto flight = Flight::create("req-1");
  auto work = std::make_shared<Work>();
  auto h1 = flight->attach(std::make_shared<Recorder>());
  flight->start(work, {});
  auto h2 = flight->attach(std::make_shared<Recorder>());
  auto h3 = flight->attach(std::make_shared<Recorder>());
  h1->cancel();
  h1->cancel();  // idempotent
  h3.reset();    // a handle dropped without cancel() counts as gone
  EXPECT_EQ(work->cancels.load(), 0);
  h2->cancel();
  EXPECT_EQ(work->cancels.load(), 1);
}

TEST(Flight, ClientsGoneBeforeStartCancelAtStart) {
  auto flight = Flight::create("req-1");
  flight->attach(std::make_shared<Recorder>())->cancel();
  auto work = std::make_shared<Work>();
  flight->start(work, {});
  EXPECT_EQ(work->cancels.load(), 1);
}

TEST(Flight, FailReachesEveryClientAndEndsOnce) {
  int ends = 0;
  bool completed = true;
  auto flight = Flight::create("req-1", [&](const Flight&, bool c) {
    ++ends;
    completed = c;
  });
  auto a = std::make_shared<Recorder>();
  auto b = std::make_shared<Recorder>();
  auto ha = flight->attach(a);
  auto hb = flight->attach(b);
  flight->fail(Error(ErrorCode::kOverloaded, "queue full"));
  flight->fail(Error(ErrorCode::kOverloaded, "again"));
  EXPECT_EQ(ends, 1);
  EXPECT_FALSE(completed);
  ASSERT_EQ(a->terminals(), 1);
  EXPECT_EQ(std::get<FailedEvent>(b->events.back()).error.message, "queue full");
  EXPECT_TRUE(flight->ended());
}

TEST(Flight, ConcurrentAttachSeesEveryEventOnce) {
  auto flight = Flight::create("req-1");
  auto owner = flight->attach(std::make_shared<Recorder>());
  constexpr int kTokens = 2000;
  std::thread engine([&] {
    for (int i = 0; i < kTokens; ++i) flight->push(TextEvent{"x", 1});
    flight->push(FinishedEvent{"length", {}, {}});
  });
  std::vector<std::shared_ptr<Recorder>> clients;
  std::vector<std::shared_ptr<RequestHandle>> handles;
  for (int i = 0; i < 50; ++i) {
    clients.push_back(std::make_shared<Recorder>());
    handles.push_back(flight->attach(clients.back()));
  }
  engine.join();
  for (auto& c : clients) {
    EXPECT_EQ(c->text(), std::string(kTokens, 'x'));
    EXPECT_EQ(c->terminals(), 1);
  }
}

class Registry : public ::testing::Test {
 protected:
  static inline ManualClock clock;
  static TimePoint now() { return clock.now(); }
  std::shared_ptr<IdempotencyRegistry> make(Duration ttl, std::size_t max = 100) {
    return IdempotencyRegistry::create({ttl, max});
  }
  const Digest body_a = sha256_parts({"/v1/completions", "{\"prompt\":\"a\"}"});
  const Digest body_b = sha256_parts({"/v1/completions", "{\"prompt\":\"b\"}"});
  using Outcome = IdempotencyRegistry::Outcome;
};

TEST_F(Registry, NewAttachReplayExpire) {
  auto r = make(300s);
  auto c1 = r->claim("k", body_a, "req-1", clock.now(), &now);
  ASSERT_EQ(c1.outcome, Outcome::kNew);
  auto c2 = r->claim("k", body_a, "req-2", clock.now(), &now);
  EXPECT_EQ(c2.outcome, Outcome::kAttached);
  EXPECT_EQ(c2.flight, c1.flight);
  EXPECT_EQ(c2.flight->id(), "req-1");
  EXPECT_EQ(r->claim("k", body_b, "req-3", clock.now(), &now).outcome, Outcome::kConflict);
  EXPECT_EQ(r->claim("other", body_b, "req-4", clock.now(), &now).outcome, Outcome::kNew);

  clock.advance(10s);
  c1.flight->push(FinishedEvent{"stop", {}, {}});  // ends at now: replayable until +300 s
  clock.advance(299s);
  EXPECT_EQ(r->claim("k", body_a, "req-5", clock.now(), &now).outcome, Outcome::kReplayed);
  EXPECT_EQ(r->claim("k", body_b, "req-6", clock.now(), &now).outcome, Outcome::kConflict);
  clock.advance(1s);
  auto fresh = r->claim("k", body_b, "req-7", clock.now(), &now);
  EXPECT_EQ(fresh.outcome, Outcome::kNew);  // expired: the key is free, any body
  EXPECT_NE(fresh.flight, c1.flight);
}

TEST_F(Registry, FailedOrCancelledWorkIsForgotten) {
  auto r = make(300s);
  auto c1 = r->claim("k", body_a, "req-1", clock.now(), &now);
  c1.flight->fail(Error(ErrorCode::kOverloaded, "queue full"));
  EXPECT_EQ(r->size(), 0u);
  auto c2 = r->claim("k", body_a, "req-2", clock.now(), &now);
  EXPECT_EQ(c2.outcome, Outcome::kNew);
  c2.flight->push(FailedEvent{Error(ErrorCode::kCancelled, "client closed"), {}, {}});
  EXPECT_EQ(r->claim("k", body_a, "req-3", clock.now(), &now).outcome, Outcome::kNew);
}

TEST_F(Registry, ZeroTtlKeepsOnlyRunningWork) {
  auto r = make(0s);
  auto c1 = r->claim("k", body_a, "req-1", clock.now(), &now);
  EXPECT_EQ(r->claim("k", body_a, "req-2", clock.now(), &now).outcome, Outcome::kAttached);
  c1.flight->push(FinishedEvent{"stop", {}, {}});
  EXPECT_EQ(r->claim("k", body_a, "req-3", clock.now(), &now).outcome, Outcome::kNew);
}

TEST_F(Registry, BoundedEvictsExpiredThenOldestCompletedNeverRunning) {
  auto r = make(100s, 2);
  auto a = r->claim("a", body_a, "req-a", clock.now(), &now);
  auto b = r->claim("b", body_a, "req-b", clock.now(), &now);
  // Both running: no room for a third key.
  EXPECT_EQ(r->claim("c", body_a, "req-c", clock.now(), &now).outcome, Outcome::kFull);
  b.flight->push(FinishedEvent{"stop", {}, {}});
  clock.advance(1s);
  auto c = r->claim("c", body_a, "req-c", clock.now(), &now);
  EXPECT_EQ(c.outcome, Outcome::kNew);  // b (completed) made room; a still runs
  EXPECT_EQ(r->claim("a", body_a, "req-a2", clock.now(), &now).outcome, Outcome::kAttached);
  EXPECT_EQ(r->claim("b", body_a, "req-b2", clock.now(), &now).outcome, Outcome::kFull);
  EXPECT_EQ(r->size(), 2u);
}

TEST_F(Registry, EndOfAReplacedFlightIsIgnored) {
  auto r = make(0s);
  auto c1 = r->claim("k", body_a, "req-1", clock.now(), &now);
  r->finished("k", c1.flight.get(), false, clock.now());  // forgotten
  auto c2 = r->claim("k", body_b, "req-2", clock.now(), &now);
  ASSERT_EQ(c2.outcome, Outcome::kNew);
  r->finished("k", c1.flight.get(), false, clock.now());  // c1's late end must not drop c2
  EXPECT_EQ(r->claim("k", body_b, "req-3", clock.now(), &now).outcome, Outcome::kAttached);
}

}  // namespace
}  // namespace vg::traffic
