// Framing (see frame.hpp).
#include "wire/frame.hpp"

namespace vg::wire {
namespace json = boost::json;

std::string encode_frame(const json::object& message) {
  const std::string payload = json::serialize(message);
  const auto n = static_cast<std::uint32_t>(payload.size());
  std::string out;
  out.reserve(kHeaderBytes + payload.size());
  out.push_back(static_cast<char>((n >> 24) & 0xff));
  out.push_back(static_cast<char>((n >> 16) & 0xff));
  out.push_back(static_cast<char>((n >> 8) & 0xff));
  out.push_back(static_cast<char>(n & 0xff));
  out += payload;
  return out;
}

std::optional<Result<json::object>> FrameReader::next() {
  if (buffered() < kHeaderBytes) return std::nullopt;
  const auto* p = reinterpret_cast<const unsigned char*>(buffer_.data() + offset_);
  const std::size_t n = (std::size_t{p[0]} << 24) | (std::size_t{p[1]} << 16) | (std::size_t{p[2]} << 8) | p[3];
  if (n == 0) return Result<json::object>(Error(ErrorCode::kInvalidRequest, "frame with an empty payload"));
  if (n > max_payload_) {
    return Result<json::object>(Error(ErrorCode::kInvalidRequest, "frame of " + std::to_string(n) +
                                                                      " bytes exceeds the limit of " +
                                                                      std::to_string(max_payload_)));
  }
  if (buffered() < kHeaderBytes + n) return std::nullopt;
  const std::string_view payload(buffer_.data() + offset_ + kHeaderBytes, n);
  json::parse_options opts;
  opts.allow_invalid_utf8 = true;  // token bytes may be part of a character
  opts.max_depth = 32;
  boost::system::error_code ec;
  json::value v = json::parse(payload, ec, {}, opts);
  // Only now, with `payload` read, may the buffer move.
  offset_ += kHeaderBytes + n;
  if (offset_ == buffer_.size()) {
    buffer_.clear();
    offset_ = 0;
  } else if (offset_ > (1u << 20) && offset_ * 2 > buffer_.size()) {
    buffer_.erase(0, offset_);
    offset_ = 0;
  }
  if (ec) return Result<json::object>(Error(ErrorCode::kInvalidRequest, "frame is not JSON: " + ec.message()));
  if (!v.is_object()) return Result<json::object>(Error(ErrorCode::kInvalidRequest, "frame is not a JSON object"));
  json::object& o = v.as_object();
  const json::value* t = o.if_contains("t");
  if (!t || !t->is_string() || t->as_string().empty()) {
    return Result<json::object>(Error(ErrorCode::kInvalidRequest, "frame has no message type \"t\""));
  }
  return Result<json::object>(std::move(o));
}

std::string_view message_type(const json::object& message) {
  const json::value* t = message.if_contains("t");
  return t && t->is_string() ? std::string_view(t->as_string()) : std::string_view();
}

}  // namespace vg::wire
