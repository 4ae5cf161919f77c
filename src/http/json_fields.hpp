// Pieces of JSON the response and request codecs of src/http share
// (json_codec.cpp defines them; chat_codec.cpp and state_json.cpp use them too). Internal to
// src/http: the only headers outside it that see Boost.JSON.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <boost/json.hpp>

#include "api/events.hpp"
#include "common/error.hpp"

namespace vg::json_fields {

/// A JSON string of `s` with invalid UTF-8 replaced (common/utf8), so every
/// response is well-formed JSON.
boost::json::string safe(std::string_view s);

/// OpenAI's usage object: prompt_tokens, completion_tokens, total_tokens.
boost::json::object usage_json(const Usage& u);

/// The JSON text of `v`, as boost::json::serialize writes it except for
/// doubles: those are plain decimals (common/decimal: "4.19", not "4.19E0"),
/// and a non-finite double, which JSON cannot carry, is null. Every body the
/// server writes goes through this. Recursive: for values built by the server
/// or parsed within Boost.JSON's depth limit.
std::string serialize(const boost::json::value& v);
std::string serialize(const boost::json::object& o);  ///< the same, without copying into a value
std::string serialize(const boost::json::array& a);   ///< the same, without copying into a value

/// A JSON array of the strings (each through safe()).
boost::json::array string_array(const std::vector<std::string>& items);
/// Integral values as JSON integers; others as doubles (written as plain
/// decimals); a non-finite value as null.
boost::json::value number(double x);
/// Milliseconds rounded to microseconds, so bodies stay short.
boost::json::value millis(double ms);

/// A kInvalidRequest error (400) with `message`.
Error invalid(std::string message);

/// `error` with its param (OpenAI's: the request field at fault) named, for
/// a 400 that names none yet and whose message starts with a field of the
/// request `body` (JSON text), or with prompt or messages (required): the
/// leading path of the message, e.g. "temperature", "stop[2]",
/// "messages[1].role". Other errors as they are.
Error with_param(Error error, std::string_view body);

/// Short printable rendering of a JSON value for error messages.
std::string shown(const boost::json::value& v);
/// The field, or nullptr when absent or null (OpenAI treats null as "use the default").
const boost::json::value* field(const boost::json::object& o, std::string_view key);
/// A 400 naming the first field of `o` that vramgate does not implement and
/// that would change the answer (unsupported_fields.cpp); Ok otherwise.
Status refuse_unimplemented(const boost::json::object& o);

/// How OpenAI shows a token: its bytes when they are whole UTF-8, else
/// "bytes:\\xNN..." (the raw bytes go in a `bytes` array where there is one).
std::string token_text(std::string_view bytes);
/// A logprob as JSON: -infinity (and anything below) as -9999.0, as OpenAI does.
boost::json::value logprob_json(double logprob);
/// Completions' logprobs object: {tokens, token_logprobs, top_logprobs, text_offset};
/// each top_logprobs entry maps token -> logprob, most likely first, with
/// the chosen token added where it is not among the top ones (OpenAI).
boost::json::object completion_logprobs_json(const std::vector<TokenLogprobs>& tokens,
                                             const std::vector<std::int64_t>& text_offset);
/// Chat's logprobs object: {content: [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}], refusal: null}.
boost::json::object chat_logprobs_json(const std::vector<TokenLogprobs>& tokens);
/// Characters the bytes add to a text (UTF-8 lead bytes; a split character counts once).
std::int64_t text_chars(std::string_view bytes);

}  // namespace vg::json_fields
