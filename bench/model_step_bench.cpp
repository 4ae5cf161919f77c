// Decode-step throughput of the GPT-2 forward pass at batch 1, 4, 16, 32 and
// 64 (tokens/s), each sequence at a different cache length, batched in one
// Model::step (BM_DecodeStep) and, for comparison, one step() call per
// sequence (BM_DecodeOneByOne); BM_MixedStep adds one 64-token prefill chunk
// to a batch of decodes; BM_SampledDecodeStep runs Model::decode_step with
// greedy picks instead (the engine's decode steps: static shapes on the
// tensor path with a pool, picks made on the device, only the ids copied
// back). BM_DecodeStep and BM_SampledDecodeStep also report the ATen ops a step
// dispatches, counted by a RecordFunction observer: `aten_ops` (every op,
// nested ones included), `aten_top_ops` (those the model calls itself) and
// `kernel_ops` (ops that call no other op and are neither views nor
// allocations: the ones that do arithmetic or copy data, as a device kernel
// would), and `parallel_regions`, the OpenMP parallel regions a step enters
// (each wakes the other compute threads; bench/support/parallel_regions.hpp
// counts those that GCC-compiled code, libtorch's and vg_model's, enters).
// The model is `--model=DIR` or, by default, a random checkpoint of the
// tinylm shape (3 layers, 128 wide, 4 heads, 256 positions, vocab 257)
// written by tools/make_random_gpt2.py. `--dtype=bfloat16|float64` switches
// the compute dtype, `--path=tensor` runs the step on the tensor path (the
// one CUDA runs: libtorch's ops only) instead of the host kernels,
// `--threads=N` the intra-op threads (default 1), `--op-names` prints the
// ops of each BM_DecodeStep run by name (per step, most frequent first) and
// the wall time per step in each top-level op (with the observer's own cost
// in it), to stderr; `--malloc-defaults` leaves glibc's malloc thresholds
// as they are (the server sets them: retain_freed_host_memory);
// `--kv-pool=TOKENS` takes every cache from one shared block pool of
// TOKENS-token blocks (Model::use_kv_pool; the tensor path then gathers a
// decode step's keys from the pool, and BM_SampledDecodeStep's steps are
// static-shape ones) instead of a pool of its own; the default is the
// server's, 16 on the tensor path (where the engine always has a pool but
// for several models on a device, --prefill-worker or --admission
// fixed|none) and none on the host path; `--kv-pool=0` gives every cache
// storage of its own (a decode step then gathers each sequence's keys
// apart, two ops per sequence and layer: its ops grow with the batch); other
// flags go to Google Benchmark.
//
// What the machine can do, in the same run and on the same threads:
// BM_StreamRead (a sum over 512 MiB: bytes read per second) and
// BM_StreamCopy (a 256 MiB copy, read + written bytes per second, as STREAM
// counts them), and BM_Matmul (a 1024 x 1024 x 1024 float32 product through
// libtorch's BLAS: FLOP/s). BM_DecodeStep reports against them `weights_Bps`
// (the model's parameter bytes times steps per second: a step must read every
// weight once, so weights / read bandwidth is its floor) and `flop_per_s`
// (2 x parameters that multiply x batch, plus 4 x n_layer x n_embd x keys per
// sequence for attention, per step).
//
// BM_EngineLoop runs the engine (admission, the step loop, sampling, event
// delivery) over the same model: `batch` greedy requests of 48 new tokens
// each, all admitted at once, and splits its wall time into the model's
// steps and the engine's host work around them: `host_us_per_step` and
// `host_us_per_token` (host work over steps, and over tokens generated).
#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <benchmark/benchmark.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <thread>
#include <variant>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string_view>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "device/device.hpp"
#include "engine/engine.hpp"
#include "model/model.hpp"
#include "model/runtime.hpp"
#include "model/sampler.hpp"
#include "parallel_regions.hpp"

