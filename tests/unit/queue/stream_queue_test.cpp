// StreamQueue against a real redis-server: cost classes, add/read/ack,
// class selection by budget, autoclaim after idle, delivery counts,
// heartbeats, malformed entries, and the shared token bucket.
#include <gtest/gtest.h>

#include <future>
#include <thread>

#include "queue/stream_queue.hpp"
#include "redis_fixture.hpp"

namespace vg::queue {
namespace {

using namespace std::chrono_literals;
using Entry = StreamQueue::Entry;
using testing::RedisFixture;

// Runs one asynchronous StreamQueue operation and waits for its callback.
template <class T, class F>
Result<T> sync(F start) {
  auto promise = std::make_shared<std::promise<Result<T>>>();
  auto result = promise->get_future();
  start([promise](Result<T> r) { promise->set_value(std::move(r)); });
  if (result.wait_for(20s) != std::future_status::ready) return Error(ErrorCode::kInternal, "no callback");
  return result.get();
}

TEST(CostClass, PowersOfTwoOfBytes) {
  EXPECT_EQ(StreamQueue::cost_class(0), 0);
  EXPECT_EQ(StreamQueue::cost_class(1), 0);
  EXPECT_EQ(StreamQueue::cost_class(2), 1);
  EXPECT_EQ(StreamQueue::cost_class(3), 2);
  EXPECT_EQ(StreamQueue::cost_class(1024), 10);
  EXPECT_EQ(StreamQueue::cost_class(1025), 11);
  EXPECT_EQ(StreamQueue::cost_class(std::int64_t{3} << 30), 32);
  EXPECT_EQ(StreamQueue::top_class(0), -1);
  EXPECT_EQ(StreamQueue::top_class(1), 0);
  EXPECT_EQ(StreamQueue::top_class(1023), 9);
  EXPECT_EQ(StreamQueue::top_class(1024), 10);
  for (std::int64_t c = 1; c < 5000; ++c) {
    int k = StreamQueue::cost_class(c);
    ASSERT_LE(c, std::int64_t{1} << k) << c;
    if (k > 0) {
      ASSERT_GT(c, std::int64_t{1} << (k - 1)) << c;
    }
  }
  // Whatever a budget's classes hold fits the budget.
  for (std::int64_t budget = 1; budget < 600; budget += 7) {
    for (std::int64_t c = 0; c < 1200; c += 3) {
      if (StreamQueue::cost_class(c) <= StreamQueue::top_class(budget)) {
        ASSERT_LE(c, budget) << c << " " << budget;
      }
    }
  }
}

TEST(StreamQueueKeys, ModelNamesAreChecked) {
  EXPECT_TRUE(StreamQueue::validate_model("meta-llama/Llama-2-7b").ok());
  EXPECT_FALSE(StreamQueue::validate_model("").ok());
  EXPECT_FALSE(StreamQueue::validate_model("a b").ok());
  EXPECT_FALSE(StreamQueue::validate_model("a{b").ok());
  EXPECT_FALSE(StreamQueue::validate_model(std::string("a\nb")).ok());
  EXPECT_FALSE(StreamQueue::validate_model(std::string(201, 'm')).ok());
}

class StreamQueueTest : public RedisFixture {
 protected:
  void SetUp() override {
    RedisFixture::SetUp();
    if (HasFatalFailure()) return;
    client_ = &connect();
    queue_ = std::make_unique<StreamQueue>(*client_, StreamQueue::Options{});
  }
  void TearDown() override {
    RedisFixture::TearDown();  // closes the clients before the queues go
    queue_.reset();
    other_queue_.reset();
  }

