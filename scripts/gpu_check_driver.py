#!/usr/bin/env python3
"""The checks of scripts/gpu-check, run against a built vramgate binary on
one device (cuda:0 on a GPU machine; any virt:N=SIZE works too, which is how
the checks themselves are tried on a machine without a GPU). Standard library
only: the GPU machine's Python may have nothing but torch.

  load        serve with a budget that holds about FIT requests (sized from a
              probe server's /v1/admission: what its budget leaves out, models,
              decode graphs, workspace and reserve, and a request's cost in KV
              blocks; the check fails before sending when the budget holds
              fewer), drive CLIENTS concurrent completions, and check: every
              request 200, no out-of-memory error, leases (reserved bytes)
              never above the budget, and reserved 0 / running 0 once all are
              done (the most running at once is sampled and reported).
  inject-oom  serve with --test-inject-oom-step, drive concurrent completions
              through the failing step, and check: the process survives, the
              out-of-memory error was counted, every request completes (the
              affected ones are preempted and recomputed), allocated bytes
              return exactly to the baseline read once the server is ready
              (every compute thread has made its cuBLAS workspace by then:
              Device::prepare_compute_thread), the next request succeeds.
              --leak-bytes plants a leak (--test-leak-bytes-on-oom) that the
              check must report.
  shared-device
              another process holds all but --shared-free-mib of the device
              (on CUDA a Python child that allocates with torch; on a virtual
              device the --test-foreign-bytes hook plays it), then serve there
              under --admission memory and drive a burst (--shared-requests of
              --shared-prompt-tokens + --shared-max-tokens from
              --shared-clients clients, --max-batch --shared-max-batch), and
              check: the start-up budget is at most what was free, every
              request 200, no out-of-memory error.
  graphs      serve with decode graphs (--cuda-graphs on; on a virtual device
              the emulated graphs of --host-kernels off
              --test-emulate-cuda-graphs) and without, send the same greedy
              completions to each one at a time (--graphs-clients 1: both run
              the same batches; some ask for n = 2, 4 or 8 choices, which
              decode as one batch), and check: every choice's text is equal,
              the graphs were recorded (the start-up log line), and their
              bytes were charged (resident bytes higher, budget lower).

Prints one summary line per check, `gpu-check <name>: PASS|FAIL ...`, and exits
1 when a check fails. Numbers come from the server's own /v1/models and
/v1/admission, never from constants.
"""
import argparse
import math
import os
import re
import shlex
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
from server_process import ServerProcess, http_json  # noqa: E402

MiB = 1 << 20


class Server(ServerProcess):
    """A `vramgate serve` process on a free port, ready when constructed."""

    def __init__(self, binary, args, env=None, start_timeout=240):
        super().__init__([binary, "serve", "--host", "127.0.0.1", "--port", "0", *args],
                         env=dict(os.environ, **(env or {})), start_timeout=start_timeout)

    def request(self, method, path, body=None, timeout=120):
        return http_json(self.url + path, body, method=method, timeout=timeout)

    def admission(self):
        status, body = self.request("GET", "/v1/admission", timeout=30)
        if status != 200:
            raise RuntimeError(f"/v1/admission answered {status}: {body}")
        return body



def cost_of(profile, tokens):
    """The server's cost formula (src/admission/memory_profile.hpp), in integers."""
    raw = tokens * profile["kv_bytes_per_token"] + profile["sequence_overhead_bytes"]
    millionths = round(profile["safety_factor"] * 1_000_000)
    return (raw * millionths + 999_999) // 1_000_000


def completion(prompt_tokens, max_tokens):
    # Byte-level models: one character is one token.
    return {"prompt": "".join(chr(97 + i % 26) for i in range(prompt_tokens)), "max_tokens": max_tokens,
            "ignore_eos": True, "temperature": 0}


