// SHA-256 through OpenSSL's EVP interface (see digest.hpp). Any thread.
#include "traffic/digest.hpp"

#include <openssl/evp.h>

#include <cstdio>
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

std::string key_id(std::string_view key) {
  const Digest d = sha256(key);
  char buf[9];
  std::snprintf(buf, sizeof buf, "%02x%02x%02x%02x", d[0], d[1], d[2], d[3]);
  return buf;
}

}  // namespace vg::traffic
