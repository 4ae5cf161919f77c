// The API key table (see api_keys.hpp). Parsed once at start-up; then
// immutable and read from any thread.
#include "traffic/api_keys.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <fstream>
#include <sstream>
#include <vector>

#include "common/text.hpp"

namespace vg::traffic {
namespace {

std::optional<double> parse_number(std::string_view v) {
  double x = 0;
  const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  if (v.empty() || ec != std::errc() || end != v.data() + v.size() || !std::isfinite(x)) return std::nullopt;
  return x;
}

bool printable_token(std::string_view s) {
  for (unsigned char c : s) {
    if (c <= 0x20 || c == 0x7f) return false;
  }
  return !s.empty();
}

}  // namespace

std::optional<std::string_view> bearer_token(std::string_view authorization) {
  authorization = trim_whitespace(authorization);
  constexpr std::string_view kScheme = "bearer";
  if (authorization.size() <= kScheme.size()) return std::nullopt;
  for (std::size_t i = 0; i < kScheme.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(authorization[i])) != kScheme[i]) return std::nullopt;
  }
  if (authorization[kScheme.size()] != ' ') return std::nullopt;
  const std::string_view token = trim_whitespace(authorization.substr(kScheme.size() + 1));
  if (!printable_token(token)) return std::nullopt;
  return token;
}

Result<ApiKeyTable> ApiKeyTable::parse(std::string_view text, std::string_view source) {
  ApiKeyTable table;
  int line_no = 0;
  const auto fail = [&](const std::string& what) {
    return Error(ErrorCode::kConfig, std::string(source) + ":" + std::to_string(line_no) + ": " + what);
  };
  while (!text.empty()) {
    ++line_no;
    const std::size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    if (const std::size_t hash = line.find('#'); hash != std::string_view::npos) line = line.substr(0, hash);
    line = trim_whitespace(line);
    if (line.empty()) continue;

    std::vector<std::string_view> words;
    std::size_t pos = 0;
    while (pos < line.size()) {
      while (pos < line.size() && (line[pos] == ' ' || line[pos] == '\t')) ++pos;
      std::size_t end = pos;
      while (end < line.size() && line[end] != ' ' && line[end] != '\t') ++end;
      if (end > pos) words.push_back(line.substr(pos, end - pos));
      pos = end;
    }
    const std::string_view key = words.front();
    if (!printable_token(key)) return fail("a key may hold only printable characters");
    if (key.find('=') != std::string_view::npos) return fail("the line must start with the key, before any option");
    ApiKey entry;
    entry.id = key_id(key);
    const Digest digest = sha256(key);
    entry.scope = hex(digest);
    for (std::size_t i = 1; i < words.size(); ++i) {
      const std::string_view w = words[i];
      const std::size_t eq = w.find('=');
      const std::string_view name = w.substr(0, eq);
      const std::string_view value = eq == std::string_view::npos ? std::string_view() : w.substr(eq + 1);
      if (eq == std::string_view::npos) return fail("expected name=value after the key, got '" + std::string(w) + "'");
      if (name == "rate") {
        auto r = parse_number(value);
        if (!r || *r <= 0 || *r > 1e6) return fail("rate must be a number of requests/s in (0, 1000000]");
        entry.rate = *r;
      } else if (name == "burst") {
        auto b = parse_number(value);
        if (!b || *b < 1 || *b > 1e6) return fail("burst must be a number of requests in [1, 1000000]");
        entry.burst = *b;
      } else if (name == "priority") {
        auto p = parse_priority(value);
        if (!p) return fail("priority must be low, normal, high or 0..2");
        entry.priority = *p;
      } else {
        return fail("unknown option '" + std::string(name) + "' (expected rate, burst or priority)");
      }
    }
    if (!table.keys_.emplace(digest, std::move(entry)).second) {
      return fail("duplicate key (key id " + key_id(key) + ")");
    }
  }
  if (table.keys_.empty()) {
    line_no = std::max(line_no, 1);
    return fail("no API key in the file");
  }
  return table;
}

Result<ApiKeyTable> ApiKeyTable::load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Error(ErrorCode::kConfig, "cannot read API key file '" + path + "'");
  std::ostringstream text;
  text << in.rdbuf();
  return parse(text.str(), path);
}

const ApiKey* ApiKeyTable::find(std::string_view key) const {
  const auto it = keys_.find(sha256(key));
  return it == keys_.end() ? nullptr : &it->second;
}

const ApiKey* ApiKeyTable::authorize(std::string_view authorization) const {
  const std::optional<std::string_view> token = bearer_token(authorization);
  return token ? find(*token) : nullptr;
}

bool ApiKeyTable::has_rates() const {
  for (const auto& [digest, key] : keys_) {
    if (key.rate) return true;
  }
  return false;
}

}  // namespace vg::traffic
