// Reads and writes the TOML config file (see config_file.hpp). The only code
// that sees toml++.
#include "config/config_file.hpp"

#include <toml++/toml.h>

#include <cerrno>
#include <charconv>
#include <climits>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "common/decimal.hpp"
#include "config/config_fields.hpp"
#include "device/device.hpp"

namespace vg {
namespace {

const char* type_name(toml::node_type t) {
  switch (t) {
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a float";
    case toml::node_type::boolean: return "a boolean";
    case toml::node_type::table: return "a table";
    case toml::node_type::array: return "an array";
    case toml::node_type::date: return "a date";
    case toml::node_type::time: return "a time";
    case toml::node_type::date_time: return "a date-time";
    default: return "nothing";
  }
}

bool is_section(std::string_view name) {
  for (const ConfigField& f : config_fields()) {
    if (name == f.section) return true;
  }
  return false;
}

// Reads the file one key at a time; remembers where each key was set.
class Reader {
 public:
  Reader(const std::string& source, ServeConfig& out) : source_(source), out_(out) {}

  Status read_table(const toml::table& table, const std::string& section) {
    for (auto&& [key, node] : table) {
      const std::string name(key.str());
      const int line = static_cast<int>(key.source().begin.line);
      if (section.empty() && node.is_table() && is_section(name)) {
        if (Status st = read_table(*node.as_table(), name); !st.ok()) return st;
        continue;
      }
      if (Status st = read_key(name, node, section, line); !st.ok()) return st;
    }
    return Status::Ok();
  }

  Error error(int line, const std::string& what) const {
    return Error(ErrorCode::kConfig, source_ + (line > 0 ? ":" + std::to_string(line) : "") + ": " + what);
  }

  int line_of(const std::string& key) const {
    auto it = lines_.find(key);
    return it == lines_.end() ? 0 : it->second;
  }

 private:
  Status read_key(const std::string& name, const toml::node& node, const std::string& section, int line) {
    const std::string shown = section.empty() ? name : section + "." + name;
    const ConfigField* field = find_config_field(name);
    if (!field) return error(line, "unknown key '" + shown + "'");
    if (!section.empty() && section != field->section) {
      return error(line, "unknown key '" + shown + "': '" + name + "' belongs in [" + field->section +
                             "] or at the top level");
    }
    if (auto it = lines_.find(name); it != lines_.end()) {
      return error(line, "key '" + name + "' is set twice (first on line " + std::to_string(it->second) + ")");
    }
    lines_[name] = line;
    std::string problem;
    std::visit([&](auto member) { problem = assign(*field, node, out_.*member); }, field->member);
    if (!problem.empty()) return error(line, "key '" + name + "': " + problem);
    if (field->value == ConfigValue::kPath) resolve_path(std::get<std::string ServeConfig::*>(field->member));
    return Status::Ok();
  }

  // A relative path in the file is relative to the file's folder.
  void resolve_path(std::string ServeConfig::*member) {
    std::string& v = out_.*member;
    const std::filesystem::path folder = std::filesystem::path(source_).parent_path();
    if (v.empty() || folder.empty() || std::filesystem::path(v).is_absolute()) return;
    v = (folder / v).lexically_normal().string();
  }

  static std::string expected(const char* what, const toml::node& node) {
    return std::string("expected ") + what + ", got " + type_name(node.type());
  }

