// ForeignBytesHook: the test hook that plays "another process" on a device
// (Device::set_test_foreign_bytes), so tests can make memory vanish from under
// a running engine and come back: at given engine step numbers, or whenever a
// file changes. Torch-free; parse on the main thread, then owned by one
// engine thread.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/error.hpp"

namespace vg {

struct ForeignBytesHook {
  /// (step number, bytes): at the start of that engine step (1-based, over
  /// the engine's life) the other process holds `bytes`; ascending steps.
  std::vector<std::pair<std::int64_t, std::int64_t>> at_steps;
  /// When set: read at every engine loop turn; it holds a byte size
  /// (parse_bytes, or 0); a missing or unreadable file changes nothing.
  std::filesystem::path file;

  bool empty() const { return at_steps.empty() && file.empty(); }
  /// The bytes due at step `step`, when one of at_steps is that step.
  std::optional<std::int64_t> at_step(std::int64_t step) const;
  /// The bytes the file says now; nullopt without a file, when it cannot be
  /// read, or when it does not hold a byte size.
  std::optional<std::int64_t> read_file() const;
};

/// Parses the test_foreign_bytes setting: "" (off), "file:PATH", or
/// "STEP=SIZE[,STEP=SIZE...]" with STEP >= 1 ascending and SIZE a byte size
/// ("6MiB") or 0. Errors: kConfig naming what is wrong.
Result<ForeignBytesHook> parse_foreign_bytes_hook(const std::string& spec);

}  // namespace vg
