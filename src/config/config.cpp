// Range and format rules of ServeConfig (the one place they live); both the
// command line and the config file report their breaches by key.
#include "config/config.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "admission/admission_policy.hpp"
#include "common/origin.hpp"
#include "config/config_fields.hpp"
#include "device/device.hpp"
#include "device/foreign_bytes_hook.hpp"
#include "tokenizer/chat_template.hpp"
#if VG_HAVE_QUEUE
#include "queue/redis_url.hpp"
#endif

namespace vg {
namespace {

std::optional<ConfigProblem> bad(const char* key, std::string what) { return ConfigProblem{key, std::move(what)}; }

// The rules of the device list: 1..kMaxDevices entries that each parse,
// `auto` only alone, no kind and index twice. Empty when they hold.
std::string device_list_problem(const std::vector<std::string>& devices) {
  if (devices.empty()) return "needs at least one device";
  if (devices.size() > ServeConfig::kMaxDevices) {
    return "at most " + std::to_string(ServeConfig::kMaxDevices) + " devices, got " + std::to_string(devices.size());
  }
  std::vector<DeviceSpec> specs;
  for (const std::string& d : devices) {
    auto spec = parse_device_spec(d);
    if (!spec.ok()) return spec.error().message;
    if (spec->kind == DeviceKind::kAuto && devices.size() > 1) {
      return "auto must be the only device, got " + std::to_string(devices.size()) + " devices";
    }
    for (std::size_t i = 0; i < specs.size(); ++i) {
      if (specs[i].kind == spec->kind && specs[i].index == spec->index) {
        return spec->name() + " is given twice ('" + devices[i] + "' and '" + d + "')";
      }
    }
    specs.push_back(*spec);
  }
  return {};
}

}  // namespace

Result<DeviceSpec> parse_device_spec(const std::string& spec) {
  const auto all_digits = [](const std::string& s) {
    return !s.empty() && s.size() <= 4 &&
           std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isdigit(c); });
  };
  if (spec == "auto") return DeviceSpec{DeviceKind::kAuto, 0, 0, spec};
  if (spec.rfind("cuda:", 0) == 0) {
    const std::string index = spec.substr(5);
    if (!all_digits(index)) {
      return Error(ErrorCode::kConfig, "bad device index '" + index + "' in '" + spec + "', expected cuda:N");
    }
    return DeviceSpec{DeviceKind::kCuda, std::stoi(index), 0, spec};
  }
  const auto eq = spec.find('=');
  if (spec.rfind("virt:", 0) != 0 || eq == std::string::npos) {
    return Error(ErrorCode::kConfig,
                 "expected virt:N=SIZE (e.g. virt:0=2GiB), cuda:N (e.g. cuda:0) or auto, got '" + spec + "'");
  }
  const std::string index = spec.substr(5, eq - 5);
  if (!all_digits(index)) return Error(ErrorCode::kConfig, "bad device index '" + index + "' in '" + spec + "'");
  auto bytes = parse_bytes(spec.substr(eq + 1));
  if (!bytes.ok()) return Error(ErrorCode::kConfig, bytes.error().message + " in '" + spec + "'");
  return DeviceSpec{DeviceKind::kVirtual, std::stoi(index), *bytes, spec};
}

std::string DeviceSpec::name() const {
  switch (kind) {
    case DeviceKind::kAuto: return "auto";
    case DeviceKind::kCuda: return "cuda:" + std::to_string(index);
    case DeviceKind::kVirtual: break;
  }
  return "virt:" + std::to_string(index);
}

namespace {

/// A value check() should have refused: a bug in the caller, not bad input.
[[noreturn]] void unchecked(const char* key, const Error& e) {
  std::fprintf(stderr, "vramgate: setting %s was used without ServeConfig::check(): %s\n", key, e.message.c_str());
  std::abort();
}

}  // namespace

