#!/usr/bin/python3
"""vramgate against Hugging Face transformers on one GPU, on random-weight
checkpoints written at start: a 12-layer, 768-wide byte-level GPT-2 in
float32 and in bfloat16, and a LLaMA of 1.1 B parameters (22 layers, hidden
2048, 32 heads, 4 KV heads) in bfloat16.

For each model one `vramgate serve --device cuda:0 --max-batch 64` answers a
round of 1, 16 and 64 concurrent clients (one non-streaming completion each:
32-token prompt, 128 tokens, greedy, ignore_eos): generated tokens/s over the
round's wall time, and ms per step from the server's /metrics (mean time
between tokens). Then, when transformers imports, the same checkpoint through
`generate()` at batch 1, 16 and 64 (greedy, exactly 128 new tokens), the
greedy ids of the first prompt against vramgate's (k of 128 equal), and the
design peer: one generate() per request behind a semaphore of 4, 16 requests,
on the float32 GPT-2. Also the device copy bandwidth (bytes read + written
per s) and each model's floor, weights bytes / bandwidth in ms per step; and a
step profile (`--profile-steps 20 --profile-min-batch B --profile-trace`, one
extra round at 1 and at the largest client count, each on a server of its
own): top GPU kernels and host ops by total time, kernel launches per step.

Writes one JSON file with every figure and each round's raw data
(--out-json) and a Markdown report (--report). Work that would not fit in
--time-budget-s is skipped and listed as skipped.

    bench/gpu.py --binary build/gpu-check/vramgate --out-json gpu.json --report gpu.md
    bench/gpu.py --virtual --binary build/release/vramgate --out-json /tmp/g.json --report /tmp/g.md

--virtual runs the same code paths small, on a virtual device: a 2-layer,
64-wide GPT-2 (float32, bfloat16) and a 2-layer LLaMA (bfloat16), 1 and 4
clients, 32-token completions; the Hugging Face and bandwidth parts are
skipped with their reason. Standard library only, until torch (checkpoints,
bandwidth) and transformers (baselines) are needed.
"""
import argparse
import collections
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tools"))
sys.path.insert(0, HERE)
from server_process import ServerProcess, http_json  # noqa: E402
import gpu_report  # noqa: E402
from gpu_trace import load_events, parse_trace  # noqa: E402

PROFILE_FLAGS = ("--profile-steps", "--profile-min-batch", "--profile-trace")
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
CHECKPOINTS = {
    "gpu": {
        "gpt2-12x768": {"family": "gpt2", "layers": 12, "heads": 12, "embd": 768, "positions": 1024, "vocab": 257},
        "llama-1.1b": {"family": "llama", "layers": 22, "hidden": 2048, "heads": 32, "kv_heads": 4,
                       "intermediate": 5632, "vocab": 32000, "positions": 2048},
    },
    "virtual": {
        "gpt2-2x64": {"family": "gpt2", "layers": 2, "heads": 4, "embd": 64, "positions": 256, "vocab": 257},
        "llama-2x64": {"family": "llama", "layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2,
                       "intermediate": 160, "vocab": 300, "positions": 256},
    },
}
# The peer runs on the first model; every model gets the agreement check.
MODELS = {
    "gpu": [("gpt2-12x768", "float32"), ("gpt2-12x768", "bfloat16"), ("llama-1.1b", "bfloat16")],
    "virtual": [("gpt2-2x64", "float32"), ("gpt2-2x64", "bfloat16"), ("llama-2x64", "bfloat16")],
}
# Rough seconds each piece of work takes on an H200; the virtual mode's are a quarter.
ESTIMATE_S = {"checkpoint": 15, "server": 20, "round": 8, "hf": 30, "peer": 25, "profile": 30}


class Budget:
    """Wall-clock seconds left for the run; records what it refuses."""

    def __init__(self, seconds, scale):
        self.t0 = time.monotonic()
        self.seconds = seconds
        self.scale = scale
        self.skipped = []

    def elapsed(self):
        return time.monotonic() - self.t0

    def left(self):
        return self.seconds - self.elapsed()

    def allows(self, what, kind, count=1):
        """True when about `count` x ESTIMATE_S[kind] seconds are left; else
        records `what` as skipped."""
        need = ESTIMATE_S[kind] * self.scale * count
        if self.left() >= need:
            return True
        self.skipped.append({"what": what, "reason": f"time budget: {max(0.0, self.left()):.0f} s left of "
                                                      f"{self.seconds:.0f}, needs about {need:.0f} s"})
        return False


