// The step profile (--profile-steps) on tinylm and a virtual device, with the
// profiler of this libtorch (Kineto where it has it, else host ops): the
// trace is valid Chrome-trace JSON with exactly the requested number of
// vg::decode_step ranges, each holding ops, and the recorded steps are the
// first decode steps (no prefill chunk) of at least --profile-min-batch
// sequences. Off, nothing is recorded or written.
#include <gtest/gtest.h>

#include <boost/json.hpp>

#include <algorithm>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <utility>

#include <unistd.h>

#include "device/device.hpp"
#include "engine/engine.hpp"
#include "model/model.hpp"
#include "model/step_profiler.hpp"
#include "model/torch_step_profiler.hpp"

namespace vg {
namespace {

using namespace std::chrono_literals;
namespace json = boost::json;

const char* kTinyLmDir = VG_SOURCE_DIR "/models/tinylm";

/// One model step as the engine ran it.
struct LoggedStep {
  int decoding = 0;       ///< inputs that continue a cached sequence by one token
  int chunks = 0;         ///< prefill chunks (inputs starting at an empty cache)
  bool recorded = false;  ///< the profiler opened a step range just before it
};

/// Forwards to a real model and logs each step (engine thread; read once the
/// engine has stopped).
class LoggingModel final : public Model {
 public:
  explicit LoggingModel(Model& inner) : inner_(inner) {}
  const ModelConfig& config() const override { return inner_.config(); }
  std::int64_t parameter_count() const override { return inner_.parameter_count(); }
  const Tokenizer& tokenizer() const override { return inner_.tokenizer(); }
  Result<std::unique_ptr<KvCache>> new_cache(int capacity) override { return inner_.new_cache(capacity); }
  Status copy_cache(const KvCache& from, KvCache& to) override { return inner_.copy_cache(from, to); }
  Result<std::vector<float>> forward_full(std::span<const std::int32_t> t) override { return inner_.forward_full(t); }
  Result<std::vector<std::vector<float>>> step(std::span<const StepInput> inputs) override {
    LoggedStep s;
    for (const StepInput& in : inputs) (in.cache->length() > 0 ? s.decoding : s.chunks) += 1;
    s.recorded = std::exchange(range_open_, false);
    steps.push_back(s);
    return inner_.step(inputs);
  }
  void range_opened() { range_open_ = true; }

  std::vector<LoggedStep> steps;

 private:
  Model& inner_;
  bool range_open_ = false;
};

/// Forwards to a real profiler and tells the model when a step range opens.
class WatchedProfiler final : public StepProfiler {
 public:
  WatchedProfiler(std::unique_ptr<StepProfiler> inner, LoggingModel& model) : inner_(std::move(inner)), model_(model) {}
  Status begin_session() override {
    ++sessions;
    return inner_->begin_session();
  }
  void begin_step() override {
    inner_->begin_step();
    model_.range_opened();
  }
  void end_step() override { inner_->end_step(); }
  Result<std::int64_t> end_and_write(const std::filesystem::path& path) override {
    ++writes;
    return inner_->end_and_write(path);
  }
  int sessions = 0;  // engine thread; read once the engine has stopped
  int writes = 0;

