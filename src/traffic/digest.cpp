// SHA-256 through OpenSSL's EVP interface (see digest.hpp). Any thread.
#include "traffic/digest.hpp"

#include <openssl/evp.h>

#include <algorithm>
#include <memory>
#include <stdexcept>

namespace vg::traffic {
namespace {

struct CtxFree {
  void operator()(EVP_MD_CTX* c) const { EVP_MD_CTX_free(c); }
};

}  // namespace

Digest sha256_parts(std::initializer_list<std::string_view> parts) {
  std::unique_ptr<EVP_MD_CTX, CtxFree> ctx(EVP_MD_CTX_new());
  bool ok = ctx && EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) == 1;
  for (std::string_view p : parts) {
    std::uint8_t len[8];
    std::uint64_t n = p.size();
    for (int i = 7; i >= 0; --i, n >>= 8) len[i] = static_cast<std::uint8_t>(n & 0xff);
    ok = ok && EVP_DigestUpdate(ctx.get(), len, sizeof len) == 1;
    ok = ok && EVP_DigestUpdate(ctx.get(), p.data(), p.size()) == 1;
  }
  Digest d{};
  unsigned int size = 0;
  ok = ok && EVP_DigestFinal_ex(ctx.get(), d.data(), &size) == 1 && size == d.size();
  if (!ok) throw std::runtime_error("SHA-256 failed in libcrypto");
  return d;
}

Digest sha256(std::string_view data) {
  Digest d{};
  unsigned int size = 0;
  if (EVP_Digest(data.data(), data.size(), d.data(), &size, EVP_sha256(), nullptr) != 1 || size != d.size()) {
    throw std::runtime_error("SHA-256 failed in libcrypto");
  }
  return d;
}

std::string hex(const Digest& d, std::size_t bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * std::min(bytes, d.size()));
  for (std::size_t i = 0; i < bytes && i < d.size(); ++i) {
    out += kDigits[d[i] >> 4];
    out += kDigits[d[i] & 15];
  }
  return out;
}

std::string key_id(std::string_view key) { return hex(sha256(key), 4); }

}  // namespace vg::traffic
