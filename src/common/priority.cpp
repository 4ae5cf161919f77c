// Priority classes (see priority.hpp). Pure; any thread.
#include "common/priority.hpp"

namespace vg {

std::optional<Priority> parse_priority(std::string_view text) {
  if (text == "low" || text == "0") return Priority::kLow;
  if (text == "normal" || text == "1") return Priority::kNormal;
  if (text == "high" || text == "2") return Priority::kHigh;
  return std::nullopt;
}

const char* to_string(Priority p) {
  switch (p) {
    case Priority::kLow: return "low";
    case Priority::kNormal: return "normal";
    case Priority::kHigh: return "high";
  }
  return "normal";
}

}  // namespace vg
