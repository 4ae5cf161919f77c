// Shared by the engine tests: an EventSink that records a request's events
// and lets the test wait on them, and a fixture with a FakeModel on a virtual
// device.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <condition_variable>
#include <chrono>
#include <mutex>
#include <thread>

#include "device/device.hpp"
#include "fake_device.hpp"
#include "engine/engine.hpp"
#include "fake_model.hpp"

namespace vg::testing {

/// Polls `done` until it holds or `limit` passes: for state another thread
/// publishes without a notification (the engine thread, at each turn).
template <class F>
bool eventually(F done, std::chrono::seconds limit = std::chrono::seconds(20)) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::yield();
  }
  return true;
}

// Collects a request's events; lets the test wait for the terminal one.
class Collector final : public EventSink {
 public:
  void push(EngineEvent e) override {
    std::lock_guard lk(mu_);
    if (is_terminal(e)) ++terminals_;
    events_.push_back(std::move(e));
    cv_.notify_all();
  }
  bool wait_done() {
    std::unique_lock lk(mu_);
    return cv_.wait_for(lk, std::chrono::seconds(20), [&] { return terminals_ > 0; });
  }
  bool wait_started() {
    std::unique_lock lk(mu_);
    return cv_.wait_for(lk, std::chrono::seconds(20), [&] {
      for (auto& e : events_) {
        if (std::holds_alternative<StartedEvent>(e)) return true;
      }
      return terminals_ > 0;
    });
  }
  /// Waits for the first TextEvent (or the end).
  bool wait_first_token() {
    std::unique_lock lk(mu_);
    return cv_.wait_for(lk, std::chrono::seconds(20), [&] {
      return terminals_ > 0 || std::any_of(events_.begin(), events_.end(), [](const EngineEvent& e) {
               return std::holds_alternative<TextEvent>(e);
             });
    });
  }
  std::string text() {
    std::lock_guard lk(mu_);
    std::string t;
    for (auto& e : events_) {
      if (auto* te = std::get_if<TextEvent>(&e)) t += te->text;
    }
    return t;
  }
  std::vector<EngineEvent> events() {
    std::lock_guard lk(mu_);
    return events_;
  }
  /// Waits until the engine reported the request waiting in its queue.
  bool wait_queued() {
    std::unique_lock lk(mu_);
    return cv_.wait_for(lk, std::chrono::seconds(20), [&] {
      return std::any_of(events_.begin(), events_.end(),
                         [](const EngineEvent& e) { return std::holds_alternative<QueuedEvent>(e); });
    });
  }
  bool started() {
    std::lock_guard lk(mu_);
    return std::any_of(events_.begin(), events_.end(),
                       [](const EngineEvent& e) { return std::holds_alternative<StartedEvent>(e); });
  }
  int terminals() {
    std::lock_guard lk(mu_);
    return terminals_;
  }
  std::optional<FinishedEvent> finished() {
    std::lock_guard lk(mu_);
    if (events_.empty()) return std::nullopt;
    if (auto* f = std::get_if<FinishedEvent>(&events_.back())) return *f;
    return std::nullopt;
  }
  std::optional<Error> failed() {
    std::lock_guard lk(mu_);
    if (events_.empty()) return std::nullopt;
    if (auto* f = std::get_if<FailedEvent>(&events_.back())) return f->error;
    return std::nullopt;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<EngineEvent> events_;
  int terminals_ = 0;
};

class EngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    device_ = std::make_unique<FakeDevice>();
  }
  // Defaults: fixed:max_batch admission, 100 bytes of cost per token.
  static Engine::Options options(int max_batch = 8, int max_queue = 64) {
    Engine::Options o;
    o.max_batch = max_batch;
    o.admission.policy = AdmissionPolicy{AdmissionPolicy::Kind::kFixed, max_batch};
    o.admission.budget_bytes = 1 << 30;
    o.admission.max_queue = max_queue;
    o.profile.kv_bytes_per_token = 100;
    o.profile.safety_factor = 1.0;
    return o;
  }
  /// The naive baseline (--admission none): everything admitted, no recovery.
  static Engine::Options naive_options() {
    Engine::Options o = options();
    o.admission.policy = AdmissionPolicy{AdmissionPolicy::Kind::kNone, 0};
    return o;
  }
  std::unique_ptr<Engine> make(Engine::Options o = options()) {
    auto e = Engine::create(o, model_, *device_);
    EXPECT_TRUE(e.ok());
    return std::move(e).value();
  }
  static GenerationRequest req(int max_tokens, std::string prompt = "a") {
    GenerationRequest r;
    r.id = "t";
    for (char c : prompt) r.prompt.push_back(static_cast<unsigned char>(c));
    r.max_tokens = max_tokens;
    r.sampling.temperature = 0;
    return r;
  }

  /// Submits `r` to `engine` and waits for its terminal event.
  static std::shared_ptr<Collector> run_to_end(Engine& engine, const GenerationRequest& r) {
    auto sink = std::make_shared<Collector>();
    EXPECT_TRUE(engine.submit(r, sink).ok());
    EXPECT_TRUE(sink->wait_done());
    return sink;
  }

  FakeModel model_;
  std::unique_ptr<FakeDevice> device_;
};

}  // namespace vg::testing
