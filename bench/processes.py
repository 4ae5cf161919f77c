#!/usr/bin/python3
"""The cost of the process boundary, and how long faults take, on one build:
the default `vramgate serve` (a gateway and one engine process, talking over
a Unix socket) against `--in-process` (HTTP and the engine in one process),
on the same traffic, rounds interleaved:

  * 1-token completions from 16 clients (closed loop): requests/s;
  * 64-token completions from 16 clients (closed loop): generated tokens/s;

and, on the default server under 8 streaming clients:

  * engine crash: `kill -9` of the engine -> the first token any stream
    receives from the restarted engine (a resumed stream);
  * gateway restart: `kill -9` of the gateway -> a new gateway on the same
    runtime folder answers its first request (the engine is re-attached, its
    weights are not loaded again).

    bench/processes.py --binary build/release/vramgate --out bench/reports/processes
"""
import argparse
import asyncio
import json
import os
import signal
import statistics
import sys
import tempfile
import threading
import time

import aiohttp
import requests

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import Server, raise_priority  # noqa: E402


async def closed_loop(url, clients, seconds, max_tokens):
    """Requests/s and generated tokens/s of `clients` closed loops."""
    done = {"requests": 0, "tokens": 0, "errors": 0}
    stop_at = time.perf_counter() + seconds
    body = {"prompt": "The meaning of life is", "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=clients)) as session:
        async def user():
            while time.perf_counter() < stop_at:
                async with session.post(url + "/v1/completions", json=body) as r:
                    data = await r.json()
                    if r.status == 200:
                        done["requests"] += 1
                        done["tokens"] += data["usage"]["completion_tokens"]
                    else:
                        done["errors"] += 1
        t0 = time.perf_counter()
        await asyncio.gather(*(user() for _ in range(clients)))
        wall = time.perf_counter() - t0
    return {"requests_per_s": done["requests"] / wall, "tokens_per_s": done["tokens"] / wall, "errors": done["errors"]}


def engine_pid(url):
    return requests.get(url + "/v1/engines", timeout=10).json()["data"][0]["pid"]


def stream_forever(url, stop, arrivals, lock):
    """Streams 64-token completions until `stop`, recording token arrival times."""
    while not stop.is_set():
        try:
            with requests.post(url + "/v1/completions", json={"prompt": "Once upon a time", "max_tokens": 64,
                                                              "temperature": 0, "stream": True},
                               stream=True, timeout=60) as r:
                for line in r.iter_lines():
                    if line.startswith(b"data: {"):
                        with lock:
                            arrivals.append(time.perf_counter())
        except requests.RequestException:
            time.sleep(0.01)  # the gateway is gone (the restart measurement): try again


def time_engine_crash(binary, model_dir, threads):
    s = Server(binary, "--model-dir", model_dir, "--threads", threads, "--test-step-delay-ms", "5")
    try:
        stop, lock, arrivals = threading.Event(), threading.Lock(), []
        workers = [threading.Thread(target=stream_forever, args=(s.url, stop, arrivals, lock)) for _ in range(8)]
        for w in workers:
            w.start()
        while len(arrivals) < 200:
            time.sleep(0.01)
        pid = engine_pid(s.url)
        killed = time.perf_counter()
        os.kill(pid, signal.SIGKILL)
        while True:
            with lock:
                after = [t for t in arrivals if t > killed + 0.05]
            if after:
                break
            time.sleep(0.005)
        first = min(after) - killed
        stop.set()
        for w in workers:
            w.join()
        log = "".join(s.log)
        return {"kill_to_first_resumed_token_s": first, "resumed_requests": log.count(" resumed on engine"),
                "resubmitted_requests": log.count(" resubmitted on engine")}
    finally:
        s.stop()


def time_gateway_restart(binary, model_dir, threads):
    runtime = tempfile.mkdtemp(prefix="vg-bench-run-")
    args = ["--model-dir", model_dir, "--threads", threads, "--runtime-dir", runtime]
    a = Server(binary, *args)
    engine = engine_pid(a.url)
    last_before = None
    for _ in range(20):
        r = requests.post(a.url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 1}, timeout=30)
        assert r.status_code == 200
        last_before = time.perf_counter()
    a.proc.send_signal(signal.SIGKILL)
    a.proc.wait()
    t0 = time.perf_counter()
    b = Server(binary, *args)
    try:
        r = requests.post(b.url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 1}, timeout=30)
        assert r.status_code == 200
        first_after = time.perf_counter()
        reattached = engine_pid(b.url) == engine and "re-attached" in "".join(b.log)
        return {"last_answer_to_first_answer_s": first_after - last_before, "start_to_first_answer_s": first_after - t0,
                "engine_reattached": reattached}
    finally:
        b.stop()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default="build/release/vramgate")
    ap.add_argument("--model-dir", default="models/tinylm")
    ap.add_argument("--threads", default="1")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=8)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--out", default="bench/reports/processes")
    args = ap.parse_args()
    ap_nice = raise_priority(-5)

    modes = {"multi-process": [], "in-process": ["--in-process"]}
    results = {m: {"one_token": [], "tokens": []} for m in modes}
    for rnd in range(args.rounds):
        for mode, extra in (list(modes.items()) if rnd % 2 == 0 else list(modes.items())[::-1]):
            s = Server(args.binary, "--model-dir", args.model_dir, "--threads", args.threads, "--max-batch", "16",
                       "--max-queue", "256", *extra)
            try:
                asyncio.run(closed_loop(s.url, args.clients, 1.5, 1))  # warm-up
                results[mode]["one_token"].append(asyncio.run(closed_loop(s.url, args.clients, args.seconds, 1)))
                results[mode]["tokens"].append(asyncio.run(closed_loop(s.url, args.clients, args.seconds, 64)))
            finally:
                s.stop()
            print(f"round {rnd + 1} {mode}: {results[mode]['one_token'][-1]['requests_per_s']:.0f} req/s, "
                  f"{results[mode]['tokens'][-1]['tokens_per_s']:.0f} tok/s", flush=True)

    def med(mode, kind, key):
        return statistics.median(r[key] for r in results[mode][kind])

    summary = {
        mode: {"one_token_requests_per_s": med(mode, "one_token", "requests_per_s"),
               "tokens_per_s_16_clients": med(mode, "tokens", "tokens_per_s"),
               "errors": sum(r["errors"] for k in ("one_token", "tokens") for r in results[mode][k])}
        for mode in modes
    }
    ratio_req = summary["multi-process"]["one_token_requests_per_s"] / summary["in-process"]["one_token_requests_per_s"]
    ratio_tok = summary["multi-process"]["tokens_per_s_16_clients"] / summary["in-process"]["tokens_per_s_16_clients"]
    crash = time_engine_crash(args.binary, args.model_dir, args.threads)
    restart = time_gateway_restart(args.binary, args.model_dir, args.threads)
    report = {"config": vars(args), "rounds": results, "summary": summary,
              "ratio_one_token_requests": ratio_req, "ratio_tokens": ratio_tok,
              "engine_crash": crash, "gateway_restart": restart}
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out + ".json", "w") as f:
        json.dump(report, f, indent=2)
    mp, ip = summary["multi-process"], summary["in-process"]
    md = f"""# The process boundary: multi-process against in-process

`bench/processes.py --binary {args.binary} --model-dir {args.model_dir} --rounds {args.rounds} --seconds {args.seconds}`
(one run on this 2-core machine; {args.rounds} interleaved rounds, medians; {args.clients} closed-loop clients;
`--threads {args.threads}`, `--max-batch 16`).

| | multi-process (default) | `--in-process` | ratio |
| --- | ---: | ---: | ---: |
| 1-token completions, requests/s | {mp['one_token_requests_per_s']:.0f} | {ip['one_token_requests_per_s']:.0f} | {ratio_req:.3f} |
| 64-token completions, generated tokens/s | {mp['tokens_per_s_16_clients']:.0f} | {ip['tokens_per_s_16_clients']:.0f} | {ratio_tok:.3f} |
| errors | {mp['errors']} | {ip['errors']} | |

Targets: the boundary costs under 5 % of tokens/s at 16 clients (ratio ≥ 0.95) and under 15 % of
1-token requests/s (ratio ≥ 0.85): {"met" if ratio_tok >= 0.95 else "NOT met"} and {"met" if ratio_req >= 0.85 else "NOT met"}.

## Faults (default server)

| | seconds |
| --- | ---: |
| engine `kill -9` → first token of a resumed stream (8 streams, `--test-step-delay-ms 5`) | {crash['kill_to_first_resumed_token_s']:.3f} |
| gateway `kill -9` → last answer before to first answer of the new gateway | {restart['last_answer_to_first_answer_s']:.3f} |
| new gateway started → its first answer | {restart['start_to_first_answer_s']:.3f} |

The crash moved {crash['resumed_requests']} streams (resumed after their tokens) and
{crash['resubmitted_requests']} requests (resubmitted before their first token). The new gateway
re-attached to the running engine: {restart['engine_reattached']} (no second weight load).
"""
    with open(args.out + ".md", "w") as f:
        f.write(md)
    print(md)


if __name__ == "__main__":
    main()
