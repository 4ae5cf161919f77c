"""Shared by the benchmark scripts: start a vramgate server on a free port,
stream and time one completion or a closed loop of them, and put a runner
ahead of other work on a shared machine."""
import atexit
import concurrent.futures
import json
import os
import random
import sys
import time

import requests

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
from server_process import ServerProcess  # noqa: E402


class Server(ServerProcess):
    def __init__(self, binary, *args):
        super().__init__([binary, "serve", "--port", "0", *args])


def stream_completion(url, body, timeout=300):
    """Returns a record: status, latency_s, ttft_s (to the first chunk with
    text), first_token_s (to the first chunk with a choice: the first token,
    which the server announces even when its bytes do not yet make a whole
    character or may still start a stop string), tokens, error type."""
    t0 = time.perf_counter()
    rec = {"status": None, "latency_s": None, "ttft_s": None, "first_token_s": None, "tokens": 0, "error": None}
    try:
        with requests.post(url + "/v1/completions", json=dict(body, stream=True), stream=True,
                           timeout=timeout) as r:
            rec["status"] = r.status_code
            if r.status_code != 200:
                rec["error"] = r.json()["error"]["type"]
            else:
                # SSE lines end at CR or LF only: split the bytes, then decode
                # (str.splitlines would also split at U+2028 inside JSON text).
                for raw in r.iter_lines():
                    line = raw.decode("utf-8")
                    if not line or not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    chunk = json.loads(line[6:])
                    if "error" in chunk:
                        rec["error"] = chunk["error"]["type"]
                        rec["status"] = "stream_error"
                        continue
                    if rec["first_token_s"] is None and chunk.get("choices"):
                        rec["first_token_s"] = time.perf_counter() - t0
                    if rec["ttft_s"] is None and chunk["choices"][0]["text"]:
                        rec["ttft_s"] = time.perf_counter() - t0
                    if chunk.get("usage"):
                        rec["tokens"] = chunk["usage"]["completion_tokens"]
    except requests.RequestException as e:
        rec["status"] = "client_error"
        rec["error"] = type(e).__name__
    rec["latency_s"] = time.perf_counter() - t0
    return rec


def split_outcomes(records):
    """(successful records, {"<status> <error>": count} of the others)."""
    ok, errors = [], {}
    for r in records:
        if r["status"] == 200 and r["error"] is None:
            ok.append(r)
        else:
            key = f"{r['status']} {r['error']}"
            errors[key] = errors.get(key, 0) + 1
    return ok, errors


def percentile(values, q):
    values = sorted(v for v in values if v is not None)
    if not values:
        return None
    k = min(len(values) - 1, max(0, round(q / 100 * (len(values) - 1))))
    return values[k]


PROMPTS = ["The meaning of life is", "Once upon a time", "A man walks into a bar", "When I was young",
           "Never trust a", "The best way to learn", "In the beginning", "My grandmother said"]


def closed_loop(url, clients, per_client, max_tokens):
    """`clients` threads each stream `per_client` completions back to back
    (generated lengths drawn from [max_tokens/2, 3*max_tokens/2] with a seed
    per client, end-of-text ignored). Returns (records, wall seconds); each
    record (see stream_completion) also has "client" (the client's index) and
    "first" (True for the client's first request: in a closed loop all
    clients send their first request at the same instant)."""
    def client(i):
        out = []
        rng = random.Random(i)
        for k in range(per_client):
            n = rng.randint(max_tokens // 2, 3 * max_tokens // 2)
            body = {"prompt": PROMPTS[(i + k) % len(PROMPTS)], "max_tokens": n, "temperature": 0.8,
                    "seed": i * 100 + k, "ignore_eos": True}
            out.append(dict(stream_completion(url, body), client=i, first=k == 0))
        return out

    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(clients) as ex:
        records = [r for rs in ex.map(client, range(clients)) for r in rs]
    return records, time.perf_counter() - t0


def raise_priority(nice):
    """os.nice(nice), and the same niceness for this session's autogroup
    (restored at exit). With the autogroup scheduler on
    (/proc/sys/kernel/sched_autogroup_enabled = 1) a process's niceness only
    orders it within its session, so other sessions' jobs would still get an
    equal share without the second part. Returns a line for the report."""
    os.nice(nice)
    try:
        with open("/proc/self/autogroup") as f:
            old = int(f.read().split()[-1])
        with open("/proc/self/autogroup", "w") as f:
            f.write(str(nice))
    except (OSError, ValueError, IndexError) as e:
        return f"niceness {nice} (autogroup unchanged: {e})"

    def restore():
        with open("/proc/self/autogroup", "w") as f:
            f.write(str(old))
    atexit.register(restore)
    return f"niceness {nice}, session autogroup niceness {nice} (was {old})"
