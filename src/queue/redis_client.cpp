// RedisClient: hiredis 0.14's async context on an Asio strand (see
// redis_client.hpp for the contract).
//
// The adapter. hiredis asks for readiness through five hooks (addRead,
// delRead, addWrite, delWrite, cleanup). Each connection (Conn) wraps the
// context's socket in a non-owning stream_descriptor: hiredis owns the fd
// and closes it in redisFree(), so the cleanup hook release()s the
// descriptor first. A hook only records the wish and arms at most one
// async_wait per direction; the wait's handler calls redisAsyncHandleRead
// or ...Write, which may free the context (EOF, error): every handler holds
// the Conn and checks that its context is still there.
//
// Deadlines. hiredis 0.14 cannot drop a single pending reply (replies come
// in order), so a command past its deadline fails with kTimeout, and the
// connection is freed: hiredis then calls every other pending callback with
// a NULL reply, which fails each with kOverloaded. Each pending command is
// in `pending` under an id (hiredis's privdata); whoever takes it out of the
// map (the reply, the timer, or close) calls its callback, so each callback
// runs exactly once.
#include "queue/redis_client.hpp"

#include <hiredis/async.h>
#include <hiredis/hiredis.h>

#include <algorithm>
#include <boost/asio/post.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <cctype>
#include <condition_variable>
#include <future>
#include <mutex>
#include <optional>
#include <unordered_map>

namespace vg::queue {
namespace asio = boost::asio;

namespace {

using Strand = asio::strand<asio::io_context::executor_type>;

// The command's name for messages (never its arguments: AUTH carries a password).
std::string command_name(const std::string& first) {
  std::string name = first.substr(0, 32);
  for (char& c : name) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return name;
}

RedisValue convert(const redisReply* r) {
  switch (r->type) {
    case REDIS_REPLY_STRING: return RedisValue::string(std::string(r->str, r->len));
    case REDIS_REPLY_INTEGER: return RedisValue::integer(r->integer);
    case REDIS_REPLY_NIL: return RedisValue::nil();
    case REDIS_REPLY_STATUS: return RedisValue::status(std::string(r->str, r->len));
    case REDIS_REPLY_ERROR: return RedisValue::error(std::string(r->str, r->len));
    case REDIS_REPLY_ARRAY: {
      RedisValue::Array elements;
      elements.reserve(r->elements);
      for (std::size_t i = 0; i < r->elements; ++i) elements.push_back(convert(r->element[i]));
      return RedisValue::array(std::move(elements));
    }
    default: return RedisValue::error("unknown reply type " + std::to_string(r->type));
  }
}

void* id_to_privdata(std::uint64_t id) { return reinterpret_cast<void*>(static_cast<std::uintptr_t>(id)); }
std::uint64_t privdata_to_id(void* p) { return static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(p)); }

}  // namespace

struct RedisClient::Impl : std::enable_shared_from_this<RedisClient::Impl> {
  // One connection: its context and the adapter state. Strand only.
  struct Conn : std::enable_shared_from_this<Conn> {
    Conn(Impl* owner, const Strand& strand, std::uint64_t gen) : impl(owner), sd(strand), generation(gen) {}
    ~Conn() {
      if (sd.is_open()) sd.release();  // never close hiredis's fd
    }

    Impl* impl;
    redisAsyncContext* ac = nullptr;  // null once hiredis freed it
    asio::posix::stream_descriptor sd;
    const std::uint64_t generation;
    bool want_read = false, want_write = false;  // what hiredis asked for
    bool read_armed = false, write_armed = false;  // an async_wait is outstanding
    bool ready = false;                // the handshake's PING was answered
    std::string drop_reason;           // why we freed it (empty: hiredis did, on EOF or error)
    std::optional<Error> refusal;      // the server refused the handshake (kConfig)
  };

  struct Pending {
    Callback done;
    bool internal = false;  // a handshake step: `done` runs inside the hiredis callback
    std::unique_ptr<asio::steady_timer> timer;
    std::string name;
    Duration timeout{};
  };

