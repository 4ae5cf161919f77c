#!/usr/bin/python3
"""Serving with a paged KV cache: three scenarios on tinylm and one virtual
device (virt:0=16MiB, --max-batch 64, so memory and not the batch limit
binds), each run against its baseline on the same build, one server per
run, in one invocation:

  over-asking   48 clients, 40-token prompts, max_tokens 200, answers that a
                stop string ends after about 20 tokens: --kv-reservation
                on-demand against full (concurrent sequences, goodput).
  shared-prefix 32 chat clients whose conversations share a 150-token system
                prompt: the prefix cache on against off (prompt tokens
                computed, median time to first token).
  pressure      48 clients whose answers run to 200 tokens: on-demand
                against full (tokens recomputed after preemption, goodput).

Goodput is the completion tokens of the requests that succeeded, per second
of the run. Concurrency is sampled from /v1/admission every 50 ms. In the
over-asking and pressure runs every engine step lasts at least
--step-ms (the --test-step-delay-ms hook), as a memory-bound decode step on
a GPU does whatever the batch: tinylm's own steps take about a millisecond on
this CPU, so without it the benchmark's clients, not the server's batch,
would set the pace.

    bench/paged.py --binary build/release/vramgate --out bench/reports/paged-serving
"""
import argparse
import concurrent.futures
import json
import os
import statistics
import sys
import threading
import time

import requests

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import Server, percentile, split_outcomes, stream_completion  # noqa: E402

# 40-byte prompts (tinylm's tokenizer is one token per byte).
PROMPTS = ["The old lighthouse keeper watched the se", "In the spring of that year the river had",
           "She opened the letter and read the first", "Nobody in the village remembered when th",
           "The train left the station an hour late ", "My grandfather kept a small notebook in ",
           "At the edge of the forest there stood a ", "The recipe called for three cups of flou"]
SYSTEM = ("You are a helpful assistant for a small bookshop. Answer in one short sentence, be polite, "
          "and never invent titles that the shop does not stock. Thank")
QUESTIONS = ["Do you have maps?", "When do you open?", "Any new novels?", "Can I order a book?",
             "Do you buy books?", "Is there parking?", "Do you ship?", "Gift cards?"]


class Sampler(threading.Thread):
    """Samples running sequences and KV blocks from /v1/admission every 50 ms."""

    def __init__(self, url):
        super().__init__(daemon=True)
        self.url, self.samples, self.stop = url, [], threading.Event()

    def run(self):
        while not self.stop.wait(0.05):
            try:
                d = requests.get(self.url + "/v1/admission", timeout=5).json()["devices"][0]
            except (requests.RequestException, KeyError, IndexError, ValueError):
                continue
            self.samples.append({"running": d["running"], "used": d.get("kv_blocks", {}).get("used", 0)})


def admission(url):
    return requests.get(url + "/v1/admission", timeout=30).json()


def stop_strings(url):
    """Per prompt, a stop string its greedy answer reaches at about token 20."""
    stops = {}
    for p in PROMPTS:
        r = requests.post(url + "/v1/completions", json={"prompt": p, "max_tokens": 20, "temperature": 0},
                          timeout=120).json()
        text = r["choices"][0]["text"]
        for k in range(4, len(text)):
            tail = text[-k:]
            if text.find(tail) == len(text) - k:  # first seen at the end
                stops[p] = tail
                break
        else:
            stops[p] = text
    return stops


def closed_loop(url, clients, per_client, body_for, chat=False, stagger_s=0.0):
    def client(i):
        time.sleep(i * stagger_s)  # arrivals spread over the first seconds, as chats begin
        out = []
        for k in range(per_client):
            rec = stream_chat(url, body_for(i, k)) if chat else stream_completion(url, body_for(i, k))
            out.append(rec)
        return out

    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(clients) as ex:
        records = [r for rs in ex.map(client, range(clients)) for r in rs]
    return records, time.perf_counter() - t0


def stream_chat(url, body):
    t0 = time.perf_counter()
    rec = {"status": None, "ttft_s": None, "tokens": 0, "error": None}
    with requests.post(url + "/v1/chat/completions", json=dict(body, stream=True,
                                                               stream_options={"include_usage": True}),
                       stream=True, timeout=300) as r:
        rec["status"] = r.status_code
        if r.status_code != 200:
            rec["error"] = r.json()["error"]["type"]
            return rec
        for raw in r.iter_lines():
            line = raw.decode("utf-8")
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                rec["error"] = chunk["error"]["type"]
                continue
            if rec["ttft_s"] is None and chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
                rec["ttft_s"] = time.perf_counter() - t0
            if chunk.get("usage"):
                rec["tokens"] = chunk["usage"]["completion_tokens"]
    return rec


