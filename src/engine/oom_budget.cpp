#include "engine/oom_budget.hpp"

#include <spdlog/spdlog.h>

#include "common/decimal.hpp"
#include "device/device.hpp"

namespace vg {

const char* budget_reason_name(BudgetReason reason) {
  switch (reason) {
    case BudgetReason::kOutOfMemory: return "out_of_memory";
    case BudgetReason::kQuietPeriod: return "quiet_period";
    case BudgetReason::kForeignGrew: return "foreign_grew";
    case BudgetReason::kForeignShrank: return "foreign_shrank";
  }
  return "unknown";
}

OomBudget::OomBudget(const OomGovernorOptions& options, std::int64_t budget_bytes, bool active,
                     AdmissionController& admission, Device& device, std::optional<DeviceBudgetInputs> inputs,
                     int device_index)
    : governor_(options, budget_bytes), active_(active), admission_(admission), device_(device),
      inputs_(inputs), device_index_(device_index) {
  if (inputs_) foreign_bytes_ = inputs_->foreign_bytes;
}

void OomBudget::on_oom(TimePoint now) {
  follow_foreign();
  if (!active_) return;
  auto change = governor_.on_oom(now);
  if (!change) {
    spdlog::warn("effective budget of {} stays at its floor of {} bytes after out of memory", device_.name(),
                 governor_.effective());
    return;
  }
  spdlog::warn("out of memory: effective budget of {} cut from {} to {} bytes (ceiling {}, floor {} bytes)",
               device_.name(), change->from, change->to, governor_.ceiling(), governor_.floor());
  apply(*change, BudgetReason::kOutOfMemory);
}

void OomBudget::on_tick(TimePoint now) {
  follow_foreign();
  if (!active_) return;
  auto change = governor_.on_tick(now);
  if (!change) return;
  spdlog::info("no out of memory for a quiet period: effective budget of {} raised from {} to {} of {} bytes",
               device_.name(), change->from, change->to, governor_.ceiling());
  apply(*change, BudgetReason::kQuietPeriod);
}

// The ceiling is the start-up formula with the foreign bytes measured now:
// what is free now plus what the models hold, never above the budget.
void OomBudget::follow_foreign() {
  if (!inputs_) return;
  const std::int64_t foreign = device_.memory().foreign;
  if (foreign == foreign_bytes_) return;
  const std::int64_t before = foreign_bytes_;
  foreign_bytes_ = foreign;
  if (!active_) return;
  DeviceBudgetInputs now = *inputs_;
  now.foreign_bytes = foreign;
  auto change = governor_.set_ceiling(device_budget(now));
  if (!change) return;
  const BudgetReason reason = foreign > before ? BudgetReason::kForeignGrew : BudgetReason::kForeignShrank;
  spdlog::warn("{}: other processes hold {} (was {}): effective budget {} from {} to {} bytes", device_.name(),
               format_bytes(foreign), format_bytes(before),
               reason == BudgetReason::kForeignGrew ? "lowered" : "raised", change->from, change->to);
  apply(*change, reason);
}

std::optional<TimePoint> OomBudget::next_change() const {
  if (!active_) return std::nullopt;
  return governor_.next_change();
}

void OomBudget::publish(EngineStats& stats) const {
  stats.effective_budget_bytes = governor_.effective();
  stats.oom_budget_cuts = changes_[static_cast<std::size_t>(BudgetReason::kOutOfMemory)];
  stats.oom_budget_raises = changes_[static_cast<std::size_t>(BudgetReason::kQuietPeriod)];
  stats.budget_foreign_grew = changes_[static_cast<std::size_t>(BudgetReason::kForeignGrew)];
  stats.budget_foreign_shrank = changes_[static_cast<std::size_t>(BudgetReason::kForeignShrank)];
  stats.foreign_bytes = foreign_bytes_;
}

void OomBudget::apply(const BudgetChange& change, BudgetReason reason) {
  ++changes_[static_cast<std::size_t>(reason)];
  admission_.set_effective_budget(change.to, device_index_);
}

}  // namespace vg