# ---- HTTP ----

def scrape_metrics(url):
    """Unlabelled and labelled samples of /metrics: {"name{labels}": value}."""
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=30) as r:
            text = r.read().decode()
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            try:
                out[name] = float(value)
            except ValueError:
                pass
    return out


def step_figures(before, after, wall_s):
    """Engine steps in a round from the /metrics deltas: steps, mean batch,
    ms per step (mean time between a sequence's tokens) and wall ms per step."""
    d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in
         ("vramgate_batch_size_count", "vramgate_batch_size_sum",
          "vramgate_inter_token_latency_seconds_sum", "vramgate_inter_token_latency_seconds_count")}
    steps = int(d["vramgate_batch_size_count"])
    itl_n = d["vramgate_inter_token_latency_seconds_count"]
    return {"steps": steps,
            "mean_batch": d["vramgate_batch_size_sum"] / steps if steps else None,
            "ms_per_step": 1000.0 * d["vramgate_inter_token_latency_seconds_sum"] / itl_n if itl_n else None,
            "ms_per_step_wall": 1000.0 * wall_s / steps if steps else None}


# ---- prompts and token ids ----

def prompts_for(spec, count, length, seed=7):
    """`count` prompts of `length` token ids: lowercase letters for the
    byte-level GPT-2 (one byte = one token), ids from 3 up for LLaMA."""
    rng = random.Random(seed)
    if spec["family"] == "gpt2":
        return [[rng.randrange(97, 123) for _ in range(length)] for _ in range(count)]
    return [[rng.randrange(3, spec["vocab"]) for _ in range(length)] for _ in range(count)]


def token_id(token, eos_id):
    """The id of one completions-logprobs token string: " 123" (a model
    served through token ids), "bytes:\\xNN" or one character (byte-level),
    "" (end-of-text, which has no bytes)."""
    if token == "":
        return eos_id
    if token.startswith("bytes:\\x") and len(token) == 10:
        return int(token[8:], 16)
    if len(token) > 1 and token[0] == " " and token[1:].isdigit():
        return int(token[1:])
    raw = token.encode()
    return raw[0] if len(raw) == 1 else None


def agreement(a, b):
    """Positions where two id lists agree: {equal, of, first_difference}."""
    n = min(len(a), len(b))
    diff = next((i for i in range(n) if a[i] != b[i]), None)
    return {"equal": sum(1 for i in range(n) if a[i] == b[i]), "of": max(len(a), len(b)), "first_difference": diff}


# ---- servers and rounds ----

def serve(args, folder, dtype, profile=None):
    """A started `vramgate serve` on 127.0.0.1 for one model; `profile` =
    (steps, min_batch, trace_path) adds the step-profile flags."""
    argv = [args.binary, "serve", "--host", "127.0.0.1", "--port", "0", "--device", args.device,
            "--model-dir", folder, "--dtype", dtype, "--threads", str(args.threads), "--max-batch", "64",
            "--max-queue", "256", *args.server_arg]
    if profile:
        argv += ["--profile-steps", str(profile[0]), "--profile-min-batch", str(profile[1]),
                 "--profile-trace", profile[2]]
    env = dict(os.environ)
    if not args.virtual:
        env.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    return ServerProcess(argv, env=env, start_timeout=300, ready_timeout=300, keep_lines=400)


def completion_body(model_id, prompt, max_tokens, **extra):
    return dict({"model": model_id, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                 "ignore_eos": True}, **extra)


def run_round(url, model_id, prompts, clients, max_tokens, timeout):
    """`clients` threads, each one non-streaming completion, released together.
    Returns the round's figures: tokens, wall_s, tokens_per_s, statuses,
    latencies (s), and the step figures from /metrics."""
    results = [None] * clients
    start = threading.Barrier(clients + 1)

    def client(i):
        body = completion_body(model_id, prompts[i % len(prompts)], max_tokens)
        start.wait()
        t0 = time.perf_counter()
        status, reply = http_json(url + "/v1/completions", body, timeout)
        tokens = (reply or {}).get("usage", {}).get("completion_tokens", 0) if status == 200 else 0
        results[i] = {"status": status, "tokens": tokens, "latency_s": time.perf_counter() - t0,
                      "error": None if status == 200 else (reply or {}).get("error")}

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    before = scrape_metrics(url)
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    return round_record(clients, results, wall, before, scrape_metrics(url))


