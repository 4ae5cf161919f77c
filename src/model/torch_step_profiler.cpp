// The libtorch step profilers of model/torch_step_profiler.hpp: Kineto's
// (libtorch's profiler writes the trace) and the host-ops one (a
// RecordFunction observer of our own, for builds without Kineto). Both mark
// the recorded steps with a RecordFunction range of USER_SCOPE, which the
// trace shows as a "user_annotation".
#include "model/torch_step_profiler.hpp"

#include <ATen/record_function.h>
#include <torch/csrc/autograd/profiler_kineto.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <optional>
#include <set>
#include <vector>

#include "device/torch_compat.hpp"

namespace vg {
namespace {

namespace prof = torch::autograd::profiler;
namespace prof_impl = torch::profiler::impl;
using SteadyClock = std::chrono::steady_clock;

/// The events a host-ops session collects. The RecordFunction callbacks are
/// plain function pointers, so they reach it through g_recording.
struct HostRecording {
  SteadyClock::time_point origin = SteadyClock::now();
  std::mutex mu;
  std::vector<TraceEvent> events;  // guarded by mu
};

/// The host-ops session recording now; null when none (one per process).
std::atomic<HostRecording*> g_recording{nullptr};

struct OpStarted final : at::ObserverContext {
  explicit OpStarted(SteadyClock::time_point t) : at(t) {}
  SteadyClock::time_point at;
};

double to_micros(SteadyClock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

std::unique_ptr<at::ObserverContext> on_op_start(const at::RecordFunction&) {
  if (g_recording.load(std::memory_order_acquire) == nullptr) return nullptr;
  return std::make_unique<OpStarted>(SteadyClock::now());
}

void on_op_end(const at::RecordFunction& fn, at::ObserverContext* context) {
  HostRecording* recording = g_recording.load(std::memory_order_acquire);
  if (recording == nullptr || context == nullptr) return;
  const SteadyClock::time_point start = static_cast<OpStarted*>(context)->at;
  TraceEvent event{fn.name(), fn.scope() == at::RecordScope::USER_SCOPE ? "user_annotation" : "cpu_op",
                   to_micros(start - recording->origin), to_micros(SteadyClock::now() - start), fn.threadId()};
  std::lock_guard lk(recording->mu);
  recording->events.push_back(std::move(event));
}

/// The kDecodeStepRange range of begin_step() .. end_step(), a RecordFunction
/// that both profilers see.
class StepRange {
 public:
  void open() {
    range_.emplace(at::RecordScope::USER_SCOPE);
    if (range_->isActive()) range_->before(kDecodeStepRange);
  }
  void close() { range_.reset(); }  // its destructor ends the range

 private:
  std::optional<at::RecordFunction> range_;
};

/// libtorch's profiler (Kineto): CPU ops, and CUDA kernels on CUDA devices.
class KinetoStepProfiler final : public StepProfiler {
 public:
  explicit KinetoStepProfiler(DeviceKind device) {
    activities_.insert(prof_impl::ActivityType::CPU);
    if (device == DeviceKind::kCuda) activities_.insert(prof_impl::ActivityType::CUDA);
  }

  Status begin_session() override {
    try {
      const prof_impl::ProfilerConfig config(prof_impl::ProfilerState::KINETO);
      prof::prepareProfiler(config, activities_);  // Kineto's order: prepare, then start (see torch_compat.cpp)
      prof::enableProfiler(config, activities_);
    } catch (...) {
      return compat::current_exception_error("starting the profiler");
    }
    return Status::Ok();
  }
  void begin_step() override { range_.open(); }
  void end_step() override { range_.close(); }

  Result<std::int64_t> end_and_write(const std::filesystem::path& path) override {
    range_.close();
    try {
      std::unique_ptr<prof::ProfilerResult> result = prof::disableProfiler();
      result->save(path.string());
      return static_cast<std::int64_t>(result->events().size());
    } catch (...) {
      return compat::current_exception_error("writing the trace to " + path.string());
    }
  }

 private:
  std::set<prof_impl::ActivityType> activities_;
  StepRange range_;
};

/// Our own RecordFunction observer on the recording thread: its ATen ops
/// and the step ranges, timed on the host.
class HostOpsStepProfiler final : public StepProfiler {
 public:
  ~HostOpsStepProfiler() override { stop(); }

  Status begin_session() override {
    auto recording = std::make_unique<HostRecording>();
    HostRecording* none = nullptr;
    if (!g_recording.compare_exchange_strong(none, recording.get())) {
      return Error(ErrorCode::kInternal, "starting the profiler: another step profile is recording");
    }
    recording_ = std::move(recording);
    callback_ = at::addThreadLocalCallback(at::RecordFunctionCallback(on_op_start, on_op_end)
                                               .scopes({at::RecordScope::FUNCTION, at::RecordScope::USER_SCOPE}));
    return Status::Ok();
  }
  void begin_step() override { range_.open(); }
  void end_step() override { range_.close(); }

  Result<std::int64_t> end_and_write(const std::filesystem::path& path) override {
    range_.close();
    std::vector<TraceEvent> events = stop();
    std::sort(events.begin(), events.end(),
              [](const TraceEvent& a, const TraceEvent& b) { return a.start_us < b.start_us; });
    if (Status st = write_chrome_trace(path, events); !st.ok()) return st.error();
    return static_cast<std::int64_t>(events.size());
  }

 private:
  /// Ends the session (if one runs) and returns its events.
  std::vector<TraceEvent> stop() {
    if (!recording_) return {};
    at::removeCallback(callback_);
    g_recording.store(nullptr, std::memory_order_release);
    std::vector<TraceEvent> events = std::move(recording_->events);
    recording_.reset();
    return events;
  }

  std::unique_ptr<HostRecording> recording_;  // null outside a session
  at::CallbackHandle callback_ = at::INVALID_CALLBACK_HANDLE;
  StepRange range_;
};

}  // namespace

TraceSource available_trace_source() {
  return compat::kineto_available() ? TraceSource::kKineto : TraceSource::kHostOps;
}

std::unique_ptr<StepProfiler> make_torch_step_profiler(TraceSource source, DeviceKind device) {
  if (source == TraceSource::kKineto) return std::make_unique<KinetoStepProfiler>(device);
  return std::make_unique<HostOpsStepProfiler>();
}

}  // namespace vg