namespace vg {
namespace {

std::unique_ptr<VirtualDevice> g_device;
std::unique_ptr<Model> g_model;

/// ATen ops dispatched since start-up, on any thread: all of them, and those
/// not nested inside another op.
std::atomic<std::int64_t> g_ops{0};
std::atomic<std::int64_t> g_top_ops{0};
std::atomic<std::int64_t> g_kernel_ops{0};
thread_local int t_depth = 0;
/// Per open op on this thread: whether another op started inside it.
thread_local std::vector<bool> t_has_child;

/// Ops that only make views or allocate (they compute nothing).
bool is_view_or_allocation(std::string_view name) {
  static const std::set<std::string_view> kNames = {
      "aten::as_strided", "aten::view",         "aten::_reshape_alias", "aten::reshape",     "aten::expand",
      "aten::permute",    "aten::transpose",    "aten::t",              "aten::unsqueeze",   "aten::squeeze",
      "aten::resolve_conj", "aten::resolve_neg", "aten::alias",         "aten::_unsafe_view", "aten::select",
      "aten::slice",      "aten::narrow",       "aten::split_with_sizes", "aten::split",     "aten::unbind",
      "aten::empty",      "aten::empty_strided", "aten::empty_like",    "aten::detach",      "aten::lift_fresh"};
  return kNames.count(name) > 0;
}
/// With --op-names: ops by name since the last reset (all, nested included).
bool g_count_names = false;
/// Whether a measured step is running (names and times are of its ops only,
/// not of the prefills that refill a batch).
std::atomic<bool> g_in_step{false};
std::mutex g_names_mutex;
std::map<std::string, std::int64_t> g_names;
/// With --op-names: wall time in top-level ops by name (nanoseconds), and
/// the start of each open op on this thread.
std::map<std::string, std::int64_t> g_top_ns;
thread_local std::vector<std::chrono::steady_clock::time_point> t_started;

std::unique_ptr<at::ObserverContext> on_op_start(const at::RecordFunction& fn) {
  g_ops.fetch_add(1, std::memory_order_relaxed);
  if (t_depth++ == 0) g_top_ops.fetch_add(1, std::memory_order_relaxed);
  if (!t_has_child.empty()) t_has_child.back() = true;
  t_has_child.push_back(false);
  if (g_count_names && g_in_step.load(std::memory_order_relaxed)) {
    const std::lock_guard lock(g_names_mutex);
    ++g_names[fn.name()];
    t_started.push_back(std::chrono::steady_clock::now());
  }
  return nullptr;
}

void print_op_names(int batch, std::int64_t steps) {
  std::vector<std::pair<std::int64_t, std::string>> by_count;
  {
    const std::lock_guard lock(g_names_mutex);
    for (const auto& [name, n] : g_names) by_count.emplace_back(n, name);
    g_names.clear();
  }
  std::sort(by_count.rbegin(), by_count.rend());
  const auto per_step = [&](std::int64_t n) { return static_cast<double>(n) / static_cast<double>(std::max<std::int64_t>(steps, 1)); };
  std::cerr << "ops per decode step at batch " << batch << ":";
  for (const auto& [n, name] : by_count) std::cerr << " " << name << "=" << per_step(n);
  std::cerr << "\n";
  std::vector<std::pair<std::int64_t, std::string>> by_time;
  {
    const std::lock_guard lock(g_names_mutex);
    for (const auto& [name, ns] : g_top_ns) by_time.emplace_back(ns, name);
    g_top_ns.clear();
  }
  std::sort(by_time.rbegin(), by_time.rend());
  std::cerr << "microseconds per decode step in top-level ops at batch " << batch << ":";
  for (const auto& [ns, name] : by_time) std::cerr << " " << name << "=" << per_step(ns) / 1e3;
  std::cerr << "\n";
}

void on_op_end(const at::RecordFunction& fn, at::ObserverContext*) {
  --t_depth;
  if (g_count_names && !t_started.empty()) {
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() -
                                                                         t_started.back()).count();
    t_started.pop_back();
    if (t_depth == 0) {
      const std::lock_guard lock(g_names_mutex);
      g_top_ns[fn.name()] += ns;
    }
  }
  if (t_has_child.empty()) return;  // started before the observer was installed
  const bool leaf = !t_has_child.back();
  t_has_child.pop_back();
  if (leaf && !is_view_or_allocation(fn.name())) g_kernel_ops.fetch_add(1, std::memory_order_relaxed);
}

/// The op counters at one moment.
struct OpCount {
  std::int64_t ops = g_ops.load();
  std::int64_t top = g_top_ops.load();
  std::int64_t kernels = g_kernel_ops.load();
};

/// `batch` caches filled to different lengths, with a token each to decode.
struct Batch {
  std::vector<std::unique_ptr<KvCache>> caches;
  std::vector<std::int32_t> next;

