// Client identity: address parsing, trusted proxy ranges, the
// X-Forwarded-For walk (only a trusted peer's header counts; spoofed entries
// to the left of the client are never taken) and the key-or-address rule.
#include "traffic/client_identity.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "traffic/api_keys.hpp"

namespace vg::traffic {
namespace {

using ::testing::HasSubstr;

std::string text(const std::optional<IpAddress>& a) { return a ? a->to_string() : "(none)"; }

TrustedProxies trusted(std::vector<std::string> entries) {
  Result<TrustedProxies> t = TrustedProxies::parse(entries);
  EXPECT_TRUE(t.ok()) << t.error().message;
  return t.ok() ? std::move(t).value() : TrustedProxies{};
}

TEST(IpAddress, ParsesBothFamiliesWithOrWithoutAPort) {
  EXPECT_EQ(text(IpAddress::parse("10.1.2.3")), "10.1.2.3");
  EXPECT_EQ(text(IpAddress::parse(" 10.1.2.3:8080 ")), "10.1.2.3");
  EXPECT_EQ(text(IpAddress::parse("2001:DB8:0:0::1")), "2001:db8::1");  // canonical text
  EXPECT_EQ(text(IpAddress::parse("[2001:db8::1]:443")), "2001:db8::1");
  EXPECT_EQ(text(IpAddress::parse("[::1]")), "::1");
  EXPECT_EQ(IpAddress::parse("::1")->family, IpAddress::Family::kV6);
}

TEST(IpAddress, AnIpv4MappedAddressIsTheIpv4Client) {
  const auto mapped = IpAddress::parse("::ffff:192.0.2.7");
  ASSERT_TRUE(mapped);
  EXPECT_EQ(mapped->family, IpAddress::Family::kV4);
  EXPECT_EQ(*mapped, *IpAddress::parse("192.0.2.7"));
}

TEST(IpAddress, RefusesWhatIsNotAnAddress) {
  for (const char* bad : {"", "unknown", "example.com", "10.1.2", "10.1.2.300", "10.1.2.3:", "10.1.2.3:http",
                          "[10.1.2.3]", "[::1", "[::1]x", "_hidden", "1.2.3.4, 5.6.7.8"}) {
    EXPECT_FALSE(IpAddress::parse(bad)) << bad;
  }
}

TEST(TrustedProxies, HoldsAddressesAndRanges) {
  const TrustedProxies t = trusted({"10.0.0.0/8", "192.168.1.5, fd00::/8", "::ffff:172.16.0.0/108"});
  EXPECT_TRUE(t.contains(*IpAddress::parse("10.200.3.4")));
  EXPECT_FALSE(t.contains(*IpAddress::parse("11.0.0.1")));
  EXPECT_TRUE(t.contains(*IpAddress::parse("192.168.1.5")));
  EXPECT_FALSE(t.contains(*IpAddress::parse("192.168.1.6")));
  EXPECT_TRUE(t.contains(*IpAddress::parse("fd12::9")));
  EXPECT_FALSE(t.contains(*IpAddress::parse("fe80::1")));
  EXPECT_TRUE(t.contains(*IpAddress::parse("172.16.9.1")));  // the mapped /108 is the IPv4 /12
  EXPECT_FALSE(t.contains(*IpAddress::parse("172.32.0.1")));
  EXPECT_TRUE(trusted({"0.0.0.0/0"}).contains(*IpAddress::parse("203.0.113.9")));
  EXPECT_FALSE(trusted({"0.0.0.0/0"}).contains(*IpAddress::parse("::1")));  // one family per range
  EXPECT_TRUE(TrustedProxies{}.empty());
}

TEST(TrustedProxies, RefusesABadEntryNamingIt) {
  const auto message = [](std::vector<std::string> entries) {
    Result<TrustedProxies> t = TrustedProxies::parse(entries);
    return t.ok() ? std::string("(ok)") : t.error().message;
  };
  EXPECT_THAT(message({"proxy.local"}), HasSubstr("'proxy.local': not an IPv4 or IPv6 address"));
  EXPECT_THAT(message({"10.0.0.0/33"}), HasSubstr("from 0 to 32"));
  EXPECT_THAT(message({"10.0.0.0/x"}), HasSubstr("'10.0.0.0/x'"));
  EXPECT_THAT(message({"10.0.0.1/8"}), HasSubstr("the range starts at 10.0.0.0"));
  EXPECT_THAT(message({"10.0.0.1:80"}), HasSubstr("not an IPv4 or IPv6 address"));
  EXPECT_THAT(message({"10.0.0.1,"}), HasSubstr("an empty entry"));
  EXPECT_THAT(message({"::ffff:10.0.0.0/64"}), HasSubstr("at least 96 bits"));
}

TEST(ClientAddress, AnUntrustedPeerIsTheClientWhateverItForwards) {
  const TrustedProxies t = trusted({"10.0.0.1"});
  EXPECT_EQ(text(client_address("203.0.113.5", "198.51.100.1", t)), "203.0.113.5");
  EXPECT_EQ(text(client_address("203.0.113.5", "198.51.100.1", TrustedProxies{})), "203.0.113.5");
  EXPECT_EQ(text(client_address("10.0.0.1", "198.51.100.1", TrustedProxies{})), "10.0.0.1");  // none trusted
}

TEST(ClientAddress, ATrustedPeersLastUntrustedEntryIsTheClient) {
  const TrustedProxies t = trusted({"10.0.0.0/24"});
  EXPECT_EQ(text(client_address("10.0.0.1", "198.51.100.1", t)), "198.51.100.1");
  // A client that sends its own X-Forwarded-For only adds entries to the
  // left of the one the proxy appended: they are never taken.
  EXPECT_EQ(text(client_address("10.0.0.1", "1.1.1.1, 2.2.2.2, 198.51.100.1", t)), "198.51.100.1");
  // A chain of trusted proxies: the walk goes on through them.
  EXPECT_EQ(text(client_address("10.0.0.1", "198.51.100.1,10.0.0.7 , 10.0.0.9", t)), "198.51.100.1");
  // Every entry trusted: the leftmost.
  EXPECT_EQ(text(client_address("10.0.0.1", "10.0.0.5, 10.0.0.6", t)), "10.0.0.5");
  // No header, or only empty entries: the proxy itself.
  EXPECT_EQ(text(client_address("10.0.0.1", "", t)), "10.0.0.1");
  EXPECT_EQ(text(client_address("10.0.0.1", " , ", t)), "10.0.0.1");
  // Ports and brackets are the entry's, not part of the client.
  EXPECT_EQ(text(client_address("10.0.0.1", "[2001:db8::7]:5555", t)), "2001:db8::7");
}

TEST(ClientAddress, AnEntryThatIsNotAnAddressStopsAtTheHopThatWroteIt) {
  const TrustedProxies t = trusted({"10.0.0.0/24"});
  EXPECT_EQ(text(client_address("10.0.0.1", "unknown", t)), "10.0.0.1");
  EXPECT_EQ(text(client_address("10.0.0.1", "198.51.100.1, unknown, 10.0.0.8", t)), "10.0.0.8");
  EXPECT_FALSE(client_address("unknown", "198.51.100.1", t));
}

TEST(IdentifyClient, TheKeyWinsElseTheAddressSaysWhereItCameFrom) {
  const TrustedProxies t = trusted({"127.0.0.1"});
  ApiKey key;
  key.scope = "abc123";
  const ClientIdentity by_key = identify_client(&key, "127.0.0.1", "198.51.100.1", t);
  EXPECT_EQ(by_key.source, ClientSource::kApiKey);
  EXPECT_EQ(by_key.id, "key:abc123");
  const ClientIdentity forwarded = identify_client(nullptr, "127.0.0.1", "198.51.100.1", t);
  EXPECT_EQ(forwarded.source, ClientSource::kForwarded);
  EXPECT_EQ(forwarded.id, "addr:198.51.100.1");
  const ClientIdentity spoofed = identify_client(nullptr, "203.0.113.5", "198.51.100.1", t);
  EXPECT_EQ(spoofed.source, ClientSource::kPeer);
  EXPECT_EQ(spoofed.id, "addr:203.0.113.5");
  // The two spellings of one IPv4 peer are one client.
  EXPECT_EQ(identify_client(nullptr, "::ffff:203.0.113.5", "", t).id, spoofed.id);
  EXPECT_EQ(identify_client(nullptr, "unknown", "", t).id, "addr:unknown");
}

}  // namespace
}  // namespace vg::traffic
