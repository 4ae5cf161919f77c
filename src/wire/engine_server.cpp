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

#include "metrics/server_metrics.hpp"
#include "wire/channel.hpp"
#include "wire/codec.hpp"
#include "wire/frame.hpp"
#include "wire/protocol.hpp"

namespace vg::wire {
namespace json = boost::json;

namespace {

/// Compares secrets in time independent of where they differ.
bool same_secret(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (std::size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

std::uint64_t rid_of(const json::object& m) {
  const json::value* v = m.if_contains("rid");
  if (v && v->is_uint64()) return v->as_uint64();
  if (v && v->is_int64() && v->as_int64() >= 0) return static_cast<std::uint64_t>(v->as_int64());
  return 0;
}

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
        (void)write_one(fd, json::object{{"t", "refused"},
                                          {"reason", "this engine serves only its own user (uid " +
                                                         std::to_string(::geteuid()) + ")"}});
        (void)read_one(fd, 1.0, 64 * 1024);
        ::close(fd);
        return;
      }
      auto hello = read_one(fd, 5.0, 64 * 1024);
      std::string why;
      if (!hello.ok()) {
        why = hello.error().message;
      } else if (message_type(*hello) != "hello") {
        why = "first message is not a hello";
      } else {
        const json::value* v = hello->if_contains("v");
        const json::value* secret = hello->if_contains("secret");
        if (!v || !v->is_int64() || v->as_int64() != kProtocolVersion) {
          why = "protocol version mismatch (this engine speaks version " + std::to_string(kProtocolVersion) + ")";
        } else if (!secret || !secret->is_string() || !same_secret(std::string(secret->as_string()), options_.secret)) {
          why = "wrong or missing secret";
        } else if (const json::value* g = hello->if_contains("gateway"); g && g->is_string()) {
          conn->peer = std::string(g->as_string());
        }
      }
      if (!why.empty()) {
        // A peer that closes before any hello is a gateway checking that an
        // engine accepts here: not worth a warning.
        if (!hello.ok() && why == "connection closed") {
          spdlog::debug("engine socket: a connection closed before its hello");
        } else {
          spdlog::warn("engine socket: closed a connection: {}", why);
        }
        (void)write_one(fd, json::object{{"t", "refused"}, {"reason", why}});
        ::close(fd);
        return;
      }
      json::array models;
      for (const ModelInfo& m : service_.models()) models.push_back(encode(m));
      json::array tensor_models;
      for (const ModelInfo& m : service_.models()) {
        if (auto t = service_.tensor_model(m.id); t.ok()) tensor_models.push_back(encode(*t));
      }
      json::array devices;
      for (const std::string& d : options_.devices) devices.emplace_back(d);
      json::object reply{{"t", "hello"},
                         {"v", kProtocolVersion},
                         {"pid", static_cast<std::int64_t>(::getpid())},
                         {"models", std::move(models)},
                         {"tensor_models", std::move(tensor_models)},
                         {"devices", std::move(devices)},
                         {"model_dir", options_.model_dir},
                         {"config_digest", options_.config_digest},
                         {"gateways", static_cast<std::int64_t>(connections())},
                         {"load_s", options_.load_s},
                         {"started_at", options_.started_at},
                         // Its budgets and load from the start: a gateway places by them.
                         {"admission", encode(service_.admission_state())}};
      if (!write_one(fd, reply).ok()) {
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

void EngineServer::serve(std::shared_ptr<Conn> conn) {
  std::weak_ptr<Conn> weak = conn;
  conn->channel->start(
      [this, weak](json::object m) {
        if (auto c = weak.lock()) handle(c, std::move(m));
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
        c->channel->send(json::object{{"t", "event"}, {"rid", rid_}, {"event", encode(event)}});
        (void)c->channel->flush(1.0);
      }
      spdlog::error("test hook --test-crash-on-prompt: request {} started; aborting the engine process", rid_);
      std::abort();
    }
    if (!c) return;
    const bool terminal = is_terminal(event);
    c->channel->send(json::object{{"t", "event"}, {"rid", rid_}, {"event", encode(event)}});
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

void EngineServer::handle(const std::shared_ptr<Conn>& conn, json::object m) {
  const std::string_view type = message_type(m);
  if (type == "submit") {
    const std::uint64_t rid = rid_of(m);
    const json::value* rv = m.if_contains("request");
    Result<CompletionRequest> req = rv ? decode_completion_request(*rv)
                                       : Result<CompletionRequest>(Error(ErrorCode::kInvalidRequest, "no request"));
    if (rid == 0 || !req.ok()) {
      const std::string why = rid == 0 ? "submit without a request number" : "bad submit: " + req.error().message;
      spdlog::warn("engine: closing the connection of gateway {}: {}", conn->peer, why);
      conn->channel->close(why);
      return;
    }
    if (const json::value* res = m.if_contains("resume"); res && !res->is_null()) {
      auto resume = decode_resume(*res);
      if (!resume.ok()) {
        conn->channel->close("bad resume: " + resume.error().message);
        return;
      }
      req->resume_tokens = std::move(resume->tokens);
      req->resume_prompt_sent = resume->prompt_sent;
    }
    if (const json::value* a = m.if_contains("admitted_before"); a && a->is_bool()) req->admitted_before = a->as_bool();
    const bool poison = !options_.crash_on_prompt.empty() &&
                        (contains_text(*req, options_.crash_on_prompt) ||
                         (options_.prompt_text && options_.prompt_text(*req).find(options_.crash_on_prompt) !=
                                                      std::string::npos));
    {
      std::lock_guard lk(conn->mu);
      if (conn->closed) return;
      if (!conn->requests.emplace(rid, Conn::Entry{nullptr, false, poison, nullptr, false}).second) {
        conn->channel->close("request number " + std::to_string(rid) + " is in use");
        return;
      }
    }
    auto sink = std::make_shared<EventsToConn>(conn, rid, poison);
    // Events the engine pushes during submit are queued on the channel
    // before the answer; the gateway registered the rid before sending.
    Result<Submission> sub = service_.submit(*req, sink);
    if (!sub.ok()) {
      {
        std::lock_guard lk(conn->mu);
        conn->requests.erase(rid);
      }
      conn->channel->send(json::object{{"t", "rejected"}, {"rid", rid}, {"error", encode(sub.error())}}, Send::kDirect);
      return;
    }
    Accepted a{sub->model, sub->prompt_tokens, sub->queue_position, sub->cost_bytes, sub->echo_text,
               sub->retry_claimed_by};
    conn->channel->send(json::object{{"t", "accepted"}, {"rid", rid}, {"submission", encode(a)}}, Send::kDirect);
    bool cancel = false;
    {
      std::lock_guard lk(conn->mu);
      auto it = conn->requests.find(rid);
      if (it != conn->requests.end()) {
        it->second.handle = sub->handle;
        cancel = it->second.cancel_pending || conn->closed;
      }
    }
    if (cancel) sub->handle->cancel();
    return;
  }
  if (type == "infer") {
    handle_infer(conn, m);
    return;
  }
  if (type == "cancel") {
    const std::uint64_t rid = rid_of(m);
    std::shared_ptr<RequestHandle> h;
    std::shared_ptr<TensorHandle> t;
    {
      std::lock_guard lk(conn->mu);
      auto it = conn->requests.find(rid);
      if (it == conn->requests.end()) return;  // already ended
      if (!it->second.handle && !it->second.tensor) {
        it->second.cancel_pending = true;
        return;
      }
      h = it->second.handle;
      t = it->second.tensor;
    }
    if (h) h->cancel();
    if (t) t->cancel();
    return;
  }
  if (type == "withdraw") {
    // Back to the gateway if still queued (it places it elsewhere); the
    // answer says which. A request being submitted or ended is not taken back.
    const std::uint64_t rid = rid_of(m);
    std::shared_ptr<RequestHandle> h;
    {
      std::lock_guard lk(conn->mu);
      auto it = conn->requests.find(rid);
      if (it != conn->requests.end() && !it->second.cancel_pending) h = it->second.handle;
    }
    const bool withdrawn = h && h->withdraw();
    if (withdrawn) {
      std::lock_guard lk(conn->mu);
      conn->requests.erase(rid);
    }
    conn->channel->send(json::object{{"t", "withdrawn"}, {"rid", rid}, {"ok", withdrawn}}, Send::kDirect);
    return;
  }
  if (type == "state") {
    json::object reply = metrics_fields();
    reply["t"] = "state";
    reply["qid"] = m.contains("qid") ? m.at("qid") : json::value(0);
    reply["admission"] = encode(service_.admission_state());
    conn->channel->send(reply, Send::kDirect);
    return;
  }
  if (type == "release") {
    released_.store(true);
    spdlog::info("engine: released by gateway {}: it exits once no gateway is connected", conn->peer);
    return;
  }
  const std::string why = "unknown message type \"" + std::string(type) + "\"";
  spdlog::warn("engine: closing the connection of gateway {}: {}", conn->peer, why);
  conn->channel->close(why);
}

void EngineServer::handle_infer(const std::shared_ptr<Conn>& conn, const json::object& m) {
  const std::uint64_t rid = rid_of(m);
  const json::value* rv = m.if_contains("request");
  Result<TensorInferRequest> req = rv ? decode_tensor_request(*rv)
                                      : Result<TensorInferRequest>(Error(ErrorCode::kInvalidRequest, "no request"));
  if (rid == 0 || !req.ok()) {
    const std::string why = rid == 0 ? "infer without a request number" : "bad infer: " + req.error().message;
    spdlog::warn("engine: closing the connection of gateway {}: {}", conn->peer, why);
    conn->channel->close(why);
    return;
  }
  {
    std::lock_guard lk(conn->mu);
    if (conn->closed) return;
    Conn::Entry entry;
    entry.is_tensor = true;
    if (!conn->requests.emplace(rid, std::move(entry)).second) {
      conn->channel->close("request number " + std::to_string(rid) + " is in use");
      return;
    }
  }
  std::weak_ptr<Conn> weak = conn;
  // Called once, on an engine thread (or the cancelling one); may come
  // before the submission returns: the gateway registered the rid first.
  TensorDone done = [weak, rid](Result<TensorResult> result) {
    auto c = weak.lock();
    if (!c) return;
    json::object msg{{"t", "infer_done"}, {"rid", rid}};
    if (result.ok()) {
      const std::size_t bytes = encoded_tensors_bound(result->outputs);
      if (bytes + 4096 <= kMaxFrameBytes) {
        msg["result"] = encode(*result);
      } else {
        msg["error"] = encode(Error(ErrorCode::kBodyTooLarge,
                                    "the outputs take " + std::to_string(bytes) + " bytes on the engine wire, more than "
                                    "one message carries (" + std::to_string(kMaxFrameBytes) +
                                    " bytes, about 48 MiB of float32 values): ask for fewer outputs or a smaller batch, "
                                    "or serve the model --in-process"));
      }
    } else {
      msg["error"] = encode(result.error());
    }
    c->channel->send(msg);
    std::lock_guard lk(c->mu);
    c->requests.erase(rid);
  };
  Result<TensorSubmission> sub = service_.submit_tensor(std::move(req).value(), std::move(done));
  if (!sub.ok()) {
    {
      std::lock_guard lk(conn->mu);
      conn->requests.erase(rid);
    }
    conn->channel->send(json::object{{"t", "rejected"}, {"rid", rid}, {"error", encode(sub.error())}}, Send::kDirect);
    return;
  }
  Accepted a{sub->model, 0, sub->queue_position, sub->cost_bytes, {}, {}};
  conn->channel->send(json::object{{"t", "accepted"}, {"rid", rid}, {"submission", encode(a)}}, Send::kDirect);
  bool cancel = false;
  {
    std::lock_guard lk(conn->mu);
    auto it = conn->requests.find(rid);
    if (it != conn->requests.end()) {
      it->second.tensor = sub->handle;
      cancel = it->second.cancel_pending || conn->closed;
    }
  }
  if (cancel) sub->handle->cancel();
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

json::object EngineServer::metrics_fields() const {
  json::object o;
  json::array hs;
  if (metrics::ServerMetrics* m = options_.metrics) {
    const std::pair<const char*, const metrics::Histogram*> histograms[] = {
        {"queue_wait_seconds", &m->queue_wait_seconds},
        {"time_to_first_token_seconds", &m->time_to_first_token_seconds},
        {"inter_token_latency_seconds", &m->inter_token_latency_seconds},
        {"request_duration_seconds", &m->request_duration_seconds},
        {"batch_size", &m->batch_size},
        {"retry_promise_error_seconds", &m->retry_promise_error_seconds},
    };
    for (const auto& [name, h] : histograms) {
      const metrics::Histogram::Snapshot s = h->snapshot();
      HistogramSample sample{name, {}, s.bounds, {}, s.sum};
      std::uint64_t prev = 0;
      for (std::uint64_t c : s.cumulative) {
        sample.buckets.push_back(c - prev);
        prev = c;
      }
      hs.push_back(encode(sample));
    }
    o["generated_tokens"] = m->generated_tokens_total.value();
    // The labelled families of tensor requests, one sample per series.
    const std::pair<const char*, const metrics::HistogramFamily*> families[] = {
        {"tensor_queue_wait_seconds", &m->tensor_queue_wait_seconds},
        {"tensor_request_duration_seconds", &m->tensor_request_duration_seconds},
        {"tensor_batch_size", &m->tensor_batch_size},
    };
    for (const auto& entry : families) {
      const char* name = entry.first;
      entry.second->for_each([&](const std::vector<std::string>& labels, const metrics::Histogram& h) {
        const metrics::Histogram::Snapshot s = h.snapshot();
        HistogramSample sample{name, labels, s.bounds, {}, s.sum};
        std::uint64_t prev = 0;
        for (std::uint64_t c : s.cumulative) {
          sample.buckets.push_back(c - prev);
          prev = c;
        }
        hs.push_back(encode(sample));
      });
    }
    json::array counters;
    m->tensor_requests_total.for_each([&](const std::vector<std::string>& labels, const metrics::Counter& c) {
      counters.push_back(json::object{{"name", "tensor_requests_total"}, {"labels", json::array(labels.begin(), labels.end())},
                                      {"value", c.value()}});
    });
    o["counters"] = std::move(counters);
  }
  o["histograms"] = std::move(hs);
  return o;
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
    json::object msg = metrics_fields();
    msg["t"] = "status";
    msg["status"] = encode(st);
    // The counters too, so what a gateway carries over when this process
    // dies misses at most one heartbeat's worth.
    msg["admission"] = encode(service_.admission_state());
    std::vector<std::shared_ptr<Conn>> conns;
    {
      std::lock_guard lk(mu_);
      conns = conns_;
    }
    for (auto& c : conns) c->channel->send(msg);
  }
}

}  // namespace vg::wire
