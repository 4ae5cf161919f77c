// Wire codecs of what an engine reports about itself: its models, its
// admission state, its status and its metrics (see codec.hpp).
#include "wire/codec.hpp"

#include <utility>

#include "wire/json_fields.hpp"

namespace vg::wire {
using namespace fields;

json::object encode(const ModelInfo& m) {
  return json::object{{"id", m.id},
                      {"family", m.family},
                      {"dtype", m.dtype},
                      {"context_length", m.context_length},
                      {"parameter_count", m.parameter_count},
                      {"device", m.device},
                      {"devices", string_array(m.devices)},
                      {"resident_bytes", m.resident_bytes},
                      {"created", m.created},
                      {"workspace_bytes", m.workspace_bytes},
                      {"kv_bytes_per_token", m.kv_bytes_per_token},
                      {"sequence_overhead_bytes", m.sequence_overhead_bytes},
                      {"safety_factor", m.safety_factor},
                      {"dir", m.dir},
                      {"vocab_size", m.vocab_size},
                      {"eos_token_id", m.eos_token_id}};
}

Result<ModelInfo> decode_model_info(const json::value& v) {
  return guarded<ModelInfo>([&] {
    const json::object& o = as_object(v, "model");
    ModelInfo m;
    m.id = str(o, "id", true);
    m.family = str(o, "family");
    m.dtype = str(o, "dtype");
    m.context_length = static_cast<int>(integer(o, "context_length", 0, kMaxInt32, 0));
    m.parameter_count = integer(o, "parameter_count", 0, kMaxInt64, 0);
    m.device = str(o, "device");
    m.devices = strings(o, "devices", kMaxSmallList);
    m.resident_bytes = integer(o, "resident_bytes", 0, kMaxInt64, 0);
    m.created = integer(o, "created", 0, kMaxInt64, 0);
    m.workspace_bytes = integer(o, "workspace_bytes", 0, kMaxInt64, 0);
    m.kv_bytes_per_token = integer(o, "kv_bytes_per_token", 0, kMaxInt64, 0);
    m.sequence_overhead_bytes = integer(o, "sequence_overhead_bytes", 0, kMaxInt64, 0);
    m.safety_factor = number(o, "safety_factor", 0, 1e6, 1.0);
    m.dir = str(o, "dir");
    if (m.dir.size() > 4096) fail("\"dir\" is longer than 4096 bytes");
    m.vocab_size = static_cast<int>(integer(o, "vocab_size", 0, kMaxInt32, 0));
    m.eos_token_id = static_cast<int>(integer(o, "eos_token_id", -1, kMaxInt32, -1));
    return m;
  });
}

// Every integer field of DeviceState and AdmissionState, by name, so encode
// and decode cannot drift apart (the counters' names are kCounters' and
// kDeviceCounters').
namespace {
using DeviceInt = std::int64_t DeviceState::*;
const std::pair<const char*, DeviceInt> kDeviceInts[] = {
    {"capacity_bytes", &DeviceState::capacity_bytes},
    {"budget_bytes", &DeviceState::budget_bytes},
    {"effective_budget_bytes", &DeviceState::effective_budget_bytes},
    {"reserved_bytes", &DeviceState::reserved_bytes},
    {"used_bytes", &DeviceState::used_bytes},
    {"peak_bytes", &DeviceState::peak_bytes},
    {"allocated_bytes", &DeviceState::allocated_bytes},
    {"cache_reserved_bytes", &DeviceState::cache_reserved_bytes},
    {"resident_bytes", &DeviceState::resident_bytes},
    {"workspace_bytes", &DeviceState::workspace_bytes},
    {"peak_reserved_bytes", &DeviceState::peak_reserved_bytes},
    {"foreign_bytes", &DeviceState::foreign_bytes},
    {"kv_block_bytes", &DeviceState::kv_block_bytes},
    {"kv_blocks_total", &DeviceState::kv_blocks_total},
    {"kv_blocks_used", &DeviceState::kv_blocks_used},
    {"kv_blocks_cached", &DeviceState::kv_blocks_cached},
};
using StateSmall = int AdmissionState::*;
const std::pair<const char*, StateSmall> kStateSmall[] = {
    {"queue_depth", &AdmissionState::queue_depth},   {"queued", &AdmissionState::queued},
    {"running", &AdmissionState::running},           {"retry_bookings", &AdmissionState::retry_bookings},
    {"retry_places", &AdmissionState::retry_places},
};
}  // namespace

json::object encode(const AdmissionState& s) {
  json::object o{{"policy", s.policy}, {"draining", s.draining}};
  for (const CounterInfo& c : kCounters) o[c.key] = s.counters[c.id];
  for (const auto& [k, m] : kStateSmall) o[k] = s.*m;
  json::array devices;
  for (const DeviceState& d : s.devices) {
    json::object dv{{"name", d.name},
                    {"ready", d.ready},
                    {"state", d.state},
                    {"reason", d.reason},
                    {"models", string_array(d.models)},
                    {"running", d.running},
                    {"max_running", d.max_running},
                    {"kv_reservation", d.kv_reservation},
                    {"kv_block_tokens", d.kv_block_tokens}};
    for (const auto& [k, m] : kDeviceInts) dv[k] = d.*m;
    for (const DeviceCounterInfo& c : kDeviceCounters) dv[c.key] = d.counters[c.id];
    devices.push_back(std::move(dv));
  }
  o["devices"] = std::move(devices);
  json::array waiting;
  for (const WaitingRequest& w : s.waiting) {
    waiting.push_back(json::object{
        {"position", w.position}, {"cost_bytes", w.cost_bytes}, {"waited_s", w.waited_s}, {"priority", w.priority}});
  }
  o["waiting"] = std::move(waiting);
  return o;
}

Result<AdmissionState> decode_admission_state(const json::value& v) {
  return guarded<AdmissionState>([&] {
    const json::object& o = as_object(v, "admission state");
    AdmissionState s;
    s.policy = str(o, "policy");
    s.draining = boolean(o, "draining");
    for (const CounterInfo& c : kCounters)
      s.counters[c.id] = integer(o, c.key.data(), 0, kMaxInt64, 0);  // a literal: NUL-terminated
    for (const auto& [k, m] : kStateSmall) s.*m = static_cast<int>(integer(o, k, 0, kMaxInt32, 0));
    if (const json::array* a = array(o, "devices", kMaxSmallList)) {
      for (const json::value& e : *a) {
        const json::object& dv = as_object(e, "a device");
        DeviceState d;
        d.name = str(dv, "name", true);
        d.ready = boolean(dv, "ready");
        d.state = str(dv, "state");
        d.reason = str(dv, "reason");
        d.models = strings(dv, "models", kMaxSmallList);
        d.running = static_cast<int>(integer(dv, "running", 0, kMaxInt32, 0));
        d.max_running = static_cast<int>(integer(dv, "max_running", 0, kMaxInt32, 0));
        d.kv_reservation = str(dv, "kv_reservation");
        d.kv_block_tokens = static_cast<int>(integer(dv, "kv_block_tokens", 0, kMaxInt32, 0));
        for (const auto& [k, m] : kDeviceInts) d.*m = integer(dv, k, 0, kMaxInt64, 0);
        for (const DeviceCounterInfo& c : kDeviceCounters)
          d.counters[c.id] = integer(dv, c.key.data(), 0, kMaxInt64, 0);  // a literal: NUL-terminated
        s.devices.push_back(std::move(d));
      }
    }
    if (const json::array* a = array(o, "waiting", AdmissionState::kMaxWaitingShown)) {
      for (const json::value& e : *a) {
        const json::object& w = as_object(e, "a waiting entry");
        s.waiting.push_back(WaitingRequest{static_cast<int>(integer(w, "position", 0, kMaxInt32, 0)),
                                           integer(w, "cost_bytes", 0, kMaxInt64, 0), duration(w, "waited_s"),
                                           str(w, "priority")});
      }
    }
    return s;
  });
}

json::object encode(const EngineStatus& s) {
  return json::object{{"ready", s.ready},
                      {"not_ready_reason", s.not_ready_reason},
                      {"healthy", s.healthy},
                      {"health_reason", s.health_reason}};
}

Result<EngineStatus> decode_status(const json::value& v) {
  return guarded<EngineStatus>([&] {
    const json::object& o = as_object(v, "status");
    EngineStatus s;
    s.ready = boolean(o, "ready");
    s.not_ready_reason = str(o, "not_ready_reason");
    s.healthy = boolean(o, "healthy");
    s.health_reason = str(o, "health_reason");
    return s;
  });
}

json::object encode(const HistogramSample& h) {
  json::array bounds, buckets;
  for (double b : h.bounds) bounds.push_back(b);
  for (std::uint64_t c : h.buckets) buckets.push_back(c);
  json::object o{{"name", h.name}, {"bounds", std::move(bounds)}, {"buckets", std::move(buckets)}, {"sum", h.sum}};
  if (!h.labels.empty()) o["labels"] = string_array(h.labels);
  return o;
}

Result<HistogramSample> decode_histogram(const json::value& v) {
  return guarded<HistogramSample>([&] {
    const json::object& o = as_object(v, "histogram");
    HistogramSample h;
    h.name = str(o, "name", true);
    h.labels = strings(o, "labels", 8);
    const json::array* bounds = array(o, "bounds", 256);
    const json::array* buckets = array(o, "buckets", 257);
    if (!bounds || !buckets || buckets->size() != bounds->size() + 1) fail("histogram buckets do not match its bounds");
    for (const json::value& b : *bounds) {
      if (!b.is_number()) fail("histogram bounds must be numbers");
      h.bounds.push_back(b.to_number<double>());
    }
    for (const json::value& c : *buckets) {
      if (c.is_uint64()) {
        h.buckets.push_back(c.as_uint64());
      } else if (c.is_int64() && c.as_int64() >= 0) {
        h.buckets.push_back(static_cast<std::uint64_t>(c.as_int64()));
      } else {
        fail("histogram counts must be integers >= 0");
      }
    }
    h.sum = number(o, "sum", -1e300, 1e300, 0);
    return h;
  });
}

void encode_metrics(const EngineMetrics& m, json::object& message) {
  json::array histograms, counters;
  for (const HistogramSample& h : m.histograms) histograms.push_back(encode(h));
  for (const CounterSample& c : m.counters) {
    counters.push_back(json::object{{"name", c.name}, {"labels", string_array(c.labels)}, {"value", c.value}});
  }
  message["histograms"] = std::move(histograms);
  message["counters"] = std::move(counters);
  if (m.generated_tokens) message["generated_tokens"] = *m.generated_tokens;
}

Result<EngineMetrics> decode_metrics(const json::object& message) {
  return guarded<EngineMetrics>([&] {
    EngineMetrics m;
    if (const json::array* a = array(message, "histograms", kMaxSmallList)) {
      for (const json::value& h : *a) {
        Result<HistogramSample> sample = decode_histogram(h);
        if (!sample.ok()) fail(sample.error().message);
        m.histograms.push_back(std::move(sample).value());
      }
    }
    if (const json::array* a = array(message, "counters", kMaxList)) {
      for (const json::value& c : *a) {
        const json::object& co = as_object(c, "a counter");
        m.counters.push_back(
            CounterSample{str(co, "name", true), strings(co, "labels", 8), number(co, "value", 0, 1e300, 0)});
      }
    }
    if (get(message, "generated_tokens")) m.generated_tokens = number(message, "generated_tokens", 0, 1e300, 0);
    return m;
  });
}

}  // namespace vg::wire
