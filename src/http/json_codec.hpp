// JSON codec of the HTTP API: decodes request bodies into plain structs with
// OpenAI semantics and encodes responses, errors and SSE chunks. Pure
// functions with no I/O and no shared state: callable from any thread.
// Beast-free and JSON-type-free in its interface, so it can be fuzzed alone.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "api/events.hpp"
#include "api/types.hpp"
#include "common/error.hpp"

namespace vg {

/// Decodes a POST /v1/completions body. Unknown fields are ignored; a missing
/// max_tokens means 16. Errors: kInvalidRequest with a message naming the field.
Result<CompletionRequest> decode_completion_request(std::string_view body);

/// Decodes a POST /infer body ({prompt, max_tokens} plus optional sampling
/// fields, same rules as /v1/completions). `stream` is ignored: /infer never streams.
Result<CompletionRequest> decode_infer_request(std::string_view body);

/// `{"error":{"type","message"[,"needed_bytes","budget_bytes","retry_after_s"]}}`.
std::string encode_error(const Error& error);

/// One finished completion (OpenAI `text_completion`).
struct CompletionBody {
  std::string id;  ///< "cmpl-..."
  std::string model;
  std::int64_t created = 0;  ///< unix seconds
  std::string text;
  std::string finish_reason;
  Usage usage;
};
std::string encode_completion(const CompletionBody& body);

/// One SSE chunk of a streaming completion. finish_reason is null until the
/// last chunk; usage is present on the last chunk only.
struct CompletionChunk {
  std::string id;
  std::string model;
  std::int64_t created = 0;
  std::string text;
  std::optional<std::string> finish_reason;
  std::optional<Usage> usage;
};
std::string encode_completion_chunk(const CompletionChunk& chunk);

/// One choice of a completion response or SSE chunk.
struct CompletionChoice {
  int index = 0;
  std::string text;
  std::optional<std::string> finish_reason;  ///< null until the choice's last chunk
  /// With logprobs requested: the tokens of `text` with their logprobs and
  /// each one's offset in the choice's whole text (characters, echoed prompt
  /// included); nullopt: "logprobs": null.
  std::optional<std::vector<TokenLogprobs>> logprobs{};
  std::vector<std::int64_t> text_offset{};  ///< one per logprobs entry
};
/// A completion (`text_completion`) body or chunk with any number of choices.
struct CompletionResponse {
  std::string id;
  std::string model;
  std::int64_t created = 0;
  std::vector<CompletionChoice> choices{};
  std::optional<Usage> usage{};
  bool usage_null = false;  ///< write "usage": null when usage is absent (stream_options.include_usage)
};
std::string encode_completion_response(const CompletionResponse& response);

/// The short /infer answer: `{result, latency_ms, queue_ms, finish_reason, usage}`.
struct InferBody {
  std::string result;
  double latency_ms = 0;
  double queue_ms = 0;
  std::string finish_reason;
  Usage usage;
};
std::string encode_infer_response(const InferBody& body);

/// GET /v1/models: `{"object":"list","data":[...]}`.
std::string encode_models(const std::vector<ModelInfo>& models);
/// GET /v1/models/{id}: one model object, as in the list (OpenAI's retrieve).
std::string encode_model(const ModelInfo& model);

/// GET /v1/admission.
std::string encode_admission(const AdmissionState& state);
/// GET /v1/engines: {"object": "list", "data": [{address, device, models, pid,
/// state, restarts, started_at, last_exit, reason}]}.
std::string encode_engines(const std::vector<EngineInfo>& engines);

/// GET /health body (and other plain status bodies): `{"status":...[,"reason":...]}`.
std::string encode_status(std::string_view status, std::string_view reason = {});

/// GET /ready body: `{"status":"ready"|"not_ready"[,"reason"],"devices":[{"name","state"[,"reason"]}]}`;
/// not ready exactly when `reason` is non-empty. A device's reason is shown
/// when it has one (not_ready or unhealthy).
std::string encode_ready(std::string_view reason, const std::vector<DeviceState>& devices);

/// One SSE event carrying `payload`: "data: <payload>\n\n". The payload must not
/// contain a newline (serialized JSON never does).
std::string sse_data(std::string_view payload);

}  // namespace vg
