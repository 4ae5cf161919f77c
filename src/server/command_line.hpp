// The vramgate command line: its subcommands (`serve`, `engine`, `plan`)
// and flags (CLI11, config/config_cli.hpp), parsed into one typed Command
// with its settings resolved (defaults, then --config, then flags) and
// validated. Both executables parse with it: `vramgate` (torch-free) runs
// the gateway itself and hands every other command to `vramgate-engine`,
// which runs them all. Main thread only.
#pragma once

#include <string>
#include <variant>
#include <vector>

#include "config/config.hpp"

namespace vg {

/// The flags of `vramgate engine` beyond the serve settings.
struct EngineProcessOptions {
  std::string listen;         ///< unix:PATH
  std::string config_digest;  ///< reported in the hello (a supervisor re-attaches on a match)
};

/// `vramgate serve`.
struct ServeCommand {
  ServeConfig config;
  bool print_config = false;  ///< --print-config: print the settings as TOML and exit
};

/// `vramgate engine`.
struct EngineCommand {
  ServeConfig config;
  EngineProcessOptions options;
};

/// `vramgate plan`: the table's prompt and max_tokens sizes (tokens).
struct PlanCommand {
  ServeConfig config;
  std::vector<int> prompt_tokens;
  std::vector<int> max_tokens;
  bool json = false;
};

/// Nothing to run: --help, --version, or a usage or settings error, already
/// printed; the process exits with `status`.
struct ExitCommand {
  int status = 0;
};

using Command = std::variant<ExitCommand, ServeCommand, EngineCommand, PlanCommand>;

/// Parses `argv`; prints help, the version and errors itself (usage errors:
/// CLI11's status; settings errors: "vramgate: MESSAGE", status 2).
Command parse_command_line(int argc, char** argv);

/// Logs to stderr at `level` ("info", "debug", ...), in the shape tests and
/// operators read; `tag` (may be empty) is written after the level.
void init_logging(const std::string& level, const std::string& tag);

}  // namespace vg
