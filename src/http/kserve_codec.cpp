// KServe v2 JSON codec (see kserve_codec.hpp).
#include "http/kserve_codec.hpp"

#include <algorithm>
#include <bit>
#include <charconv>
#include <cmath>
#include <cstring>
#include <utility>

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

/// Refuses every parameter of `parameters` (those known were taken out).
Status refuse_unknown(const json::object* parameters, const std::string& where) {
  if (parameters == nullptr) return Status::Ok();
  for (const auto& kv : *parameters) {
    return invalid(where + " parameter '" + std::string(kv.key()) + "' is not supported");
  }
  return Status::Ok();
}

/// A boolean parameter of the binary tensor extension.
Result<bool> bool_parameter(const json::value& v, const std::string& where, const char* key) {
  if (!v.is_bool()) return invalid(where + " parameter '" + key + "' must be true or false");
  return v.get_bool();
}

/// Bytes per element of a KServe datatype in the binary extension; 0 for
/// BYTES (variable), -1 for an unknown name.
int datatype_bytes(std::string_view dtype) {
  if (dtype == "BOOL" || dtype == "UINT8" || dtype == "INT8") return 1;
  if (dtype == "UINT16" || dtype == "INT16" || dtype == "FP16" || dtype == "BF16") return 2;
  if (dtype == "UINT32" || dtype == "INT32" || dtype == "FP32") return 4;
  if (dtype == "UINT64" || dtype == "INT64" || dtype == "FP64") return 8;
  if (dtype == "BYTES") return 0;
  return -1;
}

Result<const json::object*> parameters_of(const json::object& o, const std::string& where) {
  const json::value* p = o.if_contains("parameters");
  if (p == nullptr || p->is_null()) return static_cast<const json::object*>(nullptr);
  if (!p->is_object()) return invalid(where + " 'parameters' must be an object");
  return &p->as_object();
}

/// One input; `*binary_size` is set when its data comes as binary
/// (binary_data_size), and then t.data is left empty for the caller to fill.
Result<HostTensor> decode_input(const json::value& v, std::size_t index, std::string* dtype,
                                std::optional<std::int64_t>* binary_size) {
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
  if (const json::object* p = *params) {
    json::object rest = *p;
    if (const json::value* size = p->if_contains("binary_data_size")) {
      std::int64_t n = -1;
      if (size->is_int64())
        n = size->get_int64();
      else if (size->is_uint64() && size->get_uint64() < (1ull << 62))
        n = static_cast<std::int64_t>(size->get_uint64());
      if (n < 0) return invalid(in + ": parameter 'binary_data_size' must be an integer >= 0 (bytes)");
      *binary_size = n;
      rest.erase("binary_data_size");
    }
    if (Status st = refuse_unknown(&rest, in); !st.ok()) return st.error();
  }
  const json::value* datatype = o.if_contains("datatype");
  if (datatype == nullptr || !datatype->is_string())
    return invalid(in + ": 'datatype' must be a string such as \"FP32\"");
  *dtype = std::string(datatype->as_string());
  const json::value* shape = o.if_contains("shape");
  if (shape == nullptr || !shape->is_array()) return invalid(in + ": 'shape' must be an array of integers");
  if (shape->as_array().size() > kMaxRank) return invalid(in + ": rank above " + std::to_string(kMaxRank));
  for (const json::value& d : shape->as_array()) {
    std::int64_t n = -1;
    if (d.is_int64())
      n = d.get_int64();
    else if (d.is_uint64() && d.get_uint64() < (1ull << 40))
      n = static_cast<std::int64_t>(d.get_uint64());
    if (n < 0 || n > (std::int64_t{1} << 40)) return invalid(in + ": 'shape' entries must be integers >= 0");
    t.shape.push_back(n);
  }
  const json::value* data = o.if_contains("data");
  if (*binary_size) {
    if (data != nullptr) return invalid(in + ": has both 'data' and parameter 'binary_data_size'; send one");
    return t;
  }
  if (data == nullptr || !data->is_array()) {
    return invalid(in + ": 'data' must be an array of numbers (flat or nested, row-major)");
  }
  if (!flatten(*data, t.data, 0)) return invalid(in + ": 'data' must hold only numbers");
  for (float x : t.data) {
    if (!std::isfinite(x)) return invalid(in + ": 'data' holds a value outside the float32 range");
  }
  // The length is checked against the shape with the model (check_inputs).
  return t;
}

