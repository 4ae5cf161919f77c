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

/// A kInvalidRequest error (400) with `message`.
Error invalid(std::string message);

}  // namespace vg::json_fields
