// RequestTracker (see request_tracker.hpp).
#include "tracking/request_tracker.hpp"

#include <variant>

#include "tracking/request_counting.hpp"

namespace vg::tracking {

const char* phase_name(RequestPhase phase) {
  switch (phase) {
    case RequestPhase::kSent: return "sent";
    case RequestPhase::kQueued: return "queued";
    case RequestPhase::kWithdrawing: return "withdrawing";
    case RequestPhase::kRunning: return "running";
    case RequestPhase::kHeld: return "held";
    case RequestPhase::kMoving: return "moving";
    case RequestPhase::kEnded: return "ended";
  }
  return "unknown";
}

void RequestTracker::sent(bool awaited) {
  if (ended()) return;
  phase_ = RequestPhase::kSent;
  awaited_ = awaited;
}

bool RequestTracker::answered(bool accepted) {
  if (accepted && phase_ == RequestPhase::kSent) phase_ = RequestPhase::kQueued;
  const bool waits = awaited_;
  awaited_ = false;
  return waits;
}

bool RequestTracker::withdraw(bool tensor, std::int64_t cost_bytes) {
  if (!movable() || cancelled_ || tensor || suspect_ || cost_bytes <= 0) return false;
  phase_ = RequestPhase::kWithdrawing;
  return true;
}

void RequestTracker::withdrawn(bool ok) {
  if (ended()) return;
  phase_ = ok ? RequestPhase::kMoving : RequestPhase::kRunning;
}

void RequestTracker::held() {
  if (!ended()) phase_ = RequestPhase::kHeld;
}

bool RequestTracker::end() {
  if (ended()) return false;
  phase_ = RequestPhase::kEnded;
  return true;
}

EventEffect RequestTracker::on_event(const EngineEvent& event) {
  EventEffect effect;
  if (std::holds_alternative<StartedEvent>(event)) {
    // Admitted once: a start on the engine that took it over after a crash
    // is counted there as granted again (admitted_before), not here.
    effect.first_start = !started_sent_ && !ended();
    effect.forward = !started_sent_;
    started_sent_ = true;
    if (phase_ == RequestPhase::kSent || phase_ == RequestPhase::kQueued || phase_ == RequestPhase::kWithdrawing) {
      phase_ = RequestPhase::kRunning;
    }
  } else if (const auto* t = std::get_if<TextEvent>(&event)) {
    if (!t->text.empty() || !t->token_ids.empty()) any_text_ = true;
    if (t->choice == 0) delivered_.insert(delivered_.end(), t->token_ids.begin(), t->token_ids.end());
    if (suspect_) {
      // Alone among the suspects, it got through a prefill and a step: it is
      // not what brought the engine down, and a later crash counts afresh.
      suspect_ = false;
      crashes_ = 0;
    }
  } else if (std::holds_alternative<PromptEvent>(event)) {
    effect.forward = !prompt_sent_;
    prompt_sent_ = true;
  } else if (std::holds_alternative<QueuedEvent>(event)) {
    effect.forward = !started_sent_;
  }
  return effect;
}

void RequestTracker::count_end(Counters& counters, const Error* error) const {
  count_request_end(counters, started_sent_, error);
}

int RequestTracker::crashed() {
  suspect_ = true;
  return ++crashes_;
}

bool RequestTracker::cancel() {
  if (ended() || cancelled_) return false;
  cancelled_ = true;
  return true;
}

}  // namespace vg::tracking
