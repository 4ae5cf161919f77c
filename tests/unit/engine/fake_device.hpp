// A Device for engine tests that allocates nothing (the fake model holds no
// tensors): counts what the engine asks of it, torch-free so the engine
// tests also run under ThreadSanitizer.
#pragma once

#include <algorithm>
#include <atomic>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "device/device.hpp"

namespace vg::testing {

class FakeDevice final : public Device {
 public:
  explicit FakeDevice(int index = 0, std::int64_t capacity = 1 << 30)
      : name_("virt:" + std::to_string(index)), capacity_(capacity) {}
  const std::string& name() const override { return name_; }
  std::string torch_device() const override { return "cpu"; }
  DeviceMemory memory() const override {
    DeviceMemory m;
    m.capacity = capacity_;
    m.foreign = foreign_.load();
    m.used = m.foreign;
    m.peak = m.foreign;
    return m;
  }
  void reset_peak() override {}
  void inject_out_of_memory() override { ++injected_; }
  void inject_device_fault() override { ++faults_; }
  void release_cached_memory() override { ++released_; }
  void prepare_compute_thread() override {
    std::lock_guard lk(mu_);
    prepared_.push_back(std::this_thread::get_id());
  }
  void hold_test_bytes(std::int64_t bytes) override { held_ += bytes; }
  std::int64_t set_test_foreign_bytes(std::int64_t bytes) override {
    foreign_ = std::min(std::max<std::int64_t>(0, bytes), capacity_);
    return foreign_.load();
  }
  /// The threads that prepared themselves, in order.
  std::vector<std::thread::id> prepared() const {
    std::lock_guard lk(mu_);
    return prepared_;
  }
  std::int64_t held() const { return held_.load(); }
  int faults() const { return faults_.load(); }
  int injected() const { return injected_.load(); }
  int released() const { return released_.load(); }

 private:
  std::string name_;
  std::int64_t capacity_;
  std::atomic<int> injected_{0};
  std::atomic<int> released_{0};
  std::atomic<int> faults_{0};
  std::atomic<std::int64_t> held_{0};
  std::atomic<std::int64_t> foreign_{0};
  mutable std::mutex mu_;
  std::vector<std::thread::id> prepared_;
};

}  // namespace vg::testing
