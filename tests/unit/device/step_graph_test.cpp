// The step-graph recorders on a virtual device: the emulated one charges
// what a CUDA recording costs a GPU (a workspace per recording thread, an
// executable per graph outside the allocator), and record_on_one_thread
// runs every recording on one thread of its own, bound to the device, so a
// model whose graphs are recorded at start-up on one thread and again on
// another makes one workspace, not two.
#include <gtest/gtest.h>

#include <memory>
#include <stdexcept>
#include <thread>

#include "device/device.hpp"
#include "device/step_graph.hpp"

namespace vg {
namespace {

constexpr std::int64_t kWorkspace = 1 << 20;
constexpr std::int64_t kExec = 4 << 10;

std::unique_ptr<VirtualDevice> device() { return std::move(VirtualDevice::create(0, 64 << 20)).value(); }

/// Records one graph of `recorder` from a thread of its own; returns it.
std::unique_ptr<StepGraph> record_from_another_thread(StepGraphRecorder& recorder, const std::function<void()>& f) {
  std::unique_ptr<StepGraph> out;
  std::thread([&] { out = recorder.record(f); }).join();
  return out;
}

TEST(EmulatedGraphs, EachRecordingThreadMakesAWorkspaceThatTheRecorderKeeps) {
  auto dev = device();
  {
    auto recorder = make_emulated_graph_recorder(dev.get(), {kWorkspace, 0});
    auto a = recorder->record([] {});
    EXPECT_EQ(dev->memory().own, kWorkspace);
    auto b = recorder->record([] {});
    EXPECT_EQ(dev->memory().own, kWorkspace) << "the same thread reuses its workspace";
    auto c = record_from_another_thread(*recorder, [] {});
    EXPECT_EQ(dev->memory().own, 2 * kWorkspace) << "another thread makes its own, as a cuBLAS handle does";
    a.reset();
    b.reset();
    c.reset();
    EXPECT_EQ(dev->memory().own, 2 * kWorkspace) << "freeing the graphs keeps the workspaces";
  }
  EXPECT_EQ(dev->memory().own, 0) << "the recorder's end frees them";
}

TEST(EmulatedGraphs, AGraphHoldsItsExecutableOutsideTheAllocatorWhileItLives) {
  auto dev = device();
  auto recorder = make_emulated_graph_recorder(dev.get(), {0, kExec});
  int runs = 0;
  auto graph = recorder->record([&] { ++runs; });
  EXPECT_EQ(runs, 1) << "recorded once, as the CUDA recorder's warm-up runs it";
  EXPECT_EQ(dev->memory().foreign, kExec);
  EXPECT_EQ(dev->memory().own, 0);
  EXPECT_EQ(dev->memory().used, kExec);
  graph->replay();
  EXPECT_EQ(runs, 2);
  graph.reset();
  EXPECT_EQ(dev->memory().foreign, 0);
  EXPECT_EQ(dev->memory().used, 0);
}

TEST(EmulatedGraphs, ExecutablesAddToAnotherProcessesForeignBytes) {
  auto dev = device();
  ASSERT_EQ(dev->set_test_foreign_bytes(8 << 20), 8 << 20);
  auto recorder = make_emulated_graph_recorder(dev.get(), {0, kExec});
  auto graph = recorder->record([] {});
  EXPECT_EQ(dev->memory().foreign, (8 << 20) + kExec);
  ASSERT_EQ(dev->set_test_foreign_bytes(2 << 20), 2 << 20);
  EXPECT_EQ(dev->memory().foreign, (2 << 20) + kExec);
  graph.reset();
  EXPECT_EQ(dev->memory().foreign, 2 << 20);
  EXPECT_EQ(dev->memory().used, 2 << 20);
}

TEST(OneThreadRecorder, RecordingsFromSeveralThreadsRunOnOneAndMakeOneWorkspace) {
  auto dev = device();
  auto recorder = record_on_one_thread(make_emulated_graph_recorder(dev.get(), {kWorkspace, 0}), dev.get());
  std::thread::id first, second;
  Device* bound = nullptr;
  auto a = recorder->record([&] {
    first = std::this_thread::get_id();
    bound = current_device();
  });
  EXPECT_NE(first, std::this_thread::get_id());
  EXPECT_EQ(bound, dev.get()) << "the recording thread is bound to the device";
  EXPECT_EQ(dev->memory().own, kWorkspace);
  auto b = record_from_another_thread(*recorder, [&] { second = std::this_thread::get_id(); });
  EXPECT_EQ(second, first);
  EXPECT_EQ(dev->memory().own, kWorkspace) << "one workspace, whichever thread asked";
  // A replay runs on the caller's thread.
  std::thread::id replayed;
  auto c = recorder->record([&] { replayed = std::this_thread::get_id(); });
  c->replay();
  EXPECT_EQ(replayed, std::this_thread::get_id());
}

TEST(OneThreadRecorder, PassesTheRecordingsExceptionOnAndKeepsWorking) {
  auto dev = device();
  auto recorder = record_on_one_thread(make_emulated_graph_recorder(dev.get(), {}), dev.get());
  EXPECT_THROW(recorder->record([] { throw std::runtime_error("out of memory while recording"); }), std::runtime_error);
  int runs = 0;
  auto graph = recorder->record([&] { ++runs; });
  ASSERT_NE(graph, nullptr);
  EXPECT_EQ(runs, 1);
  EXPECT_FALSE(recorder->broken());
}

}  // namespace
}  // namespace vg
