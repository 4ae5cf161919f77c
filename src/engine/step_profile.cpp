// The step profile's engine side (see step_profile.hpp).
#include "engine/step_profile.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <utility>

#include "model/step_profiler.hpp"

namespace vg::engine_detail {

StepProfile::StepProfile(StepProfileOptions options) : options_(std::move(options)) {
  options_.min_batch = std::max(1, options_.min_batch);
  if (options_.steps > 0 && options_.profiler) state_ = State::kWaiting;
}

bool StepProfile::begin_recorded_step(int decoding, int chunks) {
  if (chunks > 0 || decoding < options_.min_batch) return false;
  if (state_ == State::kWaiting) {
    if (Status st = options_.profiler->begin_session(); !st.ok()) {
      spdlog::warn("profile: not recorded: {}", st.error().message);
      state_ = State::kIdle;
      return false;
    }
    state_ = State::kRecording;
  }
  options_.profiler->begin_step();
  return true;
}

void StepProfile::after_step() {
  options_.profiler->end_step();
  if (++recorded_ >= options_.steps) finish();
}

void StepProfile::stop() {
  if (state_ == State::kRecording) finish();
  state_ = State::kIdle;
}

void StepProfile::finish() {
  state_ = State::kIdle;
  const std::string path = options_.trace.string();
  Result<std::int64_t> events = options_.profiler->end_and_write(options_.trace);
  if (!events.ok()) {
    spdlog::error("profile: {} decode steps of batch >= {} recorded, but not written: {}", recorded_,
                  options_.min_batch, events.error().message);
    return;
  }
  spdlog::info("profile: {} decode steps of batch >= {} written to {} ({} events)", recorded_, options_.min_batch,
               path, *events);
}

}  // namespace vg::engine_detail
