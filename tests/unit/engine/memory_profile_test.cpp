// The start-up memory profile against what requests really use, on tinylm
// and a virtual device: the device's measured peak stays within resident +
// workspace + predicted cost, and the prediction is at most 25% above the
// bytes a request really holds.
#include "engine/memory_profiler.hpp"

#include <gtest/gtest.h>

#include <filesystem>

#include "device/device.hpp"
#include "model/model.hpp"
#include "model/sampler.hpp"

namespace vg {
namespace {

const char* kModelDir = VG_SOURCE_DIR "/models/tinylm";

TEST(MemoryProfile, PredictsWhatRequestsUseOnTinylm) {
  ASSERT_TRUE(std::filesystem::exists(std::string(kModelDir) + "/model.safetensors"));
  auto dev = VirtualDevice::create(7, 64 << 20);
  ASSERT_TRUE(dev.ok());
  VirtualDevice& device = **dev;
  DeviceScope scope(&device);
  auto model = Model::load(Model::Options{kModelDir, &device});
  ASSERT_TRUE(model.ok()) << model.error().message;
  auto profile = measure_memory_profile(**model, device, ProfileOptions{8, 512, 1.1});
  ASSERT_TRUE(profile.ok()) << profile.error().message;
  EXPECT_EQ(profile->resident_bytes, device.memory().used);
  EXPECT_GT(profile->workspace_bytes, 0);
  EXPECT_GT(profile->kv_bytes_per_token, 0);

  const std::pair<int, int> sizes[] = {{4, 12}, {16, 64}, {64, 128}, {8, 240}, {200, 56}};
  for (auto [prompt_len, max_tokens] : sizes) {
    SCOPED_TRACE("prompt " + std::to_string(prompt_len) + " + max_tokens " + std::to_string(max_tokens));
    const std::int64_t cost = request_cost(*profile, prompt_len, max_tokens);
    device.reset_peak();
    const std::int64_t before = device.memory().used;
    ASSERT_EQ(before, profile->resident_bytes);  // nothing left over from the previous request
    {
      auto cache = (*model)->new_cache(prompt_len + max_tokens);
      ASSERT_TRUE(cache.ok());
      const std::int64_t held = device.memory().used - before;
      EXPECT_GE(cost, held);
      EXPECT_LE(static_cast<double>(cost), 1.25 * static_cast<double>(held));

      std::vector<std::int32_t> prompt(static_cast<std::size_t>(prompt_len), 'e');
      StepInput in{cache->get(), prompt};
      auto logits = (*model)->step(std::span<const StepInput>(&in, 1));
      ASSERT_TRUE(logits.ok());
      Sampler sampler(SamplingParams{0.0, 1.0, 0, 1});
      for (int i = 0; i < max_tokens - 1; ++i) {
        const std::int32_t next = sampler.sample(logits->front());
        StepInput d{cache->get(), std::span<const std::int32_t>(&next, 1)};
        logits = (*model)->step(std::span<const StepInput>(&d, 1));
        ASSERT_TRUE(logits.ok());
      }
    }
    const std::int64_t peak_added = device.memory().peak - profile->resident_bytes;
    EXPECT_LE(peak_added, profile->workspace_bytes + cost);
    EXPECT_EQ(device.memory().used, profile->resident_bytes);
  }
}

}  // namespace
}  // namespace vg
