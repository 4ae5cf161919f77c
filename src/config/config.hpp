// The one validated configuration struct, filled once in main from the
// config file and the command line (config_cli.hpp) and passed by const
// reference. Each field documents its default and unit; its key, flag and
// help text are in config_fields.cpp. Test hooks are fields too (test_).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "admission/admission_policy.hpp"
#include "admission/batch_size.hpp"
#include "common/error.hpp"
#include "device/device.hpp"
#include "traffic/client_identity.hpp"

namespace vg {

/// A parsed device string: `virt:N=SIZE`, `cuda:N` or `auto`.
struct DeviceSpec {
  DeviceKind kind = DeviceKind::kVirtual;
  int index = 0;               ///< N
  std::int64_t capacity = 0;   ///< SIZE in bytes (virt only; cuda's comes from the runtime)
  std::string text;            ///< as written, e.g. "virt:0=2GiB"

  /// The device's name before it exists: "virt:N", "cuda:N" or "auto" (a
  /// created device's Device::name() is the same, auto resolved).
  std::string name() const;
};

/// What is wrong with one field: its config-file key (e.g. "max_batch") and
/// the rule it breaks.
struct ConfigProblem {
  std::string key;
  std::string what;
};

struct ServeConfig {
  /// Most entries `device` may have.
  static constexpr std::size_t kMaxDevices = 16;

  // -- models and devices
  std::string model_dir = "models/tinylm";  ///< a model folder (config.json + model.safetensors)
  /// One entry per device, each virt:N=SIZE (CPU memory with a capacity),
  /// cuda:N or auto (cuda:0 if any, else virt:0=2GiB); auto only alone, no
  /// kind and index twice, at most kMaxDevices.
  std::vector<std::string> device = {"auto"};
  int threads = 0;                          ///< compute threads for tensor ops; 0 = all cores
  std::string dtype = "float32";            ///< compute and KV cache dtype: float32, bfloat16, float16 (CUDA), float64
  /// on: decoder models in host memory decode through the host kernels
  /// (Model::Options::host_decode_kernel); off: through the tensor path
  /// that CUDA devices run (static-shape decode steps), for tests and comparisons.
  std::string host_kernels = "on";
  /// on: on a CUDA device with a KV block pool, decode steps are recorded as
  /// CUDA graphs at start-up (one per batch and key bucket) and replayed;
  /// off: every step runs eagerly. No effect elsewhere.
  std::string cuda_graphs = "on";
  /// Chat format of /v1/chat/completions: chatml, llama-2, llama-3, zephyr;
  /// empty: recognised from the model's tokenizer_config.json chat_template.
  std::string chat_template;

  // -- HTTP
  std::string host = "127.0.0.1";
  int port = 8000;
  int io_threads = 2;                        ///< threads serving HTTP connections
  std::int64_t max_body_bytes = 1 << 20;     ///< larger request bodies -> 413 (bytes)
  double read_timeout_s = 30;                ///< request headers + body must arrive within this (s) -> 408
  double idle_timeout_s = 60;                ///< keep-alive idle limit (s)
  int max_connections = 1024;                ///< open connections; more are closed at once
  /// Origins whose browser requests get CORS headers: scheme://host[:port]
  /// each, or "*" for any; empty = CORS off.
  std::vector<std::string> cors_allow_origin;

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
  // OOM recovery (policies memory and fixed).
  int max_preemptions = 3;           ///< times one request may be preempted and recomputed before 503, >= 0
  int oom_unready_after = 5;         ///< consecutive failed steps (OOM) that mark the device not ready, >= 1
  // Paged KV cache (docs/admission-and-memory.md "KV blocks").
  std::string kv_pool = "on";  ///< on: the budget is allocated at start as KV blocks; off: per-sequence caches
  std::string kv_reservation = "on-demand";  ///< on-demand | full: what a sequence reserves in KV blocks
  int kv_block_tokens = 16;                  ///< positions per KV block, 1..1024
  std::string prefix_cache = "on";           ///< on: prompts share the KV blocks of a common prefix; off