def round_record(clients, results, wall, before, after):
    tokens = sum(r["tokens"] for r in results)
    lat = sorted(r["latency_s"] for r in results)
    return dict({"clients": clients, "requests": len(results),
                 "ok": sum(1 for r in results if r["status"] == 200),
                 "statuses": dict(collections.Counter(str(r["status"]) for r in results)),
                 "tokens": tokens, "wall_s": wall, "tokens_per_s": tokens / wall if wall > 0 else 0.0,
                 "latency_s": {"min": lat[0], "median": statistics.median(lat), "max": lat[-1]},
                 "errors": [r["error"] for r in results if r["error"]][:3]}, **step_figures(before, after, wall))


def vramgate_greedy(url, model_id, prompt, max_tokens, eos_id, timeout):
    """vramgate's greedy token ids for one prompt (from logprobs tokens)."""
    status, reply = http_json(url + "/v1/completions",
                              completion_body(model_id, prompt, max_tokens, logprobs=0), timeout)
    if status != 200:
        return None
    return [token_id(t, eos_id) for t in reply["choices"][0]["logprobs"]["tokens"]]


def wait_for_trace(path, deadline_s):
    """True once `path` holds a whole Chrome trace; polls until the deadline."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if load_events(path) is not None:
            return True
        time.sleep(0.1)  # polls for the trace file, with a deadline
    return False


def request_timeout(args, budget):
    """Seconds one HTTP request may take: --request-timeout, cut to the budget
    left plus half a minute."""
    return min(args.request_timeout, max(30.0, budget.left() + 30.0))


def profile_spec(args, work, key, clients):
    """(steps, min batch, trace path) of one profile."""
    folder = args.trace_dir or os.path.join(work, "traces")
    os.makedirs(folder, exist_ok=True)
    name = f"{key.replace('/', '-')}-c{clients}.json"
    return (args.profile_steps, clients, os.path.abspath(os.path.join(folder, name)))


def profile_entry(rnd, spec):
    return {"clients": spec[1], "steps_asked": spec[0], "trace": spec[2], "round": rnd}


def vramgate_model(args, ctx, key, folder, dtype, spec):
    """The main server of one model: the 1-client profile round first (when the
    build has the flags), then one measured round per client count, then
    vramgate's greedy ids of the first prompt."""
    budget, prompts = ctx["budget"], ctx["prompts"][spec["name"]]
    prof = profile_spec(args, ctx["work"], key, 1) if ctx["profile_ok"] else None
    out = {"rounds": [], "profiles": {}}
    server = serve(args, folder, dtype, prof)
    try:
        out["served"] = http_json(server.url + "/v1/models")[1]["data"][0]
        model_id = out["served"]["id"]
        if prof:
            out["profiles"]["1"] = profile_entry(run_round(server.url, model_id, prompts, 1, args.max_tokens,
                                                           request_timeout(args, budget)), prof)
            wait_for_trace(prof[2], 5)  # written at its last step, before the measured rounds
        for c in args.clients:
            if budget.allows(f"{key}: vramgate round at {c} clients", "round"):
                out["rounds"].append(run_round(server.url, model_id, prompts, c, args.max_tokens,
                                               request_timeout(args, budget)))
        out["greedy_ids"] = vramgate_greedy(server.url, model_id, prompts[0], args.max_tokens,
                                            spec["vocab"] - 1 if spec["family"] == "gpt2" else 2,
                                            request_timeout(args, budget))
    finally:
        server.stop()
    return out


def profile_server(args, ctx, key, folder, dtype, spec, clients):
    """A server of its own that profiles the first steps of batch >= `clients`,
    and one round at `clients` whose completions are longer by 4 x the
    profiled steps: the clients' requests reach the engine over several steps,
    and the steps all of them decode in must still number at least that many."""
    prof = profile_spec(args, ctx["work"], key, clients)
    server = serve(args, folder, dtype, prof)
    try:
        model_id = http_json(server.url + "/v1/models")[1]["data"][0]["id"]
        rnd = run_round(server.url, model_id, ctx["prompts"][spec["name"]], clients,
                        args.max_tokens + 4 * args.profile_steps, request_timeout(args, ctx["budget"]))
    finally:
        server.stop()
    return profile_entry(rnd, prof)


