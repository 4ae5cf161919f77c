// Where one request of a gateway stands while engine processes run it: its
// phase (an enum with its transitions below), what its client has been sent
// (the start, the prompt's logprobs, choice 0's tokens: what a resume
// continues after), its crashes and whether the client cancelled it. It
// knows no engine, channel or clock: a gateway (RemoteService, or a Redis
// gateway that resumes requests) drives it from what its engines report.
// Not synchronised: the owner's lock guards it (RemoteService::mu_).
#pragma once

#include <cstdint>
#include <vector>

#include "api/events.hpp"
#include "api/types.hpp"
#include "common/error.hpp"

namespace vg::tracking {

/// A request's phase. Transitions (anything else leaves the phase as it is):
///   kSent        --accepted--------------> kQueued
///   kSent, kQueued, kWithdrawing --started--> kRunning   (events may overtake the answer)
///   kQueued      --withdraw asked--------> kWithdrawing
///   kWithdrawing --withdrawn-------------> kMoving       (held here for the engine with room)
///   kWithdrawing --withdraw refused------> kRunning      (admitted meanwhile: it stays)
///   any but kEnded --held----------------> kHeld         (its engine died, or refused it as full)
///   any but kEnded --sent----------------> kSent         (to an engine, again after kHeld/kMoving)
///   any          --ended-----------------> kEnded        (final: nothing leaves it)
enum class RequestPhase {
  kSent,         ///< sent to an engine; its answer not in yet
  kQueued,       ///< accepted, waiting in the engine's queue: it may be taken back (withdraw)
  kWithdrawing,  ///< asked back from the engine's queue, to go where room freed
  kRunning,      ///< started on its engine (or admitted there before it could be taken back)
  kHeld,         ///< held by the gateway for an engine to take it again
  kMoving,       ///< taken back from an engine's queue, held to be placed on another
  kEnded,        ///< its terminal event was decided: nothing more reaches its client
};

/// Its name in logs ("sent", "queued", ...).
const char* phase_name(RequestPhase phase);

/// What an engine event means for the client (RequestTracker::on_event).
struct EventEffect {
  bool forward = true;       ///< the client gets it (a repeat after a resume does not)
  bool first_start = false;  ///< the first start the client sees: count its admission
};

class RequestTracker {
 public:
  RequestPhase phase() const { return phase_; }
  bool ended() const { return phase_ == RequestPhase::kEnded; }

  // -- phase transitions (see RequestPhase)
  /// Sent to an engine; `awaited`: a submit() waits for the engine's answer
  /// (a fresh request), not a request the gateway sends again on its own.
  void sent(bool awaited);
  /// The engine's answer (accepted or refused) came in. Returns whether a
  /// submit() waits for it (it takes the answer), which this clears.
  bool answered(bool accepted);
  /// Asks it back from its engine's queue, when it is queued there and
  /// nothing rules a move out (`tensor`, a suspect, its cost unknown).
  /// False (phase unchanged) when it may not move.
  bool withdraw(bool tensor, std::int64_t cost_bytes);
  /// The engine's answer to the withdraw: `ok` taken back (kMoving), else it stays (kRunning).
  void withdrawn(bool ok);
  /// Held by the gateway for an engine to take it again.
  void held();
  /// Decides its end. False when it had ended already (nothing to do).
  bool end();

  bool awaited() const { return awaited_; }
  bool movable() const { return phase_ == RequestPhase::kQueued; }
  bool moving() const { return phase_ == RequestPhase::kMoving; }

  // -- what its client was sent
  /// Records an engine's event for it: tokens of choice 0, the start and
  /// the prompt sent; a suspect is cleared by its first token.
  EventEffect on_event(const EngineEvent& event);
  const std::vector<std::int32_t>& delivered() const { return delivered_; }
  bool prompt_sent() const { return prompt_sent_; }
  /// Its start was sent: an engine counted its admission (the next one grants it again).
  bool started_sent() const { return started_sent_; }
  /// Some choice's text (or tokens) was sent: choices of n > 1 cannot resume.
  bool output_began() const { return any_text_; }
  /// The next engine continues after what was sent (a resume, not a fresh start).
  bool resumes() const { return !delivered_.empty() || prompt_sent_; }
  /// Counts its end into `counters` as an engine would (gateway_counting.hpp).
  void count_end(Counters& counters, const Error* error) const;

  // -- crashes and cancel
  /// Its engine crashed with it accepted: a suspect from now on (sent back
  /// alone until its first token). Returns its crashes so far.
  int crashed();
  /// Its engine crashed before answering the submit: counted apart, so an
  /// innocent request beside a suspect is not failed by its next crash.
  int crashed_unanswered() { return ++unanswered_crashes_; }
  bool suspect() const { return suspect_; }
  int crashes() const { return crashes_; }
  int unanswered_crashes() const { return unanswered_crashes_; }
  /// The client cancelled it. False when it had ended or was cancelled already.
  bool cancel();
  bool cancelled() const { return cancelled_; }

 private:
  RequestPhase phase_ = RequestPhase::kSent;
  bool awaited_ = false;
  std::vector<std::int32_t> delivered_;  // choice 0's tokens sent to the client
  bool prompt_sent_ = false;
  bool started_sent_ = false;
  bool any_text_ = false;
  bool suspect_ = false;
  int crashes_ = 0;
  int unanswered_crashes_ = 0;
  bool cancelled_ = false;
};

}  // namespace vg::tracking