  Impl(asio::io_context& context, Options o)
      : io(context),
        strand(asio::make_strand(context)),
        options(std::move(o)),
        endpoint(options.url.redacted()),
        state(std::make_shared<std::atomic<State>>(State::kConnecting)),
        connect_timer(strand),
        reconnect_timer(strand),
        backoff(options.reconnect_min) {}

  asio::io_context& io;
  Strand strand;
  const Options options;
  const std::string endpoint;
  const std::shared_ptr<std::atomic<State>> state;

  // Strand only.
  std::shared_ptr<Conn> conn;
  std::uint64_t next_id = 1;
  std::uint64_t generation = 0;
  std::unordered_map<std::uint64_t, Pending> pending;
  asio::steady_timer connect_timer;
  asio::steady_timer reconnect_timer;
  Duration backoff;
  bool closed = false;

  // Any thread, under mu.
  mutable std::mutex mu;
  std::condition_variable cv;
  Error last_error{ErrorCode::kOverloaded, "not connected yet"};
  bool refused = false;  // the last attempt was refused (kConfig): waiting will not help
  Stats stats;

  void set_state(State s) {
    {
      std::lock_guard<std::mutex> lock(mu);
      state->store(s);
    }
    cv.notify_all();
  }

  // Runs `done(result)` later on the strand, or now while closing (the
  // io_context may never run again).
  void deliver(Callback done, Result<RedisValue> result) {
    if (closed) {
      done(std::move(result));
      return;
    }
    asio::post(strand, [done = std::move(done), result = std::move(result)]() mutable { done(std::move(result)); });
  }

  // --- the five hooks (called by hiredis, on the strand) ---
  static void ev_add_read(void* p) {
    auto* c = static_cast<Conn*>(p);
    c->want_read = true;
    c->impl->arm_read(*c);
  }
  static void ev_del_read(void* p) { static_cast<Conn*>(p)->want_read = false; }
  static void ev_add_write(void* p) {
    auto* c = static_cast<Conn*>(p);
    c->want_write = true;
    c->impl->arm_write(*c);
  }
  static void ev_del_write(void* p) { static_cast<Conn*>(p)->want_write = false; }
  static void ev_cleanup(void* p) {
    auto* c = static_cast<Conn*>(p);
    c->impl->on_context_gone(*c);
  }

  void arm_read(Conn& c) {
    if (c.read_armed || c.ac == nullptr) return;
    c.read_armed = true;
    c.sd.async_wait(asio::posix::descriptor_base::wait_read,
                    [self = shared_from_this(), keep = c.shared_from_this()](const boost::system::error_code& ec) {
                      keep->read_armed = false;
                      if (ec || keep->ac == nullptr || !keep->want_read) return;
                      redisAsyncHandleRead(keep->ac);  // may free the context
                      if (keep->ac != nullptr && keep->want_read) self->arm_read(*keep);
                    });
  }

  void arm_write(Conn& c) {
    if (c.write_armed || c.ac == nullptr) return;
    c.write_armed = true;
    c.sd.async_wait(asio::posix::descriptor_base::wait_write,
                    [self = shared_from_this(), keep = c.shared_from_this()](const boost::system::error_code& ec) {
                      keep->write_armed = false;
                      if (ec || keep->ac == nullptr || !keep->want_write) return;
                      redisAsyncHandleWrite(keep->ac);  // may free the context
                      if (keep->ac != nullptr && keep->want_write) self->arm_write(*keep);
                    });
  }

  // --- replies ---
  static void on_reply(redisAsyncContext* ac, void* reply, void* privdata) {
    auto* c = static_cast<Conn*>(ac->data);
    c->impl->handle_reply(*c, static_cast<const redisReply*>(reply), privdata_to_id(privdata));
  }