  void ensure_groups(const std::string& model, int up_to) {
    for (int k = 0; k <= up_to; ++k) {
      auto made = sync<bool>([&](auto done) { queue_->ensure_group(model, k, done); });
      ASSERT_TRUE(made.ok()) << made.error().message;
    }
  }
  Entry add(const std::string& model, std::int64_t cost, StreamQueue::Fields fields = {}) {
    auto e = sync<Entry>([&](auto done) { queue_->add(model, cost, fields, done); });
    EXPECT_TRUE(e.ok()) << e.error().message;
    return e ? *e : Entry{};
  }
  std::optional<Entry> read(const std::string& model, std::int64_t budget, const std::string& consumer) {
    auto r = sync<std::optional<Entry>>([&](auto done) { queue_->read_fit(model, budget, consumer, done); });
    EXPECT_TRUE(r.ok()) << r.error().message;
    return r ? *r : std::nullopt;
  }
  std::optional<StreamQueue::PendingInfo> pending(const std::string& model, const Entry& e) {
    auto r = sync<std::optional<StreamQueue::PendingInfo>>(
        [&](auto done) { queue_->pending_info(model, e.cost_class, e.id, done); });
    EXPECT_TRUE(r.ok()) << r.error().message;
    return r ? *r : std::nullopt;
  }
  // Polls the server until the entry has been idle `at_least` (server-side idle time).
  bool idle_for(const std::string& model, const Entry& e, Duration at_least) {
    return testing::eventually([&] {
      auto info = pending(model, e);
      return info && info->idle >= at_least;
    });
  }

  RedisClient* client_ = nullptr;
  std::unique_ptr<StreamQueue> queue_;
  std::unique_ptr<StreamQueue> other_queue_;
};

TEST_F(StreamQueueTest, GroupCreationIsIdempotent) {
  auto first = sync<bool>([&](auto done) { queue_->ensure_group("m", 3, done); });
  ASSERT_TRUE(first.ok()) << first.error().message;
  EXPECT_TRUE(*first);
  auto second = sync<bool>([&](auto done) { queue_->ensure_group("m", 3, done); });
  ASSERT_TRUE(second.ok()) << second.error().message;
  EXPECT_FALSE(*second);
  EXPECT_EQ(run(*client_, {"TYPE", queue_->stream_key("m", 3)}), RedisValue::status("stream"));
}

TEST_F(StreamQueueTest, AddReadAck) {
  ensure_groups("m", 12);
  const std::string prompt("hello\0world\xff", 12);
  Entry added = add("m", 1000, {{"request_id", "r1"}, {"prompt", prompt}});
  EXPECT_EQ(added.cost_class, 10);
  EXPECT_FALSE(added.id.empty());

  auto got = read("m", 1024, "engine-1");
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->id, added.id);
  EXPECT_EQ(got->cost_class, 10);
  EXPECT_EQ(got->cost_bytes, 1000);
  EXPECT_EQ(got->problem, "");
  StreamQueue::Fields want{{"cost", "1000"}, {"request_id", "r1"}, {"prompt", prompt}};
  EXPECT_EQ(got->fields, want);
  EXPECT_EQ(got->fields, added.fields);

  auto info = pending("m", *got);
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->consumer, "engine-1");
  EXPECT_EQ(info->deliveries, 1);
  EXPECT_FALSE(read("m", 1024, "engine-2").has_value()) << "delivered twice";

  auto acked = sync<bool>([&](auto done) { queue_->ack("m", got->cost_class, got->id, done); });
  ASSERT_TRUE(acked.ok()) << acked.error().message;
  EXPECT_TRUE(*acked);
  auto again = sync<bool>([&](auto done) { queue_->ack("m", got->cost_class, got->id, done); });
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(*again);
  EXPECT_FALSE(pending("m", *got).has_value());
  auto len = sync<std::int64_t>([&](auto done) { queue_->length("m", 10, done); });
  ASSERT_TRUE(len.ok());
  EXPECT_EQ(*len, 0) << "acknowledged entries are deleted";
}

TEST_F(StreamQueueTest, ReadsOnlyClassesTheBudgetHoldsLargestFirst) {
  ensure_groups("m", 20);
  Entry small = add("m", 100);     // class 7 (<= 128 bytes)
  Entry large = add("m", 100000);  // class 17 (<= 131072 bytes)
  ASSERT_EQ(small.cost_class, 7);
  ASSERT_EQ(large.cost_class, 17);

  EXPECT_FALSE(read("m", 127, "e").has_value()) << "class 7 may cost 128 bytes: not within 127";
  auto a = read("m", 1000, "e");
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->id, small.id);
  EXPECT_LE(a->cost_bytes, 1000);
  EXPECT_FALSE(read("m", 1000, "e").has_value()) << "the large one does not fit 1000 bytes";

  Entry small2 = add("m", 128);
  auto b = read("m", 200000, "e");  // both fit: the largest class first
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->id, large.id);
  auto c = read("m", 200000, "e");
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->id, small2.id);
  EXPECT_FALSE(read("m", 200000, "e").has_value());
  // Another model's streams are not read.
  add("other", 10);
  EXPECT_FALSE(read("m", 200000, "e").has_value());
}

