// The command-line side of ServeConfig: one CLI11 option per field of
// config_fields (plus --config FILE) on a subcommand, and the rule that
// combines them: defaults, then the config file, then the flags given.
// Called from main (and tests) on one thread.
#pragma once

#include <span>
#include <string>
#include <utility>
#include <vector>

#include "common/error.hpp"
#include "config/config.hpp"

namespace CLI {
class App;
class Option;
}  // namespace CLI

namespace vg {

struct ConfigField;

class ConfigFlags {
 public:
  /// Adds `--config FILE` and a flag for each field whose key is in `keys`
  /// (every field when `keys` is empty) to `app`. CLI11 writes into this
  /// object, so it must outlive app.parse() and stay where it is.
  explicit ConfigFlags(CLI::App& app, std::span<const char* const> keys = {});
  ConfigFlags(const ConfigFlags&) = delete;
  ConfigFlags& operator=(const ConfigFlags&) = delete;

  /// After app.parse(): the defaults, overridden by the config file's values
  /// (when --config was given), overridden by the flags given; validated.
  /// Errors: kConfig naming the file and key, or the flag.
  Result<ServeConfig> resolve() const;

 private:
  ServeConfig flags_;        // the values CLI11 parses into
  std::string config_path_;  // --config, empty when not given
  std::vector<std::pair<const ConfigField*, CLI::Option*>> options_;
};

}  // namespace vg
