#include "engine/oom_budget.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>

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
                     int device_index, int engine_index)
    : governor_(options, budget_bytes), raise_hold_(options.foreign_raise_hold), active_(active), admission_(admission), device_(device),
      inputs_(inputs), device_index_(device_index), engine_index_(engine_index) {
  if (inputs_) foreign_bytes_ = inputs_->foreign_bytes;
}

void OomBudget::on_oom(TimePoint now) {
  follow_foreign(now);
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
  follow_foreign(now);
  if (!active_) return;
  auto change = governor_.on_tick(now);
  if (!change) return;
  spdlog::info("no out of memory for a quiet period: effective budget of {} raised from {} to {} of {} bytes",
               device_.name(), change->from, change->to, governor_.ceiling());
  apply(*change, BudgetReason::kQuietPeriod);
}

// The ceiling is the start-up formula with the foreign bytes measured now:
// what is free now plus what the models hold, never above the budget. It
// falls at once and rises once the foreign bytes have allowed it for
// raise_hold_.
void OomBudget::follow_foreign(TimePoint now) {
  if (!inputs_) return;
  const std::int64_t foreign = device_.memory().foreign;
  const std::int64_t before = foreign_bytes_;
  foreign_bytes_ = foreign;
  if (!active_) return;
  DeviceBudgetInputs measured = *inputs_;
  measured.foreign_bytes = foreign;
  const std::int64_t ceiling = std::min(device_budget(measured), governor_.budget());
  if (ceiling > governor_.ceiling()) {
    if (!raise_since_) raise_since_ = now;
    if (now - *raise_since_ < raise_hold_) return;
  }
  raise_since_.reset();
  auto change = governor_.set_ceiling(ceiling);
  if (!change) return;
  const BudgetReason reason = change->to < change->from ? BudgetReason::kForeignGrew : BudgetReason::kForeignShrank;
  spdlog::warn("{}: other processes hold {} (was {}): effective budget {} from {} to {} bytes", device_.name(),
               format_bytes(foreign), format_bytes(before),
               reason == BudgetReason::kForeignGrew ? "lowered" : "raised", change->from, change->to);
  apply(*change, reason);
}

std::optional<TimePoint> OomBudget::next_change() const {
  if (!active_) return std::nullopt;
  std::optional<TimePoint> next = governor_.next_change();
  if (raise_since_ && (!next || *raise_since_ + raise_hold_ < *next)) next = *raise_since_ + raise_hold_;
  return next;
}

void OomBudget::publish(EngineStats& stats) const {
  stats.effective_budget_bytes = governor_.effective();
  stats.counters[CounterId::kOomBudgetCuts] = changes_[static_cast<std::size_t>(BudgetReason::kOutOfMemory)];
  stats.oom_budget_raises = changes_[static_cast<std::size_t>(BudgetReason::kQuietPeriod)];
  stats.budget_foreign_grew = changes_[static_cast<std::size_t>(BudgetReason::kForeignGrew)];
  stats.budget_foreign_shrank = changes_[static_cast<std::size_t>(BudgetReason::kForeignShrank)];
  stats.foreign_bytes = foreign_bytes_;
}

void OomBudget::apply(const BudgetChange& change, BudgetReason reason) {
  ++changes_[static_cast<std::size_t>(reason)];
  admission_.set_effective_budget(change.to, device_index_, engine_index_);
}

}  // namespace vg