TEST_F(StreamQueueTest, AutoclaimTakesOnlyEntriesIdlePastTheLimit) {
  ensure_groups("m", 8);
  add("m", 200);
  auto held = read("m", 256, "dead-engine");
  ASSERT_TRUE(held.has_value());

  auto too_soon = sync<std::vector<Entry>>([&](auto done) { queue_->autoclaim("m", 8, "e2", 60s, 10, done); });
  ASSERT_TRUE(too_soon.ok()) << too_soon.error().message;
  EXPECT_TRUE(too_soon->empty());
  EXPECT_EQ(pending("m", *held)->consumer, "dead-engine");

  ASSERT_TRUE(idle_for("m", *held, 50ms));
  auto claimed = sync<std::vector<Entry>>([&](auto done) { queue_->autoclaim("m", 8, "e2", 50ms, 10, done); });
  ASSERT_TRUE(claimed.ok()) << claimed.error().message;
  ASSERT_EQ(claimed->size(), 1u);
  EXPECT_EQ((*claimed)[0].id, held->id);
  EXPECT_EQ((*claimed)[0].cost_bytes, 200);
  EXPECT_EQ((*claimed)[0].problem, "");
  auto info = pending("m", *held);
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->consumer, "e2");
  EXPECT_EQ(info->deliveries, 2);

  // A heartbeat keeps the claim without counting a delivery: its idle time
  // starts again, so a claim for entries idle 300 ms finds nothing.
  ASSERT_TRUE(idle_for("m", *held, 300ms));
  auto touched = sync<bool>([&](auto done) { queue_->touch("m", 8, "e2", held->id, done); });
  ASSERT_TRUE(touched.ok()) << touched.error().message;
  EXPECT_TRUE(*touched);
  auto not_idle = sync<std::vector<Entry>>([&](auto done) { queue_->autoclaim("m", 8, "e3", 300ms, 10, done); });
  ASSERT_TRUE(not_idle.ok());
  EXPECT_TRUE(not_idle->empty());
  info = pending("m", *held);
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->deliveries, 2);
  EXPECT_EQ(info->consumer, "e2");
  EXPECT_LT(info->idle, 300ms);

  auto gone = sync<bool>([&](auto done) { queue_->touch("m", 8, "e2", "1-1", done); });
  ASSERT_TRUE(gone.ok()) << gone.error().message;
  EXPECT_FALSE(*gone);
}

TEST_F(StreamQueueTest, MalformedEntriesAreReadWithTheirProblem) {
  ensure_groups("m", 7);
  std::string key = queue_->stream_key("m", 7);
  ASSERT_TRUE(run(*client_, {"XADD", key, "*", "cost", "lots"}).as_string());
  ASSERT_TRUE(run(*client_, {"XADD", key, "*", "cost", "5000"}).as_string());
  ASSERT_TRUE(run(*client_, {"XADD", key, "*", "prompt", "x"}).as_string());
  auto a = read("m", 128, "e");
  ASSERT_TRUE(a.has_value());
  EXPECT_NE(a->problem.find("cost"), std::string::npos) << a->problem;
  auto b = read("m", 128, "e");
  ASSERT_TRUE(b.has_value());
  EXPECT_NE(b->problem.find("does not belong in class 7"), std::string::npos) << b->problem;
  auto c = read("m", 128, "e");
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->problem, "no cost field");
  // They are pending, for the caller to dead-letter and acknowledge.
  EXPECT_TRUE(pending("m", *a).has_value());
}

