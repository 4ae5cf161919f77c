#include "engine/oom_budget.hpp"

#include <spdlog/spdlog.h>

namespace vg {

OomBudget::OomBudget(const OomGovernorOptions& options, std::int64_t budget_bytes, bool active,
                     AdmissionController& admission, std::string device, int device_index)
    : governor_(options, budget_bytes), active_(active), admission_(admission), device_(std::move(device)),
      device_index_(device_index) {}

void OomBudget::on_oom(TimePoint now) {
  if (!active_) return;
  auto change = governor_.on_oom(now);
  if (!change) {
    spdlog::warn("effective budget of {} stays at its floor of {} bytes after out of memory", device_,
                 governor_.effective());
    return;
  }
  ++cuts_;
  spdlog::warn("out of memory: effective budget of {} cut from {} to {} bytes (budget {}, floor {} bytes)", device_,
               change->from, change->to, governor_.budget(), governor_.floor());
  apply(*change);
}

void OomBudget::on_tick(TimePoint now) {
  if (!active_) return;
  auto change = governor_.on_tick(now);
  if (!change) return;
  ++raises_;
  spdlog::info("no out of memory for a quiet period: effective budget of {} raised from {} to {} of {} bytes",
               device_, change->from, change->to, governor_.budget());
  apply(*change);
}

std::optional<TimePoint> OomBudget::next_change() const {
  if (!active_) return std::nullopt;
  return governor_.next_change();
}

void OomBudget::publish(EngineStats& stats) const {
  stats.effective_budget_bytes = governor_.effective();
  stats.oom_budget_cuts = cuts_;
  stats.oom_budget_raises = raises_;
}

void OomBudget::apply(const BudgetChange& change) { admission_.set_effective_budget(change.to, device_index_); }

}  // namespace vg
