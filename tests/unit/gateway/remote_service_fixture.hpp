// The fixture of the RemoteService tests (remote_service_test.cpp,
// remote_service_counting_test.cpp): real EngineServers over Unix sockets,
// each with a scripted fake Service behind it (FakeService), a Recorder of
// what a request's owner receives, and the gateway on top. Waits are on
// conditions with deadlines, never sleeps.
#pragma once

#include "gateway/remote_service.hpp"

#include <gtest/gtest.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>

#include "wire/engine_server.hpp"

namespace vg::gateway::remote_testing {

using namespace std::chrono_literals;

/// A Service whose submissions the test drives: it records each request and
/// sink; the test pushes the events.
class FakeService final : public Service {
 public:
  struct Sub {
    CompletionRequest request;
    std::shared_ptr<EventSink> sink;
    ResumeFrom resume{};
    std::shared_ptr<std::atomic<bool>> cancelled = std::make_shared<std::atomic<bool>>(false);
    std::shared_ptr<std::atomic<bool>> withdrawn = std::make_shared<std::atomic<bool>>(false);
  };
  class Handle final : public RequestHandle {
   public:
    Handle(std::string id, std::shared_ptr<std::atomic<bool>> c, std::shared_ptr<std::atomic<bool>> w,
           FakeService* owner)
        : id_(std::move(id)), c_(std::move(c)), w_(std::move(w)), owner_(owner) {}
    void cancel() override {
      c_->store(true);
      owner_->notify();
    }
    bool withdraw() override {
      ++owner_->withdraw_asked;
      owner_->notify();
      if (owner_->admitted.load() || c_->load()) return false;
      w_->store(true);
      owner_->notify();
      return true;
    }
    const std::string& id() const override { return id_; }

   private:
    std::string id_;
    std::shared_ptr<std::atomic<bool>> c_;
    std::shared_ptr<std::atomic<bool>> w_;
    FakeService* owner_;
  };

  std::optional<Error> refuse;  // set before submissions arrive
  /// The first refuse_first submissions are refused with first_refusal
  /// (counted in `refused`); set before submissions arrive.
  int refuse_first = 0;
  Error first_refusal{ErrorCode::kOverloaded, "queue full"};
  std::atomic<int> refused{0};
  /// Its one device's budget, and what is reserved besides its submissions
  /// (each reserves cost_bytes); 0 budget: no device in its state.
  std::int64_t budget_bytes = 0;
  std::int64_t reserved_bytes = 0;
  std::atomic<int> queue_depth{0};    // reported as waiting for admission
  int max_running = 0;                // its device's sequence slots (0: no limit reported)
  int running = 0;                    // of which taken
  std::atomic<bool> admitted{false};  // its requests are past admission: withdraw() refuses
  Counters counters;                  // reported besides its completions (set before it starts)
  DeviceCounters device_counters;     // its device's, reported when it has a budget (set before it starts)
  std::atomic<int> withdraw_asked{0};
  static constexpr std::int64_t kCost = 1000;
  bool finish_in_submit = false;  // the whole request ends before submit returns (a 1-token request)

