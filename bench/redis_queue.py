#!/usr/bin/python3
"""Redis mode (the shared queue) on one build: gateways place completions in
Redis, engine processes (`vramgate engine --queue`) pull them. All in one run:

  1. Goodput scaling: 1, 2 and 4 engines behind one Redis and one gateway
     (`serve --gateway-only --queue`), device time emulated with
     `--test-step-delay-ms` (default 20 ms a step, `--max-batch 4`, so the
     step delay and not the CPU bounds throughput); a closed loop of 16
     clients sending greedy 32-token completions (non-streaming, end-of-text
     ignored). Completed requests/s and generated tokens/s, the ratio against
     1 engine; every answer's text is compared with a reference. Each round
     starts a fresh Redis, gateway and engines; configurations interleave
     (1, 2, 4 then 4, 2, 1, ...); medians over rounds.
  2. The Redis hop: one engine, no step delay, the same traffic through
     `serve --gateway-only --queue` (gateway -> Redis -> engine) and through
     `serve --engine unix:PATH` (gateway -> engine over its socket, no Redis):
     request latency (p50/p99) of short completions (max_tokens 1-4) and time
     to first token of streams, at 1 and 4 closed-loop clients (keep-alive
     connections). Both set-ups run side by side; rounds interleave.
  3. Faults, each on a fresh Redis, gateway and 2 engines (`--claim-idle 1`,
     20 ms steps), 8 greedy streams compared token by token with a fault-free
     run of the same prompts on the same set-up:
     (a) `kill -9` of an engine running streams: requests lost, duplicate and
         missing tokens, kill -> first token of a resumed stream;
     (b) SIGSTOP of such an engine until the other claims its streams (past
         --claim-idle), then SIGCONT: the same checks, and the stalled
         engine's late output fenced out;
     (c) `kill -9` of Redis (`--appendonly yes --appendfsync always`) under a
         closed loop of 8 streaming clients and a prober sending one request
         every 20 ms; Redis restarted on the same port after `--outage`
         seconds: accepted requests lost, and how long new requests got 503.

Redis (redis-server on PATH) runs on a free loopback port with a temporary
folder; every process started here is ended at the end, also on errors. Not
part of the test suite.

    /usr/bin/python3 bench/redis_queue.py --binary build/release/vramgate \\
        --model-dir models/tinylm --out bench/reports/redis-queue
"""
import argparse
import asyncio
import concurrent.futures
import difflib
import json
import os
import platform
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import aiohttp
import requests

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import PROMPTS, percentile, raise_priority  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
from redis_procs import EngineProcess, RedisServer  # noqa: E402
from server_process import ServerProcess  # noqa: E402

STARTED = []  # every process object started here, ended by cleanup()
PHASE = ["start"]
STOP_LINES = {}  # phase -> engine log lines "queue: stopping request R: cancelled, taken over ... or gateway gone"


def cleanup():
    for p in reversed(STARTED):
        try:
            p.kill()
        except Exception as e:  # noqa: BLE001 - go on ending the others
            print(f"cleanup: {e}", file=sys.stderr)
    STARTED.clear()


def wait_for(cond, timeout, what, poll=0.02):
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(poll)


class Redis(RedisServer):
    """RedisServer, ended by cleanup(): crash() and start() for the fault runs."""

    def __init__(self, appendfsync=None):
        super().__init__(appendfsync, prefix="vg-bench-redis-")
        STARTED.append(self)

    def crash(self):
        RedisServer.kill(self)

    def kill(self):
        RedisServer.kill(self)
        shutil.rmtree(self.dir, ignore_errors=True)


class Engine(EngineProcess):
    """`vramgate engine` on its own socket (folder mode 0700), ended by
    cleanup(); counts the requests it stopped because another engine took
    them over or their gateway was gone."""

    def __init__(self, binary, model_dir, redis_url, *extra, threads="1"):
        self.folder = tempfile.mkdtemp(prefix="vg-bench-eng-")
        os.chmod(self.folder, 0o700)
        super().__init__(binary, model_dir, os.path.join(self.folder, "e.sock"), redis_url, "virt:0=64MiB", *extra,
                         threads=threads)
        STARTED.append(self)
        self.counted = False

    def kill(self):
        super().kill()
        shutil.rmtree(self.folder, ignore_errors=True)
        n = 0 if self.counted else self.logs().count("taken over by another engine, or its gateway is gone")
        self.counted = True
        if n:
            STOP_LINES[PHASE[0]] = STOP_LINES.get(PHASE[0], 0) + n


class Gateway(ServerProcess):
    def __init__(self, binary, model_dir, *args):
        super().__init__([binary, "serve", "--model-dir", model_dir, "--port", "0", *args])
        STARTED.append(self)

    def engines(self):
        return requests.get(self.url + "/v1/engines", timeout=10).json()["data"]

    def logs(self):
        return "".join(self.log)