def drive(server, bodies, clients, keep=lambda status, body: status):
    """Sends `bodies` from `clients` threads; returns keep(status, body) of each answer, in order."""
    out = [None] * len(bodies)
    lock = threading.Lock()
    nxt = [0]

    def worker():
        while True:
            with lock:
                i = nxt[0]
                nxt[0] += 1
            if i >= len(bodies):
                return
            out[i] = keep(*server.request("POST", "/v1/completions", bodies[i], timeout=300))

    threads = [threading.Thread(target=worker) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


class Sampler:
    """Samples /v1/admission while load runs: highest leases, device use and
    running sequences seen (observations, not synchronisation)."""

    def __init__(self, server):
        self.server = server
        self.max = {"reserved_bytes": 0, "used_bytes": 0, "running": 0}
        self.samples = 0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        while not self.done.is_set():
            try:
                a = self.server.admission()
            except RuntimeError:
                self.done.wait(0.05)
                continue
            d = a["devices"][0]
            self.samples += 1
            self.max["reserved_bytes"] = max(self.max["reserved_bytes"], d["reserved_bytes"])
            self.max["used_bytes"] = max(self.max["used_bytes"], d["used_bytes"])
            self.max["running"] = max(self.max["running"], a["running"])
            self.done.wait(0.05)

    def stop(self):
        self.done.set()
        self.thread.join()


def wait_idle(server, deadline_s=60):
    deadline = time.monotonic() + deadline_s
    while True:
        a = server.admission()
        if a["running"] == 0 and a["queue_depth"] == 0 and a["devices"][0]["reserved_bytes"] == 0:
            return a
        if time.monotonic() > deadline:
            return a
        time.sleep(0.05)  # polling a state with a deadline


def gb(n):
    return f"{n / MiB:.1f} MiB"


PROBE_UTILIZATION = 0.9


def kv_cost(device, prompt_tokens, max_tokens):
    """What admission charges one request at worst on a device with a KV
    block pool (/v1/admission's kv_blocks): the blocks of its prompt and every
    generated token but the last (src/engine/engine_kv_pool.cpp, pool_cost)."""
    kv = device["kv_blocks"]
    positions = prompt_tokens + max(0, max_tokens - 1)
    return -(-positions // kv["block_tokens"]) * kv["block_bytes"]


def usable_bytes(capacity, utilization, foreign):
    """The start-up budget before what the server's models hold and set aside
    (src/admission/memory_profile.cpp, device_budget): the least of capacity x
    utilization and capacity less the foreign bytes rounded up to its grain."""
    grain = max(1, capacity // 4096)
    counted = min(capacity, -(-max(0, foreign) // grain) * grain)
    return min(capacity * round(utilization * 1_000_000) // 1_000_000, capacity - counted)


def load_utilization(args, common):
    """The --memory-utilization that leaves a budget of about --fit requests:
    a probe server of the same settings says what the budget formula takes
    before the requests (models, decode graphs, workspace, reserve: its
    usable bytes less its budget) and what one request costs."""
    probe = Server(args.binary, [*common, "--memory-utilization", str(PROBE_UTILIZATION)])
    try:
        profile = probe.request("GET", "/v1/models")[1]["data"][0]
        device = probe.admission()["devices"][0]
    finally:
        probe.stop()
    capacity = device["capacity_bytes"]
    overhead = usable_bytes(capacity, PROBE_UTILIZATION, device["foreign_bytes"]) - device["budget_bytes"]
    if device.get("kv_blocks"):
        cost = kv_cost(device, args.prompt_tokens, args.max_tokens)
    else:
        cost = cost_of(profile, args.prompt_tokens + args.max_tokens)
    # Half a request more than --fit: what rounding to whole blocks takes.
    util = (overhead + args.fit * cost + cost // 2) / capacity
    return min(1.0, math.ceil(util * 1e6) / 1e6), cost, capacity


def budget_holds(device, cost):
    """Requests of `cost` bytes the device's budget holds at once (in whole
    KV blocks where it has a pool)."""
    kv = device.get("kv_blocks")
    if kv:
        per_request = cost // kv["block_bytes"]
        return (device["budget_bytes"] // kv["block_bytes"]) // per_request
    return device["budget_bytes"] // cost


def check_load(args):
    common = ["--device", args.device, "--model-dir", args.model_dir, "--threads", str(args.threads),
              "--max-batch", "16", "--max-queue", "512", "--queue-timeout", "240", *shlex.split(args.load_serve_args)]
    util, cost, capacity = load_utilization(args, common)
    env = {"PYTORCH_CUDA_ALLOC_CONF": args.alloc_conf} if args.alloc_conf else {}
    t0 = time.monotonic()
    server = Server(args.binary, [*common, "--memory-utilization", f"{util:.6f}"], env=env)
    try:
        start = server.admission()["devices"][0]
        budget = start["budget_bytes"]
        holds = budget_holds(start, cost)
        if holds < min(args.fit, args.clients):
            # Not a concurrency test: say so rather than pass one request at a time.
            print(f"gpu-check load: FAIL (the budget {gb(budget)} holds {holds} requests of {gb(cost)} at once, "
                  f"not the {args.fit} this check is sized for; utilization {util:.6f})", flush=True)
            return False
        sampler = Sampler(server)
        statuses = drive(server, [completion(args.prompt_tokens, args.max_tokens)] * args.requests, args.clients)
        sampler.stop()
        final = wait_idle(server)
        alive = server.proc.poll() is None
    finally:
        server.stop()
    d = final["devices"][0]
    ok200 = statuses.count(200)
    problems = []
    if ok200 != len(statuses):
        problems.append(f"statuses {sorted(set(statuses), key=str)}")
    if final["out_of_memory"] != 0:
        problems.append(f"{final['out_of_memory']} out-of-memory errors")
    if d["peak_reserved_bytes"] > budget or sampler.max["reserved_bytes"] > budget:
        problems.append("reserved above budget")
    if final["running"] or final["queue_depth"] or d["reserved_bytes"]:
        problems.append("not idle after the load")
    if not alive:
        problems.append("process exited")
    verdict = "PASS" if not problems else "FAIL (" + "; ".join(problems) + ")"
    print(f"gpu-check load: {verdict}: {ok200}/{len(statuses)} completed on {d['name']}, "
          f"{final['out_of_memory']} OOM, peak reserved {gb(d['peak_reserved_bytes'])} <= budget {gb(budget)} "
          f"(holds {holds} requests of {gb(cost)} at once), at most {sampler.max['running']} running, "
          f"device used peak {gb(d['peak_bytes'])} of {gb(capacity)} x {util:.4f} = {gb(capacity * util)}, "
          f"{args.alloc_conf or 'default allocator settings'}, {time.monotonic() - t0:.1f} s", flush=True)
    if problems:
        print(server.tail(40), file=sys.stderr)
    return not problems


def kv_pool_bytes(device):
    """Bytes of the device's KV block pool (/v1/admission), 0 without one."""
    kv = device.get("kv_blocks")
    return kv["total"] * kv["block_bytes"] if kv else 0


def check_inject_oom(args):
    t0 = time.monotonic()
    server = Server(args.binary, ["--device", args.device, "--model-dir", args.model_dir, "--threads",
                                  str(args.threads), "--max-batch", "8", "--memory-utilization", "0.5",
                                  "--test-inject-oom-step", str(args.inject_step), "--log-level", "info",
                                  "--test-leak-bytes-on-oom", str(args.leak_bytes)])
    try:
        before = server.admission()
        base = before["devices"][0]
        statuses = drive(server, [completion(args.prompt_tokens, args.max_tokens)] * 8, 8)
        final = wait_idle(server)
        follow_up = server.request("POST", "/v1/completions", completion(args.prompt_tokens, args.max_tokens))[0]
        health = server.request("GET", "/health")[0]
        alive = server.proc.poll() is None
        log = "".join(server.log)
    finally:
        server.stop()
    d = final["devices"][0]
    # The KV block pool shrinks with the cut budget (and grows back later):
    # what must come back is everything else.
    allocated_base = base.get("allocated_bytes", base["used_bytes"]) - kv_pool_bytes(base)
    allocated_after = d.get("allocated_bytes", d["used_bytes"]) - kv_pool_bytes(d)
    problems = []
    if not alive or health != 200:
        problems.append(f"process alive {alive}, /health {health}")
    if final["out_of_memory"] < 1:
        problems.append("no out-of-memory error was counted")
    if statuses.count(200) != len(statuses):
        problems.append(f"statuses {sorted(set(statuses), key=str)}")
    if final["running"] or final["queue_depth"] or d["reserved_bytes"]:
        problems.append("not idle after the requests")
    if allocated_after != allocated_base:
        problems.append(f"allocated {allocated_after} B after, {allocated_base} B before "
                        f"({(allocated_after - allocated_base) / MiB:+.3f} MiB)")
    if follow_up != 200:
        problems.append(f"follow-up request answered {follow_up}")
    source = "CUDA caching allocator" if "CUDA out of memory" in log else "device allocator"
    verdict = "PASS" if not problems else "FAIL (" + "; ".join(problems) + ")"
    print(f"gpu-check inject-oom: {verdict}: step {args.inject_step} failed with out-of-memory from the "
          f"{source} ({final['out_of_memory']} counted), {statuses.count(200)}/{len(statuses)} completed, "
          f"{final.get('preemptions', 0)} preempted, allocated {gb(allocated_after)} after vs "
          f"{gb(allocated_base)} before (KV block pool aside), used {gb(d['used_bytes'])}, follow-up {follow_up}, "
          f"{time.monotonic() - t0:.1f} s", flush=True)
    if problems:
        print(server.tail(40), file=sys.stderr)
    return not problems


# The other process on a GPU: holds all but argv[1] bytes of what is free on
# argv[2] until its stdin closes; prints the bytes it holds and the total.
HOLDER = """
import sys, torch
dev = torch.device(sys.argv[2])
free, total = torch.cuda.mem_get_info(dev)
n = max(0, free - int(sys.argv[1]))
x = torch.empty(n, dtype=torch.uint8, device=dev)
torch.cuda.synchronize(dev)
print(n, total, flush=True)
sys.stdin.read()
"""


def virtual_capacity(device):
    """The bytes of a virt:N=SIZE device string (MiB/GiB/KiB or bytes)."""
    m = re.fullmatch(r"virt:\d+=(\d+)(KiB|MiB|GiB)?", device)
    if not m:
        raise ValueError(f"cannot read the capacity of {device}")
    return int(m.group(1)) << {"KiB": 10, "MiB": 20, "GiB": 30, None: 0}[m.group(2)]


class OtherProcess:
    """Holds all but `keep` bytes of the device while in a `with` block.
    `server_args` are what the server needs to see it (the test hook on a
    virtual device), `held` the bytes it holds."""

    def __init__(self, args, keep):
        self.args, self.keep, self.child, self.path, self.server_args = args, keep, None, None, []

    def __enter__(self):
        if self.args.device.startswith("cuda"):
            self.child = subprocess.Popen([self.args.python, "-c", HOLDER, str(self.keep), self.args.device],
                                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            line = self.child.stdout.readline().split()
            if len(line) != 2:
                raise RuntimeError(f"the memory holder did not start (exit {self.child.wait(timeout=30)})")
            self.held = int(line[0])
            return self
        self.held = virtual_capacity(self.args.device) - self.keep
        fd, self.path = tempfile.mkstemp(prefix="gpu-check-foreign-")
        os.write(fd, str(self.held).encode())
        os.close(fd)
        self.server_args = ["--test-foreign-bytes", f"file:{self.path}"]
        return self

    def __exit__(self, *exc):
        if self.child:
            self.child.stdin.close()
            self.child.wait(timeout=60)
        if self.path:
            os.unlink(self.path)


def check_shared_device(args):
    t0 = time.monotonic()
    keep = args.shared_free_mib * MiB
    with OtherProcess(args, keep) as other:
        server = Server(args.binary, ["--device", args.device, "--model-dir", args.model_dir, "--threads",
                                      str(args.threads), "--admission", "memory", "--max-batch",
                                      str(args.shared_max_batch), "--max-queue", "512", "--queue-timeout", "240",
                                      "--log-level", "info", *other.server_args])
        try:
            start = server.admission()["devices"][0]
            sampler = Sampler(server)
            body = completion(args.shared_prompt_tokens, args.shared_max_tokens)
            statuses = drive(server, [body] * args.shared_requests, args.shared_clients)
            sampler.stop()
            final = wait_idle(server)
            alive = server.proc.poll() is None
            budget_line = next((line.strip() for line in server.log if "budget of " in line), "")
        finally:
            server.stop()
    d = final["devices"][0]
    problems = []
    if start["budget_bytes"] > keep:
        problems.append(f"budget {gb(start['budget_bytes'])} above the {gb(keep)} that was free")
    if statuses.count(200) != len(statuses):
        problems.append(f"statuses {sorted(set(statuses), key=str)}")
    if final["out_of_memory"] != 0:
        problems.append(f"{final['out_of_memory']} out-of-memory errors")
    if not alive:
        problems.append("process exited")
    verdict = "PASS" if not problems else "FAIL (" + "; ".join(problems) + ")"
    print(f"gpu-check shared-device: {verdict}: another process held {gb(other.held)} of {gb(d['capacity_bytes'])}, "
          f"{gb(keep)} left free; budget {gb(start['budget_bytes'])} (foreign {gb(start['foreign_bytes'])} at start); "
          f"{statuses.count(200)}/{len(statuses)} completed, {final['out_of_memory']} OOM, "
          f"{final.get('preemptions', 0)} preempted, at most {sampler.max['running']} running, "
          f"{time.monotonic() - t0:.1f} s", flush=True)
    print(f"gpu-check shared-device: start-up: {budget_line}", flush=True)
    if problems:
        print(server.tail(40), file=sys.stderr)
    return not problems


def texts_of(status, body):
    """An answer's texts, one per choice; None for anything but a 200."""
    return tuple(c["text"] for c in sorted(body["choices"], key=lambda c: c["index"])) if status == 200 else None


def graphs_bodies(args):
    """Greedy completions of several lengths (their steps cross key buckets),
    and some with n = 2, 4 or 8 choices (a batch of that many rows in one
    request: the batch buckets too, with no other client to change it)."""
    bodies = []
    for i in range(args.graphs_requests):
        body = completion(1 + (i * 37) % args.prompt_tokens, args.max_tokens)
        if i % 4 == 3:
            body["n"] = min(args.graphs_max_batch, 2 << (i // 4 % 3))
        bodies.append(body)
    return bodies


def check_graphs(args):
    common = ["--device", args.device, "--model-dir", args.model_dir, "--threads", str(args.threads),
              "--max-batch", str(args.graphs_max_batch)]
    if args.device.startswith("cuda"):
        on, off, kind = ["--cuda-graphs", "on"], ["--cuda-graphs", "off"], "CUDA"
    else:
        on, off, kind = ["--host-kernels", "off", "--test-emulate-cuda-graphs"], ["--host-kernels", "off"], "emulated"
    # One request at a time (--graphs-clients 1): both servers then run the
    # same batches, so answers can differ only where a graph ran a step (a
    # different batch changes cuBLAS's kernels, and rounding, on its own).
    bodies = graphs_bodies(args)
    t0 = time.monotonic()
    runs = {}
    for name, extra in (("on", on), ("off", off)):
        server = Server(args.binary, [*common, *extra])
        try:
            texts = drive(server, bodies, args.graphs_clients, keep=texts_of)
            runs[name] = (texts, server.admission()["devices"][0], server.tail(len(server.log)))
        finally:
            server.stop()
    (on_texts, on_dev, on_log), (off_texts, off_dev, _) = runs["on"], runs["off"]
    recorded = re.search(r"decode graphs on \S+ \(" + kind +
                         r"\): (\d+) graphs for batches up to \d+, ([^(]+) \(charged ([^)]+)\)", on_log)
    problems = []
    if None in on_texts or None in off_texts:
        problems.append(f"failed requests: {on_texts.count(None)} with graphs, {off_texts.count(None)} without")
    differ = sum(1 for a, b in zip(on_texts, off_texts) if a != b)
    if differ:
        problems.append(f"{differ} of {len(bodies)} greedy answers differ with graphs on and off")
    if not recorded:
        problems.append("no 'decode graphs on ...' line in the log")
    if on_dev["resident_bytes"] <= off_dev["resident_bytes"] or on_dev["budget_bytes"] >= off_dev["budget_bytes"]:
        problems.append("the graphs' bytes were not charged")
    verdict = "PASS" if not problems else "FAIL (" + "; ".join(problems) + ")"
    graphs = f"{recorded.group(1)} graphs of {recorded.group(2).strip()}" if recorded else "no graphs"
    print(f"gpu-check graphs: {verdict}: {len(bodies) - differ}/{len(bodies)} greedy answers equal with {kind} "
          f"graphs on and off ({args.graphs_clients} client(s), {sum(1 for b in bodies if 'n' in b)} of them with "
          f"n > 1); {graphs}; resident {gb(on_dev['resident_bytes'])} "
          f"against {gb(off_dev['resident_bytes'])}, budget {gb(on_dev['budget_bytes'])} against "
          f"{gb(off_dev['budget_bytes'])}; {time.monotonic() - t0:.1f} s", flush=True)
    if problems:
        print(on_log[-4000:], file=sys.stderr)
    return not problems


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", required=True, help="the vramgate executable")
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--checks", default="load,inject-oom,shared-device,graphs",
                    help="comma-separated: load, inject-oom, shared-device, graphs")
    ap.add_argument("--prompt-tokens", type=int, default=192)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--requests", type=int, default=32, help="load: completions sent")
    ap.add_argument("--clients", type=int, default=16, help="load: concurrent clients")
    ap.add_argument("--fit", type=int, default=6, help="load: requests the budget holds at once")
    ap.add_argument("--alloc-conf", default="", help="load: PYTORCH_CUDA_ALLOC_CONF for the server")
    ap.add_argument("--load-serve-args", default="",
                    help="load: more `serve` arguments, in one string (e.g. a --memory-reserve)")
    ap.add_argument("--inject-step", type=int, default=4)
    ap.add_argument("--leak-bytes", type=int, default=0,
                    help="inject-oom: bytes each recovery leaks on purpose (the check must then fail)")
    ap.add_argument("--python", default=sys.executable, help="shared-device: the Python with torch (CUDA)")
    ap.add_argument("--shared-free-mib", type=int, default=3 << 10, help="shared-device: MiB the other process leaves")
    ap.add_argument("--shared-requests", type=int, default=96)
    ap.add_argument("--shared-clients", type=int, default=64)
    ap.add_argument("--shared-max-batch", type=int, default=64)
    ap.add_argument("--shared-prompt-tokens", type=int, default=24)
    ap.add_argument("--shared-max-tokens", type=int, default=1000)
    ap.add_argument("--graphs-requests", type=int, default=24)
    ap.add_argument("--graphs-clients", type=int, default=1)
    ap.add_argument("--graphs-max-batch", type=int, default=8, help="graphs: --max-batch, and the largest n")
    args = ap.parse_args()
    checks = {"load": check_load, "inject-oom": check_inject_oom, "shared-device": check_shared_device,
              "graphs": check_graphs}
    unknown = [c for c in args.checks.split(",") if c not in checks]
    if unknown:
        ap.error(f"unknown check(s) {', '.join(unknown)}: choose from {', '.join(checks)}")
    ok = True
    for name in args.checks.split(","):
        try:
            ok = checks[name](args) and ok
        except Exception as e:  # a check that cannot run is a failed check, with its reason
            print(f"gpu-check {name}: FAIL ({type(e).__name__}: {str(e).strip()[-2000:]})", flush=True)
            ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
