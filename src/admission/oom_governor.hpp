// OomGovernor: the policy that moves a device's effective budget after
// out-of-memory errors (AIMD). An OOM cuts the effective budget
// multiplicatively, down to a floor; each quiet period without an OOM then
// raises it by a fixed step, up to the ceiling. The ceiling is the configured
// budget less what other processes took since (set_ceiling, from measured
// foreign bytes); the floor is a share of the ceiling, so it stays inside
// memory that is really there.
//
// Pure and single-threaded: no clock of its own (every call takes `now`), no
// threads, no torch. The caller applies effective() to its admission
// controller (AdmissionController::set_effective_budget) after each change.
#pragma once

#include <cstdint>
#include <optional>

#include "common/clock.hpp"
#include "common/error.hpp"

namespace vg {

struct OomGovernorOptions {
  /// On an OOM: effective = max(floor, effective × decrease_factor). In (0, 1).
  double decrease_factor = 0.5;
  /// Lowest effective budget, as a fraction of the ceiling. In [0, 1].
  double floor_fraction = 0.25;
  /// Time without an OOM before each raise (> 0).
  Duration quiet_period = std::chrono::seconds(10);
  /// Raise per quiet period, as a fraction of the configured budget. In (0, 1].
  double increase_step = 0.1;
  /// How long other processes must hold less before the ceiling rises again
  /// (engine/oom_budget.hpp), so that memory that comes and goes does not
  /// make the engine preempt and regrant again and again. >= 0.
  Duration foreign_raise_hold = std::chrono::seconds(1);
};

/// kConfig naming the first option out of range.
Status validate(const OomGovernorOptions& options);

/// A change of the effective budget (bytes).
struct BudgetChange {
  std::int64_t from = 0;
  std::int64_t to = 0;
};

class OomGovernor {
 public:
  /// `budget_bytes` (>= 0) is the configured budget; the effective budget
  /// starts there. `options` must pass validate().
  OomGovernor(const OomGovernorOptions& options, std::int64_t budget_bytes);

  /// An out-of-memory error at `now`: cuts the effective budget (unless it is
  /// at the floor already) and restarts the quiet period. The change, if any.
  std::optional<BudgetChange> on_oom(TimePoint now);

  /// Raises the effective budget by one step for each quiet period that has
  /// passed by `now` since the last OOM or raise, up to the budget. The
  /// change, if any.
  std::optional<BudgetChange> on_tick(TimePoint now);

  /// The memory measured now supports `bytes` (clamped to [0, budget]): the
  /// effective budget follows the ceiling down at once; up too, unless an
  /// OOM cut is in force (from on_oom() until quiet periods have raised the
  /// budget back to the ceiling: then only those raise it, even when the
  /// ceiling fell below the cut meanwhile). The floor moves with the
  /// ceiling. The change, if any.
  std::optional<BudgetChange> set_ceiling(std::int64_t bytes);

  /// When on_tick() will next raise the budget; nullopt at the ceiling.
  std::optional<TimePoint> next_change() const;

  std::int64_t budget() const { return budget_; }
  std::int64_t ceiling() const { return ceiling_; }
  std::int64_t effective() const { return effective_; }
  std::int64_t floor() const { return floor_; }
  std::int64_t step() const { return step_; }

 private:
  std::int64_t floor_of(std::int64_t ceiling) const;

  OomGovernorOptions options_;
  std::int64_t budget_;
  std::int64_t ceiling_;  // <= budget_
  std::int64_t effective_;  // <= ceiling_
  bool cut_ = false;        // an OOM cut is in force (see set_ceiling)
  std::int64_t floor_;
  std::int64_t step_;
  TimePoint quiet_since_{};  // last OOM or raise; meaningful while effective_ < budget_
};

}  // namespace vg
