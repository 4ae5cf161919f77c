// TensorModelSpec: config.json of a TorchScript folder (Boost.JSON) and the
// request checks (see tensor_spec.hpp).
#include "model/tensor_spec.hpp"

#include <boost/json.hpp>
#include <algorithm>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>

namespace vg {
namespace json = boost::json;

namespace {

Error spec_error(const std::filesystem::path& path, const std::string& what) {
  return Error(ErrorCode::kModelLoad, path.string() + ": " + what);
}

Error input_error(const std::string& input, const std::string& what) {
  return Error(ErrorCode::kInvalidRequest, "input '" + input + "': " + what);
}

std::optional<std::int64_t> as_int(const json::value& v) {
  if (v.is_int64()) return v.get_int64();
  if (v.is_uint64() && v.get_uint64() <= (1ull << 40)) return static_cast<std::int64_t>(v.get_uint64());
  return std::nullopt;
}

/// Parses inputs/outputs entries; names go into `used_dims`.
Result<std::vector<TensorSpec>> parse_tensors(const json::value* v, const std::string& key,
                                              const std::filesystem::path& path, std::set<std::string>& used_dims) {
  if (v == nullptr || !v->is_array() || v->as_array().empty()) {
    return spec_error(path, "'" + key + "' must be a non-empty array of {name, dtype, shape}");
  }
  std::vector<TensorSpec> out;
  std::set<std::string> names;
  for (std::size_t i = 0; i < v->as_array().size(); ++i) {
    const std::string where = key + "[" + std::to_string(i) + "]";
    const json::value& e = v->as_array()[i];
    if (!e.is_object()) return spec_error(path, "'" + where + "' must be an object");
    const json::object& o = e.as_object();
    for (const auto& kv : o) {
      if (kv.key() != "name" && kv.key() != "dtype" && kv.key() != "shape") {
        return spec_error(path, "'" + where + "' has unknown key '" + std::string(kv.key()) +
                                    "' (known: name, dtype, shape)");
      }
    }
    TensorSpec t;
    const json::value* name = o.if_contains("name");
    if (name == nullptr || !name->is_string() || name->as_string().empty()) {
      return spec_error(path, "'" + where + ".name' must be a non-empty string");
    }
    t.name = std::string(name->as_string());
    if (!names.insert(t.name).second) return spec_error(path, "'" + key + "' names '" + t.name + "' twice");
    const json::value* dtype = o.if_contains("dtype");
    if (dtype == nullptr || !dtype->is_string()) return spec_error(path, "'" + where + ".dtype' must be a string");
    t.dtype = std::string(dtype->as_string());
    if (t.dtype != "float32") {
      return spec_error(path, "'" + where + ".dtype' is '" + t.dtype + "': only float32 is served");
    }
    const json::value* shape = o.if_contains("shape");
    if (shape == nullptr || !shape->is_array() || shape->as_array().empty()) {
      return spec_error(path, "'" + where + ".shape' must be a non-empty array of integers and dimension names");
    }
    for (std::size_t d = 0; d < shape->as_array().size(); ++d) {
      const json::value& s = shape->as_array()[d];
      if (s.is_string() && !s.as_string().empty()) {
        const std::string dim(s.as_string());
        if (dim == "batch" && d != 0) return spec_error(path, "'" + where + ".shape': 'batch' must be the first dimension");
        used_dims.insert(dim);
        t.shape.emplace_back(dim);
      } else if (auto n = as_int(s); n && *n >= 1) {
        t.shape.emplace_back(*n);
      } else {
        return spec_error(path, "'" + where + ".shape[" + std::to_string(d) +
                                    "]' must be a positive integer or a dimension name");
      }
    }
    out.push_back(std::move(t));
  }
  return out;
}

Result<DimRange> parse_dim(const std::string& name, const json::value& v, const std::filesystem::path& path) {
  const std::string where = "dims." + name;
  if (!v.is_object()) return spec_error(path, "'" + where + "' must be an object {min, max}");
  DimRange r;
  r.name = name;
  for (const auto& kv : v.as_object()) {
    if (kv.key() != "min" && kv.key() != "max") {
      return spec_error(path, "'" + where + "' has unknown key '" + std::string(kv.key()) + "' (known: min, max)");
    }
  }
  if (const json::value* min = v.as_object().if_contains("min")) {
    auto n = as_int(*min);
    if (!n || *n < 1) return spec_error(path, "'" + where + ".min' must be an integer >= 1");
    r.min = *n;
  }
  const json::value* max = v.as_object().if_contains("max");
  auto n = max ? as_int(*max) : std::nullopt;
  if (!n) return spec_error(path, "'" + where + ".max' must be an integer (every dimension needs a maximum)");
  r.max = *n;
  if (r.max < r.min) {
    return spec_error(path, "'" + where + "': max " + std::to_string(r.max) + " < min " + std::to_string(r.min));
  }
  return r;
}

}  // namespace

Result<TensorModelSpec> parse_tensor_model_spec(const std::string& json_text, const std::filesystem::path& path) {
  json::error_code ec;
  const json::value root = json::parse(json_text, ec);
  if (ec) return spec_error(path, "not valid JSON: " + ec.message());
  if (!root.is_object()) return spec_error(path, "must be a JSON object");
  const json::object& o = root.as_object();
  for (const auto& kv : o) {
    const std::string_view k = kv.key();
    if (k != "model_type" && k != "inputs" && k != "outputs" && k != "dims" && k != "pad") {
      return spec_error(path, "unknown key '" + std::string(k) + "' (known: model_type, inputs, outputs, dims, pad)");
    }
  }
  const json::value* type = o.if_contains("model_type");
  if (type == nullptr || !type->is_string() || type->as_string() != "torchscript") {
    return spec_error(path, "'model_type' must be \"torchscript\"");
  }
  TensorModelSpec spec;
  std::set<std::string> used;
  auto inputs = parse_tensors(o.if_contains("inputs"), "inputs", path, used);
  if (!inputs.ok()) return std::move(inputs).error();
  spec.inputs = std::move(inputs).value();
  auto outputs = parse_tensors(o.if_contains("outputs"), "outputs", path, used);
  if (!outputs.ok()) return std::move(outputs).error();
  spec.outputs = std::move(outputs).value();

  const json::value* dims = o.if_contains("dims");
  if (dims != nullptr && !dims->is_object()) return spec_error(path, "'dims' must be an object");
  if (dims != nullptr) {
    for (const auto& kv : dims->as_object()) {
      const std::string name(kv.key());
      if (!used.count(name)) return spec_error(path, "'dims." + name + "' is not used by any input or output shape");
      auto r = parse_dim(name, kv.value(), path);
      if (!r.ok()) return std::move(r).error();
      spec.dims.push_back(*r);
    }
  }
  for (const std::string& name : used) {
    if (!spec.dim(name)) return spec_error(path, "dimension '" + name + "' has no range in 'dims' ({min, max})");
  }
  // Output-only dimensions cannot be bound from a request.
  std::set<std::string> input_dims;
  for (const TensorSpec& t : spec.inputs) {
    for (const DimSpec& d : t.shape) {
      if (const auto* s = std::get_if<std::string>(&d)) input_dims.insert(*s);
    }
  }
  for (const TensorSpec& t : spec.outputs) {
    for (const DimSpec& d : t.shape) {
      const auto* s = std::get_if<std::string>(&d);
      if (s && !input_dims.count(*s)) {
        return spec_error(path, "output '" + t.name + "' uses dimension '" + *s + "' that no input has");
      }
    }
  }
  spec.batched = true;
  for (const TensorSpec& t : spec.inputs) {
    const auto* first = std::get_if<std::string>(&t.shape.front());
    if (!first || *first != "batch") spec.batched = false;
  }
  if (!spec.batched && used.count("batch")) {
    return spec_error(path, "'batch' must be the first dimension of every input, or of none");
  }
  if (const json::value* pad = o.if_contains("pad")) {
    if (!pad->is_array()) return spec_error(path, "'pad' must be an array of dimension names");
    for (const json::value& v : pad->as_array()) {
      if (!v.is_string() || v.as_string().empty()) return spec_error(path, "'pad' entries must be dimension names");
      const std::string name(v.as_string());
      if (name == "batch") return spec_error(path, "'pad' names 'batch': requests are batched along it, not padded");
      if (!input_dims.count(name)) {
        return spec_error(path, "'pad' names '" + name + "', which is not a named dimension of any input");
      }
      if (spec.paddable(name)) return spec_error(path, "'pad' names '" + name + "' twice");
      spec.pad.push_back(name);
    }
    if (!spec.pad.empty() && !spec.batched) {
      return spec_error(path, "'pad' needs a 'batch' dimension: padding only serves to batch requests together");
    }
  }
  return spec;
}

Result<TensorModelSpec> read_tensor_model_spec(const std::filesystem::path& dir) {
  const std::filesystem::path path = dir / "config.json";
  std::ifstream in(path);
  if (!in) return spec_error(path, "cannot be read");
  std::stringstream text;
  text << in.rdbuf();
  return parse_tensor_model_spec(text.str(), path);
}

bool is_torchscript_model_dir(const std::filesystem::path& dir) {
  std::ifstream in(dir / "config.json");
  if (!in) return false;
  std::stringstream text;
  text << in.rdbuf();
  json::error_code ec;
  const json::value root = json::parse(text.str(), ec);
  if (ec || !root.is_object()) return false;
  const json::value* type = root.as_object().if_contains("model_type");
  return type != nullptr && type->is_string() && type->as_string() == "torchscript";
}

Status check_inputs(const TensorModelSpec& spec, std::span<const HostTensor> inputs,
                    std::span<const std::string> dtypes) {
  std::set<std::string> seen;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const HostTensor& t = inputs[i];
    const TensorSpec* declared = nullptr;
    for (const TensorSpec& s : spec.inputs) {
      if (s.name == t.name) declared = &s;
    }
    if (!declared) {
      std::string known;
      for (const TensorSpec& s : spec.inputs) known += (known.empty() ? "" : ", ") + s.name;
      return input_error(t.name, "unknown input (the model's inputs: " + known + ")");
    }
    if (!seen.insert(t.name).second) return input_error(t.name, "given twice");
    if (i < dtypes.size() && dtypes[i] != "FP32") {
      return input_error(t.name, "datatype '" + dtypes[i] + "' is not served; the model takes FP32");
    }
  }
  for (const TensorSpec& s : spec.inputs) {
    if (!seen.count(s.name)) return input_error(s.name, "missing");
  }
  std::vector<std::pair<std::string, std::int64_t>> bound;
  for (const HostTensor* t : ordered_inputs(spec, inputs)) {
    const TensorSpec* s = nullptr;
    for (const TensorSpec& d : spec.inputs) {
      if (d.name == t->name) s = &d;
    }
    if (t->shape.size() != s->shape.size()) {
      return input_error(t->name, "rank " + std::to_string(t->shape.size()) + " (shape " + shape_text(t->shape) +
                                      "), the model takes rank " + std::to_string(s->shape.size()) + " " +
                                      shape_text(*s));
    }
    for (std::size_t d = 0; d < s->shape.size(); ++d) {
      const std::int64_t got = t->shape[d];
      if (const auto* fixed = std::get_if<std::int64_t>(&s->shape[d])) {
        if (got != *fixed) {
          return input_error(t->name, "dimension " + std::to_string(d) + " is " + std::to_string(got) +
                                          ", the model takes " + std::to_string(*fixed) + " " + shape_text(*s));
        }
        continue;
      }
      const std::string& name = std::get<std::string>(s->shape[d]);
      const DimRange* r = spec.dim(name);
      if (got < r->min || got > r->max) {
        return input_error(t->name, "dimension '" + name + "' is " + std::to_string(got) + ", outside its range [" +
                                        std::to_string(r->min) + ", " + std::to_string(r->max) + "]");
      }
      bool found = false;
      for (const auto& [n, v] : bound) {
        if (n != name) continue;
        found = true;
        if (v != got) {
          return input_error(t->name, "dimension '" + name + "' is " + std::to_string(got) +
                                          " here but " + std::to_string(v) + " in an earlier input");
        }
      }
      if (!found) bound.emplace_back(name, got);
    }
    if (static_cast<std::int64_t>(t->data.size()) != t->elements()) {
      return input_error(t->name, "data has " + std::to_string(t->data.size()) + " values, shape " +
                                      shape_text(t->shape) + " needs " + std::to_string(t->elements()));
    }
  }
  return Status::Ok();
}

