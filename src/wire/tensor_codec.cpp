// Wire codecs of TorchScript (tensor) requests, results and models, their
// float32 data in base64 (see codec.hpp).
#include "wire/codec.hpp"

#include <string_view>

#include "wire/json_fields.hpp"

namespace vg::wire {
using namespace fields;

namespace {

constexpr std::size_t kMaxTensors = 256;  // inputs, outputs, names of a request or model
constexpr std::size_t kMaxRank = 16;
constexpr std::int64_t kMaxElements = std::int64_t{1} << 26;  // one tensor's elements (the frame bounds the sum)

constexpr char kB64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// The floats' bytes (host order: both ends of a Unix socket share a host) as base64.
std::string floats_base64(const std::vector<float>& data) {
  const auto* p = reinterpret_cast<const unsigned char*>(data.data());
  const std::size_t n = data.size() * sizeof(float);
  std::string out;
  out.reserve((n + 2) / 3 * 4);
  for (std::size_t i = 0; i < n; i += 3) {
    const std::uint32_t b0 = p[i];
    const std::uint32_t b1 = i + 1 < n ? p[i + 1] : 0;
    const std::uint32_t b2 = i + 2 < n ? p[i + 2] : 0;
    const std::uint32_t w = (b0 << 16) | (b1 << 8) | b2;
    out.push_back(kB64[(w >> 18) & 63]);
    out.push_back(kB64[(w >> 12) & 63]);
    out.push_back(i + 1 < n ? kB64[(w >> 6) & 63] : '=');
    out.push_back(i + 2 < n ? kB64[w & 63] : '=');
  }
  return out;
}

/// The floats of base64 `text` (a whole number of floats, at most kMaxElements).
std::vector<float> base64_floats(std::string_view text, const std::string& what) {
  if (text.size() % 4 != 0) fail(what + ": data is not base64");
  std::size_t bytes = text.size() / 4 * 3;
  if (!text.empty() && text.back() == '=') --bytes;
  if (text.size() >= 2 && text[text.size() - 2] == '=') --bytes;
  if (bytes % sizeof(float) != 0) fail(what + ": data is not a whole number of floats");
  const std::size_t elements = bytes / sizeof(float);
  if (elements > static_cast<std::size_t>(kMaxElements)) {
    fail(what + " has more than " + std::to_string(kMaxElements) + " values");
  }
  auto value = [&](char c) -> std::uint32_t {
    if (c >= 'A' && c <= 'Z') return static_cast<std::uint32_t>(c - 'A');
    if (c >= 'a' && c <= 'z') return static_cast<std::uint32_t>(c - 'a' + 26);
    if (c >= '0' && c <= '9') return static_cast<std::uint32_t>(c - '0' + 52);
    if (c == '+') return 62;
    if (c == '/') return 63;
    fail(what + ": data is not base64");
  };
  std::vector<float> out(elements);
  auto* q = reinterpret_cast<unsigned char*>(out.data());
  std::size_t o = 0;
  for (std::size_t i = 0; i < text.size(); i += 4) {
    const bool last = i + 4 == text.size();
    const bool pad2 = last && text[i + 2] == '=';
    const bool pad3 = last && text[i + 3] == '=';
    if (pad2 && !pad3) fail(what + ": data is not base64");
    const std::uint32_t w = (value(text[i]) << 18) | (value(text[i + 1]) << 12) | (pad2 ? 0 : value(text[i + 2]) << 6) |
                            (pad3 ? 0 : value(text[i + 3]));
    const unsigned char b[3] = {static_cast<unsigned char>(w >> 16), static_cast<unsigned char>(w >> 8),
                                static_cast<unsigned char>(w)};
    for (int k = 0; k < 3 && o < bytes; ++k) q[o++] = b[k];
  }
  return out;
}

std::vector<std::int64_t> shape_of(const json::object& o, const char* key, const std::string& what) {
  std::vector<std::int64_t> shape;
  const json::array* a = array(o, key, kMaxRank);
  if (!a) fail(what + ": missing \"" + key + "\"");
  for (const json::value& x : *a) {
    if (!x.is_int64() || x.as_int64() < 0 || x.as_int64() > kMaxElements) {
      fail(what + ": \"" + key + "\" entries must be sizes (integers 0.." + std::to_string(kMaxElements) + ")");
    }
    shape.push_back(x.as_int64());
  }
  return shape;
}

json::object encode_tensor(const HostTensor& t) {
  return json::object{{"name", t.name}, {"shape", int_array(t.shape)}, {"data", floats_base64(t.data)}};
}

HostTensor decode_tensor(const json::value& v) {
  const json::object& o = as_object(v, "tensor");
  HostTensor t;
  t.name = str(o, "name", true);
  const std::string what = "tensor '" + t.name + "'";
  // Whether the data fits the shape is the engine's check (check_inputs,
  // a 400 naming the input), not a broken frame.
  t.shape = shape_of(o, "shape", what);
  const json::value* data = get(o, "data");
  if (!data || !data->is_string()) fail(what + ": \"data\" must be a base64 string");
  t.data = base64_floats(std::string_view(data->as_string()), what);
  return t;
}

json::array tensors(const std::vector<HostTensor>& v) {
  json::array a;
  for (const HostTensor& t : v) a.push_back(encode_tensor(t));
  return a;
}

std::vector<HostTensor> tensors_of(const json::object& o, const char* key) {
  std::vector<HostTensor> out;
  if (const json::array* a = array(o, key, kMaxTensors)) {
    for (const json::value& x : *a) out.push_back(decode_tensor(x));
  }
  return out;
}

json::object encode_spec(const TensorSpec& t) {
  json::array shape;
  for (const DimSpec& d : t.shape) {
    if (const auto* n = std::get_if<std::int64_t>(&d)) {
      shape.push_back(*n);
    } else {
      shape.emplace_back(std::get<std::string>(d));
    }
  }
  return json::object{{"name", t.name}, {"dtype", t.dtype}, {"shape", std::move(shape)}};
}

TensorSpec decode_spec(const json::value& v) {
  const json::object& o = as_object(v, "tensor spec");
  TensorSpec t;
  t.name = str(o, "name", true);
  t.dtype = str(o, "dtype", true);
  const json::array* a = array(o, "shape", kMaxRank);
  if (!a) fail("tensor spec '" + t.name + "' has no shape");
  for (const json::value& x : *a) {
    if (x.is_int64() && x.as_int64() >= 1) {
      t.shape.emplace_back(x.as_int64());
    } else if (x.is_string() && !x.as_string().empty()) {
      t.shape.emplace_back(std::string(x.as_string()));
    } else {
      fail("tensor spec '" + t.name + "': a dimension is a size >= 1 or a name");
    }
  }
  return t;
}

}  // namespace

json::object encode(const TensorInferRequest& r) {
  json::object o{{"request_id", r.request_id},
                 {"model", r.model},
                 {"id", r.id},
                 {"inputs", tensors(r.inputs)},
                 {"dtypes", string_array(r.dtypes)},
                 {"outputs", string_array(r.outputs)}};
  if (r.timeout_s) o["timeout_s"] = *r.timeout_s;
  if (r.priority) o["priority"] = static_cast<int>(*r.priority);
  return o;
}

Result<TensorInferRequest> decode_tensor_request(const json::value& v) {
  return guarded<TensorInferRequest>([&] {
    const json::object& o = as_object(v, "tensor request");
    TensorInferRequest r;
    r.request_id = str(o, "request_id");
    r.model = str(o, "model", true);
    r.id = str(o, "id");
    r.inputs = tensors_of(o, "inputs");
    r.dtypes = strings(o, "dtypes", kMaxTensors);
    if (r.dtypes.size() != r.inputs.size()) fail("\"dtypes\" must name each input's datatype");
    r.outputs = strings(o, "outputs", kMaxTensors);
    if (get(o, "timeout_s")) r.timeout_s = number(o, "timeout_s", 0, 1e9, 0);
    if (get(o, "priority")) r.priority = static_cast<Priority>(integer(o, "priority", 0, 2, 1));
    return r;
  });
}

std::size_t encoded_tensors_bound(const std::vector<HostTensor>& tensors) {
  std::size_t bytes = 0;
  for (const HostTensor& t : tensors) {
    bytes += (t.data.size() * sizeof(float) + 2) / 3 * 4;   // base64
    bytes += 6 * t.name.size() + 64 + 24 * t.shape.size();  // name (escaped at worst), keys, shape
  }
  return bytes;
}

json::object encode(const TensorResult& r) {
  return json::object{{"outputs", tensors(r.outputs)},
                      {"batch_requests", r.batch_requests},
                      {"batch_shape", int_array(r.batch_shape)},
                      {"batch_cost_bytes", r.batch_cost_bytes},
                      {"queue_ms", r.queue_ms},
                      {"compute_ms", r.compute_ms}};
}

Result<TensorResult> decode_tensor_result(const json::value& v) {
  return guarded<TensorResult>([&] {
    const json::object& o = as_object(v, "tensor result");
    TensorResult r;
    r.outputs = tensors_of(o, "outputs");
    r.batch_requests = static_cast<int>(integer(o, "batch_requests", 1, 1 << 20, 1));
    if (get(o, "batch_shape")) r.batch_shape = shape_of(o, "batch_shape", "tensor result");
    r.batch_cost_bytes = integer(o, "batch_cost_bytes", 0, kMaxInt64, 0);
    r.queue_ms = duration(o, "queue_ms");
    r.compute_ms = duration(o, "compute_ms");
    return r;
  });
}

json::object encode(const TensorModelInfo& m) {
  json::array inputs, outputs, dims, samples;
  for (const TensorSpec& t : m.spec.inputs) inputs.push_back(encode_spec(t));
  for (const TensorSpec& t : m.spec.outputs) outputs.push_back(encode_spec(t));
  for (const DimRange& d : m.spec.dims) dims.push_back(json::object{{"name", d.name}, {"min", d.min}, {"max", d.max}});
  for (const PeakSample& s : m.profile.samples) {
    samples.push_back(json::object{{"shape", int_array(s.shape)},
                                   {"elements", s.elements},
                                   {"peak_bytes", s.peak_bytes},
                                   {"held_out", s.held_out},
                                   {"predicted_bytes", s.predicted_bytes}});
  }
  const TensorMemoryProfile& p = m.profile;
  return json::object{{"id", m.id},
                      {"devices", string_array(m.devices)},
                      {"spec", json::object{{"inputs", std::move(inputs)},
                                            {"outputs", std::move(outputs)},
                                            {"dims", std::move(dims)},
                                            {"batched", m.spec.batched},
                                            {"pad", string_array(m.spec.pad)}}},
                      {"profile", json::object{{"resident_bytes", p.resident_bytes},
                                               {"fixed_bytes", p.fixed_bytes},
                                               {"bytes_per_element", p.bytes_per_element},
                                               {"safety_factor", p.safety_factor},
                                               {"held_out_max_error", p.held_out_max_error},
                                               {"held_out_min_error", p.held_out_min_error},
                                               {"samples", std::move(samples)}}},
                      {"max_batch", m.max_batch},
                      {"budget_bytes", m.budget_bytes}};
}

Result<TensorModelInfo> decode_tensor_model_info(const json::value& v) {
  return guarded<TensorModelInfo>([&] {
    const json::object& o = as_object(v, "tensor model");
    TensorModelInfo m;
    m.id = str(o, "id", true);
    m.devices = strings(o, "devices", kMaxSmallList);
    const json::value* sv = get(o, "spec");
    if (!sv) fail("tensor model '" + m.id + "' has no spec");
    const json::object& so = as_object(*sv, "spec");
    if (const json::array* a = array(so, "inputs", kMaxTensors)) {
      for (const json::value& x : *a) m.spec.inputs.push_back(decode_spec(x));
    }
    if (const json::array* a = array(so, "outputs", kMaxTensors)) {
      for (const json::value& x : *a) m.spec.outputs.push_back(decode_spec(x));
    }
    if (const json::array* a = array(so, "dims", kMaxTensors)) {
      for (const json::value& x : *a) {
        const json::object& d = as_object(x, "dimension");
        DimRange r;
        r.name = str(d, "name", true);
        r.min = integer(d, "min", 1, kMaxInt64, 1, true);
        r.max = integer(d, "max", r.min, kMaxInt64, r.min, true);
        m.spec.dims.push_back(std::move(r));
      }
    }
    m.spec.batched = boolean(so, "batched");
    m.spec.pad = strings(so, "pad", kMaxTensors);
    const json::value* pv = get(o, "profile");
    if (!pv) fail("tensor model '" + m.id + "' has no profile");
    const json::object& po = as_object(*pv, "profile");
    TensorMemoryProfile& p = m.profile;
    p.resident_bytes = integer(po, "resident_bytes", 0, kMaxInt64, 0);
    p.fixed_bytes = integer(po, "fixed_bytes", 0, kMaxInt64, 0);
    p.bytes_per_element = number(po, "bytes_per_element", 0, 1e15, 0);
    p.safety_factor = number(po, "safety_factor", 1, 1e6, 1);
    p.held_out_max_error = number(po, "held_out_max_error", -1e6, 1e6, 0);
    p.held_out_min_error = number(po, "held_out_min_error", -1e6, 1e6, 0);
    if (const json::array* a = array(po, "samples", kMaxSmallList)) {
      for (const json::value& x : *a) {
        const json::object& so2 = as_object(x, "profile sample");
        PeakSample s;
        s.shape = shape_of(so2, "shape", "profile sample");
        s.elements = integer(so2, "elements", 0, kMaxInt64, 0);
        s.peak_bytes = integer(so2, "peak_bytes", 0, kMaxInt64, 0);
        s.held_out = boolean(so2, "held_out");
        s.predicted_bytes = integer(so2, "predicted_bytes", 0, kMaxInt64, 0);
        p.samples.push_back(std::move(s));
      }
    }
    m.max_batch = static_cast<int>(integer(o, "max_batch", 1, 1 << 20, 1));
    m.budget_bytes = integer(o, "budget_bytes", 0, kMaxInt64, 0);
    return m;
  });
}

}  // namespace vg::wire
