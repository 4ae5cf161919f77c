#!/usr/bin/python3
"""Soak test: runs mixed traffic against a real vramgate for a chosen time,
then checks that the server returns to its post-warm-up state.

    /usr/bin/python3 tools/soak.py --seconds 600             # ten minutes
    /usr/bin/python3 tools/soak.py --bin build/asan/vramgate --seconds 120

Traffic (seeded, several client threads): plain and streaming completions,
/infer, streams the client closes after a few events, requests the client
abandons at a short client-side timeout, requests with a tiny server deadline
(504), bad requests (malformed JSON, huge max_tokens, unknown routes, long
URLs, bodies over the limit, a stalled body that gets 408), and out-of-memory
errors injected by --test-inject-oom-step during the run.

After the traffic, once every client is done, it checks:
  * reserved bytes, running sequences and queue depth are 0;
  * device used bytes, the KV block pool set aside, equal their post-warm-up
    value, which is at most resident + workspace (/v1/admission);
  * open file descriptors (/proc/PID/fd) return to their post-warm-up count;
  * RSS after malloc_trim (the --test-trim-heap hook runs it on GET
    /v1/admission) is within --rss-margin-mib MiB or --rss-margin-frac of its
    post-warm-up value, whichever is larger;
  * no response was a 5xx other than the injected out-of-memory 503s, and the
    process is still serving.
Prints a JSON report; exit status 0 when every check holds, 1 otherwise."""
import argparse
import json
import os
import random
import re
import socket
import sys
import threading
import time
from collections import Counter

import requests

from server_process import ServerProcess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_BODY = 65536
READ_TIMEOUT_S = 2
IDLE_TIMEOUT_S = 3
TCP_STATES = {"01": "ESTABLISHED", "02": "SYN_SENT", "03": "SYN_RECV", "04": "FIN_WAIT1", "05": "FIN_WAIT2",
              "06": "TIME_WAIT", "07": "CLOSE", "08": "CLOSE_WAIT", "09": "LAST_ACK", "0A": "LISTEN",
              "0B": "CLOSING"}


class Server(ServerProcess):
    def __init__(self, binary, model_dir, extra):
        try:
            super().__init__([binary, "serve", "--model-dir", model_dir, "--port", "0", "--threads", "1",
                              "--max-body-bytes", str(MAX_BODY), "--read-timeout", str(READ_TIMEOUT_S),
                              "--idle-timeout", str(IDLE_TIMEOUT_S), "--test-trim-heap", *extra],
                             start_timeout=300, ready_timeout=300, keep_lines=200)
        except RuntimeError as e:
            sys.exit(str(e))

    def admission(self):
        return requests.get(self.url + "/v1/admission", timeout=30).json()

    def fds(self):
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    def fd_list(self):
        """What each open descriptor is: its link target, and for a TCP
        socket its state and local/remote ports (from /proc/PID/net/tcp*)."""
        tcp = {}
        for name in ("tcp", "tcp6"):
            try:
                with open(f"/proc/{self.proc.pid}/net/{name}") as f:
                    next(f)
                    for line in f:
                        cols = line.split()
                        local, remote, st, inode = cols[1], cols[2], cols[3], cols[9]
                        tcp[inode] = (f"{TCP_STATES.get(st, st)} :{int(local.rsplit(':', 1)[1], 16)}"
                                      f" -> :{int(remote.rsplit(':', 1)[1], 16)}")
            except OSError:
                pass
        out = []
        d = f"/proc/{self.proc.pid}/fd"
        for fd in sorted(os.listdir(d), key=int):
            try:
                target = os.readlink(f"{d}/{fd}")
            except OSError:
                continue
            m = re.match(r"socket:\[(\d+)\]", target)
            out.append(f"{fd} {target}" + (f" {tcp[m.group(1)]}" if m and m.group(1) in tcp else ""))
        return out

    def rss_bytes(self):
        self.admission()  # runs malloc_trim first (--test-trim-heap)
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS")


