// EngineServer (see engine_server.hpp).
#include "wire/engine_server.hpp"

#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>

#include "common/overloaded.hpp"
#include "wire/channel.hpp"
#include "wire/codec.hpp"
#include "wire/engine_metrics.hpp"
#include "wire/envelope.hpp"

namespace vg::wire {

namespace {

/// Compares secrets in time independent of where they differ.
bool same_secret(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (std::size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

/// Why the first message of a connection, `hello` (a payload, or why none
/// came), does not open it; empty when it does (`peer` then names the gateway).
std::string hello_refusal(const Result<std::string>& hello, const std::string& secret, std::string& peer) {
  if (!hello.ok()) return hello.error().message;
  Decoded<ToEngine> m = decode_to_engine(*hello);
  if (!m.ok()) return m.error().message;
  const auto* h = std::get_if<GatewayHello>(&*m);
  if (!h) return "first message is not a hello";
  if (h->version != kProtocolVersion) {
    return "protocol version mismatch (this engine speaks version " + std::to_string(kProtocolVersion) + ")";
  }
  if (!same_secret(h->secret, secret)) return "wrong or missing secret";
  if (!h->gateway.empty()) peer = h->gateway;
  return {};
}

Status send_refusal(int fd, std::string reason) { return write_one(fd, encode_frame(Refused{std::move(reason)})); }

}  // namespace

struct EngineServer::Conn {
  std::shared_ptr<Channel> channel;
  std::string peer;  // for log lines
  std::mutex mu;
  /// The connection's requests until their terminal event. A null handle:
  /// submit still running (cancel_pending says whether to cancel once it returns).
  struct Entry {
    std::shared_ptr<RequestHandle> handle;
    bool cancel_pending = false;
    bool poison = false;  // the crash_on_prompt test hook matched
    std::shared_ptr<TensorHandle> tensor;  // a tensor request's handle (then `handle` stays null)
    bool is_tensor = false;
  };
  std::map<std::uint64_t, Entry> requests;  // guarded by mu
  bool closed = false;                      // guarded by mu
};

EngineServer::EngineServer(Options options, Service& service, int listen_fd)
    : options_(std::move(options)), service_(service), listen_fd_(listen_fd), alone_since_(Clock::now()) {}

Result<std::unique_ptr<EngineServer>> EngineServer::start(Options options, Service& service) {
  auto fd = listen_unix(options.socket_path);
  if (!fd.ok()) return std::move(fd).error();
  std::unique_ptr<EngineServer> s(new EngineServer(std::move(options), service, *fd));
  struct stat st{};
  if (::stat(s->options_.socket_path.c_str(), &st) == 0) s->socket_inode_ = st.st_ino;
  s->accept_thread_ = std::thread([p = s.get()] { p->accept_loop(); });
  s->heartbeat_thread_ = std::thread([p = s.get()] { p->heartbeat_loop(); });
  return s;
}

EngineServer::~EngineServer() { stop(); }

int EngineServer::connections() const {
  std::lock_guard lk(mu_);
  return static_cast<int>(conns_.size());
}

std::optional<TimePoint> EngineServer::alone_since() const {
  std::lock_guard lk(mu_);
  if (!conns_.empty()) return std::nullopt;
  return alone_since_;
}

bool EngineServer::flush(double timeout_s) {
  std::vector<std::shared_ptr<Conn>> conns;
  {
    std::lock_guard lk(mu_);
    conns = conns_;
  }
  const TimePoint deadline = Clock::now() + from_seconds(timeout_s);
  bool all = true;
  for (auto& c : conns) {
    const double left = to_seconds(deadline - Clock::now());
    all = c->channel->flush(std::max(0.0, left)) && all;
  }
  return all;
}

void EngineServer::stop() {
  if (stopping_.exchange(true)) return;
  ::shutdown(listen_fd_, SHUT_RDWR);
  ::close(listen_fd_);
  {
    std::lock_guard lk(hb_mu_);
    hb_cv_.notify_all();
  }
  if (accept_thread_.joinable()) accept_thread_.join();
  if (heartbeat_thread_.joinable()) heartbeat_thread_.join();
  std::vector<std::shared_ptr<Conn>> conns;
  {
    std::lock_guard lk(mu_);
    conns = conns_;
  }
  for (auto& c : conns) {
    (void)c->channel->flush(1.0);  // events already pushed reach their gateway
    c->channel->close("engine stopping");
  }
  // The connections' threads call back into this object until they end.
  {
    std::unique_lock lk(mu_);
    conns_cv_.wait_for(lk, std::chrono::seconds(10), [&] { return conns_.empty() && hellos_ == 0; });
  }
  // A newer engine may have replaced the socket (a restart): leave that one.
  struct stat st{};
  if (::stat(options_.socket_path.c_str(), &st) == 0 && st.st_ino == socket_inode_) {
    ::unlink(options_.socket_path.c_str());
  }
}

void EngineServer::accept_loop() {
  while (!stopping_.load()) {
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (stopping_.load()) return;
      if (errno == EINTR || errno == ECONNABORTED) continue;
      spdlog::warn("engine socket: accept failed: {}", std::strerror(errno));
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      continue;
    }
    // The hello is read on its own thread, so a silent peer holds up no one.
    {
      std::lock_guard lk(mu_);
      ++hellos_;
    }
    std::thread([this, fd] {
      struct Done {
        EngineServer* s;
        ~Done() {
          std::lock_guard lk(s->mu_);
          --s->hellos_;
          s->conns_cv_.notify_all();
        }
      } done{this};
      auto conn = std::make_shared<Conn>();
      const std::optional<uid_t> uid = peer_uid(fd);
      conn->peer = "pid-less peer";
      if (!uid || *uid != ::geteuid()) {
        spdlog::warn("engine socket: refused a connection from uid {} (the engine runs as uid {})",
                     uid ? std::to_string(*uid) : "unknown", ::geteuid());
        // The peer is told why; what it sent is discarded unread (a bounded
        // wait for its hello, so the refusal is not lost to a reset).
        (void)send_refusal(fd, "this engine serves only its own user (uid " + std::to_string(::geteuid()) + ")");
        (void)read_one(fd, 1.0, 64 * 1024);
        ::close(fd);
        return;
      }
      const Result<std::string> hello = read_one(fd, 5.0, 64 * 1024);
      const std::string why = hello_refusal(hello, options_.secret, conn->peer);
      if (!why.empty()) {
        // A peer that closes before any hello is a gateway checking that an
        // engine accepts here: not worth a warning.
        if (!hello.ok() && why == "connection closed") {
          spdlog::debug("engine socket: a connection closed before its hello");
        } else {
          spdlog::warn("engine socket: closed a connection: {}", why);
        }
        (void)send_refusal(fd, why);
        ::close(fd);
        return;
      }
      if (!write_one(fd, encode_frame(hello_reply())).ok()) {
        ::close(fd);
        return;
      }
      conn->channel = Channel::adopt(fd);
      {
        std::lock_guard lk(mu_);
        if (stopping_.load()) {
          conn->channel->close("engine stopping");
          return;
        }
        conns_.push_back(conn);
      }
      spdlog::info("engine: gateway {} connected ({} connected)", conn->peer, connections());
      serve(conn);
    }).detach();
  }
}

namespace {

/// Answers a submit or infer whose request the decoder refused (a field
/// outside the wire's range) as that request's own 400, so the connection
/// and the gateway's other requests go on. False: not such a message (no
/// request number, or one in use, which register_request() also closes
/// the connection for): the caller closes the connection.
bool refuse_request(EngineServer::Conn& conn, const DecodeError& e) {
  if (e.rid == 0 || (e.type != "submit" && e.type != "infer")) return false;
  {
    std::lock_guard lk(conn.mu);
    if (conn.closed || conn.requests.count(e.rid)) return false;
  }
  const std::string prefix = "bad " + e.type + ": ";
  std::string why = e.message.rfind(prefix, 0) == 0 ? e.message.substr(prefix.size()) : e.message;
  Error error(ErrorCode::kInvalidRequest, "the engine refused the request: " + why);
  spdlog::warn("engine: request {} of gateway {} refused: {}", e.rid, conn.peer, why);
  conn.channel->send(encode_frame(SubmitRejected{e.rid, std::move(error)}), Send::kDirect);
  return true;
}

}  // namespace

void EngineServer::serve(std::shared_ptr<Conn> conn) {
  std::weak_ptr<Conn> weak = conn;
  conn->channel->start(
      [this, weak](std::string_view payload) {
        auto c = weak.lock();
        if (!c) return;
        Decoded<ToEngine> m = decode_to_engine(payload);
        if (m.ok()) {
          handle(c, std::move(m).value());
        } else if (!refuse_request(*c, m.error())) {
          spdlog::warn("engine: closing the connection of gateway {}: {}", c->peer, m.error().message);
          c->channel->close(m.error().message);
        }
      },
      [this, weak](const std::string& reason) {
        if (auto c = weak.lock()) on_closed(c, reason);
      });
}

namespace {

class EventsToConn final : public EventSink {
 public:
  EventsToConn(std::weak_ptr<EngineServer::Conn> conn, std::uint64_t rid, bool poison)
      : conn_(std::move(conn)), rid_(rid), poison_(poison) {}
  void push(EngineEvent event) override {
    auto c = conn_.lock();
    if (poison_ && std::holds_alternative<StartedEvent>(event)) {
      // As a crash in the request's first step would: after its start is out.
      if (c) {
        c->channel->send(encode_frame(Event{rid_, std::move(event)}));
        (void)c->channel->flush(1.0);
      }
      spdlog::error("test hook --test-crash-on-prompt: request {} started; aborting the engine process", rid_);
      std::abort();
    }
    if (!c) return;
    const bool terminal = is_terminal(event);
    c->channel->send(encode_frame(Event{rid_, std::move(event)}));
    if (terminal) {
      std::lock_guard lk(c->mu);
      c->requests.erase(rid_);
    }
  }

