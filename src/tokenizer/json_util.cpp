// json_util.hpp accessors. Any thread.
#include "tokenizer/json_util.hpp"

#include <fstream>
#include <sstream>

#include <boost/json.hpp>

namespace vg::tok {

namespace json = boost::json;

Result<json::value> read_json_file(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) return Error(ErrorCode::kModelLoad, file.string() + ": cannot open");
  std::ostringstream ss;
  ss << in.rdbuf();
  boost::system::error_code ec;
  json::value v = json::parse(ss.str(), ec);
  if (ec) return Error(ErrorCode::kModelLoad, file.string() + ": not valid JSON: " + ec.message());
  return v;
}

std::string json_string(const json::object& o, std::string_view key, std::string def) {
  const json::value* v = o.if_contains(key);
  if (!v) return def;
  if (const json::string* s = v->if_string()) return std::string(*s);
  if (const json::object* obj = v->if_object()) {
    if (const json::value* c = obj->if_contains("content"); c && c->is_string()) return std::string(c->as_string());
  }
  return def;
}

std::int64_t json_int(const json::object& o, std::string_view key, std::int64_t def) {
  const json::value* v = o.if_contains(key);
  if (v && v->is_int64()) return v->as_int64();
  if (v && v->is_uint64()) return static_cast<std::int64_t>(v->as_uint64());
  return def;
}

bool json_bool(const json::object& o, std::string_view key, bool def) {
  const json::value* v = o.if_contains(key);
  return v && v->is_bool() ? v->as_bool() : def;
}

const json::object* json_object(const json::object& o, std::string_view key) {
  const json::value* v = o.if_contains(key);
  return v ? v->if_object() : nullptr;
}

const json::array* json_array(const json::object& o, std::string_view key) {
  const json::value* v = o.if_contains(key);
  return v ? v->if_array() : nullptr;
}

}  // namespace vg::tok