# ---- checkpoints ----

def write_checkpoint(args, ctx, name, spec):
    """Writes checkpoint `name` under the work folder; returns {folder, seconds,
    note} (a GPT-2 that cannot be written falls back to models/tinylm)."""
    folder = os.path.join(ctx["work"], name)
    t0 = time.perf_counter()
    if spec["family"] == "gpt2":
        cmd = [sys.executable, os.path.join(ROOT, "tools", "make_random_gpt2.py"), "--out", folder, "--seed", "1",
               "--layers", str(spec["layers"]), "--heads", str(spec["heads"]), "--embd", str(spec["embd"]),
               "--positions", str(spec["positions"]), "--vocab", str(spec["vocab"]), "--prefix", "transformer."]
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if run.returncode != 0:
            return {"folder": os.path.join(ROOT, "models", "tinylm"), "seconds": time.perf_counter() - t0,
                    "note": "make_random_gpt2.py failed, models/tinylm instead: " + run.stderr.strip()[-300:]}
        return {"folder": folder, "seconds": time.perf_counter() - t0, "note": None}
    tt = ctx["torch"]
    if tt is None:
        return {"folder": None, "seconds": 0.0, "note": "torch not importable: " + ctx["torch_why"]}
    made = tt.write_llama(folder, spec, "cpu" if args.virtual else args.torch_device)
    return dict(made, folder=folder, note=None)


# ---- stages ----

def bandwidth_stage(args, ctx):
    if args.virtual:
        return {"skipped": "virtual device: no device memory to measure"}
    if ctx["torch"] is None:
        return {"skipped": ctx["torch_why"]}
    try:
        return ctx["torch"].copy_bandwidth(args.torch_device)
    except Exception as e:  # no floor then, with the reason
        return {"skipped": f"copy failed: {type(e).__name__}: {str(e)[-300:]}"}


def hf_stage(args, ctx, results):
    """Hugging Face on each model, while the budget lasts."""
    why = hf_unavailable(args, ctx)
    for i, (name, dtype) in enumerate(ctx["models"]):
        key = f"{name}/{dtype}"
        entry = results[key]
        if why or entry.get("folder") is None:
            entry["hf"] = {"skipped": why or "no checkpoint"}
            continue
        if not ctx["budget"].allows(f"{key}: Hugging Face", "hf"):
            entry["hf"] = {"skipped": "time budget"}
            continue
        peer = {"requests": args.peer_requests, "concurrency": args.peer_concurrency} if i == 0 else None
        keep_going = lambda: ctx["budget"].left() > ESTIMATE_S["round"] * ctx["budget"].scale  # noqa: E731
        try:
            entry["hf"] = ctx["torch"].hf_bench(entry["folder"], dtype, args.torch_device,
                                                ctx["prompts"][name], args.clients, args.max_tokens, keep_going,
                                                peer=peer)
        except Exception as e:  # a baseline that fails is reported, not fatal
            entry["hf"] = {"error": f"{type(e).__name__}: {str(e)[-500:]}"}
        for what in entry["hf"].get("skipped", []):
            ctx["budget"].skipped.append({"what": f"{key}: Hugging Face {what}", "reason": "time budget"})


def hf_unavailable(args, ctx):
    if args.virtual:
        return "virtual device: the Hugging Face baseline runs on the GPU only"
    if args.skip_hf:
        return "--skip-hf"
    if ctx["torch"] is None:
        return ctx["torch_why"]
    return ctx["torch"].transformers_version()[1]


def vramgate_stage(args, ctx, results):
    budget = ctx["budget"]
    for name, dtype in ctx["models"]:
        key = f"{name}/{dtype}"
        entry = results[key]
        if entry.get("folder") is None:
            continue
        if not budget.allows(f"{key}: vramgate server", "server"):
            continue
        try:
            entry["vramgate"] = vramgate_model(args, ctx, key, entry["folder"], dtype, ctx["specs"][name])
        except Exception as e:  # one model that cannot serve does not stop the others
            entry["vramgate"] = {"error": f"{type(e).__name__}: {str(e)[-1500:]}", "rounds": [], "profiles": {}}


