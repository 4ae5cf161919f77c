#include "device/foreign_bytes_hook.hpp"

#include <cctype>
#include <charconv>
#include <fstream>
#include <sstream>

#include "device/device.hpp"

namespace vg {
namespace {

Error bad_hook(const std::string& why) { return Error(ErrorCode::kConfig, "test_foreign_bytes: " + why); }

// A byte size, or "0" (parse_bytes refuses 0: nothing held).
Result<std::int64_t> size_or_zero(std::string text) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front()))) text.erase(0, 1);
  if (text == "0") return std::int64_t{0};
  return parse_bytes(text);
}

}  // namespace

std::optional<std::int64_t> ForeignBytesHook::at_step(std::int64_t step) const {
  for (const auto& [s, bytes] : at_steps) {
    if (s == step) return bytes;
  }
  return std::nullopt;
}

std::optional<std::int64_t> ForeignBytesHook::read_file() const {
  if (file.empty()) return std::nullopt;
  std::ifstream in(file);
  if (!in) return std::nullopt;
  std::stringstream text;
  text << in.rdbuf();
  auto bytes = size_or_zero(text.str());
  if (!bytes.ok()) return std::nullopt;
  return *bytes;
}

Result<ForeignBytesHook> parse_foreign_bytes_hook(const std::string& spec) {
  ForeignBytesHook hook;
  if (spec.empty()) return hook;
  if (spec.rfind("file:", 0) == 0) {
    hook.file = spec.substr(5);
    if (hook.file.empty()) return bad_hook("\"file:\" needs a path");
    return hook;
  }
  std::stringstream items(spec);
  std::string item;
  while (std::getline(items, item, ',')) {
    const auto eq = item.find('=');
    std::int64_t step = 0;
    const char* end = item.data() + (eq == std::string::npos ? 0 : eq);
    if (eq == std::string::npos || std::from_chars(item.data(), end, step).ptr != end || step < 1) {
      return bad_hook("\"" + item + "\" is not STEP=SIZE with STEP >= 1");
    }
    if (!hook.at_steps.empty() && step <= hook.at_steps.back().first) return bad_hook("steps must ascend");
    auto bytes = size_or_zero(item.substr(eq + 1));
    if (!bytes.ok()) return bad_hook(bytes.error().message);
    hook.at_steps.emplace_back(step, *bytes);
  }
  if (hook.at_steps.empty()) return bad_hook("no STEP=SIZE given");
  return hook;
}

}  // namespace vg
