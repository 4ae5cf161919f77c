#!/usr/bin/python3
"""Continuous batching vs one-at-a-time on the same build and traffic.

Closed loop: C clients (C = 1, 4, 16, 32) each stream completions back to back
(generated lengths drawn from [max_tokens/2, 3*max_tokens/2] with a fixed
seed, end-of-text ignored, so both modes do exactly the same work and clients
do not fall into lock-step waves). Measures aggregate decode tokens/s and time to first token (p50, p99)
for `--max-batch 32` (continuous batching) and `--max-batch 1`, in one run, and
writes a JSON and a Markdown report.

    bench/batching.py --binary build/release/vramgate --out bench/reports/batching-tinylm

A larger model makes each decode step weigh more than its fixed overheads,
as on real deployments; a random GPT-2 of 6 layers x 512 does:

    /usr/bin/python3 tools/make_random_gpt2.py --out /tmp/gpt2-6x512 --seed 3 \
        --layers 6 --heads 8 --embd 512 --positions 256
    bench/batching.py --model-dir /tmp/gpt2-6x512 --out bench/reports/batching-6x512
"""
import argparse
import json
import os

from common import Server, closed_loop, percentile, stream_completion


def run_level(url, clients, per_client, max_tokens):
    records, wall = closed_loop(url, clients, per_client, max_tokens)
    ok = [r for r in records if r["status"] == 200]
    return {"clients": clients, "requests": len(records), "ok": len(ok),
            "tokens_per_s": sum(r["tokens"] for r in ok) / wall,
            "ttft_p50_ms": 1000 * percentile([r["ttft_s"] for r in ok], 50),
            "ttft_p99_ms": 1000 * percentile([r["ttft_s"] for r in ok], 99),
            "wall_s": wall}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default="build/release/vramgate")
    ap.add_argument("--model-dir", default="models/tinylm")
    ap.add_argument("--levels", default="1,4,16,32")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1,
                    help="compute threads of the server (the load generator needs the other core)")
    ap.add_argument("--out", default="bench/reports/batching")
    args = ap.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    results = {}
    for mode, batch in (("batched", "32"), ("one_at_a_time", "1")):
        server = Server(args.binary, "--model-dir", args.model_dir, "--max-batch", batch, "--max-queue", "256",
                        "--threads", str(args.threads))
        try:
            stream_completion(server.url, {"prompt": "warm up", "max_tokens": 8})
            results[mode] = [run_level(server.url, c, max(2, 32 // c), args.max_tokens) for c in levels]
        finally:
            server.stop()
        for row in results[mode]:
            print(mode, json.dumps(row), flush=True)

    single_ttft = results["batched"][0]["ttft_p99_ms"]
    lines = ["# Continuous batching vs one-at-a-time", "",
             f"Model `{args.model_dir}`, {args.threads} compute thread(s), {args.max_tokens // 2}-{3 * args.max_tokens // 2} generated tokens per request (same seeded draw in both modes), closed loop, streaming; same build, "
             "same traffic, one run. `batched` = `--max-batch 32`, `one_at_a_time` = `--max-batch 1`.", "",
             "| clients | batched tok/s | one-at-a-time tok/s | ratio | batched TTFT p50 / p99 (ms) | "
             "one-at-a-time TTFT p50 / p99 (ms) |",
             "| --- | --- | --- | --- | --- | --- |"]
    summary = []
    for b, s in zip(results["batched"], results["one_at_a_time"]):
        ratio = b["tokens_per_s"] / s["tokens_per_s"]
        summary.append({"clients": b["clients"], "throughput_ratio": ratio,
                        "batched_ttft_p99_vs_single_client": b["ttft_p99_ms"] / single_ttft})
        lines.append(f"| {b['clients']} | {b['tokens_per_s']:.0f} | {s['tokens_per_s']:.0f} | {ratio:.2f}x | "
                     f"{b['ttft_p50_ms']:.1f} / {b['ttft_p99_ms']:.1f} | {s['ttft_p50_ms']:.1f} / "
                     f"{s['ttft_p99_ms']:.1f} |")
    lines += ["", "p99 time to first token of batched runs relative to the single-client value: " +
              ", ".join(f"{x['clients']} clients {x['batched_ttft_p99_vs_single_client']:.2f}x" for x in summary), ""]
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out + ".json", "w") as f:
        json.dump({"results": results, "summary": summary}, f, indent=2)
    with open(args.out + ".md", "w") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
