#include "config/config.hpp"

#include <spdlog/spdlog.h>

#include "admission/admission_policy.hpp"
#include "device/device.hpp"

namespace vg {
namespace {

Error bad(const std::string& flag, const std::string& what) {
  return Error(ErrorCode::kConfig, "--" + flag + ": " + what);
}

}  // namespace

Status ServeConfig::validate() const {
  if (model_dir.empty()) return bad("model-dir", "must not be empty");
  if (device.rfind("virt:", 0) != 0) return bad("device", "expected virt:N=SIZE, e.g. virt:0=2GiB, got '" + device + "'");
  if (threads < 0) return bad("threads", "must be >= 0");
  if (port < 0 || port > 65535) return bad("port", "must be in 0..65535");
  if (io_threads < 1 || io_threads > 64) return bad("io-threads", "must be in 1..64");
  if (max_body_bytes < 1024) return bad("max-body-bytes", "must be >= 1024");
  if (read_timeout_s <= 0) return bad("read-timeout", "must be > 0");
  if (idle_timeout_s <= 0) return bad("idle-timeout", "must be > 0");
  if (max_connections < 1) return bad("max-connections", "must be >= 1");
  if (auto p = parse_admission_policy(admission); !p.ok()) return bad("admission", p.error().message);
  if (memory_reserve != "0") {
    if (auto b = parse_bytes(memory_reserve); !b.ok()) return bad("memory-reserve", b.error().message);
  }
  if (memory_utilization <= 0 || memory_utilization > 1) return bad("memory-utilization", "must be in (0, 1]");
  if (memory_safety < 1 || memory_safety > 16) return bad("memory-safety", "must be in [1, 16]");
  if (max_bypass_s < 0) return bad("max-bypass", "must be >= 0");
  if (max_batch_tokens < 1) return bad("max-batch-tokens", "must be >= 1");
  if (max_batch < 1 || max_batch > 256) return bad("max-batch", "must be in 1..256");
  if (max_queue < 0) return bad("max-queue", "must be >= 0");
  if (queue_timeout_s <= 0) return bad("queue-timeout", "must be > 0");
  if (request_timeout_s <= 0) return bad("request-timeout", "must be > 0");
  if (shutdown_grace_s < 0) return bad("shutdown-grace", "must be >= 0");
  if (spdlog::level::from_str(log_level) == spdlog::level::off && log_level != "off") {
    return bad("log-level", "unknown level '" + log_level + "'");
  }
  if (watchdog_timeout_s <= 0) return bad("watchdog-timeout", "must be > 0");
  if (test_inject_oom_step < 0) return bad("test-inject-oom-step", "must be >= 0");
  if (test_step_delay_ms < 0) return bad("test-step-delay-ms", "must be >= 0");
  return Status::Ok();
}

}  // namespace vg
