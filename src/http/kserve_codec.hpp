// The KServe v2 (Triton) inference protocol over HTTP/JSON: decoding an
// infer request body into a TensorInferRequest, and encoding infer
// responses, model metadata and the health answers. Pure functions; any
// thread. Internal to src/http.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.hpp"
#include "engine/tensor_engine.hpp"
#include "server/api.hpp"

namespace vg::httpd {

/// Decodes the JSON body of POST /v2/models/{model}/infer: "inputs" (each
/// {name, shape, datatype, data}, data flat or nested row-major), optional
/// "id", "outputs" ([{name}]) and "parameters" (vramgate: "timeout" seconds,
/// "priority"). Errors: kInvalidRequest naming the field or the input: bad
/// JSON, missing or mistyped fields, unknown fields, negative dimensions,
/// non-numeric data, and the binary tensor extension's parameters
/// (binary_data, binary_data_size, binary_data_output), which are not served.
Result<TensorInferRequest> decode_tensor_infer_request(std::string_view body, const std::string& model);

/// The infer response: {model_name, model_version, id, outputs: [{name,
/// datatype, shape, data}], parameters: {batch_requests, queue_ms,
/// compute_ms, reserved_bytes}}. `only` (non-empty): the outputs to include.
std::string encode_tensor_infer_response(const std::string& model, const std::string& id, const TensorResult& result,
                                         const std::vector<std::string>& only, std::int64_t reserved_bytes);

/// GET /v2/models/{name}: {name, versions, platform, inputs, outputs} with
/// -1 for variable dimensions, plus vramgate's dims, max_batch, devices,
/// budget_bytes and memory_profile (the fit and every profile run).
std::string encode_tensor_model_metadata(const TensorModelInfo& info);

/// GET /v2: {name, version, extensions}.
std::string encode_server_metadata();

}  // namespace vg::httpd
