// TensorModelSpec: strict config.json validation of TorchScript folders and
// the request checks (each refusal names the input and what is wrong).
#include <gtest/gtest.h>

#include "model/tensor_spec.hpp"

namespace vg {
namespace {

const char* kImage = R"({"model_type": "torchscript",
  "inputs":  [{"name": "image", "dtype": "float32", "shape": ["batch", 3, "height", "width"]}],
  "outputs": [{"name": "logits", "dtype": "float32", "shape": ["batch", 10]}],
  "dims": {"batch": {"max": 16}, "height": {"min": 8, "max": 512}, "width": {"min": 8, "max": 512}},
  "pad": []})";

TensorModelSpec image_spec() {
  auto spec = parse_tensor_model_spec(kImage, "config.json");
  EXPECT_TRUE(spec.ok()) << spec.error().message;
  return *spec;
}

std::string spec_error(const std::string& text) {
  auto spec = parse_tensor_model_spec(text, "m/config.json");
  if (spec.ok()) return "(accepted)";
  EXPECT_EQ(spec.error().code, ErrorCode::kModelLoad);
  return spec.error().message;
}

std::string replace(std::string s, const std::string& from, const std::string& to) {
  const auto at = s.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return s.replace(at, from.size(), to);
}

TEST(TensorSpec, ParsesTheDeclaredForm) {
  const TensorModelSpec spec = image_spec();
  ASSERT_EQ(spec.inputs.size(), 1u);
  EXPECT_EQ(spec.inputs[0].name, "image");
  EXPECT_EQ(shape_text(spec.inputs[0]), "[batch, 3, height, width]");
  EXPECT_TRUE(spec.batched);
  EXPECT_EQ(spec.max_batch(), 16);
  ASSERT_NE(spec.dim("height"), nullptr);
  EXPECT_EQ(spec.dim("height")->min, 8);
  EXPECT_EQ(spec.dim("height")->max, 512);
  EXPECT_EQ(spec.dim("batch")->min, 1);
}

TEST(TensorSpec, RefusesWhatItCannotServeByName) {
  EXPECT_NE(spec_error(replace(kImage, "\"torchscript\"", "\"gpt2\"")).find("'model_type'"), std::string::npos);
  EXPECT_NE(spec_error(replace(kImage, "\"dtype\": \"float32\", \"shape\": [\"batch\", 3",
                               "\"dtype\": \"int64\", \"shape\": [\"batch\", 3"))
                .find("inputs[0].dtype' is 'int64'"),
            std::string::npos);
  EXPECT_NE(spec_error(replace(kImage, "\"pad\": []", "\"pads\": []")).find("unknown key 'pads'"), std::string::npos);
  EXPECT_NE(spec_error(replace(kImage, "\"height\": {\"min\": 8, \"max\": 512}", "\"height\": {\"min\": 8}"))
                .find("'dims.height.max'"),
            std::string::npos);
  EXPECT_NE(spec_error(replace(kImage, "\"height\": {\"min\": 8, \"max\": 512}, ", ""))
                .find("dimension 'height' has no range"),
            std::string::npos);
  EXPECT_NE(spec_error(replace(kImage, "[\"batch\", 3, \"height\"", "[3, \"batch\", \"height\""))
                .find("'batch' must be the first"),
            std::string::npos);
  EXPECT_NE(spec_error(replace(kImage, "\"min\": 8, \"max\": 512}, \"width\"", "\"min\": 9, \"max\": 4}, \"width\""))
                .find("max 4 < min 9"),
            std::string::npos);
  EXPECT_NE(spec_error(replace(kImage, "[\"batch\", 10]", "[\"batch\", \"classes\"]")).find("'classes'"),
            std::string::npos);
  EXPECT_NE(spec_error(replace(kImage, "[\"batch\", 3, ", "[\"batch\", 0, ")).find("inputs[0].shape[1]"),
            std::string::npos);
  EXPECT_NE(spec_error("[1, 2]").find("JSON object"), std::string::npos);
  EXPECT_NE(spec_error("{").find("not valid JSON"), std::string::npos);
}

