// Who a request comes from (docs/admission-and-memory.md "Traffic policies", "Booked retries"):
// the one identity behind its rate bucket, its share of retry bookings and
// the body matching of its retries. It is the caller's API key when the
// server has keys; else the client's address: the peer's, or, when the peer
// is a trusted proxy (--trusted-proxy), the address that proxy forwarded in
// X-Forwarded-For. X-Forwarded-For from any other peer is ignored, so a
// client cannot pick its own identity.
//
// Pure functions over strings; TrustedProxies is immutable after parse().
// Any thread.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.hpp"

namespace vg::traffic {

struct ApiKey;

/// An IPv4 or IPv6 address. An IPv4-mapped IPv6 address (::ffff:a.b.c.d, as
/// a dual-stack socket reports IPv4 peers) is held as the IPv4 address, so
/// both spellings are one client.
struct IpAddress {
  enum class Family { kV4, kV6 };
  Family family = Family::kV4;
  std::array<std::uint8_t, 16> bytes{};  ///< network order; IPv4 uses the first 4

  /// "1.2.3.4", "::1", "[::1]", and with a port "1.2.3.4:80", "[::1]:80";
  /// surrounding spaces ignored. nullopt for anything else (a host name,
  /// "unknown", an obfuscated identifier).
  static std::optional<IpAddress> parse(std::string_view text);
  /// The canonical text: dotted IPv4, or RFC 5952 IPv6.
  std::string to_string() const;
  int bits() const { return family == Family::kV4 ? 32 : 128; }
  bool operator==(const IpAddress&) const = default;
};

/// An address range: the addresses whose first `prefix_bits` bits are
/// those of `network`.
struct IpRange {
  IpAddress network;
  int prefix_bits = 0;
  bool contains(const IpAddress& address) const;
};

/// The proxies whose X-Forwarded-For is believed. Empty (the default):
/// X-Forwarded-For is ignored.
class TrustedProxies {
 public:
  TrustedProxies() = default;
  /// Each entry an address ("10.0.0.7", "::1") or a CIDR range
  /// ("10.0.0.0/8", "fd00::/8"). Errors: kConfig naming the entry, for text
  /// that is neither, a prefix beyond the family's bits, or a range with bits
  /// set after its prefix ("10.0.0.1/8": write 10.0.0.0/8).
  static Result<TrustedProxies> parse(std::span<const std::string> entries);

  bool empty() const { return ranges_.empty(); }
  bool contains(const IpAddress& address) const;

 private:
  std::vector<IpRange> ranges_;
};

/// Where a request's identity came from.
enum class ClientSource {
  kApiKey,     ///< the API key it authorized with
  kPeer,       ///< the address of the connection's peer
  kForwarded,  ///< the client address a trusted proxy forwarded
};

struct ClientIdentity {
  ClientSource source = ClientSource::kPeer;
  /// "key:<the key's scope>" or "addr:<canonical address>" ("addr:unknown"
  /// when the peer's address could not be read): compared for equality only.
  std::string id;
};

/// The client address behind `peer`: `peer` itself unless it is a trusted
/// proxy and `forwarded_for` (every X-Forwarded-For value, joined with ","
/// in header order) names one. Then X-Forwarded-For is read from the right,
/// each entry having been appended by the hop to its right: the first entry
/// that is not a trusted proxy is the client; when every entry is trusted,
/// the leftmost; an entry that is not an address stops the walk at the
/// trusted hop that wrote it. nullopt when `peer` is not an address.
std::optional<IpAddress> client_address(std::string_view peer, std::string_view forwarded_for,
                                        const TrustedProxies& trusted);

/// The identity of a request from `peer` (the connection's remote address as
/// text) that authorized with `key` (nullptr: no keys on the server): the
/// key when there is one, else client_address().
ClientIdentity identify_client(const ApiKey* key, std::string_view peer, std::string_view forwarded_for,
                               const TrustedProxies& trusted);

}  // namespace vg::traffic
