// redis:// URL parsing and password sources (see redis_url.hpp).
#include "queue/redis_url.hpp"

#include <cctype>
#include <charconv>
#include <fstream>
#include <sstream>

namespace vg::queue {
namespace {

Error url_error(const std::string& what) { return Error(ErrorCode::kConfig, "redis URL: " + what); }

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

bool host_name_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '-' || c == '.' || c == '_';
}

bool ipv6_char(char c) { return std::isxdigit(static_cast<unsigned char>(c)) != 0 || c == ':' || c == '.'; }

// A decimal number of 1..9 digits with no sign, or nullopt.
std::optional<int> parse_small_uint(std::string_view text) {
  if (text.empty() || text.size() > 9) return std::nullopt;
  int value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || value < 0) return std::nullopt;
  return value;
}

Result<RedisUrl> parse_host_port(std::string_view hostport, RedisUrl url) {
  std::string_view port_text;
  bool has_port = false;
  if (!hostport.empty() && hostport.front() == '[') {
    auto close = hostport.find(']');
    if (close == std::string_view::npos) return url_error("unclosed '[' in the host");
    std::string_view host = hostport.substr(1, close - 1);
    if (host.empty()) return url_error("empty IPv6 address");
    for (char c : host) {
      if (!ipv6_char(c)) return url_error("bad character in the IPv6 address '" + std::string(host) + "'");
    }
    url.host = std::string(host);
    std::string_view rest = hostport.substr(close + 1);
    if (!rest.empty()) {
      if (rest.front() != ':') return url_error("unexpected text after ']'");
      has_port = true;
      port_text = rest.substr(1);
    }
  } else {
    auto colon = hostport.find(':');
    std::string_view host = hostport.substr(0, colon);
    if (colon != std::string_view::npos) {
      has_port = true;
      port_text = hostport.substr(colon + 1);
    }
    if (host.empty()) return url_error("empty host");
    for (char c : host) {
      if (!host_name_char(c)) return url_error("bad character '" + std::string(1, c) + "' in the host");
    }
    url.host = std::string(host);
  }
  if (has_port) {
    auto port = parse_small_uint(port_text);
    if (!port || *port < 1 || *port > 65535) {
      return url_error("port '" + std::string(port_text) + "' is not a number in 1..65535");
    }
    url.port = *port;
  }
  return url;
}

}  // namespace

std::string RedisUrl::redacted() const {
  std::ostringstream out;
  out << "redis://";
  if (!user.empty()) out << user << "@";
  if (host.find(':') != std::string::npos) {
    out << "[" << host << "]";
  } else {
    out << host;
  }
  out << ":" << port << "/" << db;
  return out.str();
}

Result<std::string> percent_decode(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '%') {
      out.push_back(text[i]);
      continue;
    }
    if (i + 2 >= text.size()) {
      return url_error("truncated percent escape");
    }
    int hi = hex_value(text[i + 1]);
    int lo = hex_value(text[i + 2]);
    if (hi < 0 || lo < 0) return url_error("bad percent escape (want %XX with hex digits)");
    out.push_back(static_cast<char>(hi * 16 + lo));
    i += 2;
  }
  return out;
}

Result<RedisUrl> parse_redis_url(std::string_view text) {
  constexpr std::string_view kScheme = "redis://";
  if (text.substr(0, 9) == "rediss://") {
    return url_error("rediss:// (TLS) is not supported: hiredis 0.14 has no TLS; use redis:// to a private "
                     "network address or a local TLS tunnel");
  }
  if (text.substr(0, kScheme.size()) != kScheme) {
    return url_error("must start with redis:// (got '" + std::string(text.substr(0, text.find(':'))) + "')");
  }
  std::string_view rest = text.substr(kScheme.size());
  if (rest.find_first_of("?#") != std::string_view::npos) {
    return url_error("query strings and fragments are not supported");
  }
  auto slash = rest.find('/');
  std::string_view authority = rest.substr(0, slash);
  std::string_view path = slash == std::string_view::npos ? std::string_view() : rest.substr(slash + 1);

  RedisUrl url;
  auto at = authority.rfind('@');
  std::string_view hostport = authority;
  if (at != std::string_view::npos) {
    std::string_view userinfo = authority.substr(0, at);
    hostport = authority.substr(at + 1);
    auto colon = userinfo.find(':');
    auto user = percent_decode(userinfo.substr(0, colon));
    if (!user) return url_error("the user: " + user.error().message);
    if (colon == std::string_view::npos) {
      // USER@HOST: the password comes from a file or a variable (with_password).
      if (user->empty()) return url_error("empty user before '@'");
    } else {
      auto password = percent_decode(userinfo.substr(colon + 1));
      if (!password) return url_error("the password: " + password.error().message);
      if (password->empty()) return url_error("empty password");
      url.password = std::move(*password);
    }
    url.user = std::move(*user);
    for (char c : url.user) {
      if (std::isspace(static_cast<unsigned char>(c)) != 0 || c == '\0') {
        return url_error("the user holds a space or control character");
      }
    }
  }
  auto parsed = parse_host_port(hostport, std::move(url));
  if (!parsed) return parsed;
  if (!path.empty()) {
    auto db = parse_small_uint(path);
    if (!db) return url_error("database '" + std::string(path) + "' is not a non-negative number");
    parsed->db = *db;
  }
  return parsed;
}

Result<std::string> read_password_file(const std::string& path) {
  constexpr std::size_t kMaxBytes = 4096;
  std::ifstream in(path, std::ios::binary);
  if (!in) return Error(ErrorCode::kConfig, "redis password file '" + path + "' cannot be read");
  std::string content(kMaxBytes + 1, '\0');
  in.read(content.data(), static_cast<std::streamsize>(content.size()));
  content.resize(static_cast<std::size_t>(in.gcount()));
  if (content.size() > kMaxBytes) {
    return Error(ErrorCode::kConfig, "redis password file '" + path + "' is larger than 4 KiB");
  }
  if (!content.empty() && content.back() == '\n') content.pop_back();
  if (!content.empty() && content.back() == '\r') content.pop_back();
  if (content.empty()) return Error(ErrorCode::kConfig, "redis password file '" + path + "' is empty");
  if (content.find_first_of(std::string_view("\r\n\0", 3)) != std::string::npos) {
    return Error(ErrorCode::kConfig,
                 "redis password file '" + path + "' holds a line break or NUL inside (one line expected)");
  }
  return content;
}

Result<RedisUrl> with_password(RedisUrl url, const PasswordSource& source, const EnvLookup& env) {
  if (source.file.empty() && source.env_var.empty()) return url;
  if (!source.file.empty() && !source.env_var.empty()) {
    return Error(ErrorCode::kConfig, "redis password: give a file or an environment variable, not both");
  }
  if (!url.password.empty()) {
    return Error(ErrorCode::kConfig, "redis password given twice: in the URL and in a " +
                                         std::string(source.file.empty() ? "variable" : "file"));
  }
  if (!source.file.empty()) {
    auto password = read_password_file(source.file);
    if (!password) return password.error();
    url.password = std::move(*password);
    return url;
  }
  std::optional<std::string> value = env ? env(source.env_var) : std::nullopt;
  if (!value || value->empty()) {
    return Error(ErrorCode::kConfig, "redis password variable " + source.env_var + " is unset or empty");
  }
  url.password = std::move(*value);
  return url;
}

}  // namespace vg::queue
