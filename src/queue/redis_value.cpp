// RedisValue accessors and its readable form (see redis_value.hpp).
#include "queue/redis_value.hpp"

#include <cstdio>

namespace vg::queue {
namespace {

void append_quoted(std::string& out, const std::string& bytes) {
  out.push_back('"');
  for (unsigned char c : bytes) {
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (c < 0x20 || c >= 0x7f) {
      char buf[5];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  out.push_back('"');
}

void append_value(std::string& out, const RedisValue& v) {
  switch (v.kind()) {
    case RedisValue::Kind::kNil: out += "nil"; break;
    case RedisValue::Kind::kInteger: out += std::to_string(*v.as_integer()); break;
    case RedisValue::Kind::kStatus: out += "+" + *v.as_status(); break;
    case RedisValue::Kind::kError: out += "-" + *v.as_error(); break;
    case RedisValue::Kind::kString: append_quoted(out, *v.as_string()); break;
    case RedisValue::Kind::kArray: {
      out.push_back('[');
      bool first = true;
      for (const auto& e : *v.as_array()) {
        if (!first) out += ", ";
        first = false;
        append_value(out, e);
      }
      out.push_back(']');
      break;
    }
  }
}

}  // namespace

std::optional<std::int64_t> RedisValue::as_integer() const {
  if (const auto* v = std::get_if<1>(&v_)) return *v;
  return std::nullopt;
}

const std::string* RedisValue::as_status() const {
  const auto* v = std::get_if<StatusText>(&v_);
  return v ? &v->text : nullptr;
}

const std::string* RedisValue::as_error() const {
  const auto* v = std::get_if<ErrorText>(&v_);
  return v ? &v->text : nullptr;
}

std::string RedisValue::debug_string() const {
  std::string out;
  append_value(out, *this);
  return out;
}

bool operator==(const RedisValue& a, const RedisValue& b) {
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case RedisValue::Kind::kNil: return true;
    case RedisValue::Kind::kInteger: return a.as_integer() == b.as_integer();
    case RedisValue::Kind::kStatus: return *a.as_status() == *b.as_status();
    case RedisValue::Kind::kError: return *a.as_error() == *b.as_error();
    case RedisValue::Kind::kString: return *a.as_string() == *b.as_string();
    case RedisValue::Kind::kArray: return *a.as_array() == *b.as_array();
  }
  return false;
}

}  // namespace vg::queue
