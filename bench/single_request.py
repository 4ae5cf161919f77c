#!/usr/bin/python3
"""Single-request decode speed of a running vramgate: tokens/s and time to
first token for one client, one request at a time (streaming).

    build/release/vramgate serve --port 8000 &
    bench/single_request.py --url http://127.0.0.1:8000 --out bench/results/single_request.json
"""
import argparse
import json
import os
import statistics
import time

import requests


def one(url, prompt, max_tokens):
    t0 = time.perf_counter()
    ttft = None
    tokens = 0
    with requests.post(url + "/v1/completions", json={"prompt": prompt, "max_tokens": max_tokens,
                                                      "temperature": 0, "stream": True}, stream=True,
                       timeout=300) as r:
        r.raise_for_status()
        for raw in r.iter_lines():
            line = raw.decode("utf-8")
            if not line or not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if ttft is None and chunk["choices"][0]["text"]:
                ttft = time.perf_counter() - t0
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    return time.perf_counter() - t0, ttft, tokens


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--requests", type=int, default=10)
    ap.add_argument("--max-tokens", type=int, default=200)
    ap.add_argument("--out", default="bench/results/single_request.json")
    args = ap.parse_args()
    one(args.url, "Warm up", 8)
    runs = [one(args.url, "The ", args.max_tokens) for _ in range(args.requests)]
    tps = [n / t for t, _, n in runs if n]
    report = {
        "requests": args.requests, "max_tokens": args.max_tokens,
        "tokens_per_s_median": statistics.median(tps),
        "ttft_ms_median": 1000 * statistics.median(f for _, f, _ in runs if f is not None),
        "latency_s_median": statistics.median(t for t, _, _ in runs),
    }
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
