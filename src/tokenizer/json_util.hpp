// Small Boost.JSON accessors for the tokenizer files of a model folder:
// missing or mistyped keys give the default. Pure functions; any thread.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

#include <boost/json/value.hpp>

#include "common/error.hpp"

namespace vg::tok {

/// Parses a JSON file. Errors: kModelLoad naming the file (unreadable, or
/// not JSON, with the parser's message).
Result<boost::json::value> read_json_file(const std::filesystem::path& file);

/// o[key] as a string; a token object {"content": "..."} gives its content.
std::string json_string(const boost::json::object& o, std::string_view key, std::string def = {});
std::int64_t json_int(const boost::json::object& o, std::string_view key, std::int64_t def);
bool json_bool(const boost::json::object& o, std::string_view key, bool def);
const boost::json::object* json_object(const boost::json::object& o, std::string_view key);
const boost::json::array* json_array(const boost::json::object& o, std::string_view key);

}  // namespace vg::tok
