// Tests of EventQueue (http/event_queue.hpp): wakes coalesced until the
// session takes the events; a non-streaming session woken only by the
// terminal event; none after detach().
#include <gtest/gtest.h>

#include <memory>
#include <variant>

#include "http/event_queue.hpp"

namespace vg::httpd {
namespace {

TEST(EventQueue, EachEventWakesUnlessAWakeIsAlreadyOnItsWay) {
  int wakes = 0;
  EventQueue q([&] { ++wakes; });
  q.push(StartedEvent{});
  EXPECT_EQ(wakes, 1);
  q.push(TextEvent{"a", 1, 0, {}, {1}});  // not taken yet: the first wake covers it
  EXPECT_EQ(wakes, 1);
  EXPECT_EQ(q.take().size(), 2u);
  q.push(TextEvent{"b", 1, 0, {}, {2}});
  EXPECT_EQ(wakes, 2);
}

TEST(EventQueue, ATerminalOnlySessionIsWokenOnceWithEveryEventInOrder) {
  int wakes = 0;
  EventQueue q([&] { ++wakes; }, EventQueue::Wake::kTerminal);
  q.push(QueuedEvent{2});
  q.push(StartedEvent{});
  for (int i = 0; i < 64; ++i) q.push(TextEvent{"x", 1, 0, {}, {i}});
  EXPECT_EQ(wakes, 0);
  q.push(FinishedEvent{"length", {3, 64}, {}, 0});
  EXPECT_EQ(wakes, 1);
  const std::vector<EngineEvent> events = q.take();
  ASSERT_EQ(events.size(), 67u);
  EXPECT_TRUE(std::holds_alternative<QueuedEvent>(events.front()));
  EXPECT_EQ(std::get<TextEvent>(events[10]).token_ids, (std::vector<std::int32_t>{8}));
  EXPECT_TRUE(std::holds_alternative<FinishedEvent>(events.back()));
}

TEST(EventQueue, ATerminalOnlySessionIsWokenByAFailureToo) {
  int wakes = 0;
  EventQueue q([&] { ++wakes; }, EventQueue::Wake::kTerminal);
  q.push(StartedEvent{});
  q.push(FailedEvent{Error(ErrorCode::kOverloaded, "queue full"), {}, {}});
  EXPECT_EQ(wakes, 1);
  EXPECT_EQ(q.take().size(), 2u);
}

TEST(EventQueue, NothingWakesOrIsKeptAfterDetach) {
  int wakes = 0;
  EventQueue q([&] { ++wakes; });
  q.detach();
  q.push(StartedEvent{});
  q.push(FinishedEvent{"stop", {1, 1}, {}, 0});
  EXPECT_EQ(wakes, 0);
  EXPECT_TRUE(q.take().empty());
}

}  // namespace
}  // namespace vg::httpd
