// API keys (docs/admission-and-memory.md "Traffic policies"): the table read from --api-keys FILE
// and the lookup of a bearer token. Keys are kept only as SHA-256 digests, so
// a lookup compares digests (no timing leak on the key) and nothing here can
// log a key: the logs carry `id`, the first 8 hex characters of the digest.
//
// File format, one key a line, '#' starts a comment, blank lines ignored:
//   sk-abc rate=5 burst=10 priority=high
// rate: requests/s (> 0), burst: bucket size (>= 1), priority: low|normal|high|0..2.
//
// Thread-safety: immutable after parse(); any thread.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>

#include "common/error.hpp"
#include "common/priority.hpp"
#include "traffic/digest.hpp"

namespace vg::traffic {

struct ApiKey {
  std::string id;  ///< key_id(): 8 hex characters, safe to log
  /// The key's full SHA-256 in hex: names its rate bucket and scopes its
  /// Idempotency-Keys (not logged: ids are enough there).
  std::string scope;
  std::optional<double> rate;   ///< requests/s; nullopt: the server's --rate-limit
  std::optional<double> burst;  ///< bucket size; nullopt: the server's --rate-burst
  /// Default and cap of the key's requests; nullopt: default normal, cap normal.
  std::optional<Priority> priority;
};

class ApiKeyTable {
 public:
  /// Parses the file's text. Errors: kConfig "SOURCE:LINE: ..." for a bad
  /// option, a duplicate key, a key with spaces or control characters, or no
  /// key at all. The message never quotes a key.
  static Result<ApiKeyTable> parse(std::string_view text, std::string_view source);
  /// Reads and parses `path` (kConfig when it cannot be read).
  static Result<ApiKeyTable> load(const std::string& path);

  /// The key for an `Authorization` header value ("Bearer KEY", scheme
  /// case-insensitive); nullptr when absent, malformed or unknown.
  const ApiKey* authorize(std::string_view authorization) const;
  /// The key itself; nullptr when unknown.
  const ApiKey* find(std::string_view key) const;

  std::size_t size() const { return keys_.size(); }
  /// Whether some key has a rate of its own (rate=).
  bool has_rates() const;

 private:
  std::unordered_map<Digest, ApiKey, DigestHash> keys_;
};

/// The token of "Bearer TOKEN" (scheme case-insensitive, surrounding spaces
/// trimmed); nullopt for any other form.
std::optional<std::string_view> bearer_token(std::string_view authorization);

}  // namespace vg::traffic
