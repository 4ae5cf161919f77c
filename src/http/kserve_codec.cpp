// KServe v2 JSON codec (see kserve_codec.hpp).
#include "http/kserve_codec.hpp"

#include <charconv>
#include <cmath>

#include "common/decimal.hpp"
#include "http/json_fields.hpp"

namespace vg::httpd {
namespace json = boost::json;
using json_fields::invalid;

namespace {

constexpr std::size_t kMaxRank = 8;

/// Appends the numbers of a flat or nested array; false on a non-number.
bool flatten(const json::value& v, std::vector<float>& out, int depth) {
  if (v.is_number()) {
    out.push_back(static_cast<float>(v.to_number<double>()));
    return true;
  }
  if (!v.is_array() || depth > static_cast<int>(kMaxRank)) return false;
  for (const json::value& e : v.as_array()) {
    if (!flatten(e, out, depth + 1)) return false;
  }
  return true;
}

Status refuse_binary(const json::object* parameters, const std::string& where) {
  if (parameters == nullptr) return Status::Ok();
  for (const char* key : {"binary_data", "binary_data_size", "binary_data_output"}) {
    if (parameters->contains(key)) {
      return invalid(where + " parameter '" + std::string(key) +
                     "': the binary tensor extension is not supported; send the tensors as JSON \"data\"");
    }
  }
  for (const auto& kv : *parameters) {
    return invalid(where + " parameter '" + std::string(kv.key()) + "' is not supported");
  }
  return Status::Ok();
}

Result<const json::object*> parameters_of(const json::object& o, const std::string& where) {
  const json::value* p = o.if_contains("parameters");
  if (p == nullptr || p->is_null()) return static_cast<const json::object*>(nullptr);
  if (!p->is_object()) return invalid(where + " 'parameters' must be an object");
  return &p->as_object();
}

Result<HostTensor> decode_input(const json::value& v, std::size_t index, std::string* dtype) {
  const std::string where = "inputs[" + std::to_string(index) + "]";
  if (!v.is_object()) return invalid(where + " must be an object {name, shape, datatype, data}");
  const json::object& o = v.as_object();
  HostTensor t;
  const json::value* name = o.if_contains("name");
  if (name == nullptr || !name->is_string() || name->as_string().empty()) {
    return invalid(where + ".name must be a non-empty string");
  }
  t.name = std::string(name->as_string());
  const std::string in = "input '" + t.name + "'";
  for (const auto& kv : o) {
    const std::string_view k = kv.key();
    if (k != "name" && k != "shape" && k != "datatype" && k != "data" && k != "parameters") {
      return invalid(in + ": unknown field '" + std::string(k) + "' (known: name, shape, datatype, data, parameters)");
    }
  }
  auto params = parameters_of(o, in);
  if (!params.ok()) return std::move(params).error();
  if (Status st = refuse_binary(*params, in); !st.ok()) return st.error();
  const json::value* datatype = o.if_contains("datatype");
  if (datatype == nullptr || !datatype->is_string()) return invalid(in + ": 'datatype' must be a string such as \"FP32\"");
  *dtype = std::string(datatype->as_string());
  const json::value* shape = o.if_contains("shape");
  if (shape == nullptr || !shape->is_array()) return invalid(in + ": 'shape' must be an array of integers");
  if (shape->as_array().size() > kMaxRank) return invalid(in + ": rank above " + std::to_string(kMaxRank));
  std::int64_t elements = 1;
  for (const json::value& d : shape->as_array()) {
    std::int64_t n = -1;
    if (d.is_int64()) n = d.get_int64();
    else if (d.is_uint64() && d.get_uint64() < (1ull << 40)) n = static_cast<std::int64_t>(d.get_uint64());
    if (n < 0 || n > (std::int64_t{1} << 40)) return invalid(in + ": 'shape' entries must be integers >= 0");
    t.shape.push_back(n);
    elements = n == 0 ? 0 : std::min<std::int64_t>(elements * n, std::int64_t{1} << 40);
  }
  const json::value* data = o.if_contains("data");
  if (data == nullptr || !data->is_array()) {
    return invalid(in + ": 'data' must be an array of numbers (flat or nested, row-major)");
  }
  if (!flatten(*data, t.data, 0)) return invalid(in + ": 'data' must hold only numbers");
  for (float x : t.data) {
    if (!std::isfinite(x)) return invalid(in + ": 'data' holds a value outside the float32 range");
  }
  (void)elements;  // the length is checked against the shape with the model (check_inputs)
  return t;
}

void put_float(std::string& out, float x) {
  if (!std::isfinite(x)) {
    out += "null";
    return;
  }
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, x, std::chars_format::fixed);
  if (r.ec != std::errc()) {
    out += format_decimal(static_cast<double>(x));
    return;
  }
  out.append(buf, r.ptr);
}

json::array shape_json(const TensorSpec& t) {
  json::array a;
  for (const DimSpec& d : t.shape) {
    if (const auto* fixed = std::get_if<std::int64_t>(&d)) a.emplace_back(*fixed);
    else a.emplace_back(-1);
  }
  return a;
}

json::array tensors_json(const std::vector<TensorSpec>& specs) {
  json::array out;
  for (const TensorSpec& t : specs) {
    json::array names;
    for (const DimSpec& d : t.shape) {
      if (const auto* fixed = std::get_if<std::int64_t>(&d)) names.emplace_back(*fixed);
      else names.emplace_back(json_fields::safe(std::get<std::string>(d)));
    }
    out.push_back(json::object{{"name", json_fields::safe(t.name)}, {"datatype", "FP32"}, {"shape", shape_json(t)},
                               {"dims", names}});
  }
  return out;
}

}  // namespace

