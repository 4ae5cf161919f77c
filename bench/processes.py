#!/usr/bin/python3
"""The cost of the process boundary, and how long faults take, on one build:
the default `vramgate serve` (a gateway and one engine process, talking over
a Unix socket) against `--in-process` (HTTP and the engine in one process),
on the same traffic, rounds interleaved:

  * 1-token completions from 16 clients (closed loop): requests/s;
  * 64-token completions from 16 clients (closed loop): generated tokens/s;

and, for each of the two, the server's voluntary context switches (every
thread that blocks and is woken again: what a crossing of the socket adds)
and its CPU time: utime + stime of the
server's processes (for the default server the gateway and its engine
processes together) from /proc/PID/stat before and after the round, so
requests and tokens per CPU-second. On a machine where the client shares
the server's cores the wall-clock rates move with the client's share of
them; the CPU time the server spends on each token does not, so the ratio
of tokens per CPU-second is the steadier measure of what the boundary costs;

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
    return {"requests": done["requests"], "tokens": done["tokens"], "wall_s": wall,
            "requests_per_s": done["requests"] / wall, "tokens_per_s": done["tokens"] / wall, "errors": done["errors"]}


def engine_pid(url):
    return requests.get(url + "/v1/engines", timeout=10).json()["data"][0]["pid"]


CLK_TCK = os.sysconf("SC_CLK_TCK")


def proc_cpu_s(pid):
    """utime + stime of process `pid` (all its threads), in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()  # after "(comm)": field 3 (state) is [0]
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # fields 14 and 15


def context_switches(pid):
    """Voluntary context switches of all threads of process `pid` (a thread
    that blocks: waiting for a lock, a condition, a socket), summed over
    /proc/PID/task/*/status. Threads that ended are not counted."""
    n = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/status") as f:
                for line in f:
                    if line.startswith("voluntary_ctxt_switches:"):
                        n += int(line.split()[1])
        except OSError:
            continue
    return n


def descendants(pid):
    """Pids of the processes below `pid` in the process tree."""
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def server_pids(s, in_process):
    """The server's processes: the `vramgate serve` process, and for the
    default server the engine processes /v1/engines lists plus any other
    process below the gateway in the tree."""
    pids = {s.proc.pid}
    if not in_process:
        pids.update(e["pid"] for e in requests.get(s.url + "/v1/engines", timeout=10).json()["data"])
        pids.update(descendants(s.proc.pid))
    return sorted(pids)


def machine_busy_s():
    """CPU seconds all the machine's cores have spent on anything but idle
    and I/O wait since boot (/proc/stat)."""
    with open("/proc/stat") as f:
        user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, f.readline().split()[1:9])
    return (user + nice + system + irq + softirq + steal) / CLK_TCK