  Batch(int batch, int extra_prefill) {
    const int capacity = g_model->config().n_positions;
    for (int i = 0; i < batch; ++i) {
      caches.push_back(std::move(g_model->new_cache(capacity)).value());
      // Lengths spread over [capacity / 4, 3 * capacity / 4).
      const int length = capacity / 4 + (i * 37) % (capacity / 2);
      std::vector<std::int32_t> prompt;
      for (int j = 0; j < length; ++j) prompt.push_back((j * 31 + i * 7) % 256);
      const StepInput input{caches.back().get(), prompt};
      if (!g_model->step(std::span(&input, 1)).ok()) std::abort();
      next.push_back(i % 256);
    }
    if (extra_prefill > 0) caches.push_back(std::move(g_model->new_cache(capacity)).value());
  }
  bool room(int tokens) const {
    for (const auto& c : caches) {
      if (c->length() + tokens > c->capacity()) return false;
    }
    return true;
  }
};

/// BM_DecodeStep's loop: Model::step (logits to the host), or with
/// `sampled` Model::decode_step with greedy picks (the engine's decode
/// steps: a static-shape step on the tensor path, picks made on the device).
void decode_steps(benchmark::State& state, bool sampled) {
  const int batch = static_cast<int>(state.range(0));
  auto b = std::make_unique<Batch>(batch, 0);
  SamplingParams greedy;
  greedy.temperature = 0;
  std::vector<Sampler> samplers(static_cast<std::size_t>(batch), Sampler(greedy));
  std::vector<SampleSpec> specs;
  for (Sampler& s : samplers) specs.push_back({&s, -1});
  std::int64_t ops = 0, top = 0, kernels = 0, regions = 0;
  if (g_count_names) {
    const std::lock_guard lock(g_names_mutex);
    g_names.clear();
    g_top_ns.clear();
  }
  for (auto _ : state) {
    if (!b->room(1)) {
      state.PauseTiming();
      b = std::make_unique<Batch>(batch, 0);
      state.ResumeTiming();
    }
    std::vector<StepInput> inputs;
    for (int i = 0; i < batch; ++i) inputs.push_back({b->caches[static_cast<std::size_t>(i)].get(), std::span(&b->next[static_cast<std::size_t>(i)], 1)});
    const OpCount before;
    const std::int64_t regions_before = bench::parallel_regions();
    g_in_step.store(true, std::memory_order_relaxed);
    if (sampled) {
      auto r = g_model->decode_step(inputs, specs);
      if (!r.ok()) std::abort();
      benchmark::DoNotOptimize(r->data());
    } else {
      auto r = g_model->step(inputs);
      if (!r.ok()) std::abort();
      benchmark::DoNotOptimize(r->data());
    }
    g_in_step.store(false, std::memory_order_relaxed);
    regions += bench::parallel_regions() - regions_before;
    ops += g_ops.load() - before.ops;
    top += g_top_ops.load() - before.top;
    kernels += g_kernel_ops.load() - before.kernels;
  }
  const auto steps = static_cast<double>(std::max<std::int64_t>(state.iterations(), 1));
  if (g_count_names) print_op_names(batch, state.iterations());
  const ModelConfig& config = g_model->config();
  const double element_bytes = config.dtype == "float64" ? 8 : config.dtype == "float32" ? 4 : 2;
  const auto params = static_cast<double>(g_model->parameter_count());
  // Position embeddings are looked up, not multiplied (GPT-2); the tied
  // embedding is multiplied once, as the LM head.
  const double multiplying = params - (config.family == "gpt2" ? double(config.n_positions) * config.n_embd : 0.0);
  double keys = 0;
  for (const auto& c : b->caches) keys += c->length();
  const double flop_per_step = 2 * multiplying * batch + 4.0 * config.n_layer * config.n_embd * keys;
  state.counters["weights_Bps"] = benchmark::Counter(static_cast<double>(state.iterations()) * params * element_bytes,
                                                     benchmark::Counter::kIsRate);
  state.counters["flop_per_s"] = benchmark::Counter(static_cast<double>(state.iterations()) * flop_per_step,
                                                    benchmark::Counter::kIsRate);
  state.counters["aten_ops"] = static_cast<double>(ops) / steps;
  state.counters["aten_top_ops"] = static_cast<double>(top) / steps;
  state.counters["kernel_ops"] = static_cast<double>(kernels) / steps;
  state.counters["parallel_regions"] = static_cast<double>(regions) / steps;
  state.counters["tokens_per_s"] = benchmark::Counter(static_cast<double>(state.iterations()) * batch,
                                                      benchmark::Counter::kIsRate);
}

void BM_DecodeStep(benchmark::State& state) { decode_steps(state, false); }
void BM_SampledDecodeStep(benchmark::State& state) { decode_steps(state, true); }

void BM_DecodeOneByOne(benchmark::State& state) {
  const int batch = static_cast<int>(state.range(0));
  auto b = std::make_unique<Batch>(batch, 0);
  for (auto _ : state) {
    if (!b->room(1)) {
      state.PauseTiming();
      b = std::make_unique<Batch>(batch, 0);
      state.ResumeTiming();
    }
    for (int i = 0; i < batch; ++i) {
      const StepInput input{b->caches[static_cast<std::size_t>(i)].get(), std::span(&b->next[static_cast<std::size_t>(i)], 1)};
      auto r = g_model->step(std::span(&input, 1));
      if (!r.ok()) std::abort();
      benchmark::DoNotOptimize(r->data());
    }
  }
  state.counters["tokens_per_s"] = benchmark::Counter(static_cast<double>(state.iterations()) * batch,
                                                      benchmark::Counter::kIsRate);
}

void BM_MixedStep(benchmark::State& state) {
  const int batch = static_cast<int>(state.range(0));
  constexpr int kChunk = 64;
  std::vector<std::int32_t> chunk;
  for (int j = 0; j < kChunk; ++j) chunk.push_back((j * 13) % 256);
  auto b = std::make_unique<Batch>(batch, kChunk);
  for (auto _ : state) {
    if (!b->room(kChunk)) {
      state.PauseTiming();
      b = std::make_unique<Batch>(batch, kChunk);
      state.ResumeTiming();
    }
    std::vector<StepInput> inputs;
    for (int i = 0; i < batch; ++i) inputs.push_back({b->caches[static_cast<std::size_t>(i)].get(), std::span(&b->next[static_cast<std::size_t>(i)], 1)});
    inputs.push_back({b->caches.back().get(), chunk});
    auto r = g_model->step(inputs);
    if (!r.ok()) std::abort();
    benchmark::DoNotOptimize(r->data());
  }
  state.counters["tokens_per_s"] = benchmark::Counter(static_cast<double>(state.iterations()) * (batch + kChunk),
                                                      benchmark::Counter::kIsRate);
}

void BM_StreamRead(benchmark::State& state) {
  const at::Tensor a = at::ones({128LL << 20}, at::kFloat);  // 512 MiB
  for (auto _ : state) benchmark::DoNotOptimize(at::sum(a).item<float>());
  state.counters["read_Bps"] = benchmark::Counter(static_cast<double>(state.iterations()) * a.nbytes(),
                                                  benchmark::Counter::kIsRate);
}

void BM_StreamCopy(benchmark::State& state) {
  const at::Tensor a = at::ones({64LL << 20}, at::kFloat);  // 256 MiB each
  at::Tensor b = at::empty_like(a);
  for (auto _ : state) {
    b.copy_(a);
    benchmark::DoNotOptimize(b.data_ptr());
  }
  state.counters["copy_Bps"] = benchmark::Counter(static_cast<double>(state.iterations()) * 2.0 * a.nbytes(),
                                                  benchmark::Counter::kIsRate);
}

void BM_Matmul(benchmark::State& state) {
  const std::int64_t n = state.range(0);
  const at::Tensor a = at::randn({n, n}), b = at::randn({n, n});
  at::Tensor c = at::empty({n, n});
  for (auto _ : state) {
    at::mm_out(c, a, b);
    benchmark::DoNotOptimize(c.data_ptr());
  }
  state.counters["flop_per_s"] = benchmark::Counter(static_cast<double>(state.iterations()) * 2.0 * n * n * n,
                                                    benchmark::Counter::kIsRate);
}

/// The benchmark's model, timing its steps (the engine thread's only model calls that compute).
class TimedModel final : public Model {
 public:
  explicit TimedModel(Model& inner) : inner_(inner) {}
  const ModelConfig& config() const override { return inner_.config(); }
  std::int64_t parameter_count() const override { return inner_.parameter_count(); }
  const Tokenizer& tokenizer() const override { return inner_.tokenizer(); }
  Result<std::unique_ptr<KvCache>> new_cache(int capacity_tokens) override { return inner_.new_cache(capacity_tokens); }
  Status copy_cache(const KvCache& from, KvCache& to) override { return inner_.copy_cache(from, to); }
  Result<std::vector<std::vector<float>>> step(std::span<const StepInput> inputs) override {
    const auto t0 = std::chrono::steady_clock::now();
    auto r = inner_.step(inputs);
    step_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return r;
  }
  Result<std::vector<float>> forward_full(std::span<const std::int32_t> tokens) override {
    return inner_.forward_full(tokens);
  }
  /// Seconds in step() so far (read after the engine stopped stepping).
  double step_seconds() const { return step_seconds_; }

