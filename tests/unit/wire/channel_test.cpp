// Channel over a socket pair: queued and direct sends keep their order, a
// direct send the socket cannot take at once is finished by the writer, and
// flush() waits for both.
#include "wire/channel.hpp"

#include "common/wakeup_batch.hpp"
#include "wire/frame.hpp"

#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace vg::wire {
namespace {

/// The receiving end: collects the number each payload starts with, in arrival order.
struct Collector {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::int64_t> got;
  std::string closed_reason;
  bool closed = false;
  std::shared_ptr<Channel> channel;

  void start(const std::shared_ptr<Channel>& ch) {
    channel = ch;
    ch->start(
        [this](std::string_view payload) {
          std::lock_guard lk(mu);
          got.push_back(std::stoll(std::string(payload.substr(0, payload.find(' ')))));
          cv.notify_all();
        },
        [this](const std::string& reason) {
          std::lock_guard lk(mu);
          closed = true;
          closed_reason = reason;
          cv.notify_all();
        });
  }
  /// The channel's threads call back into this object until on_close:
  /// close it and wait for that before this object goes.
  ~Collector() {
    if (channel) channel->close("test over");
    std::unique_lock lk(mu);
    cv.wait_for(lk, std::chrono::seconds(10), [&] { return closed; });
  }
  /// Waits (at most 10 s) for `n` messages; returns what arrived.
  std::vector<std::int64_t> wait_for(std::size_t n) {
    std::unique_lock lk(mu);
    cv.wait_for(lk, std::chrono::seconds(10), [&] { return got.size() >= n || closed; });
    return got;
  }
};

struct Pair {
  int a = -1;
  int b = -1;
  explicit Pair(int sndbuf = 0) {
    int fds[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
    a = fds[0];
    b = fds[1];
    if (sndbuf > 0) {
      EXPECT_EQ(::setsockopt(a, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf)), 0);
      EXPECT_EQ(::setsockopt(b, SOL_SOCKET, SO_RCVBUF, &sndbuf, sizeof(sndbuf)), 0);
    }
  }
};

/// The frame of a payload "<n> <pad bytes>".
std::string msg(std::int64_t n, std::size_t pad = 0) {
  return frame_of(std::to_string(n) + " " + std::string(pad, 'p'));
}

/// A started sender and a started receiver on a socket pair.
struct Linked {
  Pair p;
  std::shared_ptr<Channel> sender;
  Collector c;  // owns the receiver; closes it and waits for its end first
  explicit Linked(int sndbuf = 0) : p(sndbuf), sender(Channel::adopt(p.a)) {
    c.start(Channel::adopt(p.b));
    sender->start([](std::string_view) {}, [](const std::string&) {});
  }
  ~Linked() { sender->close("test over"); }
};

std::vector<std::int64_t> iota(std::int64_t n) {
  std::vector<std::int64_t> v;
  for (std::int64_t i = 0; i < n; ++i) v.push_back(i);
  return v;
}

TEST(Channel, DirectAndQueuedSendsArriveInOrder) {
  Linked l;
  auto& sender = l.sender;
  constexpr int kN = 2000;
  for (int i = 0; i < kN; ++i) {
    ASSERT_TRUE(sender->send(msg(i, i % 7 == 0 ? 3000 : 10), i % 3 == 0 ? Send::kQueued : Send::kDirect));
  }
  EXPECT_TRUE(sender->flush(10));
  EXPECT_EQ(l.c.wait_for(kN), iota(kN));
}

TEST(Channel, DirectSendsFromManyThreadsAllArrive) {
  // Small socket buffers and frames near their size: direct writes often go
  // in part while other threads queue theirs behind them.
  Linked l(4096);
  auto& sender = l.sender;
  constexpr int kThreads = 4;
  constexpr int kEach = 500;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) sender->send(msg(t * kEach + i, 100 + (i % 4) * 2000), i % 5 ? Send::kDirect : Send::kQueued);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_TRUE(sender->flush(10));
  auto got = l.c.wait_for(kThreads * kEach);
  ASSERT_EQ(got.size(), static_cast<std::size_t>(kThreads * kEach)) << l.c.closed_reason;
  // Each thread's own messages keep their order; every message arrives once.
  std::vector<std::int64_t> last(kThreads, -1);
  for (auto n : got) {
    const int t = static_cast<int>(n / kEach);
    EXPECT_GT(n, last[t]);
    last[t] = n;
  }
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(last[t], t * kEach + kEach - 1);
}