  Error connection_error(const Conn& c, const std::string& name) const {
    if (closed) return Error(ErrorCode::kCancelled, "redis client closed with " + name + " pending");
    std::string why = c.drop_reason;
    if (why.empty() && c.ac != nullptr && c.ac->errstr != nullptr && c.ac->errstr[0] != '\0') why = c.ac->errstr;
    if (why.empty()) why = "connection closed";
    return Error(ErrorCode::kOverloaded, "redis at " + endpoint + ": connection lost with " + name + " pending (" +
                                             why + ")");
  }

  void handle_reply(Conn& c, const redisReply* reply, std::uint64_t id) {
    auto it = pending.find(id);
    if (it == pending.end()) return;  // already failed by its timer or by close
    Pending p = std::move(it->second);
    pending.erase(it);
    if (p.timer) p.timer->cancel();
    Result<RedisValue> result = reply != nullptr ? Result<RedisValue>(convert(reply))
                                                 : Result<RedisValue>(connection_error(c, p.name));
    if (p.internal) {
      p.done(std::move(result));
    } else {
      deliver(std::move(p.done), std::move(result));
    }
  }

  // Queues `args` on the connection. False when hiredis refused (disconnecting).
  bool send(Conn& c, const Args& args, std::uint64_t id) {
    std::vector<const char*> argv;
    std::vector<std::size_t> lens;
    argv.reserve(args.size());
    lens.reserve(args.size());
    for (const auto& a : args) {
      argv.push_back(a.data());
      lens.push_back(a.size());
    }
    return redisAsyncCommandArgv(c.ac, &Impl::on_reply, id_to_privdata(id), static_cast<int>(args.size()),
                                 argv.data(), lens.data()) == REDIS_OK;
  }

  void start_command(Args args, TimePoint deadline, Duration timeout, Callback done) {
    if (closed) {
      deliver(std::move(done), Error(ErrorCode::kCancelled, "redis client closed"));
      return;
    }
    if (args.empty()) {
      deliver(std::move(done), Error(ErrorCode::kInvalidRequest, "empty redis command"));
      return;
    }
    std::string name = command_name(args.front());
    if (!conn || !conn->ready) {
      deliver(std::move(done), Error(ErrorCode::kOverloaded,
                                     "redis at " + endpoint + " not connected (" + last_error_message() + ")"));
      return;
    }
    if (Clock::now() >= deadline) {
      deliver(std::move(done), Error(ErrorCode::kTimeout, "redis command " + name + ": deadline passed before it was sent"));
      return;
    }
    std::uint64_t id = next_id++;
    if (!send(*conn, args, id)) {
      deliver(std::move(done), Error(ErrorCode::kOverloaded, "redis at " + endpoint + ": cannot send " + name));
      return;
    }
    Pending p;
    p.done = std::move(done);
    p.name = std::move(name);
    p.timeout = timeout;
    p.timer = std::make_unique<asio::steady_timer>(strand);
    p.timer->expires_at(deadline);
    p.timer->async_wait([self = shared_from_this(), id](const boost::system::error_code& ec) {
      if (!ec) self->on_command_timeout(id);
    });
    pending.emplace(id, std::move(p));
  }

  void on_command_timeout(std::uint64_t id) {
    auto it = pending.find(id);
    if (it == pending.end()) return;
    Pending p = std::move(it->second);
    pending.erase(it);
    {
      std::lock_guard<std::mutex> lock(mu);
      ++stats.timeouts;
    }
    std::string what = "redis command " + p.name + " had no reply from " + endpoint + " within " +
                       std::to_string(whole_ms(p.timeout)) + " ms";
    deliver(std::move(p.done), Error(ErrorCode::kTimeout, what + "; the connection is reset"));
    if (conn) drop_connection(conn, "command " + p.name + " timed out after " + std::to_string(whole_ms(p.timeout)) + " ms");
  }

  // Frees the connection's context (its pending callbacks and the cleanup
  // hook run from inside, or right after the hiredis callback we are in).
  void drop_connection(std::shared_ptr<Conn> c, const std::string& reason) {
    if (c->ac == nullptr) return;
    if (c->drop_reason.empty()) c->drop_reason = reason;
    redisAsyncFree(c->ac);
  }