AdmissionPolicy ServeConfig::admission_policy() const {
  Result<AdmissionPolicy> p = parse_admission_policy(admission);
  if (!p.ok()) unchecked("admission", p.error());
  return *p;
}

std::int64_t ServeConfig::memory_reserve_bytes() const {
  if (memory_reserve == "0") return 0;
  Result<std::int64_t> b = parse_bytes(memory_reserve);
  if (!b.ok()) unchecked("memory_reserve", b.error());
  return *b;
}

std::vector<DeviceSpec> ServeConfig::device_specs() const {
  if (std::string p = device_list_problem(device); !p.empty()) unchecked("device", Error(ErrorCode::kConfig, p));
  std::vector<DeviceSpec> out;
  for (const std::string& d : device) out.push_back(*parse_device_spec(d));
  return out;
}

traffic::TrustedProxies ServeConfig::trusted_proxies() const {
  Result<traffic::TrustedProxies> t = traffic::TrustedProxies::parse(trusted_proxy);
  if (!t.ok()) unchecked("trusted_proxy", t.error());
  return std::move(t).value();
}

namespace {

// The model settings of check(): dtype, the decode paths, the chat format.
std::optional<ConfigProblem> check_model_settings(const ServeConfig& c) {
  if (c.dtype != "float32" && c.dtype != "bfloat16" && c.dtype != "float16" && c.dtype != "float64") {
    return bad("dtype", "must be float32, bfloat16, float16 or float64");
  }
  if (c.host_kernels != "on" && c.host_kernels != "off") {
    return bad("host_kernels", "must be on or off, got '" + c.host_kernels + "'");
  }
  if (c.cuda_graphs != "on" && c.cuda_graphs != "off") {
    return bad("cuda_graphs", "must be on or off, got '" + c.cuda_graphs + "'");
  }
  if (c.test_emulate_cuda_graphs && c.host_kernels == "on") {
    return bad("test_emulate_cuda_graphs", "needs --host-kernels off (decode graphs record the tensor path's steps)");
  }
  if (!c.chat_template.empty() && !parse_chat_format(c.chat_template)) {
    return bad("chat_template", "must be chatml, llama-2, llama-3 or zephyr (or empty: the model's own)");
  }
  return std::nullopt;
}

// The process settings of check(): engines, gateways, the shared queue.
std::optional<ConfigProblem> check_processes(const ServeConfig& c) {
  for (const std::string& e : c.engine) {
    if (e.rfind("unix:", 0) != 0 || e.size() <= 5) return bad("engine", "'" + e + "' is not unix:PATH");
    if (e.size() - 5 > 100) return bad("engine", "socket path '" + e.substr(5) + "' is longer than 100 bytes");
  }
  if (c.in_process && !c.engine.empty()) return bad("engine", "cannot be combined with --in-process");
  if (c.one_engine && c.in_process) return bad("one_engine", "cannot be combined with --in-process");
  if (c.one_engine && !c.engine.empty()) {
    return bad("one_engine", "cannot be combined with --engine (it chooses how serve starts engines)");
  }
  if (c.one_engine && c.gateway_only) return bad("one_engine", "cannot be combined with --gateway-only");
  if (c.gateway_only && c.queue.empty())
    return bad("gateway_only", "needs --queue (the shared queue it places work in)");
  if (c.gateway_only && c.in_process) return bad("gateway_only", "cannot be combined with --in-process");
  if (c.gateway_only && !c.engine.empty()) return bad("gateway_only", "cannot be combined with --engine");
  if (!(c.engine_heartbeat_timeout_s >= 1 && c.engine_heartbeat_timeout_s <= 3600)) {
    return bad("engine_heartbeat_timeout", "must be in [1, 3600] (engines heartbeat every 0.25 s)");
  }
  if (c.max_crash_retries < 1 || c.max_crash_retries > 100) return bad("max_crash_retries", "must be in [1, 100]");
  if (!(c.orphan_timeout_s > 0 && c.orphan_timeout_s <= 7 * 86400))
    return bad("orphan_timeout", "must be in (0, 604800]");
  if (!c.queue.empty()) {
#if VG_HAVE_QUEUE
    if (auto url = queue::parse_redis_url(c.queue); !url.ok()) return bad("queue", url.error().message);
#else
    return bad("queue", "this build has no Redis support (hiredis was not found when it was built)");
#endif
  }
  if (!c.queue_password_file.empty() && c.queue.empty()) return bad("queue_password_file", "needs --queue");
  if (!(c.queue_command_timeout_s > 0 && c.queue_command_timeout_s <= 60)) {
    return bad("queue_command_timeout", "must be in (0, 60]");
  }
  if (!(c.claim_idle_s >= 0.5 && c.claim_idle_s <= 600)) return bad("claim_idle", "must be in [0.5, 600]");
  return std::nullopt;
}

}  // namespace

