// A framed message connection over a Unix stream socket (the engine wire
// protocol): one reader thread that splits the bytes into frames
// (frame.hpp) and hands each payload to a callback, and one writer thread that
// sends what send() queued, so a sender (an engine thread pushing events)
// never blocks on the peer. A send() with Send::kDirect writes on the
// caller's thread instead when nothing is waiting to be written: one
// non-blocking system call and no writer wake-up, for a request's submit
// and its answer; what the socket does not take at once goes to the writer.
// Torch-free.
//
// Threads: send() and close() from any thread. The callbacks run on the
// reader thread, one at a time; on_close runs once, after the last
// on_message. The threads hold the Channel alive until they end, so the
// owner may drop its pointer in a callback.
#pragma once

#include <sys/types.h>

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "common/error.hpp"
#include "wire/protocol.hpp"

namespace vg::wire {

/// Limits of one connection.
struct ChannelLimits {
  std::size_t max_payload_bytes = kMaxFrameBytes;  ///< a larger incoming frame closes the connection
  std::size_t max_queued_bytes = 256u << 20;  ///< unsent bytes queued; more closes it (the peer is not reading)
};

/// How send() hands a message to the socket.
enum class Send {
  /// The writer thread writes it, with everything else queued when it
  /// wakes, in one system call: the sender never makes one (an engine's
  /// events). A sender inside a WakeupBatch (common/wakeup_batch.hpp) wakes
  /// the writer once, when its batch closes: a step's frames go together.
  /// A sender outside one wakes it at once, with whatever a batch holds back.
  kQueued,
  /// Written at once on the caller's thread (non-blocking) when nothing is
  /// queued or being written, so the writer thread is not woken; otherwise,
  /// and for what the socket does not take at once, queued and the writer
  /// woken at once (a WakeupBatch does not hold it back). Order is kept
  /// either way.
  kDirect,
};

class Channel : public std::enable_shared_from_this<Channel> {
 public:
  /// A frame's payload (envelope.hpp decodes it); valid during the call.
  using OnMessage = std::function<void(std::string_view payload)>;
  using OnClose = std::function<void(const std::string& reason)>;

  /// Takes ownership of a connected socket `fd`. Call start() next.
  static std::shared_ptr<Channel> adopt(int fd, ChannelLimits limits = {});
  ~Channel();
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;

  /// Starts the reader and writer threads.
  void start(OnMessage on_message, OnClose on_close);
  /// Sends `frame` (a whole frame: envelope.hpp's encode_frame) as `how`
  /// says; false when the channel is closed (or just closed: the queue would
  /// pass max_queued_bytes, or a direct write failed).
  bool send(std::string frame, Send how = Send::kQueued);
  /// Closes the connection (both threads stop; on_close gets `reason`). Idempotent.
  void close(const std::string& reason);
  bool closed() const;
  /// Waits until everything queued has been written (or the channel
  /// closed), at most `timeout_s`; true when the queue is empty.
  bool flush(double timeout_s);
  int fd() const { return fd_; }

 private:
  Channel(int fd, ChannelLimits limits) : fd_(fd), limits_(limits) {}
  void read_loop(OnMessage on_message, OnClose on_close);
  void write_loop();
  /// Queues `frame` and wakes the writer: inside the calling thread's
  /// WakeupBatch (kQueued) once, at the batch's end; otherwise now; false
  /// when that would pass max_queued_bytes. Requires mu_.
  bool enqueue(std::string frame, Send how);

  const int fd_;
  const ChannelLimits limits_;
  mutable std::mutex mu_;
  std::condition_variable writer_cv_;  // with mu_: the writer waits for frames
  std::condition_variable idle_cv_;    // with mu_: flush() waits for the queue to empty
  std::deque<std::string> queue_;  // guarded by mu_
  std::size_t queued_bytes_ = 0;   // guarded by mu_
  bool closed_ = false;            // guarded by mu_
  bool writing_ = false;           // guarded by mu_: the writer, or a direct send, is writing
  std::string close_reason_;       // guarded by mu_
};

/// Connects to the Unix socket at `path`. Errors: kOverloaded saying why
/// (no such socket, refused, path too long).
Result<int> connect_unix(const std::string& path);
/// Binds and listens on `path` (a stale socket file there is replaced),
/// with mode 0600. Errors: kConfig saying why, also when an engine still
/// accepts connections on `path`.
Result<int> listen_unix(const std::string& path);
/// The user id of the process at the other end of Unix socket `fd`.
std::optional<uid_t> peer_uid(int fd);

/// Reads one frame from blocking socket `fd` within `timeout_s` (used for
/// the hello, before a Channel takes the socket) and returns its payload.
/// Errors: kOverloaded on timeout or close, kInvalidRequest on a bad frame.
Result<std::string> read_one(int fd, double timeout_s, std::size_t max_payload_bytes);
/// Writes `frame` (a whole frame) to blocking socket `fd`.
Status write_one(int fd, std::string_view frame);

}  // namespace vg::wire
