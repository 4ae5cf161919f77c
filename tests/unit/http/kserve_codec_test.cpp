// KServe v2 JSON codec: infer requests decoded (flat and nested data, id,
// outputs, parameters), refusals naming the field or input, the binary
// extension's parameters refused by name, responses in plain decimals.
#include <gtest/gtest.h>

#include <boost/json.hpp>

#include "http/kserve_codec.hpp"

namespace vg::httpd {
namespace {

std::string refusal(std::string_view body) {
  auto r = decode_tensor_infer_request(body, "m");
  if (r.ok()) return "(accepted)";
  EXPECT_EQ(r.error().code, ErrorCode::kInvalidRequest);
  return r.error().message;
}

TEST(KserveCodec, DecodesFlatAndNestedData) {
  auto r = decode_tensor_infer_request(
      R"({"id": "q1", "inputs": [{"name": "a", "shape": [2, 2], "datatype": "FP32", "data": [[1, 2], [3, 4.5]]},
                                {"name": "b", "shape": [3], "datatype": "INT64", "data": [1, 2, 3]}],
          "outputs": [{"name": "y"}], "parameters": {"timeout": 2.5, "priority": "high"}})",
      "model");
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->model, "model");
  EXPECT_EQ(r->id, "q1");
  ASSERT_EQ(r->inputs.size(), 2u);
  EXPECT_EQ(r->inputs[0].shape, (std::vector<std::int64_t>{2, 2}));
  EXPECT_EQ(r->inputs[0].data, (std::vector<float>{1, 2, 3, 4.5f}));
  EXPECT_EQ(r->dtypes, (std::vector<std::string>{"FP32", "INT64"}));  // the model check refuses INT64 by name
  EXPECT_EQ(r->outputs, std::vector<std::string>{"y"});
  EXPECT_DOUBLE_EQ(*r->timeout_s, 2.5);
  EXPECT_EQ(*r->priority, Priority::kHigh);
}

TEST(KserveCodec, RefusalsNameTheFieldOrInput) {
  EXPECT_NE(refusal("{").find("not valid JSON"), std::string::npos);
  EXPECT_NE(refusal(R"({"inputs": []})").find("'inputs'"), std::string::npos);
  EXPECT_NE(refusal(R"({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}], "model": 1})")
                .find("unknown field 'model'"),
            std::string::npos);
  EXPECT_NE(refusal(R"({"inputs": [{"name": "x", "shape": [-1], "datatype": "FP32", "data": [1]}]})")
                .find("input 'x': 'shape'"),
            std::string::npos);
  EXPECT_NE(refusal(R"({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [true]}]})")
                .find("input 'x': 'data' must hold only numbers"),
            std::string::npos);
  EXPECT_NE(refusal(R"({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1e300]}]})")
                .find("input 'x': 'data' holds a value outside the float32 range"),
            std::string::npos);
  EXPECT_NE(refusal(R"({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1], "dtype": "f"}]})")
                .find("input 'x': unknown field 'dtype'"),
            std::string::npos);
  EXPECT_NE(refusal(R"({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}],
                       "parameters": {"timeout": 0}})")
                .find("'timeout'"),
            std::string::npos);
}

TEST(KserveCodec, TheBinaryExtensionIsRefusedByName) {
  EXPECT_NE(refusal(R"({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [],
                                    "parameters": {"binary_data_size": 4}}]})")
                .find("input 'x' parameter 'binary_data_size'"),
            std::string::npos);
  EXPECT_NE(refusal(R"({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}],
                       "outputs": [{"name": "y", "parameters": {"binary_data": true}}]})")
                .find("output 'y' parameter 'binary_data'"),
            std::string::npos);
  EXPECT_NE(refusal(R"({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}],
                       "parameters": {"binary_data_output": true}})")
                .find("parameter 'binary_data_output'"),
            std::string::npos);
}

TEST(KserveCodec, ResponsesCarryPlainDecimalsAndOnlyTheAskedOutputs) {
  TensorResult result;
  result.outputs.push_back(HostTensor{"y", {1, 3}, {0.000001f, 12345678.0f, -0.5f}});
  result.outputs.push_back(HostTensor{"z", {1}, {1.0f}});
  result.batch_requests = 3;
  const std::string body = encode_tensor_infer_response("m", "q1", result, {"y"}, 4096);
  const auto at = body.find("\"data\":[");
  ASSERT_NE(at, std::string::npos);
  const std::string data_text = body.substr(at, body.find(']', at) - at);
  EXPECT_EQ(data_text.find_first_of("eE"), std::string::npos) << data_text;  // no exponent form
  const boost::json::value v = boost::json::parse(body);
  EXPECT_EQ(v.at("id").as_string(), "q1");
  const auto& outputs = v.at("outputs").as_array();
  ASSERT_EQ(outputs.size(), 1u);
  const auto& data = outputs[0].at("data").as_array();
  EXPECT_FLOAT_EQ(static_cast<float>(data[0].to_number<double>()), 0.000001f);
  EXPECT_FLOAT_EQ(static_cast<float>(data[1].to_number<double>()), 12345678.0f);
  EXPECT_EQ(v.at("parameters").at("batch_requests").to_number<int>(), 3);
  EXPECT_EQ(v.at("parameters").at("reserved_bytes").to_number<int>(), 4096);
}

}  // namespace
}  // namespace vg::httpd
