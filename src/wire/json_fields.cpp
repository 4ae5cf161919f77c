// Field readers and writers (see json_fields.hpp).
#include "wire/json_fields.hpp"

#include <algorithm>
#include <cmath>

namespace vg::wire::fields {

void fail(const std::string& what) { throw FieldError(what); }

const json::object& as_object(const json::value& v, const char* what) {
  if (!v.is_object()) fail(std::string(what) + " must be an object");
  return v.as_object();
}

const json::value* get(const json::object& o, const char* key) {
  const json::value* v = o.if_contains(key);
  return v && !v->is_null() ? v : nullptr;
}

const json::value& need(const json::object& o, const char* key) {
  const json::value* v = get(o, key);
  if (!v) fail(std::string("missing \"") + key + "\"");
  return *v;
}

std::string str(const json::object& o, const char* key, bool required) {
  const json::value* v = get(o, key);
  if (!v) {
    if (required) fail(std::string("missing \"") + key + "\"");
    return {};
  }
  if (!v->is_string()) fail(std::string("\"") + key + "\" must be a string");
  return std::string(v->as_string());
}

std::int64_t integer(const json::object& o, const char* key, std::int64_t lo, std::int64_t hi, std::int64_t dflt,
                     bool required) {
  const json::value* v = get(o, key);
  if (!v) {
    if (required) fail(std::string("missing \"") + key + "\"");
    return dflt;
  }
  std::int64_t x = 0;
  if (v->is_int64()) {
    x = v->as_int64();
  } else if (v->is_uint64() && v->as_uint64() <= static_cast<std::uint64_t>(kMaxInt64)) {
    x = static_cast<std::int64_t>(v->as_uint64());
  } else {
    fail(std::string("\"") + key + "\" must be an integer");
  }
  if (x < lo || x > hi) {
    fail(std::string("\"") + key + "\" = " + std::to_string(x) + " is outside " + std::to_string(lo) + ".." +
         std::to_string(hi));
  }
  return x;
}

double number(const json::object& o, const char* key, double lo, double hi, double dflt) {
  const json::value* v = get(o, key);
  if (!v) return dflt;
  double x = 0;
  if (v->is_double()) {
    x = v->as_double();
  } else if (v->is_int64()) {
    x = static_cast<double>(v->as_int64());
  } else if (v->is_uint64()) {
    x = static_cast<double>(v->as_uint64());
  } else {
    fail(std::string("\"") + key + "\" must be a number");
  }
  if (!std::isfinite(x) || x < lo || x > hi) fail(std::string("\"") + key + "\" is out of range");
  return x;
}

double duration(const json::object& o, const char* key) { return std::max(0.0, number(o, key, -1e12, 1e12, 0)); }

bool boolean(const json::object& o, const char* key) {
  const json::value* v = get(o, key);
  if (!v) return false;
  if (!v->is_bool()) fail(std::string("\"") + key + "\" must be a boolean");
  return v->as_bool();
}

const json::array* array(const json::object& o, const char* key, std::size_t max) {
  const json::value* v = get(o, key);
  if (!v) return nullptr;
  if (!v->is_array()) fail(std::string("\"") + key + "\" must be an array");
  if (v->as_array().size() > max) fail(std::string("\"") + key + "\" has too many entries");
  return &v->as_array();
}

std::vector<std::int32_t> ids(const json::object& o, const char* key) {
  std::vector<std::int32_t> out;
  if (const json::array* a = array(o, key, kMaxTokens)) {
    out.reserve(a->size());
    for (const json::value& x : *a) {
      if (!x.is_int64() || x.as_int64() < 0 || x.as_int64() > kMaxInt32) {
        fail(std::string("\"") + key + "\" entries must be token ids (integers >= 0)");
      }
      out.push_back(static_cast<std::int32_t>(x.as_int64()));
    }
  }
  return out;
}

std::vector<std::string> strings(const json::object& o, const char* key, std::size_t max) {
  std::vector<std::string> out;
  if (const json::array* a = array(o, key, max)) {
    for (const json::value& x : *a) {
      if (!x.is_string()) fail(std::string("\"") + key + "\" entries must be strings");
      out.emplace_back(x.as_string());
    }
  }
  return out;
}

json::array id_array(const std::vector<std::int32_t>& v) {
  json::array a;
  a.reserve(v.size());
  for (std::int32_t x : v) a.push_back(x);
  return a;
}

json::array string_array(const std::vector<std::string>& v) {
  json::array a;
  for (const std::string& s : v) a.emplace_back(s);
  return a;
}

json::array int_array(const std::vector<std::int64_t>& v) {
  json::array a;
  for (std::int64_t x : v) a.push_back(x);
  return a;
}

}  // namespace vg::wire::fields
