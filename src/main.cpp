// vramgate command line: parses flags into one ServeConfig, validates it
// once, and runs the server.
#include <CLI/CLI.hpp>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <iostream>

#include "config/config.hpp"
#include "server/app.hpp"

namespace {

void add_serve_flags(CLI::App& serve, vg::ServeConfig& c) {
  serve.add_option("--model-dir", c.model_dir, "Model folder: config.json + model.safetensors (GPT-2 layout)")
      ->capture_default_str();
  serve.add_option("--device", c.device,
                   "Device to serve on: virt:N=SIZE is CPU memory with an enforced capacity "
                   "(SIZE like 2GiB, 512MiB)")
      ->capture_default_str();
  serve.add_option("--threads", c.threads, "Compute threads for tensor ops (0 = all cores)")->capture_default_str();
  serve.add_option("--host", c.host, "Address to listen on")->capture_default_str();
  serve.add_option("--port", c.port, "TCP port to listen on (0 = any free port, printed at start)")
      ->capture_default_str();
  serve.add_option("--io-threads", c.io_threads, "Threads serving HTTP connections")->capture_default_str();
  serve.add_option("--max-body-bytes", c.max_body_bytes, "Largest request body in bytes (more -> 413)")
      ->capture_default_str();
  serve.add_option("--read-timeout", c.read_timeout_s,
                   "Seconds for a request's headers and body to arrive (slower -> 408)")
      ->capture_default_str();
  serve.add_option("--idle-timeout", c.idle_timeout_s, "Seconds a keep-alive connection may sit idle")
      ->capture_default_str();
  serve.add_option("--max-connections", c.max_connections, "Open connections at most; more are closed at once")
      ->capture_default_str();
  serve.add_option("--admission", c.admission,
                   "Admission policy: memory (bytes against the device budget), fixed:N (at most N "
                   "sequences), none (the naive baseline: no fit check, no queue limit)")
      ->capture_default_str();
  serve.add_option("--memory-utilization", c.memory_utilization,
                   "Fraction of device capacity vramgate may use: budget = capacity x utilization - resident - "
                   "workspace - reserve")
      ->capture_default_str();
  serve.add_option("--memory-reserve", c.memory_reserve, "Bytes never handed to requests (e.g. 64MiB)")
      ->capture_default_str();
  serve.add_option("--memory-safety", c.memory_safety, "Multiplier on each request's measured memory cost (>= 1)")
      ->capture_default_str();
  serve.add_option("--max-bypass", c.max_bypass_s,
                   "Seconds a waiting request that does not fit may be passed by later ones that do")
      ->capture_default_str();
  serve.add_option("--max-batch", c.max_batch, "Sequences that run together on a device")->capture_default_str();
  serve.add_option("--max-batch-tokens", c.max_batch_tokens,
                   "Tokens processed in one step (prefill chunks + one per decoding sequence); longer prompts "
                   "are prefilled in chunks")
      ->capture_default_str();
  serve.add_option("--max-queue", c.max_queue, "Requests that may wait per device (more -> 503 overloaded)")
      ->capture_default_str();
  serve.add_option("--queue-timeout", c.queue_timeout_s,
                   "Longest wait in the queue in seconds (-> 503 overloaded with Retry-After)")
      ->capture_default_str();
  serve.add_option("--request-timeout", c.request_timeout_s,
                   "Total deadline per request in seconds (-> 504); a request's \"timeout\" field may lower it")
      ->capture_default_str();
  serve.add_option("--shutdown-grace", c.shutdown_grace_s,
                   "On SIGINT/SIGTERM: seconds in-flight work may finish before it is cancelled")
      ->capture_default_str();
  serve.add_option("--log-level", c.log_level, "trace, debug, info, warn, error or off")->capture_default_str();
  serve.add_flag("--log-request-text", c.log_request_text,
                 "Include prompt and output text in the per-request log lines (off: counts only)");
  serve.add_option("--watchdog-timeout", c.watchdog_timeout_s,
                   "Seconds an engine step may run before /health reports the engine stuck (503)")
      ->capture_default_str();
  serve.add_option("--test-step-delay-ms", c.test_step_delay_ms,
                   "Test hook: sleep this many ms after every engine step")
      ->capture_default_str();
  serve.add_option("--test-inject-oom-step", c.test_inject_oom_step,
                   "Test hook: the engine step with this number (from 1) fails with out-of-memory")
      ->capture_default_str();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"vramgate: an inference server that admits only what fits in device memory"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "vramgate 0.1.0");
  vg::ServeConfig config;
  CLI::App* serve = app.add_subcommand("serve", "Load the model and serve it over HTTP");
  add_serve_flags(*serve, config);
  CLI11_PARSE(app, argc, argv);

  auto logger = spdlog::stderr_color_mt("vramgate");
  spdlog::set_default_logger(logger);
  spdlog::set_level(spdlog::level::from_str(config.log_level));
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ %v");

  if (vg::Status st = config.validate(); !st.ok()) {
    std::cerr << "vramgate: " << st.error().message << "\n";
    return 2;
  }
  return vg::run_server(config);
}
