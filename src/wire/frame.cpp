// Framing (see frame.hpp).
#include "wire/frame.hpp"

namespace vg::wire {

void seal_frame(std::string& frame) {
  const auto n = static_cast<std::uint32_t>(frame.size() - kHeaderBytes);
  frame[0] = static_cast<char>((n >> 24) & 0xff);
  frame[1] = static_cast<char>((n >> 16) & 0xff);
  frame[2] = static_cast<char>((n >> 8) & 0xff);
  frame[3] = static_cast<char>(n & 0xff);
}

std::string frame_of(std::string_view payload) {
  std::string out;
  out.reserve(kHeaderBytes + payload.size());
  out.append(kHeaderBytes, '\0');
  out += payload;
  seal_frame(out);
  return out;
}

void FrameReader::append(std::string_view bytes) {
  compact();
  buffer_.append(bytes);
}

void FrameReader::compact() {
  if (offset_ == buffer_.size()) {
    buffer_.clear();
    offset_ = 0;
  } else if (offset_ > (1u << 20) && offset_ * 2 > buffer_.size()) {
    buffer_.erase(0, offset_);
    offset_ = 0;
  }
}

std::optional<Result<std::string_view>> FrameReader::next() {
  compact();  // the payload returned last is no longer read
  if (buffered() < kHeaderBytes) return std::nullopt;
  const auto* p = reinterpret_cast<const unsigned char*>(buffer_.data() + offset_);
  const std::size_t n = (std::size_t{p[0]} << 24) | (std::size_t{p[1]} << 16) | (std::size_t{p[2]} << 8) | p[3];
  if (n == 0) return Result<std::string_view>(Error(ErrorCode::kInvalidRequest, "frame with an empty payload"));
  if (n > max_payload_) {
    return Result<std::string_view>(
        Error(ErrorCode::kInvalidRequest,
              "frame of " + std::to_string(n) + " bytes exceeds the limit of " + std::to_string(max_payload_)));
  }
  if (buffered() < kHeaderBytes + n) return std::nullopt;
  const std::string_view payload(buffer_.data() + offset_ + kHeaderBytes, n);
  offset_ += kHeaderBytes + n;
  return Result<std::string_view>(payload);
}

}  // namespace vg::wire