Result<TensorInferRequest> decode_tensor_infer_request(std::string_view body, const std::string& model) {
  json::error_code ec;
  json::value root = json::parse(body, ec);
  if (ec) return invalid("request body is not valid JSON: " + ec.message());
  if (!root.is_object()) return invalid("request body must be a JSON object with \"inputs\"");
  const json::object& o = root.as_object();
  for (const auto& kv : o) {
    const std::string_view k = kv.key();
    if (k != "id" && k != "inputs" && k != "outputs" && k != "parameters") {
      return invalid("unknown field '" + std::string(k) + "' (known: id, inputs, outputs, parameters)");
    }
  }
  TensorInferRequest r;
  r.model = model;
  if (const json::value* id = o.if_contains("id"); id != nullptr && !id->is_null()) {
    if (!id->is_string()) return invalid("'id' must be a string");
    r.id = std::string(id->as_string());
  }
  auto params = parameters_of(o, "request");
  if (!params.ok()) return std::move(params).error();
  if (const json::object* p = *params) {
    json::object rest = *p;
    if (const json::value* t = p->if_contains("timeout")) {
      if (!t->is_number() || !(t->to_number<double>() > 0)) return invalid("parameter 'timeout' must be seconds > 0");
      r.timeout_s = t->to_number<double>();
      rest.erase("timeout");
    }
    if (const json::value* pr = p->if_contains("priority")) {
      std::optional<Priority> parsed;
      if (pr->is_string()) parsed = parse_priority(std::string(pr->as_string()));
      else if (pr->is_int64()) parsed = parse_priority(std::to_string(pr->get_int64()));
      if (!parsed) return invalid("parameter 'priority' must be \"low\", \"normal\", \"high\" or 0..2");
      r.priority = parsed;
      rest.erase("priority");
    }
    if (Status st = refuse_binary(&rest, "request"); !st.ok()) return st.error();
  }
  const json::value* inputs = o.if_contains("inputs");
  if (inputs == nullptr || !inputs->is_array() || inputs->as_array().empty()) {
    return invalid("'inputs' must be a non-empty array of {name, shape, datatype, data}");
  }
  for (std::size_t i = 0; i < inputs->as_array().size(); ++i) {
    std::string dtype;
    auto t = decode_input(inputs->as_array()[i], i, &dtype);
    if (!t.ok()) return std::move(t).error();
    r.inputs.push_back(std::move(t).value());
    r.dtypes.push_back(std::move(dtype));
  }
  if (const json::value* outputs = o.if_contains("outputs"); outputs != nullptr && !outputs->is_null()) {
    if (!outputs->is_array()) return invalid("'outputs' must be an array of {name}");
    for (const json::value& v : outputs->as_array()) {
      if (!v.is_object() || !v.as_object().contains("name") || !v.as_object().at("name").is_string()) {
        return invalid("each 'outputs' entry must be an object with a string 'name'");
      }
      const std::string name(v.as_object().at("name").as_string());
      for (const auto& kv : v.as_object()) {
        if (kv.key() != "name" && kv.key() != "parameters") {
          return invalid("output '" + name + "': unknown field '" + std::string(kv.key()) + "'");
        }
      }
      auto op = parameters_of(v.as_object(), "output '" + name + "'");
      if (!op.ok()) return std::move(op).error();
      if (Status st = refuse_binary(*op, "output '" + name + "'"); !st.ok()) return st.error();
      r.outputs.push_back(name);
    }
  }
  return r;
}