  // --- connecting ---
  void start_connect() {
    if (closed) return;
    set_state(State::kConnecting);
    std::uint64_t gen = ++generation;
    redisAsyncContext* ac = redisAsyncConnect(options.url.host.c_str(), options.url.port);
    if (ac == nullptr) {
      attempt_failed(Error(ErrorCode::kOverloaded, "cannot allocate a redis context"));
      return;
    }
    if (ac->err != 0) {
      std::string why = ac->errstr != nullptr ? ac->errstr : "unknown error";
      redisAsyncFree(ac);  // no hooks yet: nothing of ours runs
      attempt_failed(Error(ErrorCode::kOverloaded, "cannot connect to " + endpoint + ": " + why));
      return;
    }
    auto c = std::make_shared<Conn>(this, strand, gen);
    boost::system::error_code ec;
    c->sd.assign(ac->c.fd, ec);
    if (ec) {
      redisAsyncFree(ac);
      attempt_failed(Error(ErrorCode::kOverloaded, "cannot watch the socket to " + endpoint + ": " + ec.message()));
      return;
    }
    c->ac = ac;
    ac->data = c.get();
    ac->ev.data = c.get();
    ac->ev.addRead = &Impl::ev_add_read;
    ac->ev.delRead = &Impl::ev_del_read;
    ac->ev.addWrite = &Impl::ev_add_write;
    ac->ev.delWrite = &Impl::ev_del_write;
    ac->ev.cleanup = &Impl::ev_cleanup;
    conn = c;

    connect_timer.expires_after(options.connect_timeout);
    connect_timer.async_wait([self = shared_from_this(), gen](const boost::system::error_code& e) {
      if (!e) self->on_connect_timeout(gen);
    });
    send_handshake(c);
  }

  // AUTH, SELECT and PING, pipelined; ready when the PING is answered.
  void send_handshake(const std::shared_ptr<Conn>& c) {
    const RedisUrl& url = options.url;
    if (!url.password.empty()) {
      Args auth = url.user.empty() ? Args{"AUTH", url.password} : Args{"AUTH", url.user, url.password};
      std::string who = url.user.empty() ? "the default user" : "user '" + url.user + "'";
      send_internal(*c, auth, "AUTH", [this, c, who](Result<RedisValue> r) {
        if (r && r->is_error()) refuse(c, "redis at " + endpoint + " refused the credentials of " + who + ": " + *r->as_error());
      });
    }
    if (url.db != 0) {
      send_internal(*c, {"SELECT", std::to_string(url.db)}, "SELECT", [this, c, db = url.db](Result<RedisValue> r) {
        if (r && r->is_error()) refuse(c, "redis at " + endpoint + ": SELECT " + std::to_string(db) + " failed: " + *r->as_error());
      });
    }
    send_internal(*c, {"PING"}, "PING", [this, c](Result<RedisValue> r) {
      if (!r || c->ac == nullptr || c->refusal) return;  // lost or refused: the cleanup hook says why
      if (r->is_error()) {
        const std::string& text = *r->as_error();
        if (text.rfind("NOAUTH", 0) == 0 || text.rfind("WRONGPASS", 0) == 0) {
          refuse(c, "redis at " + endpoint + " needs a password (redis://USER:PASSWORD@..., or a password file): " + text);
        } else {
          drop_connection(c, "PING answered " + text);  // e.g. LOADING: retried with backoff
        }
        return;
      }
      on_ready(*c);
    });
  }

  void send_internal(Conn& c, const Args& args, const std::string& name, Callback done) {
    std::uint64_t id = next_id++;
    if (!send(c, args, id)) return;  // the context is going away; the cleanup hook reports it
    Pending p;
    p.done = std::move(done);
    p.internal = true;
    p.name = name;
    pending.emplace(id, std::move(p));
  }