std::optional<ConfigProblem> ServeConfig::check() const {
  if (model_dir.empty()) return bad("model_dir", "must not be empty");
  if (std::string p = device_list_problem(device); !p.empty()) return bad("device", std::move(p));
  if (threads < 0) return bad("threads", "must be >= 0");
  for (const std::string& origin : cors_allow_origin) {
    if (Status st = check_origin(origin); !st) return bad("cors_allow_origin", st.error().message);
  }
  if (auto p = check_model_settings(*this)) return p;
  if (port < 0 || port > 65535) return bad("port", "must be in 0..65535");
  if (io_threads < 1 || io_threads > 64) return bad("io_threads", "must be in 1..64");
  if (max_body_bytes < 1024) return bad("max_body_bytes", "must be >= 1024");
  if (read_timeout_s <= 0) return bad("read_timeout", "must be > 0");
  if (idle_timeout_s <= 0) return bad("idle_timeout", "must be > 0");
  if (max_connections < 1) return bad("max_connections", "must be >= 1");
  if (auto p = parse_admission_policy(admission); !p.ok()) return bad("admission", p.error().message);
  if (memory_reserve != "0") {
    if (auto b = parse_bytes(memory_reserve); !b.ok()) return bad("memory_reserve", b.error().message);
  }
  if (memory_utilization <= 0 || memory_utilization > 1) return bad("memory_utilization", "must be in (0, 1]");
  if (memory_safety < 1 || memory_safety > 16) return bad("memory_safety", "must be in [1, 16]");
  if (max_bypass_s < 0) return bad("max_bypass", "must be >= 0");
  if (!(oom_decrease_factor > 0 && oom_decrease_factor < 1)) return bad("oom_decrease_factor", "must be in (0, 1)");
  if (!(oom_budget_floor >= 0 && oom_budget_floor <= 1)) return bad("oom_budget_floor", "must be in [0, 1]");
  if (!(oom_quiet_period_s >= 0.001 && oom_quiet_period_s <= 86400)) {
    return bad("oom_quiet_period", "must be in [0.001, 86400]");
  }
  if (!(oom_increase_step > 0 && oom_increase_step <= 1)) return bad("oom_increase_step", "must be in (0, 1]");
  if (max_batch_tokens < 1) return bad("max_batch_tokens", "must be >= 1");
  if (max_batch < 0 || max_batch > kLargestMaxBatch)
    return bad("max_batch", "must be in 0..256 (0: chosen at start-up)");
  if (!(max_batch_delay_ms >= 0 && max_batch_delay_ms <= 10000)) {
    return bad("max_batch_delay_ms", "must be in 0..10000 (milliseconds)");
  }
  if (max_n < 1 || max_n > 256) return bad("max_n", "must be in 1..256");
  if (max_queue < 0) return bad("max_queue", "must be >= 0");
  if (queue_timeout_s <= 0) return bad("queue_timeout", "must be > 0");
  if (request_timeout_s <= 0) return bad("request_timeout", "must be > 0");
  if (shutdown_grace_s < 0) return bad("shutdown_grace", "must be >= 0");
  if (auto t = traffic::TrustedProxies::parse(trusted_proxy); !t.ok()) return bad("trusted_proxy", t.error().message);
  if (retry_bookings != "on" && retry_bookings != "off") {
    return bad("retry_bookings", "must be on or off, got '" + retry_bookings + "'");
  }
  if (max_retry_bookings < 1 || max_retry_bookings > 1000000) return bad("max_retry_bookings", "must be in 1..1000000");
  if (!(retry_early_s >= 0 && retry_early_s <= 3600)) return bad("retry_early", "must be in [0, 3600]");
  if (!(retry_grace_s > 0 && retry_grace_s <= 3600)) return bad("retry_grace", "must be in (0, 3600]");
  if (!(max_retry_after_s > 0 && max_retry_after_s <= 86400)) return bad("max_retry_after", "must be in (0, 86400]");
  if (spdlog::level::from_str(log_level) == spdlog::level::off && log_level != "off") {
    return bad("log_level", "unknown level '" + log_level + "'");
  }
  if (watchdog_timeout_s <= 0) return bad("watchdog_timeout", "must be > 0");
  if (profile_steps < 0 || profile_steps > 100000) return bad("profile_steps", "must be in 0..100000");
  if (profile_min_batch < 1) return bad("profile_min_batch", "must be >= 1");
  if (profile_steps > 0 && profile_trace.empty()) {
    return bad("profile_trace", "is required when --profile-steps is above 0 (the file the trace is written to)");
  }
  if (!(rate_limit >= 0 && rate_limit <= 1e6)) return bad("rate_limit", "must be in [0, 1000000]");
  if (!(rate_burst >= 0 && rate_burst <= 1e6)) return bad("rate_burst", "must be in [0, 1000000]");
  if (!(priority_aging_s >= 0 && priority_aging_s <= 86400)) return bad("priority_aging", "must be in [0, 86400]");
  if (!(idempotency_ttl_s >= 0 && idempotency_ttl_s <= 86400)) return bad("idempotency_ttl", "must be in [0, 86400]");
  if (test_inject_oom_step < 0) return bad("test_inject_oom_step", "must be >= 0");
  if (test_inject_oom_count < 1) return bad("test_inject_oom_count", "must be >= 1");
  if (test_leak_bytes_on_oom < 0) return bad("test_leak_bytes_on_oom", "must be >= 0");
  if (max_preemptions < 0) return bad("max_preemptions", "must be >= 0");
  if (kv_pool != "on" && kv_pool != "off") return bad("kv_pool", "must be on or off, got '" + kv_pool + "'");
  if (kv_reservation != "on-demand" && kv_reservation != "full") {
    return bad("kv_reservation", "must be on-demand or full, got '" + kv_reservation + "'");
  }
  if (kv_block_tokens < 1 || kv_block_tokens > 1024) return bad("kv_block_tokens", "must be in 1..1024");
  if (prefix_cache != "on" && prefix_cache != "off") {
    return bad("prefix_cache", "must be on or off, got '" + prefix_cache + "'");
  }
  if (oom_unready_after < 1) return bad("oom_unready_after", "must be >= 1");
  if (test_step_delay_ms < 0) return bad("test_step_delay_ms", "must be >= 0");
  if (test_poison_logits_step < 0) return bad("test_poison_logits_step", "must be >= 0");
  if (test_device_fault_step < 0) return bad("test_device_fault_step", "must be >= 0");
  if (auto hook = parse_foreign_bytes_hook(test_foreign_bytes); !hook.ok()) {
    return bad("test_foreign_bytes", hook.error().message);
  }
  if (auto p = check_processes(*this)) return p;
  return std::nullopt;
}

Status ServeConfig::validate() const {
  if (auto p = check()) return Error(ErrorCode::kConfig, flag_name(p->key) + ": " + p->what);
  return Status::Ok();
}

}  // namespace vg