def measured(pids, run):
    """run()'s result with the CPU seconds the processes `pids` (server_cpu_s),
    this client (client_cpu_s) and everything else on the machine
    (other_cpu_s: other jobs competing for the cores) spent while it ran."""
    before = sum(proc_cpu_s(p) for p in pids)
    switches_before = sum(context_switches(p) for p in pids)
    client_before = sum(os.times()[:2])
    machine_before = machine_busy_s()
    result = run()
    result["server_cpu_s"] = sum(proc_cpu_s(p) for p in pids) - before
    result["server_context_switches"] = sum(context_switches(p) for p in pids) - switches_before
    result["client_cpu_s"] = sum(os.times()[:2]) - client_before
    result["other_cpu_s"] = max(0.0, machine_busy_s() - machine_before - result["server_cpu_s"] -
                                result["client_cpu_s"])
    return result


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
    ap.add_argument("--idle-seconds", type=float, default=2,
                    help="seconds of no traffic, per round and mode, over which the server's idle CPU is measured")
    ap.add_argument("--no-faults", action="store_true", help="skip the engine crash and gateway restart timings")
    ap.add_argument("--out", default="bench/reports/processes")
    args = ap.parse_args()
    nice = raise_priority(-5)

    modes = {"multi-process": [], "in-process": ["--in-process"]}
    results = {m: {"one_token": [], "tokens": [], "idle": [], "pids": []} for m in modes}
    for rnd in range(args.rounds):
        for mode, extra in (list(modes.items()) if rnd % 2 == 0 else list(modes.items())[::-1]):
            s = Server(args.binary, "--model-dir", args.model_dir, "--threads", args.threads, "--max-batch", "16",
                       "--max-queue", "256", *extra)
            try:
                asyncio.run(closed_loop(s.url, args.clients, 1.5, 1))  # warm-up
                pids = server_pids(s, bool(extra))
                results[mode]["pids"].append(len(pids))

                def idle():
                    t0 = time.perf_counter()
                    time.sleep(args.idle_seconds)
                    return {"wall_s": time.perf_counter() - t0}
                results[mode]["idle"].append(measured(pids, idle))
                for kind, max_tokens in (("one_token", 1), ("tokens", 64)):
                    results[mode][kind].append(measured(
                        pids, lambda: asyncio.run(closed_loop(s.url, args.clients, args.seconds, max_tokens))))
            finally:
                s.stop()
            one, tok = results[mode]["one_token"][-1], results[mode]["tokens"][-1]
            print(f"round {rnd + 1} {mode}: {one['requests_per_s']:.0f} req/s, "
                  f"{one['requests'] / one['server_cpu_s']:.0f} req/CPU-s; {tok['tokens_per_s']:.0f} tok/s, "
                  f"{tok['tokens'] / tok['server_cpu_s']:.0f} tok/CPU-s; {len(pids)} processes; "
                  f"other jobs {tok['other_cpu_s'] / tok['wall_s']:.2f} cores", flush=True)

    def med(mode, kind, f):
        return statistics.median(f(r) for r in results[mode][kind])

    def per_cpu(count):
        return lambda r: r[count] / r["server_cpu_s"]

    summary = {
        mode: {"one_token_requests_per_s": med(mode, "one_token", lambda r: r["requests_per_s"]),
               "tokens_per_s_16_clients": med(mode, "tokens", lambda r: r["tokens_per_s"]),
               "one_token_requests_per_cpu_s": med(mode, "one_token", per_cpu("requests")),
               "tokens_per_cpu_s": med(mode, "tokens", per_cpu("tokens")),
               "one_token_server_cores": med(mode, "one_token", lambda r: r["server_cpu_s"] / r["wall_s"]),
               "tokens_server_cores": med(mode, "tokens", lambda r: r["server_cpu_s"] / r["wall_s"]),
               "one_token_client_cores": med(mode, "one_token", lambda r: r["client_cpu_s"] / r["wall_s"]),
               "tokens_client_cores": med(mode, "tokens", lambda r: r["client_cpu_s"] / r["wall_s"]),
               "idle_server_cores": med(mode, "idle", lambda r: r["server_cpu_s"] / r["wall_s"]),
               "other_cores": med(mode, "tokens", lambda r: r["other_cpu_s"] / r["wall_s"]),
               "one_token_switches_per_request": med(mode, "one_token",
                                                     lambda r: r["server_context_switches"] / max(1, r["requests"])),
               "tokens_switches_per_token": med(mode, "tokens",
                                                lambda r: r["server_context_switches"] / max(1, r["tokens"])),
               "errors": sum(r["errors"] for k in ("one_token", "tokens") for r in results[mode][k])}
        for mode in modes
    }
    mp, ip = summary["multi-process"], summary["in-process"]
    ratio_req = mp["one_token_requests_per_s"] / ip["one_token_requests_per_s"]
    ratio_tok = mp["tokens_per_s_16_clients"] / ip["tokens_per_s_16_clients"]
    # multi-process / in-process of work per CPU-second (same direction as the
    # wall-clock ratios: 1 is a free boundary); its inverse is how many times
    # the CPU time per request or token the boundary multiplies.
    cpu_ratio_req = mp["one_token_requests_per_cpu_s"] / ip["one_token_requests_per_cpu_s"]
    cpu_ratio_tok = mp["tokens_per_cpu_s"] / ip["tokens_per_cpu_s"]

    def paired(kind, f):
        """Each round's multi-process / in-process ratio (the two ran back to back)."""
        return [f(m) / f(i) for m, i in zip(results["multi-process"][kind], results["in-process"][kind])]
    rounds_ratio = {"one_token_requests_per_s": paired("one_token", lambda r: r["requests_per_s"]),
                    "tokens_per_s": paired("tokens", lambda r: r["tokens_per_s"]),
                    "one_token_requests_per_cpu_s": paired("one_token", per_cpu("requests")),
                    "tokens_per_cpu_s": paired("tokens", per_cpu("tokens"))}
    crash = restart = None
    if not args.no_faults:
        crash = time_engine_crash(args.binary, args.model_dir, args.threads)
        restart = time_gateway_restart(args.binary, args.model_dir, args.threads)
    report = {"config": vars(args), "priority": nice, "rounds": results, "summary": summary,
              "ratio_one_token_requests": ratio_req, "ratio_tokens": ratio_tok,
              "cpu_ratio_one_token_requests": cpu_ratio_req, "cpu_ratio_tokens": cpu_ratio_tok,
              "rounds_ratio": rounds_ratio, "engine_crash": crash, "gateway_restart": restart}
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out + ".json", "w") as f:
        json.dump(report, f, indent=2)

    def spread(xs):
        return f"{min(xs):.3f}–{max(xs):.3f}"

    def verdict(ratio, floor):
        return "met" if ratio >= floor else "NOT met"
    command = (f"bench/processes.py --binary {args.binary} --model-dir {args.model_dir} --rounds {args.rounds} "
               f"--seconds {args.seconds}" + (" --no-faults" if args.no_faults else ""))
    md = f"""# The process boundary: multi-process against in-process

`{command}`
(one run on this machine: {os.cpu_count()} cores, shared by the server and the Python client; {args.rounds}
interleaved rounds, a fresh server for each mode in each round, medians; {args.clients} closed-loop clients;
`--threads {args.threads}`, `--max-batch 16`; the runner at {nice}).

## Wall clock

| | multi-process (default) | `--in-process` | ratio | rounds' ratios |
| --- | ---: | ---: | ---: | ---: |
| 1-token completions, requests/s | {mp['one_token_requests_per_s']:.0f} | {ip['one_token_requests_per_s']:.0f} | {ratio_req:.3f} | {spread(rounds_ratio['one_token_requests_per_s'])} |
| 64-token completions, generated tokens/s | {mp['tokens_per_s_16_clients']:.0f} | {ip['tokens_per_s_16_clients']:.0f} | {ratio_tok:.3f} | {spread(rounds_ratio['tokens_per_s'])} |
| errors | {mp['errors']} | {ip['errors']} | | |

Targets: the boundary costs under 5 % of tokens/s at 16 clients (ratio ≥ 0.95) and under 15 % of
1-token requests/s (ratio ≥ 0.85): {verdict(ratio_tok, 0.95)} and {verdict(ratio_req, 0.85)}.
The ratio is multi-process / in-process of the medians; "rounds' ratios" is the range of the same
ratio within each round (the two modes ran back to back).

## CPU time

The server's CPU seconds in each round (utime + stime from `/proc/PID/stat` before and after it, all
threads; multi-process: the gateway and the engine process summed), so the work done per CPU-second.

| | multi-process (default) | `--in-process` | ratio | rounds' ratios |
| --- | ---: | ---: | ---: | ---: |
| 1-token completions per server CPU-second | {mp['one_token_requests_per_cpu_s']:.0f} | {ip['one_token_requests_per_cpu_s']:.0f} | {cpu_ratio_req:.3f} | {spread(rounds_ratio['one_token_requests_per_cpu_s'])} |
| generated tokens per server CPU-second (64-token completions) | {mp['tokens_per_cpu_s']:.0f} | {ip['tokens_per_cpu_s']:.0f} | {cpu_ratio_tok:.3f} | {spread(rounds_ratio['tokens_per_cpu_s'])} |
| server cores busy, 1-token / 64-token rounds | {mp['one_token_server_cores']:.2f} / {mp['tokens_server_cores']:.2f} | {ip['one_token_server_cores']:.2f} / {ip['tokens_server_cores']:.2f} | | |
| client cores busy, 1-token / 64-token rounds | {mp['one_token_client_cores']:.2f} / {mp['tokens_client_cores']:.2f} | {ip['one_token_client_cores']:.2f} / {ip['tokens_client_cores']:.2f} | | |
| other processes' cores busy (the machine's other jobs), 64-token rounds | {mp['other_cores']:.2f} | {ip['other_cores']:.2f} | | |
| server cores busy with no traffic ({args.idle_seconds:g} s) | {mp['idle_server_cores']:.3f} | {ip['idle_server_cores']:.3f} | | |
| server threads' voluntary context switches per 1-token request | {mp['one_token_switches_per_request']:.2f} | {ip['one_token_switches_per_request']:.2f} | | |
| server threads' voluntary context switches per generated token (64-token) | {mp['tokens_switches_per_token']:.3f} | {ip['tokens_switches_per_token']:.3f} | | |

In CPU time the boundary multiplies the server's CPU per generated token by {1 / cpu_ratio_tok:.3f}
(in-process / multi-process of tokens per CPU-second) and per 1-token request by {1 / cpu_ratio_req:.3f}:
against the same targets (ratio ≥ 0.95 and ≥ 0.85) {verdict(cpu_ratio_tok, 0.95)} and {verdict(cpu_ratio_req, 0.85)}.
"""
    if crash is not None:
        md += f"""
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