class Cluster:
    """One Redis, one gateway-only gateway, n engines; close() ends them."""

    def __init__(self, args, n, engine_args, appendfsync=None, gateway_args=()):
        self.redis = Redis(appendfsync)
        self.engines = [Engine(args.binary, args.model_dir, self.redis.url, *engine_args, threads=args.threads)
                        for _ in range(n)]
        self.gateway = Gateway(args.binary, args.model_dir, "--queue", self.redis.url, "--gateway-only",
                               *gateway_args)
        pids = {e.pid for e in self.engines}
        wait_for(lambda: pids <= {e["pid"] for e in self.gateway.engines() if e["state"] == "ready"}, 60,
                 f"{n} engines registered in the shared queue", 0.05)
        self.url = self.gateway.url

    def running_engine(self):
        by_pid = {e.pid: e for e in self.engines}
        for info in self.gateway.engines():
            if info.get("running", 0) > 0 and info["pid"] in by_pid and by_pid[info["pid"]].proc.poll() is None:
                return by_pid[info["pid"]]
        return None

    def wait_idle(self):
        wait_for(lambda: all(x.get("running", 0) == 0 for x in self.gateway.engines()), 30, "the engines idle", 0.05)

    def close(self):
        for p in (self.gateway, *self.engines, self.redis):
            p.kill()
            if p in STARTED:
                STARTED.remove(p)


class DirectCluster:
    """n engines without Redis and one gateway talking to them over their
    sockets (`serve --engine unix:A --engine unix:B ...`): the control."""

    def __init__(self, args, n, engine_args):
        self.engines = [Engine(args.binary, args.model_dir, None, *engine_args, threads=args.threads)
                        for _ in range(n)]
        for e in self.engines:
            e.wait_listening()
        flags = [x for e in self.engines for x in ("--engine", "unix:" + e.sock)]
        self.gateway = Gateway(args.binary, args.model_dir, *flags)
        self.url = self.gateway.url

    def wait_idle(self):
        pass

    def close(self):
        for p in (self.gateway, *self.engines):
            p.kill()
            if p in STARTED:
                STARTED.remove(p)


def greedy(prompt, max_tokens, stream=False):
    return {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": stream}


# ---------------------------------------------------------------- 1. scaling

async def goodput_loop(url, clients, seconds, max_tokens, reference):
    """Closed loop of `clients` users, each sending greedy completions of the
    prompts in turn; counts completed requests and tokens, other answers, and
    texts that differ from `reference` (prompt -> text)."""
    done = {"requests": 0, "tokens": 0, "errors": {}, "wrong_text": 0}
    stop_at = time.perf_counter() + seconds
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=clients), timeout=timeout) as session:
        async def user(i):
            k = 0
            while time.perf_counter() < stop_at:
                prompt = PROMPTS[(i + k) % len(PROMPTS)]
                k += 1
                try:
                    async with session.post(url + "/v1/completions", json=greedy(prompt, max_tokens)) as r:
                        data = await r.json()
                        if r.status == 200:
                            done["requests"] += 1
                            done["tokens"] += data["usage"]["completion_tokens"]
                            if reference is not None and data["choices"][0]["text"] != reference[prompt]:
                                done["wrong_text"] += 1
                        else:
                            key = f"{r.status} {data.get('error', {}).get('type')}"
                            done["errors"][key] = done["errors"].get(key, 0) + 1
                except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                    key = "client " + type(e).__name__
                    done["errors"][key] = done["errors"].get(key, 0) + 1
        t0 = time.perf_counter()
        await asyncio.gather(*(user(i) for i in range(clients)))
        wall = time.perf_counter() - t0
    done.update(wall_s=wall, requests_per_s=done["requests"] / wall, tokens_per_s=done["tokens"] / wall)
    return done


def reference_texts(url, max_tokens):
    out = {}
    for p in PROMPTS:
        r = requests.post(url + "/v1/completions", json=greedy(p, max_tokens), timeout=60)
        r.raise_for_status()
        out[p] = r.json()["choices"][0]["text"]
    return out


SCALING = [("redis", 1), ("redis", 2), ("redis", 4), ("direct", 1), ("direct", 4)]


def run_scaling(args):
    engine_args = ["--test-step-delay-ms", str(args.step_delay_ms), "--max-batch", str(args.max_batch)]
    rounds = {f"{m}-{n}": [] for m, n in SCALING}
    clusters = {}
    try:
        # All five set-ups stay up for all rounds (idle engines and gateways
        # cost well under 1 % of a core each); only the one measured gets load.
        for mode, n in SCALING:
            clusters[f"{mode}-{n}"] = (Cluster(args, n, engine_args) if mode == "redis"
                                       else DirectCluster(args, n, engine_args))
        reference = reference_texts(clusters["redis-1"].url, args.tokens)
        for rnd in range(args.rounds):
            for mode, n in (SCALING if rnd % 2 == 0 else SCALING[::-1]):
                c = clusters[f"{mode}-{n}"]
                asyncio.run(goodput_loop(c.url, args.clients, 1.0, args.tokens, reference))  # warm-up
                c.wait_idle()
                r = asyncio.run(goodput_loop(c.url, args.clients, args.seconds, args.tokens, reference))
                r["engines_ready"] = len([e for e in c.gateway.engines() if e["state"] == "ready"])
                rounds[f"{mode}-{n}"].append(r)
                print(f"scaling round {rnd + 1}, {mode}, {n} engine(s): {r['requests_per_s']:.2f} req/s, "
                      f"{r['tokens_per_s']:.1f} tok/s, errors {r['errors']}, wrong texts {r['wrong_text']}",
                      flush=True)
    finally:
        for c in clusters.values():
            c.close()
    summary = {}
    for key, rs in rounds.items():
        summary[key] = {"requests_per_s": statistics.median(r["requests_per_s"] for r in rs),
                        "tokens_per_s": statistics.median(r["tokens_per_s"] for r in rs),
                        "errors": sum(sum(r["errors"].values()) for r in rs),
                        "wrong_text": sum(r["wrong_text"] for r in rs),
                        "requests": sum(r["requests"] for r in rs)}
    for key, v in summary.items():
        base = summary[key.split("-")[0] + "-1"]
        v["ratio_requests"] = v["requests_per_s"] / base["requests_per_s"]
        v["ratio_tokens"] = v["tokens_per_s"] / base["tokens_per_s"]
        n = int(key.split("-")[1])
        # What the step delay allows with every slot busy: max_batch tokens per engine per step.
        v["step_delay_bound_tokens_per_s"] = n * args.max_batch * 1000 / args.step_delay_ms
        if key.startswith("redis") and f"direct-{n}" in summary:
            v["against_direct"] = v["tokens_per_s"] / summary[f"direct-{n}"]["tokens_per_s"]
    return {"rounds": rounds, "summary": summary}


