// The prefill worker (Engine::Options::prefill_worker, disaggregated
// prefill): a second compute thread per engine that prefills newly admitted
// prompts while the engine thread runs decode steps, so a new request's time
// to first token is its own prefill rather than the rest of a decode step
// plus a mixed step. The worker samples and sends the first token itself,
// then hands the sequence back; the engine thread decodes it from the next
// step on. A failed worker step is handled by the engine thread exactly as a
// failed step of its own (out-of-memory recovery included).
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "device/device.hpp"
#include "engine/engine_impl.hpp"

namespace vg {

void Engine::Impl::prefill_loop() {
  DeviceScope scope(&device);
  PrefillWorker& w = *prefill;
  Shared& sig = *w.signal;
  std::vector<std::unique_ptr<Sequence>> work;  // oldest first
  std::vector<PrefillBatch> back;
  for (;;) {
    {
      std::unique_lock lk(sig.mu);
      sig.cv.wait(lk, [&] { return sig.stopping || sig.wake || !w.inbox.empty() || !work.empty(); });
      if (sig.stopping) {
        // Unfinished work goes back as it is; the engine thread answers it.
        if (!work.empty()) w.outbox.push_back(PrefillBatch{std::move(work), std::nullopt});
        break;
      }
      sig.wake = false;
      for (auto& s : w.inbox) work.push_back(std::move(s));
      w.inbox.clear();
    }
    prefill_admit(work, back);
    const bool stepped = !work.empty();
    prefill_step_started.store(Clock::now().time_since_epoch().count(), std::memory_order_relaxed);
    prefill_step(work, back);
    prefill_step_started.store(engine_detail::kIdle, std::memory_order_relaxed);
    if (stepped && options.step_delay_ms > 0) {
      std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(options.step_delay_ms));
    }
    if (back.empty()) continue;
    {
      std::lock_guard lk(sig.mu);
      for (PrefillBatch& b : back) w.outbox.push_back(std::move(b));
    }
    back.clear();
    shared->notify();
  }
}

// New work starts here as well as on the engine thread, so that a request
// arriving during a decode step is prefilled at once instead of after it.
// Admission bounds the batch (the engine's leases <= max_batch) whichever
// thread asks.
void Engine::Impl::prefill_admit(std::vector<std::unique_ptr<Sequence>>& work, std::vector<PrefillBatch>& back) {
  const TimePoint now = Clock::now();
  if (front->queued_count.load() == 0) return;
  drop_queued(now);
  if (paused(now) || !admission->engine_available(index)) return;
  std::vector<AdmissionGrant> grants = admission->grant(now, max_running(), index);
  if (grants.empty()) return;
  // Counted before they leave the queue (see admit()).
  in_prefill += static_cast<int>(grants.size());
  {
    std::lock_guard lk(shared->mu);
    shared->stats.running += static_cast<int>(grants.size());
  }
  std::vector<std::unique_ptr<Sequence>> granted;
  for (AdmissionGrant& g : grants) {
    auto r = front->take(g.id);
    if (!r) {  // cannot happen: registered before enqueue
      --in_prefill;
      continue;
    }
    auto sequences = make_sequences(std::move(r), std::move(g.lease), now, /*fork=*/false);
    in_prefill += static_cast<int>(sequences.size()) - 1;  // the choices of an n > 1 request
    for (auto& s : sequences) granted.push_back(std::move(s));
  }
  for (std::unique_ptr<Sequence>& s : granted) {
    in_prefill_cost += s->req->cost;
    std::optional<Error> e = open_sequence(*s);
    in_prefill_kv_bytes += s->kv_bytes;
    if (!e) {
      work.push_back(std::move(s));
    } else if (e->code == ErrorCode::kCancelled) {
      fail(*s, std::move(*e));
      back.push_back(PrefillBatch{});
      back.back().sequences.push_back(std::move(s));
    } else {
      // The engine thread recovers (out of memory) or fails it.
      back.push_back(PrefillBatch{});
      back.back().sequences.push_back(std::move(s));
      back.back().error = std::move(*e);
      back.back().cache_failed = true;
    }
  }
}

