// The GPT-2 byte <-> character tables, built once on first use. Any thread.
#include "tokenizer/byte_level.hpp"

#include <array>
#include <cstdint>
#include <unordered_map>

namespace vg::tok {
namespace {

void append_utf8(std::string& out, std::uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

struct Tables {
  std::array<std::string, 256> to_text;
  std::unordered_map<std::uint32_t, unsigned char> to_byte;

  Tables() {
    // Printable Latin-1 bytes stand for themselves; the others are shifted to
    // 256 + n in byte order (encoder.py's bytes_to_unicode).
    std::uint32_t next = 256;
    for (std::uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const std::uint32_t cp = printable ? b : next++;
      append_utf8(to_text[b], cp);
      to_byte[cp] = static_cast<unsigned char>(b);
    }
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

}  // namespace

std::string byte_level_encode(std::string_view bytes) {
  const Tables& t = tables();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) out += t.to_text[static_cast<unsigned char>(c)];
  return out;
}

std::optional<std::string> byte_level_decode(std::string_view text) {
  const Tables& t = tables();
  std::string out;
  out.reserve(text.size());
  std::size_t i = 0;
  while (i < text.size()) {
    const auto c = static_cast<unsigned char>(text[i]);
    std::uint32_t cp = 0;
    std::size_t len = 0;
    if (c < 0x80) {
      cp = c;
      len = 1;
    } else if ((c & 0xE0) == 0xC0) {
      cp = c & 0x1F;
      len = 2;
    } else if ((c & 0xF0) == 0xE0) {
      cp = c & 0x0F;
      len = 3;
    } else {
      return std::nullopt;  // byte-level characters are all below U+0144
    }
    if (i + len > text.size()) return std::nullopt;
    for (std::size_t k = 1; k < len; ++k) {
      const auto cc = static_cast<unsigned char>(text[i + k]);
      if ((cc & 0xC0) != 0x80) return std::nullopt;
      cp = (cp << 6) | (cc & 0x3F);
    }
    auto it = t.to_byte.find(cp);
    if (it == t.to_byte.end()) return std::nullopt;
    out += static_cast<char>(it->second);
    i += len;
  }
  return out;
}

}  // namespace vg::tok
