#!/usr/bin/python3
"""A device shared with another process, on a virtual device (the
--test-foreign-bytes hook plays the other process, through a file).

  start-up   the other process holds 60 % of the device before the server
             starts: the budget from what is free, against the budget a
             formula from total memory would give (capacity x utilization -
             resident - workspace, more than is there).
  mid-burst  REQUESTS long completions from CLIENTS clients; once 16 run, the
             other process takes 60 % of the device for HOLD_S seconds, then
             frees it. Under --admission memory (the budget follows its
             bytes) and none (the naive baseline): completed, refused, failed,
             out-of-memory steps and KV cache allocations, preemptions, goodput, and the effective
             budget sampled while it held the bytes.

Writes bench/reports/shared-device.{md,json}.
"""
import argparse
import concurrent.futures
import json
import os
import sys
import tempfile
import threading
import time

import requests

from common import Server

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MiB = 1 << 20


def admission(server):
    return requests.get(server.url + "/v1/admission", timeout=30).json()


def wait_for(cond, timeout=120):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        time.sleep(0.02)  # polling the server's own state, with a deadline


def start_up(args, path):
    capacity = args.capacity_mib * MiB
    with open(path, "w") as f:
        f.write(str(capacity * 6 // 10))
    server = Server(args.binary, "--model-dir", args.model_dir, "--device", f"virt:0={args.capacity_mib}MiB",
                    "--threads", "1", "--test-foreign-bytes", f"file:{path}")
    try:
        d = admission(server)["devices"][0]
    finally:
        server.stop()
    from_total = int(capacity * 0.9) - d["resident_bytes"] - d["workspace_bytes"]
    return {"capacity_bytes": capacity, "foreign_bytes": d["foreign_bytes"],
            "free_bytes": capacity - d["foreign_bytes"], "budget_bytes": d["budget_bytes"],
            "budget_from_total_bytes": from_total}


def burst(args, path, policy):
    capacity = args.capacity_mib * MiB
    with open(path, "w") as f:
        f.write("0")
    server = Server(args.binary, "--model-dir", args.model_dir, "--device", f"virt:0={args.capacity_mib}MiB",
                    "--threads", "1", "--admission", policy, "--max-batch", "16", "--max-queue", "512",
                    "--queue-timeout", "120", "--test-step-delay-ms", str(args.step_delay_ms),
                    "--test-foreign-bytes", f"file:{path}", "--oom-quiet-period", "3600")
    body = {"prompt": "x" * 8, "max_tokens": args.max_tokens, "ignore_eos": True, "temperature": 0}
    budgets = []
    try:
        budget = admission(server)["devices"][0]["budget_bytes"]

        def one(_):
            try:
                return requests.post(server.url + "/v1/completions", json=body, timeout=300).status_code
            except requests.RequestException:
                return None

        t0 = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(args.clients) as ex:
            futures = [ex.submit(one, i) for i in range(args.requests)]
            wait_for(lambda: admission(server)["running"] >= 16)
            with open(path, "w") as f:
                f.write(str(capacity * 6 // 10))
            until = time.monotonic() + args.hold_s
            while time.monotonic() < until:
                budgets.append(admission(server)["devices"][0]["effective_budget_bytes"])
                time.sleep(0.05)  # sampling, not synchronisation
            with open(path, "w") as f:
                f.write("0")
            statuses = [f.result() for f in futures]
        elapsed = time.monotonic() - t0
        a = admission(server)
    finally:
        server.stop()
    d = a["devices"][0]
    ok = statuses.count(200)
    return {"policy": policy, "requests": len(statuses), "completed": ok,
            "refused_503": statuses.count(503), "failed": len(statuses) - ok - statuses.count(503),
            "out_of_memory_steps": a["out_of_memory"], "preemptions": a["preemptions"],
            "budget_bytes": budget, "lowest_effective_budget_bytes": min(budgets) if budgets else budget,
            "budget_changes": d["budget_changes"], "seconds": round(elapsed, 2),
            "goodput_req_s": round(ok / elapsed, 2)}


def report(args, start, runs):
    mib = lambda n: f"{n / MiB:.1f} MiB"  # noqa: E731
    lines = ["# A device shared with another process (virtual device)", "",
             f"tinylm on `virt:0={args.capacity_mib}MiB`; the other process is the `--test-foreign-bytes` hook "
             f"(a file). Command: `bench/shared_device.py` (defaults: {args.requests} requests of 8 + "
             f"{args.max_tokens} tokens from {args.clients} clients, `--max-batch 16`, "
             f"`--test-step-delay-ms {args.step_delay_ms}`, the other process holds 60 % for {args.hold_s} s).", "",
             "## Start-up with 60 % held by another process", "",
             "| capacity | held by others | free | budget | budget from total (capacity x 0.9 - resident - workspace) |",
             "|---|---|---|---|---|",
             f"| {mib(start['capacity_bytes'])} | {mib(start['foreign_bytes'])} | {mib(start['free_bytes'])} | "
             f"{mib(start['budget_bytes'])} | {mib(start['budget_from_total_bytes'])} |", "",
             "## Another process takes 60 % mid-burst, then frees it", "",
             "| policy | completed | 503 | failed | out of memory (steps, KV caches) | preemptions | budget | lowest effective budget "
             "| budget changes (foreign grew / shrank) | goodput req/s |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        bc = r["budget_changes"]
        lines.append(f"| {r['policy']} | {r['completed']}/{r['requests']} | {r['refused_503']} | {r['failed']} | "
                     f"{r['out_of_memory_steps']} | {r['preemptions']} | {mib(r['budget_bytes'])} | "
                     f"{mib(r['lowest_effective_budget_bytes'])} | {bc['foreign_grew']} / {bc['foreign_shrank']} | "
                     f"{r['goodput_req_s']} |")
    lines.append("")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default=os.path.join(ROOT, "build", "release", "vramgate"))
    ap.add_argument("--model-dir", default=os.path.join(ROOT, "models", "tinylm"))
    ap.add_argument("--capacity-mib", type=int, default=40)
    ap.add_argument("--requests", type=int, default=96)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=230)
    ap.add_argument("--step-delay-ms", type=float, default=2)
    ap.add_argument("--hold-s", type=float, default=3)
    ap.add_argument("--report", default=os.path.join(ROOT, "bench", "reports", "shared-device.md"))
    args = ap.parse_args()
    fd, path = tempfile.mkstemp(prefix="vg-foreign-")
    os.close(fd)
    try:
        start = start_up(args, path)
        runs = [burst(args, path, policy) for policy in ("memory", "none")]
    finally:
        os.unlink(path)
    text = report(args, start, runs)
    with open(args.report, "w") as f:
        f.write(text)
    with open(os.path.splitext(args.report)[0] + ".json", "w") as f:
        json.dump({"start_up": start, "bursts": runs}, f, indent=2)
    print(text)
    memory = runs[0]
    return 0 if memory["out_of_memory_steps"] == 0 and memory["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