def profile_stage(args, ctx, results):
    """The largest-client-count profile of each model, on its own server."""
    top = max(args.clients)
    for name, dtype in ctx["models"]:
        key = f"{name}/{dtype}"
        entry = results[key]
        vg = entry.get("vramgate")
        if not ctx["profile_ok"] or not vg or vg.get("error") or top == 1:
            continue
        if not ctx["budget"].allows(f"{key}: profile at {top} clients", "profile"):
            continue
        try:
            vg["profiles"][str(top)] = profile_server(args, ctx, key, entry["folder"], dtype,
                                                      ctx["specs"][name], top)
        except Exception as e:  # reported with the profile
            vg["profiles"][str(top)] = {"clients": top, "error": f"{type(e).__name__}: {str(e)[-800:]}"}


def checkpoint_stage(args, ctx, results):
    folders = {}
    for name, dtype in ctx["models"]:
        if name not in folders and ctx["budget"].allows(f"checkpoint {name}", "checkpoint"):
            try:
                folders[name] = write_checkpoint(args, ctx, name, ctx["specs"][name])
            except Exception as e:  # the models of this checkpoint are left out, with the reason
                folders[name] = {"folder": None, "note": f"writing failed: {type(e).__name__}: {str(e)[-300:]}"}
        made = folders.get(name, {"folder": None, "note": "time budget"})
        results[f"{name}/{dtype}"] = {"checkpoint": name, "dtype": dtype, "family": ctx["specs"][name]["family"],
                                      "spec": ctx["specs"][name], "folder": made["folder"], "written": made}


# ---- figures computed from the stages ----

def finish(results, bandwidth, profile_ok):
    """Adds to each model: the traces' summaries, the greedy agreement and the
    bandwidth floor."""
    for entry in results.values():
        vg = entry.get("vramgate") or {}
        for prof in vg.get("profiles", {}).values():
            if "trace" in prof:
                prof["summary"] = parse_trace(prof["trace"])
        hf_ids = (entry.get("hf") or {}).get("greedy_ids")
        if vg.get("greedy_ids") and hf_ids:
            entry["agreement"] = agreement(vg["greedy_ids"], hf_ids)
        entry["floor"] = floor(entry, bandwidth)
        if not profile_ok:
            entry["profile"] = "profile: flags not supported by this build"


def floor(entry, bandwidth):
    """Weights bytes (parameters x dtype bytes) / copy bandwidth, in ms per step."""
    served = (entry.get("vramgate") or {}).get("served")
    bps = (bandwidth or {}).get("bytes_per_s")
    if not served or not bps:
        return None
    weights = served["parameter_count"] * DTYPE_BYTES.get(entry["dtype"], 4)
    return {"weights_bytes": weights, "resident_bytes": served.get("resident_bytes"),
            "floor_ms_per_step": 1000.0 * weights / bps}


# ---- main ----

