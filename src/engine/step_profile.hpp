// The engine thread's side of the step profile (Engine::Options::step_profile):
// which steps are recorded, when the profiler's session starts and ends, and
// the log line. Not a public header; engine thread only.
#pragma once

#include "engine/engine.hpp"

namespace vg::engine_detail {

class StepProfile {
 public:
  /// Off when options.steps is 0 or there is no profiler.
  explicit StepProfile(StepProfileOptions options);

  /// Before each step, with its decoding sequences and prefill chunks: true
  /// when the step is recorded (its range is open; call after_step()). Off
  /// or done, this is one comparison.
  bool before_step(int decoding, int chunks) {
    if (state_ == State::kIdle) return false;
    return begin_recorded_step(decoding, chunks);
  }
  /// After a recorded step: closes its range, and after the last one ends
  /// the session and writes the trace.
  void after_step();
  /// The engine is stopping: a session in progress ends, and the trace of
  /// the steps recorded so far is written.
  void stop();

 private:
  enum class State {
    kIdle,       ///< off, or the trace is written (or failed)
    kWaiting,    ///< no qualifying step yet: no session
    kRecording,  ///< the session runs
  };

  bool begin_recorded_step(int decoding, int chunks);
  void finish();

  StepProfileOptions options_;
  State state_ = State::kIdle;
  int recorded_ = 0;  ///< steps recorded so far
};

}  // namespace vg::engine_detail
