// The request log: one JSON line per finished completion request and per
// decoded KServe v2 infer request, written at info level ("request {...}").
// Internal to src/http; any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "common/clock.hpp"

namespace vg::httpd {

struct RequestLogLine {
  std::string id;
  std::string model;
  std::string route;
  bool stream = false;
  int status = 0;  ///< HTTP status answered (200 for a stream that started)
  int prompt_tokens = 0;
  int completion_tokens = 0;
  std::int64_t reserved_bytes = 0;  ///< the request's admission cost
  double queue_ms = 0;
  double prefill_ms = 0;
  double decode_ms = 0;
  double duration_ms = 0;  ///< from the request's arrival to its end
  std::string outcome;     ///< completed, failed or cancelled
  std::string reason;      ///< finish_reason, or the error type
  // Traffic policies; each written only when set.
  std::string key_id;       ///< the API key's id (8 hex characters of its SHA-256), never the key
  std::string priority;     ///< the class it was queued with: low, normal, high
  std::string idempotency;  ///< with an Idempotency-Key: new, attached or replayed
  std::string retry;        ///< a retry that took its booked place: claimed by token, idempotency_key or body
  // Tensor (TorchScript) requests; each written only when set.
  std::optional<double> compute_ms;   ///< lease granted -> outputs (batching delay included)
  std::optional<int> batch_requests;  ///< requests in the forward pass that computed it
  /// Only with --log-request-text.
  std::optional<std::variant<std::string, std::vector<std::int32_t>>> prompt;
  std::optional<std::string> output;
};

/// The line's JSON object (always valid JSON: strings are sanitized to UTF-8).
std::string encode_request_log(const RequestLogLine& line);

/// Writes "request <json>" at info level.
void log_request(const RequestLogLine& line);

/// Ends `line`: sets outcome, reason, status and duration_ms (from `start`,
/// the request's arrival, to now), then writes it (log_request).
void log_request_end(RequestLogLine& line, TimePoint start, std::string outcome, std::string reason, int status);

}  // namespace vg::httpd