# ---------------------------------------------------------------- 2. the hop

def one_request(session, url, body):
    """(latency_s, first_token_s or None, ok) of one completion."""
    t0 = time.perf_counter()
    first = None
    ok = False
    try:
        if body.get("stream"):
            with session.post(url + "/v1/completions", json=body, stream=True, timeout=60) as r:
                if r.status_code == 200:
                    for raw in r.iter_lines():
                        if not raw.startswith(b"data: "):
                            continue
                        if raw == b"data: [DONE]":
                            ok = True
                            break
                        chunk = json.loads(raw[6:])
                        if "error" in chunk:
                            break
                        if first is None and chunk.get("choices"):
                            first = time.perf_counter() - t0
        else:
            r = session.post(url + "/v1/completions", json=body, timeout=60)
            ok = r.status_code == 200
    except requests.RequestException:
        ok = False
    return time.perf_counter() - t0, first, ok


def latency_loop(url, clients, seconds, stream):
    """`clients` threads, each on a keep-alive session, send completions of
    1-4 tokens (greedy, cycling prompts and lengths) back to back."""
    stop_at = time.perf_counter() + seconds

    def client(i):
        out = []
        k = 0
        with requests.Session() as s:
            while time.perf_counter() < stop_at:
                body = greedy(PROMPTS[(i + k) % len(PROMPTS)], 1 + (i + k) % 4, stream)
                k += 1
                out.append(one_request(s, url, body))
        return out

    with concurrent.futures.ThreadPoolExecutor(clients) as ex:
        return [r for rs in ex.map(client, range(clients)) for r in rs]


def run_hop(args):
    engine_args = ["--max-batch", str(args.max_batch)]
    procs = []
    redis = Redis()
    procs.append(redis)
    q_engine = Engine(args.binary, args.model_dir, redis.url, *engine_args, threads=args.threads)
    procs.append(q_engine)
    q_gw = Gateway(args.binary, args.model_dir, "--queue", redis.url, "--gateway-only")
    procs.append(q_gw)
    wait_for(lambda: any(e["pid"] == q_engine.pid and e["state"] == "ready" for e in q_gw.engines()), 60,
             "the engine registered in the shared queue", 0.05)
    d_engine = Engine(args.binary, args.model_dir, None, *engine_args, threads=args.threads)
    procs.append(d_engine)
    d_engine.wait_listening()
    d_gw = Gateway(args.binary, args.model_dir, "--engine", "unix:" + d_engine.sock)
    procs.append(d_gw)
    modes = {"redis": q_gw.url, "direct": d_gw.url}
    loads = [(c, stream) for c in (1, 4) for stream in (False, True)]
    samples = {m: {f"{c}-{'stream' if s else 'request'}": [] for c, s in loads} for m in modes}
    per_round = {m: {k: [] for k in samples[m]} for m in modes}
    try:
        for url in modes.values():  # warm-up
            latency_loop(url, 4, 0.5, False)
        for rnd in range(args.rounds):
            order = list(modes) if rnd % 2 == 0 else list(modes)[::-1]
            for c, stream in loads:
                key = f"{c}-{'stream' if stream else 'request'}"
                for mode in order:
                    recs = latency_loop(modes[mode], c, args.latency_seconds, stream)
                    samples[mode][key] += recs
                    per_round[mode][key].append(percentile([r[1] if stream else r[0] for r in recs if r[2]], 50))
            print(f"hop round {rnd + 1}: " + ", ".join(
                f"{m} {k} p50 {per_round[m][k][-1] * 1000:.2f} ms" for m in modes for k in samples[m]), flush=True)
    finally:
        for p in reversed(procs):
            p.kill()
            STARTED.remove(p)
    summary = {}
    for m in modes:
        summary[m] = {}
        for key, recs in samples[m].items():
            ok = [r for r in recs if r[2]]
            lat = [r[0] for r in ok]
            ttft = [r[1] for r in ok if r[1] is not None]
            slow = [r[1] if key.endswith("stream") else r[0] for r in ok]
            summary[m][key] = {"n": len(recs), "failed": len(recs) - len(ok),
                               "over_100ms": sum(1 for v in slow if v is not None and v > 0.1),
                               "latency_p50_s": percentile(lat, 50), "latency_p99_s": percentile(lat, 99),
                               "first_token_p50_s": percentile(ttft, 50) if key.endswith("stream") else None,
                               "first_token_p99_s": percentile(ttft, 99) if key.endswith("stream") else None,
                               "round_p50_s": per_round[m][key]}
    return {"summary": summary}


