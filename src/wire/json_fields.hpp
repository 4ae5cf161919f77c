// The field readers and writers every wire codec shares (wire/ only): each
// reader checks a field's type and range and throws FieldError saying what
// is wrong; guarded() turns that into the kInvalidRequest a public decoder
// returns. A null field counts as absent. Pure; any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include <boost/json.hpp>

#include "common/error.hpp"

namespace vg::wire::fields {

namespace json = boost::json;

// Bounds on what a peer may send (the frame limit bounds the total too).
inline constexpr std::size_t kMaxTokens = 1u << 20;  // prompt ids, resume tokens
inline constexpr std::size_t kMaxList = 1u << 16;    // messages, logprob entries, waiting entries
inline constexpr std::size_t kMaxSmallList = 1024;   // stop strings, logit_bias, devices, models
inline constexpr std::int64_t kMaxInt32 = std::numeric_limits<std::int32_t>::max();
inline constexpr std::int64_t kMaxInt64 = std::numeric_limits<std::int64_t>::max();

/// What a field reader throws; its message names the field.
struct FieldError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

[[noreturn]] void fail(const std::string& what);

/// `v` as an object; else FieldError "<what> must be an object".
const json::object& as_object(const json::value& v, const char* what);
/// The field `key`, or null when it is absent or null.
const json::value* get(const json::object& o, const char* key);
/// The field `key`; FieldError "missing" when it is absent or null.
const json::value& need(const json::object& o, const char* key);
/// A string field; absent: empty, or FieldError when `required`.
std::string str(const json::object& o, const char* key, bool required = false);
/// An integer field in lo..hi; absent: `dflt`, or FieldError when `required`.
std::int64_t integer(const json::object& o, const char* key, std::int64_t lo, std::int64_t hi, std::int64_t dflt,
                     bool required = false);
/// A finite number field in lo..hi; absent: `dflt`.
double number(const json::object& o, const char* key, double lo, double hi, double dflt);
/// A duration (ms or s) measured by the peer: finite; a value just below 0
/// (two clocks read in the other order) counts as 0.
double duration(const json::object& o, const char* key);
/// A boolean field; absent: false.
bool boolean(const json::object& o, const char* key);
/// An array field of at most `max` entries; null when absent.
const json::array* array(const json::object& o, const char* key, std::size_t max);
/// An array of token ids (integers 0..2^31-1, at most kMaxTokens).
std::vector<std::int32_t> ids(const json::object& o, const char* key);
/// An array of at most `max` strings.
std::vector<std::string> strings(const json::object& o, const char* key, std::size_t max);

json::array id_array(const std::vector<std::int32_t>& v);
json::array string_array(const std::vector<std::string>& v);
json::array int_array(const std::vector<std::int64_t>& v);

/// f() (which reads fields), or the kInvalidRequest saying why it could not.
template <class T, class F>
Result<T> guarded(F&& f) {
  try {
    return f();
  } catch (const FieldError& e) {
    return Error(ErrorCode::kInvalidRequest, e.what());
  } catch (const std::exception& e) {  // bad_alloc, length_error: still the peer's frame
    return Error(ErrorCode::kInvalidRequest, std::string("undecodable message: ") + e.what());
  }
}

}  // namespace vg::wire::fields
