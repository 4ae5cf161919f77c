#include "engine/memory_profiler.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <vector>

#include "common/clock.hpp"
#include "common/decimal.hpp"
#include "device/device.hpp"
#include "model/model.hpp"
#include "model/sampler.hpp"

namespace vg {
namespace {

// Device bytes one empty cache of `capacity` tokens adds. Sizes are fitted
// from allocated bytes: on CUDA `used` moves in whole allocator segments.
Result<std::int64_t> cache_bytes(Model& model, Device& device, int capacity) {
  const std::int64_t before = device.memory().allocated;
  auto cache = model.new_cache(capacity);
  if (!cache.ok()) return std::move(cache).error();
  return device.memory().allocated - before;
}

// Filler tokens for profile runs: cycle through printable ids.
std::vector<std::int32_t> filler(int n, int vocab) {
  std::vector<std::int32_t> t(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) t[static_cast<std::size_t>(i)] = 32 + i % std::max(1, std::min(vocab, 127) - 32);
  return t;
}

// Peak bytes above the pre-step level while running `inputs` (caches are
// allocated before the step, so only activations count).
Result<std::int64_t> step_peak(Model& model, Device& device, std::span<const StepInput> inputs) {
  device.reset_peak();
  const std::int64_t base = device.memory().allocated;
  auto out = model.step(inputs);
  if (!out.ok()) return std::move(out).error();
  return device.memory().peak_allocated - base;
}

// Peak bytes above the pre-step level while running decode `inputs` as the
// engine runs them (Model::decode_step), each row sampled the costliest way
// a request can ask: temperature with top-p (a sort of the vocabulary), a
// repetition penalty over its prompt, and the most logprobs.
Result<std::int64_t> decode_peak(Model& model, Device& device, std::span<const StepInput> inputs,
                                 std::span<const std::int32_t> prompt) {
  SamplingParams costliest;
  costliest.temperature = 1.0;
  costliest.top_p = 0.95;
  costliest.repetition_penalty = 1.1;
  costliest.seed = 0;
  std::vector<Sampler> samplers(inputs.size(), Sampler(costliest, prompt));
  std::vector<SampleSpec> specs;
  for (Sampler& s : samplers) specs.push_back(SampleSpec{&s, kMaxTopLogprobs});
  device.reset_peak();
  const std::int64_t base = device.memory().allocated;
  auto out = model.decode_step(inputs, specs);
  if (!out.ok()) return std::move(out).error();
  return device.memory().peak_allocated - base;
}

}  // namespace

Result<MemoryProfile> measure_memory_profile(Model& model, Device& device, const ProfileOptions& options) {
  const ModelConfig& mc = model.config();
  MemoryProfile p;
  p.resident_bytes = device.memory().own;
  p.safety_factor = options.safety_factor;

  // KV cache: linear in capacity; fit slope and intercept from two sizes.
  const int small = std::min(16, mc.n_positions);
  const int large = mc.n_positions;
  auto a = cache_bytes(model, device, small);
  if (!a.ok()) return std::move(a).error();
  auto b = cache_bytes(model, device, large);
  if (!b.ok()) return std::move(b).error();
  if (large > small) {
    p.kv_bytes_per_token = (*b - *a + (large - small) - 1) / (large - small);
  } else {
    p.kv_bytes_per_token = (*b + large - 1) / large;
  }
  p.sequence_overhead_bytes = std::max<std::int64_t>(0, *b - p.kv_bytes_per_token * large);

  // Workspace run 1: the largest prefill chunk a step may hold.
  const int chunk = std::min(options.max_batch_tokens, mc.n_positions);
  std::int64_t workspace = 0;
  {
    auto cache = model.new_cache(chunk);
    if (!cache.ok()) return std::move(cache).error();
    const auto tokens = filler(chunk, mc.vocab_size);
    StepInput in{cache->get(), tokens};
    auto peak = step_peak(model, device, std::span<const StepInput>(&in, 1));
    if (!peak.ok()) return std::move(peak).error();
    workspace = std::max(workspace, *peak);
  }
  // Workspace run 2: decode steps over full-context caches with 1 and 2
  // sequences; the per-sequence growth is extrapolated to max_batch (at_batch,
  // over the padded rows where decode steps pad), so the profile itself needs
  // only two full caches on the device. Without a block pool yet they take
  // the layout of step(), whose gathered keys (every cached key, concatenated,
  // then padded) bound a static-shape step's of as many rows.
  {
    const int prefix = std::max(1, mc.n_positions - 2);
    const auto prompt = filler(prefix, mc.vocab_size);
    std::vector<std::unique_ptr<KvCache>> caches;
    for (int i = 0; i < 2; ++i) {
      auto cache = model.new_cache(mc.n_positions);
      if (!cache.ok()) return std::move(cache).error();
      StepInput in{cache->get(), prompt};
      auto r = model.step(std::span<const StepInput>(&in, 1));
      if (!r.ok()) return std::move(r).error();
      caches.push_back(std::move(cache).value());
    }
    std::vector<std::int32_t> next = {32, 32};
    std::int64_t peaks[2] = {0, 0};
    double step_s[2] = {0, 0};
    for (int n = 1; n <= 2; ++n) {
      std::vector<StepInput> inputs;
      for (int i = 0; i < n; ++i) {
        // Each run appends one token; caches hold prefix + 2 at most.
        inputs.push_back(StepInput{caches[static_cast<std::size_t>(i)].get(),
                                   std::span<const std::int32_t>(&next[static_cast<std::size_t>(i)], 1)});
      }
      const auto started = std::chrono::steady_clock::now();
      auto peak = decode_peak(model, device, inputs, prompt);
      step_s[n - 1] = to_seconds(std::chrono::steady_clock::now() - started);
      if (!peak.ok()) return std::move(peak).error();
      peaks[n - 1] = *peak;
    }
    p.batch.decode_workspace_bytes = peaks[0];
    p.batch.workspace_per_sequence_bytes = std::max<std::int64_t>(0, peaks[1] - peaks[0]);
    // The step time grows with the batch as the peak does: extrapolated the same way.
    p.batch.decode_step_seconds = step_s[0];
    p.batch.step_seconds_per_sequence = std::max(0.0, step_s[1] - step_s[0]);
    p.batch.pads_to_power_of_two = model.pads_decode_batch();
  }
  p.batch.prefill_workspace_bytes = workspace;
  p = at_batch(p, std::max(1, std::min(options.max_batch, options.max_batch_tokens)));
  device.reset_peak();
  spdlog::info("memory profile on {}: resident {} B, workspace {} B, KV cache {} B/token + {} B/sequence, safety x{}, "
               "full-batch decode step {} ms",
               device.name(), p.resident_bytes, p.workspace_bytes, p.kv_bytes_per_token, p.sequence_overhead_bytes,
               format_decimal(p.safety_factor), format_decimal(p.step_seconds * 1e3));
  return p;
}

}  // namespace vg
