// UTF-8 helpers for text that leaves the server: validation with U+FFFD
// replacement, and finding where a byte string stops being complete UTF-8.
// Pure functions; any thread.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace vg {

/// Returns `bytes` with every ill-formed subsequence replaced by U+FFFD
/// (the "maximal subpart" practice of Unicode 15, section 3.9).
std::string sanitize_utf8(std::string_view bytes);

/// Length of the longest prefix of `bytes` that does not end inside an
/// incomplete (but so far valid-looking) multi-byte character. Bytes after it
/// may still become a character when more bytes arrive.
std::size_t complete_utf8_prefix(std::string_view bytes);

}  // namespace vg
