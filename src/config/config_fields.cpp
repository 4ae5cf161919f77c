// The settings table of ServeConfig (see config_fields.hpp). A new field of
// ServeConfig gets one row here and is then a flag and a config-file key.
#include "config/config_fields.hpp"

#include <algorithm>

namespace vg {
namespace {

using C = ServeConfig;

const ConfigField kFields[] = {
    {"model_dir", "model",
     "Model folder: config.json (model_type gpt2 or llama) + model.safetensors or its shards "
     "(model.safetensors.index.json)",
     &C::model_dir, ConfigValue::kPath},
    {"device", "model",
     "Device to serve on: virt:N=SIZE is CPU memory with an enforced capacity (SIZE like 2GiB, 512MiB), "
     "cuda:N a GPU (builds against a CUDA libtorch), auto is cuda:0 when there is one, else virt:0=2GiB; may be "
     "given several times (or comma-separated; in the file an array of strings): one engine and model replica "
     "per device",
     &C::device},
    {"threads", "model",
     "Compute threads for tensor ops, per engine process (0 = all cores; with an engine process per device, the "
     "cores divided among them)",
     &C::threads},
    {"dtype", "model",
     "Compute and KV cache dtype: float32, bfloat16, float16 (CUDA only) or float64 (a test mode); weights "
     "stored as F32, F16 or BF16 are converted on load",
     &C::dtype},
    {"host_kernels", "model",
     "on: on a CPU device (virt:), GPT-2 and LLaMA decode through the host kernels (decode attention and "
     "batch-invariant products written for the CPU); off: through the tensor path that CUDA devices run "
     "(static-shape decode steps through the KV block table), for tests and comparisons",
     &C::host_kernels},
    {"cuda_graphs", "model",
     "on: on a CUDA device with a KV block pool, decode steps are recorded at start-up as CUDA graphs (one per "
     "batch bucket and key bucket, their memory charged to the budget) and replayed; off: every step runs "
     "eagerly. No effect on other devices or without a pool (the start-up log says which)",
     &C::cuda_graphs},
    {"chat_template", "model",
     "Chat format of /v1/chat/completions: chatml, llama-2, llama-3 or zephyr; empty: recognised from the "
     "model's tokenizer_config.json chat_template (a request's chat_template field wins over both)",
     &C::chat_template},

    {"host", "http", "Address to listen on", &C::host},
    {"port", "http", "TCP port to listen on (0 = any free port, printed at start)", &C::port},
    {"io_threads", "http", "Threads serving HTTP connections", &C::io_threads},
    {"max_body_bytes", "http", "Largest request body in bytes, or with a unit like 64MiB (more -> 413)",
     &C::max_body_bytes, ConfigValue::kBytes},
    {"read_timeout", "http", "Seconds for a request's headers and body to arrive (slower -> 408)", &C::read_timeout_s},
    {"idle_timeout", "http", "Seconds a keep-alive connection may sit idle", &C::idle_timeout_s},
    {"max_connections", "http", "Open connections at most; more are closed at once", &C::max_connections},
    {"cors_allow_origin", "http",
     "Origin allowed to call the API from a browser (CORS), as scheme://host[:port], or * for any; may be given "
     "several times (in the file an array of strings); none: no CORS headers, preflights get 403",
     &C::cors_allow_origin},

    {"admission", "memory",
     "Admission policy: memory (bytes against the device budget), fixed:N (at most N sequences), none (the "
     "naive baseline: no fit check, no queue limit)",
     &C::admission},
    {"memory_utilization", "memory",
     "Share of the device's total memory vramgate may use, capped by what is free: budget = min(capacity x "
     "utilization, capacity - bytes other processes hold) - resident - workspace - reserve",
     &C::memory_utilization},
    {"memory_reserve", "memory", "Bytes never handed to requests (e.g. 64MiB)", &C::memory_reserve,
     ConfigValue::kBytes},
    {"memory_safety", "memory", "Multiplier on each request's measured memory cost (>= 1)", &C::memory_safety},
    {"oom_decrease_factor", "memory",
     "OOM governor (admission memory): an out-of-memory error multiplies the effective budget by this (0..1)",
     &C::oom_decrease_factor},
    {"oom_budget_floor", "memory", "OOM governor: lowest effective budget, as a fraction of the budget",
     &C::oom_budget_floor},
    {"oom_quiet_period", "memory", "OOM governor: seconds without out-of-memory before each raise of the budget",
     &C::oom_quiet_period_s},
    {"oom_increase_step", "memory", "OOM governor: raise per quiet period, as a fraction of the budget",
     &C::oom_increase_step},
    {"max_preemptions", "memory",
     "OOM recovery (memory, fixed): times one request may be preempted (KV cache freed, recomputed later) "
     "before it gets 503",
     &C::max_preemptions},
    {"kv_pool", "memory",
     "on: with admission memory and one language model on a device, its budget is allocated at start as a pool "
     "of KV cache blocks (no fragmentation, prefix cache, reservations on demand); off: each sequence allocates "
     "its worst-case KV cache when it starts and frees it when it ends, so memory the server does not use stays "
     "free for other processes on the device",
     &C::kv_pool},
    {"kv_reservation", "memory",
     "KV cache blocks a sequence reserves (admission memory, one language model on its device): on-demand (its "
     "prompt plus the output length recent answers had; one more block as it grows, preempting the youngest "
     "when none is left) or full (prompt + max_tokens up front, never preempted for blocks)",
     &C::kv_reservation},
    {"kv_block_tokens", "memory", "Positions per KV cache block (the unit of the pool and of each lease)",
     &C::kv_block_tokens},
    {"prefix_cache", "memory",
     "on: a prompt starts from the KV blocks of the longest prefix another request computed (kept until the pool "
     "needs them); off: every prompt is computed in full",
     &C::prefix_cache},
    {"oom_unready_after", "memory",
     "OOM recovery: consecutive out-of-memory steps that mark the device not ready (/ready 503) for one "
     "oom_quiet_period",
     &C::oom_unready_after},

    {"max_bypass", "scheduling", "Seconds a waiting request that does not fit may be passed by later ones that do",
     &C::max_bypass_s},
    {"max_batch", "scheduling",
     "Sequences that run together on a device (TorchScript models: requests in one forward pass); 0: chosen at "
     "start-up, up to 256 where the KV cache is a block pool (docs/admission-and-memory.md), else 8",
     &C::max_batch},
    {"max_batch_delay_ms", "scheduling",
     "TorchScript models: milliseconds a partial batch waits for more requests before it runs", &C::max_batch_delay_ms},
    {"max_n", "scheduling",
     "Most choices one request may ask for (OpenAI n); they run together, so at most --max-batch", &C::max_n},
    {"max_batch_tokens", "scheduling",
     "Tokens processed in one step (prefill chunks + one per decoding sequence); longer prompts are prefilled "
     "in chunks",
     &C::max_batch_tokens},
    {"prefill_worker", "scheduling",
     "Disaggregated prefill: a second compute thread per device prefills new prompts while decode steps run, "
     "so time to first token is one prefill rather than a decode step plus a prefill; two steps may then run at "
     "once, so twice the step workspace is set aside",
     &C::prefill_worker},
    {"max_queue", "scheduling",
     "Requests that may wait for admission in one queue: each engine process has its own; with --in-process or "
     "--one-engine one queue serves every device (more -> 503 overloaded)",
     &C::max_queue},
    {"queue_timeout", "scheduling", "Longest wait in the queue in seconds (-> 503 overloaded with Retry-After)",
     &C::queue_timeout_s},
    {"request_timeout", "scheduling",
     "Total deadline per request in seconds (-> 504); a request's \"timeout\" field may lower it",
     &C::request_timeout_s},
    {"retry_bookings", "scheduling",
     "on: a request refused as overloaded (queue full, queue wait limit) books a place for its retry at the "
     "promised time (Retry-After, retry-after-ms, X-Retry-Token); off: whole-second estimates, nothing booked",
     &C::retry_bookings},
    {"max_retry_bookings", "scheduling", "Booked retry places held at once (a client holds at most its share)",
     &C::max_retry_bookings},
    {"retry_early", "scheduling",
     "Seconds a booked retry may arrive before its promised time (earlier -> 503 with the time left)",
     &C::retry_early_s},
    {"retry_grace", "scheduling", "Seconds after its promised time a booked place is held for the retry",
     &C::retry_grace_s},
    {"max_retry_after", "scheduling", "Longest promise in seconds: a refusal expecting longer books nothing",
     &C::max_retry_after_s},
    {"shutdown_grace", "scheduling", "On SIGINT/SIGTERM: seconds in-flight work may finish before it is cancelled",
     &C::shutdown_grace_s},

    {"api_keys", "traffic",
     "File of API keys, one a line (\"KEY [rate=R] [burst=B] [priority=low|normal|high]\", # comments); when "
     "set, requests need Authorization: Bearer KEY (else 401); /health and /ready stay open",
     &C::api_keys, ConfigValue::kPath},
    {"metrics_auth", "traffic", "With api_keys: GET /metrics needs a key too", &C::metrics_auth},
    {"rate_limit", "traffic",
     "Work requests (POST completions, chat, /infer, /v2 infer) per second per API key (or client address without "
     "keys); more -> 429; 0 = off",
     &C::rate_limit},
    {"rate_burst", "traffic", "Token bucket size for rate_limit (requests); 0 = max(1, rate_limit)", &C::rate_burst},
    {"trusted_proxy", "traffic",
     "Proxy whose X-Forwarded-For names the client (address or CIDR range like 10.0.0.0/8); may be given several "
     "times (or comma-separated; in the file an array of strings). Without API keys the client address is then "
     "the one rate limits and retry booking shares count by; none: X-Forwarded-For is ignored",
     &C::trusted_proxy},
    {"priority_aging", "traffic",
     "Seconds after which a queued request counts as high priority, so low ones cannot starve (0 = FIFO)",
     &C::priority_aging_s},
    {"idempotency_ttl", "traffic",
     "Seconds a finished request's result is replayed to a retry with the same Idempotency-Key", &C::idempotency_ttl_s},

    {"log_level", "operability", "trace, debug, info, warn, error or off", &C::log_level},
    {"log_request_text", "operability",
     "Include prompt and output text in the per-request log lines (off: counts only)", &C::log_request_text},
    {"watchdog_timeout", "operability", "Seconds an engine step may run before /health reports the engine stuck (503)",
     &C::watchdog_timeout_s},
    {"profile_steps", "operability",
     "Step profile: record a trace of this many decode steps (steps without a prefill chunk) of the first device's "
     "engine and write it to --profile-trace as Chrome-trace JSON; 0 = off",
     &C::profile_steps},
    {"profile_min_batch", "operability",
     "Step profile: only decode steps with at least this many running sequences are recorded (the trace covers the "
     "first --profile-steps of them)",
     &C::profile_min_batch},
    {"profile_trace", "operability",
     "Step profile: the file the trace is written to (needed when --profile-steps is above 0; its folder must exist)",
     &C::profile_trace, ConfigValue::kPath},

    {"in_process", "processes",
     "Run HTTP and the engines in one process (no engine processes, no supervisor): for debugging, and where "
     "fork/exec is not possible; a crash in the model code then takes the HTTP side with it",
     &C::in_process},
    {"engine", "processes",
     "An engine process to serve from, unix:PATH (started with vramgate engine --listen unix:PATH; its secret is "
     "read from PATH.secret); may be given several times; none: serve starts and supervises its engine processes",
     &C::engine},
    {"one_engine", "processes",
     "Start one engine process for all --devices instead of one per device: one admission queue over them, but a "
     "crash then stops every device (off: a process per device, each with its own queue and --max-queue; the "
     "gateway sends each request to the engine with the most free budget and moves a waiting one to the engine "
     "where room frees first)",
     &C::one_engine},
    {"runtime_dir", "processes",
     "Folder (mode 0700) for the sockets and secrets of the engines serve starts; empty: $XDG_RUNTIME_DIR/vramgate, "
     "else /tmp/vramgate-UID. A serve that finds its engines running there with the same settings re-attaches",
     &C::runtime_dir, ConfigValue::kPath},
    {"engine_heartbeat_timeout", "processes",
     "Seconds a connected engine may send nothing (it heartbeats 4 times a second) before it counts as hung and "
     "is killed and restarted",
     &C::engine_heartbeat_timeout_s},
    {"max_crash_retries", "processes",
     "Engine crashes while a request runs after which that request is taken as the cause: it ends with 500 "
     "engine_crashed instead of being resumed again",
     &C::max_crash_retries},
    {"orphan_timeout", "processes",
     "Seconds an engine process with no gateway connected keeps its model loaded before it exits",
     &C::orphan_timeout_s},
    {"keep_engines", "processes",
     "On shutdown, leave the engine processes serve started running (the next serve re-attaches without "
     "loading the weights again); off: they exit once no gateway uses them",
     &C::keep_engines},

    {"queue", "queue",
     "Redis mode: redis://[USER[:PASSWORD]@]HOST[:PORT][/DB] of a Redis shared by every gateway; the rate "
     "limits are then token buckets there, one per key or address for all gateways together. Empty: off. Put the "
     "password in --queue-password-file or VRAMGATE_QUEUE_PASSWORD rather than here (ps shows the command line)",
     &C::queue},
    {"queue_password_file", "queue",
     "File holding the password of --queue's Redis user (one line; the URL then has none)", &C::queue_password_file,
     ConfigValue::kPath},
    {"queue_command_timeout", "queue",
     "Seconds each Redis round trip may take; a request whose rate limit Redis does not answer in time gets 503 "
     "overloaded with Retry-After",
     &C::queue_command_timeout_s},
    {"claim_idle", "queue",
     "Seconds after which a request an engine took from the shared queue, and no longer keeps alive (it died or "
     "stalled), is claimed by another engine of the model, which resumes it after the tokens already sent",
     &C::claim_idle_s},
    {"gateway_only", "queue",
     "With --queue: start no engine here; completions go through the shared queue to the engines that pull from it "
     "(`vramgate engine --queue`), and this gateway loads nothing",
     &C::gateway_only},

    {"test_step_delay_ms", "test", "Test hook: sleep this many ms after every engine step", &C::test_step_delay_ms},
    {"test_inject_oom_step", "test", "Test hook: the engine step with this number (from 1) fails with out-of-memory",
     &C::test_inject_oom_step},
    {"test_inject_oom_count", "test", "Test hook: this many consecutive steps from test_inject_oom_step fail",
     &C::test_inject_oom_count},
    {"test_leak_bytes_on_oom", "test",
     "Test hook: bytes each out-of-memory recovery leaves allocated on the device until exit, a planted leak for "
     "the checks that must find one",
     &C::test_leak_bytes_on_oom},
    {"test_crash_on_prompt", "test",
     "Test hook: an engine process aborts when a request whose prompt contains this text starts running",
     &C::test_crash_on_prompt},
    {"test_engine_crash_at_start", "test", "Test hook: an engine process aborts before it loads its model",
     &C::test_engine_crash_at_start},
    {"test_emulate_cuda_graphs", "test",
     "Test hook: record decode graphs as on a CUDA device, emulated (a replay runs the recorded step again), "
     "where a CPU device runs the tensor path (needs --host-kernels off; --cuda-graphs off wins)",
     &C::test_emulate_cuda_graphs},
    {"test_poison_logits_step", "test",
     "Test hook: this engine step (from 1) counts as producing NaN logits (an engine process then exits to be "
     "restarted)",
     &C::test_poison_logits_step},
    {"test_device_fault_step", "test",
     "Test hook: this engine step (from 1) fails with a CUDA fault (an illegal memory access; virtual devices "
     "only), which poisons the engine (an engine process then exits to be restarted)",
     &C::test_device_fault_step},
    {"test_foreign_bytes", "test",
     "Test hook: another process takes device memory: STEP=SIZE,... at engine steps (SIZE 0 frees it), or "
     "file:PATH, a file whose byte size is read at every engine turn",
     &C::test_foreign_bytes},
    {"test_trim_heap", "test",
     "Test hook: GET /v1/admission first returns free heap memory to the OS (malloc_trim), so that RSS "
     "measurements compare live memory (tools/soak.py)",
     &C::test_trim_heap},
};

}  // namespace

std::span<const ConfigField> config_fields() { return kFields; }

const ConfigField* find_config_field(const std::string& key) {
  auto fields = config_fields();
  auto it = std::find_if(fields.begin(), fields.end(), [&](const ConfigField& f) { return key == f.key; });
  return it == fields.end() ? nullptr : &*it;
}

std::string flag_name(const std::string& key) {
  std::string flag = "--" + key;
  std::replace(flag.begin(), flag.end(), '_', '-');
  return flag;
}

void copy_config_field(const ConfigField& field, const ServeConfig& from, ServeConfig& to) {
  std::visit([&](auto member) { to.*member = from.*member; }, field.member);
}

}  // namespace vg