  // -- scheduling
  /// Sequences that run together on a device; 0: chosen at start-up
  /// (choose_max_batch with a KV block pool, else kDefaultMaxBatch).
  int max_batch = 0;
  int max_n = 8;                     ///< choices one request may ask for (OpenAI n), 1..256
  int max_batch_tokens = 512;        ///< tokens in one step: prefill chunks + one per decoding sequence
  double max_batch_delay_ms = 2;     ///< TorchScript models: ms a partial batch waits for more requests (>= 0)
  bool prefill_worker = false;       ///< prefill new prompts on a second compute thread (2x workspace)
  int max_queue = 64;                ///< waiting requests (one queue shared by the devices); more -> 503
  double queue_timeout_s = 30;       ///< longest wait in the queue (s) -> 503 + Retry-After
  double request_timeout_s = 300;    ///< total deadline per request (s) -> 504; a request may ask for less
  double shutdown_grace_s = 10;      ///< on SIGTERM: how long in-flight work may drain (s)
  // Booked retries (docs/admission-and-memory.md "Booked retries").
  std::string retry_bookings = "on"; ///< on: an overloaded refusal books its retry's place; off: the baseline
  int max_retry_bookings = 256;      ///< booked places held at once, >= 1
  double retry_early_s = 0.25;       ///< a booked retry may come this much before its promise (s), >= 0
  double retry_grace_s = 2;          ///< and this much after it; then the booking is released (s), > 0
  double max_retry_after_s = 30;     ///< a longer promise books nothing (s), > 0

  // -- traffic policies (docs/admission-and-memory.md "Traffic policies")
  std::string api_keys;              ///< file of API keys, one a line; empty = no keys, no 401
  bool metrics_auth = false;         ///< GET /metrics needs a key too (when api_keys is set)
  double rate_limit = 0;             ///< requests/s per API key or client address; 0 = off
  double rate_burst = 0;             ///< bucket size (requests); 0 = max(1, rate_limit)
  /// Proxies (addresses or CIDR ranges) whose X-Forwarded-For names the
  /// client address (without API keys: rate buckets, booking shares); empty:
  /// X-Forwarded-For is ignored.
  std::vector<std::string> trusted_proxy;
  double priority_aging_s = 10;      ///< a request waiting this long counts as high priority (s); 0 = FIFO
  double idempotency_ttl_s = 300;    ///< how long a finished Idempotency-Key result is replayed (s); 0 = in flight only

  // -- operability
  std::string log_level = "info";    ///< trace, debug, info, warn, error, off
  bool log_request_text = false;     ///< request log lines include prompt and output text (opt-in)
  double watchdog_timeout_s = 60;    ///< an engine step running longer than this turns /health 503 (s)
  // Step profile (docs/operations.md "Step profile"): a Chrome trace of decode steps.
  int profile_steps = 0;             ///< decode steps to record, 0..100000; 0 = off
  int profile_min_batch = 1;         ///< only decode steps of at least this many sequences are recorded, >= 1
  std::string profile_trace;         ///< where the trace JSON is written; needed when profile_steps > 0

  // -- processes (docs/processes.md "Processes")
  /// One process: HTTP and the engines together (no supervisor, no socket).
  bool in_process = false;
  /// Engines to use instead of starting them: unix:PATH each (their secret
  /// in PATH.secret); empty: start engine processes (see one_engine).
  std::vector<std::string> engine;
  /// Started engines: one process for all --devices (one admission queue
  /// over them; a crash stops every device); off: one process per device (a
  /// crash stops one device; each device has its own admission queue, and
  /// the gateway places each request on the engine with the most free
  /// budget and moves a waiting one to where room frees first).
  bool one_engine = false;
  std::string runtime_dir;              ///< sockets and secrets of started engines; empty: $XDG_RUNTIME_DIR/vramgate or /tmp/vramgate-UID
  double engine_heartbeat_timeout_s = 5;  ///< a connected engine silent this long is hung: killed and restarted (s)
  int max_crash_retries = 2;            ///< engine crashes with a request running that end it with engine_crashed, >= 1
  double orphan_timeout_s = 600;        ///< an engine with no gateway this long exits (s)
  bool keep_engines = false;            ///< on shutdown leave the started engines running for the next serve