std::vector<const HostTensor*> ordered_inputs(const TensorModelSpec& spec, std::span<const HostTensor> inputs) {
  std::vector<const HostTensor*> out;
  for (const TensorSpec& s : spec.inputs) {
    for (const HostTensor& t : inputs) {
      if (t.name == s.name) {
        out.push_back(&t);
        break;
      }
    }
  }
  return out;
}

std::vector<std::int64_t> bind_shape(const TensorModelSpec& spec, const TensorSpec& t,
                                     std::span<const std::pair<std::string, std::int64_t>> values) {
  std::vector<std::int64_t> out;
  for (const DimSpec& d : t.shape) {
    if (const auto* fixed = std::get_if<std::int64_t>(&d)) {
      out.push_back(*fixed);
      continue;
    }
    const std::string& name = std::get<std::string>(d);
    std::int64_t v = spec.dim(name) ? spec.dim(name)->max : 1;
    for (const auto& [n, x] : values) {
      if (n == name) v = x;
    }
    out.push_back(v);
  }
  return out;
}

std::string shape_text(const TensorSpec& t) {
  std::string s = "[";
  for (std::size_t i = 0; i < t.shape.size(); ++i) {
    if (i) s += ", ";
    if (const auto* fixed = std::get_if<std::int64_t>(&t.shape[i])) {
      s += std::to_string(*fixed);
    } else {
      s += std::get<std::string>(t.shape[i]);
    }
  }
  return s + "]";
}

std::string shape_text(std::span<const std::int64_t> shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace vg
