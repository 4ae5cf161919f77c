// The emulated step-graph recorder and the wrapper that runs every
// recording on one thread; the CUDA recorder is in cuda_graph.cpp.
#include "device/step_graph.hpp"

#include <condition_variable>
#include <exception>
#include <mutex>
#include <new>
#include <set>
#include <thread>
#include <utility>

#include "device/device.hpp"

namespace vg {
namespace {

class EmulatedGraph final : public StepGraph {
 public:
  EmulatedGraph(std::function<void()> forward, VirtualDevice* device, std::int64_t exec_bytes)
      : forward_(std::move(forward)), device_(device), exec_bytes_(exec_bytes) {
    if (device_ != nullptr) device_->hold_outside_allocator(exec_bytes_);
  }
  ~EmulatedGraph() override {
    if (device_ != nullptr) device_->release_outside_allocator(exec_bytes_);
  }
  EmulatedGraph(const EmulatedGraph&) = delete;
  EmulatedGraph& operator=(const EmulatedGraph&) = delete;
  void replay() override { forward_(); }

 private:
  std::function<void()> forward_;
  VirtualDevice* device_;
  std::int64_t exec_bytes_;
};

// Runs the function once when recording, as the CUDA recorder's warm-up
// does, and again at every replay; charges a workspace per recording thread.
class EmulatedRecorder final : public StepGraphRecorder {
 public:
  EmulatedRecorder(VirtualDevice* device, EmulatedGraphCosts costs) : device_(device), costs_(costs) {}
  ~EmulatedRecorder() override {
    if (device_ != nullptr) device_->release(costs_.workspace_bytes * static_cast<std::int64_t>(threads_.size()));
  }
  EmulatedRecorder(const EmulatedRecorder&) = delete;
  EmulatedRecorder& operator=(const EmulatedRecorder&) = delete;

  std::unique_ptr<StepGraph> record(const std::function<void()>& forward) override {
    if (device_ != nullptr && !threads_.contains(std::this_thread::get_id())) {
      if (!device_->try_charge(costs_.workspace_bytes)) throw std::bad_alloc();
      threads_.insert(std::this_thread::get_id());
    }
    forward();
    return std::make_unique<EmulatedGraph>(forward, device_, costs_.exec_bytes);
  }

 private:
  VirtualDevice* device_;
  EmulatedGraphCosts costs_;
  std::set<std::thread::id> threads_;  ///< the threads that recorded: one workspace each
};

// A thread that runs one recording at a time for its callers.
class OneThreadRecorder final : public StepGraphRecorder {
 public:
  OneThreadRecorder(std::unique_ptr<StepGraphRecorder> inner, Device* device)
      : inner_(std::move(inner)), thread_([this, device] { run(device); }) {}
  ~OneThreadRecorder() override {
    {
      std::lock_guard lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  OneThreadRecorder(const OneThreadRecorder&) = delete;
  OneThreadRecorder& operator=(const OneThreadRecorder&) = delete;

  std::unique_ptr<StepGraph> record(const std::function<void()>& forward) override {
    std::unique_ptr<StepGraph> out;
    std::exception_ptr error;
    std::unique_lock lk(mu_);
    cv_.wait(lk, [this] { return !job_; });  // one recording at a time
    job_ = [&] {
      try {
        out = inner_->record(forward);
      } catch (...) {
        error = std::current_exception();
      }
    };
    cv_.notify_all();
    cv_.wait(lk, [this] { return !job_; });
    if (error) std::rethrow_exception(error);
    return out;
  }

  bool broken() const override { return inner_->broken(); }

 private:
  void run(Device* device) {
    const DeviceScope scope(device);
    std::unique_lock lk(mu_);
    while (true) {
      cv_.wait(lk, [this] { return stop_ || job_; });
      if (stop_) return;
      job_();
      job_ = nullptr;
      cv_.notify_all();
    }
  }

  std::unique_ptr<StepGraphRecorder> inner_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::function<void()> job_;  ///< guarded by mu_: the recording asked for, until it is done
  bool stop_ = false;          ///< guarded by mu_
  std::thread thread_;         ///< last: starts once the members it reads exist
};

}  // namespace

std::unique_ptr<StepGraphRecorder> make_emulated_graph_recorder(VirtualDevice* device, EmulatedGraphCosts costs) {
  return std::make_unique<EmulatedRecorder>(device, costs);
}

std::unique_ptr<StepGraphRecorder> record_on_one_thread(std::unique_ptr<StepGraphRecorder> recorder, Device* device) {
  return std::make_unique<OneThreadRecorder>(std::move(recorder), device);
}

}  // namespace vg
