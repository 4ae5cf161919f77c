// The TOML config file of `vramgate serve --config FILE`: reading one into a
// ServeConfig (every key checked against config_fields, every value against
// ServeConfig::check) and writing a ServeConfig back as TOML
// (--print-config). Called from main only; any thread.
//
// Keys are the flag names in snake_case (`max_batch = 8` for --max-batch),
// written at the top level or in their section table ([model], [http],
// [memory], [scheduling], [operability], [test]); byte sizes are strings
// ("64MiB") or integers (bytes).
#pragma once

#include <string>
#include <string_view>

#include "common/error.hpp"
#include "config/config.hpp"

namespace vg {

/// Parses TOML `text` over `base`: keys the text does not set keep base's
/// values; the result passes ServeConfig::check(). `source` names the file in
/// errors, and its folder is where the text's relative paths (the
/// ConfigValue::kPath keys: model_dir, api_keys, ...) are resolved from. Errors: kConfig as "SOURCE:LINE: key
/// 'max_batch': must be in 1..256" for syntax errors, unknown keys or tables, wrong value types, keys set twice and
/// values out of range.
Result<ServeConfig> parse_config_toml(std::string_view text, const std::string& source, const ServeConfig& base = {});

/// Reads and parses the file at `path` (see parse_config_toml). Errors:
/// kConfig naming the file when it cannot be read.
Result<ServeConfig> load_config_file(const std::string& path, const ServeConfig& base = {});

/// `config` as TOML, one table per section with each key's help as a comment,
/// paths made absolute; parse_config_toml() of the text gives back the same
/// values (the paths absolute).
std::string format_config_toml(const ServeConfig& config);

}  // namespace vg
