// SHA-256 digests of API keys and request bodies (OpenSSL's libcrypto), and
// the short key id the logs carry instead of a key. Pure; any thread.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>

namespace vg::traffic {

using Digest = std::array<std::uint8_t, 32>;

/// SHA-256 of `data`.
Digest sha256(std::string_view data);

/// SHA-256 of the concatenation of `parts`, each length-prefixed so that
/// ("ab","c") and ("a","bc") differ.
Digest sha256_parts(std::initializer_list<std::string_view> parts);

/// The first `bytes` bytes of `d` (all of them by default) as lowercase hex.
std::string hex(const Digest& d, std::size_t bytes = 32);

/// The first 8 hex characters of sha256(key): a non-reversible id for logs.
std::string key_id(std::string_view key);

/// Hash functor for unordered containers keyed by Digest.
struct DigestHash {
  std::size_t operator()(const Digest& d) const noexcept {
    std::size_t h = 0;
    for (std::size_t i = 0; i < sizeof h; ++i) h = (h << 8) | d[i];
    return h;
  }
};

}  // namespace vg::traffic
