// GPT-2's byte-level alphabet: each of the 256 byte values is shown as one
// printable Unicode character (bytes_to_unicode() of openai/gpt-2 encoder.py),
// so that BPE vocabularies can be stored as text. Pure functions; any thread.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace vg::tok {

/// Bytes -> the UTF-8 text of their byte-level characters (one per byte).
std::string byte_level_encode(std::string_view bytes);

/// Byte-level text -> the bytes it stands for; nullopt when a character is
/// not one of the 256 byte-level characters (or the text is not UTF-8).
std::optional<std::string> byte_level_decode(std::string_view text);

}  // namespace vg::tok