# ---------------------------------------------------------------- 3. faults

class Stream:
    """One greedy stream read on its own thread: chunk texts and arrival times."""

    def __init__(self, url, prompt, max_tokens):
        self.prompt = prompt
        self.chunks, self.times = [], []
        self.status, self.done, self.error = None, False, None
        self.thread = threading.Thread(target=self._run, args=(url, max_tokens), daemon=True)
        self.thread.start()

    def _run(self, url, max_tokens):
        try:
            with requests.post(url + "/v1/completions", json=greedy(self.prompt, max_tokens, True), stream=True,
                               timeout=120) as r:
                self.status = r.status_code
                if r.status_code != 200:
                    self.error = r.text
                    return
                for raw in r.iter_lines():
                    if not raw.startswith(b"data: "):
                        continue
                    if raw == b"data: [DONE]":
                        self.done = True
                        return
                    chunk = json.loads(raw[6:])
                    if "error" in chunk:
                        self.error = chunk["error"]
                        return
                    if chunk.get("choices") and chunk["choices"][0]["finish_reason"] is None:
                        self.times.append(time.perf_counter())
                        self.chunks.append(chunk["choices"][0]["text"])
        except requests.RequestException as e:
            self.error = type(e).__name__

    def join(self, timeout=180):
        self.thread.join(timeout)
        return not self.thread.is_alive()


def compare(streams, reference):
    """Lost requests, duplicate and missing tokens against the reference
    chunks (a diff of the token sequences: inserted = duplicate/extra,
    deleted = missing, replaced counts as both)."""
    lost, dup, missing, wrong = [], 0, 0, []
    for s in streams:
        ref = reference[s.prompt]
        if not s.done:
            lost.append({"prompt": s.prompt, "status": s.status, "error": s.error, "tokens": len(s.chunks)})
        for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, ref, s.chunks, autojunk=False).get_opcodes():
            if tag in ("insert", "replace"):
                dup += j2 - j1
            if tag in ("delete", "replace"):
                missing += i2 - i1
        if s.chunks != ref:
            wrong.append({"prompt": s.prompt, "expected": "".join(ref), "got": "".join(s.chunks)})
    return {"requests": len(streams), "lost": len(lost), "lost_detail": lost, "duplicate_tokens": dup,
            "missing_tokens": missing, "differing_texts": wrong}


def resumed_figures(streams, t_fault, gap=0.3):
    """A stream with a pause of more than `gap` s between two tokens, the
    second after the fault, was on the engine hit (tokens come every step
    otherwise): the time from the fault to the token that ends its pause."""
    moved, detail = [], []
    for s in streams:
        for a, b in zip(s.times, s.times[1:]):
            if b > t_fault and b - a > gap:
                moved.append(b - t_fault)
                detail.append({"prompt": s.prompt, "last_token_before_s": a - t_fault, "resumed_s": b - t_fault,
                               "tokens_before": sum(1 for t in s.times if t <= a)})
                break
    return {"streams_moved": len(moved), "fault_to_first_resumed_token_s": min(moved) if moved else None,
            "fault_to_last_stream_resumed_s": max(moved) if moved else None, "moved_detail": detail}


def fault_streams(c, prompts, max_tokens, fault, min_tokens=10):
    """Runs the streams once without a fault (the reference), then again
    calling fault() once every stream has `min_tokens` tokens; returns
    (reference chunks, faulted streams, fault time, fault's result)."""
    ref_streams = [Stream(c.url, p, max_tokens) for p in prompts]
    for s in ref_streams:
        if not s.join():
            raise RuntimeError("a fault-free reference stream hung")
    bad = [s for s in ref_streams if not s.done or len(s.chunks) != max_tokens]
    if bad:
        raise RuntimeError(f"fault-free reference streams failed: {[(s.status, s.error, len(s.chunks)) for s in bad]}")
    reference = {s.prompt: s.chunks for s in ref_streams}
    c.wait_idle()
    streams = [Stream(c.url, p, max_tokens) for p in prompts]
    wait_for(lambda: all(len(s.chunks) >= min_tokens for s in streams) or any(s.error for s in streams), 30,
             "every stream's first tokens")
    t_fault, result = fault()
    hung = [s.prompt for s in streams if not s.join()]
    if hung:
        raise RuntimeError(f"streams hung after the fault: {hung}")
    return reference, streams, t_fault, result


def run_kill_engine(args):
    c = Cluster(args, 2, ["--test-step-delay-ms", str(args.step_delay_ms), "--max-batch", str(args.max_batch),
                          "--claim-idle", "1"])
    try:
        state = {}

        def fault():
            victim = wait_for(c.running_engine, 10, "an engine running the streams")
            state["victim"] = victim
            t = time.perf_counter()
            os.kill(victim.pid, signal.SIGKILL)
            return t, victim.pid

        prompts = PROMPTS[:args.fault_streams]
        reference, streams, t_fault, pid = fault_streams(c, prompts, args.fault_tokens, fault)
        survivor = next(e for e in c.engines if e is not state["victim"])
        res = compare(streams, reference)
        res.update(resumed_figures(streams, t_fault))
        res["claims_logged"] = survivor.logs().count("claimed request")
        after = requests.post(c.url + "/v1/completions", json=greedy(prompts[0], 8), timeout=60)
        res["new_request_after_status"] = after.status_code
        res["survivor_log_tail"] = survivor.logs()[-4000:]
        return res
    finally:
        c.close()


