// Where the shared queue's Redis is and who we are to it: a parsed
// `redis://[USER[:PASSWORD]@]HOST[:PORT][/DB]` URL, and the password taken
// from a file or an environment variable instead of the URL, so that the
// command line (which `ps` shows) never carries it. Pure functions; no
// getenv here: the caller (main) passes a lookup. Any thread.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "common/error.hpp"

namespace vg::queue {

/// One Redis endpoint and its credentials.
struct RedisUrl {
  std::string host;       ///< a name or an IP address (IPv6 without its brackets)
  int port = 6379;        ///< TCP port, 1..65535
  std::string user;       ///< ACL user (Redis 6+); empty: the default user
  std::string password;   ///< empty: no AUTH on connect
  int db = 0;             ///< logical database, SELECTed on connect when not 0

  /// The URL without its password (`redis://alice@host:6379/2`), for logs and errors.
  std::string redacted() const;
};

/// Parses `redis://[USER[:PASSWORD]@]HOST[:PORT][/DB]` (also
/// `redis://:PASSWORD@HOST`, the default user, and `redis://USER@HOST`, whose
/// password then comes from with_password()). USER and PASSWORD are
/// percent-decoded (`%40` is `@`); HOST is a name, an IPv4 address or an IPv6
/// address in brackets; PORT defaults to 6379, DB to 0.
/// Errors: kConfig naming what is wrong (another scheme, `rediss://` since
/// hiredis 0.14 has no TLS, a bad percent escape, an empty host, a port out
/// of range, a query string, an empty password, ...). The message
/// never repeats the password.
Result<RedisUrl> parse_redis_url(std::string_view url);

/// Where the password comes from when the URL does not carry it. At most one
/// of the two may be set.
struct PasswordSource {
  std::string file;     ///< a file holding the password (one trailing newline is dropped)
  std::string env_var;  ///< the name of an environment variable holding it
};

/// Looks up an environment variable (main passes one over getenv; tests a map).
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;

/// Reads a password file: its content with one trailing "\n" or "\r\n"
/// dropped. Errors: kConfig when it cannot be read, is empty, is larger than
/// 4 KiB, or holds a line break or a NUL inside.
Result<std::string> read_password_file(const std::string& path);

/// `url` with its password taken from `source` (unchanged when `source` is
/// empty). Errors: kConfig when both the URL and `source` give a password,
/// when both file and env_var are set, when the variable is unset or empty,
/// or as read_password_file().
Result<RedisUrl> with_password(RedisUrl url, const PasswordSource& source, const EnvLookup& env);

/// Percent-decodes `text` (`%XX`, hex digits of either case; `+` stays `+`).
/// Errors: kConfig on a truncated or non-hex escape.
Result<std::string> percent_decode(std::string_view text);

}  // namespace vg::queue
