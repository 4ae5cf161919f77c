// Framing of the engine wire protocol (the Unix socket between a gateway and
// an engine process): each message is a 4-byte big-endian payload length
// followed by the payload (one JSON object whose "t" names the message type:
// envelope.hpp reads and writes those). Pure and JSON-free; FrameReader is
// what a socket's bytes go through, so a truncated or oversized frame is an
// error value, never a crash.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "common/error.hpp"

namespace vg::wire {

/// Bytes of the length prefix.
inline constexpr std::size_t kHeaderBytes = 4;

/// Writes the length prefix of `frame`, whose first kHeaderBytes bytes the
/// caller left for it and whose rest is the payload (at most 4 GiB - 1).
void seal_frame(std::string& frame);

/// The frame of `payload`: length prefix + payload.
std::string frame_of(std::string_view payload);

/// Splits a byte stream into payloads. Feed bytes with append(), then call
/// next() until it returns nullopt (needs more bytes) or an error (the
/// stream is unusable: close the connection and log the reason).
/// Not thread-safe: one reader per connection.
class FrameReader {
 public:
  /// `max_payload_bytes`: a larger length prefix is an error at once
  /// (before any of its payload is buffered).
  explicit FrameReader(std::size_t max_payload_bytes) : max_payload_(max_payload_bytes) {}

  void append(std::string_view bytes);

  /// The next whole payload, nullopt when more bytes are needed, or
  /// kInvalidRequest saying what is wrong: a length over the limit or zero.
  /// The view points into the reader's buffer: valid until the next call
  /// of append() or next().
  std::optional<Result<std::string_view>> next();

  /// Bytes buffered and not yet returned as a payload.
  std::size_t buffered() const { return buffer_.size() - offset_; }

 private:
  /// Drops the bytes of payloads already returned, when they are worth moving.
  void compact();

  std::size_t max_payload_;
  std::string buffer_;
  std::size_t offset_ = 0;
};

}  // namespace vg::wire
