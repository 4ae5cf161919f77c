#include "admission/oom_governor.hpp"

#include <algorithm>
#include <cmath>

namespace vg {
namespace {

Error bad(const char* what) { return Error(ErrorCode::kConfig, what); }

}  // namespace

Status validate(const OomGovernorOptions& o) {
  if (!(o.decrease_factor > 0 && o.decrease_factor < 1)) return bad("oom decrease factor must be in (0, 1)");
  if (!(o.floor_fraction >= 0 && o.floor_fraction <= 1)) return bad("oom budget floor must be in [0, 1]");
  if (o.quiet_period <= Duration::zero()) return bad("oom quiet period must be > 0");
  if (!(o.increase_step > 0 && o.increase_step <= 1)) return bad("oom increase step must be in (0, 1]");
  if (o.foreign_raise_hold < Duration::zero()) return bad("foreign raise hold must be >= 0");
  return Status::Ok();
}

OomGovernor::OomGovernor(const OomGovernorOptions& options, std::int64_t budget_bytes)
    : options_(options), budget_(std::max<std::int64_t>(0, budget_bytes)), ceiling_(budget_), effective_(budget_) {
  floor_ = floor_of(ceiling_);
  // At least one byte, so that every raise makes progress.
  step_ = std::max<std::int64_t>(1, std::llround(static_cast<double>(budget_) * options_.increase_step));
}

std::int64_t OomGovernor::floor_of(std::int64_t ceiling) const {
  return std::clamp<std::int64_t>(std::llround(static_cast<double>(ceiling) * options_.floor_fraction), 0, ceiling);
}

std::optional<BudgetChange> OomGovernor::set_ceiling(std::int64_t bytes) {
  ceiling_ = std::clamp<std::int64_t>(bytes, 0, budget_);
  floor_ = floor_of(ceiling_);
  // Under an OOM cut the budget only falls with the ceiling; quiet periods
  // raise it again, even when the ceiling fell below the cut meanwhile.
  const std::int64_t next = cut_ ? std::min(effective_, ceiling_) : ceiling_;
  if (next == effective_) return std::nullopt;
  BudgetChange change{effective_, next};
  effective_ = next;
  return change;
}

std::optional<BudgetChange> OomGovernor::on_oom(TimePoint now) {
  quiet_since_ = now;
  cut_ = true;
  const auto cut = static_cast<std::int64_t>(static_cast<double>(effective_) * options_.decrease_factor);
  const std::int64_t next = std::max(floor_, std::min(effective_, cut));
  if (next == effective_) return std::nullopt;
  BudgetChange change{effective_, next};
  effective_ = next;
  return change;
}

std::optional<BudgetChange> OomGovernor::on_tick(TimePoint now) {
  if (effective_ >= ceiling_ || now < quiet_since_ + options_.quiet_period) return std::nullopt;
  const std::int64_t periods = (now - quiet_since_) / options_.quiet_period;
  quiet_since_ += periods * options_.quiet_period;
  BudgetChange change{effective_, 0};
  const std::int64_t room = ceiling_ - effective_;
  effective_ = periods >= (room + step_ - 1) / step_ ? ceiling_ : effective_ + periods * step_;
  cut_ = effective_ < ceiling_;
  change.to = effective_;
  return change;
}

std::optional<TimePoint> OomGovernor::next_change() const {
  if (effective_ >= ceiling_) return std::nullopt;
  return quiet_since_ + options_.quiet_period;
}

}  // namespace vg