  Result<Submission> submit(const CompletionRequest& request, std::shared_ptr<EventSink> sink) override {
    return submit_resumed(request, ResumeFrom{}, std::move(sink));
  }
  Result<Submission> submit_resumed(const CompletionRequest& request, const ResumeFrom& resume,
                                    std::shared_ptr<EventSink> sink) override {
    if (refuse) return *refuse;
    if (refused.load() < refuse_first) {
      ++refused;
      notify();
      return first_refusal;
    }
    Sub s{request, sink, resume};
    Submission out;
    out.handle = std::make_shared<Handle>(request.request_id, s.cancelled, s.withdrawn, this);
    out.model = "fake";
    out.prompt_tokens = 3;
    out.cost_bytes = kCost;
    if (finish_in_submit) {
      sink->push(StartedEvent{});
      sink->push(TextEvent{"x", 1, 0, {}, {120}});
      sink->push(FinishedEvent{"length", {3, 1}, {}, 0});
    }
    {
      std::lock_guard lk(mu_);
      subs_.push_back(s);
    }
    notify();
    return out;
  }
  std::vector<ModelInfo> models() const override {
    ModelInfo m;
    m.id = "fake";
    m.devices = {"virt:0"};
    if (!model_dir.empty()) {  // a byte-vocabulary GPT-2 (as tinylm): the byte tokenizer
      m.family = "gpt2";
      m.dir = model_dir;
      m.vocab_size = 257;
      m.eos_token_id = 256;
      m.context_length = 64;
    }
    return {m};
  }
  std::string model_dir;  // set: its hello names a language model folder (the gateway encodes its prompts)
  bool healthy(std::string*) const override { return true; }
  bool ready() const override { return true; }
  // The engine process's lifecycle is the EngineServer's here: nothing to drain.
  void begin_drain() override {}
  bool wait_idle(TimePoint) const override { return true; }
  void shutdown() override {}
  AdmissionState admission_state() const override {
    AdmissionState s;
    s.policy = "memory";
    std::lock_guard lk(mu_);
    s.counters = counters;
    s.counters[CounterId::kCompleted] += static_cast<std::int64_t>(subs_.size());
    s.queue_depth = s.queued = queue_depth.load();
    if (budget_bytes > 0) {
      DeviceState d;
      d.name = "virt:0";
      d.budget_bytes = d.effective_budget_bytes = budget_bytes;
      d.reserved_bytes = reserved_bytes + kCost * static_cast<std::int64_t>(subs_.size());
      d.max_running = max_running;
      d.running = running;
      d.counters = device_counters;
      s.devices.push_back(d);
    }
    return s;
  }

  std::size_t submissions() const {
    std::lock_guard lk(mu_);
    return subs_.size();
  }
  /// Waits for the n-th submission (1-based) and returns it.
  Sub wait_sub(std::size_t n) {
    std::unique_lock lk(mu_);
    EXPECT_TRUE(cv_.wait_for(lk, 10s, [&] { return subs_.size() >= n; })) << "no submission " << n;
    return subs_.size() >= n ? subs_[n - 1] : Sub{};
  }
  bool wait_refused(int n) {
    std::unique_lock lk(mu_);
    return cv_.wait_for(lk, 10s, [&] { return refused.load() >= n; });
  }
  bool wait_withdraw_asked() {
    std::unique_lock lk(mu_);
    return cv_.wait_for(lk, 10s, [&] { return withdraw_asked.load() > 0; });
  }
  bool wait_withdrawn(const Sub& s) {
    std::unique_lock lk(mu_);
    return cv_.wait_for(lk, 10s, [&] { return s.withdrawn->load(); });
  }
  bool wait_cancelled(const Sub& s) {
    std::unique_lock lk(mu_);
    return cv_.wait_for(lk, 10s, [&] { return s.cancelled->load(); });
  }
  void notify() {
    std::lock_guard lk(mu_);
    cv_.notify_all();
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Sub> subs_;
};

/// Records the events a request's owner receives.
class Recorder final : public EventSink {
 public:
  void push(EngineEvent e) override {
    std::lock_guard lk(mu_);
    events.push_back(std::move(e));
    cv_.notify_all();
  }
  bool wait_terminal() {
    std::unique_lock lk(mu_);
    return cv_.wait_for(lk, 20s, [&] { return !events.empty() && is_terminal(events.back()); });
  }
  bool wait_count(std::size_t n) {
    std::unique_lock lk(mu_);
    return cv_.wait_for(lk, 20s, [&] { return events.size() >= n; });
  }
  std::size_t count() {
    std::lock_guard lk(mu_);
    return events.size();
  }
  std::string text() {
    std::lock_guard lk(mu_);
    std::string t;
    for (auto& e : events) {
      if (auto* x = std::get_if<TextEvent>(&e)) t += x->text;
    }
    return t;
  }
  int count_started() {
    std::lock_guard lk(mu_);
    return static_cast<int>(std::count_if(
        events.begin(), events.end(), [](const EngineEvent& e) { return std::holds_alternative<StartedEvent>(e); }));
  }
  std::vector<EngineEvent> events;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
};

class RemoteServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // spdlog's registry starts on first use; make that this thread, before
    // the threads under test log (its lock lives in the uninstrumented library).
    spdlog::default_logger()->set_level(spdlog::level::info);
    dir_ = std::filesystem::temp_directory_path() / ("vg-remote-" + std::to_string(::getpid()) + "-" +
                                                     ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
    ::chmod(dir_.c_str(), 0700);
    socket_ = (dir_ / "e.sock").string();
  }
  void TearDown() override {
    gateway_.reset();
    engine_.reset();
    more_engines_.clear();
    std::filesystem::remove_all(dir_);
  }
  void start_engine(FakeService& service, const std::string& secret = "s3cret") {
    { std::ofstream(socket_ + ".secret") << "s3cret"; }
    wire::EngineServer::Options o;
    o.socket_path = socket_;
    o.secret = secret;
    o.devices = {"virt:0"};
    auto s = wire::EngineServer::start(o, service);
    ASSERT_TRUE(s.ok()) << s.error().message;
    engine_ = std::move(s).value();
  }
  void start_gateway(int max_crash_retries = 2) {
    RemoteService::Options o;
    EngineEndpoint ep;
    ep.socket_path = socket_;
    o.engines.push_back(ep);
    o.max_crash_retries = max_crash_retries;
    o.heartbeat_timeout_s = 30;
    auto g = RemoteService::create(o);
    ASSERT_TRUE(g.ok());
    gateway_ = std::move(g).value();
    gateway_->start();
  }
  CompletionRequest request(const std::string& id) {
    CompletionRequest r;
    r.request_id = id;
    r.prompt = std::string("hello");
    r.max_tokens = 8;
    return r;
  }