void Engine::Impl::prefill_step(std::vector<std::unique_ptr<Sequence>>& work, std::vector<PrefillBatch>& back) {
  // Cancelled sequences, and those past their deadline, go back before
  // each chunk: the engine thread answers them.
  PrefillBatch returned;
  const TimePoint now = Clock::now();
  for (auto& s : work) {
    const std::optional<TimePoint>& deadline = s->req->gen.deadline;
    if (s->req->is_cancelled() || (deadline && now >= *deadline)) returned.sequences.push_back(std::move(s));
  }
  std::erase(work, nullptr);
  if (!returned.sequences.empty()) back.push_back(std::move(returned));
  if (work.empty()) return;

  std::vector<StepInput> inputs;
  int budget = options.max_batch_tokens;
  for (auto& s : work) {
    if (budget <= 0) break;
    inputs.push_back(s->next_chunk(budget));
    budget -= static_cast<int>(inputs.back().tokens.size());
  }
  begin_step();
  auto logits = model.step(inputs);
  {
    std::lock_guard lk(shared->mu);
    ++shared->stats.steps;
  }
  if (!logits.ok()) {
    // Everything the worker holds goes back with the error: the engine
    // thread's recovery then sees every lease of the device.
    back.push_back(PrefillBatch{std::move(work), logits.error()});
    work.clear();
    return;
  }
  const TimePoint stepped = Clock::now();
  PrefillBatch done;
  done.step_ok = true;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    Sequence& s = *work[i];
    if (!on_chunk(s, inputs[i], logits.value()[i], stepped)) continue;  // more chunks to go
    done.sequences.push_back(std::move(work[i]));
  }
  std::erase(work, nullptr);
  if (!done.sequences.empty()) back.push_back(std::move(done));
}

void Engine::Impl::hand_off_prefills() {
  std::vector<std::unique_ptr<Sequence>> handed;
  for (auto& s : running) {
    if (s->done || !s->prefilling()) continue;
    ++in_prefill;
    in_prefill_kv_bytes += s->kv_bytes;
    in_prefill_cost += s->req->cost;
    handed.push_back(std::move(s));
  }
  if (handed.empty()) return;
  std::erase(running, nullptr);
  {
    std::lock_guard lk(prefill->signal->mu);
    for (auto& s : handed) prefill->inbox.push_back(std::move(s));
  }
  prefill->signal->cv.notify_all();
}

void Engine::Impl::collect_prefills(TimePoint now) {
  std::vector<PrefillBatch> batches;
  {
    std::lock_guard lk(prefill->signal->mu);
    batches.swap(prefill->outbox);
  }
  for (PrefillBatch& b : batches) {
    std::vector<Sequence*> returned;
    for (auto& s : b.sequences) {
      --in_prefill;
      in_prefill_kv_bytes -= s->kv_bytes;
      in_prefill_cost -= s->req->cost;
      returned.push_back(s.get());
      running.push_back(std::move(s));
    }
    if (!b.error) {
      if (b.step_ok) on_step_ok();
      continue;
    }
    if (b.cache_failed) {
      not_opened(now, *returned.front(), *b.error);
    } else {
      on_failed_step(now, *b.error, returned, "a prefill step");
    }
  }
}

void Engine::Impl::stop_prefill_worker() {
  if (!prefill || !prefill->thread.joinable()) return;
  {
    std::lock_guard lk(prefill->signal->mu);
    prefill->signal->stopping = true;
  }
  prefill->signal->cv.notify_all();
  prefill->thread.join();
  std::vector<PrefillBatch> batches;
  {
    std::lock_guard lk(prefill->signal->mu);
    batches.swap(prefill->outbox);
    if (!prefill->inbox.empty()) batches.push_back(PrefillBatch{std::move(prefill->inbox), std::nullopt});
    prefill->inbox.clear();
  }
  for (PrefillBatch& b : batches) {
    for (auto& s : b.sequences) running.push_back(std::move(s));
  }
  in_prefill = 0;
  in_prefill_kv_bytes = 0;
  in_prefill_cost = 0;
}

}  // namespace vg
