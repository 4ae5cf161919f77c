// Decode-step throughput of the GPT-2 forward pass at batch 1, 4, 16 and 32
// (tokens/s), each sequence at a different cache length, batched in one
// Model::step (BM_DecodeStep) and, for comparison, one step() call per
// sequence (BM_DecodeOneByOne); BM_MixedStep adds one 64-token prefill chunk
// to a batch of decodes. The model is `--model=DIR` or, by default, a random
// checkpoint of the tinylm shape (3 layers, 128 wide, 4 heads, 256 positions,
// vocab 257) written by tools/make_random_gpt2.py. `--dtype=float64` switches
// the compute dtype, `--threads=N` the intra-op threads (default 1); other
// flags go to Google Benchmark.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "device/device.hpp"
#include "model/model.hpp"
#include "model/runtime.hpp"

namespace vg {
namespace {

std::unique_ptr<VirtualDevice> g_device;
std::unique_ptr<Model> g_model;

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

void BM_DecodeStep(benchmark::State& state) {
  const int batch = static_cast<int>(state.range(0));
  auto b = std::make_unique<Batch>(batch, 0);
  for (auto _ : state) {
    if (!b->room(1)) {
      state.PauseTiming();
      b = std::make_unique<Batch>(batch, 0);
      state.ResumeTiming();
    }
    std::vector<StepInput> inputs;
    for (int i = 0; i < batch; ++i) inputs.push_back({b->caches[static_cast<std::size_t>(i)].get(), std::span(&b->next[static_cast<std::size_t>(i)], 1)});
    auto r = g_model->step(inputs);
    if (!r.ok()) std::abort();
    benchmark::DoNotOptimize(r->data());
  }
  state.counters["tokens_per_s"] = benchmark::Counter(static_cast<double>(state.iterations()) * batch,
                                                      benchmark::Counter::kIsRate);
}

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

/// Shared machines are noisy: with --benchmark_repetitions, the fastest
/// repetition is the one to compare.
double fastest(const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); }

BENCHMARK(BM_DecodeStep)->Arg(1)->Arg(4)->Arg(16)->Arg(32)->Unit(benchmark::kMillisecond)->ComputeStatistics("min", fastest);
BENCHMARK(BM_DecodeOneByOne)->Arg(1)->Arg(4)->Arg(16)->Arg(32)->Unit(benchmark::kMillisecond)->ComputeStatistics("min", fastest);
BENCHMARK(BM_MixedStep)->Arg(4)->Arg(16)->Arg(32)->Unit(benchmark::kMillisecond)->ComputeStatistics("min", fastest);

}  // namespace
}  // namespace vg

int main(int argc, char** argv) {
  std::filesystem::path model_dir;
  std::string dtype = "float32";
  int threads = 1;
  std::vector<char*> rest;
  for (int i = 0; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--model=", 0) == 0) {
      model_dir = arg.substr(8);
    } else if (arg.rfind("--dtype=", 0) == 0) {
      dtype = arg.substr(8);
    } else if (arg.rfind("--threads=", 0) == 0) {
      threads = std::stoi(arg.substr(10));
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
  vg::set_compute_threads(threads);
  vg::g_device = std::move(vg::VirtualDevice::create(0, 4LL << 30)).value();
  vg::DeviceScope scope(vg::g_device.get());
  auto model = vg::Model::load({model_dir, vg::g_device.get(), dtype});
  if (!model.ok()) {
    std::cerr << model.error().message << "\n";
    return 1;
  }
  vg::g_model = std::move(model).value();
  std::cerr << vg::torch_runtime_description() << ", dtype " << dtype << "\n";
  int rest_argc = static_cast<int>(rest.size());
  benchmark::Initialize(&rest_argc, rest.data());
  benchmark::RunSpecifiedBenchmarks();
  vg::g_model.reset();
  benchmark::Shutdown();
  std::filesystem::remove_all(scratch);
  return 0;
}
