// Pieces of JSON the response and request codecs of src/http share
// (json_codec.cpp defines them; chat_codec.cpp uses them too). Internal to
// src/http: the only headers outside it that see Boost.JSON.
#pragma once

#include <string>
#include <string_view>

#include <boost/json.hpp>

#include "common/error.hpp"
#include "engine/events.hpp"

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

/// A kInvalidRequest error (400) with `message`.
Error invalid(std::string message);

}  // namespace vg::json_fields