def run_case(binary, model_dir, args, workload):
    server = Server(binary, "--model-dir", model_dir, "--device", "virt:0=16MiB", "--max-batch", "64",
                    "--max-queue", "256", *workload.server_args, *args)
    try:
        url = server.url
        sampler = Sampler(url)
        context = workload.prepare(url)
        before = admission(url)
        sampler.start()
        records, wall = workload.run(url, context)
        sampler.stop.set()
        sampler.join()
        after = admission(url)
    finally:
        server.stop()
    ok, errors = split_outcomes(records)
    dev, dev0 = after["devices"][0], before["devices"][0]
    kv, kv0 = dev.get("kv_blocks", {}), dev0.get("kv_blocks", {})
    running = [s["running"] for s in sampler.samples] or [0]
    tokens = sum(r["tokens"] for r in ok)
    return {
        "args": list(args), "requests": len(records), "succeeded": len(ok), "errors": errors,
        "wall_s": wall, "completion_tokens": tokens, "goodput_tokens_per_s": tokens / wall,
        "running_mean": statistics.mean(running), "running_peak": max(running),
        "ttft_median_s": percentile([r["ttft_s"] for r in ok], 50),
        "ttft_p90_s": percentile([r["ttft_s"] for r in ok], 90),
        "out_of_memory": after["out_of_memory"] - before["out_of_memory"],
        "preemptions": after["preemptions"] - before["preemptions"],
        "prompt_tokens": kv.get("prompt_tokens", 0) - kv0.get("prompt_tokens", 0),
        "prefix_hit_tokens": kv.get("prefix_hit_tokens", 0) - kv0.get("prefix_hit_tokens", 0),
        "recomputed_tokens": kv.get("recomputed_tokens", 0) - kv0.get("recomputed_tokens", 0),
        "kv_blocks_total": kv.get("total", 0),
    }


class OverAsking:
    """48 clients, max_tokens 200, a stop string after about 20 tokens."""

    def __init__(self, per_client, step_ms, long_answers=False):
        self.per_client, self.long = per_client, long_answers
        self.server_args = ["--test-step-delay-ms", str(step_ms)]

    def prepare(self, url):
        return {} if self.long else stop_strings(url)

    def run(self, url, stops):
        def body(i, k):
            p = PROMPTS[(i + k) % len(PROMPTS)]
            b = {"prompt": p, "max_tokens": 200, "temperature": 0, "ignore_eos": True}
            if not self.long:
                b["stop"] = [stops[p]]
            return b
        return closed_loop(url, 48, self.per_client, body)


class SharedPrefix:
    """32 chat clients sharing a 150-token system prompt."""

    def __init__(self, per_client):
        self.per_client = per_client
        self.server_args = []

    def prepare(self, url):
        return None

    def run(self, url, _):
        def body(i, k):
            return {"messages": [{"role": "system", "content": SYSTEM},
                                 {"role": "user", "content": QUESTIONS[(i + k) % len(QUESTIONS)]}],
                    "max_tokens": 6, "temperature": 0}
        return closed_loop(url, 32, self.per_client, body, chat=True, stagger_s=0.05)


