// Channel and the Unix socket helpers (see channel.hpp).
#include "wire/channel.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <spdlog/fmt/fmt.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <string_view>
#include <thread>

#include "common/wakeup_batch.hpp"
#include "wire/frame.hpp"

namespace vg::wire {
namespace {

/// Writes `data` to socket `fd` with send(2) and `flags` (MSG_NOSIGNAL is
/// added), retrying on EINTR, until all is written, the socket would block
/// (MSG_DONTWAIT), or it fails. Returns the bytes written; `error` is 0, or
/// the errno of the failure (EPIPE when send wrote nothing).
std::size_t write_socket(int fd, std::string_view data, int flags, int& error) {
  error = 0;
  std::size_t off = 0;
  while (off < data.size()) {
    const ssize_t n = ::send(fd, data.data() + off, data.size() - off, flags | MSG_NOSIGNAL);
    if (n > 0) {
      off += static_cast<std::size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      if (!(n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))) error = n < 0 ? errno : EPIPE;
      break;
    }
  }
  return off;
}

}  // namespace

std::shared_ptr<Channel> Channel::adopt(int fd, ChannelLimits limits) {
  return std::shared_ptr<Channel>(new Channel(fd, limits));
}

Channel::~Channel() { ::close(fd_); }

void Channel::start(OnMessage on_message, OnClose on_close) {
  auto self = shared_from_this();
  std::thread([self, m = std::move(on_message), c = std::move(on_close)]() mutable {
    self->read_loop(std::move(m), std::move(c));
  }).detach();
  std::thread([self] { self->write_loop(); }).detach();
}

bool Channel::enqueue(std::string frame, Send how) {
  if (queued_bytes_ + frame.size() > limits_.max_queued_bytes) return false;
  queued_bytes_ += frame.size();
  const bool was_empty = queue_.empty();
  queue_.push_back(std::move(frame));
  if (how == Send::kQueued && WakeupBatch::open()) {
    // One wake-up per WakeupBatch of the sending thread (a decode step).
    if (was_empty) WakeupBatch::defer(this, [self = shared_from_this()] { self->writer_cv_.notify_one(); });
  } else {
    // At once, also when frames are already queued: their wake-up may be
    // held back by another thread's batch (a direct send is wanted now, and
    // a heartbeat must not wait for the end of an engine step).
    writer_cv_.notify_one();
  }
  return true;
}

bool Channel::send(std::string frame, Send how) {
  std::unique_lock lk(mu_);
  if (closed_) return false;
  if (how == Send::kDirect && queue_.empty() && !writing_) {
    writing_ = true;  // the writer and other direct senders queue behind this frame
    lk.unlock();
    int error = 0;
    const std::size_t off = write_socket(fd_, frame, MSG_DONTWAIT, error);  // a full socket: the writer sends the rest
    lk.lock();
    writing_ = false;
    if (error != 0) {
      lk.unlock();
      close(std::string("write failed: ") + std::strerror(error));
      return false;
    }
    if (off < frame.size()) {
      // The rest of this frame goes before anything queued meanwhile.
      frame.erase(0, off);
      queued_bytes_ += frame.size();
      queue_.push_front(std::move(frame));
    }
    if (!queue_.empty()) writer_cv_.notify_one();
    idle_cv_.notify_all();
    return true;
  }
  if (enqueue(std::move(frame), how)) return true;
  lk.unlock();
  close("the peer is not reading: " + std::to_string(limits_.max_queued_bytes) + " bytes queued");
  return false;
}

void Channel::close(const std::string& reason) {
  {
    std::lock_guard lk(mu_);
    if (closed_) return;
    closed_ = true;
    close_reason_ = reason;
    writer_cv_.notify_all();
    idle_cv_.notify_all();
  }
  ::shutdown(fd_, SHUT_RDWR);  // wakes the reader
}

bool Channel::closed() const {
  std::lock_guard lk(mu_);
  return closed_;
}

bool Channel::flush(double timeout_s) {
  std::unique_lock lk(mu_);
  if (!queue_.empty()) writer_cv_.notify_one();  // frames a WakeupBatch still holds back
  return idle_cv_.wait_for(lk, std::chrono::duration<double>(timeout_s),
                      [&] { return closed_ || (queue_.empty() && !writing_); }) &&
         queue_.empty();
}

void Channel::read_loop(OnMessage on_message, OnClose on_close) {
  FrameReader reader(limits_.max_payload_bytes);
  std::string buf(64 * 1024, '\0');
  std::string error;
  while (error.empty()) {
    const ssize_t n = ::recv(fd_, buf.data(), buf.size(), 0);
    if (n == 0) {
      error = "closed by the peer";
      break;
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      error = std::string("read failed: ") + std::strerror(errno);
      break;
    }
    reader.append(std::string_view(buf.data(), static_cast<std::size_t>(n)));
    while (true) {
      auto msg = reader.next();
      if (!msg) break;
      if (!msg->ok()) {
        error = msg->error().message;
        break;
      }
      if (closed()) break;
      on_message(msg->value());
    }
    if (closed()) break;
  }
  close(error);
  std::string reason;
  {
    std::lock_guard lk(mu_);
    reason = close_reason_;
  }
  on_close(reason);
}