std::string encode_tensor_infer_response(const std::string& model, const std::string& id, const TensorResult& result,
                                         const std::vector<std::string>& only, std::int64_t reserved_bytes) {
  std::string out = "{\"model_name\":" + json_fields::serialize(json::value(json_fields::safe(model))) +
                    ",\"model_version\":\"1\"";
  if (!id.empty()) out += ",\"id\":" + json_fields::serialize(json::value(json_fields::safe(id)));
  out += ",\"outputs\":[";
  bool first = true;
  for (const HostTensor& t : result.outputs) {
    if (!only.empty() && std::find(only.begin(), only.end(), t.name) == only.end()) continue;
    if (!first) out += ",";
    first = false;
    out += "{\"name\":" + json_fields::serialize(json::value(json_fields::safe(t.name))) +
           ",\"datatype\":\"FP32\",\"shape\":[";
    for (std::size_t i = 0; i < t.shape.size(); ++i) out += (i ? "," : "") + std::to_string(t.shape[i]);
    out += "],\"data\":[";
    out.reserve(out.size() + t.data.size() * 12);
    for (std::size_t i = 0; i < t.data.size(); ++i) {
      if (i) out += ',';
      put_float(out, t.data[i]);
    }
    out += "]}";
  }
  out += "],\"parameters\":" + json_fields::serialize(json::object{{"batch_requests", result.batch_requests},
                                                                   {"queue_ms", result.queue_ms},
                                                                   {"compute_ms", result.compute_ms},
                                                                   {"reserved_bytes", reserved_bytes}});
  return out + "}";
}

std::string encode_tensor_model_metadata(const TensorModelInfo& info) {
  const TensorMemoryProfile& p = info.profile;
  json::object dims;
  for (const DimRange& d : info.spec.dims) dims[d.name] = json::object{{"min", d.min}, {"max", d.max}};
  json::array devices;
  for (const std::string& d : info.devices) devices.emplace_back(json_fields::safe(d));
  json::array samples;
  for (const PeakSample& s : p.samples) {
    json::array shape;
    for (std::int64_t d : s.shape) shape.emplace_back(d);
    samples.push_back(json::object{{"shape", shape},
                                   {"elements", s.elements},
                                   {"peak_bytes", s.peak_bytes},
                                   {"predicted_bytes", s.predicted_bytes},
                                   {"held_out", s.held_out}});
  }
  json::object profile{{"resident_bytes", p.resident_bytes},
                       {"fixed_bytes", p.fixed_bytes},
                       {"bytes_per_element", p.bytes_per_element},
                       {"safety_factor", p.safety_factor},
                       {"held_out_min_error", p.held_out_min_error},
                       {"held_out_max_error", p.held_out_max_error},
                       {"samples", samples}};
  json::object o{{"name", json_fields::safe(info.id)},
                 {"versions", json::array{"1"}},
                 {"platform", "pytorch_torchscript"},
                 {"inputs", tensors_json(info.spec.inputs)},
                 {"outputs", tensors_json(info.spec.outputs)},
                 {"dims", dims},
                 {"max_batch", info.max_batch},
                 {"devices", devices},
                 {"budget_bytes", info.budget_bytes},
                 {"memory_profile", profile}};
  return json_fields::serialize(o);
}

std::string encode_server_metadata() {
  return json_fields::serialize(json::object{{"name", "vramgate"}, {"version", "0.1.0"}, {"extensions", json::array{}}});
}

}  // namespace vg::httpd
