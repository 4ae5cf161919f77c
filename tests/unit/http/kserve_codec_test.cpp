// KServe v2 codec: infer requests decoded (flat and nested data, id,
// outputs, parameters), refusals naming the field or input, responses in
// plain decimals; the binary tensor data extension both ways, and each way a
// binary body can be wrong refused by name.
#include <gtest/gtest.h>

#include <boost/json.hpp>
#include <limits>

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

TEST(KserveCodec, AnOutputListedTwiceIsRefusedByName) {
  const std::string one = R"({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}], )";
  EXPECT_EQ(refusal(one + R"("outputs": [{"name": "y"}, {"name": "z"}, {"name": "y"}]})"),
            "output 'y' is listed twice in 'outputs'");
  EXPECT_EQ(refusal(one + R"("outputs": [{"name": "y", "parameters": {"binary_data": true}},
                                          {"name": "y", "parameters": {"binary_data": false}}]})"),
            "output 'y' is listed twice in 'outputs'");
  EXPECT_EQ(refusal(one + R"("outputs": [{"name": "y"}, {"name": "z"}]})"), "(accepted)");
}

std::string floats(std::vector<float> v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

/// A binary request: `header` then `tail`, with the header's length.
Result<TensorInferRequest> binary_request(const std::string& header, const std::string& tail) {
  const std::string length = std::to_string(header.size());
  return decode_tensor_infer_request(header + tail, "m", length);
}

std::string binary_refusal(const std::string& header, const std::string& tail) {
  auto r = binary_request(header, tail);
  if (r.ok()) return "(accepted)";
  EXPECT_EQ(r.error().code, ErrorCode::kInvalidRequest);
  return r.error().message;
}

TEST(KserveCodecBinary, DecodesRawLittleEndianTensorsInOrderNextToJsonOnes) {
  const std::string header = R"({"inputs": [
      {"name": "a", "shape": [2, 2], "datatype": "FP32", "parameters": {"binary_data_size": 16}},
      {"name": "j", "shape": [1], "datatype": "FP32", "data": [7]},
      {"name": "b", "shape": [3], "datatype": "FP32", "parameters": {"binary_data_size": 12}}],
    "outputs": [{"name": "y", "parameters": {"binary_data": true}}, {"name": "z", "parameters": {"binary_data": false}}],
    "parameters": {"binary_data_output": false}})";
  auto r = binary_request(header, floats({1, 2, 3, 4.5f}) + floats({-1, 0.25f, 1e-7f}));
  ASSERT_TRUE(r.ok()) << r.error().message;
  ASSERT_EQ(r->inputs.size(), 3u);
  EXPECT_EQ(r->inputs[0].data, (std::vector<float>{1, 2, 3, 4.5f}));
  EXPECT_EQ(r->inputs[1].data, std::vector<float>{7});
  EXPECT_EQ(r->inputs[2].data, (std::vector<float>{-1, 0.25f, 1e-7f}));
  EXPECT_EQ(r->dtypes, (std::vector<std::string>{"FP32", "FP32", "FP32"}));
  EXPECT_EQ(r->outputs, (std::vector<std::string>{"y", "z"}));
  EXPECT_EQ(r->binary_outputs, std::vector<std::string>{"y"});
  EXPECT_FALSE(r->all_outputs_binary);

  // The header alone, with no binary input, is a plain JSON request.
  const std::string plain = R"({"inputs": [{"name": "j", "shape": [1], "datatype": "FP32", "data": [7]}],
                                "parameters": {"binary_data_output": true}})";
  auto p = binary_request(plain, "");
  ASSERT_TRUE(p.ok()) << p.error().message;
  EXPECT_TRUE(p->all_outputs_binary);
}