void Channel::write_loop() {
  // Everything queued when the writer wakes goes out in one send(): the
  // events of one decode step (a frame per sequence) cost one system call
  // here and one wake-up of the peer's reader.
  constexpr std::size_t kBatchBytes = 1u << 20;
  std::string batch;
  while (true) {
    batch.clear();
    {
      std::unique_lock lk(mu_);
      writer_cv_.wait(lk, [&] { return closed_ || (!queue_.empty() && !writing_); });
      if (closed_) return;
      while (!queue_.empty() && (batch.empty() || batch.size() + queue_.front().size() <= kBatchBytes)) {
        std::string& frame = queue_.front();
        queued_bytes_ -= frame.size();
        if (batch.empty() && frame.size() >= kBatchBytes) {
          batch.swap(frame);
        } else {
          batch += frame;
        }
        queue_.pop_front();
      }
      writing_ = true;
    }
    int error = 0;
    if (write_socket(fd_, batch, 0, error) < batch.size()) {
      close(std::string("write failed: ") + std::strerror(error));
      return;
    }
    if (batch.capacity() > 4 * kBatchBytes) batch = std::string();
    std::lock_guard lk(mu_);
    writing_ = false;
    idle_cv_.notify_all();
  }
}

namespace {

Result<sockaddr_un> unix_address(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return Error(ErrorCode::kConfig, "socket path '" + path + "' is empty or longer than " +
                                         std::to_string(sizeof(addr.sun_path) - 1) + " bytes");
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  return addr;
}

}  // namespace

Result<int> connect_unix(const std::string& path) {
  auto addr = unix_address(path);
  if (!addr.ok()) return Error(ErrorCode::kOverloaded, addr.error().message);
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Error(ErrorCode::kOverloaded, std::string("socket: ") + std::strerror(errno));
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&*addr), sizeof(sockaddr_un)) != 0) {
    const int e = errno;
    ::close(fd);
    return Error(ErrorCode::kOverloaded, "connect " + path + ": " + std::strerror(e));
  }
  return fd;
}

Result<int> listen_unix(const std::string& path) {
  auto addr = unix_address(path);
  if (!addr.ok()) return std::move(addr).error();
  if (auto live = connect_unix(path); live.ok()) {
    ::close(*live);
    return Error(ErrorCode::kConfig, "socket " + path + " is in use: another engine accepts connections there");
  }
  ::unlink(path.c_str());  // a stale socket of an engine that is gone
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Error(ErrorCode::kConfig, std::string("socket: ") + std::strerror(errno));
  // Created 0600 from the start: a umask that leaves no window in which
  // another user could connect.
  const mode_t old = ::umask(0177);
  const int rc = ::bind(fd, reinterpret_cast<const sockaddr*>(&*addr), sizeof(sockaddr_un));
  const int e = errno;
  ::umask(old);
  if (rc != 0 || ::chmod(path.c_str(), 0600) != 0 || ::listen(fd, 64) != 0) {
    ::close(fd);
    return Error(ErrorCode::kConfig, "listen on " + path + ": " + std::strerror(rc != 0 ? e : errno));
  }
  return fd;
}

std::optional<uid_t> peer_uid(int fd) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return std::nullopt;
  return cred.uid;
}

Result<std::string> read_one(int fd, double timeout_s, std::size_t max_payload_bytes) {
  FrameReader reader(max_payload_bytes);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  char buf[1];
  while (true) {
    if (auto msg = reader.next()) {
      if (!msg->ok()) return std::move(*msg).error();
      return std::string(msg->value());
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return Error(ErrorCode::kOverloaded, fmt::format("no answer within {:g} s", timeout_s));
    pollfd p{fd, POLLIN, 0};
    const int rc = ::poll(&p, 1, static_cast<int>(left.count()));
    if (rc < 0 && errno == EINTR) continue;
    if (rc <= 0) continue;
    // One byte at a time (a hello is small), so bytes of later messages stay
    // in the socket for the Channel that takes it over.
    const ssize_t n = ::recv(fd, buf, 1, 0);
    if (n == 0) return Error(ErrorCode::kOverloaded, "connection closed");
    if (n < 0) {
      if (errno == EINTR) continue;
      return Error(ErrorCode::kOverloaded, std::string("read failed: ") + std::strerror(errno));
    }
    reader.append(std::string_view(buf, static_cast<std::size_t>(n)));
  }
}

Status write_one(int fd, std::string_view frame) {
  int error = 0;
  if (write_socket(fd, frame, 0, error) < frame.size()) {
    return Error(ErrorCode::kOverloaded, std::string("write failed: ") + std::strerror(error));
  }
  return Status::Ok();
}

}  // namespace vg::wire
