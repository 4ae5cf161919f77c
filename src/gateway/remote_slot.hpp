// RemoteService's parts (remote_service.hpp): one engine (Slot), one request
// (Req), and the Outbox of what a handler decided under the lock and does
// after releasing it. Only remote_service.cpp and remote_requests.cpp
// include this. Slot and Req fields are guarded by RemoteService::mu_ (a
// Slot's endpoint is fixed); an Outbox belongs to the thread that fills it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gateway/engine_link.hpp"
#include "gateway/engine_process.hpp"
#include "gateway/metrics_mirror.hpp"
#include "gateway/placement.hpp"
#include "gateway/remote_service.hpp"
#include "tracking/counter_carry.hpp"
#include "tracking/request_tracker.hpp"

namespace vg::gateway {

/// Whether something exists at `path` (an engine's Unix socket). Any thread.
bool socket_exists(const std::string& path);

/// One engine: its link, its process and what it last said.
struct RemoteService::Slot {
  EngineEndpoint ep;
  std::shared_ptr<EngineLink> link;  // null while not connected
  std::uint64_t epoch = 0;           // +1 per connection
  EngineState state = EngineState::kStarting;
  EngineProcess process;
  TimePoint connected{};
  TimePoint next_connect{};  // after a refused hello: try again at this time
  TimePoint last_heard{};
  wire::EngineStatus status;
  std::vector<ModelInfo> models;
  std::vector<TensorModelInfo> tensor_models;  // its TorchScript models (also listed in `models`)
  std::vector<std::string> devices;
  std::map<std::uint64_t, std::shared_ptr<Req>> inflight;
  MetricsMirror mirror;
  /// Its counters across its processes (what its states reported, and
  /// what this gateway counted for a process that died before reporting).
  tracking::CounterCarry carry;
  /// Its last state (while it is away: its devices only).
  std::optional<AdmissionState> last_state;
  bool connecting = false;
  std::string connect_error;  // why the last connection attempt failed; empty: none failed
  /// The requests placement sent it since its last status: counted against
  /// it until a status includes them.
  PlacedSinceStatus placed;
  /// This gateway's requests admitted (first started) and completed there
  /// since its last state: counted into /v1/admission until the next state
  /// holds them, and carried over when the engine dies before sending one.
  Counters unreported;

  bool supervised() const { return !ep.command.empty(); }
  std::string label() const {
    if (!ep.device.empty()) return ep.device;
    std::string s;
    for (const std::string& d : devices) s += (s.empty() ? "" : ",") + d;
    return s.empty() ? "unix:" + ep.socket_path : s;
  }
  bool ready() const { return link && status.ready; }
  /// Its state as the engine just reported it (hello, heartbeat or state
  /// reply): what placement counted since the last one is in it now.
  void learn(std::optional<AdmissionState> reported) {
    if (reported) carry.report(tracking::CounterTotals::of(*reported));
    last_state = std::move(reported);
    unreported = Counters{};
    placed = PlacedSinceStatus{};
  }
  /// It as placement sees it for a request of `model` (placement.hpp).
  EngineSnapshot snapshot(const std::string& model) const {
    EngineSnapshot e;
    e.ready = ready();
    e.serves = serves(model);
    e.has_state = last_state.has_value();
    e.queue_depth = last_state ? last_state->queue_depth : 0;
    e.free_budget = free_budget(last_state, placed);
    e.free_slots = free_slots(last_state, placed);
    e.largest_budget = largest_budget(last_state);
    e.inflight = inflight.size();
    return e;
  }
  bool serves(const std::string& model) const {
    if (model.empty()) return true;
    return std::any_of(models.begin(), models.end(), [&](const ModelInfo& m) { return m.id == model; });
  }
};

/// A request the HTTP layer holds.
struct RemoteService::Req final : RequestHandle {
  RemoteService* svc = nullptr;
  std::string id_;
  CompletionRequest request;
  std::shared_ptr<EventSink> sink;
  TimePoint deadline;
  Slot* slot = nullptr;  // where it runs now; null while held here
  std::uint64_t rid = 0;
  /// Its phase, what its client was sent, its crashes and cancel.
  tracking::RequestTracker track;
  std::int64_t cost_bytes = 0;  // its admission cost, from its engine's answer
  /// Asked back (withdraw) or taken back from its engine's queue to be
  /// placed where room freed: where (its cost is held there until sent).
  Slot* move_to = nullptr;
  /// Held here: not sent again before this (an engine refused it as
  /// overloaded), except to another engine with room for it now.
  TimePoint not_before{};
  Slot* refused_by = nullptr;  // the engine that refused it last (its booked place is there)
  /// A TorchScript request: sent as "infer"; `request` holds only its model
  /// and id, and `sink` turns a failure into a call of `tensor_done`.
  std::optional<TensorInferRequest> tensor;
  TensorDone tensor_done;

  const std::string& id() const override { return id_; }
  void cancel() override { svc->cancel(*this); }
};

/// What a handler decided under RemoteService::mu_ and does after releasing
/// it, in order: events pushed to sinks, tensor results handed over, cancels.
class RemoteService::Outbox {
 public:
  void push(std::shared_ptr<EventSink> sink, EngineEvent event) {
    steps_.emplace_back([sink = std::move(sink), e = std::move(event)]() mutable { sink->push(std::move(e)); });
  }
  void then(std::function<void()> step) { steps_.push_back(std::move(step)); }
  bool empty() const { return steps_.empty(); }
  /// Runs what it holds (without the lock), once.
  void deliver() {
    std::vector<std::function<void()>> steps = std::move(steps_);
    steps_.clear();
    for (auto& step : steps) step();
  }

 private:
  std::vector<std::function<void()>> steps_;
};

}  // namespace vg::gateway