  void refuse(const std::shared_ptr<Conn>& c, std::string message) {
    if (c->refusal) return;
    c->refusal = Error(ErrorCode::kConfig, std::move(message));
    drop_connection(c, c->refusal->message);
  }

  void on_ready(Conn& c) {
    c.ready = true;
    connect_timer.cancel();
    backoff = options.reconnect_min;
    {
      std::lock_guard<std::mutex> lock(mu);
      ++stats.connects;
      refused = false;
      last_error = Error(ErrorCode::kOverloaded, "");
      state->store(State::kReady);
    }
    cv.notify_all();
  }

  void on_connect_timeout(std::uint64_t gen) {
    if (!conn || conn->generation != gen || conn->ready) return;
    drop_connection(conn, "no connection and PING answer within " + std::to_string(whole_ms(options.connect_timeout)) +
                              " ms");
  }

  void attempt_failed(Error error) {
    {
      std::lock_guard<std::mutex> lock(mu);
      ++stats.failed_attempts;
      refused = error.code == ErrorCode::kConfig;
      last_error = std::move(error);
    }
    cv.notify_all();
    schedule_reconnect();
  }

  void schedule_reconnect() {
    if (closed) return;
    set_state(State::kDisconnected);
    Duration delay = backoff;
    backoff = std::min(backoff * 2, options.reconnect_max);
    reconnect_timer.expires_after(delay);
    reconnect_timer.async_wait([self = shared_from_this()](const boost::system::error_code& ec) {
      if (!ec && !self->closed) self->start_connect();
    });
  }

  // The cleanup hook: hiredis is freeing `c`'s context (pending callbacks
  // have run; the fd is closed right after we return).
  void on_context_gone(Conn& c) {
    auto keep = c.shared_from_this();
    std::string why = c.drop_reason;
    if (why.empty() && c.ac != nullptr && c.ac->errstr != nullptr && c.ac->errstr[0] != '\0') why = c.ac->errstr;
    if (why.empty()) why = "connection closed";
    c.want_read = c.want_write = false;
    if (c.sd.is_open()) c.sd.release();  // cancels our waits; hiredis closes the fd
    c.ac = nullptr;
    if (conn.get() == &c) conn.reset();
    connect_timer.cancel();
    if (closed) {
      set_state(State::kClosed);
      return;
    }
    if (c.ready) {
      {
        std::lock_guard<std::mutex> lock(mu);
        ++stats.disconnects;
        refused = false;
        last_error = Error(ErrorCode::kOverloaded, "connection to " + endpoint + " lost: " + why);
      }
      schedule_reconnect();
      return;
    }
    attempt_failed(c.refusal ? *c.refusal : Error(ErrorCode::kOverloaded, "cannot connect to " + endpoint + ": " + why));
  }

  std::string last_error_message() const {
    std::lock_guard<std::mutex> lock(mu);
    return last_error.message.empty() ? "connecting" : last_error.message;
  }

  void shutdown() {
    if (closed) return;
    closed = true;
    connect_timer.cancel();
    reconnect_timer.cancel();
    if (conn) drop_connection(conn, "client closed");  // pending commands fail with kCancelled
    auto left = std::move(pending);
    pending.clear();
    for (auto& [id, p] : left) {
      if (p.timer) p.timer->cancel();
      if (!p.internal) p.done(Error(ErrorCode::kCancelled, "redis client closed with " + p.name + " pending"));
    }
    set_state(State::kClosed);
  }
};

const char* state_name(RedisClient::State state) {
  switch (state) {
    case RedisClient::State::kConnecting: return "connecting";
    case RedisClient::State::kReady: return "ready";
    case RedisClient::State::kDisconnected: return "disconnected";
    case RedisClient::State::kClosed: return "closed";
  }
  return "unknown";
}

