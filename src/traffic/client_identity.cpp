// Client identity (see client_identity.hpp): address parsing, trusted proxy
// ranges and the X-Forwarded-For walk. Pure; any thread.
#include "traffic/client_identity.hpp"

#include <arpa/inet.h>

#include <algorithm>
#include <cstring>

#include "common/text.hpp"
#include "traffic/api_keys.hpp"

namespace vg::traffic {
namespace {

// Longest text taken for an address: an IPv6 address with an IPv4 tail,
// brackets and a port fits well within it.
constexpr std::size_t kMaxAddressText = 64;
constexpr int kMappedPrefixBits = 96;  // ::ffff:0:0/96 holds the IPv4-mapped addresses

bool is_mapped_v4(const std::array<std::uint8_t, 16>& b) {
  return std::all_of(b.begin(), b.begin() + 10, [](std::uint8_t x) { return x == 0; }) && b[10] == 0xff &&
         b[11] == 0xff;
}

// An address without brackets or port; IPv4-mapped IPv6 stays IPv6 here
// (`mapped` says so), so a range's prefix can be adjusted with it.
std::optional<IpAddress> parse_plain(std::string_view text, bool* mapped = nullptr) {
  if (text.empty() || text.size() >= kMaxAddressText) return std::nullopt;
  char buf[kMaxAddressText];
  std::memcpy(buf, text.data(), text.size());
  buf[text.size()] = '\0';
  IpAddress a;
  if (inet_pton(AF_INET, buf, a.bytes.data()) == 1) {
    a.family = IpAddress::Family::kV4;
    return a;
  }
  if (inet_pton(AF_INET6, buf, a.bytes.data()) != 1) return std::nullopt;
  a.family = IpAddress::Family::kV6;
  if (is_mapped_v4(a.bytes)) {
    if (mapped) *mapped = true;
    std::array<std::uint8_t, 16> v4{};
    std::copy(a.bytes.begin() + 12, a.bytes.end(), v4.begin());
    a.bytes = v4;
    a.family = IpAddress::Family::kV4;
  }
  return a;
}

bool all_digits(std::string_view s) {
  return !s.empty() && s.size() <= 5 && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

Result<IpRange> parse_range(std::string_view entry) {
  const auto bad = [&](const std::string& why) {
    return Error(ErrorCode::kConfig, "'" + std::string(entry) + "': " + why);
  };
  const std::size_t slash = entry.find('/');
  bool mapped = false;
  const std::optional<IpAddress> address = parse_plain(entry.substr(0, slash), &mapped);
  if (!address) return bad("not an IPv4 or IPv6 address (or ADDRESS/BITS range)");
  IpRange r{*address, address->bits()};
  if (slash != std::string_view::npos) {
    const std::string_view bits = entry.substr(slash + 1);
    const int written_max = mapped ? 128 : address->bits();
    if (!all_digits(bits) || std::stoi(std::string(bits)) > written_max) {
      return bad("the prefix must be a number of bits from 0 to " + std::to_string(written_max));
    }
    r.prefix_bits = std::stoi(std::string(bits));
    if (mapped) {
      if (r.prefix_bits < kMappedPrefixBits) return bad("an IPv4-mapped range needs a prefix of at least 96 bits");
      r.prefix_bits -= kMappedPrefixBits;
    }
  }
  IpRange masked = r;
  for (int bit = r.prefix_bits; bit < r.network.bits(); ++bit) {
    masked.network.bytes[bit / 8] &= static_cast<std::uint8_t>(~(0x80u >> (bit % 8)));
  }
  if (!(masked.network == r.network)) {
    return bad("bits are set after the prefix (the range starts at " + masked.network.to_string() + ")");
  }
  return r;
}

}  // namespace

std::optional<IpAddress> IpAddress::parse(std::string_view text) {
  text = trim_whitespace(text);
  if (!text.empty() && text.front() == '[') {
    const std::size_t close = text.find(']');
    if (close == std::string_view::npos) return std::nullopt;
    const std::string_view rest = text.substr(close + 1);
    if (!rest.empty() && !(rest.front() == ':' && all_digits(rest.substr(1)))) return std::nullopt;
    std::optional<IpAddress> a = parse_plain(text.substr(1, close - 1));
    if (a && a->family == Family::kV4 && text.substr(1, close - 1).find(':') == std::string_view::npos) {
      return std::nullopt;  // brackets hold IPv6 only
    }
    return a;
  }
  if (std::count(text.begin(), text.end(), ':') == 1) {  // IPv4 with a port
    const std::size_t colon = text.find(':');
    if (!all_digits(text.substr(colon + 1))) return std::nullopt;
    std::optional<IpAddress> a = parse_plain(text.substr(0, colon));
    return a && a->family == Family::kV4 ? a : std::nullopt;
  }
  return parse_plain(text);
}

std::string IpAddress::to_string() const {
  char buf[INET6_ADDRSTRLEN];
  const int af = family == Family::kV4 ? AF_INET : AF_INET6;
  if (inet_ntop(af, bytes.data(), buf, sizeof buf) == nullptr) return "unknown";
  return buf;
}

bool IpRange::contains(const IpAddress& a) const {
  if (a.family != network.family) return false;
  const int whole = prefix_bits / 8;
  if (!std::equal(a.bytes.begin(), a.bytes.begin() + whole, network.bytes.begin())) return false;
  const int rest = prefix_bits % 8;
  if (rest == 0) return true;
  const auto mask = static_cast<std::uint8_t>(0xffu << (8 - rest));
  return (a.bytes[whole] & mask) == (network.bytes[whole] & mask);
}

Result<TrustedProxies> TrustedProxies::parse(std::span<const std::string> entries) {
  TrustedProxies out;
  for (const std::string& list : entries) {
    std::string_view rest = list;
    while (true) {  // an entry may itself be a comma-separated list
      const std::size_t comma = rest.find(',');
      const std::string_view entry = trim_whitespace(rest.substr(0, comma));
      if (entry.empty()) return Error(ErrorCode::kConfig, "an empty entry in '" + list + "'");
      Result<IpRange> range = parse_range(entry);
      if (!range.ok()) return std::move(range).error();
      out.ranges_.push_back(*range);
      if (comma == std::string_view::npos) break;
      rest.remove_prefix(comma + 1);
    }
  }
  return out;
}

bool TrustedProxies::contains(const IpAddress& address) const {
  return std::any_of(ranges_.begin(), ranges_.end(), [&](const IpRange& r) { return r.contains(address); });
}

std::optional<IpAddress> client_address(std::string_view peer, std::string_view forwarded_for,
                                        const TrustedProxies& trusted) {
  std::optional<IpAddress> current = IpAddress::parse(peer);
  if (!current || !trusted.contains(*current)) return current;
  // From the right: each entry was appended by the (trusted) hop after it.
  while (!forwarded_for.empty()) {
    const std::size_t comma = forwarded_for.rfind(',');
    const std::string_view entry =
        trim_whitespace(comma == std::string_view::npos ? forwarded_for : forwarded_for.substr(comma + 1));
    forwarded_for = comma == std::string_view::npos ? std::string_view() : forwarded_for.substr(0, comma);
    if (entry.empty()) continue;
    const std::optional<IpAddress> hop = IpAddress::parse(entry);
    if (!hop) return current;  // not an address: the trusted hop that wrote it is as far as is known
    current = hop;
    if (!trusted.contains(*current)) return current;
  }
  return current;
}

ClientIdentity identify_client(const ApiKey* key, std::string_view peer, std::string_view forwarded_for,
                               const TrustedProxies& trusted) {
  if (key != nullptr) return {ClientSource::kApiKey, "key:" + key->scope};
  const std::optional<IpAddress> address = client_address(peer, forwarded_for, trusted);
  if (!address) return {ClientSource::kPeer, "addr:unknown"};
  const std::optional<IpAddress> direct = IpAddress::parse(peer);
  return {direct && *direct == *address ? ClientSource::kPeer : ClientSource::kForwarded,
          "addr:" + address->to_string()};
}

}  // namespace vg::traffic