/// "[2, 3]" (vg_http does not link the model library's shape_text).
std::string dims_text(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

/// Fills `t.data` from `bytes` (FP32 little-endian) after checking the size
/// against the shape.
Status fill_binary(HostTensor& t, const std::string& dtype, std::string_view bytes) {
  const std::string in = "input '" + t.name + "'";
  const int width = datatype_bytes(dtype);
  if (width == 0) {
    return invalid(in + ": datatype 'BYTES' is not supported (the models served take FP32)");
  }
  if (width < 0) return invalid(in + ": unknown datatype '" + dtype + "'");
  // Elements, saturating: shape entries are < 2^40 and rank <= 8.
  std::int64_t elements = 1;
  for (std::int64_t d : t.shape) {
    if (d == 0) {
      elements = 0;
      break;
    }
    elements = elements > (std::int64_t{1} << 50) / d ? (std::int64_t{1} << 50) : elements * d;
  }
  const std::int64_t want = elements * width;
  if (static_cast<std::int64_t>(bytes.size()) != want) {
    return invalid(in + ": binary_data_size is " + std::to_string(bytes.size()) + " bytes, shape " +
                   dims_text(t.shape) + " of " + dtype + " needs " + std::to_string(want));
  }
  if (dtype != "FP32") return invalid(in + ": datatype '" + dtype + "' is not served; the model takes FP32");
  static_assert(std::endian::native == std::endian::little, "the binary tensor extension is little-endian");
  t.data.resize(static_cast<std::size_t>(elements));
  if (elements > 0) std::memcpy(t.data.data(), bytes.data(), bytes.size());
  for (float x : t.data) {
    if (!std::isfinite(x)) return invalid(in + ": binary data holds a NaN or an infinity");
  }
  return Status::Ok();
}

/// The Inference-Header-Content-Length value: a byte count within the body.
Result<std::size_t> header_bytes(std::string_view value, std::size_t body_size) {
  std::size_t n = 0;
  const auto [ptr, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
  if (value.empty() || ec != std::errc() || ptr != value.data() + value.size()) {
    return invalid("header Inference-Header-Content-Length must be a byte count, got '" +
                   std::string(value.substr(0, 40)) + "'");
  }
  if (n > body_size) {
    return invalid("header Inference-Header-Content-Length is " + std::to_string(n) + " but the body has only " +
                   std::to_string(body_size) + " bytes");
  }
  return n;
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
    if (const auto* fixed = std::get_if<std::int64_t>(&d))
      a.emplace_back(*fixed);
    else
      a.emplace_back(-1);
  }
  return a;
}

json::array tensors_json(const std::vector<TensorSpec>& specs) {
  json::array out;
  for (const TensorSpec& t : specs) {
    json::array names;
    for (const DimSpec& d : t.shape) {
      if (const auto* fixed = std::get_if<std::int64_t>(&d))
        names.emplace_back(*fixed);
      else
        names.emplace_back(json_fields::safe(std::get<std::string>(d)));
    }
    out.push_back(json::object{
        {"name", json_fields::safe(t.name)}, {"datatype", "FP32"}, {"shape", shape_json(t)}, {"dims", names}});
  }
  return out;
}

/// The body's JSON header and the binary data after it: with the
/// Inference-Header-Content-Length header, its first that many bytes are
/// the JSON; without, all of it (and no binary data).
Result<std::pair<std::string_view, std::string_view>> split_body(std::string_view body,
                                                                 std::optional<std::string_view> header_length) {
  if (!header_length) return std::pair{body, std::string_view()};
  auto n = header_bytes(*header_length, body.size());
  if (!n.ok()) return std::move(n).error();
  return std::pair{body.substr(0, *n), body.substr(*n)};
}

/// The request's JSON object (checked for unknown fields).
Result<json::value> parse_request_json(std::string_view header, bool has_header_length) {
  json::error_code ec;
  json::value root = json::parse(header, ec);
  if (ec) {
    return invalid(
        std::string(has_header_length ? "the JSON header (Inference-Header-Content-Length bytes)" : "request body") +
        " is not valid JSON: " + ec.message());
  }
  if (!root.is_object()) return invalid("request body must be a JSON object with \"inputs\"");
  for (const auto& kv : root.as_object()) {
    const std::string_view k = kv.key();
    if (k != "id" && k != "inputs" && k != "outputs" && k != "parameters") {
      return invalid("unknown field '" + std::string(k) + "' (known: id, inputs, outputs, parameters)");
    }
  }
  return root;
}

/// The request's "parameters": timeout, priority and binary_data_output.
Status decode_request_parameters(const json::object& o, TensorInferRequest& r) {
  auto params = parameters_of(o, "request");
  if (!params.ok()) return std::move(params).error();
  const json::object* p = *params;
  if (p == nullptr) return Status::Ok();
  json::object rest = *p;
  if (const json::value* t = p->if_contains("timeout")) {
    if (!t->is_number() || !(t->to_number<double>() > 0)) return invalid("parameter 'timeout' must be seconds > 0");
    r.timeout_s = t->to_number<double>();
    rest.erase("timeout");
  }
  if (const json::value* pr = p->if_contains("priority")) {
    std::optional<Priority> parsed;
    if (pr->is_string())
      parsed = parse_priority(std::string(pr->as_string()));
    else if (pr->is_int64())
      parsed = parse_priority(std::to_string(pr->get_int64()));
    if (!parsed) return invalid("parameter 'priority' must be \"low\", \"normal\", \"high\" or 0..2");
    r.priority = parsed;
    rest.erase("priority");
  }
  if (const json::value* all = p->if_contains("binary_data_output")) {
    auto b = bool_parameter(*all, "request", "binary_data_output");
    if (!b.ok()) return std::move(b).error();
    r.all_outputs_binary = *b;
    rest.erase("binary_data_output");
  }
  return refuse_unknown(&rest, "request");
}

/// The binary data of the inputs with binary_data_size, taken in order.
struct BinaryData {
  std::string_view bytes;  // after the JSON header
  bool has_header_length;  // without the header no input may be binary
  std::size_t offset = 0;  // into `bytes`: what the inputs took so far
  std::string sizes{};     // "a: 16, b: 8" for the sum's message

  /// Fills `t` with the next `size` bytes.
  Status take(HostTensor& t, const std::string& dtype, std::int64_t size) {
    const std::string in = "input '" + t.name + "'";
    if (!has_header_length) {
      return invalid(in +
                     ": parameter 'binary_data_size' needs the header Inference-Header-Content-Length "
                     "(the JSON's length in bytes)");
    }
    const std::size_t left = bytes.size() - offset;
    if (static_cast<std::uint64_t>(size) > left) {
      return invalid(in + ": binary_data_size " + std::to_string(size) + " runs past the end of the body (" +
                     std::to_string(left) + " bytes of binary data left)");
    }
    if (Status st = fill_binary(t, dtype, bytes.substr(offset, static_cast<std::size_t>(size))); !st.ok()) return st;
    offset += static_cast<std::size_t>(size);
    sizes += (sizes.empty() ? "" : ", ") + t.name + ": " + std::to_string(size);
    return Status::Ok();
  }

  /// The inputs' sizes must add up to the bytes after the header.
  Status check_all_taken() const {
    if (offset == bytes.size()) return Status::Ok();
    return invalid("the body has " + std::to_string(bytes.size()) +
                   " bytes after the JSON header, but the inputs' binary_data_size add up to " +
                   std::to_string(offset) + (sizes.empty() ? " (no input has binary_data_size)" : " (" + sizes + ")"));
  }
};

/// The request's "inputs", their binary data taken from `binary`.
Status decode_inputs(const json::object& o, BinaryData& binary, TensorInferRequest& r) {
  const json::value* inputs = o.if_contains("inputs");
  if (inputs == nullptr || !inputs->is_array() || inputs->as_array().empty()) {
    return invalid("'inputs' must be a non-empty array of {name, shape, datatype, data}");
  }
  for (std::size_t i = 0; i < inputs->as_array().size(); ++i) {
    std::string dtype;
    std::optional<std::int64_t> size;
    auto t = decode_input(inputs->as_array()[i], i, &dtype, &size);
    if (!t.ok()) return std::move(t).error();
    if (size) {
      if (Status st = binary.take(*t, dtype, *size); !st.ok()) return st;
    }
    r.inputs.push_back(std::move(t).value());
    r.dtypes.push_back(std::move(dtype));
  }
  return binary.check_all_taken();
}

/// One "outputs" entry: {name, parameters?: {binary_data}}.
Status decode_output(const json::value& v, TensorInferRequest& r) {
  if (!v.is_object() || !v.as_object().contains("name") || !v.as_object().at("name").is_string()) {
    return invalid("each 'outputs' entry must be an object with a string 'name'");
  }
  const std::string name(v.as_object().at("name").as_string());
  const std::string where = "output '" + name + "'";
  if (std::find(r.outputs.begin(), r.outputs.end(), name) != r.outputs.end()) {
    return invalid(where + " is listed twice in 'outputs'");
  }
  for (const auto& kv : v.as_object()) {
    if (kv.key() != "name" && kv.key() != "parameters") {
      return invalid(where + ": unknown field '" + std::string(kv.key()) + "'");
    }
  }
  auto op = parameters_of(v.as_object(), where);
  if (!op.ok()) return std::move(op).error();
  if (const json::object* p = *op) {
    json::object rest = *p;
    if (const json::value* b = p->if_contains("binary_data")) {
      auto flag = bool_parameter(*b, where, "binary_data");
      if (!flag.ok()) return std::move(flag).error();
      if (*flag) r.binary_outputs.push_back(name);
      rest.erase("binary_data");
    }
    if (Status st = refuse_unknown(&rest, where); !st.ok()) return st;
  }
  r.outputs.push_back(name);
  return Status::Ok();
}

/// The request's optional "outputs".
Status decode_outputs(const json::object& o, TensorInferRequest& r) {
  const json::value* outputs = o.if_contains("outputs");
  if (outputs == nullptr || outputs->is_null()) return Status::Ok();
  if (!outputs->is_array()) return invalid("'outputs' must be an array of {name}");
  for (const json::value& v : outputs->as_array()) {
    if (Status st = decode_output(v, r); !st.ok()) return st;
  }
  return Status::Ok();
}

}  // namespace