  static std::string assign(const ConfigField& field, const toml::node& node, std::string& v) {
    if (auto s = node.value_exact<std::string>()) {
      v = *s;
    } else if (auto i = node.value_exact<std::int64_t>(); field.bytes() && i) {
      if (*i < 0) return "must be >= 0 bytes";
      v = std::to_string(*i);
    } else {
      return expected(field.bytes() ? "a string like \"64MiB\" or an integer (bytes)" : "a string", node);
    }
    return {};
  }
  // A list: one string, or an array of strings (replacing base's list).
  static std::string assign(const ConfigField&, const toml::node& node, std::vector<std::string>& v) {
    if (auto s = node.value_exact<std::string>()) {
      v = {*s};
      return {};
    }
    const toml::array* array = node.as_array();
    if (!array) return expected("a string or an array of strings", node);
    std::vector<std::string> items;
    for (std::size_t i = 0; i < array->size(); ++i) {
      auto s = (*array)[i].value_exact<std::string>();
      if (!s) {
        return "expected a string or an array of strings, got an array with " +
               std::string(type_name((*array)[i].type())) + " at index " + std::to_string(i);
      }
      items.push_back(*s);
    }
    v = std::move(items);
    return {};
  }
  static std::string assign(const ConfigField& field, const toml::node& node, std::int64_t& v) {
    if (auto s = node.value_exact<std::string>(); field.bytes() && s) {
      auto n = parse_bytes(*s);
      if (!n.ok()) return n.error().message;
      v = *n;
      return {};
    }
    auto i = node.value_exact<std::int64_t>();
    if (!i) return expected(field.bytes() ? "a string like \"64MiB\" or an integer (bytes)" : "an integer", node);
    v = *i;
    return {};
  }
  static std::string assign(const ConfigField&, const toml::node& node, int& v) {
    auto i = node.value_exact<std::int64_t>();
    if (!i) return expected("an integer", node);
    if (*i < INT_MIN || *i > INT_MAX) return std::to_string(*i) + " is out of range for a 32-bit integer";
    v = static_cast<int>(*i);
    return {};
  }
  static std::string assign(const ConfigField&, const toml::node& node, double& v) {
    if (auto d = node.value_exact<double>()) {
      v = *d;
    } else if (auto i = node.value_exact<std::int64_t>()) {
      v = static_cast<double>(*i);
    } else {
      return expected("a number", node);
    }
    return {};
  }
  static std::string assign(const ConfigField&, const toml::node& node, bool& v) {
    auto b = node.value_exact<bool>();
    if (!b) return expected("a boolean (true or false)", node);
    v = *b;
    return {};
  }

  const std::string& source_;
  ServeConfig& out_;
  std::map<std::string, int> lines_;
};

std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

// Shortest plain decimal that reads back as the same double (common/decimal),
// always with a '.' or 'e' so that TOML reads it as a float.
std::string float_text(double d) {
  if (!std::isfinite(d)) return std::isnan(d) ? "nan" : (d > 0 ? "inf" : "-inf");
  std::string s = format_decimal(d);
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

std::string value_text(const ConfigField& field, const ServeConfig& c) {
  return std::visit(
      [&](auto member) -> std::string {
        const auto& v = c.*member;
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, std::string>) {
          // A path as an absolute one: the printed file means the same
          // wherever it is saved (its relative paths would be its folder's).
          if (field.value == ConfigValue::kPath && !v.empty()) {
            return quoted(std::filesystem::absolute(v).lexically_normal().string());
          }
          return quoted(v);
        } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
          // One entry as a plain string (the common case reads as before),
          // several as an array; the reader takes both.
          if (v.size() == 1) return quoted(v.front());
          std::string out = "[";
          for (std::size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + quoted(v[i]);
          return out + "]";
        } else if constexpr (std::is_same_v<T, bool>) {
          return v ? "true" : "false";
        } else if constexpr (std::is_same_v<T, double>) {
          return float_text(v);
        } else {
          return std::to_string(v);
        }
      },
      field.member);
}

}  // namespace

Result<ServeConfig> parse_config_toml(std::string_view text, const std::string& source, const ServeConfig& base) {
  toml::table table;
  try {
    table = toml::parse(text, std::string_view(source));
  } catch (const toml::parse_error& e) {
    return Error(ErrorCode::kConfig, source + ":" + std::to_string(e.source().begin.line) + ":" +
                                         std::to_string(e.source().begin.column) +
                                         ": not valid TOML: " + std::string(e.description()));
  }
  ServeConfig out = base;
  Reader reader(source, out);
  if (Status st = reader.read_table(table, ""); !st.ok()) return st.error();
  if (auto p = out.check()) return reader.error(reader.line_of(p->key), "key '" + p->key + "': " + p->what);
  return out;
}

Result<ServeConfig> load_config_file(const std::string& path, const ServeConfig& base) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Error(ErrorCode::kConfig, "cannot read config file '" + path + "': " + std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return Error(ErrorCode::kConfig, "cannot read config file '" + path + "'");
  return parse_config_toml(text.str(), path, base);
}

std::string format_config_toml(const ServeConfig& config) {
  std::string out;
  std::string section;
  for (const ConfigField& f : config_fields()) {
    if (section != f.section) {
      section = f.section;
      out += (out.empty() ? "[" : "\n[") + section + "]\n";
    }
    out += "# " + std::string(f.help) + "\n";
    out += std::string(f.key) + " = " + value_text(f, config) + "\n";
  }
  return out;
}

}  // namespace vg