TEST(Channel, ADirectSendTheSocketCannotTakeIsFinishedByTheWriter) {
  // Small socket buffers and a peer that does not read yet: the first direct
  // frame is written in part, the rest of it and every later frame (direct
  // or not) wait in the queue, and all of it arrives whole and in order once
  // the peer reads.
  Pair p(4096);
  auto sender = Channel::adopt(p.a);
  sender->start([](std::string_view) {}, [](const std::string&) {});
  ASSERT_TRUE(sender->send(msg(0, 256 * 1024), Send::kDirect));
  ASSERT_TRUE(sender->send(msg(1, 10), Send::kDirect));
  ASSERT_TRUE(sender->send(msg(2, 64 * 1024), Send::kQueued));
  ASSERT_TRUE(sender->send(msg(3, 10), Send::kDirect));
  EXPECT_FALSE(sender->flush(0.05));  // the peer reads nothing yet: the writer is blocked
  auto receiver = Channel::adopt(p.b);
  Collector c;
  c.start(receiver);
  EXPECT_EQ(c.wait_for(4), iota(4));
  EXPECT_TRUE(sender->flush(10));
  sender->close("done");
  receiver->close("done");
}

TEST(Channel, QueuedSendsInsideAWakeupBatchAllArriveAndFlushDoesNotWaitForItsEnd) {
  // An engine step's events are queued in a WakeupBatch; a poisoned engine
  // flushes them from inside it before it exits.
  Linked l;
  auto& sender = l.sender;
  {
    WakeupBatch step;
    for (int i = 0; i < 100; ++i) ASSERT_TRUE(sender->send(msg(i, 50)));
    EXPECT_TRUE(sender->flush(10));
    EXPECT_EQ(l.c.wait_for(100), iota(100));
    for (int i = 100; i < 200; ++i) ASSERT_TRUE(sender->send(msg(i, 50)));
  }
  EXPECT_EQ(l.c.wait_for(200), iota(200));
}

TEST(Channel, AQueuedSendFromOutsideABatchIsNotHeldBackByAnotherThreadsBatch) {
  // The engine thread's step holds its events back; the heartbeat thread's
  // status, queued behind them, must still go out before the step ends.
  Linked l;
  std::mutex mu;
  std::condition_variable cv;
  bool queued = false;
  bool step_may_end = false;
  std::thread engine([&] {
    WakeupBatch step;
    ASSERT_TRUE(l.sender->send(msg(0, 10)));
    std::unique_lock lk(mu);
    queued = true;
    cv.notify_all();
    cv.wait_for(lk, std::chrono::seconds(20), [&] { return step_may_end; });
  });
  {
    std::unique_lock lk(mu);
    ASSERT_TRUE(cv.wait_for(lk, std::chrono::seconds(10), [&] { return queued; }));
  }
  ASSERT_TRUE(l.sender->send(msg(1, 0), Send::kQueued));
  const auto got = l.c.wait_for(2);  // both, while the engine's batch is still open
  {
    std::lock_guard lk(mu);
    step_may_end = true;
  }
  cv.notify_all();
  engine.join();
  EXPECT_EQ(got, iota(2));
}

TEST(Channel, ADirectSendToAClosedPeerClosesTheChannel) {
  Pair p;
  auto sender = Channel::adopt(p.a);
  std::mutex mu;
  std::condition_variable cv;
  bool closed = false;
  sender->start([](std::string_view) {},
                [&](const std::string&) {
                  std::lock_guard lk(mu);
                  closed = true;
                  cv.notify_all();
                });
  ::close(p.b);
  // The first write may still succeed into the socket buffer before the
  // close is seen; a later one fails, and the channel closes.
  bool refused = false;
  for (int i = 0; i < 100 && !refused; ++i) refused = !sender->send(msg(i, 10), Send::kDirect);
  EXPECT_TRUE(refused);
  EXPECT_TRUE(sender->closed());
  std::unique_lock lk(mu);
  EXPECT_TRUE(cv.wait_for(lk, std::chrono::seconds(10), [&] { return closed; }));
}

}  // namespace
}  // namespace vg::wire
