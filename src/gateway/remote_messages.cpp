// RemoteService's handling of its engines' messages (see remote_service.hpp),
// on the links' reader threads: each decoded message dispatched by its type
// (heartbeats, state replies, answers to submits, events, tensor results,
// withdrawals), and what a message that cannot be read does.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <variant>

#include "common/overloaded.hpp"
#include "gateway/remote_service.hpp"
#include "gateway/remote_slot.hpp"

namespace vg::gateway {

void RemoteService::on_message(Slot* s, std::uint64_t epoch, wire::Decoded<wire::ToGateway> m) {
  Outbox out;
  {
    MutexLock lock(mu_);
    if (s->epoch != epoch) return;
    s->last_heard = Clock::now();
    if (m.ok()) {
      dispatch(*s, std::move(m).value(), out);
    } else {
      on_unreadable(*s, m.error(), out);
    }
  }
  out.deliver();
}

void RemoteService::dispatch(Slot& s, wire::ToGateway message, Outbox& out) {
  using Kind = SubmitAnswer::Kind;
  // The request a message names; null when it ended here already (cancelled, failed over).
  auto request = [&](std::uint64_t rid) VG_REQUIRES(mu_) -> std::shared_ptr<Req> {
    auto it = s.inflight.find(rid);
    return it == s.inflight.end() ? nullptr : it->second;
  };
  // Each handler runs under mu_, as dispatch() does (the analysis does not see into lambdas).
  std::visit(Overloaded{
                 [&](const wire::StatusReport& m) VG_REQUIRES(mu_) { on_status(s, m); },
                 [&](wire::StateReport& m) VG_REQUIRES(mu_) { on_state(s, std::move(m)); },
                 [&](wire::SubmitAccepted& m) VG_REQUIRES(mu_) {
                   route_answer(s, m.rid, SubmitAnswer{Kind::kAccepted, std::move(m.submission), {}}, out);
                 },
                 [&](wire::SubmitRejected& m) VG_REQUIRES(mu_) {
                   route_answer(s, m.rid, SubmitAnswer{Kind::kRejected, {}, std::move(m.error)}, out);
                 },
                 [&](const wire::Withdrawn& m) VG_REQUIRES(mu_) {
                   if (auto r = request(m.rid)) on_withdrawn(s, r, m.rid, m.ok);
                 },
                 [&](wire::InferDone& m) VG_REQUIRES(mu_) {
                   if (auto r = request(m.rid)) on_infer_done(s, r, m.rid, std::move(m.result), out);
                 },
                 [&](wire::Event& m) VG_REQUIRES(mu_) {
                   if (auto r = request(m.rid)) on_event(s, r, std::move(m.event), out);
                 },
                 // The answers to a hello, never sent after it.
                 [&](const wire::EngineHello&) VG_REQUIRES(mu_) {
                   on_unreadable(s, wire::DecodeError{"hello", 0, "a second hello"}, out);
                 },
                 [&](const wire::Refused& m) VG_REQUIRES(mu_) {
                   on_unreadable(s, wire::DecodeError{"refused", 0, "refused after its hello: " + m.reason}, out);
                 },
             },
             message);
}

void RemoteService::on_state(Slot& s, wire::StateReport m) {
  if (options_.metrics) s.mirror.mirror(*options_.metrics, m.metrics);
  const std::uint64_t qid = m.qid;
  state_replies_[qid] = std::move(m);
  cv_.notify_all();
}

void RemoteService::route_answer(Slot& s, std::uint64_t rid, SubmitAnswer a, Outbox& out) {
  auto it = s.inflight.find(rid);
  if (it != s.inflight.end()) {
    const std::shared_ptr<Req> r = it->second;  // a copy: the handler may erase the entry
    on_answer(s, r, rid, std::move(a), out);
  } else if (awaiting_.count(rid)) {
    // A short request can end before the engine's answer to its submit
    // (events pushed during submit go first): submit() still waits for it.
    answer(rid, std::move(a));
  }
}

void RemoteService::on_unreadable(Slot& s, const wire::DecodeError& e, Outbox& out) {
  auto it = e.rid ? s.inflight.find(e.rid) : s.inflight.end();
  if (it != s.inflight.end()) {
    const std::shared_ptr<Req> r = it->second;  // a copy: the handler erases the entry
    fail_unreadable(s, r, e.rid, e.message, out);
    return;
  }
  // Nothing to pin it on (the protocol is broken): the connection closes,
  // and its requests move as after a crash.
  spdlog::error("engine on {}: closing its connection: {}", s.label(), e.message);
  if (std::shared_ptr<EngineLink> link = s.link) out.then([link, why = e.message] { link->close(why); });
}

void RemoteService::fail_unreadable(Slot& s, const std::shared_ptr<Req>& r, std::uint64_t rid, const std::string& why,
                                    Outbox& out) {
  spdlog::error("engine on {}: a message about request {} could not be read: {}", s.label(), r->id_, why);
  if (std::shared_ptr<EngineLink> link = s.link) out.then([link, rid] { link->cancel(rid); });
  Error error(ErrorCode::kInternal, "the engine sent a message about the request that could not be read: " + why);
  if (awaiting_.count(rid)) {
    // Its submit waits for an answer: this is it.
    answer(rid, SubmitAnswer{SubmitAnswer::Kind::kRejected, {}, std::move(error)});
    return;
  }
  // The request cannot go on from a stream it cannot read: it ends here.
  s.inflight.erase(rid);
  if (!r->track.end()) return;
  request_ended();
  cv_.notify_all();
  if (r->tensor) {
    out.then([r, error] { r->tensor_done(error); });
  } else {
    out.push(r->sink, FailedEvent{std::move(error), {}, {}});
  }
}

void RemoteService::on_status(Slot& s, const wire::StatusReport& m) {
  const bool was = s.status.ready;
  s.status = m.status;
  if (was != s.status.ready) set_state(s, s.status.ready ? EngineState::kReady : EngineState::kNotReady);
  if (m.admission) {
    s.learn(*m.admission);
    publish_engine_metrics(s);  // its device names may be known from now on
  }
  if (options_.metrics) s.mirror.mirror(*options_.metrics, m.metrics);
}

void RemoteService::on_answer(Slot& s, const std::shared_ptr<Req>& r, std::uint64_t rid, SubmitAnswer a, Outbox& out) {
  const bool accepted = a.kind == SubmitAnswer::Kind::kAccepted;
  const bool awaited = r->track.answered(accepted);
  if (accepted) {
    // Placement counts its cost against the engine until a status shows it.
    // Counted when sent (a resubmission at its known cost, a new one at 0): the rest now.
    const std::int64_t cost = a.accepted.cost_bytes;
    if (cost > r->cost_bytes) s.placed.bytes += cost - r->cost_bytes;
    r->cost_bytes = cost;
    if (awaited) answer(rid, std::move(a));
    return;
  }
  s.inflight.erase(rid);
  if (awaited) {
    answer(rid, std::move(a));
  } else if (a.error.code == ErrorCode::kOverloaded && !r->track.ended() && !r->track.cancelled()) {
    // A request taken again (after a crash, or moved) that the engine has
    // no room for now (its queue is full, or it is draining): held here
    // and offered again after the engine's Retry-After (at least 0.05 s),
    // with the token of the place the engine booked for it, until its
    // deadline; its client sees latency, or at the deadline a 503 with
    // Retry-After. (Offered before the promised time, the engine would
    // count it as an early retry and refuse it again.)
    s.placed.remove(r->cost_bytes);
    r->slot = nullptr;
    const double wait = std::max(0.05, a.error.retry_after_s.value_or(0.2));
    r->request.retry.token = a.error.retry_token;
    r->refused_by = &s;
    r->not_before = Clock::now() + from_seconds(wait);
    r->track.held();
    spdlog::info("request {}: engine {} has no room for it now ({}); offering it again in {:.2f} s", r->id_, s.label(),
                 a.error.message, wait);
    pending_.push_back(r);
    monitor_cv_.notify_one();
  } else if (r->track.end()) {
    // A resubmitted request has no submit() waiting: its client gets the refusal as its end.
    request_ended();
    cv_.notify_all();
    out.push(r->sink, FailedEvent{std::move(a.error), {}, {}});
  }
}

void RemoteService::on_withdrawn(Slot& s, const std::shared_ptr<Req>& r, std::uint64_t rid, bool ok) {
  Slot* to = r->move_to;
  r->move_to = nullptr;
  r->track.withdrawn(ok);  // not taken back: admitted meanwhile, it runs here
  if (!ok) {
    if (to) to->placed.remove(r->cost_bytes);
    return;
  }
  s.inflight.erase(rid);
  if (r->track.ended()) {
    if (to) to->placed.remove(r->cost_bytes);
    return;
  }
  r->slot = nullptr;
  r->move_to = to;  // its hold there stays until it is sent
  pending_.push_back(r);
  monitor_cv_.notify_one();  // placed again at the monitor's next turn
}

void RemoteService::on_infer_done(Slot& s, const std::shared_ptr<Req>& r, std::uint64_t rid,
                                  Result<TensorResult> result, Outbox& out) {
  if (!r->tensor) return;
  s.inflight.erase(rid);
  if (!r->track.end()) return;
  request_ended();
  cv_.notify_all();
  auto shared = std::make_shared<Result<TensorResult>>(std::move(result));
  out.then([r, shared] { r->tensor_done(std::move(*shared)); });
}

void RemoteService::on_event(Slot& s, const std::shared_ptr<Req>& r, EngineEvent e, Outbox& out) {
  const tracking::EventEffect effect = r->track.on_event(e);
  if (effect.first_start) ++s.unreported[CounterId::kAdmitted];
  if (is_terminal(e)) {
    s.inflight.erase(r->rid);
    if (r->track.ended()) return;
    const auto* failed = std::get_if<FailedEvent>(&e);
    r->track.count_end(s.unreported, failed ? &failed->error : nullptr);
    r->track.end();
    request_ended();
  }
  if (r->track.ended() && !is_terminal(e)) return;
  if (effect.forward) out.push(r->sink, std::move(e));
}

}  // namespace vg::gateway
