// Framing of the engine wire protocol (the Unix socket between a gateway and
// an engine process): each message is a 4-byte big-endian payload length
// followed by the payload, one JSON object whose "t" names the message type.
// Pure and torch-free; FrameReader is what a socket's bytes go through, so a
// truncated, oversized or malformed frame is an error value, never a crash.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <boost/json.hpp>

#include "common/error.hpp"

namespace vg::wire {

/// Bytes of the length prefix.
inline constexpr std::size_t kHeaderBytes = 4;

/// The frame of `message` (a JSON object with a string "t"): length prefix
/// + serialized payload. Token bytes that are not UTF-8 travel as they are.
std::string encode_frame(const boost::json::object& message);

/// Splits a byte stream into messages. Feed bytes with append(), then call
/// next() until it returns nullopt (needs more bytes) or an error (the
/// stream is unusable: close the connection and log the reason).
/// Not thread-safe: one reader per connection.
class FrameReader {
 public:
  /// `max_payload_bytes`: a larger length prefix is an error at once
  /// (before any of its payload is buffered).
  explicit FrameReader(std::size_t max_payload_bytes) : max_payload_(max_payload_bytes) {}

  void append(std::string_view bytes) { buffer_.append(bytes); }

  /// The next whole message, nullopt when more bytes are needed, or
  /// kInvalidRequest saying what is wrong: a length over the limit or zero,
  /// a payload that is not a JSON object, no string "t".
  std::optional<Result<boost::json::object>> next();

  /// Bytes buffered and not yet returned as a message.
  std::size_t buffered() const { return buffer_.size() - offset_; }

 private:
  std::size_t max_payload_;
  std::string buffer_;
  std::size_t offset_ = 0;
};

/// The message type ("t") of a message FrameReader returned.
std::string_view message_type(const boost::json::object& message);

}  // namespace vg::wire
