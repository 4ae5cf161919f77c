#!/usr/bin/python3
"""Booked retries under sustained overload, from one address with one body.

24 closed-loop clients send the same completion (a 40-character prompt,
max_tokens 48, greedy) for 20 s against `serve --max-queue 2 --max-batch 4`
(the model's real speed, one compute thread); a 503 is retried once, after
exactly its retry-after-ms, with its X-Retry-Token, as
docs/admission-and-memory.md "Booked retries" asks; then the client goes on
with a fresh request. Every client shares one address and one body, so fresh
requests look like the retries of others (the case where body matching can
take a retry's place). Run for n = 1 and n = 4 choices a request, on each
binary given (a build before a change and after it, same machine, same run).

Reports the share of first retries admitted, why the others were refused,
the server's promise error (vramgate_retry_promise_error_seconds: p50, p90,
p99 bucket bounds), completions and the booking counters. Writes
bench/reports/retry-sustained.md and .json.

  bench/retry_sustained.py --binary build/release/vramgate [--binary OTHER --label before --label after]
  bench/retry_sustained.py --seconds 3 --out-dir /tmp/rs   # a smoke run
"""
import argparse
import collections
import concurrent.futures
import json
import os
import sys
import threading
import time

import requests

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import Server  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
PROMPT = "The quick brown fox jumps over the lazy d"  # 40 characters
SHAPE = ["--max-queue", "2", "--max-batch", "4", "--threads", "1"]


def histogram_quantiles(metrics_text, name, quantiles):
    """Upper bucket bounds at each quantile of a Prometheus histogram, and its count."""
    buckets = []
    for line in metrics_text.splitlines():
        if line.startswith(name + "_bucket"):
            le = line.split('le="')[1].split('"')[0]
            buckets.append((float("inf") if le == "+Inf" else float(le), float(line.rsplit(" ", 1)[1])))
    total = buckets[-1][1] if buckets else 0
    return [next((le for le, c in buckets if c >= q * total), None) for q in quantiles], int(total)


class Clients:
    """Closed-loop clients until `end`; thread-safe tallies."""

    def __init__(self, url, n, end):
        self.url, self.end = url, end
        self.body = {"prompt": PROMPT, "max_tokens": 48, "temperature": 0, "n": n}
        self.lock = threading.Lock()
        self.counts = collections.Counter()
        self.reasons = collections.Counter()

    def one(self, _):
        while time.monotonic() < self.end:
            r = requests.post(self.url + "/v1/completions", json=self.body, timeout=120)
            if r.status_code != 503:
                with self.lock:
                    self.counts["completed" if r.status_code == 200 else f"first_{r.status_code}"] += 1
                continue
            time.sleep(float(r.headers.get("retry-after-ms", "1000")) / 1000)
            token = r.headers.get("X-Retry-Token")
            r2 = requests.post(self.url + "/v1/completions", json=self.body, timeout=120,
                               headers={"X-Retry-Token": token} if token else {})
            with self.lock:
                self.counts["retried_with_token" if token else "retried_without_token"] += 1
                if r2.status_code == 200:
                    self.counts["retry_admitted"] += 1
                    self.counts["completed"] += 1
                else:
                    self.reasons[" ".join(r2.json()["error"]["message"].split()[:2]).rstrip(":")] += 1

    def run(self, clients):
        with concurrent.futures.ThreadPoolExecutor(clients) as pool:
            list(pool.map(self.one, range(clients)))


def run(binary, model_dir, n, seconds, clients):
    server = Server(binary, "--model-dir", model_dir, *SHAPE)
    try:
        loop = Clients(server.url, n, time.monotonic() + seconds)
        loop.run(clients)
        metrics = requests.get(server.url + "/metrics", timeout=30).text
        admission = requests.get(server.url + "/v1/admission", timeout=30).json()
    finally:
        server.stop()
    retried = loop.counts["retried_with_token"] + loop.counts["retried_without_token"]
    (p50, p90, p99), promises = histogram_quantiles(metrics, "vramgate_retry_promise_error_seconds", (0.5, 0.9, 0.99))
    return {"n": n, "retried": retried, "retried_with_token": loop.counts["retried_with_token"],
            "first_retry_admitted": loop.counts["retry_admitted"] / retried if retried else None,
            "refusal_reasons": dict(loop.reasons.most_common(4)), "completed": loop.counts["completed"],
            "promise_error_s": {"p50": p50, "p90": p90, "p99": p99, "count": promises},
            "bookings": admission.get("retry_bookings", {})}


def pct(x):
    return "-" if x is None else f"{100 * x:.1f} %"


def write_report(out_dir, results, args):
    lines = ["# Booked retries under sustained overload", "",
             f"Command: `bench/retry_sustained.py {' '.join(sys.argv[1:])}`", "",
             f"Server: tinylm, `serve {' '.join(SHAPE)}` (the model's own speed). {args.clients} closed-loop "
             f"clients from one address, one body (a 40-character prompt, `max_tokens` 48, greedy, n = 1 or 4), "
             f"{args.seconds} s each; a 503 is retried once after exactly its `retry-after-ms`, with its "
             "`X-Retry-Token`. Promise error: the server's `vramgate_retry_promise_error_seconds` (grant - "
             "promise), as histogram bucket bounds.", "",
             "| build | n | first retries admitted | refusals of first retries | promise error p50 / p90 / p99 |"
             " completed | bookings |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for label, rows in results.items():
        for r in rows:
            e = r["promise_error_s"]
            reasons = ", ".join(f"{k}: {v}" for k, v in r["refusal_reasons"].items()) or "none"
            b = r["bookings"]
            lines.append(f"| {label} | {r['n']} | {pct(r['first_retry_admitted'])} ({r['retried']} retried) | "
                         f"{reasons} | {e['p50']} / {e['p90']} / {e['p99']} s | {r['completed']} | "
                         f"booked {b.get('booked')}, claimed {b.get('claimed')}, reclaimed {b.get('reclaimed', '-')}, "
                         f"early {b.get('early')}, expired {b.get('expired')} |")
    lines += ["", "Targets: first retries admitted >= 90 %, promise error p90 <= 0.5 s, for n = 1 and n = 4.", ""]
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "retry-sustained.md"), "w") as f:
        f.write("\n".join(lines))
    with open(os.path.join(out_dir, "retry-sustained.json"), "w") as f:
        json.dump(results, f, indent=1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--binary", action="append", help="vramgate binaries to compare (default build/release/vramgate)")
    ap.add_argument("--label", action="append", help="a name for each --binary, in order")
    ap.add_argument("--model-dir", default=os.path.join(ROOT, "models", "tinylm"))
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--clients", type=int, default=24)
    ap.add_argument("--out-dir", default=os.path.join(ROOT, "bench", "reports"))
    args = ap.parse_args()
    binaries = args.binary or [os.path.join(ROOT, "build", "release", "vramgate")]
    labels = args.label or [os.path.basename(os.path.dirname(b)) or b for b in binaries]
    results = {}
    for label, binary in zip(labels, binaries):
        results[label] = [run(binary, args.model_dir, n, args.seconds, args.clients) for n in (1, 4)]
        for r in results[label]:
            print(label, json.dumps(r), flush=True)
    write_report(args.out_dir, results, args)


if __name__ == "__main__":
    main()
