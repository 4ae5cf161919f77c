#include "common/utf8.hpp"

namespace vg {
namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";

// Length of the well-formed character at bytes[i], or 0 if ill-formed; sets
// `subpart` to the length of the maximal ill-formed subpart to replace.
std::size_t char_length(std::string_view b, std::size_t i, std::size_t* subpart) {
  const auto c = static_cast<unsigned char>(b[i]);
  *subpart = 1;
  if (c < 0x80) return 1;
  std::size_t need = 0;
  unsigned char lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    need = 1;
  } else if (c >= 0xE0 && c <= 0xEF) {
    need = 2;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    need = 3;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  for (std::size_t k = 1; k <= need; ++k) {
    if (i + k >= b.size()) return 0;
    const auto cc = static_cast<unsigned char>(b[i + k]);
    const unsigned char l = (k == 1) ? lo : 0x80;
    const unsigned char h = (k == 1) ? hi : 0xBF;
    if (cc < l || cc > h) return 0;
    *subpart = k + 1;
  }
  return need + 1;
}

}  // namespace

std::string sanitize_utf8(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  std::size_t i = 0;
  while (i < bytes.size()) {
    std::size_t subpart = 1;
    const std::size_t n = char_length(bytes, i, &subpart);
    if (n == 0) {
      out += kReplacement;
      i += subpart;
    } else {
      out.append(bytes.substr(i, n));
      i += n;
    }
  }
  return out;
}

std::size_t complete_utf8_prefix(std::string_view bytes) {
  // Look back at most 3 bytes for the lead byte of a character that is cut off.
  const std::size_t n = bytes.size();
  for (std::size_t back = 1; back <= 3 && back <= n; ++back) {
    const auto c = static_cast<unsigned char>(bytes[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: keep looking
    std::size_t need = 0;
    if (c >= 0xC2 && c <= 0xDF) need = 2;
    else if (c >= 0xE0 && c <= 0xEF) need = 3;
    else if (c >= 0xF0 && c <= 0xF4) need = 4;
    if (need > back) {
      // Only hold back if what is there so far could still be well-formed.
      std::size_t subpart = 0;
      const std::string_view tail = bytes.substr(n - back);
      char_length(tail, 0, &subpart);
      if (subpart == back) return n - back;
    }
    return n;
  }
  return n;
}

}  // namespace vg
