// Request priority classes (docs/admission-and-memory.md "Traffic policies"): the vocabulary
// shared by the HTTP layer (request field, X-Priority header, API keys),
// admission (higher classes are granted first, with aging) and the engine
// (preemption takes from the lowest class first). Pure; any thread.
#pragma once

#include <optional>
#include <string_view>

namespace vg {

/// Ordered: a larger value is a higher class. Numeric forms 0, 1, 2 map to
/// low, normal, high.
enum class Priority : int { kLow = 0, kNormal = 1, kHigh = 2 };

inline constexpr Priority kTopPriority = Priority::kHigh;

/// "low", "normal", "high", or "0", "1", "2" (case-sensitive); nullopt otherwise.
std::optional<Priority> parse_priority(std::string_view text);

/// "low", "normal" or "high".
const char* to_string(Priority p);

/// The lower of two classes (a cap).
inline Priority min_priority(Priority a, Priority b) { return static_cast<int>(a) < static_cast<int>(b) ? a : b; }

}  // namespace vg