 private:
  std::unique_ptr<StepProfiler> inner_;
  LoggingModel& model_;
};

/// Counts a request's generated tokens; lets the test wait on them.
class TokenSink final : public EventSink {
 public:
  void push(EngineEvent e) override {
    std::lock_guard lk(mu_);
    if (auto* t = std::get_if<TextEvent>(&e)) tokens_ += t->tokens;
    if (is_terminal(e)) done_ = true;
    cv_.notify_all();
  }
  bool wait_tokens(int n) {
    std::unique_lock lk(mu_);
    return cv_.wait_for(lk, 60s, [&] { return tokens_ >= n || done_; }) && tokens_ >= n;
  }
  bool wait_done() {
    std::unique_lock lk(mu_);
    return cv_.wait_for(lk, 60s, [&] { return done_; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int tokens_ = 0;
  bool done_ = false;
};

class StepProfileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto dev = VirtualDevice::create(7, 256LL << 20);
    ASSERT_TRUE(dev.ok());
    device_ = std::move(dev).value();
    DeviceScope scope(device_.get());
    auto model = Model::load(Model::Options{kTinyLmDir, device_.get()});
    ASSERT_TRUE(model.ok()) << model.error().message;
    model_ = std::move(model).value();
    logging_ = std::make_unique<LoggingModel>(*model_);
    trace_ = std::filesystem::temp_directory_path() /
             ("vg-step-profile-" + std::to_string(::getpid()) + "-" +
              ::testing::UnitTest::GetInstance()->current_test_info()->name() + ".json");
    std::filesystem::remove(trace_);
  }
  void TearDown() override { std::filesystem::remove(trace_); }

  Engine::Options options(int steps, int min_batch) {
    Engine::Options o;
    o.max_batch = 4;
    o.admission.policy = AdmissionPolicy{AdmissionPolicy::Kind::kFixed, 4};
    o.admission.budget_bytes = 1 << 30;
    o.profile.kv_bytes_per_token = 1;
    o.step_profile.steps = steps;
    o.step_profile.min_batch = min_batch;
    o.step_profile.trace = trace_;
    auto watched = std::make_shared<WatchedProfiler>(
        make_torch_step_profiler(available_trace_source(), DeviceKind::kVirtual), *logging_);
    profiler_ = watched.get();
    o.step_profile.profiler = std::move(watched);
    return o;
  }
  static GenerationRequest request(const std::string& id, int max_tokens) {
    GenerationRequest r;
    r.id = id;
    r.prompt = {10, 11, 12, 13};
    r.max_tokens = max_tokens;
    r.ignore_eos = true;
    r.sampling.temperature = 0;
    return r;
  }
  /// Runs one request alone for a few decode steps, then two more beside it,
  /// each to the end; stops the engine (its thread is joined).
  void run_requests(Engine& engine) {
    auto first = std::make_shared<TokenSink>();
    ASSERT_TRUE(engine.submit(request("a", 24), first).ok());
    ASSERT_TRUE(first->wait_tokens(4));  // three decode steps of batch 1 at least
    std::vector<std::shared_ptr<TokenSink>> sinks{first};
    for (const char* id : {"b", "c"}) {
      sinks.push_back(std::make_shared<TokenSink>());
      ASSERT_TRUE(engine.submit(request(id, 12), sinks.back()).ok());
    }
    for (auto& s : sinks) ASSERT_TRUE(s->wait_done());
    engine.shutdown();
  }

  std::unique_ptr<VirtualDevice> device_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<LoggingModel> logging_;
  std::filesystem::path trace_;
  WatchedProfiler* profiler_ = nullptr;
};

json::value read_json(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return json::parse(text.str());  // throws on invalid JSON
}

double number(const json::value& v) { return v.to_number<double>(); }

TEST_F(StepProfileTest, RecordsTheFirstDecodeStepsOfTheBatch) {
  auto engine = Engine::create(options(3, 2), *logging_, *device_);
  ASSERT_TRUE(engine.ok()) << engine.error().message;
  run_requests(**engine);

  // The engine recorded the first three decode steps of 2+ sequences, after
  // some of batch 1 and the steps that prefilled the others.
  EXPECT_EQ(profiler_->sessions, 1);
  EXPECT_EQ(profiler_->writes, 1);
  int qualifying = 0, recorded = 0, alone_before = 0;
  for (const LoggedStep& s : logging_->steps) {
    const bool qualifies = s.chunks == 0 && s.decoding >= 2;
    if (qualifying == 0 && s.chunks == 0 && s.decoding == 1) ++alone_before;
    EXPECT_EQ(s.recorded, qualifies && qualifying < 3) << "decoding " << s.decoding << ", chunks " << s.chunks;
    qualifying += qualifies ? 1 : 0;
    recorded += s.recorded ? 1 : 0;
  }
  EXPECT_GE(alone_before, 3);
  EXPECT_GT(qualifying, 3);
  EXPECT_EQ(recorded, 3);

  ASSERT_TRUE(std::filesystem::exists(trace_));
  const json::value trace = read_json(trace_);
  const json::array& events = trace.at("traceEvents").as_array();
  std::vector<const json::object*> ranges, ops;
  for (const json::value& v : events) {
    const json::object& e = v.as_object();
    if (!e.contains("ph") || e.at("ph") != "X" || !e.contains("ts") || !e.contains("dur")) continue;
    (e.at("name") == kDecodeStepRange ? ranges : ops).push_back(&e);
  }
  ASSERT_EQ(ranges.size(), 3u);
  for (const json::object* r : ranges) {
    EXPECT_EQ(r->at("cat"), "user_annotation");
    const double begin = number(r->at("ts")), end = begin + number(r->at("dur"));
    const auto inside = [&](const json::object* op) {
      const double ts = number(op->at("ts"));
      return ts >= begin && ts + number(op->at("dur")) <= end + 1e-3;
    };
    EXPECT_TRUE(std::any_of(ops.begin(), ops.end(), inside)) << "no op inside the step range at " << begin;
  }
}

TEST_F(StepProfileTest, OffRecordsAndWritesNothing) {
  auto engine = Engine::create(options(0, 2), *logging_, *device_);
  ASSERT_TRUE(engine.ok()) << engine.error().message;
  run_requests(**engine);
  EXPECT_EQ(profiler_->sessions, 0);
  EXPECT_EQ(profiler_->writes, 0);
  for (const LoggedStep& s : logging_->steps) EXPECT_FALSE(s.recorded);
  EXPECT_FALSE(std::filesystem::exists(trace_));
}

TEST(ChromeTrace, WritesEscapedNamesAsValidJson) {
  const std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("vg-chrome-trace-" + std::to_string(::getpid()) + ".json");
  const std::vector<TraceEvent> events{{"aten::mm", "cpu_op", 1.5, 2.25, 3},
                                       {"a \"quoted\"\\name\n", "user_annotation", 0, 10, 3}};
  ASSERT_TRUE(write_chrome_trace(path, events).ok());
  const json::value trace = read_json(path);
  const json::array& out = trace.at("traceEvents").as_array();
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].at("name"), "aten::mm");
  EXPECT_EQ(out[0].at("ph"), "X");
  EXPECT_DOUBLE_EQ(number(out[0].at("ts")), 1.5);
  EXPECT_DOUBLE_EQ(number(out[0].at("dur")), 2.25);
  EXPECT_EQ(out[1].at("name"), "a \"quoted\"\\name\n");
  EXPECT_EQ(out[1].at("cat"), "user_annotation");
  std::filesystem::remove(path);

  const Status bad = write_chrome_trace("/nonexistent-folder/trace.json", events);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code, ErrorCode::kConfig);
}

}  // namespace
}  // namespace vg
