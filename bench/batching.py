#!/usr/bin/python3
"""Continuous batching vs one-at-a-time on the same build and traffic.

Closed loop: C clients (C = 1, 4, 16, 32) each stream completions back to back
(generated lengths drawn from [max_tokens/2, 3*max_tokens/2] with a fixed
seed, end-of-text ignored, so every mode does exactly the same work and
clients do not fall into lock-step waves); about --requests requests per level,
split evenly over the clients. Three server modes, each its own server from the
same binary, in one run:

    batched                  --max-batch 32 (continuous batching)
    batched_prefill_worker   --max-batch 32 --prefill-worker (new prompts are
                             prefilled on a second compute thread while decode
                             steps run)
    one_at_a_time            --max-batch 1

Measures aggregate decode tokens/s and time to first token (p50, p99) over
all requests, over the steady-state requests (each client's first request
left out) and over the start-up burst (each client's first request: all of
them leave at the same instant), and writes a JSON and a Markdown report.

    bench/batching.py --binary build/release/vramgate --out bench/reports/batching-tinylm
    bench/batching.py --modes batched,one_at_a_time --levels 1,4 --requests 8 --out /tmp/batching-smoke

A larger model makes each decode step weigh more than its fixed overheads,
as on real deployments; a random GPT-2 of 6 layers x 512 does:

    /usr/bin/python3 tools/make_random_gpt2.py --out /tmp/gpt2-6x512 --seed 3 \\
        --layers 6 --heads 8 --embd 512 --positions 256
    bench/batching.py --model-dir /tmp/gpt2-6x512 --out bench/reports/batching-6x512

`--nice -10` (needs root) puts the runner, its load generator and the servers
it starts ahead of other work on a shared machine (see common.raise_priority).
"""
import argparse
import json
import os
import subprocess
import time

from common import PROMPTS, Server, closed_loop, percentile, raise_priority, split_outcomes, stream_completion

# mode -> (server flags, description for the report); the order is the run order
MODES = {
    "batched": (["--max-batch", "32"], "continuous batching"),
    "batched_prefill_worker": (["--max-batch", "32", "--prefill-worker"],
                               "continuous batching; new prompts are prefilled on a second compute thread "
                               "while decode steps run"),
    "one_at_a_time": (["--max-batch", "1"], "one sequence at a time"),
}
REFERENCE = "one_at_a_time"


