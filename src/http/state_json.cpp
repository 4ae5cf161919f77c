// The state bodies of the HTTP API (see json_codec.hpp): /v1/models,
// /v1/engines, /v1/admission, /health and /ready. The request decoders and
// the completion bodies are in json_codec.cpp.
#include <cmath>
#include <string>
#include <vector>

#include <boost/json.hpp>

#include "http/json_codec.hpp"
#include "http/json_fields.hpp"

namespace vg {
namespace {

namespace json = boost::json;
using json_fields::number;
using json_fields::safe;
using json_fields::string_array;

/// A device's KV block pool in /v1/admission.
json::object kv_blocks_json(const DeviceState& d) {
  return {{"reservation", safe(d.kv_reservation)},
          {"block_tokens", d.kv_block_tokens},
          {"block_bytes", d.kv_block_bytes},
          {"total", d.kv_blocks_total},
          {"used", d.kv_blocks_used},
          {"cached", d.kv_blocks_cached},
          {"free", d.kv_blocks_free()},
          {"evicted", d.counters[DeviceCounterId::kKvBlocksEvicted]},
          {"prompt_tokens", d.counters[DeviceCounterId::kKvPromptTokens]},
          {"prefix_hit_tokens", d.counters[DeviceCounterId::kKvPrefixHitTokens]},
          {"recomputed_tokens", d.counters[DeviceCounterId::kKvRecomputedTokens]},
          {"growth_preemptions", d.counters[DeviceCounterId::kKvGrowthPreemptions]}};
}

/// One model object of /v1/models (OpenAI's fields, then vramgate's).
json::object model_object(const ModelInfo& m) {
  json::object o;
  o["id"] = safe(m.id);
  o["object"] = "model";
  o["created"] = m.created;
  o["owned_by"] = "vramgate";
  o["family"] = safe(m.family);
  o["dtype"] = safe(m.dtype);
  o["context_length"] = m.context_length;
  o["parameter_count"] = m.parameter_count;
  o["device"] = safe(m.device);
  o["devices"] = string_array(m.devices);
  o["resident_bytes"] = m.resident_bytes;
  o["workspace_bytes"] = m.workspace_bytes;
  o["kv_bytes_per_token"] = m.kv_bytes_per_token;
  o["sequence_overhead_bytes"] = m.sequence_overhead_bytes;
  o["safety_factor"] = number(m.safety_factor);
  return o;
}

}  // namespace

std::string encode_models(const std::vector<ModelInfo>& models) {
  json::array data;
  for (const ModelInfo& m : models) data.push_back(model_object(m));
  json::object o;
  o["object"] = "list";
  o["data"] = std::move(data);
  return json_fields::serialize(o);
}

std::string encode_model(const ModelInfo& model) { return json_fields::serialize(model_object(model)); }

std::string encode_engines(const std::vector<EngineInfo>& engines) {
  json::array data;
  for (const EngineInfo& e : engines) {
    json::array models;
    for (const std::string& m : e.models) models.push_back(safe(m));
    json::object o{{"address", safe(e.address)},
                   {"device", safe(e.device)},
                   {"models", std::move(models)},
                   {"pid", e.pid},
                   {"state", safe(e.state)},
                   {"restarts", e.restarts},
                   {"started_at", e.started_at},
                   {"last_exit", e.last_exit.empty() ? json::value(nullptr) : json::value(safe(e.last_exit))},
                   {"reason", safe(e.reason)}};
    if (!e.host.empty()) o["host"] = safe(e.host);
    if (e.free_budget_bytes) o["free_budget_bytes"] = *e.free_budget_bytes;
    if (e.last_heartbeat_s) {
      o["last_heartbeat_s"] = *e.last_heartbeat_s;
      o["running"] = e.running;
    }
    data.push_back(std::move(o));
  }
  return json_fields::serialize(json::object{{"object", "list"}, {"data", std::move(data)}});
}

std::string encode_admission(const AdmissionState& state) {
  json::array devices;
  for (const DeviceState& d : state.devices) {
    json::object o;
    o["name"] = safe(d.name);
    o["capacity_bytes"] = d.capacity_bytes;
    o["budget_bytes"] = d.budget_bytes;
    o["effective_budget_bytes"] = d.effective_budget_bytes;
    o["reserved_bytes"] = d.reserved_bytes;
    o["peak_reserved_bytes"] = d.peak_reserved_bytes;
    o["used_bytes"] = d.used_bytes;
    o["peak_bytes"] = d.peak_bytes;
    o["allocated_bytes"] = d.allocated_bytes;
    o["cache_reserved_bytes"] = d.cache_reserved_bytes;
    o["foreign_bytes"] = d.foreign_bytes;
    const DeviceCounters& c = d.counters;
    o["budget_changes"] = {{"out_of_memory", c[DeviceCounterId::kBudgetCutsOutOfMemory]},
                           {"quiet_period", c[DeviceCounterId::kBudgetRaisesQuietPeriod]},
                           {"foreign_grew", c[DeviceCounterId::kBudgetCutsForeign]},
                           {"foreign_shrank", c[DeviceCounterId::kBudgetRaisesForeign]}};
    o["resident_bytes"] = d.resident_bytes;
    o["workspace_bytes"] = d.workspace_bytes;
    o["ready"] = d.ready;
    o["state"] = safe(d.state);
    if (!d.reason.empty()) o["reason"] = safe(d.reason);
    o["models"] = string_array(d.models);
    o["running"] = d.running;
    o["completed"] = c[DeviceCounterId::kCompleted];
    o["out_of_memory"] = c[DeviceCounterId::kOutOfMemory];
    o["preemptions"] = c[DeviceCounterId::kPreemptions];
    if (!d.kv_reservation.empty()) o["kv_blocks"] = kv_blocks_json(d);
    devices.push_back(std::move(o));
  }
  json::object o;
  o["policy"] = safe(state.policy);
  o["devices"] = std::move(devices);
  o["queue_depth"] = state.queue_depth;
  o["queued"] = state.queued;
  json::array waiting;
  for (const WaitingRequest& w : state.waiting) {
    json::object e;
    e["position"] = w.position;
    e["cost_bytes"] = w.cost_bytes;
    e["waited_s"] = number(std::round(w.waited_s * 1000.0) / 1000.0);  // milliseconds are enough
    e["priority"] = safe(w.priority);
    waiting.push_back(std::move(e));
  }
  o["waiting"] = std::move(waiting);
  o["running"] = state.running;
  o["draining"] = state.draining;
  json::object retry;
  retry["held"] = state.retry_bookings;
  retry["open"] = state.retry_places;
  for (const CounterInfo& c : kCounters) {
    (c.section == CounterSection::kTop ? o : retry)[c.api_key] = state.counters[c.id];
  }
  o["retry_bookings"] = std::move(retry);
  return json_fields::serialize(o);
}

std::string encode_status(std::string_view status, std::string_view reason) {
  json::object o;
  o["status"] = safe(status);
  if (!reason.empty()) o["reason"] = safe(reason);
  return json_fields::serialize(o);
}

std::string encode_ready(std::string_view reason, const std::vector<DeviceState>& devices) {
  json::object o;
  o["status"] = reason.empty() ? "ready" : "not_ready";
  if (!reason.empty()) o["reason"] = safe(reason);
  json::array list;
  for (const DeviceState& d : devices) {
    json::object e;
    e["name"] = safe(d.name);
    e["state"] = safe(d.state);
    if (!d.reason.empty()) e["reason"] = safe(d.reason);
    list.push_back(std::move(e));
  }
  o["devices"] = std::move(list);
  return json_fields::serialize(o);
}

}  // namespace vg