TEST_F(StreamQueueTest, ErrorRepliesBecomeErrors) {
  ASSERT_EQ(run(*client_, {"SET", queue_->stream_key("m", 4), "not a stream"}), RedisValue::status("OK"));
  auto e = sync<Entry>([&](auto done) { queue_->add("m", 10, {}, done); });
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.error().code, ErrorCode::kInternal);
  EXPECT_NE(e.error().message.find("WRONGTYPE"), std::string::npos) << e.error().message;
  auto bad = sync<Entry>([&](auto done) { queue_->add("bad model", 10, {}, done); });
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code, ErrorCode::kInvalidRequest);
}

TEST_F(StreamQueueTest, TokenBucketIsSharedByEveryClient) {
  // Two gateways: two connections, one bucket. Rate 0.01/s: no refill to speak of.
  RedisClient& second = connect();
  other_queue_ = std::make_unique<StreamQueue>(second, StreamQueue::Options{});
  int allowed = 0;
  double last_retry = 0;
  for (int i = 0; i < 8; ++i) {
    StreamQueue& q = i % 2 == 0 ? *queue_ : *other_queue_;
    auto d = sync<StreamQueue::RateDecision>([&](auto done) { q.take_tokens("key-a", 0.01, 3, 1, done); });
    ASSERT_TRUE(d.ok()) << d.error().message;
    if (d->allowed) {
      ++allowed;
      EXPECT_NEAR(d->tokens_left, 3 - allowed, 0.05);  // 5 s of refill at most
    } else {
      EXPECT_GT(d->retry_after_s, 0);
      EXPECT_LE(d->retry_after_s, 100.0 + 1e-6);  // one token at 0.01/s
      last_retry = d->retry_after_s;
    }
  }
  EXPECT_EQ(allowed, 3);
  EXPECT_GT(last_retry, 90.0);
  // Another key has its own bucket.
  auto other = sync<StreamQueue::RateDecision>([&](auto done) { queue_->take_tokens("key-b", 0.01, 3, 1, done); });
  ASSERT_TRUE(other.ok());
  EXPECT_TRUE(other->allowed);
  auto bad = sync<StreamQueue::RateDecision>([&](auto done) { queue_->take_tokens("k", 0, 3, 1, done); });
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code, ErrorCode::kInvalidRequest);
}

TEST_F(StreamQueueTest, TokenBucketRefillsAtItsRate) {
  // Burst 1 at 20 tokens/s: a refusal says to come back within 50 ms, and a
  // token is back by then.
  auto first = sync<StreamQueue::RateDecision>([&](auto done) { queue_->take_tokens("r", 20, 1, 1, done); });
  ASSERT_TRUE(first.ok()) << first.error().message;
  ASSERT_TRUE(first->allowed);
  auto second = sync<StreamQueue::RateDecision>([&](auto done) { queue_->take_tokens("r", 20, 1, 1, done); });
  ASSERT_TRUE(second.ok());
  ASSERT_FALSE(second->allowed);
  EXPECT_GT(second->retry_after_s, 0);
  EXPECT_LE(second->retry_after_s, 0.05 + 1e-6);
  auto start = Clock::now();
  bool again = false;
  while (!again && Clock::now() - start < 5s) {
    auto d = sync<StreamQueue::RateDecision>([&](auto done) { queue_->take_tokens("r", 20, 1, 1, done); });
    ASSERT_TRUE(d.ok());
    again = d->allowed;
  }
  EXPECT_TRUE(again);
  EXPECT_LT(Clock::now() - start, 2s);
}

TEST_F(StreamQueueTest, ScriptsAreLoadedOnceAndAgainAfterAFlush) {
  for (int i = 0; i < 3; ++i) {
    auto d = sync<StreamQueue::RateDecision>([&](auto done) { queue_->take_tokens("s", 100, 10, 1, done); });
    ASSERT_TRUE(d.ok()) << d.error().message;
  }
  EXPECT_EQ(queue_->stats().script_loads, 1u);
  ASSERT_EQ(run(*client_, {"SCRIPT", "FLUSH"}), RedisValue::status("OK"));
  auto d = sync<StreamQueue::RateDecision>([&](auto done) { queue_->take_tokens("s", 100, 10, 1, done); });
  ASSERT_TRUE(d.ok()) << d.error().message;
  EXPECT_TRUE(d->allowed);
  EXPECT_EQ(queue_->stats().script_loads, 2u);
}

}  // namespace
}  // namespace vg::queue