Result<std::unique_ptr<RedisClient>> RedisClient::create(asio::io_context& io, Options options) {
  if (options.url.host.empty()) return Error(ErrorCode::kConfig, "redis client: empty host");
  if (!options.url.user.empty() && options.url.password.empty()) {
    return Error(ErrorCode::kConfig, "redis user '" + options.url.user +
                                         "' has no password (give it in the URL, a password file or a variable)");
  }
  if (options.connect_timeout <= Duration::zero() || options.command_timeout <= Duration::zero() ||
      options.reconnect_min <= Duration::zero()) {
    return Error(ErrorCode::kConfig, "redis client: timeouts and reconnect_min must be positive");
  }
  if (options.reconnect_min > options.reconnect_max) {
    return Error(ErrorCode::kConfig, "redis client: reconnect_min is above reconnect_max");
  }
  auto impl = std::make_shared<Impl>(io, std::move(options));
  asio::post(impl->strand, [impl] { impl->start_connect(); });
  return std::unique_ptr<RedisClient>(new RedisClient(impl));
}

RedisClient::RedisClient(std::shared_ptr<Impl> impl)
    : impl_(std::move(impl)), state_(impl_->state), endpoint_(impl_->endpoint) {}

RedisClient::~RedisClient() { close(); }

void RedisClient::close() {
  auto impl = impl_;
  if (impl->strand.running_in_this_thread() || impl->io.stopped()) {
    impl->shutdown();
    return;
  }
  auto done = std::make_shared<std::promise<void>>();
  auto finished = done->get_future();
  asio::post(impl->strand, [impl, done] {
    impl->shutdown();
    done->set_value();
  });
  if (impl->io.get_executor().running_in_this_thread()) return;  // on another handler: do not wait for ourselves
  // Bounded, in case no thread runs the io_context any more; the shutdown
  // then runs whenever it does (the handler holds the Impl).
  (void)finished.wait_for(std::chrono::seconds(10));
}

void RedisClient::command(Args args, Callback done) {
  Duration timeout = impl_->options.command_timeout;
  command(std::move(args), timeout, std::move(done));
}

void RedisClient::command(Args args, Duration timeout, Callback done) {
  TimePoint deadline = Clock::now() + timeout;
  asio::post(impl_->strand, [impl = impl_, args = std::move(args), deadline, timeout, done = std::move(done)]() mutable {
    impl->start_command(std::move(args), deadline, timeout, std::move(done));
  });
}

Result<RedisValue> RedisClient::command_sync(Args args, Duration timeout) {
  if (impl_->io.get_executor().running_in_this_thread()) {
    return Error(ErrorCode::kInternal, "RedisClient::command_sync called on an io_context thread (it would wait for itself)");
  }
  auto promise = std::make_shared<std::promise<Result<RedisValue>>>();
  auto reply = promise->get_future();
  command(std::move(args), timeout, [promise](Result<RedisValue> r) { promise->set_value(std::move(r)); });
  // The command's own deadline ends it; the margin covers an io_context that is not running.
  if (reply.wait_for(timeout + std::chrono::seconds(5)) != std::future_status::ready) {
    return Error(ErrorCode::kTimeout, "redis command not run: is the io_context running?");
  }
  return reply.get();
}

Status RedisClient::wait_connected(Duration timeout) {
  if (impl_->io.get_executor().running_in_this_thread()) {
    return Error(ErrorCode::kInternal, "RedisClient::wait_connected called on an io_context thread");
  }
  std::unique_lock<std::mutex> lock(impl_->mu);
  impl_->cv.wait_for(lock, timeout, [&] {
    State s = state_->load();
    return s == State::kReady || s == State::kClosed || impl_->refused;
  });
  State s = state_->load();
  if (s == State::kReady) return Status::Ok();
  if (s == State::kClosed) return Error(ErrorCode::kCancelled, "redis client closed");
  if (impl_->refused) return impl_->last_error;
  return Error(ErrorCode::kOverloaded, "redis at " + endpoint_ + " not connected within " +
                                           std::to_string(whole_ms(timeout)) + " ms: " + impl_->last_error.message);
}

Error RedisClient::last_error() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->last_error;
}

RedisClient::Stats RedisClient::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->stats;
}

}  // namespace vg::queue