 private:
  Model& inner_;
  double step_seconds_ = 0;
};

/// Counts finished requests; wakes the benchmark when all are done.
class CountingSink final : public EventSink {
 public:
  void push(EngineEvent event) override {
    if (!std::holds_alternative<FinishedEvent>(event) && !std::holds_alternative<FailedEvent>(event)) return;
    const std::lock_guard lock(mu_);
    if (std::holds_alternative<FailedEvent>(event)) ++failed_;
    ++done_;
    cv_.notify_all();
  }
  /// Waits for `count` ends; false if one was a failure.
  bool wait(int count) {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return done_ >= count; });
    return failed_ == 0;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int done_ = 0;
  int failed_ = 0;
};

void BM_EngineLoop(benchmark::State& state) {
  const int batch = static_cast<int>(state.range(0));
  constexpr int kNew = 48;
  TimedModel model(*g_model);
  Engine::Options o;
  o.max_batch = batch;
  o.max_batch_tokens = 4096;
  o.admission.policy = AdmissionPolicy{AdmissionPolicy::Kind::kFixed, batch};
  o.admission.budget_bytes = 1LL << 40;
  o.admission.max_queue = batch;
  o.profile.kv_bytes_per_token = 1;
  auto created = Engine::create(o, model, *g_device);
  if (!created.ok()) {
    state.SkipWithError(created.error().message.c_str());
    return;
  }
  const std::unique_ptr<Engine> engine = std::move(created).value();
  double wall = 0;
  std::int64_t steps = 0, tokens = 0;
  const double step_seconds_before = model.step_seconds();
  for (auto _ : state) {
    const EngineStats before = engine->stats();
    auto sink = std::make_shared<CountingSink>();
    std::vector<std::shared_ptr<RequestHandle>> handles;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < batch; ++i) {
      GenerationRequest r;
      r.id = "bench-" + std::to_string(i);
      for (int j = 0; j < 8; ++j) r.prompt.push_back((j * 31 + i * 7) % 256);
      r.max_tokens = kNew;
      r.sampling.temperature = 0;
      r.ignore_eos = true;
      auto h = engine->submit(std::move(r), sink);
      if (!h.ok()) {
        state.SkipWithError(h.error().message.c_str());
        return;
      }
      handles.push_back(std::move(h).value());
    }
    if (!sink->wait(batch)) {
      state.SkipWithError("a request failed");
      return;
    }
    wall += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    // The engine counts a step before it delivers the step's events: wait
    // until the last one is counted.
    while (engine->stats().counters[CounterId::kCompleted] < before.counters[CounterId::kCompleted] + batch)
      std::this_thread::yield();
    const EngineStats after = engine->stats();
    steps += after.steps - before.steps;
    tokens += after.generated_tokens - before.generated_tokens;
  }
  engine->shutdown();
  const double host = wall - (model.step_seconds() - step_seconds_before);
  state.counters["host_us_per_step"] = 1e6 * host / static_cast<double>(std::max<std::int64_t>(steps, 1));
  state.counters["host_us_per_token"] = 1e6 * host / static_cast<double>(std::max<std::int64_t>(tokens, 1));
  state.counters["host_share"] = host / std::max(wall, 1e-9);
  state.counters["tokens_per_s"] = static_cast<double>(tokens) / std::max(wall, 1e-9);
}

