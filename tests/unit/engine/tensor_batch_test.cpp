// Batch selection for tensor models: which granted requests share a forward
// pass, their padded shapes, and the bound that a pass's predicted peak
// (padding included) stays within its requests' leases + the free budget.
#include "engine/tensor_batch.hpp"

#include <gtest/gtest.h>

namespace vg {
namespace {

const char* kAudio = R"({"model_type": "torchscript",
  "inputs":  [{"name": "audio", "dtype": "float32", "shape": ["batch", "samples"]},
              {"name": "gain", "dtype": "float32", "shape": ["batch", 2]}],
  "outputs": [{"name": "audio", "dtype": "float32", "shape": ["batch", "samples"]}],
  "dims": {"batch": {"max": 16}, "samples": {"min": 100, "max": 1000}},
  "pad": ["samples"]})";

TensorModelSpec audio_spec(bool paddable = true) {
  std::string text = kAudio;
  if (!paddable) text.replace(text.find("[\"samples\"]}"), 11, "[]");
  auto spec = parse_tensor_model_spec(text, "config.json");
  EXPECT_TRUE(spec.ok()) << spec.error().message;
  return *spec;
}

TensorMemoryProfile profile() {
  TensorMemoryProfile p;
  p.fixed_bytes = 1000;
  p.bytes_per_element = 10;
  p.safety_factor = 1.0;
  return p;
}

/// A request of `samples`, holding its own cost (as a granted lease does).
BatchCandidate request(std::int64_t samples, std::int64_t rows = 1) {
  BatchCandidate c;
  c.shapes = {{rows, samples}, {rows, 2}};
  c.held_bytes = tensor_cost(profile(), total_elements(c.shapes));
  return c;
}

BatchLimits limits(std::optional<std::int64_t> extra, int max_requests = 8) {
  BatchLimits l;
  l.max_requests = max_requests;
  l.max_rows = 16;
  l.extra_bytes = extra;
  return l;
}

TEST(TensorBatch, KeysWildcardOnlyThePaddableDimensions) {
  const auto spec = audio_spec();
  const std::vector<std::vector<std::int64_t>> a{{1, 300}, {1, 2}}, b{{4, 700}, {4, 2}};
  EXPECT_EQ(batch_key(spec, a), batch_key(spec, b));
  EXPECT_EQ(batch_key(spec, a), (std::vector<std::int64_t>{2, -1, 2, 2}));
  EXPECT_NE(batch_key(audio_spec(false), a), batch_key(audio_spec(false), b));
}

TEST(TensorBatch, PadsToTheLargestAndSumsRows) {
  const std::vector<BatchCandidate> c{request(300), request(700, 2), request(500)};
  const BatchPlan plan = plan_batch(audio_spec(), profile(), c, limits(std::nullopt));
  EXPECT_EQ(plan.members, (std::vector<std::size_t>{0, 1, 2}));
  EXPECT_EQ(plan.shapes, (std::vector<std::vector<std::int64_t>>{{4, 700}, {4, 2}}));
  EXPECT_EQ(plan.cost_bytes, 1000 + 10 * (4 * 700 + 4 * 2));
  EXPECT_FALSE(plan.full);
}

TEST(TensorBatch, WithoutPadDifferentSizesNeverShareAPass) {
  const std::vector<BatchCandidate> c{request(300), request(700), request(300)};
  const BatchPlan plan = plan_batch(audio_spec(false), profile(), c, limits(std::nullopt));
  EXPECT_EQ(plan.members, (std::vector<std::size_t>{0, 2}));
  EXPECT_EQ(plan.shapes.front(), (std::vector<std::int64_t>{2, 300}));
}

TEST(TensorBatch, EqualShapesNeverNeedMoreThanTheirLeases) {
  std::vector<BatchCandidate> c(8, request(500));
  const BatchPlan plan = plan_batch(audio_spec(), profile(), c, limits(0));
  EXPECT_EQ(plan.members.size(), 8u);
  EXPECT_LE(plan.cost_bytes, plan.held_bytes);
  EXPECT_TRUE(plan.full);  // --max-batch 8
}

// The bound: a padded pass's predicted peak never passes the members' leases
// plus the free bytes, for every amount of free bytes.
TEST(TensorBatch, PaddedCostStaysWithinLeasesPlusFreeBytes) {
  const std::vector<BatchCandidate> c{request(100), request(1000), request(120), request(110), request(900)};
  for (std::int64_t extra = 0; extra <= 40000; extra += 250) {
    const BatchPlan plan = plan_batch(audio_spec(), profile(), c, limits(extra));
    ASSERT_FALSE(plan.members.empty());
    EXPECT_EQ(plan.members.front(), 0u);
    EXPECT_LE(plan.cost_bytes, plan.held_bytes + extra) << extra;  // alone: its cost is its lease
    std::int64_t held = 0;
    for (std::size_t i : plan.members) held += c[i].held_bytes;
    EXPECT_EQ(plan.held_bytes, held);
    EXPECT_EQ(plan.cost_bytes, tensor_cost(profile(), total_elements(plan.shapes)));
  }
  // With no free bytes the long requests cannot join the short ones (their
  // padding costs more than the fixed bytes saved), the close sizes can.
  const BatchPlan tight = plan_batch(audio_spec(), profile(), c, limits(0));
  EXPECT_EQ(tight.members, (std::vector<std::size_t>{0, 2, 3}));
  EXPECT_EQ(tight.shapes.front(), (std::vector<std::int64_t>{3, 120}));
  // With room for the padding everything shares one pass, padded to 1000.
  const BatchPlan roomy = plan_batch(audio_spec(), profile(), c, limits(std::int64_t{1} << 30));
  EXPECT_EQ(roomy.members.size(), 5u);
  EXPECT_EQ(roomy.shapes.front(), (std::vector<std::int64_t>{5, 1000}));
}

TEST(TensorBatch, TheFirstRequestAlwaysRunsAndLimitsStopTheBatch) {
  const std::vector<BatchCandidate> one{request(1000)};
  const BatchPlan alone = plan_batch(audio_spec(), profile(), one, limits(0));
  EXPECT_EQ(alone.members, std::vector<std::size_t>{0});
  EXPECT_EQ(alone.cost_bytes, alone.held_bytes);

  const std::vector<BatchCandidate> rows{request(500, 10), request(500, 7), request(500, 6)};
  const BatchPlan by_rows = plan_batch(audio_spec(), profile(), rows, limits(std::nullopt));
  EXPECT_EQ(by_rows.members, std::vector<std::size_t>{0});  // 10 + 7 > 16 rows
  EXPECT_TRUE(by_rows.full);

  const std::vector<BatchCandidate> many(5, request(500));
  const BatchPlan by_count = plan_batch(audio_spec(), profile(), many, limits(std::nullopt, 3));
  EXPECT_EQ(by_count.members.size(), 3u);
  EXPECT_TRUE(by_count.full);
  EXPECT_TRUE(plan_batch(audio_spec(), profile(), {}, limits(0)).members.empty());
}

}  // namespace
}  // namespace vg
