// The table of ServeConfig's settings: one descriptor per field with its
// key, section and help text. The command line (config_cli) and the config
// file (config_file) are both built from this table, so the two cannot
// drift. Any thread; the table is immutable.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "config/config.hpp"

namespace vg {

/// A pointer to one ServeConfig member, by its type.
/// A list (std::vector<std::string>) is a flag that may be given several
/// times and a config-file key that is a string or an array of strings.
using ConfigMember = std::variant<std::string ServeConfig::*, int ServeConfig::*, std::int64_t ServeConfig::*,
                                  double ServeConfig::*, bool ServeConfig::*,
                                  std::vector<std::string> ServeConfig::*>;

/// What a field's value is, beyond its C++ type.
enum class ConfigValue {
  kPlain,
  /// A byte size: a string like "64MiB" or a plain count of bytes, as a flag
  /// and in the file (where the count may also be an integer). A
  /// std::int64_t member holds the parsed count.
  kBytes,
  /// A file or folder: in a config file, a relative path is relative to the
  /// file's folder (as a flag, to the current folder).
  kPath,
};

struct ConfigField {
  const char* key;      ///< snake_case key in the config file; the flag is "--" + key with '-' for '_'
  const char* section;  ///< config-file table the key may also be written in, e.g. "admission"
  const char* help;     ///< one line for --help
  ConfigMember member;
  ConfigValue value = ConfigValue::kPlain;
  bool bytes() const { return value == ConfigValue::kBytes; }
};

/// Every settable field of ServeConfig, in the order --help and
/// --print-config list them.
std::span<const ConfigField> config_fields();

/// The field with this config-file key, or nullptr.
const ConfigField* find_config_field(const std::string& key);

/// "--max-batch" for "max_batch".
std::string flag_name(const std::string& key);

/// Copies one field's value from `from` into `to`.
void copy_config_field(const ConfigField& field, const ServeConfig& from, ServeConfig& to);

}  // namespace vg