 private:
  std::weak_ptr<EngineServer::Conn> conn_;
  std::uint64_t rid_;
  bool poison_;
};

}  // namespace

void EngineServer::handle(const std::shared_ptr<Conn>& conn, ToEngine message) {
  std::visit(Overloaded{
                 [&](Submit& m) { on_submit(conn, std::move(m)); },
                 [&](Infer& m) { on_infer(conn, std::move(m)); },
                 [&](const Cancel& m) { on_cancel(*conn, m.rid); },
                 [&](const Withdraw& m) { on_withdraw(*conn, m.rid); },
                 [&](const QueryState& m) {
                   conn->channel->send(
                       encode_frame(StateReport{m.qid, service_.admission_state(), engine_metrics(options_.metrics)}),
                       Send::kDirect);
                 },
                 [&](const Release&) {
                   released_.store(true);
                   spdlog::info("engine: released by gateway {}: it exits once no gateway is connected", conn->peer);
                 },
                 [&](const GatewayHello&) {
                   spdlog::warn("engine: closing the connection of gateway {}: a second hello", conn->peer);
                   conn->channel->close("a second hello");
                 },
             },
             message);
}

namespace {

/// Registers request `rid` of `conn`, being submitted; false when it is
/// not to be submitted (the connection closed, or closes now: `rid` in use).
bool register_request(EngineServer::Conn& conn, std::uint64_t rid, EngineServer::Conn::Entry entry) {
  std::lock_guard lk(conn.mu);
  if (conn.closed) return false;
  if (!conn.requests.emplace(rid, std::move(entry)).second) {
    conn.channel->close("request number " + std::to_string(rid) + " is in use");
    return false;
  }
  return true;
}

/// Answers a submit the service refused; `rid` is forgotten.
void reject(EngineServer::Conn& conn, std::uint64_t rid, Error error) {
  {
    std::lock_guard lk(conn.mu);
    conn.requests.erase(rid);
  }
  conn.channel->send(encode_frame(SubmitRejected{rid, std::move(error)}), Send::kDirect);
}

/// Answers a submit the service took, then gives the entry of `rid` its
/// handle (`set`); true when the handle is to be cancelled at once (a
/// cancel came meanwhile, or the connection closed).
template <class F>
bool accept(EngineServer::Conn& conn, std::uint64_t rid, Accepted accepted, F&& set) {
  conn.channel->send(encode_frame(SubmitAccepted{rid, std::move(accepted)}), Send::kDirect);
  std::lock_guard lk(conn.mu);
  auto it = conn.requests.find(rid);
  if (it == conn.requests.end()) return false;
  set(it->second);
  return it->second.cancel_pending || conn.closed;
}

/// A tensor request's end as it goes back: outputs too large for one frame become kBodyTooLarge.
InferDone infer_done(std::uint64_t rid, Result<TensorResult> result) {
  if (result.ok()) {
    const std::size_t bytes = encoded_tensors_bound(result->outputs);
    if (bytes + 4096 > kMaxFrameBytes) {
      result =
          Error(ErrorCode::kBodyTooLarge, "the outputs take " + std::to_string(bytes) +
                                              " bytes on the engine wire, more than one message "
                                              "carries (" +
                                              std::to_string(kMaxFrameBytes) +
                                              " bytes, about 48 MiB of float32 values): ask "
                                              "for fewer outputs or a smaller batch, or serve the model --in-process");
    }
  }
  return InferDone{rid, std::move(result)};
}

}  // namespace

bool EngineServer::poisoned(const CompletionRequest& r) const {
  const std::string& needle = options_.crash_on_prompt;
  return !needle.empty() && (contains_text(r, needle) ||
                             (options_.prompt_text && options_.prompt_text(r).find(needle) != std::string::npos));
}

void EngineServer::on_submit(const std::shared_ptr<Conn>& conn, Submit m) {
  const std::uint64_t rid = m.rid;
  const CompletionRequest& req = m.request;
  ResumeFrom resume;
  if (m.resume) {
    resume.tokens = std::move(m.resume->tokens);
    resume.prompt_sent = m.resume->prompt_sent;
  }
  resume.admitted_before = m.admitted_before;
  const bool poison = poisoned(req);
  if (!register_request(*conn, rid, Conn::Entry{nullptr, false, poison, nullptr, false})) return;
  auto sink = std::make_shared<EventsToConn>(conn, rid, poison);
  // Events the engine pushes during submit are queued on the channel
  // before the answer; the gateway registered the rid before sending.
  Result<Submission> sub = service_.submit_resumed(req, resume, sink);
  if (!sub.ok()) {
    reject(*conn, rid, std::move(sub).error());
    return;
  }
  Accepted a{sub->model,      sub->prompt_tokens, sub->queue_position,
             sub->cost_bytes, sub->echo_text,     sub->retry_claimed_by};
  if (accept(*conn, rid, std::move(a), [&](Conn::Entry& e) { e.handle = sub->handle; })) sub->handle->cancel();
}

void EngineServer::on_infer(const std::shared_ptr<Conn>& conn, Infer m) {
  const std::uint64_t rid = m.rid;
  Conn::Entry entry;
  entry.is_tensor = true;
  if (!register_request(*conn, rid, std::move(entry))) return;
  std::weak_ptr<Conn> weak = conn;
  // Called once, on an engine thread (or the cancelling one); may come
  // before the submission returns: the gateway registered the rid first.
  TensorDone done = [weak, rid](Result<TensorResult> result) {
    auto c = weak.lock();
    if (!c) return;
    c->channel->send(encode_frame(infer_done(rid, std::move(result))));
    std::lock_guard lk(c->mu);
    c->requests.erase(rid);
  };
  Result<TensorSubmission> sub = service_.submit_tensor(std::move(m.request), std::move(done));
  if (!sub.ok()) {
    reject(*conn, rid, std::move(sub).error());
    return;
  }
  Accepted a{sub->model, 0, sub->queue_position, sub->cost_bytes, {}, {}};
  if (accept(*conn, rid, std::move(a), [&](Conn::Entry& e) { e.tensor = sub->handle; })) sub->handle->cancel();
}

void EngineServer::on_cancel(Conn& conn, std::uint64_t rid) {
  std::shared_ptr<RequestHandle> h;
  std::shared_ptr<TensorHandle> t;
  {
    std::lock_guard lk(conn.mu);
    auto it = conn.requests.find(rid);
    if (it == conn.requests.end()) return;  // already ended
    if (!it->second.handle && !it->second.tensor) {
      it->second.cancel_pending = true;
      return;
    }
    h = it->second.handle;
    t = it->second.tensor;
  }
  if (h) h->cancel();
  if (t) t->cancel();
}

void EngineServer::on_withdraw(Conn& conn, std::uint64_t rid) {
  // Back to the gateway if still queued (it places it elsewhere); the
  // answer says which. A request being submitted or ended is not taken back.
  std::shared_ptr<RequestHandle> h;
  {
    std::lock_guard lk(conn.mu);
    auto it = conn.requests.find(rid);
    if (it != conn.requests.end() && !it->second.cancel_pending) h = it->second.handle;
  }
  const bool withdrawn = h && h->withdraw();
  if (withdrawn) {
    std::lock_guard lk(conn.mu);
    conn.requests.erase(rid);
  }
  conn.channel->send(encode_frame(Withdrawn{rid, withdrawn}), Send::kDirect);
}

EngineHello EngineServer::hello_reply() const {
  EngineHello h;
  h.pid = static_cast<std::int64_t>(::getpid());
  h.models = service_.models();
  for (const ModelInfo& m : h.models) {
    if (auto t = service_.tensor_model(m.id); t.ok()) h.tensor_models.push_back(std::move(t).value());
  }
  h.devices = options_.devices;
  h.model_dir = options_.model_dir;
  h.config_digest = options_.config_digest;
  h.gateways = connections();
  h.load_s = options_.load_s;
  h.started_at = options_.started_at;
  h.admission = service_.admission_state();  // its budgets and load from the start: a gateway places by them
  return h;
}

void EngineServer::on_closed(const std::shared_ptr<Conn>& conn, const std::string& reason) {
  std::vector<std::shared_ptr<RequestHandle>> cancel;
  std::vector<std::shared_ptr<TensorHandle>> cancel_tensors;
  {
    std::lock_guard lk(conn->mu);
    conn->closed = true;
    for (auto& [rid, e] : conn->requests) {
      if (e.handle) cancel.push_back(e.handle);
      if (e.tensor) cancel_tensors.push_back(e.tensor);
      e.cancel_pending = true;
    }
  }
  for (auto& h : cancel) h->cancel();
  for (auto& t : cancel_tensors) t->cancel();
  int left = 0;
  {
    std::lock_guard lk(mu_);
    left = static_cast<int>(std::count_if(conns_.begin(), conns_.end(), [&](const auto& c) { return c != conn; }));
  }
  spdlog::info("engine: gateway {} disconnected ({}); cancelled its {} requests; {} gateways connected", conn->peer,
               reason.empty() ? "closed" : reason, cancel.size() + cancel_tensors.size(), left);
  // Last: stop() waits for this, and this object may go once it returns.
  std::lock_guard lk(mu_);
  std::erase(conns_, conn);
  if (conns_.empty()) alone_since_ = Clock::now();
  conns_cv_.notify_all();
}

void EngineServer::heartbeat_loop() {
  while (!stopping_.load()) {
    {
      std::unique_lock lk(hb_mu_);
      hb_cv_.wait_for(lk, options_.heartbeat, [&] { return stopping_.load(); });
    }
    if (stopping_.load()) return;
    EngineStatus st;
    st.not_ready_reason = service_.not_ready_reason();
    st.ready = st.not_ready_reason.empty();
    st.healthy = service_.healthy(&st.health_reason);
    // The counters too, so what a gateway carries over when this process
    // dies misses at most one heartbeat's worth.
    const std::string frame =
        encode_frame(StatusReport{std::move(st), service_.admission_state(), engine_metrics(options_.metrics)});
    std::vector<std::shared_ptr<Conn>> conns;
    {
      std::lock_guard lk(mu_);
      conns = conns_;
    }
    for (auto& c : conns) c->channel->send(frame);
  }
}

}  // namespace vg::wire
