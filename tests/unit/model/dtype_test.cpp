// Compute dtypes on the virtual device: bfloat16 halves the weights' and KV
// cache's device bytes and stays close to float32; float64 doubles them;
// float16 is refused with a message that says it is for CUDA.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "device/device.hpp"
#include "model/model.hpp"
#include "model_test_util.hpp"

namespace vg {
namespace {

using testing::TempDir;

struct Loaded {
  std::unique_ptr<VirtualDevice> device;
  std::unique_ptr<Model> model;
  std::int64_t resident = 0;  ///< device bytes after loading
};

Loaded load_in_dtype(const std::filesystem::path& dir, const std::string& dtype, bool host_kernel = true) {
  Loaded l{std::move(VirtualDevice::create(0, 1LL << 30)).value(), nullptr};
  auto m = Model::load({dir, l.device.get(), dtype, host_kernel});
  EXPECT_TRUE(m.ok()) << dtype << ": " << m.error().message;
  if (m.ok()) l.model = std::move(m).value();
  l.resident = l.device->memory().used;
  return l;
}

class DtypeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::RandomGpt2 spec;
    spec.n_embd = 64;
    spec.n_positions = 48;
    testing::write_random_gpt2(dir_.path(), spec);
  }
  TempDir dir_;
};

TEST_F(DtypeTest, DeviceBytesFollowTheDtype) {
  Loaded f32 = load_in_dtype(dir_.path(), "float32");
  Loaded bf16 = load_in_dtype(dir_.path(), "bfloat16");
  Loaded f64 = load_in_dtype(dir_.path(), "float64");
  ASSERT_TRUE(f32.model && bf16.model && f64.model);
  EXPECT_EQ(bf16.model->config().dtype, "bfloat16");
  EXPECT_EQ(f32.model->parameter_count(), bf16.model->parameter_count());
  // Weights: 4, 2 and 8 bytes per parameter (allocator rounding aside).
  const double params = static_cast<double>(f32.model->parameter_count());
  EXPECT_NEAR(static_cast<double>(f32.resident) / params, 4.0, 0.1);
  EXPECT_NEAR(static_cast<double>(bf16.resident) / params, 2.0, 0.1);
  EXPECT_NEAR(static_cast<double>(f64.resident) / params, 8.0, 0.2);
  // KV cache: 2 layers x K and V x 32 tokens x 64 values.
  const std::int64_t values = 2 * 2 * 32 * 64;
  EXPECT_EQ(std::move(f32.model->new_cache(32)).value()->bytes(), values * 4);
  EXPECT_EQ(std::move(bf16.model->new_cache(32)).value()->bytes(), values * 2);
  EXPECT_EQ(std::move(f64.model->new_cache(32)).value()->bytes(), values * 8);
}

TEST_F(DtypeTest, Bfloat16StepsStayCloseToFloat32) {
  Loaded f32 = load_in_dtype(dir_.path(), "float32");
  Loaded bf16 = load_in_dtype(dir_.path(), "bfloat16");
  ASSERT_TRUE(f32.model && bf16.model);
  std::vector<std::int32_t> ids;
  for (int i = 0; i < 20; ++i) ids.push_back((i * 31 + 3) % 256);
  auto c32 = std::move(f32.model->new_cache(21)).value();
  auto c16 = std::move(bf16.model->new_cache(21)).value();
  // A prefill, then a decode step through the KV cache.
  for (auto chunk : {std::span<const std::int32_t>(ids).first(19), std::span<const std::int32_t>(ids).last(1)}) {
    const StepInput in32{c32.get(), chunk}, in16{c16.get(), chunk};
    auto a = f32.model->step(std::span(&in32, 1));
    auto b = bf16.model->step(std::span(&in16, 1));
    ASSERT_TRUE(a.ok() && b.ok());
    float scale = 0;
    for (float x : a->at(0)) scale = std::max(scale, std::abs(x));
    // bfloat16 keeps 8 significant bits: a few percent of the logit range.
    EXPECT_LE(testing::max_abs_diff(a->at(0), b->at(0)), 0.05f * scale);
    EXPECT_GT(testing::max_abs_diff(a->at(0), b->at(0)), 0.0f);  // it really computed in bfloat16
  }
}

// The host kernels read bfloat16 weights in place for the products (in
// float, rounded once); libtorch's bfloat16 product rounds its own way. Both
// stay within bfloat16's precision of each other, on the same device bytes.
TEST_F(DtypeTest, Bfloat16HostProductsAgreeWithLibtorchs) {
  Loaded host = load_in_dtype(dir_.path(), "bfloat16", /*host_kernel=*/true);
  Loaded aten = load_in_dtype(dir_.path(), "bfloat16", /*host_kernel=*/false);
  ASSERT_TRUE(host.model && aten.model);
  EXPECT_EQ(host.resident, aten.resident);
  std::vector<std::int32_t> ids;
  for (int i = 0; i < 20; ++i) ids.push_back((i * 17 + 5) % 256);
  auto ch = std::move(host.model->new_cache(21)).value();
  auto ca = std::move(aten.model->new_cache(21)).value();
  for (auto chunk : {std::span<const std::int32_t>(ids).first(19), std::span<const std::int32_t>(ids).last(1)}) {
    const StepInput in_h{ch.get(), chunk}, in_a{ca.get(), chunk};
    auto a = host.model->step(std::span(&in_h, 1));
    auto b = aten.model->step(std::span(&in_a, 1));
    ASSERT_TRUE(a.ok() && b.ok());
    float scale = 0;
    for (float x : b->at(0)) scale = std::max(scale, std::abs(x));
    EXPECT_LE(testing::max_abs_diff(a->at(0), b->at(0)), 0.05f * scale);
  }
}

TEST_F(DtypeTest, Float16IsForCuda) {
  auto device = std::move(VirtualDevice::create(0, 1LL << 30)).value();
  auto m = Model::load({dir_.path(), device.get(), "float16"});
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.error().code, ErrorCode::kModelLoad);
  EXPECT_NE(m.error().message.find("'float16' is for CUDA devices"), std::string::npos) << m.error().message;
  EXPECT_NE(m.error().message.find("bfloat16"), std::string::npos) << m.error().message;
  EXPECT_EQ(device->memory().used, 0);
}

}  // namespace
}  // namespace vg
