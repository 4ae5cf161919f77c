// RedisRateLimits (see redis_rate_limits.hpp): token buckets shared by every
// gateway on one Redis, and the health PING behind /ready.
#include "queue/redis_rate_limits.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <future>

#include <boost/asio/post.hpp>

#include "traffic/digest.hpp"

namespace vg::queue {

std::string RedisRateLimits::bucket_name(std::string_view client) { return traffic::hex(traffic::sha256(client), 16); }

Result<std::unique_ptr<RedisRateLimits>> RedisRateLimits::create(Options options) {
  if (options.command_timeout <= Duration::zero() || options.health_interval <= Duration::zero()) {
    return Error(ErrorCode::kConfig, "redis rate limits: timeouts must be positive");
  }
  std::unique_ptr<RedisRateLimits> self(new RedisRateLimits(std::move(options)));
  RedisClient::Options co;
  co.url = self->options_.url;
  co.connect_timeout = self->options_.connect_timeout;
  co.command_timeout = self->options_.command_timeout;
  co.reconnect_min = std::chrono::milliseconds(50);
  co.reconnect_max = std::max<Duration>(co.reconnect_min, std::chrono::seconds(1));
  auto client = RedisClient::create(self->io_, std::move(co));
  if (!client.ok()) return std::move(client).error();
  self->client_ = std::move(client).value();
  StreamQueue::Options qo;
  qo.prefix = self->options_.prefix;
  qo.timeout = self->options_.command_timeout;
  self->queue_ = std::make_unique<StreamQueue>(*self->client_, qo);
  self->thread_ = std::thread([io = &self->io_] { io->run(); });
  boost::asio::post(self->io_, [s = self.get()] { s->schedule_ping(); });
  return self;
}

RedisRateLimits::RedisRateLimits(Options options)
    : options_(std::move(options)), work_(boost::asio::make_work_guard(io_)), ping_timer_(io_) {}

RedisRateLimits::~RedisRateLimits() {
  stopping_ = true;
  if (client_) client_->close();  // pending takes and PINGs fail with kCancelled now
  // Handlers still queued (the PING timer) are dropped unrun: they only
  // refer to members, which outlive io_'s thread.
  work_.reset();
  io_.stop();
  if (thread_.joinable()) thread_.join();
  client_.reset();  // before io_ (its strand and sockets live there)
}

Status RedisRateLimits::wait_connected(Duration timeout) { return client_->wait_connected(timeout); }

void RedisRateLimits::schedule_ping() {
  if (stopping_) return;
  ping_timer_.expires_after(options_.health_interval);
  ping_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (!ec) ping();
  });
}

void RedisRateLimits::ping() {
  if (stopping_) return;
  // Not connected: RedisClient is already reconnecting; the PING then fails
  // at once and the state says why.
  client_->command({"PING"}, options_.command_timeout, [this](Result<RedisValue> r) {
    if (stopping_) return;
    const bool ok = r.ok() && !r->is_error();
    note(ok, ok ? std::string() : (r.ok() ? *r->as_error() : r.error().message));
    // Back on io_ (the callback runs on the client's strand, the timer is io_'s).
    boost::asio::post(io_, [this] { schedule_ping(); });
  });
}

void RedisRateLimits::note(bool reachable, const std::string& why) {
  std::lock_guard lock(log_mu_);
  if (!reachable && !logged_unreachable_) {
    logged_unreachable_ = true;
    spdlog::warn("Redis at {} is unreachable ({}): requests that need the shared rate limits get 503 until it is "
                 "back",
                 client_->endpoint(), why);
  } else if (reachable && logged_unreachable_) {
    logged_unreachable_ = false;
    spdlog::info("Redis at {} answers again", client_->endpoint());
  }
}

Result<traffic::RateDecision> RedisRateLimits::take(std::string_view client, const traffic::RateLimit& limit) {
  auto promise = std::make_shared<std::promise<Result<StreamQueue::RateDecision>>>();
  auto answer = promise->get_future();
  queue_->take_tokens(bucket_name(client), limit.rate, limit.burst, 1,
                      [promise](Result<StreamQueue::RateDecision> r) { promise->set_value(std::move(r)); });
  // take_tokens always answers by its own deadline; the margin only covers
  // a client thread that no longer runs (shutdown).
  if (answer.wait_for(options_.command_timeout + std::chrono::seconds(1)) != std::future_status::ready) {
    return Error(ErrorCode::kOverloaded, "Redis at " + client_->endpoint() + " did not answer the rate limit within " +
                                             std::to_string(whole_ms(options_.command_timeout)) + " ms");
  }
  Result<StreamQueue::RateDecision> r = answer.get();
  if (!r.ok()) {
    const std::string why = r.error().code == ErrorCode::kTimeout
                                ? "Redis at " + client_->endpoint() + " did not answer within " +
                                      std::to_string(whole_ms(options_.command_timeout)) + " ms"
                                : describe();
    return Error(ErrorCode::kOverloaded, "the shared rate limit cannot be checked: " + why);
  }
  traffic::RateDecision d;
  d.allowed = r->allowed;
  d.retry_after_s = r->allowed ? 0 : std::max(r->retry_after_s, 1e-6);
  return d;
}

std::string RedisRateLimits::describe() const {
  const RedisClient::State state = client_->state();
  std::string why = client_->last_error().message;
  // The client's messages name the endpoint too: once is enough.
  const std::string& ep = client_->endpoint();
  for (const std::string& said : {"redis at " + ep + ": ", " to " + ep}) {
    for (std::size_t at; (at = why.find(said)) != std::string::npos;) why.erase(at, said.size());
  }
  return "Redis at " + ep + " is " + state_name(state) + (why.empty() ? "" : ": " + why);
}

std::string RedisRateLimits::unavailable_reason() const {
  if (client_->state() == RedisClient::State::kReady) return "";
  return describe();
}

}  // namespace vg::queue
