// OomBudget: the OOM governor of one engine. Feeds out-of-memory errors and
// the passing of time to an OomGovernor, applies each change of the effective
// budget to the device's admission controller, logs it and counts it.
// Active under policy memory only (fixed and none are baselines without a
// governor); otherwise every call is a no-op. Engine thread only.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "admission/admission_controller.hpp"
#include "admission/oom_governor.hpp"
#include "engine/engine.hpp"

namespace vg {

class OomBudget {
 public:
  /// `admission` must outlive this object; `device` names it in the log.
  /// `device_index` is the device's place in the admission topology.
  OomBudget(const OomGovernorOptions& options, std::int64_t budget_bytes, bool active, AdmissionController& admission,
            std::string device, int device_index = 0);

  /// A step failed with out-of-memory at `now`: cut the effective budget.
  void on_oom(TimePoint now);
  /// Raises the effective budget after quiet periods (call once per loop turn).
  void on_tick(TimePoint now);
  /// When on_tick() will next raise the budget; nullopt when it will not.
  std::optional<TimePoint> next_change() const;
  /// Copies the effective budget and the counters into `stats`.
  void publish(EngineStats& stats) const;

 private:
  void apply(const BudgetChange& change);

  OomGovernor governor_;
  bool active_;
  AdmissionController& admission_;
  std::string device_;
  int device_index_ = 0;
  std::int64_t cuts_ = 0;
  std::int64_t raises_ = 0;
};

}  // namespace vg
