#include "common/error.hpp"

#include <algorithm>
#include <cmath>

#include "common/decimal.hpp"

namespace vg {

int http_status(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidRequest: return 400;
    case ErrorCode::kUnauthorized: return 401;
    case ErrorCode::kForbidden: return 403;
    case ErrorCode::kModelNotFound: return 404;
    case ErrorCode::kNotFound: return 404;
    case ErrorCode::kMethodNotAllowed: return 405;
    case ErrorCode::kRequestTimeout: return 408;
    case ErrorCode::kBodyTooLarge: return 413;
    case ErrorCode::kUriTooLong: return 414;
    case ErrorCode::kHeaderTooLarge: return 431;
    case ErrorCode::kExceedsDeviceMemory: return 413;
    case ErrorCode::kIdempotencyKeyReused: return 422;
    case ErrorCode::kRateLimited: return 429;
    case ErrorCode::kOutOfMemory: return 500;
    case ErrorCode::kInternal: return 500;
    case ErrorCode::kOverloaded: return 503;
    case ErrorCode::kTimeout: return 504;
    case ErrorCode::kCancelled: return 499;
    case ErrorCode::kModelLoad: return 500;
    case ErrorCode::kConfig: return 500;
    case ErrorCode::kEngineCrashed: return 500;
    case ErrorCode::kDeviceFault: return 500;
  }
  return 500;
}

const char* error_type(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidRequest: return "invalid_request";
    case ErrorCode::kUnauthorized: return "unauthorized";
    case ErrorCode::kForbidden: return "forbidden";
    case ErrorCode::kModelNotFound: return "model_not_found";
    case ErrorCode::kNotFound: return "not_found";
    case ErrorCode::kMethodNotAllowed: return "method_not_allowed";
    case ErrorCode::kRequestTimeout: return "request_timeout";
    case ErrorCode::kBodyTooLarge: return "body_too_large";
    case ErrorCode::kUriTooLong: return "uri_too_long";
    case ErrorCode::kHeaderTooLarge: return "header_too_large";
    case ErrorCode::kExceedsDeviceMemory: return "exceeds_device_memory";
    case ErrorCode::kIdempotencyKeyReused: return "idempotency_key_reused";
    case ErrorCode::kRateLimited: return "rate_limited";
    case ErrorCode::kOutOfMemory: return "out_of_memory";
    case ErrorCode::kInternal: return "internal_error";
    case ErrorCode::kOverloaded: return "overloaded";
    case ErrorCode::kTimeout: return "timeout";
    case ErrorCode::kCancelled: return "cancelled";
    case ErrorCode::kModelLoad: return "model_load_error";
    case ErrorCode::kConfig: return "config_error";
    case ErrorCode::kEngineCrashed: return "engine_crashed";
    case ErrorCode::kDeviceFault: return "device_fault";
  }
  return "internal_error";
}

std::string api_code(const Error& error) {
  if (!error.api_code.empty()) return error.api_code;
  switch (error.code) {
    case ErrorCode::kRateLimited: return "rate_limit_exceeded";
    case ErrorCode::kUnauthorized: return "invalid_api_key";
    case ErrorCode::kModelNotFound: return "model_not_found";
    default: return error_type(error.code);
  }
}

Error shutting_down(std::optional<double> retry_after_s) {
  Error e(ErrorCode::kOverloaded, "server is shutting down");
  e.retry_after_s = retry_after_s;
  return e;
}

std::int64_t retry_after_ms(double seconds) {
  if (std::isnan(seconds)) return 1;
  return static_cast<std::int64_t>(std::clamp(std::ceil(seconds * 1e3), 1.0, 86400000.0));
}

std::int64_t retry_after_whole_s(double seconds) {
  if (std::isnan(seconds)) return 1;
  return static_cast<std::int64_t>(std::clamp(std::ceil(seconds), 1.0, 86400.0));
}

bool retry_can_help(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidRequest:
    case ErrorCode::kUnauthorized:
    case ErrorCode::kModelNotFound:
    case ErrorCode::kNotFound:
    case ErrorCode::kMethodNotAllowed:
    case ErrorCode::kBodyTooLarge:
    case ErrorCode::kUriTooLong:
    case ErrorCode::kHeaderTooLarge:
    case ErrorCode::kExceedsDeviceMemory:
    case ErrorCode::kIdempotencyKeyReused:
    case ErrorCode::kEngineCrashed:  // the request itself brings the engine down
      return false;
    default:
      return true;
  }
}

Error exceeds_device_memory(std::int64_t needed_bytes, std::int64_t budget_bytes, bool several) {
  Error e(ErrorCode::kExceedsDeviceMemory,
          "request needs " + format_bytes(needed_bytes) + " (" + std::to_string(needed_bytes) + " bytes) but the " +
              (several ? "largest device budget" : "device budget") + " is " + format_bytes(budget_bytes) + " (" +
              std::to_string(budget_bytes) + " bytes): it cannot run even on an empty device");
  e.needed_bytes = needed_bytes;
  e.budget_bytes = budget_bytes;
  return e;
}

Error exceeds_context_length(std::int64_t prompt_tokens, std::int64_t max_tokens, const std::string& model,
                             std::int64_t context_length) {
  Error e(ErrorCode::kInvalidRequest,
          "prompt (" + std::to_string(prompt_tokens) + " tokens) + max_tokens (" + std::to_string(max_tokens) +
              ") = " + std::to_string(prompt_tokens + max_tokens) + " exceeds the context length of model '" + model +
              "' (" + std::to_string(context_length) + " tokens)");
  e.param = "max_tokens";
  e.api_code = "context_length_exceeded";
  return e;
}

}  // namespace vg