def per_client_requests(total, clients):
    """Requests per client so that a level has about `total` requests: an even
    split rounded up, at least 2 (one burst request and one steady one)."""
    return max(2, -(-total // clients))


def ms(seconds):
    return None if seconds is None else 1000 * seconds


def run_level(url, clients, per_client, max_tokens):
    records, wall = closed_loop(url, clients, per_client, max_tokens)
    ok, errors = split_outcomes(records)
    ttft_all = [r["first_token_s"] for r in ok]
    ttft_steady = [r["first_token_s"] for r in ok if not r["first"]]
    ttft_burst = [r["first_token_s"] for r in ok if r["first"]]
    text_steady = [r["ttft_s"] for r in ok if not r["first"]]
    return {"clients": clients, "per_client": per_client, "requests": len(records), "ok": len(ok),
            "errors": errors, "tokens": sum(r["tokens"] for r in ok), "wall_s": wall,
            "tokens_per_s": sum(r["tokens"] for r in ok) / wall,
            "ttft_p50_ms": ms(percentile(ttft_all, 50)),
            "ttft_p99_ms": ms(percentile(ttft_all, 99)),
            "steady_requests": len(ttft_steady),
            "steady_ttft_p50_ms": ms(percentile(ttft_steady, 50)),
            "steady_ttft_p99_ms": ms(percentile(ttft_steady, 99)),
            "burst_requests": len(ttft_burst),
            "burst_ttft_p99_ms": ms(percentile(ttft_burst, 99)),
            "steady_first_text_p99_ms": ms(percentile(text_steady, 99)),
            "first_token_without_text": sum(1 for r in ok if r["ttft_s"] is not None
                                            and r["ttft_s"] > r["first_token_s"])}


def missing_flags(binary, modes):
    """Flags of the chosen modes that `binary serve --help` does not list."""
    text = subprocess.run([binary, "serve", "--help"], capture_output=True, text=True, timeout=60).stdout
    return sorted({(flag, mode) for mode in modes for flag in MODES[mode][0]
                   if flag.startswith("--") and flag not in text})


def fmt(value, digits=1, suffix=""):
    return "n/a" if value is None else f"{value:.{digits}f}{suffix}"


def ratio(a, b):
    return None if a is None or not b else a / b


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default="build/release/vramgate")
    ap.add_argument("--model-dir", default="models/tinylm")
    ap.add_argument("--modes", default=",".join(MODES),
                    help=f"comma list of server modes to run, in this order (of: {', '.join(MODES)})")
    ap.add_argument("--levels", default="1,4,16,32", help="comma list of client counts")
    ap.add_argument("--requests", type=int, default=128,
                    help="requests per level, split evenly over the clients (rounded up, at least 2 per client)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1,
                    help="compute threads of the server (the load generator needs the other core)")
    ap.add_argument("--nice", type=int, default=0,
                    help="niceness for the runner, its load generator, the servers it starts and its session's "
                         "autogroup (negative: ahead of other work on a shared machine; needs root)")
    ap.add_argument("--out", default="bench/reports/batching")
    args = ap.parse_args()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        ap.error(f"--modes: unknown {', '.join(unknown) or '(none given)'}; choose from {', '.join(MODES)}")
    levels = [int(x) for x in args.levels.split(",")]
    if args.requests < 1 or any(c < 1 for c in levels):
        ap.error("--requests and every level must be at least 1")
    missing = missing_flags(args.binary, modes)
    if missing:
        ap.error("; ".join(f"`{args.binary} serve` does not know {flag} (mode {mode})" for flag, mode in missing) +
                 "; leave those modes out with --modes")
    priority = raise_priority(args.nice) if args.nice else "niceness 0"
    common_flags = ["--model-dir", args.model_dir, "--max-queue", "256", "--threads", str(args.threads)]

    load_before = os.getloadavg()
    t_start = time.time()
    results = {}
    for mode in modes:
        server = Server(args.binary, *common_flags, *MODES[mode][0])
        try:
            stream_completion(server.url, {"prompt": "warm up", "max_tokens": 8})
            results[mode] = []
            for c in levels:
                row = run_level(server.url, c, per_client_requests(args.requests, c), args.max_tokens)
                results[mode].append(row)
                print(mode, json.dumps(row), flush=True)
        finally:
            server.stop()
    elapsed = time.time() - t_start
    load_after = os.getloadavg()

    # Ratios: throughput of each batched mode over one-at-a-time at the same
    # level; p99 TTFT of each batched mode over its own single-client p99.
    batched_modes = [m for m in modes if m != REFERENCE]
    ratios = []
    for i, c in enumerate(levels):
        entry = {"clients": c}
        for m in batched_modes:
            row = results[m][i]
            single = results[m][levels.index(1)] if 1 in levels else None
            entry[m] = {
                "tokens_per_s_over_one_at_a_time":
                    ratio(row["tokens_per_s"], results[REFERENCE][i]["tokens_per_s"]) if REFERENCE in modes
                    else None,
                "steady_ttft_p99_over_single_client":
                    ratio(row["steady_ttft_p99_ms"], single["steady_ttft_p99_ms"]) if single else None,
                "ttft_p99_over_single_client":
                    ratio(row["ttft_p99_ms"], single["ttft_p99_ms"]) if single else None,
            }
        ratios.append(entry)

    lo, hi = args.max_tokens // 2, 3 * args.max_tokens // 2
    per_level = ", ".join(f"{c} client{'s' if c > 1 else ''}: {per_client_requests(args.requests, c)} each"
                          for c in levels)
    lines = ["# Continuous batching vs one-at-a-time", "",
             "## Method", "",
             f"- Same binary (`{args.binary}`), model `{args.model_dir}`, same traffic, one run; each mode starts "
             "its own server, sends one warm-up request, then runs the levels in the order "
             f"{', '.join(str(c) for c in levels)} clients.",
             "- Server flags common to every mode: `" + " ".join(common_flags) + f"` ({args.threads} compute "
             f"thread(s)). Machine: {os.cpu_count()} cores (os.cpu_count()), shared by the servers and the load "
             f"generator (this script, one thread per client); {priority}; load average (1 min) "
             f"{load_before[0]:.2f} before, {load_after[0]:.2f} after; {elapsed:.0f} s in all.",
             "- Modes:"]
    for m in modes:
        lines.append(f"  - `{m}`: `{' '.join(MODES[m][0])}` ({MODES[m][1]}).")
    lines += [
        f"- Closed loop: C clients each stream completions back to back (a client sends its next request when "
        f"the previous stream ends). About {args.requests} requests per level, split evenly over the clients "
        f"(rounded up, at least 2 per client; {per_level}).",
        f"- Requests: {len(PROMPTS)} short fixed prompts in rotation; generated lengths drawn from [{lo}, {hi}] "
        "tokens with a fixed seed per client, end-of-text ignored, so every mode gets the same requests with the "
        "same lengths; temperature 0.8 with a fixed seed per request; streaming.",
        "- tok/s: completion tokens of the successful requests over the level's wall time (first request sent "
        "to last stream ended). TTFT: from sending a request to the streamed chunk of its first token, measured "
        "by the client. The server sends that chunk as soon as the token is sampled, with empty text when the "
        "token's bytes do not yet make a whole character (frequent with a random model's tokens); the first chunk "
        "with text comes a decode step or more later for those requests, and its steady p99 is given apart.",
        "- all: every successful request of the level. steady: every successful request except each client's first. "
        "burst: each client's first request; all C of them leave at the same instant, so C prompts arrive "
        "together, which is not steady state (C samples per level).",
        "- Percentiles are nearest-rank over the samples: the p99 of 51 samples or fewer is their maximum.",
        "",
        "## Results", "",
        "| clients | mode | requests (ok) | tok/s | TTFT p50 / p99 all (ms) | TTFT p50 / p99 steady (ms) | "
        "TTFT p99 burst (ms) | first text p99 steady (ms) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for i, c in enumerate(levels):
        for m in modes:
            r = results[m][i]
            errs = "" if not r["errors"] else " " + ", ".join(f"{k}: {v}" for k, v in sorted(r["errors"].items()))
            lines.append(f"| {c} | `{m}` | {r['requests']} ({r['ok']}{errs}) | {r['tokens_per_s']:.0f} | "
                         f"{fmt(r['ttft_p50_ms'])} / {fmt(r['ttft_p99_ms'])} | "
                         f"{fmt(r['steady_ttft_p50_ms'])} / {fmt(r['steady_ttft_p99_ms'])} | "
                         f"{fmt(r['burst_ttft_p99_ms'])} | {fmt(r['steady_first_text_p99_ms'])} |")

    lines += ["", "## Ratios", ""]
    if not batched_modes:
        lines += ["No batched mode was run.", ""]
    else:
        if REFERENCE in modes:
            lines += ["Tokens/s of each batched mode over `one_at_a_time` at the same level:", "",
                      "| clients | " + " | ".join(f"`{m}`" for m in batched_modes) + " |",
                      "| --- |" + " --- |" * len(batched_modes)]
            for e in ratios:
                lines.append(f"| {e['clients']} | " + " | ".join(
                    fmt(e[m]["tokens_per_s_over_one_at_a_time"], 2, "x") for m in batched_modes) + " |")
        else:
            lines.append("Tokens/s over one-at-a-time: not computed (`one_at_a_time` was not run).")
        lines.append("")
        if 1 in levels:
            lines += ["p99 TTFT of each batched mode over the same mode's p99 at 1 client (steady over steady, "
                      "all over all):", "",
                      "| clients | " + " | ".join(f"`{m}` steady | `{m}` all" for m in batched_modes) + " |",
                      "| --- |" + " --- | --- |" * len(batched_modes)]
            for e in ratios:
                lines.append(f"| {e['clients']} | " + " | ".join(
                    f"{fmt(e[m]['steady_ttft_p99_over_single_client'], 2, 'x')} | "
                    f"{fmt(e[m]['ttft_p99_over_single_client'], 2, 'x')}" for m in batched_modes) + " |")
        else:
            lines.append("p99 TTFT over the single-client value: not computed (level 1 was not run).")
        lines.append("")

    method = {"binary": args.binary, "model_dir": args.model_dir, "modes": {m: MODES[m][0] for m in modes},
              "common_flags": common_flags, "threads": args.threads, "cpu_count": os.cpu_count(),
              "levels": levels, "requests_per_level": args.requests,
              "per_client": {str(c): per_client_requests(args.requests, c) for c in levels},
              "max_tokens": args.max_tokens, "generated_tokens_range": [lo, hi], "priority": priority,
              "loadavg_before": load_before, "loadavg_after": load_after, "elapsed_s": elapsed}
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out + ".json", "w") as f:
        json.dump({"method": method, "results": results, "ratios": ratios}, f, indent=2)
    with open(args.out + ".md", "w") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