def wait_until(cond, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if cond():
                return True
        except (requests.RequestException, OSError):
            pass
        time.sleep(0.05)
    raise TimeoutError(f"timed out waiting for {what}")


def idle(server):
    a = server.admission()
    server.last_admission = a
    return a["queued"] == 0 and a["running"] == 0 and all(d["reserved_bytes"] == 0 for d in a["devices"])


def settled(server):
    """Idle, and every budget cut by an out-of-memory error raised back.

    The KV block pool shrinks with the budget and grows back one quiet
    period at a time; a snapshot taken in between would count the blocks
    not yet given back as used bytes."""
    if not idle(server):
        return False

    def raised(d):
        # A pool's effective budget is a whole number of blocks.
        block = d["kv_blocks"]["block_bytes"] if "kv_blocks" in d else 1
        return d["budget_bytes"] - d["effective_budget_bytes"] < max(1, block)
    return all(raised(d) for d in server.last_admission["devices"])


def raw_exchange(server, data, read=True):
    """Sends raw bytes; returns the status of the answer (0: closed without one)."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as s:
        s.sendall(data)
        if not read:
            return 0
        buf = b""
        while b"\r\n" not in buf:
            chunk = s.recv(4096)
            if not chunk:
                return 0
            buf += chunk
        return int(buf.split(b" ", 2)[1])


# Each kind returns an outcome label; statuses are counted by the caller.
def k_plain(server, rng):
    body = {"prompt": rng.choice(["Hello", "The meaning of", "Once upon a time"]), "max_tokens": rng.randint(1, 24)}
    return requests.post(server.url + "/v1/completions", json=body, timeout=120).status_code


def k_infer(server, rng):
    return requests.post(server.url + "/infer", json={"prompt": "Hi", "max_tokens": rng.randint(1, 8)},
                         timeout=120).status_code


def k_stream(server, rng):
    body = {"prompt": "Once", "max_tokens": rng.randint(4, 32), "stream": True}
    with requests.post(server.url + "/v1/completions", json=body, stream=True, timeout=120) as r:
        if r.status_code != 200:
            return r.status_code
        done = any(line == b"data: [DONE]" for line in r.iter_lines())
        return 200 if done else "stream-unfinished"


def k_disconnect(server, rng):
    body = {"prompt": "The", "max_tokens": 200, "stream": True, "ignore_eos": True}
    r = requests.post(server.url + "/v1/completions", json=body, stream=True, timeout=120)
    status = r.status_code
    lines = r.iter_lines()
    for _ in range(rng.randint(1, 4)):
        next(lines, None)
    r.close()
    return status


def k_client_timeout(server, rng):
    body = {"prompt": "The", "max_tokens": 200, "ignore_eos": True}
    try:
        return requests.post(server.url + "/v1/completions", json=body, timeout=rng.choice([0.01, 0.05, 0.2])).status_code
    except requests.Timeout:
        return "client-timeout"


def k_deadline(server, rng):
    body = {"prompt": "The", "max_tokens": 200, "ignore_eos": True, "timeout": 0.001}
    return requests.post(server.url + "/v1/completions", json=body, timeout=120).status_code


def k_bad(server, rng):
    choice = rng.randrange(6)
    if choice == 0:
        return requests.post(server.url + "/v1/completions", data=b'{"prompt": ', timeout=30).status_code
    if choice == 1:
        return requests.post(server.url + "/v1/completions", json={"prompt": "x", "max_tokens": 10**9},
                             timeout=30).status_code
    if choice == 2:
        return requests.get(server.url + "/no/such/route", timeout=30).status_code
    if choice == 3:
        return raw_exchange(server, b"GET /health?" + b"q" * 20000 + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    if choice == 4:
        return requests.post(server.url + "/v1/completions", data=b"x" * (MAX_BODY + 1), timeout=30).status_code
    # A body that stalls: 408 after the read timeout.
    return raw_exchange(server, b"POST /infer HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")


KINDS = [(k_plain, 30), (k_infer, 10), (k_stream, 20), (k_disconnect, 10), (k_client_timeout, 10),
         (k_deadline, 5), (k_bad, 15)]


def traffic(server, seconds, clients, seed):
    counts = Counter()
    lock = threading.Lock()
    stop_at = time.monotonic() + seconds
    errors = []

    def client(i):
        rng = random.Random(seed * 1000 + i)
        fns, weights = zip(*KINDS)
        while time.monotonic() < stop_at:
            fn = rng.choices(fns, weights)[0]
            try:
                outcome = fn(server, rng)
            except (requests.RequestException, OSError) as e:
                outcome = "client-error"
                errors.append(f"{fn.__name__}: {e}")
            with lock:
                counts[f"{fn.__name__[2:]}:{outcome}"] += 1

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return counts, errors


def snapshot(server):
    # Descriptors first: each request below opens a connection that the
    # server closes a moment after the client has its answer.
    fds = server.fds()
    a = server.admission()
    d = a["devices"][0]
    kv = d.get("kv_blocks")
    # The KV block pool is allocated once (and shrinks and grows back with
    # the budget after an out-of-memory error): it is not what a leak grows.
    pool = kv["total"] * kv["block_bytes"] if kv else 0
    return {"fds": fds, "rss_bytes": server.rss_bytes(), "used_bytes": d["used_bytes"] - pool, "kv_pool_bytes": pool,
            "resident_bytes": d["resident_bytes"], "workspace_bytes": d["workspace_bytes"],
            "reserved_bytes": d["reserved_bytes"], "running": a["running"], "queue_depth": a["queue_depth"], "queued": a["queued"],
            "out_of_memory": a["out_of_memory"], "completed": a["completed"], "cancelled": a["cancelled"],
            "failed": a["failed"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.environ.get("VRAMGATE_BIN", os.path.join(ROOT, "build/release/vramgate")))
    ap.add_argument("--model-dir", default=os.environ.get("VRAMGATE_MODEL_DIR", os.path.join(ROOT, "models/tinylm")))
    ap.add_argument("--seconds", type=float, default=120, help="traffic time after warm-up")
    ap.add_argument("--warmup-seconds", type=float, default=10)
    ap.add_argument("--clients", type=int, default=6)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--oom-step", type=int, default=300, help="engine step of the injected OOMs (0: none)")
    ap.add_argument("--serve-arg", action="append", default=[], metavar="ARG",
                    help="one more `vramgate serve` argument (repeat for each), e.g. --serve-arg=--prefill-worker")
    ap.add_argument("--rss-margin-mib", type=float, default=48)
    ap.add_argument("--rss-margin-frac", type=float, default=0.10)
    ap.add_argument("--no-rss-check", action="store_true",
                    help="skip the RSS check (sanitizer builds: their allocator keeps freed memory)")
    ap.add_argument("--report", help="also write the JSON report to this file")
    args = ap.parse_args()

    extra = ["--oom-quiet-period", "2"]
    if args.oom_step > 0:
        extra += ["--test-inject-oom-step", str(args.oom_step), "--test-inject-oom-count", "3"]
    server = Server(args.bin, args.model_dir, extra + args.serve_arg)
    report = {"seconds": args.seconds, "clients": args.clients, "seed": args.seed, "serve_args": args.serve_arg}
    failures = []
    try:
        warm, _ = traffic(server, args.warmup_seconds, args.clients, args.seed + 7919)
        wait_until(lambda: settled(server), 120, "idle, with the budget raised back, after warm-up")
        # Every connection of the warm-up has ended once the read and idle
        # timeouts have passed since its last byte: the fd baseline is then stable.
        time.sleep(READ_TIMEOUT_S + IDLE_TIMEOUT_S + 1)
        base_fds = server.fd_list()
        base = snapshot(server)
        counts, errors = traffic(server, args.seconds, args.clients, args.seed)
        wait_until(lambda: settled(server), 120, "idle, with the budget raised back, after the traffic")
        try:
            wait_until(lambda: server.fds() <= base["fds"], 30, "file descriptors back to the baseline")
        except TimeoutError:
            pass  # reported below
        end_fds = server.fd_list()
        end = snapshot(server)
        if end["fds"] > base["fds"]:
            base["fd_list"], end["fd_list"] = base_fds, end_fds
        report.update(warmup=dict(warm), baseline=base, end=end, counts=dict(sorted(counts.items())),
                      client_errors=errors[:20], requests=sum(counts.values()))

        def check(ok, what):
            if not ok:
                failures.append(what)

        check(end["reserved_bytes"] == 0 and end["running"] == 0 and end["queued"] == 0,
              "admission state not back to zero")
        check(end["used_bytes"] == base["used_bytes"], "device used bytes differ from the post-warm-up value")
        check(base["used_bytes"] <= base["resident_bytes"] + base["workspace_bytes"],
              "post-warm-up used bytes exceed resident + workspace")
        # A leak grows the count; the baseline may still hold one of its own
        # keep-alive connections, which the server closes later.
        check(end["fds"] <= base["fds"], f"open fds {end['fds']} > post-warm-up {base['fds']}")
        margin = max(args.rss_margin_mib * 2**20, args.rss_margin_frac * base["rss_bytes"])
        report["rss_margin_bytes"] = int(margin)
        report["rss_growth_bytes"] = end["rss_bytes"] - base["rss_bytes"]
        check(args.no_rss_check or end["rss_bytes"] <= base["rss_bytes"] + margin, "RSS grew beyond the margin")
        # 503: the injected OOMs; 504: the requests sent with a 1 ms deadline.
        bad = {k: v for k, v in counts.items()
               if re.search(r":5\d\d$", k) and not k.endswith(":503") and k != "deadline:504"}
        check(not bad, f"unexpected 5xx responses: {bad}")
        check(not [k for k in counts if k.endswith(":client-error") or k.endswith(":0")],
              "connections closed without an answer")
        check(args.oom_step == 0 or end["out_of_memory"] > base["out_of_memory"] or base["out_of_memory"] > 0,
              "no injected out-of-memory happened (run longer or lower --oom-step)")
        check(requests.get(server.url + "/health", timeout=30).status_code == 200, "/health not 200")
    except TimeoutError as e:
        failures.append(f"{e}; last /v1/admission: {json.dumps(getattr(server, 'last_admission', None))}")
    finally:
        rc = server.stop()
        report["exit_code"] = rc
        if rc != 0:
            failures.append(f"server exit code {rc}")
    report["failures"] = failures
    report["ok"] = not failures
    text = json.dumps(report, indent=2)
    print(text)
    if args.report:
        with open(args.report, "w") as f:
            f.write(text + "\n")
    if failures:
        print("soak: FAILED: " + "; ".join(failures), file=sys.stderr)
        print(server.tail(40), file=sys.stderr)
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