def run_stall_engine(args):
    c = Cluster(args, 2, ["--test-step-delay-ms", str(args.step_delay_ms), "--max-batch", str(args.max_batch),
                          "--claim-idle", "1"])
    try:
        state = {}

        def fault():
            victim = wait_for(c.running_engine, 10, "an engine running the streams")
            other = next(e for e in c.engines if e is not victim)
            state.update(victim=victim, other=other)
            t = time.perf_counter()
            victim.pause()
            try:
                wait_for(lambda: "claimed request" in other.logs(), 30, "the other engine claiming the streams")
                state["stopped_s"] = time.perf_counter() - t
            finally:
                victim.resume()
            return t, victim.pid

        prompts = PROMPTS[:args.fault_streams]
        reference, streams, t_fault, pid = fault_streams(c, prompts, args.fault_tokens, fault)
        res = compare(streams, reference)
        res.update(resumed_figures(streams, t_fault))
        res["stopped_for_s"] = state["stopped_s"]
        res["claims_logged"] = state["other"].logs().count("claimed request")
        stalled_log = state["victim"].logs()
        res["stalled_engine_fenced"] = ("another engine took it over" in stalled_log or
                                        "taken over by another engine" in stalled_log)
        # The woken engine goes on: it is registered and both serve new work.
        wait_for(lambda: any(e["pid"] == state["victim"].pid and e["state"] == "ready" for e in c.gateway.engines()),
                 20, "the stalled engine registered again")
        res["stalled_engine_ready_after"] = True
        res["stalled_engine_alive"] = state["victim"].proc.poll() is None
        res["stalled_log_tail"] = stalled_log[-4000:]
        return res
    finally:
        c.close()


def run_kill_redis(args):
    # Twice the batch of (a) and (b): the 8 streaming clients leave slots free for the probes.
    c = Cluster(args, 2, ["--test-step-delay-ms", str(args.step_delay_ms), "--max-batch", str(2 * args.max_batch),
                          "--claim-idle", "1"], appendfsync="always")
    try:
        prompts = PROMPTS[:args.fault_streams]
        tokens = 32
        ref_streams = [Stream(c.url, p, tokens) for p in prompts]
        for s in ref_streams:
            s.join()
        reference = {s.prompt: s.chunks for s in ref_streams}
        if any(not s.done for s in ref_streams):
            raise RuntimeError("fault-free reference streams failed")
        c.wait_idle()
        stop = threading.Event()
        lock = threading.Lock()
        accepted, refused, other = [], [], []  # accepted: Stream objects; refused/other: (sent, status)
        probes = []  # (sent time, status)

        def client(prompt):
            while not stop.is_set():
                t = time.perf_counter()
                s = Stream(c.url, prompt, tokens)
                s.join()
                with lock:
                    if s.status == 200:
                        accepted.append(s)
                    elif s.status == 503:
                        refused.append((t, s.status))
                    else:
                        other.append((t, s.status, s.error))
                if s.status != 200:
                    time.sleep(0.02)

        probe_ref = requests.post(c.url + "/v1/completions", json=greedy("probe", 1), timeout=60).json()
        probe_text = probe_ref["choices"][0]["text"]

        def probe(t):
            try:
                r = requests.post(c.url + "/v1/completions", json=greedy("probe", 1), timeout=60)
                st = r.status_code
                if st == 200 and r.json()["choices"][0]["text"] != probe_text:
                    st = "200 wrong text"
            except requests.RequestException as e:
                st = "client " + type(e).__name__
            with lock:
                probes.append((t, st, time.perf_counter()))

        def prober():
            # Each probe on its own thread, one every 20 ms: a probe held by
            # the outage does not delay the next one.
            pending = []
            while not stop.is_set():
                th = threading.Thread(target=probe, args=(time.perf_counter(),), daemon=True)
                th.start()
                pending.append(th)
                time.sleep(0.02)
            for th in pending:
                th.join(90)

        threads = [threading.Thread(target=client, args=(p,), daemon=True) for p in prompts]
        threads.append(threading.Thread(target=prober, daemon=True))
        for t in threads:
            t.start()
        time.sleep(2.0)
        in_flight = sum(x.get("running", 0) for x in c.gateway.engines())
        t_kill = time.perf_counter()
        c.redis.crash()
        time.sleep(args.outage)
        t_restart = time.perf_counter()
        c.redis.start()
        t_up = time.perf_counter()
        time.sleep(4.0)
        stop.set()
        for t in threads:
            t.join(180)
        if any(t.is_alive() for t in threads):
            raise RuntimeError("clients hung after the Redis restart")
        res = compare(accepted, reference)
        res.pop("requests")
        res["accepted_requests"] = len(accepted)
        res["accepted_running_at_kill"] = in_flight
        res["accepted_spanning_outage"] = sum(1 for s in accepted if s.times and s.times[0] < t_kill and
                                              s.times[-1] > t_restart)
        res["refused_503_clients"] = len(refused)
        res["other_answers"] = other
        probe_503 = [p for p in probes if p[1] == 503]
        all_503 = sorted([p[0] for p in probe_503] + [r[0] for r in refused])
        res["probes"] = len(probes)
        res["probe_statuses"] = {str(k): sum(1 for p in probes if p[1] == k) for k in {p[1] for p in probes}}
        res["outage_s"] = t_up - t_kill
        res["redis_restart_to_ping_s"] = t_up - t_restart
        res["first_503_after_kill_s"] = (all_503[0] - t_kill) if all_503 else None
        res["last_503_after_kill_s"] = (all_503[-1] - t_kill) if all_503 else None
        res["last_503_after_restart_s"] = (all_503[-1] - t_up) if all_503 else None
        res["span_of_503s_s"] = (all_503[-1] - all_503[0]) if all_503 else 0.0
        ok_after = [p for p in probes if p[1] == 200 and p[0] > t_up]
        res["restart_to_first_new_200_sent_s"] = (ok_after[0][0] - t_up) if ok_after else None
        res["max_503_answer_s"] = max((p[2] - p[0] for p in probe_503), default=None)
        during = [p for p in probes if t_kill <= p[0] <= t_up]
        res["probes_sent_while_down"] = len(during)
        res["probes_sent_while_down_statuses"] = {str(k): sum(1 for p in during if p[1] == k)
                                                  for k in {p[1] for p in during}}
        held = [p[2] - p[0] for p in probes if p[1] == 200 and p[0] >= t_kill - 0.1]
        res["slowest_200_probe_from_kill_s"] = max(held, default=None)
        res["probe_timeline"] = [(round(p[0] - t_kill, 4), p[1], round(p[2] - p[0], 4)) for p in sorted(probes)
                                 if t_kill - 0.2 <= p[0] <= t_up + 2.5]
        res["kill_s"], res["restart_s"] = 0.0, t_up - t_kill
        glog = c.gateway.logs()
        res["gateway_readded"] = glog.count("was no longer in Redis; added again")
        res["gateway_readded_before_first_token"] = glog.count(
            "was no longer in Redis; added again (resuming after 0 tokens)")
        res["gateway_noticed_restart"] = "queue: Redis restarted" in glog
        res["probes_after_up_over_1s"] = sum(1 for p in probes if p[0] > t_up and p[1] == 200 and p[2] - p[0] > 1.0)
        res["gateway_log_not_request_lines"] = [ln for ln in c.gateway.logs().splitlines()
                                                if " info request {" not in ln][-60:]
        res["engine_logs_queue_lines"] = [[ln for ln in e.logs().splitlines() if "queue:" in ln][-40:]
                                          for e in c.engines]
        return res
    finally:
        c.close()