  // -- Redis mode (docs/redis.md "Redis mode")
  /// redis://[USER[:PASSWORD]@]HOST[:PORT][/DB]: rate limits shared by every
  /// gateway on this Redis; empty = off (the limits are this process's own).
  std::string queue;
  /// A file holding the Redis password (instead of the URL, which `ps`
  /// shows); the variable VRAMGATE_QUEUE_PASSWORD is the other way (read by server/queue_setup).
  std::string queue_password_file;
  double queue_command_timeout_s = 0.25;  ///< deadline of each Redis round trip (s), (0, 60]
  /// An engine's request in the shared queue not kept alive this long (the
  /// engine died or stalled) is claimed by another engine (s), [0.5, 600].
  double claim_idle_s = 2;
  /// With --queue: start no engine of this gateway's own (completions go
  /// through the shared queue only; no TorchScript models).
  bool gateway_only = false;

  // -- test hooks
  double test_step_delay_ms = 0;     ///< sleep after every engine step (ms), to hold requests running
  std::int64_t test_inject_oom_step = 0;  ///< engine step (1-based) that fails with out-of-memory; 0 = never
  std::int64_t test_inject_oom_count = 1; ///< consecutive steps from test_inject_oom_step that fail, >= 1
  std::int64_t test_leak_bytes_on_oom = 0; ///< bytes each out-of-memory recovery leaves allocated (a planted leak), >= 0
  /// Test hook: an engine process aborts when a request whose prompt contains this text starts running.
  std::string test_crash_on_prompt;
  /// Test hook: an engine process aborts before it loads its model (every start).
  bool test_engine_crash_at_start = false;
  /// Test hook: decode graphs recorded as on a CUDA device, emulated (each
  /// replay runs the recorded step again), where a CPU device runs the
  /// tensor path (--host-kernels off).
  bool test_emulate_cuda_graphs = false;
  /// Test hook: this engine step (1-based) counts as producing NaN logits; 0 = never.
  std::int64_t test_poison_logits_step = 0;
  /// Test hook: at this engine step (1-based) the device's next allocation fails with the
  /// c10::Error of a CUDA fault (an illegal memory access), virtual devices only; 0 = never.
  std::int64_t test_device_fault_step = 0;
  /// Another process on the device (virtual: simulated; CUDA: cudaMalloc
  /// outside the allocator): "STEP=SIZE,..." at engine steps, or "file:PATH"
  /// whose byte size is read at every engine turn; "" = off
  /// (device/foreign_bytes_hook.hpp).
  std::string test_foreign_bytes;
  bool test_trim_heap = false;       ///< GET /v1/admission first calls malloc_trim(0), so RSS is comparable (soak)

  /// Checks ranges and formats; the first field that breaks a rule, or none.
  std::optional<ConfigProblem> check() const;
  /// check() as a Status. Errors: kConfig naming the flag, "--max-batch: ...".
  Status validate() const;

  // The typed values of settings written as text, parsed here and nowhere
  // else. Valid once check() passes (every config from a file or the command
  // line has); on one that does not, they end the process naming the key, a
  // programming error rather than a user's.
  /// `admission`: memory, fixed:N or none.
  /// --max-batch, or kDefaultMaxBatch for 0 (where no block pool chooses it).
  int max_batch_or_default() const { return max_batch > 0 ? max_batch : kDefaultMaxBatch; }
  AdmissionPolicy admission_policy() const;
  /// `memory_reserve` in bytes.
  std::int64_t memory_reserve_bytes() const;
  /// `device`, each entry parsed, in the order given (at least one). The
  /// strings stay the form that crosses process boundaries (an engine's
  /// flags, its hello), these the form that creates devices.
  std::vector<DeviceSpec> device_specs() const;
  /// `trusted_proxy`, every entry (and comma-separated part) parsed.
  traffic::TrustedProxies trusted_proxies() const;
};

/// Parses "virt:0=2GiB", "cuda:0" or "auto". Whether the build has CUDA is
/// not checked here (create_device says so at start-up). Errors: kConfig
/// saying what is wrong (no flag name).
Result<DeviceSpec> parse_device_spec(const std::string& spec);

}  // namespace vg
