// RemoteService's request path (see remote_service.hpp): placing a request
// and waiting for its engine's answer, what a closed engine leaves behind
// (crashes, resubmission), and moving
// queued requests to where room freed. Placement itself is placement.hpp's;
// each request's phase is its RequestTracker's.
#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <set>

#include "gateway/gateway_counting.hpp"
#include "gateway/remote_service.hpp"
#include "gateway/remote_slot.hpp"
#include "metrics/server_metrics.hpp"

namespace vg::gateway {
namespace {

/// What (re)submits `r` as `rid`. The deadline runs from the client's
/// request, not from this engine's receipt: a request sent again after a
/// crash carries what is left of it.
SubmitOrder order_for(const RemoteService::Req& r, std::uint64_t rid) {
  SubmitOrder order;
  order.rid = rid;
  order.timeout_s = std::max(1e-3, to_seconds(r.deadline - Clock::now()));
  if (r.tensor) {
    order.tensor = &*r.tensor;
    return order;
  }
  order.request = &r.request;
  // After output was sent, the next engine resumes after it.
  if (r.track.resumes()) order.resume = wire::ResumeState{r.track.delivered(), r.track.prompt_sent()};
  // An engine's start of it was counted: the next engine grants it again, it does not admit it again.
  order.admitted_before = r.track.started_sent();
  return order;
}

}  // namespace

// -- placement

std::vector<EngineSnapshot> RemoteService::snapshots(const std::string& model) const {
  std::vector<EngineSnapshot> out;
  out.reserve(slots_.size());
  for (const auto& s : slots_) out.push_back(s->snapshot(model));
  return out;
}

RemoteService::Slot* RemoteService::pick(const std::string& model, const std::set<const Slot*>& skip,
                                         std::int64_t min_budget) const {
  std::vector<EngineSnapshot> engines = snapshots(model);
  for (std::size_t i = 0; i < slots_.size(); ++i) engines[i].skip = skip.count(slots_[i].get()) > 0;
  const std::optional<std::size_t> i = pick_engine(engines, min_budget);
  return i ? slots_[*i].get() : nullptr;
}

RemoteService::Slot* RemoteService::room_now(const Req& r, const Slot* except) const {
  std::optional<std::size_t> other;
  for (std::size_t i = 0; i < slots_.size(); ++i) {
    if (slots_[i].get() == except) other = i;
  }
  const std::optional<std::size_t> i = engine_with_room(snapshots(r.request.model), r.cost_bytes, other);
  return i ? slots_[*i].get() : nullptr;
}

Result<wire::Accepted> RemoteService::place(std::shared_ptr<Req> r) {
  MutexUniqueLock lk(mu_);
  if (draining_ || stopping_) return shutting_down();
  Slot* s = pick(r->request.model);
  if (!s) {
    // A model no engine serves is the engine's to refuse (404 with the list).
    for (auto& other : slots_) {
      if (other->ready()) {
        s = other.get();
        break;
      }
    }
  }
  if (!s) {
    std::string why;
    for (auto& other : slots_) why += (why.empty() ? "" : "; ") + slot_reason(*other);
    Error e(ErrorCode::kOverloaded, "no engine is ready: " + why);
    e.retry_after_s = retry_after_s();
    return e;
  }
  r->svc = this;
  const double timeout =
      r->request.timeout_s ? std::min(*r->request.timeout_s, options_.request_timeout_s) : options_.request_timeout_s;
  const TimePoint answer_deadline = Clock::now() + from_seconds(options_.submit_timeout_s);
  r->deadline = Clock::now() + from_seconds(timeout);
  ++active_;
  std::uint64_t rid = 0;
  std::optional<SubmitAnswer> got;  // nullopt: no answer in time
  std::set<const Slot*> refused;    // engines whose devices are all too small for it
  std::int64_t largest_refusing_budget = 0;
  while (true) {
    r->slot = s;
    r->rid = next_rid_++;
    r->track.sent(true);  // a refusal by an earlier engine does not answer this send
    rid = r->rid;
    s->inflight[rid] = r;
    s->placed.add(0);                         // its cost is added when the engine accepts it
    std::condition_variable_any answered_cv;  // answer() wakes this submit alone
    awaiting_[rid] = &answered_cv;
    // Sent under mu_: a cancel of this request (cancel(), which takes mu_
    // first) then always reaches the engine after its submit.
    s->link->submit(order_for(*r, rid), true);
    const bool answered =
        answered_cv.wait_until(lk, answer_deadline, [&]() VG_REQUIRES(mu_) { return answers_.count(rid) > 0; });
    awaiting_.erase(rid);
    got.reset();
    if (answered) {
      got = std::move(answers_[rid]);
      answers_.erase(rid);
    }
    if (got && got->kind == SubmitAnswer::Kind::kRejected && !r->track.cancelled()) {
      // Too large for this engine's devices: an engine with a larger device
      // budget may take it (engine per device, devices of other sizes).
      const Error& refusal = got->error;
      if (refusal.code == ErrorCode::kExceedsDeviceMemory && refusal.budget_bytes) {
        refused.insert(s);
        largest_refusing_budget = std::max(largest_refusing_budget, *refusal.budget_bytes);
        if (Slot* larger = pick(r->request.model, refused, *refusal.budget_bytes + 1)) {
          s->inflight.erase(rid);
          spdlog::debug("request {} needs more than the budget of {} ({} bytes): sent to {}", r->id_, s->label(),
                        *refusal.budget_bytes, larger->label());
          s = larger;
          continue;
        }
      }
    }
    if (!got || got->kind != SubmitAnswer::Kind::kClosed || r->track.cancelled()) break;
    if (r->request.n > 1 && r->track.output_began()) break;  // choices cannot resume after their output began
    // The engine went away before it answered: the same request goes to
    // the engine that is ready next, within the same wait for an answer.
    r->slot = nullptr;
    const bool again = cv_.wait_until(lk, answer_deadline, [&]() VG_REQUIRES(mu_) {
      return stopping_ || draining_ || r->track.cancelled() || pick(r->request.model) != nullptr;
    });
    if (!again || stopping_ || draining_ || r->track.cancelled()) break;
    s = pick(r->request.model);
    spdlog::info("request {} sent again to engine {}: the engine it was sent to went away before answering", r->id_,
                 s->label());
    if (options_.metrics) options_.metrics->count_resumed("resubmitted");
  }
  if (got && got->kind == SubmitAnswer::Kind::kAccepted) return std::move(got->accepted);
  return placement_failed(*r, rid, got ? &*got : nullptr, largest_refusing_budget);
}

Error RemoteService::placement_failed(Req& r, std::uint64_t rid, const SubmitAnswer* got,
                                      std::int64_t largest_refusing_budget) {
  // Refused, or no answer: nothing of it goes on.
  const bool ends_here = r.track.end();
  if (ends_here) --active_;
  if (r.slot) r.slot->inflight.erase(rid);
  std::erase_if(pending_, [&](const std::shared_ptr<Req>& p) { return p.get() == &r; });
  cv_.notify_all();
  const auto kind = got ? got->kind : SubmitAnswer::Kind::kAccepted;
  if (got && kind == SubmitAnswer::Kind::kRejected) {
    Error error = got->error;
    // Too large for every engine of the model: said with the largest budget
    // of them all, as one engine over several devices says it.
    const auto serving = std::count_if(slots_.begin(), slots_.end(),
                                       [&](const auto& o) { return o->ready() && o->serves(r.request.model); });
    if (error.code == ErrorCode::kExceedsDeviceMemory && error.needed_bytes && serving > 1) {
      error = exceeds_device_memory(*error.needed_bytes,
                                    std::max(largest_refusing_budget, error.budget_bytes.value_or(0)), true);
    }
    return error;
  }
  if (!got && r.slot && r.slot->link) r.slot->link->cancel(rid);
  if (got && kind == SubmitAnswer::Kind::kCrashed) {
    Error e(ErrorCode::kEngineCrashed,
            fmt::format("request {} was in the engine each of the {} times it crashed (--max-crash-retries {}); "
                        "it is not tried again",
                        r.id_, r.track.unanswered_crashes(), options_.max_crash_retries));
    if (ends_here) r.track.count_end(ended_here_, &e);
    return e;
  }
  Error e(ErrorCode::kOverloaded,
          !got ? "the engine did not answer the submission in time" : "the engine restarted while taking the request");
  e.retry_after_s = retry_after_s();
  // Its engine is gone: nobody else counts its end (one that timed out is the engine's to end and count).
  if (got && kind == SubmitAnswer::Kind::kClosed && ends_here) {
    const Error cancelled(ErrorCode::kCancelled, "client closed the connection");
    r.track.count_end(ended_here_, r.track.cancelled() ? &cancelled : &e);
  }
  return e;
}

void RemoteService::answer(std::uint64_t rid, SubmitAnswer a) {
  answers_[rid] = std::move(a);
  if (auto it = awaiting_.find(rid); it != awaiting_.end()) {
    it->second->notify_one();
  } else {
    cv_.notify_all();
  }
}

void RemoteService::request_ended() {
  --active_;
  if (active_ == 0) cv_.notify_all();  // wait_idle(); nothing else waits for a request's end
}

// -- held requests and moves (the monitor thread)

void RemoteService::resubmit_pending(TimePoint now, Outbox& out) {
  std::vector<std::shared_ptr<Req>> keep;
  std::set<Slot*> suspect_busy;  // a suspect runs alone per engine
  for (auto& s : slots_) {
    for (auto& [rid, r] : s->inflight) {
      if (r->track.suspect()) suspect_busy.insert(s.get());
    }
  }
  for (auto& r : pending_) {
    if (r->track.ended()) continue;
    // Every request held here was accepted by an engine before (a crash's,
    // a move's): during a drain it still runs, within the shutdown grace.
    if (r->track.cancelled() || now >= r->deadline) {
      Error e(ErrorCode::kCancelled, "client closed the connection");
      if (!r->track.cancelled()) {
        e = Error(ErrorCode::kOverloaded, "no engine took the request again before its deadline");
        e.retry_after_s = retry_after_s();
      }
      r->track.end();
      r->track.count_end(ended_here_, &e);
      out.push(r->sink, FailedEvent{std::move(e), {}, {}});
      request_ended();
      continue;
    }
    // A moved request goes where room was found for it, while that engine
    // is ready; any other to an engine whose devices can hold it.
    Slot* s = r->move_to && r->move_to->ready() ? r->move_to : pick(r->request.model, {}, r->cost_bytes);
    // Refused by a full engine: sent back there at its Retry-After, or
    // before that to another engine that has room for it now (a restarted
    // engine, one whose queue emptied).
    if (s && now < r->not_before) s = room_now(*r, r->refused_by);
    if (!s || (r->track.suspect() && suspect_busy.count(s))) {
      keep.push_back(r);
      continue;
    }
    if (r->track.suspect()) suspect_busy.insert(s);
    resend(r, s);
  }
  pending_ = std::move(keep);
}

void RemoteService::resend(const std::shared_ptr<Req>& r, Slot* s) {
  if (s != r->refused_by) r->request.retry.token.clear();  // a place booked elsewhere
  if (r->move_to && r->move_to != s) r->move_to->placed.remove(r->cost_bytes);
  if (r->move_to != s) s->placed.add(r->cost_bytes);  // a move's hold already counts it there
  const bool moved = r->track.moving();
  r->slot = s;
  r->rid = next_rid_++;
  r->track.sent(false);  // no submit() waits for it
  r->move_to = nullptr;
  s->inflight[r->rid] = r;
  const SubmitOrder order = order_for(*r, r->rid);
  const bool resumed = !r->track.delivered().empty();
  if (moved) {
    if (options_.metrics) options_.metrics->count_resumed("moved");
    spdlog::info("request {} moved to engine {}: room freed there while it waited", r->id_, s->label());
  } else {
    if (options_.metrics) options_.metrics->count_resumed(resumed ? "resumed" : "resubmitted");
    spdlog::info("request {} {} on engine {} ({} tokens already sent, {} crashes{})", r->id_,
                 resumed ? "resumed" : "resubmitted", s->label(), r->track.delivered().size(), r->track.crashes(),
                 r->track.suspect() ? ", running alone until its first token" : "");
  }
  s->link->submit(order, false);
}

void RemoteService::rebalance() {
  // Several engines of a model (one per device): a request of this gateway
  // waiting in one engine's queue is taken back and placed on another
  // engine that has room for it now and nothing waiting, so it runs where
  // room frees first, as it would in one queue over the devices.
  if (slots_.size() < 2 || draining_ || stopping_) return;
  for (auto& from : slots_) {
    if (!from->ready() || !from->last_state || from->last_state->queue_depth == 0) continue;
    for (auto& [rid, r] : from->inflight) {  // in the order placed (rid)
      if (!r->track.movable()) continue;
      Slot* to = room_now(*r, from.get());
      if (!to || !r->track.withdraw(r->tensor.has_value(), r->cost_bytes)) continue;
      r->move_to = to;
      to->placed.add(r->cost_bytes);  // held for it until the move ends
      from->link->withdraw(rid);
    }
  }
}

// -- a closed engine's requests

bool RemoteService::requeue_after_close(const std::shared_ptr<Req>& r, std::uint64_t rid, Outbox& ends) {
  r->slot = nullptr;
  if (r->track.awaited()) {
    // A fresh submit still waiting for its answer: submit() sends it
    // again once an engine is ready (within its wait for an answer), or
    // fails it when this was its last crash.
    const int crashes = r->track.crashed_unanswered();
    answer(rid, closed_answer(crashes >= options_.max_crash_retries));
    return false;
  }
  std::optional<Error> end;
  if (r->track.cancelled() || stopping_) {
    end = r->track.cancelled() ? Error(ErrorCode::kCancelled, "client closed the connection")
                               : shutting_down(std::nullopt);
  } else {
    // Every request the engine held counts, queued or running: whether its
    // start got out before the crash does not say whether it ran (a crash
    // in its first step can take the start event with it). The suspects
    // then go back one at a time, so an innocent one is cleared by its
    // first token and the cause is found alone.
    const int crashes = r->track.crashed();
    if (crashes >= options_.max_crash_retries) {
      end = Error(ErrorCode::kEngineCrashed, fmt::format("request {} was running in the engine each of the {} times "
                                                         "it crashed (--max-crash-retries {}); it is not tried again",
                                                         r->id_, crashes, options_.max_crash_retries));
      spdlog::error("request {} failed: running at {} engine crashes", r->id_, crashes);
    } else if (r->request.n > 1 && r->track.output_began()) {
      end = Error(ErrorCode::kOverloaded, "the engine running this request's " + std::to_string(r->request.n) +
                                              " choices restarted after their output began");
      end->retry_after_s = retry_after_s();
    }
  }
  if (end) {
    r->track.end();
    --active_;
    r->track.count_end(ended_here_, &*end);
    ends.push(r->sink, FailedEvent{std::move(*end), {}, {}});
    return false;
  }
  r->track.held();
  pending_.push_back(r);
  return true;
}

// -- Service: submits and cancels

Status RemoteService::encode_prompt(CompletionRequest& request) const {
  const std::string* text = std::get_if<std::string>(&request.prompt);
  if (!request.chat && !text) return Status::Ok();  // token ids: the engine checks them
  std::string name = request.model;
  if (name.empty()) {
    MutexLock lock(mu_);
    // The engines' default model: the first language model each names, when they agree.
    for (const auto& s : slots_) {
      auto first = std::find_if(s->models.begin(), s->models.end(),
                                [](const ModelInfo& m) { return m.family != "torchscript"; });
      if (first == s->models.end()) continue;
      if (name.empty()) {
        name = first->id;
      } else if (name != first->id) {
        return Status::Ok();
      }
    }
  }
  return encoders_.encode(request, name);
}

Result<Submission> RemoteService::submit(const CompletionRequest& request, std::shared_ptr<EventSink> sink) {
  auto r = std::make_shared<Req>();
  r->request = request;
  if (Status encoded = encode_prompt(r->request); !encoded.ok()) return encoded.error();
  r->sink = std::move(sink);
  r->id_ = request.request_id;
  auto a = place(r);
  if (!a.ok()) return std::move(a).error();
  Submission sub;
  sub.handle = r;
  sub.model = a->model;
  sub.prompt_tokens = a->prompt_tokens;
  sub.queue_position = a->queue_position;
  sub.cost_bytes = a->cost_bytes;
  // A text prompt echoes as the client sent it (the engine saw token ids).
  const std::string* text = std::get_if<std::string>(&request.prompt);
  sub.echo_text = request.echo && text ? *text : a->echo_text;
  sub.retry_claimed_by = a->retry_claimed_by;
  return sub;
}

void RemoteService::cancel(Req& req) {
  std::shared_ptr<EngineLink> link;
  std::uint64_t rid = 0;
  {
    MutexLock lock(mu_);
    if (!req.track.cancel()) return;
    if (req.slot && req.slot->link) {
      link = req.slot->link;
      rid = req.rid;
    }
    notify_changed();  // a held one ends at the monitor's next turn
  }
  if (link) link->cancel(rid);
}

}  // namespace vg::gateway
