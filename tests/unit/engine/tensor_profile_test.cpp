// The memory profile of a real TorchScript model (the image-to-image test
// model of tools/make_torchscript_models.py) on a virtual device: for input
// sizes the fit never saw, the measured peak of a forward pass stays within
// the predicted cost and the prediction is at most 25 % above it.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <random>

#include "device/device.hpp"
#include "engine/tensor_profiler.hpp"
#include "model/torchscript_model.hpp"

namespace vg {
namespace {

std::filesystem::path make_models() {
  static const std::filesystem::path dir = [] {
    std::filesystem::path d = std::filesystem::temp_directory_path() /
                              ("vg-tensor-profile-" + std::to_string(std::random_device{}()));
    const std::string cmd = "/usr/bin/python3 '" + std::string(VG_SOURCE_DIR) +
                            "/tools/make_torchscript_models.py' '" + d.string() + "' 1>&2";
    EXPECT_EQ(std::system(cmd.c_str()), 0);
    return d;
  }();
  return dir;
}

struct Loaded {
  std::unique_ptr<VirtualDevice> device;
  std::unique_ptr<TorchScriptModel> model;
};

Loaded load(const std::string& name, std::int64_t capacity) {
  Loaded out;
  out.device = std::move(VirtualDevice::create(3, capacity)).value();
  DeviceScope scope(out.device.get());
  auto m = TorchScriptModel::load({make_models() / name, out.device.get()});
  EXPECT_TRUE(m.ok()) << m.error().message;
  if (m.ok()) out.model = std::move(m).value();
  return out;
}

std::int64_t measured_peak(Loaded& l, const std::vector<std::vector<std::int64_t>>& shapes) {
  DeviceScope scope(l.device.get());
  l.device->reset_peak();
  const std::int64_t base = l.device->memory().allocated;
  EXPECT_TRUE(l.model->forward_zeros(shapes).ok());
  return l.device->memory().peak_allocated - base;
}

TEST(TensorProfile, HeldOutShapesAreWithinThePredictionAndAtMost25PercentAbove) {
  for (const std::string name : {"image_to_image", "image_classifier", "audio_classifier"}) {
    SCOPED_TRACE(name);
    Loaded l = load(name, std::int64_t{1} << 30);
    ASSERT_TRUE(l.model);
    Result<TensorMemoryProfile> p = [&] {
      DeviceScope scope(l.device.get());
      return measure_tensor_profile(*l.model, *l.device, TensorProfileOptions{8, 1.1});
    }();
    ASSERT_TRUE(p.ok()) << p.error().message;
    EXPECT_GT(p->bytes_per_element, 0);
    // The profile's own held-out runs.
    EXPECT_GE(p->held_out_min_error, 0.0);
    EXPECT_LE(p->held_out_max_error, 0.25);
    // Shapes no profile run used, including odd sizes and batches.
    const std::vector<std::pair<double, std::int64_t>> unseen = {{0.1, 1}, {0.6, 1}, {0.9, 1}, {0.2, 3}, {0.45, 2}};
    for (const auto& [fraction, batch] : unseen) {
      const auto shapes = profile_shapes(l.model->spec(), fraction, batch);
      const std::int64_t measured = measured_peak(l, shapes);
      const std::int64_t predicted = predicted_peak(*p, total_elements(shapes));
      SCOPED_TRACE(shape_text(shapes.front()));
      EXPECT_LE(measured, tensor_cost(*p, total_elements(shapes)));
      EXPECT_LE(measured, predicted);
      EXPECT_LE(static_cast<double>(predicted), 1.25 * static_cast<double>(measured));
    }
  }
}

TEST(TensorProfile, RunsThatDoNotFitAreLeftOut) {
  // 8 MiB: the largest image runs (16 channels at 256 x 256) do not fit.
  Loaded l = load("image_to_image", std::int64_t{8} << 20);
  ASSERT_TRUE(l.model);
  DeviceScope scope(l.device.get());
  auto p = measure_tensor_profile(*l.model, *l.device, TensorProfileOptions{8, 1.0});
  ASSERT_TRUE(p.ok()) << p.error().message;
  EXPECT_LT(p->samples.size(), 8u);
  EXPECT_GE(p->samples.size(), 2u);
}

}  // namespace
}  // namespace vg
