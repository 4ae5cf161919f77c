// Device: where tensors live. VirtualDevice is CPU memory whose capacity is
// enforced by an allocator installed into libtorch: an allocation made by a
// thread bound to the device (DeviceScope) that would pass capacity throws
// c10::OutOfMemoryError, exactly as CUDA does. Torch-free header.
//
// Thread-safety: byte counters are atomics and may be read from any thread;
// DeviceScope binds the calling thread only.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "common/error.hpp"

namespace vg {

/// A device's memory counters, in bytes.
struct DeviceMemory {
  std::int64_t capacity = 0;  ///< bytes the device has
  std::int64_t used = 0;      ///< bytes currently allocated through the device allocator
  std::int64_t peak = 0;      ///< highest `used` since the last reset_peak()
};

class Device {
 public:
  virtual ~Device() = default;
  /// "virt:0" or "cuda:0".
  virtual const std::string& name() const = 0;
  /// The torch device string tensors are created on: "cpu" or "cuda:N".
  virtual std::string torch_device() const = 0;
  virtual DeviceMemory memory() const = 0;
  /// Sets peak to the current used bytes.
  virtual void reset_peak() = 0;
  /// Test hook: the next allocation charged to this device fails with
  /// c10::OutOfMemoryError as if the device were full.
  virtual void inject_out_of_memory() = 0;
};

/// CPU memory with an enforced capacity (bytes).
class VirtualDevice final : public Device {
 public:
  /// Creates `virt:<index>` with `capacity_bytes` (> 0). Installs the capped
  /// allocator into libtorch on first use (process-wide, idempotent).
  static Result<std::unique_ptr<VirtualDevice>> create(int index, std::int64_t capacity_bytes);

  const std::string& name() const override { return name_; }
  std::string torch_device() const override { return "cpu"; }
  DeviceMemory memory() const override;
  void reset_peak() override;
  void inject_out_of_memory() override { inject_oom_.store(true); }

  /// Called by the allocator. Returns false (and charges nothing) when
  /// used + bytes would pass capacity.
  bool try_charge(std::int64_t bytes);
  void release(std::int64_t bytes);

 private:
  VirtualDevice(int index, std::int64_t capacity_bytes);
  std::string name_;
  std::int64_t capacity_;
  std::atomic<std::int64_t> used_{0};
  std::atomic<std::int64_t> peak_{0};
  std::atomic<bool> inject_oom_{false};
};

/// Binds the calling thread to a device for the scope's life: libtorch
/// allocations on this thread are charged to it (nullptr: uncharged).
/// Scopes nest; the previous binding is restored on destruction.
class DeviceScope {
 public:
  explicit DeviceScope(Device* device);
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  Device* previous_;
};

/// The device bound to the calling thread, or nullptr.
Device* current_device();

/// Parses a byte size: "2GiB", "512MiB", "64KiB", "1.5GB", "1000" (bytes).
/// Errors: kConfig on anything else or a value <= 0.
Result<std::int64_t> parse_bytes(const std::string& text);

}  // namespace vg
