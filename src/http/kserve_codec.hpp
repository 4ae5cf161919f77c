// The KServe v2 (Triton) inference protocol over HTTP/JSON: decoding an
// infer request body into a TensorInferRequest, and encoding infer
// responses, model metadata and the health answers; with Triton's binary
// tensor data extension (a JSON header of Inference-Header-Content-Length
// bytes, then each binary tensor's raw little-endian bytes in order). Pure
// functions; any thread. Internal to src/http.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "api/types.hpp"
#include "common/error.hpp"

namespace vg::httpd {

/// The one version every model has: GET /v2/models/{name} lists it in
/// "versions", infer responses carry it as "model_version", and
/// /v2/models/{name}/versions/{version}/... routes only for it.
inline constexpr std::string_view kModelVersion = "1";

/// Decodes the body of POST /v2/models/{model}/infer: "inputs" (each {name,
/// shape, datatype, data}, data flat or nested row-major, or instead
/// "parameters": {"binary_data_size": N}), optional "id", "outputs"
/// ([{name, parameters?: {binary_data}}]) and "parameters" (vramgate:
/// "timeout" seconds, "priority"; the extension's "binary_data_output").
///
/// `header_length`: the Inference-Header-Content-Length header's value when
/// the request has one. Then the body's first that many bytes are the JSON
/// and the rest is binary tensor data: the inputs with binary_data_size, in
/// order, each exactly that many bytes (FP32: 4 per element, little-endian).
///
/// Errors: kInvalidRequest naming the field or the input: bad JSON, missing
/// or mistyped fields, unknown fields, negative dimensions, non-numeric or
/// non-finite data; for the extension a header that is not a byte count or
/// exceeds the body, binary_data_size without the header or together with
/// "data", a size other than shape x datatype size, sizes that run past the
/// body or do not add up to it, a binary datatype other than FP32 (BYTES is
/// refused by name).
Result<TensorInferRequest> decode_tensor_infer_request(std::string_view body, const std::string& model,
                                                       std::optional<std::string_view> header_length = std::nullopt);

/// An encoded infer response.
struct InferResponseBody {
  std::string body;
  /// Bytes of JSON at the body's start; < body.size() exactly when some
  /// output is binary (then send Inference-Header-Content-Length: json_bytes
  /// and Content-Type: application/octet-stream).
  std::size_t json_bytes = 0;
  bool binary() const { return json_bytes < body.size(); }
};

/// Which outputs a response carries, and how.
struct OutputSelection {
  std::vector<std::string> only;    ///< non-empty: just these outputs
  std::vector<std::string> binary;  ///< these as raw bytes (binary tensor extension)
  bool all_binary = false;          ///< every output as raw bytes
};

/// The infer response: {model_name, model_version, id, outputs: [{name,
/// datatype, shape, data}], parameters: {batch_requests, batch_shape,
/// batch_cost_bytes, queue_ms, compute_ms, reserved_bytes}}. A binary output
/// has "parameters": {"binary_data_size": N} instead of "data", and its N
/// bytes (FP32 little-endian, row-major) follow the JSON, in output order.
InferResponseBody encode_tensor_infer_response(const std::string& model, const std::string& id,
                                               const TensorResult& result, const OutputSelection& outputs,
                                               std::int64_t reserved_bytes);

/// GET /v2/models/{name}: {name, versions, platform, inputs, outputs} with
/// -1 for variable dimensions, plus vramgate's dims, max_batch, devices,
/// budget_bytes and memory_profile (the fit and every profile run).
std::string encode_tensor_model_metadata(const TensorModelInfo& info);

/// GET /v2: {name, version, extensions}.
std::string encode_server_metadata();

}  // namespace vg::httpd
