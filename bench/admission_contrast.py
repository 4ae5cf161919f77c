#!/usr/bin/python3
"""The naive server vs memory-aware admission, on one small virtual device.

32 clients at once each ask for a long completion (40-byte prompt, 200
generated tokens, end-of-text ignored). The same build serves them with
`--admission none` (no fit check, no queue limit: what a plain server does)
and with `--admission memory`. For each: status counts, out-of-memory
failures, peak device memory against capacity and budget, wall time.

    bench/admission_contrast.py --binary build/release/vramgate --out bench/reports/admission-contrast
"""
import argparse
import collections
import concurrent.futures
import json
import os
import time

from common import Server, percentile, stream_completion


def run(binary, model_dir, device, policy, clients, max_tokens):
    server = Server(binary, "--model-dir", model_dir, "--device", device, "--admission", policy,
                    "--max-batch", "32", "--max-queue", "64", "--threads", "1")
    try:
        body = {"prompt": "The quick brown fox jumps over the lazy ", "max_tokens": max_tokens,
                "ignore_eos": True, "temperature": 0.8}
        t0 = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(clients) as ex:
            records = list(ex.map(lambda i: stream_completion(server.url, dict(body, seed=i)), range(clients)))
        wall = time.perf_counter() - t0
        state = server_state(server)
    finally:
        server.stop()
    statuses = collections.Counter(str(r["status"]) + (f" {r['error']}" if r["error"] else "") for r in records)
    dev = state["devices"][0]
    return {"policy": policy, "device": device, "clients": clients, "wall_s": wall,
            "statuses": dict(statuses),
            "out_of_memory_failures": sum(1 for r in records if r["error"] == "out_of_memory"),
            "succeeded": sum(1 for r in records if r["status"] == 200 and not r["error"]),
            "latency_p50_s": percentile([r["latency_s"] for r in records], 50),
            "latency_p99_s": percentile([r["latency_s"] for r in records], 99),
            "capacity_bytes": dev["capacity_bytes"], "budget_bytes": dev["budget_bytes"],
            "peak_device_bytes": dev["peak_bytes"], "peak_reserved_bytes": dev["peak_reserved_bytes"],
            "server_out_of_memory_events": state["out_of_memory"]}


def server_state(server):
    import requests
    return requests.get(server.url + "/v1/admission", timeout=30).json()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default="build/release/vramgate")
    ap.add_argument("--model-dir", default="models/tinylm")
    ap.add_argument("--device", default="virt:0=16MiB")
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=200)
    ap.add_argument("--out", default="bench/reports/admission-contrast")
    args = ap.parse_args()
    rows = [run(args.binary, args.model_dir, args.device, p, args.clients, args.max_tokens)
            for p in ("none", "memory")]
    lines = ["# Naive server vs memory-aware admission", "",
             f"{args.clients} concurrent streaming completions of {args.max_tokens} tokens on `{args.device}` "
             f"(tinylm), same build, one run.", "",
             "| policy | succeeded | out-of-memory failures | statuses | peak device bytes / capacity | "
             "peak reserved / budget | p50 / p99 latency (s) |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['policy']} | {r['succeeded']} | {r['out_of_memory_failures']} | "
                     f"{json.dumps(r['statuses'])} | {r['peak_device_bytes']} / {r['capacity_bytes']} | "
                     f"{r['peak_reserved_bytes']} / {r['budget_bytes']} | {r['latency_p50_s']:.2f} / "
                     f"{r['latency_p99_s']:.2f} |")
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out + ".json", "w") as f:
        json.dump(rows, f, indent=2)
    with open(args.out + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
