// The emulated step-graph recorder; the CUDA one is in cuda_graph.cpp.
// Engine thread.
#include "device/step_graph.hpp"

#include <utility>

namespace vg {
namespace {

class EmulatedGraph final : public StepGraph {
 public:
  explicit EmulatedGraph(std::function<void()> forward) : forward_(std::move(forward)) {}
  void replay() override { forward_(); }

 private:
  std::function<void()> forward_;
};

// Runs the function once when recording, as the CUDA recorder's warm-up
// does, and again at every replay.
class EmulatedRecorder final : public StepGraphRecorder {
 public:
  std::unique_ptr<StepGraph> record(const std::function<void()>& forward) override {
    forward();
    return std::make_unique<EmulatedGraph>(forward);
  }
};

}  // namespace

std::unique_ptr<StepGraphRecorder> make_emulated_graph_recorder() { return std::make_unique<EmulatedRecorder>(); }

}  // namespace vg
