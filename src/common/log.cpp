#include "common/log.hpp"

#include <spdlog/spdlog.h>

namespace vg {

void log_line(LogLevel level, std::string_view message) {
  switch (level) {
    case LogLevel::kDebug: spdlog::debug("{}", message); return;
    case LogLevel::kInfo: spdlog::info("{}", message); return;
    case LogLevel::kWarn: spdlog::warn("{}", message); return;
    case LogLevel::kError: spdlog::error("{}", message); return;
  }
}

}  // namespace vg
