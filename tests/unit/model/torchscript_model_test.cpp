// TorchScriptModel: the test models of tools/make_torchscript_models.py
// loaded on a virtual device give the output the Python TorchScript module
// gives (reference.json), alone and batched with another request; broken
// folders fail to load with kModelLoad naming what is wrong; a forward pass
// that does not fit is kOutOfMemory.
#include <gtest/gtest.h>

#include <boost/json.hpp>
#include <fstream>
#include <sstream>

#include "device/device.hpp"
#include "model/torchscript_model.hpp"
#include "model_test_util.hpp"

namespace vg {
namespace {

using testing::TempDir;

/// The test models, written once for the whole suite.
class TorchScriptModels : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    ASSERT_EQ(testing::run_python_tool("make_torchscript_models.py", "'" + dir_->path().string() + "' --reference"), 0);
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static std::filesystem::path model(const std::string& name) { return dir_->path() / name; }
  static TempDir* dir_;
};
TempDir* TorchScriptModels::dir_ = nullptr;

struct Reference {
  HostTensor input;
  HostTensor output;
};

HostTensor read_tensor(const boost::json::object& o) {
  HostTensor t;
  t.name = std::string(o.at("name").as_string());
  for (const auto& d : o.at("shape").as_array()) t.shape.push_back(d.to_number<std::int64_t>());
  for (const auto& v : o.at("data").as_array()) t.data.push_back(v.to_number<float>());
  return t;
}

Reference read_reference(const std::filesystem::path& dir) {
  std::ifstream in(dir / "reference.json");
  std::stringstream text;
  text << in.rdbuf();
  const boost::json::value v = boost::json::parse(text.str());
  return Reference{read_tensor(v.at("inputs").as_array()[0].as_object()),
                   read_tensor(v.at("outputs").as_array()[0].as_object())};
}

std::unique_ptr<VirtualDevice> device(std::int64_t bytes = std::int64_t{256} << 20) {
  auto d = VirtualDevice::create(7, bytes);
  EXPECT_TRUE(d.ok());
  return std::move(d).value();
}

float max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  return testing::max_abs_diff(a, b);
}

TEST_F(TorchScriptModels, ForwardEqualsThePythonModule) {
  for (const std::string name : {"image_classifier", "image_to_image", "audio_classifier"}) {
    SCOPED_TRACE(name);
    auto dev = device();
    DeviceScope scope(dev.get());
    const std::int64_t before = dev->memory().used;
    auto m = TorchScriptModel::load({model(name), dev.get()});
    ASSERT_TRUE(m.ok()) << m.error().message;
    EXPECT_GE(dev->memory().used - before, (*m)->parameter_bytes());  // the weights live on the device
    const Reference ref = read_reference(model(name));
    const TensorInputs one{&ref.input};
    auto out = (*m)->forward(std::span<const TensorInputs>(&one, 1));
    ASSERT_TRUE(out.ok()) << out.error().message;
    ASSERT_EQ(out->size(), 1u);
    ASSERT_EQ((*out)[0].size(), 1u);
    EXPECT_EQ((*out)[0][0].shape, ref.output.shape);
    EXPECT_LT(max_diff((*out)[0][0].data, ref.output.data), 1e-5f);

    // Batched with a second request of another batch size: each gets its own rows.
    HostTensor other = ref.input;
    other.shape.front() = 1;
    other.data.resize(static_cast<std::size_t>(other.elements()));
    for (float& x : other.data) x = -x;
    const std::vector<TensorInputs> two{{&other}, {&ref.input}};
    auto batched = (*m)->forward(two);
    ASSERT_TRUE(batched.ok()) << batched.error().message;
    ASSERT_EQ(batched->size(), 2u);
    EXPECT_EQ((*batched)[1][0].shape, ref.output.shape);
    EXPECT_LT(max_diff((*batched)[1][0].data, ref.output.data), 1e-5f);
    EXPECT_EQ((*batched)[0][0].shape.front(), 1);
  }
}

TEST_F(TorchScriptModels, RequestsOfDifferentShapesAreNotBatched) {
  auto dev = device();
  DeviceScope scope(dev.get());
  auto m = TorchScriptModel::load({model("image_to_image"), dev.get()});
  ASSERT_TRUE(m.ok()) << m.error().message;
  HostTensor a{"image", {1, 3, 8, 8}, std::vector<float>(192, 0.f)};
  HostTensor b{"image", {1, 3, 8, 16}, std::vector<float>(384, 0.f)};
  const std::vector<TensorInputs> batch{{&a}, {&b}};
  auto out = (*m)->forward(batch);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.error().code, ErrorCode::kInvalidRequest);
}

TEST_F(TorchScriptModels, AForwardPassThatDoesNotFitIsOutOfMemory) {
  auto dev = device(std::int64_t{2} << 20);
  DeviceScope scope(dev.get());
  auto m = TorchScriptModel::load({model("image_to_image"), dev.get()});
  ASSERT_TRUE(m.ok()) << m.error().message;
  const std::int64_t used = dev->memory().used;
  const std::vector<std::vector<std::int64_t>> big{{16, 3, 256, 256}};
  Status st = (*m)->forward_zeros(big);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, ErrorCode::kOutOfMemory);
  EXPECT_EQ(dev->memory().used, used);  // nothing kept
}

std::string script_load_error(const std::filesystem::path& dir) {
  auto dev = device();
  DeviceScope scope(dev.get());
  auto m = TorchScriptModel::load({dir, dev.get()});
  if (m.ok()) return "(loaded)";
  EXPECT_EQ(m.error().code, ErrorCode::kModelLoad);
  return m.error().message;
}

void write_config(const std::filesystem::path& dir, const std::string& output_shape) {
  std::ofstream(dir / "config.json")
      << R"({"model_type": "torchscript", "inputs": [{"name": "image", "dtype": "float32", "shape": ["batch", 3, "h", "w"]}],
            "outputs": [{"name": "logits", "dtype": "float32", "shape": )"
      << output_shape << R"(}], "dims": {"batch": {"max": 4}, "h": {"min": 8, "max": 32}, "w": {"min": 8, "max": 32}}})";
}

TEST_F(TorchScriptModels, BrokenFoldersFailToLoadSayingWhy) {
  TempDir dir;
  write_config(dir.path(), R"(["batch", 10])");
  EXPECT_NE(script_load_error(dir.path()).find("model.pt: missing"), std::string::npos);

  std::ofstream(dir / "model.pt") << "not a zip archive";
  EXPECT_NE(script_load_error(dir.path()).find("torch::jit::load"), std::string::npos);

  std::filesystem::copy_file(model("image_classifier") / "model.pt", dir / "model.pt",
                             std::filesystem::copy_options::overwrite_existing);
  EXPECT_EQ(script_load_error(dir.path()), "(loaded)");
  write_config(dir.path(), R"(["batch", 12])");
  EXPECT_NE(
      script_load_error(dir.path()).find("output 'logits' has shape [1, 10] where config.json declares [batch, 12]"),
      std::string::npos);
}

}  // namespace
}  // namespace vg