/// Shared machines are noisy: with --benchmark_repetitions, the fastest
/// repetition is the one to compare.
double fastest(const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); }

BENCHMARK(BM_StreamRead)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_StreamCopy)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Matmul)->Arg(1024)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_DecodeStep)->Arg(1)->Arg(4)->Arg(16)->Arg(32)->Arg(64)->Unit(benchmark::kMillisecond)->UseRealTime()->ComputeStatistics("min", fastest);
BENCHMARK(BM_SampledDecodeStep)
    ->Arg(1)
    ->Arg(4)
    ->Arg(16)
    ->Arg(32)
    ->Arg(64)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->ComputeStatistics("min", fastest);
BENCHMARK(BM_EngineLoop)->Arg(1)->Arg(16)->Arg(64)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_DecodeOneByOne)->Arg(1)->Arg(4)->Arg(16)->Arg(32)->Unit(benchmark::kMillisecond)->UseRealTime()->ComputeStatistics("min", fastest);
BENCHMARK(BM_MixedStep)->Arg(4)->Arg(16)->Arg(32)->Unit(benchmark::kMillisecond)->UseRealTime()->ComputeStatistics("min", fastest);

}  // namespace
}  // namespace vg

int main(int argc, char** argv) {
  std::filesystem::path model_dir;
  std::string dtype = "float32";
  bool host_kernel = true;
  bool malloc_defaults = false;
  int threads = 1;
  int pool_block_tokens = -1;  // default: the server's 16 on the tensor path, none on the host path
  std::vector<char*> rest;
  for (int i = 0; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--model=", 0) == 0) {
      model_dir = arg.substr(8);
    } else if (arg.rfind("--dtype=", 0) == 0) {
      dtype = arg.substr(8);
    } else if (arg.rfind("--path=", 0) == 0) {
      host_kernel = arg.substr(7) != "tensor";
    } else if (arg == "--op-names") {
      vg::g_count_names = true;
    } else if (arg == "--malloc-defaults") {
      malloc_defaults = true;
    } else if (arg.rfind("--threads=", 0) == 0) {
      threads = std::stoi(arg.substr(10));
    } else if (arg.rfind("--kv-pool=", 0) == 0) {
      pool_block_tokens = std::stoi(arg.substr(10));
    } else {
      rest.push_back(argv[i]);
    }
  }
  const std::filesystem::path scratch = std::filesystem::temp_directory_path() / "vg_model_step_bench";
  if (model_dir.empty()) {
    model_dir = scratch;
    const std::string command = "/usr/bin/python3 '" + std::string(VG_SOURCE_DIR) +
                                "/tools/make_random_gpt2.py' --out '" + scratch.string() +
                                "' --seed 3 --layers 3 --heads 4 --embd 128 --positions 256 --vocab 257";
    if (std::system(command.c_str()) != 0) {
      std::cerr << "cannot write a random checkpoint: " << command << "\n";
      return 1;
    }
  }
  if (pool_block_tokens < 0) pool_block_tokens = host_kernel ? 0 : 16;
  if (!malloc_defaults) vg::retain_freed_host_memory();  // as the server does
  vg::set_compute_threads(threads);
  vg::g_device = std::move(vg::VirtualDevice::create(0, 4LL << 30)).value();
  vg::DeviceScope scope(vg::g_device.get());
  auto model = vg::Model::load({model_dir, vg::g_device.get(), dtype, host_kernel});
  if (!model.ok()) {
    std::cerr << model.error().message << "\n";
    return 1;
  }
  vg::g_model = std::move(model).value();
  if (pool_block_tokens > 0) {
    // Room for the largest batch (64 sequences and a prefill) at full context.
    const int n_positions = vg::g_model->config().n_positions;
    const std::int64_t blocks = 65 * ((n_positions + pool_block_tokens - 1) / pool_block_tokens);
    if (vg::Status st = vg::g_model->use_kv_pool({pool_block_tokens, blocks}); !st.ok()) {
      std::cerr << st.error().message << "\n";
      return 1;
    }
  }
  std::cerr << vg::torch_runtime_description() << ", dtype " << dtype << ", "
            << (host_kernel ? "host decode kernel where the dtype has one" : "tensor path")
            << (malloc_defaults ? ", glibc malloc's default thresholds" : "")
            << (pool_block_tokens > 0 ? ", caches in one pool of " + std::to_string(pool_block_tokens) + "-token blocks"
                                      : std::string())
            << "\n";
  const at::CallbackHandle observer = at::addGlobalCallback(
      at::RecordFunctionCallback(vg::on_op_start, vg::on_op_end).scopes({at::RecordScope::FUNCTION}));
  int rest_argc = static_cast<int>(rest.size());
  benchmark::Initialize(&rest_argc, rest.data());
  benchmark::RunSpecifiedBenchmarks();
  at::removeCallback(observer);
  vg::g_model.reset();
  benchmark::Shutdown();
  std::filesystem::remove_all(scratch);
  return 0;
}