# ---------------------------------------------------------------- report

def ms(v):
    return "–" if v is None else f"{v * 1000:.1f}"


def machine():
    def first(path, key):
        try:
            with open(path) as f:
                for line in f:
                    if line.startswith(key):
                        return line.split(":", 1)[1].strip()
        except OSError:
            pass
        return "?"
    try:
        debian = open("/etc/debian_version").read().strip()
    except OSError:
        debian = "?"
    redis_v = subprocess.run(["redis-server", "--version"], capture_output=True, text=True).stdout.strip()
    return {"cpu": first("/proc/cpuinfo", "model name"), "cores": os.cpu_count(), "kernel": platform.release(),
            "debian": debian, "python": platform.python_version(), "redis": redis_v.split(" sha=")[0],
            "memory": first("/proc/meminfo", "MemTotal")}


def binary_info(path):
    import hashlib
    with open(path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    st = os.stat(path)
    return {"sha256": digest, "bytes": st.st_size,
            "modified": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(st.st_mtime))}


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def write_report(args, command, report):
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out + ".json", "w") as f:
        json.dump(report, f, indent=2)
    m = report["machine"]
    sc = report["scaling"]["summary"]
    hop = report["hop"]["summary"]
    ka, st, kr = report["kill_engine"], report["stall_engine"], report["kill_redis"]
    rows = "\n".join(
        f"| {k.split('-')[0]} | {k.split('-')[1]} | {v['requests_per_s']:.2f} | {v['tokens_per_s']:.1f} | "
        f"{v['ratio_tokens']:.2f} | {v['step_delay_bound_tokens_per_s']:.0f} | "
        f"{'' if 'against_direct' not in v else format(v['against_direct'], '.2f')} |" for k, v in sc.items())
    checks = "\n".join(f"| {k} | {v['requests']} | {v['errors']} | {v['wrong_text']} |" for k, v in sc.items())
    hop_rows = []
    for key, label in (("1-request", "request latency, 1 client"), ("4-request", "request latency, 4 clients"),
                       ("1-stream", "stream first token, 1 client"), ("4-stream", "stream first token, 4 clients")):
        stream = key.endswith("stream")
        q, d = hop["redis"][key], hop["direct"][key]
        p50 = "first_token_p50_s" if stream else "latency_p50_s"
        p99 = "first_token_p99_s" if stream else "latency_p99_s"
        hop_rows.append(f"| {label} | {ms(q[p50])} / {ms(q[p99])} | {ms(d[p50])} / {ms(d[p99])} | "
                        f"{ms(q[p50] - d[p50])} | {q['n']} / {d['n']} | "
                        f"{100 * q['over_100ms'] / max(1, q['n']):.1f} / {100 * d['over_100ms'] / max(1, d['n']):.1f} | "
                        f"{q['failed'] + d['failed']} |")
    hop_rows = "\n".join(hop_rows)

    def fault_row(label, r, extra=""):
        return (f"| {label} | {r['requests']} | {r['lost']} | {r['duplicate_tokens']} | {r['missing_tokens']} | "
                f"{len(r['differing_texts'])} | {r['streams_moved']} | {ms(r['fault_to_first_resumed_token_s'])} | "
                f"{ms(r['fault_to_last_stream_resumed_s'])} | {extra} |")

    row_a = fault_row("(a) `kill -9` engine", ka, f"{ka['claims_logged']} claims logged by the survivor; "
                      f"a new request after: {ka['new_request_after_status']}")
    row_b = fault_row("(b) SIGSTOP engine, SIGCONT after the claim", st,
                      f"stopped {st['stopped_for_s']:.2f} s; {st['claims_logged']} claims logged; stalled engine "
                      f"fenced out: {st['stalled_engine_fenced']}, alive and registered again: "
                      f"{st['stalled_engine_alive'] and st['stalled_engine_ready_after']}")
    md = f"""# Redis mode: scaling over engines, the Redis hop, and faults

`{command}`

One run on {m['cores']} cores ({m['cpu']}, {m['memory']}), Debian {m['debian']}, kernel {m['kernel']},
{m['redis']}, Python {m['python']}; {report['priority']}. Load average {report['loadavg_start']} at the start,
{report['loadavg_end']} at the end (the machine is shared: other jobs ran during the run). The whole run took
{report['wall_s']:.0f} s. Binary: {args.binary_note + ', ' if args.binary_note else ''}sha256 {report['binary']['sha256'][:16]}…,
built {report['binary']['modified']}. Model `{args.model_dir}`, every engine `--device virt:0=64MiB --threads {args.threads}`.
Redis runs on a loopback port with persistence off, except in fault (c).

## 1. Goodput over engines (one Redis, one gateway)

redis: `serve --gateway-only --queue redis://...` and N × `engine --queue redis://... --test-step-delay-ms
{args.step_delay_ms:g} --max-batch {args.max_batch}`. direct (the control, no Redis): the same N engines without
`--queue` behind one `serve --engine unix:A [--engine unix:B ...]`. Every engine step sleeps {args.step_delay_ms:g} ms
(the emulated device time), so one engine produces at most {args.max_batch} tokens per {args.step_delay_ms:g} ms. Load:
{args.clients} closed-loop clients, greedy non-streaming completions of exactly {args.tokens} tokens (end-of-text
ignored), {args.seconds:g} s per configuration after 1 s of warm-up; {args.rounds} rounds, the configurations in turn
(forward, then backward, ...); each set-up (its own Redis, gateway and engines) is started once and stays up,
idle, while the others are measured; medians over rounds.
requests/s: completed (200) requests per second of wall time; tokens/s: their generated tokens per second;
×1 engine: tokens/s against the same mode with 1 engine; bound: N × max-batch × 1000 / step-delay tokens/s,
what the step delay allows with every slot busy (prefill steps and a slot's idle time between one request's
end and the next one's start keep it below); ÷direct: redis tokens/s over direct tokens/s at the same N.

| mode | engines | requests/s | tokens/s | ×1 engine | bound tokens/s | ÷direct |
| --- | ---: | ---: | ---: | ---: | ---: | ---: |
{rows}

Checks over all rounds (wrong texts: answers that differ from the greedy reference of their prompt):

| configuration | completed requests | errors | wrong texts |
| --- | ---: | ---: | ---: |
{checks}

## 2. The Redis hop (one engine, no step delay)

The same engine build and flags (`--max-batch {args.max_batch}`, no step delay: the tiny model's real CPU step)
behind `serve --gateway-only --queue` (gateway → Redis → engine) and behind `serve --engine unix:PATH` (gateway →
engine over its Unix socket, no Redis), both running side by side. Traffic: closed-loop clients on keep-alive
connections, greedy completions of 1-4 tokens (cycling), {args.latency_seconds:g} s per load and mode per round,
{args.rounds} rounds with the mode order alternating; percentiles over all requests of all rounds. Request
latency: POST to the whole answer (non-streaming). First token: POST of a stream to its first chunk with a
token. Added: Redis p50 minus direct p50. Over 100 ms: the share of requests whose figure (latency, or first
token for streams) exceeded 100 ms.

| | Redis p50 / p99 (ms) | direct p50 / p99 (ms) | added at p50 (ms) | samples Redis / direct | over 100 ms, % Redis / direct | failed |
| --- | ---: | ---: | ---: | ---: | ---: | ---: |
{hop_rows}

## 3. Faults (2 engines, `--claim-idle 1`, {args.step_delay_ms:g} ms steps)

(a) and (b): {args.fault_streams} greedy streams of {args.fault_tokens} tokens, run once without a fault (the
reference) and then again with the fault once every stream had 10 tokens; the engine hit is one the gateway's
`/v1/engines` shows running streams. Lost: streams that did not end with `[DONE]` (error event, cut, non-200).
Duplicate / missing tokens: a diff of each stream's token chunks against the reference's (extra chunks count
as duplicates, absent ones as missing). Moved: streams with a pause of more than 0.3 s between two tokens, the
second after the fault (those the engine hit held: tokens come every 20 ms otherwise); fault → resumed: from the
signal to the token that ends the first (and the last) moved stream's pause.

| fault | streams | lost | duplicate tokens | missing tokens | differing texts | moved | fault → first resumed token (ms) | fault → last resumed (ms) | notes |
| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |
{row_a}
{row_b}

(c) Redis `--appendonly yes --appendfsync always`, engines with `--max-batch {2 * args.max_batch}` (so the streams
leave slots for the probes), `kill -9` of Redis under load, restarted on the same port
{args.outage:g} s later (kill → answering PING again: {kr['outage_s']:.2f} s). Load: {args.fault_streams} closed-loop
clients streaming greedy 32-token completions (a client whose request is refused tries again after 20 ms),
and a prober starting a greedy 1-token completion every 20 ms, each on its own connection and thread (so a
probe held by the outage does not hold up the next); 2 s of load before the kill, 4 s after the restart.
Times of refused requests are when they were sent (a request sent just before the kill may be refused: then
"kill → first 503" is negative).
Accepted: requests answered 200 (the stream started); lost: accepted ones that did not end with `[DONE]`, or
whose tokens differ from the fault-free reference.

| | |
| --- | ---: |
| accepted requests | {kr['accepted_requests']} |
| running in the engines at the kill | {kr['accepted_running_at_kill']} |
| accepted streams with tokens before the kill and after the restart | {kr['accepted_spanning_outage']} |
| accepted requests lost | {kr['lost']} |
| duplicate / missing tokens | {kr['duplicate_tokens']} / {kr['missing_tokens']} |
| differing texts | {len(kr['differing_texts'])} |
| requests refused with 503 (clients + prober) | {kr['refused_503_clients'] + kr['probe_statuses'].get('503', 0)} |
| other answers (not 200 or 503) | {len(kr['other_answers']) + sum(v for k, v in kr['probe_statuses'].items() if k not in ('200', '503'))} |
| kill → first 503 sent (ms) | {ms(kr['first_503_after_kill_s'])} |
| kill → last 503 sent (ms) | {ms(kr['last_503_after_kill_s'])} |
| Redis answering again → last 503 sent (ms) | {ms(kr['last_503_after_restart_s'])} |
| Redis answering again → first new request answered 200 sent (ms, prober) | {ms(kr['restart_to_first_new_200_sent_s'])} |
| slowest 503 answer (ms) | {ms(kr['max_503_answer_s'])} |
| probes sent while Redis was down: answers | {kr['probes_sent_while_down']}: {kr['probes_sent_while_down_statuses']} |
| slowest probe answered 200, sent from the kill on (ms) | {ms(kr['slowest_200_probe_from_kill_s'])} |
| probes sent after Redis answered again that took over 1 s (answered 200) | {kr['probes_after_up_over_1s']} |
| gateway log: "request ... was no longer in Redis; added again" (of them before their first token) | {kr['gateway_readded']} ({kr['gateway_readded_before_first_token']}) |

New requests got 503 for {kr['span_of_503s_s']:.2f} s (first to last refused request sent), against
{kr['outage_s']:.2f} s of Redis being down.

Engine log lines `queue: stopping request ...: cancelled, taken over by another engine, or its gateway is
gone`, per part: {report['engine_stopping_request_lines'] or 'none'}. Details (every round, percentiles,
the streams moved, log tails) are in `{os.path.basename(args.out)}.json`.
"""
    with open(args.out + ".md", "w") as f:
        f.write(md)
    return md


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default="build/release/vramgate")
    ap.add_argument("--model-dir", default="models/tinylm")
    ap.add_argument("--threads", default="1")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=8, help="closed-loop seconds per scaling configuration")
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=32, help="tokens per scaling completion")
    ap.add_argument("--step-delay-ms", type=float, default=20)
    ap.add_argument("--max-batch", type=int, default=4)
    ap.add_argument("--latency-seconds", type=float, default=2.0, help="seconds per load and mode per round")
    ap.add_argument("--fault-streams", type=int, default=8)
    ap.add_argument("--fault-tokens", type=int, default=96)
    ap.add_argument("--outage", type=float, default=1.0, help="seconds Redis stays down in fault (c)")
    ap.add_argument("--binary-note", default="", help="for the report: where the binary comes from (e.g. its commit)")
    ap.add_argument("--nice", type=int, default=-5)
    ap.add_argument("--out", default="bench/reports/redis-queue")
    args = ap.parse_args()
    command = "/usr/bin/python3 bench/redis_queue.py " + shlex.join(sys.argv[1:])
    prio = raise_priority(args.nice)

    def on_signal(sig, frame):
        raise SystemExit(128 + sig)
    signal.signal(signal.SIGTERM, on_signal)
    t0 = time.perf_counter()
    report = {"config": vars(args), "machine": machine(), "priority": prio, "loadavg_start": loadavg(),
              "binary": binary_info(args.binary)}
    try:
        PHASE[0] = "scaling"
        report["scaling"] = run_scaling(args)
        PHASE[0] = "hop"
        report["hop"] = run_hop(args)
        print("fault (a): kill -9 an engine", flush=True)
        PHASE[0] = "kill_engine"
        report["kill_engine"] = run_kill_engine(args)
        print("fault (b): SIGSTOP an engine", flush=True)
        PHASE[0] = "stall_engine"
        report["stall_engine"] = run_stall_engine(args)
        print("fault (c): kill -9 Redis", flush=True)
        PHASE[0] = "kill_redis"
        report["kill_redis"] = run_kill_redis(args)
    finally:
        cleanup()
    report["engine_stopping_request_lines"] = STOP_LINES
    report["loadavg_end"] = loadavg()
    report["wall_s"] = time.perf_counter() - t0
    print(write_report(args, command, report))


if __name__ == "__main__":
    main()