  /// Engines on sockets 0..n-1 behind `services`, and a gateway on all of
  /// them in that order (the order of --device).
  void start_engines_and_gateway(const std::vector<FakeService*>& services) {
    RemoteService::Options g;
    g.heartbeat_timeout_s = 30;
    for (std::size_t i = 0; i < services.size(); ++i) {
      EngineEndpoint ep;
      ep.socket_path = start_numbered_engine(i, *services[i]);
      if (ep.socket_path.empty()) return;
      g.engines.push_back(ep);
    }
    auto gw = RemoteService::create(g);
    ASSERT_TRUE(gw.ok());
    gateway_ = std::move(gw).value();
    gateway_->start();
    ASSERT_TRUE(gateway_->wait_ready(Clock::now() + 10s));
    (void)gateway_->admission_state();  // every engine's state known, as after its first heartbeat
  }

  /// Engine i (socket e<i>.sock, device virt:<i>) behind `service`, kept in
  /// more_engines_; again on the same socket after it stopped, as a
  /// restarted engine. Its socket path; empty (and a test failure) when it
  /// could not start.
  std::string start_numbered_engine(std::size_t i, FakeService& service) {
    const std::string path = (dir_ / ("e" + std::to_string(i) + ".sock")).string();
    std::ofstream(path + ".secret") << "s3cret";
    wire::EngineServer::Options o;
    o.socket_path = path;
    o.secret = "s3cret";
    o.devices = {"virt:" + std::to_string(i)};
    // No heartbeats: the tests say when the gateway learns an engine's
    // state (admission_state()), so a status never lands between their steps.
    o.heartbeat = std::chrono::hours(1);
    auto s = wire::EngineServer::start(o, service);
    EXPECT_TRUE(s.ok()) << s.error().message;
    if (!s.ok()) return {};
    more_engines_.push_back(std::move(s).value());
    return path;
  }

  /// Submits request r1 through the gateway and lets the fake engine run it
  /// to its end (started, one token, finished); returns what its client got.
  std::shared_ptr<Recorder> run_one_to_the_end(FakeService& fake) {
    auto rec = std::make_shared<Recorder>();
    EXPECT_TRUE(gateway_->submit(request("r1"), rec).ok());
    auto s1 = fake.wait_sub(1);
    if (!s1.sink) return rec;
    s1.sink->push(StartedEvent{});
    s1.sink->push(TextEvent{"a", 1, 0, {}, {5}});
    s1.sink->push(FinishedEvent{"length", {3, 1}, {}, 0});
    EXPECT_TRUE(rec->wait_terminal());
    return rec;
  }

  /// A fake engine's service; it outlives the EngineServer serving it.
  FakeService& new_fake() { return *fakes_.emplace_back(std::make_unique<FakeService>()); }

  std::vector<std::unique_ptr<FakeService>> fakes_;
  std::filesystem::path dir_;
  std::string socket_;
  std::unique_ptr<wire::EngineServer> engine_;
  std::vector<std::unique_ptr<wire::EngineServer>> more_engines_;
  std::unique_ptr<RemoteService> gateway_;
};

}  // namespace vg::gateway::remote_testing
