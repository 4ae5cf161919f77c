// Redis mode's start-up pieces shared by the gateway (vramgate serve --queue)
// and the engine (vramgate engine with --queue): the queue URL with its
// password, a process's queue id, and the shared rate limits. Torch-free;
// main thread only. Without VG_HAVE_QUEUE (a build without hiredis) only
// what refuses --queue is declared.
#pragma once

#include <memory>
#include <string>

#include "common/error.hpp"
#include "config/config.hpp"
#include "traffic/shared_rate_limits.hpp"

#if VG_HAVE_QUEUE
#include "queue/redis_url.hpp"
#endif

namespace vg {

/// --queue without the password it may hold, for a settings file an engine
/// process reads (the password then must come from the environment or a
/// file). Errors: kConfig when the URL holds a password. Without
/// VG_HAVE_QUEUE: as given.
Result<std::string> queue_url_without_password(const std::string& text);

#if VG_HAVE_QUEUE
/// --queue's URL with its password (from the URL, --queue-password-file or
/// VRAMGATE_QUEUE_PASSWORD, at most one of them). Errors: kConfig.
Result<queue::RedisUrl> resolve_queue_url(const ServeConfig& config);

/// A name unique to this process for the shared queue: `role`, host, pid and
/// random bits (queue::valid_queue_id accepts it).
std::string queue_process_id(const char* role);
#endif

/// Redis mode: the rate limits shared through --queue's Redis. Waits for the
/// first connection up to its attempt deadline: a Redis that refuses the
/// credentials or database is a configuration error (kConfig, start-up
/// fails); one that is merely unreachable is not (the gateway starts, not
/// ready, and connects once it answers). Without VG_HAVE_QUEUE: kConfig.
Result<std::shared_ptr<traffic::SharedRateLimits>> make_shared_limits(const ServeConfig& config);

}  // namespace vg