TEST(KserveCodecBinary, EachInconsistencyIsRefusedNamingTheInput) {
  const auto one = [](const std::string& size, const std::string& shape = "[2]", const std::string& dtype = "FP32") {
    return R"({"inputs": [{"name": "x", "shape": )" + shape + R"(, "datatype": ")" + dtype +
           R"(", "parameters": {"binary_data_size": )" + size + "}}]}";
  };
  EXPECT_NE(binary_refusal(one("4"), floats({1})).find("input 'x': binary_data_size is 4 bytes, shape [2] of FP32 needs 8"),
            std::string::npos);
  EXPECT_NE(binary_refusal(one("12"), floats({1, 2})).find("input 'x': binary_data_size 12 runs past the end"),
            std::string::npos);
  // Sizes that add up to less than the body.
  EXPECT_NE(binary_refusal(one("8"), floats({1, 2, 3})).find("the body has 12 bytes after the JSON header, but the "
                                                             "inputs' binary_data_size add up to 8 (x: 8)"),
            std::string::npos);
  EXPECT_NE(binary_refusal(one("-8"), floats({1, 2})).find("input 'x': parameter 'binary_data_size' must be"),
            std::string::npos);
  EXPECT_NE(binary_refusal(one("\"8\""), floats({1, 2})).find("input 'x': parameter 'binary_data_size'"),
            std::string::npos);
  EXPECT_NE(binary_refusal(one("8", "[2]", "BYTES"), floats({1, 2})).find("input 'x': datatype 'BYTES' is not supported"),
            std::string::npos);
  EXPECT_NE(binary_refusal(one("8", "[2]", "INT32"), floats({1, 2})).find("input 'x': datatype 'INT32' is not served"),
            std::string::npos);
  EXPECT_NE(binary_refusal(one("8", "[1]", "INT32"), floats({1, 2})).find("input 'x': binary_data_size is 8 bytes, "
                                                                          "shape [1] of INT32 needs 4"),
            std::string::npos);
  EXPECT_NE(binary_refusal(one("8", "[2]", "FP99"), floats({1, 2})).find("input 'x': unknown datatype 'FP99'"),
            std::string::npos);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_NE(binary_refusal(one("8"), floats({1, nan})).find("input 'x': binary data holds a NaN"), std::string::npos);
  EXPECT_NE(binary_refusal(R"({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1],
                                           "parameters": {"binary_data_size": 4}}]})",
                           floats({1}))
                .find("input 'x': has both 'data' and parameter 'binary_data_size'"),
            std::string::npos);
  // Bytes after the JSON that no input claims.
  EXPECT_NE(binary_refusal(R"({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}]})", "abcd")
                .find("no input has binary_data_size"),
            std::string::npos);
  // binary_data_size without the header.
  EXPECT_NE(refusal(one("8") + floats({1, 2})).find("not valid JSON"), std::string::npos);
  EXPECT_NE(refusal(one("8")).find("input 'x': parameter 'binary_data_size' needs the header"), std::string::npos);
  // The header's value.
  const std::string body = one("8") + floats({1, 2});
  for (std::string bad : {"", "abc", "-1", "12x", "99999999999999999999999"}) {
    auto r = decode_tensor_infer_request(body, "m", bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.error().message.find("Inference-Header-Content-Length must be a byte count"), std::string::npos)
        << r.error().message;
  }
  auto past = decode_tensor_infer_request(body, "m", std::to_string(body.size() + 1));
  ASSERT_FALSE(past.ok());
  EXPECT_NE(past.error().message.find("but the body has only " + std::to_string(body.size()) + " bytes"),
            std::string::npos);
  auto cut = decode_tensor_infer_request(body, "m", "5");  // the JSON cut short
  ASSERT_FALSE(cut.ok());
  EXPECT_NE(cut.error().message.find("the JSON header (Inference-Header-Content-Length bytes) is not valid JSON"),
            std::string::npos);
  // Output and request flags must be booleans; unknown parameters stay refused.
  EXPECT_NE(refusal(R"({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}],
                       "outputs": [{"name": "y", "parameters": {"binary_data": 1}}]})")
                .find("output 'y' parameter 'binary_data' must be true or false"),
            std::string::npos);
  EXPECT_NE(refusal(R"({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}],
                       "parameters": {"binary_data_output": "yes"}})")
                .find("parameter 'binary_data_output' must be true or false"),
            std::string::npos);
  EXPECT_NE(refusal(R"({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1],
                                    "parameters": {"shared_memory_region": "r"}}]})")
                .find("input 'x' parameter 'shared_memory_region' is not supported"),
            std::string::npos);
}

TEST(KserveCodecBinary, BinaryOutputsFollowTheJsonHeaderInOrder) {
  TensorResult result;
  result.outputs.push_back(HostTensor{"y", {1, 3}, {1.5f, -2.0f, 3.25f}});
  result.outputs.push_back(HostTensor{"z", {1}, {9.0f}});
  result.outputs.push_back(HostTensor{"w", {2}, {4.0f, 5.0f}});
  const InferResponseBody r = encode_tensor_infer_response("m", "", result, {{}, {"w", "y"}, false}, 1);
  ASSERT_TRUE(r.binary());
  const boost::json::value v = boost::json::parse(r.body.substr(0, r.json_bytes));
  const auto& outputs = v.at("outputs").as_array();
  ASSERT_EQ(outputs.size(), 3u);
  EXPECT_EQ(outputs[0].at("parameters").at("binary_data_size").to_number<int>(), 12);
  EXPECT_FALSE(outputs[0].as_object().contains("data"));
  EXPECT_EQ(outputs[1].at("data").as_array().size(), 1u);  // z stays JSON
  EXPECT_EQ(outputs[2].at("parameters").at("binary_data_size").to_number<int>(), 8);
  EXPECT_EQ(r.body.substr(r.json_bytes), floats({1.5f, -2.0f, 3.25f}) + floats({4.0f, 5.0f}));

  const InferResponseBody all = encode_tensor_infer_response("m", "", result, {{"z"}, {}, true}, 1);
  ASSERT_TRUE(all.binary());
  EXPECT_EQ(all.body.substr(all.json_bytes), floats({9.0f}));
  const InferResponseBody none = encode_tensor_infer_response("m", "", result, {}, 1);
  EXPECT_FALSE(none.binary());
  EXPECT_EQ(none.json_bytes, none.body.size());
}

TEST(KserveCodec, ResponsesCarryPlainDecimalsAndOnlyTheAskedOutputs) {
  TensorResult result;
  result.outputs.push_back(HostTensor{"y", {1, 3}, {0.000001f, 12345678.0f, -0.5f}});
  result.outputs.push_back(HostTensor{"z", {1}, {1.0f}});
  result.batch_requests = 3;
  result.batch_shape = {3, 5};
  result.batch_cost_bytes = 8192;
  const std::string body = encode_tensor_infer_response("m", "q1", result, {{"y"}, {}, false}, 4096).body;
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
  EXPECT_EQ(v.at("parameters").at("batch_cost_bytes").to_number<int>(), 8192);
  EXPECT_EQ(v.at("parameters").at("batch_shape").as_array().size(), 2u);
}

}  // namespace
}  // namespace vg::httpd