Result<TensorInferRequest> decode_tensor_infer_request(std::string_view body, const std::string& model,
                                                       std::optional<std::string_view> header_length) {
  auto parts = split_body(body, header_length);
  if (!parts.ok()) return std::move(parts).error();
  const auto [header, binary] = *parts;
  auto root = parse_request_json(header, header_length.has_value());
  if (!root.ok()) return std::move(root).error();
  const json::object& o = root->as_object();
  TensorInferRequest r;
  r.model = model;
  if (const json::value* id = o.if_contains("id"); id != nullptr && !id->is_null()) {
    if (!id->is_string()) return invalid("'id' must be a string");
    r.id = std::string(id->as_string());
  }
  if (Status st = decode_request_parameters(o, r); !st.ok()) return st.error();
  BinaryData data{binary, header_length.has_value()};
  if (Status st = decode_inputs(o, data, r); !st.ok()) return st.error();
  if (Status st = decode_outputs(o, r); !st.ok()) return st.error();
  return r;
}

InferResponseBody encode_tensor_infer_response(const std::string& model, const std::string& id,
                                               const TensorResult& result, const OutputSelection& sel,
                                               std::int64_t reserved_bytes) {
  std::string out = "{\"model_name\":" + json_fields::serialize(json::value(json_fields::safe(model))) +
                    ",\"model_version\":\"" + std::string(kModelVersion) + "\"";
  if (!id.empty()) out += ",\"id\":" + json_fields::serialize(json::value(json_fields::safe(id)));
  out += ",\"outputs\":[";
  bool first = true;
  std::vector<const HostTensor*> raw;  // binary outputs, in order
  const auto listed = [](const std::vector<std::string>& names, const std::string& n) {
    return std::find(names.begin(), names.end(), n) != names.end();
  };
  for (const HostTensor& t : result.outputs) {
    if (!sel.only.empty() && !listed(sel.only, t.name)) continue;
    if (!first) out += ",";
    first = false;
    out += "{\"name\":" + json_fields::serialize(json::value(json_fields::safe(t.name))) +
           ",\"datatype\":\"FP32\",\"shape\":[";
    for (std::size_t i = 0; i < t.shape.size(); ++i) out += (i ? "," : "") + std::to_string(t.shape[i]);
    out += "]";
    if (sel.all_binary || listed(sel.binary, t.name)) {
      out += ",\"parameters\":{\"binary_data_size\":" + std::to_string(t.data.size() * sizeof(float)) + "}}";
      raw.push_back(&t);
      continue;
    }
    out += ",\"data\":[";
    out.reserve(out.size() + t.data.size() * 12);
    for (std::size_t i = 0; i < t.data.size(); ++i) {
      if (i) out += ',';
      put_float(out, t.data[i]);
    }
    out += "]}";
  }
  json::array batch_shape;
  for (std::int64_t d : result.batch_shape) batch_shape.emplace_back(d);
  out += "],\"parameters\":" + json_fields::serialize(json::object{{"batch_requests", result.batch_requests},
                                                                   {"batch_shape", batch_shape},
                                                                   {"batch_cost_bytes", result.batch_cost_bytes},
                                                                   {"queue_ms", result.queue_ms},
                                                                   {"compute_ms", result.compute_ms},
                                                                   {"reserved_bytes", reserved_bytes}});
  out += "}";
  InferResponseBody r;
  r.json_bytes = out.size();
  for (const HostTensor* t : raw) {
    static_assert(std::endian::native == std::endian::little, "the binary tensor extension is little-endian");
    out.append(reinterpret_cast<const char*>(t->data.data()), t->data.size() * sizeof(float));
  }
  r.body = std::move(out);
  return r;
}

std::string encode_tensor_model_metadata(const TensorModelInfo& info) {
  const TensorMemoryProfile& p = info.profile;
  json::object dims;
  for (const DimRange& d : info.spec.dims) dims[d.name] = json::object{{"min", d.min}, {"max", d.max}};
  json::array pad;
  for (const std::string& d : info.spec.pad) pad.emplace_back(json_fields::safe(d));
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
                 {"versions", json::array{json::string(kModelVersion)}},
                 {"platform", "pytorch_torchscript"},
                 {"inputs", tensors_json(info.spec.inputs)},
                 {"outputs", tensors_json(info.spec.outputs)},
                 {"dims", dims},
                 {"pad", pad},
                 {"max_batch", info.max_batch},
                 {"devices", devices},
                 {"budget_bytes", info.budget_bytes},
                 {"memory_profile", profile}};
  return json_fields::serialize(o);
}

std::string encode_server_metadata() {
  return json_fields::serialize(
      json::object{{"name", "vramgate"}, {"version", "0.1.0"}, {"extensions", json::array{"binary_tensor_data"}}});
}

}  // namespace vg::httpd
