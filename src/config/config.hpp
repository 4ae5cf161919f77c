// The one validated configuration struct, filled once in main from the
// config file and the command line (config_cli.hpp) and passed by const
// reference. Each field documents its default and unit; its key, flag and
// help text are in config_fields.cpp. Test hooks are fields too (test_).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "common/error.hpp"

namespace vg {

/// What is wrong with one field: its config-file key (e.g. "max_batch") and
/// the rule it breaks.
struct ConfigProblem {
  std::string key;
  std::string what;
};

struct ServeConfig {
  // -- models and devices
  std::string model_dir = "models/tinylm";  ///< a model folder (config.json + model.safetensors)
  std::string device = "virt:0=2GiB";       ///< virt:N=SIZE (CPU memory with an enforced capacity)
  int threads = 0;                          ///< compute threads for tensor ops; 0 = all cores

  // -- HTTP
  std::string host = "127.0.0.1";
  int port = 8000;
  int io_threads = 2;                        ///< threads serving HTTP connections
  std::int64_t max_body_bytes = 1 << 20;     ///< larger request bodies -> 413 (bytes)
  double read_timeout_s = 30;                ///< request headers + body must arrive within this (s) -> 408
  double idle_timeout_s = 60;                ///< keep-alive idle limit (s)
  int max_connections = 1024;                ///< open connections; more are closed at once

  // -- admission
  std::string admission = "memory";  ///< memory | fixed:N | none (the naive baseline)
  double memory_utilization = 0.9;   ///< fraction of device capacity vramgate may use (0, 1]
  std::string memory_reserve = "0";  ///< bytes never handed to requests, e.g. 64MiB
  double memory_safety = 1.1;        ///< multiplier on measured per-request cost, >= 1
  double max_bypass_s = 5;           ///< how long a waiting request may be passed by smaller ones (s)
  // OOM governor (policy memory): an OOM cuts the effective budget, quiet periods restore it.
  double oom_decrease_factor = 0.5;  ///< on an OOM: effective budget x this, in (0, 1)
  double oom_budget_floor = 0.25;    ///< lowest effective budget, fraction of the budget in [0, 1]
  double oom_quiet_period_s = 10;    ///< time without an OOM before each raise (s), [0.001, 86400]
  double oom_increase_step = 0.1;    ///< raise per quiet period, fraction of the budget in (0, 1]

  // -- scheduling
  int max_batch = 8;                 ///< sequences that run together on a device
  int max_batch_tokens = 512;        ///< tokens in one step: prefill chunks + one per decoding sequence
  int max_queue = 64;                ///< waiting requests per device; more -> 503
  double queue_timeout_s = 30;       ///< longest wait in the queue (s) -> 503 + Retry-After
  double request_timeout_s = 300;    ///< total deadline per request (s) -> 504; a request may ask for less
  double shutdown_grace_s = 10;      ///< on SIGTERM: how long in-flight work may drain (s)

  // -- operability
  std::string log_level = "info";    ///< trace, debug, info, warn, error, off
  bool log_request_text = false;     ///< request log lines include prompt and output text (opt-in)
  double watchdog_timeout_s = 60;    ///< an engine step running longer than this turns /health 503 (s)

  // -- test hooks
  double test_step_delay_ms = 0;     ///< sleep after every engine step (ms), to hold requests running
  std::int64_t test_inject_oom_step = 0;  ///< engine step (1-based) that fails with out-of-memory; 0 = never

  /// Checks ranges and formats; the first field that breaks a rule, or none.
  std::optional<ConfigProblem> check() const;
  /// check() as a Status. Errors: kConfig naming the flag, "--max-batch: ...".
  Status validate() const;
};

/// A parsed `virt:N=SIZE` device string.
struct DeviceSpec {
  int index = 0;               ///< N
  std::int64_t capacity = 0;   ///< SIZE in bytes
};

/// Parses "virt:0=2GiB". Errors: kConfig saying what is wrong (no flag name).
Result<DeviceSpec> parse_device_spec(const std::string& spec);

}  // namespace vg
