// RemoteService's engines (see remote_service.hpp): the monitor thread that
// supervises them (engine_process.hpp: spawn, reap, backoff, heartbeats),
// connecting to one and saying hello (engine_link.hpp), and what a closed
// connection leaves behind. The requests of a closed engine are
// remote_requests.cpp's (requeue_after_close).
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>

#include "gateway/gateway_counting.hpp"
#include "gateway/remote_service.hpp"
#include "gateway/remote_slot.hpp"
#include "wire/channel.hpp"

namespace vg::gateway {

bool socket_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

// -- the monitor thread

void RemoteService::monitor_loop() {
  MutexUniqueLock lk(mu_);
  while (!stopping_) {
    const TimePoint now = Clock::now();
    lk.unlock();
    reap_children(now);
    lk.lock();
    for (auto& s : slots_) supervise(*s, now);
    Outbox ends;
    resubmit_pending(now, ends);
    if (!ends.empty()) {
      lk.unlock();
      ends.deliver();
      lk.lock();
    }
    rebalance();
    monitor_cv_.wait_for(lk, std::chrono::milliseconds(20));
  }
}

void RemoteService::reap_children(TimePoint now) {
  for (const auto& [pid, status] : reap_exited()) {
    MutexLock lock(mu_);
    for (auto& s : slots_) {
      if (s->process.pid != pid) continue;
      s->process.ended(status);
      if (!stopping_) process_ended(*s, pid, status, now);
      break;
    }
  }
}

void RemoteService::process_ended(Slot& s, pid_t pid, int status, TimePoint now) {
  if (s.process.start_failed(status, s.connected)) {
    // Restarting cannot help. One engine of several is left out (its
    // devices shown unhealthy, with the reason it wrote); when none is
    // left, the server cannot serve.
    const std::string why = take_start_failure(s.ep.socket_path);
    s.process.failed = fmt::format("could not start ({}){}", s.process.last_exit, why.empty() ? "" : ": " + why);
    set_state(s, EngineState::kGone);
    const bool others =
        std::any_of(slots_.begin(), slots_.end(), [](const auto& o) { return o->process.failed.empty(); });
    if (!others) {
      std::string all;
      for (auto& o : slots_) {
        all += fmt::format("{}the engine on {} {}", all.empty() ? "" : "; ", o->label(), o->process.failed);
      }
      fatal_ = all + "; its log lines above say why";
      const bool settings = std::all_of(slots_.begin(), slots_.end(), [](const auto& o) {
        return o->process.last_exit == "exit 2";  // exit_text() of an exit with status 2
      });
      fatal_exit_status_ = settings ? 2 : 1;
    } else {
      spdlog::error("engine on {} (pid {}) {}: its devices are left out; the other engines serve", s.label(), pid,
                    s.process.failed);
    }
    return;
  }
  const double delay = s.process.schedule_restart(now, s.connected, backoff());
  spdlog::error("engine on {} (pid {}) ended: {}; restart {} in {:.1f} s", s.label(), pid, s.process.last_exit,
                s.process.restarts, delay);
  set_state(s, EngineState::kRestarting);
  if (s.link) s.link->close("engine process ended: " + s.process.last_exit);
}

void RemoteService::supervise(Slot& s, TimePoint now) {
  if (!s.process.failed.empty()) return;  // left out for good
  if (s.link) {
    if (now - s.last_heard > from_seconds(options_.heartbeat_timeout_s)) {
      s.process.last_exit = fmt::format("no heartbeat for {:.1f} s", to_seconds(now - s.last_heard));
      spdlog::error("engine on {} (pid {}): {}; killing it", s.label(), s.process.pid, s.process.last_exit);
      s.process.kill_hung(s.supervised());
      s.link->close(s.process.last_exit);  // on_close moves its requests
    }
    return;
  }
  if (s.connecting) return;
  // Not connected: at the first start, an engine already running on the
  // socket (this gateway's predecessor's) is re-attached if its settings
  // match; then start a supervised engine that has no process, else try the
  // socket (a started engine creates it once its model is loaded).
  if (!s.process.tried_attach) {
    s.process.tried_attach = true;
    if (s.supervised() && socket_exists(s.ep.socket_path)) {
      (void)connect_off_lock(s);
      if (s.link) return;
    }
  }
  if (s.supervised() && !s.process.has_process()) {
    start_engine(s, now);
    return;
  }
  if (now < s.next_connect || !socket_exists(s.ep.socket_path)) return;
  if (!connect_off_lock(s)) s.next_connect = Clock::now() + std::chrono::seconds(1);
}

void RemoteService::start_engine(Slot& s, TimePoint now) {
  if (now < s.process.next_start || fatal_) return;
  if (socket_exists(s.ep.socket_path)) {
    if (auto fd = wire::connect_unix(s.ep.socket_path); fd.ok()) {
      ::close(*fd);
      // An engine accepts there: another gateway's restart of the same
      // engine (same settings: attach to it), or one being replaced that
      // is stopping (other settings: wait for it to go).
      s.process.next_start = now + std::chrono::milliseconds(200);
      if (now >= s.next_connect) {
        if (!connect_off_lock(s)) s.next_connect = Clock::now() + std::chrono::seconds(1);
        if (s.link) return;
      }
      if (s.connect_error.empty()) {
        s.connect_error = "waiting for the engine that holds unix:" + s.ep.socket_path + " to exit";
      }
      return;
    }
  }
  if (Status st = s.process.spawn(s.ep.command, s.ep.socket_path, now, backoff()); !st.ok()) {
    spdlog::error("engine on {}: cannot start {}: {}", s.label(), s.ep.command.front(), st.error().message);
    return;
  }
  s.status = {};
  spdlog::info("engine on {}: started pid {}", s.label(), s.process.pid);
  set_state(s, s.process.restarts > 0 ? EngineState::kRestarting : EngineState::kStarting);
}

bool RemoteService::connect_off_lock(Slot& s) {
  // mu_ held on entry and on return; connecting reads a hello (a short
  // wait), so it runs off the lock, and `connecting` keeps others away.
  s.connecting = true;
  mu_.unlock();
  const bool ok = try_connect(s);
  mu_.lock();
  s.connecting = false;
  return ok;
}

bool RemoteService::try_connect(Slot& s) {
  auto fd = wire::connect_unix(s.ep.socket_path);
  if (!fd.ok()) return true;
  auto fail = [&](const std::string& why) {
    ::close(*fd);
    spdlog::warn("engine at unix:{}: {}; trying again in 1 s", s.ep.socket_path, why);
    MutexLock lock(mu_);
    s.connect_error = why;
    return false;
  };
  HelloReply reply = say_hello(*fd, s.ep.secret_path);
  if (reply.gone) {
    ::close(*fd);
    return true;
  }
  if (!reply.refused.empty()) return fail(reply.refused);
  if (!reply.invalid.empty()) return fail(reply.invalid);
  const wire::EngineHello& hello = reply.hello;
  std::string refusal;         // another serve uses it with other settings
  bool replace_other = false;  // other settings and no other gateway: stop it, start ours
  {
    MutexLock lock(mu_);
    if (stopping_) {
      ::close(*fd);
      return true;
    }
    if (s.supervised() && !s.ep.config_digest.empty() && hello.config_digest != s.ep.config_digest) {
      if (hello.gateways > 0) {
        // Another serve uses it: never stopped from here. At this serve's
        // start that ends the start (two serves with other settings may not
        // share a device); later, this one waits for the device to be free.
        refusal = fmt::format(
            "the engine on these devices (pid {}) runs other settings for {} other gateway(s); not stopping it: "
            "stop that serve, or give this one other --device or --runtime-dir",
            hello.pid, hello.gateways);
        if (s.connected == TimePoint{} && s.process.restarts == 0 && !fatal_) fatal_ = refusal;
      } else {
        replace_other = true;
      }
    }
  }
  if (replace_other) {
    if (hello.pid > 0 && hello.pid != ::getpid()) ::kill(static_cast<pid_t>(hello.pid), SIGTERM);
    return fail(fmt::format("runs other settings (pid {}); stopping it and starting one with these", hello.pid));
  }
  if (!refusal.empty()) return fail(refusal);
  // Its models' prompt encoders, before it serves here: its first requests
  // are encoded by this gateway too. Off the lock (`connecting` keeps the slot).
  encoders_.learn(hello.models);
  return attach(s, *fd, std::move(reply.hello));
}

bool RemoteService::attach(Slot& s, int fd, wire::EngineHello hello) {
  std::shared_ptr<EngineLink> link;
  std::uint64_t epoch = 0;
  {
    MutexLock lock(mu_);
    if (stopping_) {
      ::close(fd);
      return true;
    }
    link = EngineLink::adopt(fd);
    epoch = ++s.epoch;
    const TimePoint now = Clock::now();
    const bool attached = !s.process.has_process() || !s.supervised();
    if (attached) {
      s.process.pid = static_cast<pid_t>(hello.pid);
      s.process.child = false;
      s.process.started_at = unix_seconds_now();
    }
    if (s.process.spawned != TimePoint{} && !attached) s.process.startup_s = to_seconds(now - s.process.spawned);
    s.link = link;
    ++open_channels_;
    s.connect_error.clear();
    if (hello.started_at > 0) s.process.started_at = hello.started_at;
    // Its process as started or attached here (a start it does not say is
    // the time it connected: a new process).
    s.carry.begin(tracking::ProcessId{s.process.pid, s.process.started_at});
    s.models = std::move(hello.models);
    s.tensor_models = std::move(hello.tensor_models);
    s.devices = std::move(hello.devices);
    s.learn(std::move(hello.admission));
    s.last_heard = now;
    s.connected = now;
    s.status.ready = true;  // until its first heartbeat says otherwise
    s.mirror.reset();
    set_state(s, EngineState::kReady);
    const bool started_here = s.process.startup_s && !attached;
    spdlog::info("engine on {} (pid {}) {}: unix:{}{}", s.label(), s.process.pid,
                 attached && s.supervised() ? "re-attached" : "connected", s.ep.socket_path,
                 started_here ? fmt::format(", ready {:.2f} s after its start", *s.process.startup_s) : "");
  }
  Slot* sp = &s;
  link->start([this, sp, epoch](wire::Decoded<wire::ToGateway> m) { on_message(sp, epoch, std::move(m)); },
              [this, sp, epoch](const std::string& reason) { on_close(sp, epoch, reason); });
  notify_changed();
  return true;
}

void RemoteService::on_close(Slot* s, std::uint64_t epoch, const std::string& reason) {
  Outbox ends;
  int moved = 0, ended = 0;
  // The last thing this callback does is count its channel closed: until
  // then shutdown() waits, so the slot stays alive.
  struct Closed {
    RemoteService* svc;
    ~Closed() {
      MutexLock lock(svc->mu_);
      --svc->open_channels_;
      svc->cv_.notify_all();
    }
  } closed{this};
  std::string label;
  bool stopping_now = false;
  {
    MutexLock lock(mu_);
    if (s->epoch != epoch) return;
    label = s->label();
    stopping_now = stopping_;
    s->link.reset();
    // What this gateway counted since the process's last state is the
    // process's too: the next process counts on top of it (the same
    // process, connecting again, reports it in its next state).
    tracking::CounterTotals last;
    if (s->last_state) last = tracking::CounterTotals::of(*s->last_state);
    last.counters += s->unreported;
    s->carry.report(last);
    s->unreported = Counters{};
    // While it is away only its devices are shown.
    if (s->last_state) {
      AdmissionState shown;
      shown.policy = s->last_state->policy;
      shown.devices = std::move(s->last_state->devices);
      s->last_state = std::move(shown);
    }
    const bool restarts = (s->supervised() || !s->process.has_process()) && !stopping_;
    set_state(*s, restarts ? EngineState::kRestarting : EngineState::kGone);
    if (s->supervised() && !s->process.child && s->process.has_process() && !stopping_) {
      // A re-attached engine (not our child): make sure it is gone, then start ours.
      s->process.replace_attached(Clock::now());
      publish_engine_metrics(*s);
    }
    for (auto& [rid, r] : s->inflight) {
      if (r->track.ended()) continue;
      if (requeue_after_close(r, rid, ends)) ++moved;
      if (r->track.ended()) ++ended;
    }
    s->inflight.clear();
    notify_changed();
  }
  if (stopping_now) {
    spdlog::info("engine on {} disconnected ({})", label, reason.empty() ? "closed" : reason);
  } else {
    spdlog::warn("engine on {} disconnected ({}): {} requests to move, {} ended", label,
                 reason.empty() ? "closed" : reason, moved, ended);
  }
  ends.deliver();
}

}  // namespace vg::gateway
