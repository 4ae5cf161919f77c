// EngineLink and the hello (see engine_link.hpp).
#include "gateway/engine_link.hpp"

#include <unistd.h>

#include <fstream>
#include <utility>
#include <variant>

#include "common/overloaded.hpp"
#include "wire/channel.hpp"
#include "wire/envelope.hpp"

namespace vg::gateway {

namespace {

std::optional<std::string> read_secret(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::string s;
  std::getline(in, s);
  if (s.empty()) return std::nullopt;
  return s;
}

/// The engine's answer to this gateway's hello, `payload`, into `out`.
void read_hello_answer(std::string_view payload, HelloReply& out) {
  wire::Decoded<wire::ToGateway> answer = wire::decode_to_gateway(payload);
  if (!answer.ok()) {
    out.invalid = answer.error().message;
    return;
  }
  std::visit(
      Overloaded{
          [&](wire::EngineHello& h) { out.hello = std::move(h); },
          [&](const wire::Refused& r) { out.refused = "refused: " + (r.reason.empty() ? "no reason" : r.reason); },
          [&](const auto& other) { out.refused = "no hello: the engine sent " + std::string(type_name(other)); },
      },
      *answer);
}

}  // namespace

HelloReply say_hello(int fd, const std::string& secret_path) {
  HelloReply out;
  const std::optional<std::string> secret = read_secret(secret_path);
  if (!secret) {
    out.refused = "cannot read its secret " + secret_path;
    return out;
  }
  const wire::GatewayHello hello{wire::kProtocolVersion, *secret, "pid " + std::to_string(::getpid())};
  if (!wire::write_one(fd, wire::encode_frame(hello)).ok()) {
    out.gone = true;  // a dead engine's socket, before its exit is reaped
    return out;
  }
  auto reply = wire::read_one(fd, 5.0, wire::kMaxFrameBytes);
  if (!reply.ok()) {
    out.refused = "no hello: " + reply.error().message;
  } else {
    read_hello_answer(*reply, out);
  }
  return out;
}

std::shared_ptr<EngineLink> EngineLink::adopt(int fd) {
  return std::shared_ptr<EngineLink>(new EngineLink(wire::Channel::adopt(fd)));
}

void EngineLink::start(OnMessage on_message, OnClose on_close) {
  channel_->start(
      [on_message = std::move(on_message)](std::string_view payload) { on_message(wire::decode_to_gateway(payload)); },
      std::move(on_close));
}

void EngineLink::submit(const SubmitOrder& order, bool direct) {
  std::string frame;
  if (order.tensor) {
    wire::Infer m{order.rid, *order.tensor};
    m.request.timeout_s = order.timeout_s;
    frame = wire::encode_frame(std::move(m));
  } else {
    wire::Submit m{order.rid, *order.request, order.resume, order.admitted_before};
    m.request.timeout_s = order.timeout_s;
    frame = wire::encode_frame(std::move(m));
  }
  channel_->send(std::move(frame), direct ? wire::Send::kDirect : wire::Send::kQueued);
}

void EngineLink::cancel(std::uint64_t rid) {
  channel_->send(wire::encode_frame(wire::Cancel{rid}), wire::Send::kDirect);
}

void EngineLink::withdraw(std::uint64_t rid) {
  channel_->send(wire::encode_frame(wire::Withdraw{rid}), wire::Send::kDirect);
}

void EngineLink::query_state(std::uint64_t qid) {
  channel_->send(wire::encode_frame(wire::QueryState{qid}), wire::Send::kDirect);
}

void EngineLink::release() { channel_->send(wire::encode_frame(wire::Release{})); }

bool EngineLink::flush(double timeout_s) { return channel_->flush(timeout_s); }

void EngineLink::close(const std::string& reason) { channel_->close(reason); }

SubmitAnswer closed_answer(bool last_crash) {
  SubmitAnswer out;
  out.kind = last_crash ? SubmitAnswer::Kind::kCrashed : SubmitAnswer::Kind::kClosed;
  return out;
}

}  // namespace vg::gateway
