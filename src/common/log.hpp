// One log line from code that may not include spdlog: the files compiled
// with libtorch's include folders (device/, model/). torch 2.x ships its own
// fmt under torch/include, which comes first on those files' include path,
// so spdlog there would be compiled against a foreign fmt
// (scripts/check-includes, rule 4). Messages arrive formatted; any thread.
#pragma once

#include <string_view>

namespace vg {

enum class LogLevel { kDebug, kInfo, kWarn, kError };

/// Writes `message` to the server's log (spdlog's default logger) at `level`.
void log_line(LogLevel level, std::string_view message);

}  // namespace vg
