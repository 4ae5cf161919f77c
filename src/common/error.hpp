// One error vocabulary for the whole server: ErrorCode, Error and Result<T>.
// Every layer returns these for expected failures; src/http maps them to HTTP
// status and JSON body in one place (http_status() below and http/json_codec).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace vg {

/// Kinds of failure a client or operator can see. The HTTP mapping is in
/// http_status(); the JSON `error.type` string is error_type().
enum class ErrorCode {
  kInvalidRequest,       ///< 400 bad JSON, wrong types, values out of range
  kUnauthorized,         ///< 401 missing or wrong API key
  kForbidden,            ///< 403 a CORS preflight from an origin that is not allowed
  kModelNotFound,        ///< 404 unknown model
  kNotFound,             ///< 404 unknown route
  kMethodNotAllowed,     ///< 405 wrong method on a known route
  kRequestTimeout,       ///< 408 request not received in time
  kBodyTooLarge,         ///< 413 HTTP body over the limit
  kUriTooLong,           ///< 414 request target over the limit
  kHeaderTooLarge,       ///< 431 request header section over the limit
  kExceedsDeviceMemory,  ///< 413 request can never fit, even on an empty device
  kIdempotencyKeyReused, ///< 422 same Idempotency-Key, different body
  kRateLimited,          ///< 429 over the client's rate
  kOutOfMemory,          ///< 500 only under --admission none
  kInternal,             ///< 500 a bug; never a client mistake
  kOverloaded,           ///< 503 queue full, queue wait limit, draining
  kTimeout,              ///< 504 total deadline passed
  kCancelled,            ///< client went away; never sent (there is no one to send it to)
  kModelLoad,            ///< start-up: a model folder or weight file is unusable
  kConfig,               ///< start-up: invalid configuration
  kEngineCrashed,        ///< 500 the engine process died each time it ran this request (--max-crash-retries)
  kDeviceFault,          ///< 500 the device failed a step (a CUDA error other than out of memory); its state is not trusted
};

/// The last ErrorCode, for code that walks them all (the wire codec).
inline constexpr ErrorCode kLastErrorCode = ErrorCode::kDeviceFault;

/// HTTP status code for an error code (the single mapping).
int http_status(ErrorCode code);

/// The `error.type` string of the JSON body, e.g. "invalid_request".
const char* error_type(ErrorCode code);

struct Error;

/// The `error.code` string of the JSON body: `error.api_code` when set,
/// else OpenAI's code where OpenAI has one for the case ("rate_limit_exceeded"
/// 429, "invalid_api_key" 401, "model_not_found" 404), else error_type().
std::string api_code(const Error& error);

/// An expected failure with a human-readable message that states the numbers.
struct Error {
  ErrorCode code = ErrorCode::kInternal;
  std::string message;
  /// Seconds a client should wait before retrying (503/429): `Retry-After`.
  std::optional<double> retry_after_s;
  /// For kExceedsDeviceMemory: bytes the request needs and the device budget.
  std::optional<std::int64_t> needed_bytes;
  std::optional<std::int64_t> budget_bytes;
  /// For kOverloaded: the 1-based place in line the retry was promised, and
  /// the token that claims a booked place (X-Retry-Token; empty when nothing
  /// was booked). retry_after_s is then the promise itself, not rounded.
  std::optional<std::int64_t> retry_position;
  std::string retry_token;
  /// The request field at fault (400s): the error body's "param"
  /// (OpenAI's), e.g. "temperature"; empty: none.
  std::string param;
  /// OpenAI's error code for this case where it has one that the ErrorCode
  /// does not imply ("context_length_exceeded"); empty: api_code()'s by code.
  std::string api_code;

  Error() = default;
  Error(ErrorCode c, std::string msg) : code(c), message(std::move(msg)) {}
};

/// kExceedsDeviceMemory (413): a request that needs `needed_bytes` cannot
/// run even on an empty device, the largest budget being `budget_bytes`;
/// `several`: that budget is the largest of several devices.
Error exceeds_device_memory(std::int64_t needed_bytes, std::int64_t budget_bytes, bool several);

/// kInvalidRequest (400): a prompt of `prompt_tokens` tokens plus
/// `max_tokens` does not fit the context length of `model` (tokens).
Error exceeds_context_length(std::int64_t prompt_tokens, std::int64_t max_tokens, const std::string& model,
                             std::int64_t context_length);

/// kOverloaded (503) "server is shutting down": the server is draining or
/// stopping and takes no new work. `retry_after_s` is the Retry-After it
/// carries: 1 s for refusals and for the work failed at shutdown; none
/// (nullopt) where the gateway fails its requests on the way out.
Error shutting_down(std::optional<double> retry_after_s = 1.0);

/// A retry wait in whole milliseconds, rounded up (retry-after-ms), clamped
/// to [1, 86400000]; NaN gives 1.
std::int64_t retry_after_ms(double seconds);
/// The same in whole seconds, rounded up (Retry-After), clamped to [1, 86400].
std::int64_t retry_after_whole_s(double seconds);

/// Whether retrying the same request can succeed (x-should-retry): false for
/// refusals about the request itself (400, 401, 404, 405, 413, 414, 422, 431).
bool retry_can_help(ErrorCode code);

/// Either a value or an Error. Minimal stand-in for C++23 std::expected.
template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::in_place_index<0>, std::move(value)) {}  // NOLINT(google-explicit-constructor)
  Result(Error error) : v_(std::in_place_index<1>, std::move(error)) {}  // NOLINT(google-explicit-constructor)

  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }
  T& value() & { return std::get<0>(v_); }
  const T& value() const& { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  const Error& error() const& { return std::get<1>(v_); }
  Error&& error() && { return std::get<1>(std::move(v_)); }

 private:
  std::variant<T, Error> v_;
};

/// Result of an operation that produces no value.
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Error error) : error_(std::move(error)) {}  // NOLINT(google-explicit-constructor)
  static Status Ok() { return {}; }
  bool ok() const { return !error_.has_value(); }
  explicit operator bool() const { return ok(); }
  const Error& error() const { return *error_; }

 private:
  std::optional<Error> error_;
};

}  // namespace vg
