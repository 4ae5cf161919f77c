#!/usr/bin/python3
"""One request with n=4 choices against four separate requests of the same
prompt, on one server (same build, same run): tokens/s of generated text,
wall time, and what admission reserved for each. The four separate requests
are sent at once, so both sides run four sequences in the same batch; what
differs is one prefill copied to four KV caches against four prefills, and
one lease against four. Rounds alternate the two forms, and the report
gives the medians.

    bench/choices.py --binary build/release/vramgate --out bench/reports/choices
"""
import argparse
import concurrent.futures
import json
import os
import statistics
import sys
import time

import requests

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import Server, raise_priority  # noqa: E402

PROMPT = "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of"


def post(url, body):
    r = requests.post(url + "/v1/completions", json=body, timeout=600)
    if r.status_code != 200:
        raise SystemExit(f"{r.status_code} {r.text}")
    return r.json(), int(r.headers.get("X-Queue-Position", "0"))


def one_request(url, n, max_tokens, seed):
    t0 = time.perf_counter()
    body, _ = post(url, {"prompt": PROMPT, "max_tokens": max_tokens, "n": n, "seed": seed, "temperature": 0.8,
                         "ignore_eos": True})
    return time.perf_counter() - t0, body["usage"]["completion_tokens"], len(body["choices"])


def separate_requests(url, n, max_tokens, seed):
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(n) as ex:
        bodies = list(ex.map(lambda i: post(url, {"prompt": PROMPT, "max_tokens": max_tokens, "seed": seed + i,
                                                   "temperature": 0.8, "ignore_eos": True})[0], range(n)))
    return time.perf_counter() - t0, sum(b["usage"]["completion_tokens"] for b in bodies), len(bodies)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default="build/release/vramgate")
    ap.add_argument("--model-dir", default="models/tinylm")
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--nice", type=int, default=0, help="raise this runner's priority (negative niceness, root)")
    ap.add_argument("--out", default="bench/reports/choices", help="writes OUT.json and OUT.md")
    args = ap.parse_args()
    priority = raise_priority(args.nice) if args.nice else "default niceness"

    server = Server(args.binary, "--model-dir", args.model_dir, "--threads", "1", "--max-batch", str(args.n))
    try:
        url = server.url
        one_request(url, args.n, 8, 1)  # warm-up
        separate_requests(url, args.n, 8, 1)
        rows = {"n_choices": [], "separate": []}
        for k in range(args.rounds):
            first, second = (("n_choices", one_request), ("separate", separate_requests))[:: 1 if k % 2 == 0 else -1]
            for name, fn in (first, second):
                wall, tokens, outputs = fn(url, args.n, args.max_tokens, 1000 + k)
                rows[name].append({"wall_s": wall, "tokens": tokens, "outputs": outputs, "tokens_per_s": tokens / wall})
        models = requests.get(url + "/v1/models", timeout=30).json()["data"][0]
    finally:
        server.stop()

    summary = {}
    for name, rs in rows.items():
        summary[name] = {"tokens_per_s_median": statistics.median(r["tokens_per_s"] for r in rs),
                         "wall_s_median": statistics.median(r["wall_s"] for r in rs),
                         "tokens_per_round": rs[0]["tokens"], "outputs_per_round": rs[0]["outputs"]}
    ratio = summary["n_choices"]["tokens_per_s_median"] / summary["separate"]["tokens_per_s_median"]
    report = {"n": args.n, "max_tokens": args.max_tokens, "rounds": args.rounds, "model": models["id"],
              "prompt_tokens": len(PROMPT.encode()), "priority": priority, "rows": rows, "summary": summary,
              "n_choices_over_separate_tokens_per_s": ratio}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out + ".json", "w") as f:
        json.dump(report, f, indent=2)
    lines = [
        f"# One request with n={args.n} against {args.n} separate requests",
        "",
        f"`bench/choices.py` on `{models['id']}`, one server (`--threads 1 --max-batch {args.n}`), prompt of "
        f"{report['prompt_tokens']} tokens, {args.max_tokens} generated tokens per choice (end-of-text ignored, "
        f"temperature 0.8), {args.rounds} rounds alternating the two forms; {priority}. The {args.n} separate "
        f"requests are sent at once, so both forms decode {args.n} sequences per step: the n form prefills the "
        f"prompt once and copies its KV cache to the other choices, and holds one lease.",
        "",
        "| form | tokens/s (median) | wall s (median) | tokens per round |",
        "| --- | --- | --- | --- |",
    ]
    for name, label in (("n_choices", f"one request, n={args.n}"), ("separate", f"{args.n} separate requests")):
        s = summary[name]
        lines.append(f"| {label} | {s['tokens_per_s_median']:.1f} | {s['wall_s_median']:.3f} | {s['tokens_per_round']} |")
    lines += ["", f"Ratio (n form / separate requests, tokens/s): **{ratio:.2f}x**.", ""]
    with open(args.out + ".md", "w") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