def ratio(a, b):
    return a / b if b else float("inf")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default="build/release/vramgate")
    ap.add_argument("--model-dir", default="models/tinylm")
    ap.add_argument("--per-client", type=int, default=10, help="requests each client sends, one after another")
    ap.add_argument("--step-ms", type=float, default=10, help="least milliseconds of an engine step (see above)")
    ap.add_argument("--out", default="bench/reports/paged-serving", help="writes OUT.json and OUT.md")
    args = ap.parse_args()
    assert len(SYSTEM) == 150, len(SYSTEM)

    runs = {}
    for name, workload, cases in [
        ("over-asking", OverAsking(args.per_client, args.step_ms),
         {"full": ["--kv-reservation", "full"], "on-demand": ["--kv-reservation", "on-demand"]}),
        ("shared-prefix", SharedPrefix(args.per_client),
         {"prefix cache off": ["--prefix-cache", "off"], "prefix cache on": ["--prefix-cache", "on"]}),
        ("pressure", OverAsking(max(1, args.per_client // 3), args.step_ms, long_answers=True),
         {"full": ["--kv-reservation", "full"], "on-demand": ["--kv-reservation", "on-demand"]}),
    ]:
        runs[name] = {case: run_case(args.binary, args.model_dir, flags, workload) for case, flags in cases.items()}
        print(name, json.dumps(runs[name], indent=1), flush=True)

    o = runs["over-asking"]
    s = runs["shared-prefix"]
    p = runs["pressure"]
    computed = {k: v["prompt_tokens"] - v["prefix_hit_tokens"] for k, v in s.items()}
    verdict = {
        "over_asking_concurrency_ratio": ratio(o["on-demand"]["running_mean"], o["full"]["running_mean"]),
        "over_asking_goodput_ratio": ratio(o["on-demand"]["goodput_tokens_per_s"], o["full"]["goodput_tokens_per_s"]),
        "shared_prefix_computed_ratio": ratio(computed["prefix cache off"], computed["prefix cache on"]),
        "shared_prefix_ttft_ratio": ratio(s["prefix cache off"]["ttft_median_s"], s["prefix cache on"]["ttft_median_s"]),
        "pressure_recomputed_share": ratio(p["on-demand"]["recomputed_tokens"], p["on-demand"]["completion_tokens"]),
        "pressure_goodput_ratio": ratio(p["on-demand"]["goodput_tokens_per_s"], p["full"]["goodput_tokens_per_s"]),
        "out_of_memory": sum(c["out_of_memory"] for r in runs.values() for c in r.values()),
        "failed_requests": sum(c["requests"] - c["succeeded"] for r in runs.values() for c in r.values()),
    }
    with open(args.out + ".json", "w") as f:
        json.dump({"runs": runs, "verdict": verdict, "per_client": args.per_client, "step_ms": args.step_ms}, f,
                  indent=1)
    with open(args.out + ".md", "w") as f:
        f.write(report(runs, verdict, computed, args))
    print(json.dumps(verdict, indent=1))


def report(runs, v, computed, args):
    lines = ["# Paged KV cache: serving scenarios", "",
             f"`bench/paged.py --per-client {args.per_client} --step-ms {args.step_ms:g}`: tinylm on "
             "`virt:0=16MiB`, `--max-batch 64`, one server per row, same build, one run; over-asking and pressure "
             f"steps last at least {args.step_ms:g} ms.", ""]
    lines += ["| scenario | run | requests ok | mean running | peak running | goodput tok/s | median TTFT s | "
              "prompt tokens | prefix hits | recomputed | preemptions | OOM |",
              "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name, cases in runs.items():
        for case, r in cases.items():
            ttft = f"{r['ttft_median_s']:.3f}" if r["ttft_median_s"] is not None else "-"
            lines.append(f"| {name} | {case} | {r['succeeded']}/{r['requests']} | {r['running_mean']:.1f} | "
                         f"{r['running_peak']} | {r['goodput_tokens_per_s']:.0f} | {ttft} | {r['prompt_tokens']} | "
                         f"{r['prefix_hit_tokens']} | {r['recomputed_tokens']} | {r['preemptions']} | "
                         f"{r['out_of_memory']} |")
    lines += ["", "| target | measured |", "| --- | ---: |",
              f"| over-asking: concurrent sequences on-demand ÷ full (≥ 3) | {v['over_asking_concurrency_ratio']:.2f} |",
              f"| over-asking: goodput on-demand ÷ full (≥ 2) | {v['over_asking_goodput_ratio']:.2f} |",
              f"| shared prefix: prompt tokens computed, off ÷ on (≥ 4) | {v['shared_prefix_computed_ratio']:.2f} "
              f"({computed['prefix cache off']} ÷ {computed['prefix cache on']}) |",
              f"| shared prefix: median TTFT off ÷ on (≥ 2) | {v['shared_prefix_ttft_ratio']:.2f} |",
              f"| pressure: recomputed ÷ delivered tokens (≤ 0.15) | {v['pressure_recomputed_share']:.3f} |",
              f"| pressure: goodput on-demand ÷ full (≥ 0.95) | {v['pressure_goodput_ratio']:.2f} |",
              f"| out-of-memory errors, all runs (0) | {v['out_of_memory']} |",
              f"| failed requests, all runs (0) | {v['failed_requests']} |", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