def profile_flags_supported(binary):
    """True when `binary serve --help` lists every step-profile flag."""
    try:
        text = subprocess.run([binary, "serve", "--help"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return all(f in text for f in PROFILE_FLAGS)


def load_torch(args):
    """(gpu_torch module, None) or (None, why torch cannot be used)."""
    try:
        import gpu_torch
    except Exception as e:  # no torch: the parts that need it are skipped with this reason
        return None, f"torch not importable: {type(e).__name__}: {e}"
    if not args.virtual and not gpu_torch.torch.cuda.is_available():
        return None, f"torch {gpu_torch.torch.__version__} sees no GPU"
    return gpu_torch, None


def machine(args, ctx):
    info = {"host": platform.node(), "python": platform.python_version(), "cpus": os.cpu_count(),
            "device": args.device, "binary": os.path.abspath(args.binary)}
    if ctx["torch"] is not None:
        info.update(ctx["torch"].machine_info("cpu" if args.virtual else args.torch_device))
    else:
        info["torch_unavailable"] = ctx["torch_why"]
    return info


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", required=True, help="the vramgate executable")
    ap.add_argument("--out-json", required=True, help="JSON file to write (every figure, raw rounds)")
    ap.add_argument("--report", help="Markdown report to write")
    ap.add_argument("--virtual", action="store_true", help="small run on a virtual device (no GPU)")
    ap.add_argument("--device", help="vramgate --device (default cuda:0; --virtual: virt:0=1GiB)")
    ap.add_argument("--clients", help="client counts, comma-separated (default 1,16,64; --virtual: 1,4)")
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, help="tokens per completion (default 128; --virtual: 32)")
    ap.add_argument("--threads", type=int, help="vramgate --threads (default 4; --virtual: 1)")
    ap.add_argument("--profile-steps", type=int, default=20, help="decode steps each profile traces")
    ap.add_argument("--peer-requests", type=int, default=16)
    ap.add_argument("--peer-concurrency", type=int, default=4)
    ap.add_argument("--models", help="checkpoint/dtype pairs to run, comma-separated (default all)")
    ap.add_argument("--skip-hf", action="store_true", help="leave out the Hugging Face baselines")
    ap.add_argument("--time-budget-s", type=float, help="wall-clock budget (default 240; --virtual: 50)")
    ap.add_argument("--request-timeout", type=float, default=300, help="seconds per HTTP request")
    ap.add_argument("--work-dir", help="folder for checkpoints and traces (default: a temporary one, removed)")
    ap.add_argument("--trace-dir", help="folder to keep the profile traces in (default: the work folder)")
    ap.add_argument("--server-arg", action="append", default=[], help="extra `serve` flag (repeatable)")
    args = ap.parse_args(argv)
    v = args.virtual
    args.device = args.device or ("virt:0=1GiB" if v else "cuda:0")
    args.torch_device = "cpu" if v else args.device
    args.clients = [int(c) for c in (args.clients or ("1,4" if v else "1,16,64")).split(",")]
    args.max_tokens = args.max_tokens or (32 if v else 128)
    args.threads = args.threads or (1 if v else 4)
    args.time_budget_s = args.time_budget_s or (50.0 if v else 240.0)
    return args


def context(args, work):
    mode = "virtual" if args.virtual else "gpu"
    specs = {n: dict(s, name=n) for n, s in CHECKPOINTS[mode].items()}
    models = MODELS[mode]
    if args.models:
        wanted = args.models.split(",")
        models = [m for m in models if f"{m[0]}/{m[1]}" in wanted]
    tt, why = load_torch(args)
    count = max(max(args.clients), args.peer_requests)
    return {"budget": Budget(args.time_budget_s, 0.25 if args.virtual else 1.0), "work": work, "specs": specs,
            "models": models, "torch": tt,
            "torch_why": why, "profile_ok": profile_flags_supported(args.binary),
            "prompts": {n: prompts_for(s, count, args.prompt_tokens) for n, s in specs.items()}}


def run(args, work):
    ctx = context(args, work)
    data = {"mode": "virtual" if args.virtual else "gpu", "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "time_budget_s": args.time_budget_s, "machine": machine(args, ctx),
            "settings": {"clients": args.clients, "prompt_tokens": args.prompt_tokens,
                         "max_tokens": args.max_tokens, "threads": args.threads, "max_batch": 64,
                         "profile_steps": args.profile_steps, "server_args": args.server_arg,
                         "peer": {"requests": args.peer_requests, "concurrency": args.peer_concurrency}},
            "profile_support": {"supported": ctx["profile_ok"],
                                "note": None if ctx["profile_ok"] else "profile: flags not supported by this build"}}
    results = {}
    data["bandwidth"] = bandwidth_stage(args, ctx)
    checkpoint_stage(args, ctx, results)
    vramgate_stage(args, ctx, results)
    hf_stage(args, ctx, results)
    profile_stage(args, ctx, results)
    finish(results, data["bandwidth"], ctx["profile_ok"])
    data.update(models=results, skipped=ctx["budget"].skipped, elapsed_s=ctx["budget"].elapsed())
    return data


def main(argv=None):
    args = parse_args(argv)
    work = args.work_dir or tempfile.mkdtemp(prefix="vg-gpu-bench-")
    os.makedirs(work, exist_ok=True)
    try:
        data = run(args, work)
    finally:
        if not args.work_dir:
            shutil.rmtree(work, ignore_errors=True)
    with open(args.out_json, "w") as f:
        json.dump(data, f, indent=1)
    if args.report:
        with open(args.report, "w") as f:
            f.write(gpu_report.markdown(data, args.out_json))
    print(gpu_report.summary_lines(data), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
