#include "server/queue_setup.hpp"

#include <unistd.h>

#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <random>

#include "common/clock.hpp"

#if VG_HAVE_QUEUE
#include "queue/redis_rate_limits.hpp"
#endif

namespace vg {
namespace {

/// The environment variable a Redis password may come from (docs/redis.md "Redis mode").
constexpr const char* kQueuePasswordVariable = "VRAMGATE_QUEUE_PASSWORD";

}  // namespace

Result<std::string> queue_url_without_password(const std::string& text) {
#if VG_HAVE_QUEUE
  auto url = queue::parse_redis_url(text);
  if (!url.ok()) return std::move(url).error();
  if (!url->password.empty()) {
    return Error(ErrorCode::kConfig,
                 "--queue: a password in the URL would be written into the engine's settings file; use "
                 "--queue-password-file or " +
                     std::string(kQueuePasswordVariable));
  }
#endif
  return text;
}

#if VG_HAVE_QUEUE
Result<queue::RedisUrl> resolve_queue_url(const ServeConfig& config) {
  auto url = queue::parse_redis_url(config.queue);
  if (!url.ok()) return std::move(url).error();
  queue::PasswordSource source;
  source.file = config.queue_password_file;
  if (std::getenv(kQueuePasswordVariable) != nullptr) source.env_var = kQueuePasswordVariable;
  auto lookup = [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
  return queue::with_password(std::move(url).value(), source, lookup);
}

std::string queue_process_id(const char* role) {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) std::snprintf(host, sizeof host, "host");
  std::string h;
  for (const char* p = host; *p != 0 && h.size() < 32; ++p) {
    const char c = *p;
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-';
    h += ok ? c : '-';
  }
  std::random_device rd;
  return fmt::format("{}-{}-{}-{:08x}", role, h, ::getpid(), rd());
}
#endif

Result<std::shared_ptr<traffic::SharedRateLimits>> make_shared_limits(const ServeConfig& config) {
#if VG_HAVE_QUEUE
  auto resolved = resolve_queue_url(config);
  if (!resolved.ok()) return std::move(resolved).error();
  queue::RedisRateLimits::Options o;
  o.url = std::move(resolved).value();
  o.command_timeout = from_seconds(config.queue_command_timeout_s);
  o.connect_timeout = std::max(from_seconds(1), o.command_timeout);
  auto limits = queue::RedisRateLimits::create(std::move(o));
  if (!limits.ok()) return std::move(limits).error();
  std::shared_ptr<queue::RedisRateLimits> shared = std::move(limits).value();
  const Status connected =
      shared->wait_connected(std::max(from_seconds(2), from_seconds(config.queue_command_timeout_s)));
  if (!connected.ok() && connected.error().code == ErrorCode::kConfig) return connected.error();
  if (connected.ok()) {
    spdlog::info("Redis mode: rate limits shared through Redis at {} ({} ms per round trip at most)",
                 shared->endpoint(), static_cast<long long>(config.queue_command_timeout_s * 1000));
  } else {
    spdlog::warn("Redis mode: {}; starting anyway, not ready (/ready 503) until it answers", connected.error().message);
  }
  return std::shared_ptr<traffic::SharedRateLimits>(std::move(shared));
#else
  (void)config;
  return Error(ErrorCode::kConfig, "this build has no Redis support (hiredis was not found when it was built)");
#endif
}

}  // namespace vg
