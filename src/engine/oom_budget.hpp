// OomBudget: the effective budget of one engine's device. Each loop turn it
// measures the bytes other processes hold on the device (foreign bytes) and
// lowers the budget's ceiling by what they took beyond the start-up budget
// at once, before anything more is admitted; it raises it back only once
// they have held less for OomGovernorOptions::foreign_raise_hold, so memory
// that comes and goes does not make the engine preempt and regrant again
// and again;
// out-of-memory errors and quiet periods move the effective budget under that
// ceiling (OomGovernor). Each change is applied to the device's admission
// controller, logged and counted by reason.
// Budgets move under policy memory only (fixed and none are baselines
// without a governor); foreign bytes are measured under every policy.
// Engine thread only.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>

#include "admission/admission_controller.hpp"
#include "admission/memory_profile.hpp"
#include "admission/oom_governor.hpp"
#include "engine/engine.hpp"

namespace vg {

class Device;

/// Why the effective budget changed.
enum class BudgetReason {
  kOutOfMemory,    ///< a step ran out of memory: cut (OomGovernor)
  kQuietPeriod,    ///< no out-of-memory error for a quiet period: raised
  kForeignGrew,    ///< other processes took memory: lowered to what is there
  kForeignShrank,  ///< other processes freed memory: raised back
};
/// "out_of_memory", "quiet_period", "foreign_grew", "foreign_shrank".
const char* budget_reason_name(BudgetReason reason);

class OomBudget {
 public:
  /// `admission` and `device` must outlive this object. `budget_bytes` is
  /// the device's configured budget; `inputs` what it was worked out from at
  /// start-up (device_budget): with them the ceiling follows the measured
  /// foreign bytes; without them (nullopt) it stays the budget.
  /// `device_index` is the device's place in the admission topology,
  /// `engine_index` the engine's (the source of its budget there: the
  /// device's effective budget is the least its engines allow).
  OomBudget(const OomGovernorOptions& options, std::int64_t budget_bytes, bool active, AdmissionController& admission,
            Device& device, std::optional<DeviceBudgetInputs> inputs, int device_index = 0, int engine_index = 0);

  /// A step failed with out-of-memory at `now`: measure the device, then
  /// cut the effective budget (its floor a share of what is there).
  void on_oom(TimePoint now);
  /// Measures the foreign bytes and follows them, then raises the effective
  /// budget after quiet periods. Call once per loop turn, before admitting.
  void on_tick(TimePoint now);
  /// When on_tick() will next raise the budget (a quiet period's end, or
  /// the end of the foreign raise hold); nullopt when it will not.
  std::optional<TimePoint> next_change() const;
  /// The effective budget (bytes; policy memory: after cuts; else the budget).
  std::int64_t effective() const { return governor_.effective(); }
  /// Copies the effective budget, the foreign bytes and the counters into `stats`.
  void publish(EngineStats& stats) const;

 private:
  void follow_foreign(TimePoint now);
  void apply(const BudgetChange& change, BudgetReason reason);

  OomGovernor governor_;
  Duration raise_hold_;
  bool active_;
  AdmissionController& admission_;
  Device& device_;
  std::optional<DeviceBudgetInputs> inputs_;
  int device_index_ = 0;
  int engine_index_ = 0;
  std::int64_t foreign_bytes_ = 0;  // measured at the last turn
  std::optional<TimePoint> raise_since_;  // since when the foreign bytes allow a higher ceiling
  std::array<std::int64_t, 4> changes_{};  // by BudgetReason
};

}  // namespace vg