TEST(TensorSpec, PadNamesInputDimensionsOtherThanBatch) {
  auto spec = parse_tensor_model_spec(replace(kImage, "\"pad\": []", "\"pad\": [\"width\", \"height\"]"), "c.json");
  ASSERT_TRUE(spec.ok()) << spec.error().message;
  EXPECT_EQ(spec->pad, (std::vector<std::string>{"width", "height"}));
  EXPECT_TRUE(spec->paddable("width"));
  EXPECT_FALSE(spec->paddable("batch"));
  EXPECT_FALSE(spec->paddable(0, 0));  // batch
  EXPECT_FALSE(spec->paddable(0, 1));  // the fixed 3
  EXPECT_TRUE(spec->paddable(0, 2));
  EXPECT_TRUE(spec->paddable(0, 3));
  EXPECT_FALSE(spec->paddable(1, 0));  // no second input
  EXPECT_TRUE(image_spec().pad.empty());

  EXPECT_NE(spec_error(replace(kImage, "\"pad\": []", "\"pad\": [\"batch\"]")).find("'pad' names 'batch'"),
            std::string::npos);
  EXPECT_NE(spec_error(replace(kImage, "\"pad\": []", "\"pad\": [\"depth\"]")).find("'depth'"), std::string::npos);
  EXPECT_NE(spec_error(replace(kImage, "\"pad\": []", "\"pad\": [\"width\", \"width\"]")).find("twice"),
            std::string::npos);
  EXPECT_NE(spec_error(replace(kImage, "\"pad\": []", "\"pad\": [3]")).find("'pad' entries"), std::string::npos);
  EXPECT_NE(spec_error(replace(kImage, "\"pad\": []", "\"pad\": \"width\"")).find("'pad' must be an array"),
            std::string::npos);
  const std::string unbatched = R"({"model_type": "torchscript",
    "inputs": [{"name": "x", "dtype": "float32", "shape": [3, "n"]}],
    "outputs": [{"name": "y", "dtype": "float32", "shape": [3, "n"]}],
    "dims": {"n": {"max": 8}}, "pad": ["n"]})";
  EXPECT_NE(spec_error(unbatched).find("needs a 'batch' dimension"), std::string::npos);
}

HostTensor image(std::vector<std::int64_t> shape, std::string name = "image") {
  HostTensor t;
  t.name = std::move(name);
  t.shape = std::move(shape);
  t.data.assign(static_cast<std::size_t>(t.elements()), 0.5f);
  return t;
}

std::string input_error(std::vector<HostTensor> inputs, std::vector<std::string> dtypes = {"FP32"}) {
  Status st = check_inputs(image_spec(), inputs, dtypes);
  if (st.ok()) return "(accepted)";
  EXPECT_EQ(st.error().code, ErrorCode::kInvalidRequest);
  return st.error().message;
}

TEST(TensorSpec, ChecksRequestInputsNamingTheInput) {
  EXPECT_EQ(input_error({image({2, 3, 16, 24})}), "(accepted)");
  EXPECT_NE(input_error({image({2, 3, 16, 24})}, {"INT64"}).find("input 'image': datatype 'INT64'"),
            std::string::npos);
  EXPECT_NE(input_error({image({3, 16, 24})}).find("input 'image': rank 3"), std::string::npos);
  EXPECT_NE(input_error({image({1, 4, 16, 24})}).find("input 'image': dimension 1 is 4"), std::string::npos);
  EXPECT_NE(input_error({image({1, 3, 4, 24})}).find("input 'image': dimension 'height' is 4, outside its range [8, 512]"),
            std::string::npos);
  EXPECT_NE(input_error({image({17, 3, 8, 8})}).find("dimension 'batch' is 17"), std::string::npos);
  HostTensor short_data = image({1, 3, 8, 8});
  short_data.data.pop_back();
  EXPECT_NE(input_error({short_data}).find("input 'image': data has 191 values, shape [1, 3, 8, 8] needs 192"),
            std::string::npos);
  EXPECT_NE(input_error({image({1, 3, 8, 8}, "picture")}).find("input 'picture': unknown input"), std::string::npos);
  EXPECT_NE(input_error({}).find("input 'image': missing"), std::string::npos);
  EXPECT_NE(input_error({image({1, 3, 8, 8}), image({1, 3, 8, 8})}, {"FP32", "FP32"}).find("given twice"),
            std::string::npos);
}

TEST(TensorSpec, BindShapeUsesBoundValuesElseMax) {
  const TensorModelSpec spec = image_spec();
  const std::vector<std::pair<std::string, std::int64_t>> bound = {{"batch", 2}, {"height", 9}};
  EXPECT_EQ(bind_shape(spec, spec.inputs[0], bound), (std::vector<std::int64_t>{2, 3, 9, 512}));
  EXPECT_EQ(bind_shape(spec, spec.outputs[0], bound), (std::vector<std::int64_t>{2, 10}));
}

}  // namespace
}  // namespace vg
