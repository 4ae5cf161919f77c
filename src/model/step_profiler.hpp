// The step profile (--profile-steps): the StepProfiler interface the engine
// drives around the decode steps it records, and the Chrome-trace writer
// for profilers that collect their events themselves. Torch-free: the
// libtorch profilers are in model/torch_step_profiler.cpp, made by
// model/torch_step_profiler.hpp. A StepProfiler belongs to one engine thread:
// every call comes from it, and recording covers that thread's ops.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>

#include "common/error.hpp"

namespace vg {

/// The name of the range that marks each recorded decode step in a trace.
inline constexpr const char* kDecodeStepRange = "vg::decode_step";

/// One complete event of a Chrome trace ("ph": "X").
struct TraceEvent {
  std::string name;       ///< an op ("aten::mm") or a range (kDecodeStepRange)
  std::string category;   ///< "cpu_op" for ops, "user_annotation" for ranges
  double start_us = 0;    ///< start, microseconds on the recorder's clock
  double duration_us = 0; ///< microseconds
  std::uint64_t thread = 0;  ///< the thread it ran on (the trace's "tid")
};

/// Writes `events` to `path` as Chrome-trace JSON, {"traceEvents": [...]},
/// each with "ph": "X" and this process's pid; chrome://tracing and Perfetto
/// open it. Replaces the file. Errors: kConfig naming the path when it
/// cannot be written. Any thread.
Status write_chrome_trace(const std::filesystem::path& path, std::span<const TraceEvent> events);

/// Records the ops of a run of steps on the calling thread and writes them as
/// a Chrome trace. The call order is begin_session, then any number of
/// begin_step / end_step pairs (ops between the pairs are recorded too, but
/// not inside a step range), then end_and_write once. Engine thread only.
class StepProfiler {
 public:
  virtual ~StepProfiler() = default;
  /// Starts recording the calling thread's ops. Errors: kInternal when the
  /// profiler cannot start (e.g. another profile runs on this thread).
  virtual Status begin_session() = 0;
  /// Opens a kDecodeStepRange range: the step that follows runs inside it.
  virtual void begin_step() = 0;
  /// Closes the range begin_step opened.
  virtual void end_step() = 0;
  /// Stops recording and writes the trace to `path`. Returns the number of
  /// events recorded (ops, ranges and, where recorded, device kernels).
  /// Errors: kConfig when `path` cannot be written, kInternal when the
  /// profiler fails; recording has stopped either way.
  virtual Result<std::int64_t> end_and_write(const std::filesystem::path& path) = 0;
};

}  // namespace vg
