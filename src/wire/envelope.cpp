// Envelopes (see envelope.hpp). Each message type has one Wire<M>: its name
// on the wire, the fields it puts beside "t", and how it reads them back
// (throwing FieldError, which decode() turns into a DecodeError). The
// variants' alternatives are walked at compile time, so a message listed in
// protocol.hpp without a Wire<M> does not build.
#include "wire/envelope.hpp"

#include <cstddef>
#include <limits>
#include <optional>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "wire/codec.hpp"
#include "wire/frame.hpp"
#include "wire/json_fields.hpp"

namespace vg::wire {
using namespace fields;

namespace {

/// The value of a payload decoder, or FieldError with its message.
template <class T>
T must(Result<T> r) {
  if (!r.ok()) fail(r.error().message);
  return std::move(r).value();
}

/// A request number: an integer >= 1.
std::uint64_t rid_of(const json::object& o) {
  return static_cast<std::uint64_t>(integer(o, "rid", 1, kMaxInt64, 0, true));
}

std::optional<AdmissionState> admission_of(const json::object& o) {
  if (const json::value* a = get(o, "admission")) return must(decode_admission_state(*a));
  return std::nullopt;
}

Error error_of(const json::object& o) {
  Error e;
  if (Status st = decode_error(need(o, "error"), &e); !st.ok()) fail(st.error().message);
  return e;
}

template <class T, class F>
json::array array_of(const std::vector<T>& v, F&& encode_one) {
  json::array a;
  a.reserve(v.size());
  for (const T& x : v) a.push_back(encode_one(x));
  return a;
}

template <class T, class F>
std::vector<T> list_of(const json::object& o, const char* key, F&& decode_one) {
  std::vector<T> out;
  if (const json::array* a = array(o, key, kMaxSmallList)) {
    for (const json::value& x : *a) out.push_back(must(decode_one(x)));
  }
  return out;
}

template <class M>
struct Wire;

// -- gateway -> engine

template <>
struct Wire<GatewayHello> {
  static constexpr std::string_view kType = "hello";
  static void put(const GatewayHello& m, json::object& o) {
    o["v"] = m.version;
    o["secret"] = m.secret;
    if (!m.gateway.empty()) o["gateway"] = m.gateway;
  }
  static GatewayHello read(const json::object& o) {
    // Any version decodes: the engine answers another one with a refusal.
    const std::int64_t lowest = std::numeric_limits<std::int64_t>::min();
    return GatewayHello{integer(o, "v", lowest, kMaxInt64, 0), str(o, "secret"), str(o, "gateway")};
  }
};

template <>
struct Wire<Submit> {
  static constexpr std::string_view kType = "submit";
  static void put(const Submit& m, json::object& o) {
    o["rid"] = m.rid;
    o["request"] = encode(m.request);
    if (m.resume) o["resume"] = encode(*m.resume);
    if (m.admitted_before) o["admitted_before"] = true;
  }
  static Submit read(const json::object& o) {
    Submit m;
    m.rid = rid_of(o);
    m.request = must(decode_completion_request(need(o, "request")));
    if (const json::value* r = get(o, "resume")) m.resume = must(decode_resume(*r));
    m.admitted_before = boolean(o, "admitted_before");
    return m;
  }
};

template <>
struct Wire<Infer> {
  static constexpr std::string_view kType = "infer";
  static void put(const Infer& m, json::object& o) {
    o["rid"] = m.rid;
    o["request"] = encode(m.request);
  }
  static Infer read(const json::object& o) { return Infer{rid_of(o), must(decode_tensor_request(need(o, "request")))}; }
};

template <>
struct Wire<Cancel> {
  static constexpr std::string_view kType = "cancel";
  static void put(const Cancel& m, json::object& o) { o["rid"] = m.rid; }
  static Cancel read(const json::object& o) { return Cancel{rid_of(o)}; }
};

template <>
struct Wire<Withdraw> {
  static constexpr std::string_view kType = "withdraw";
  static void put(const Withdraw& m, json::object& o) { o["rid"] = m.rid; }
  static Withdraw read(const json::object& o) { return Withdraw{rid_of(o)}; }
};

template <>
struct Wire<QueryState> {
  static constexpr std::string_view kType = "state";
  static void put(const QueryState& m, json::object& o) { o["qid"] = m.qid; }
  static QueryState read(const json::object& o) {
    return QueryState{static_cast<std::uint64_t>(integer(o, "qid", 0, kMaxInt64, 0, true))};
  }
};

template <>
struct Wire<Release> {
  static constexpr std::string_view kType = "release";
  static void put(const Release&, json::object&) {}
  static Release read(const json::object&) { return {}; }
};

// -- engine -> gateway

template <>
struct Wire<EngineHello> {
  static constexpr std::string_view kType = "hello";
  static void put(const EngineHello& m, json::object& o) {
    o["v"] = m.version;
    o["pid"] = m.pid;
    o["models"] = array_of(m.models, [](const ModelInfo& x) { return encode(x); });
    o["tensor_models"] = array_of(m.tensor_models, [](const TensorModelInfo& x) { return encode(x); });
    o["devices"] = string_array(m.devices);
    o["model_dir"] = m.model_dir;
    o["config_digest"] = m.config_digest;
    o["gateways"] = m.gateways;
    o["load_s"] = m.load_s;
    o["started_at"] = m.started_at;
    if (m.admission) o["admission"] = encode(*m.admission);
  }
  static EngineHello read(const json::object& o) {
    EngineHello m;
    m.version = integer(o, "v", 0, kMaxInt64, 0);
    m.pid = integer(o, "pid", 0, kMaxInt64, 0);
    m.models = list_of<ModelInfo>(o, "models", [](const json::value& x) { return decode_model_info(x); });
    m.tensor_models =
        list_of<TensorModelInfo>(o, "tensor_models", [](const json::value& x) { return decode_tensor_model_info(x); });
    m.devices = strings(o, "devices", kMaxSmallList);
    m.model_dir = str(o, "model_dir");
    m.config_digest = str(o, "config_digest");
    m.gateways = integer(o, "gateways", 0, kMaxInt64, 0);
    m.load_s = duration(o, "load_s");
    m.started_at = number(o, "started_at", 0, 1e12, 0);
    m.admission = admission_of(o);
    return m;
  }
};

template <>
struct Wire<Refused> {
  static constexpr std::string_view kType = "refused";
  static void put(const Refused& m, json::object& o) { o["reason"] = m.reason; }
  static Refused read(const json::object& o) { return Refused{str(o, "reason")}; }
};

template <>
struct Wire<SubmitAccepted> {
  static constexpr std::string_view kType = "accepted";
  static void put(const SubmitAccepted& m, json::object& o) {
    o["rid"] = m.rid;
    o["submission"] = encode(m.submission);
  }
  static SubmitAccepted read(const json::object& o) {
    return SubmitAccepted{rid_of(o), must(decode_accepted(need(o, "submission")))};
  }
};

template <>
struct Wire<SubmitRejected> {
  static constexpr std::string_view kType = "rejected";
  static void put(const SubmitRejected& m, json::object& o) {
    o["rid"] = m.rid;
    o["error"] = encode(m.error);
  }
  static SubmitRejected read(const json::object& o) { return SubmitRejected{rid_of(o), error_of(o)}; }
};

template <>
struct Wire<Event> {
  static constexpr std::string_view kType = "event";
  static void put(const Event& m, json::object& o) {
    o["rid"] = m.rid;
    o["event"] = encode(m.event);
  }
  static Event read(const json::object& o) { return Event{rid_of(o), must(decode_event(need(o, "event")))}; }
};

template <>
struct Wire<InferDone> {
  static constexpr std::string_view kType = "infer_done";
  static void put(const InferDone& m, json::object& o) {
    o["rid"] = m.rid;
    if (m.result.ok()) {
      o["result"] = encode(*m.result);
    } else {
      o["error"] = encode(m.result.error());
    }
  }
  static InferDone read(const json::object& o) {
    InferDone m;
    m.rid = rid_of(o);
    if (get(o, "error")) {
      m.result = error_of(o);
    } else {
      m.result = must(decode_tensor_result(need(o, "result")));
    }
    return m;
  }
};

template <>
struct Wire<Withdrawn> {
  static constexpr std::string_view kType = "withdrawn";
  static void put(const Withdrawn& m, json::object& o) {
    o["rid"] = m.rid;
    o["ok"] = m.ok;
  }
  static Withdrawn read(const json::object& o) { return Withdrawn{rid_of(o), boolean(o, "ok")}; }
};

template <>
struct Wire<StateReport> {
  static constexpr std::string_view kType = "state";
  static void put(const StateReport& m, json::object& o) {
    o["qid"] = m.qid;
    if (m.admission) o["admission"] = encode(*m.admission);
    encode_metrics(m.metrics, o);
  }
  static StateReport read(const json::object& o) {
    return StateReport{static_cast<std::uint64_t>(integer(o, "qid", 0, kMaxInt64, 0, true)), admission_of(o),
                       must(decode_metrics(o))};
  }
};

template <>
struct Wire<StatusReport> {
  static constexpr std::string_view kType = "status";
  static void put(const StatusReport& m, json::object& o) {
    o["status"] = encode(m.status);
    if (m.admission) o["admission"] = encode(*m.admission);
    encode_metrics(m.metrics, o);
  }
  static StatusReport read(const json::object& o) {
    return StatusReport{must(decode_status(need(o, "status"))), admission_of(o), must(decode_metrics(o))};
  }
};

// -- the variants

/// `o` as a frame: the 4-byte length, then the JSON written straight after it.
std::string frame_of_object(const json::object& o) {
  std::string frame(kHeaderBytes, '\0');
  json::serializer sr;
  sr.reset(&o);
  char buf[16384];
  while (!sr.done()) frame.append(sr.read(buf, sizeof buf));
  seal_frame(frame);
  return frame;
}

template <class V>
std::string encode_variant(const V& message) {
  return std::visit(
      [](const auto& m) {
        using M = std::decay_t<decltype(m)>;
        json::object o;
        o["t"] = Wire<M>::kType;
        Wire<M>::put(m, o);
        return frame_of_object(o);
      },
      message);
}

template <class V>
std::string_view name_of(const V& message) {
  return std::visit([](const auto& m) { return Wire<std::decay_t<decltype(m)>>::kType; }, message);
}

/// The alternative of V named `type`, read from `o`; nullopt for an unknown type.
template <class V, std::size_t I = 0>
std::optional<V> read_variant(std::string_view type, const json::object& o) {
  if constexpr (I == std::variant_size_v<V>) {
    return std::nullopt;
  } else {
    using M = std::variant_alternative_t<I, V>;
    if (type == Wire<M>::kType) return V(std::in_place_index<I>, Wire<M>::read(o));
    return read_variant<V, I + 1>(type, o);
  }
}

/// The rid of a message that does not decode, when one can be read (for the error).
std::uint64_t rid_if_any(const json::object& o) {
  const json::value* v = o.if_contains("rid");
  if (v && v->is_uint64()) return v->as_uint64();
  if (v && v->is_int64() && v->as_int64() > 0) return static_cast<std::uint64_t>(v->as_int64());
  return 0;
}

template <class V>
Decoded<V> decode_variant(std::string_view payload) {
  json::parse_options opts;
  opts.allow_invalid_utf8 = true;  // token bytes may be part of a character
  opts.max_depth = 32;
  boost::system::error_code ec;
  const json::value v = json::parse(payload, ec, {}, opts);
  if (ec) return DecodeError{"", 0, "frame is not JSON: " + ec.message()};
  if (!v.is_object()) return DecodeError{"", 0, "frame is not a JSON object"};
  const json::object& o = v.as_object();
  const json::value* t = o.if_contains("t");
  if (!t || !t->is_string() || t->as_string().empty()) return DecodeError{"", 0, "frame has no message type \"t\""};
  DecodeError error{std::string(t->as_string()), rid_if_any(o), {}};
  try {
    if (std::optional<V> m = read_variant<V>(error.type, o)) return std::move(*m);
    error.message = "unknown message type \"" + error.type + "\"";
  } catch (const FieldError& e) {
    error.message = "bad " + error.type + ": " + e.what();
  } catch (const std::exception& e) {  // bad_alloc, length_error: still the peer's frame
    error.message = "bad " + error.type + ": undecodable message: " + e.what();
  }
  return error;
}

}  // namespace

std::string encode_frame(const ToEngine& message) { return encode_variant(message); }
std::string encode_frame(const ToGateway& message) { return encode_variant(message); }

Decoded<ToEngine> decode_to_engine(std::string_view payload) { return decode_variant<ToEngine>(payload); }
Decoded<ToGateway> decode_to_gateway(std::string_view payload) { return decode_variant<ToGateway>(payload); }

std::string_view type_name(const ToEngine& message) { return name_of(message); }
std::string_view type_name(const ToGateway& message) { return name_of(message); }

}  // namespace vg::wire
