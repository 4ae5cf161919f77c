// EngineLink and the hello (see engine_link.hpp): the only gateway file
// that sees the wire's JSON.
#include "gateway/engine_link.hpp"

#include <unistd.h>

#include <fstream>

#include <boost/json.hpp>

#include "wire/channel.hpp"
#include "wire/codec.hpp"
#include "wire/frame.hpp"
#include "wire/protocol.hpp"

namespace vg::gateway {
namespace json = boost::json;

namespace {

std::optional<std::string> read_secret(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::string s;
  std::getline(in, s);
  if (s.empty()) return std::nullopt;
  return s;
}

std::int64_t int_field(const json::object& o, const char* key) {
  const json::value* v = o.if_contains(key);
  return v && v->is_int64() ? v->as_int64() : 0;
}

/// The parts of a hello every reader needs (they never fail).
void read_identity(const json::object& o, EngineHello& out) {
  if (const json::value* d = o.if_contains("devices"); d && d->is_array()) {
    for (const json::value& v : d->as_array()) {
      if (v.is_string()) out.devices.emplace_back(v.as_string());
    }
  }
  out.pid = int_field(o, "pid");
  out.gateways = int_field(o, "gateways");
  if (const json::value* v = o.if_contains("config_digest"); v && v->is_string()) out.config_digest = v->as_string();
  if (const json::value* v = o.if_contains("started_at"); v && v->is_number()) out.started_at = v->to_number<double>();
}

/// What it serves and its admission state; the first part that cannot be read, as an error.
Status read_offer(const json::object& o, EngineHello& out) {
  if (const json::value* m = o.if_contains("models"); m && m->is_array()) {
    for (const json::value& v : m->as_array()) {
      auto info = wire::decode_model_info(v);
      if (!info.ok()) return info.error();
      out.models.push_back(std::move(info).value());
    }
  }
  if (const json::value* m = o.if_contains("tensor_models"); m && m->is_array()) {
    for (const json::value& v : m->as_array()) {
      auto info = wire::decode_tensor_model_info(v);
      if (!info.ok()) return info.error();
      out.tensor_models.push_back(std::move(info).value());
    }
  }
  if (const json::value* a = o.if_contains("admission")) {
    auto state = wire::decode_admission_state(*a);
    if (!state.ok()) return state.error();
    out.admission = std::move(state).value();
  }
  return Status::Ok();
}

/// An error the engine sent, or kInternal saying that it sent none or a bad one.
Error read_error(const json::object& m, const char* none) {
  Error error(ErrorCode::kInternal, none);
  if (const json::value* e = m.if_contains("error")) {
    if (Status st = wire::decode_error(*e, &error); !st.ok()) {
      error = Error(ErrorCode::kInternal, "engine sent a bad error: " + st.error().message);
    }
  }
  return error;
}

EngineMetrics read_metrics(const json::object& m) {
  EngineMetrics out;
  if (const json::value* hs = m.if_contains("histograms"); hs && hs->is_array()) {
    for (const json::value& v : hs->as_array()) {
      if (auto h = wire::decode_histogram(v); h.ok()) out.histograms.push_back(std::move(h).value());
    }
  }
  if (const json::value* cs = m.if_contains("counters"); cs && cs->is_array()) {
    for (const json::value& v : cs->as_array()) {
      const json::object* c = v.if_object();
      if (!c) continue;
      const json::value* name = c->if_contains("name");
      const json::value* labels = c->if_contains("labels");
      const json::value* value = c->if_contains("value");
      if (!name || !name->is_string() || name->as_string() != "tensor_requests_total" || !labels ||
          !labels->is_array() || !value || !value->is_number()) {
        continue;
      }
      EngineMetrics::Counter counter;
      for (const json::value& l : labels->as_array()) {
        if (!l.is_string()) break;
        counter.labels.emplace_back(l.as_string());
      }
      counter.value = value->to_number<double>();
      out.tensor_requests.push_back(std::move(counter));
    }
  }
  if (const json::value* t = m.if_contains("generated_tokens"); t && t->is_number()) {
    out.generated_tokens = t->to_number<double>();
  }
  return out;
}

std::optional<std::uint64_t> read_id(const json::object& m, const char* key) {
  const json::value* v = m.if_contains(key);
  if (v && v->is_uint64()) return v->as_uint64();
  if (v && v->is_int64()) return static_cast<std::uint64_t>(v->as_int64());
  return std::nullopt;
}

StatusMessage read_status(const json::object& m) {
  StatusMessage out;
  if (const json::value* st = m.if_contains("status")) {
    if (auto status = wire::decode_status(*st); status.ok()) out.status = std::move(status).value();
  }
  if (const json::value* a = m.if_contains("admission")) {
    out.admission_sent = true;
    if (auto state = wire::decode_admission_state(*a); state.ok()) out.admission = std::move(state).value();
  }
  out.metrics = read_metrics(m);
  return out;
}

StateReply read_state(const json::object& m) {
  StateReply out;
  out.metrics = read_metrics(m);
  out.qid = read_id(m, "qid");
  if (const json::value* a = m.if_contains("admission")) {
    if (auto state = wire::decode_admission_state(*a); state.ok()) out.admission = std::move(state).value();
  }
  return out;
}

SubmitAnswer read_answer(const json::object& m, bool accepted) {
  SubmitAnswer out;
  if (!accepted) {
    out.kind = SubmitAnswer::Kind::kRejected;
    out.error = read_error(m, "the engine refused the request without saying why");
    return out;
  }
  out.kind = SubmitAnswer::Kind::kAccepted;
  if (const json::value* sv = m.if_contains("submission"); sv && sv->is_object()) {
    if (const json::value* c = sv->as_object().if_contains("cost_bytes"); c && c->is_int64()) {
      out.cost_bytes = c->as_int64();
    }
  }
  if (const json::value* sv = m.if_contains("submission")) out.accepted = wire::decode_accepted(*sv);
  return out;
}

InferDoneMessage read_infer_done(const json::object& m) {
  InferDoneMessage out;
  if (m.if_contains("error")) {
    out.result = read_error(m, "the engine failed the request without saying why");
  } else if (const json::value* rv = m.if_contains("result")) {
    out.result = wire::decode_tensor_result(*rv);
    if (!out.result.ok()) {
      out.unreadable = out.result.error().message;
      out.result = Error(ErrorCode::kInternal, "the engine sent a result that could not be read: " + out.unreadable);
    }
  }
  return out;
}

EngineMessage read_message(const json::object& m) {
  const std::string_view type = wire::message_type(m);
  EngineMessage out;
  if (type == "status") {
    out.body = read_status(m);
    return out;
  }
  if (type == "state") {
    out.body = read_state(m);
    return out;
  }
  out.rid = read_id(m, "rid").value_or(0);
  if (type == "accepted" || type == "rejected") {
    out.body = read_answer(m, type == "accepted");
  } else if (type == "withdrawn") {
    const json::value* ok = m.if_contains("ok");
    out.body = WithdrawnMessage{ok && ok->is_bool() && ok->as_bool()};
  } else if (type == "infer_done") {
    out.body = read_infer_done(m);
  } else if (type == "event") {
    EventMessage e;
    if (const json::value* ev = m.if_contains("event")) e.event = wire::decode_event(*ev);
    out.body = std::move(e);
  }
  return out;
}

}  // namespace

HelloReply say_hello(int fd, const std::string& secret_path) {
  HelloReply out;
  const std::optional<std::string> secret = read_secret(secret_path);
  if (!secret) {
    out.refused = "cannot read its secret " + secret_path;
    return out;
  }
  json::object hello{{"t", "hello"},
                     {"v", wire::kProtocolVersion},
                     {"secret", *secret},
                     {"gateway", "pid " + std::to_string(::getpid())}};
  if (!wire::write_one(fd, hello).ok()) {
    out.gone = true;  // a dead engine's socket, before its exit is reaped
    return out;
  }
  auto reply = wire::read_one(fd, 5.0, 64u << 20);
  if (!reply.ok()) {
    out.refused = "no hello: " + reply.error().message;
  } else if (wire::message_type(*reply) != "hello") {
    const json::value* r = reply->if_contains("reason");
    out.refused = "refused: " + (r && r->is_string() ? std::string(r->as_string()) : std::string("no reason"));
  } else {
    read_identity(*reply, out.hello);
    if (Status st = read_offer(*reply, out.hello); !st.ok()) out.invalid = "bad hello: " + st.error().message;
  }
  return out;
}

std::shared_ptr<EngineLink> EngineLink::adopt(int fd) {
  return std::shared_ptr<EngineLink>(new EngineLink(wire::Channel::adopt(fd)));
}

void EngineLink::start(OnMessage on_message, OnClose on_close) {
  channel_->start([on_message = std::move(on_message)](json::object m) { on_message(read_message(m)); },
                  std::move(on_close));
}

void EngineLink::submit(const SubmitOrder& order, bool direct) {
  json::object msg;
  if (order.tensor) {
    json::object request = wire::encode(*order.tensor);
    request["timeout_s"] = order.timeout_s;
    msg = json::object{{"t", "infer"}, {"rid", order.rid}, {"request", std::move(request)}};
  } else {
    json::object request = wire::encode(*order.request);
    request["timeout_s"] = order.timeout_s;
    msg = json::object{{"t", "submit"}, {"rid", order.rid}, {"request", std::move(request)}};
    if (order.resume) msg["resume"] = wire::encode(*order.resume);
    if (order.admitted_before) msg["admitted_before"] = true;
  }
  channel_->send(msg, direct ? wire::Send::kDirect : wire::Send::kQueued);
}

void EngineLink::cancel(std::uint64_t rid) {
  channel_->send(json::object{{"t", "cancel"}, {"rid", rid}}, wire::Send::kDirect);
}

void EngineLink::withdraw(std::uint64_t rid) {
  channel_->send(json::object{{"t", "withdraw"}, {"rid", rid}}, wire::Send::kDirect);
}

void EngineLink::query_state(std::uint64_t qid) {
  channel_->send(json::object{{"t", "state"}, {"qid", qid}}, wire::Send::kDirect);
}

void EngineLink::release() { channel_->send(json::object{{"t", "release"}}); }

bool EngineLink::flush(double timeout_s) { return channel_->flush(timeout_s); }

void EngineLink::close(const std::string& reason) { channel_->close(reason); }

SubmitAnswer closed_answer(bool last_crash) {
  SubmitAnswer out;
  out.kind = last_crash ? SubmitAnswer::Kind::kCrashed : SubmitAnswer::Kind::kClosed;
  return out;
}

}  // namespace vg::gateway
