#!/usr/bin/python3
"""Booked retries against the baseline (docs/admission-and-memory.md "Booked retries").

On one build, one server configuration and the same traffic, with
`--retry-bookings on` and `off`:
  1. the unloaded peak: as many closed-loop clients as the batch holds;
  2. overload: about 3x that many closed-loop clients, each of which, when
     refused, waits exactly the retry-after-ms it was given (else
     Retry-After) and sends the same request again;
  3. the same burst driven by the official OpenAI JS SDK (npm `openai`) with
     its default retry policy (2 retries, retry-after-ms first).
Reports the share of retries admitted on their first retry, p50/p99 of
admitted - promised time (admitted: the retry's send time plus the queue wait
the server reports; promised: the refusal's arrival plus its retry-after),
goodput under overload against the unloaded peak, total client wait, and for
the SDK the share of calls that succeed within its own retries. Writes
bench/reports/retry-booking.md and .json.

  bench/retry_booking.py --binary build/release/vramgate
  bench/retry_booking.py --tiny --out-dir /tmp/rb   # seconds: a smoke run
  bench/retry_booking.py --proxy-case   # clients behind one proxy, one body
"""
import argparse
import concurrent.futures
import json
import os
import subprocess
import sys
import threading
import time

import requests

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import Server, percentile  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def retry_wait_s(r):
    """The wait a refusal asks for: retry-after-ms first (as the OpenAI SDKs read it), else Retry-After."""
    ms = r.headers.get("retry-after-ms")
    if ms is not None:
        return float(ms) / 1000
    return float(r.headers.get("Retry-After", "1"))


class Loop:
    """Closed-loop clients until `end`; each retries a refused request after
    the wait it was told. Thread-safe records."""

    def __init__(self, url, max_tokens, end, tag):
        self.url = url
        self.max_tokens = max_tokens
        self.end = end
        self.tag = tag
        self.lock = threading.Lock()
        self.done = []        # (finish time, latency s, retries)
        self.first_retry = []  # True: the first retry of a refused request was admitted
        self.lateness = []     # admitted - promised (s), first retries that were admitted
        self.waited_s = 0.0    # time clients slept on retry-after
        self.errors = {}
        self.body_extra = {}   # more fields of every request's body

    def client(self, i):
        session = requests.Session()
        seq = 0
        while time.monotonic() < self.end:
            seq += 1
            body = {"prompt": f"{self.tag} client {i} request {seq}", "max_tokens": self.max_tokens,
                    "ignore_eos": True, **self.body_extra}
            t0 = time.monotonic()
            retries = 0
            promised = None
            while True:
                sent = time.monotonic()
                try:
                    r = session.post(self.url + "/v1/completions", json=body, timeout=120)
                except requests.RequestException as e:
                    with self.lock:
                        self.errors[type(e).__name__] = self.errors.get(type(e).__name__, 0) + 1
                    break
                now = time.monotonic()
                if r.status_code == 200:
                    admitted = sent + float(r.headers.get("X-Queue-Wait-Ms", "0")) / 1000
                    with self.lock:
                        self.done.append((now, now - t0, retries))
                        if retries == 1:
                            self.first_retry.append(True)
                            self.lateness.append(admitted - promised)
                    break
                if r.status_code != 503:
                    with self.lock:
                        self.errors[str(r.status_code)] = self.errors.get(str(r.status_code), 0) + 1
                    break
                wait = retry_wait_s(r)
                with self.lock:
                    if retries == 1:
                        self.first_retry.append(False)
                if now + wait >= self.end:
                    return  # the run is over before the retry could be sent: this client stops
                promised = now + wait
                retries += 1
                with self.lock:
                    self.waited_s += wait
                time.sleep(wait)  # the client honours the server's retry-after: what is measured

    def run(self, clients):
        with concurrent.futures.ThreadPoolExecutor(clients) as pool:
            list(pool.map(self.client, range(clients)))


def histogram_quantiles(metrics_text, name, qs=(50, 99)):
    """Quantiles of a Prometheus histogram as the upper bound of the bucket
    that holds them (None when it has no samples)."""
    buckets = []
    for line in metrics_text.splitlines():
        if line.startswith(name + "_bucket{"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            buckets.append((float("inf") if le == "+Inf" else float(le), float(line.rsplit(" ", 1)[1])))
    if not buckets or buckets[-1][1] == 0:
        return {q: None for q in qs}
    total = buckets[-1][1]
    return {q: next(le for le, n in buckets if n >= q / 100 * total) for q in qs}


def goodput(loop, start, end):
    n = sum(1 for t, _, _ in loop.done if start <= t <= end)
    return n / (end - start)


def phase(url, clients, seconds, warmup, max_tokens, tag):
    start = time.monotonic()
    loop = Loop(url, max_tokens, start + seconds, tag)
    loop.run(clients)
    return loop, goodput(loop, start + warmup, start + seconds)


def sdk_phase(url, model, clients, seconds, max_tokens):
    script = os.path.join(ROOT, "bench", "retry_booking_sdk.mjs")
    p = subprocess.run(["node", script, url, model, str(clients), str(seconds), str(max_tokens)],
                       capture_output=True, text=True, timeout=seconds + 300, cwd=ROOT)
    if p.returncode != 0:
        raise RuntimeError("the OpenAI SDK run failed:\n" + p.stderr[-4000:])
    out = json.loads(p.stdout.strip().splitlines()[-1])
    out["success_share"] = out["succeeded"] / out["calls"] if out["calls"] else None
    out["latency_p50_s"] = percentile(out["latencies_s"], 50)
    out["latency_p99_s"] = percentile(out["latencies_s"], 99)
    del out["latencies_s"]
    return out


def run_mode(args, mode):
    server_args = ["--model-dir", args.model_dir, "--threads", "1", "--max-batch", str(args.max_batch),
                   "--max-queue", str(args.max_queue), "--test-step-delay-ms", str(args.step_delay_ms),
                   "--retry-bookings", mode]
    server = Server(args.binary, *server_args)
    try:
        model = requests.get(server.url + "/v1/models", timeout=30).json()["data"][0]["id"]
        _, peak = phase(server.url, args.max_batch, args.peak_s, args.warmup_s, args.max_tokens, f"{mode} peak")
        loop, overload = phase(server.url, args.clients, args.overload_s, args.warmup_s, args.max_tokens,
                               f"{mode} overload")
        admission = requests.get(server.url + "/v1/admission", timeout=30).json()
        server_error = histogram_quantiles(requests.get(server.url + "/metrics", timeout=30).text,
                                           "vramgate_retry_promise_error_seconds")
        sdk = None if args.skip_sdk else sdk_phase(server.url, model, args.clients, args.sdk_s, args.max_tokens)
    finally:
        server.stop()
    first = loop.first_retry
    latencies = [lat for _, lat, _ in loop.done]
    return {
        "mode": mode,
        "peak_goodput_rps": peak,
        "overload_goodput_rps": overload,
        "goodput_ratio": overload / peak if peak else None,
        "completed": len(loop.done),
        "refused_then_retried": len(first),
        "first_retry_admitted_share": sum(first) / len(first) if first else None,
        "admitted_minus_promised_p50_s": percentile(loop.lateness, 50),
        "admitted_minus_promised_p99_s": percentile(loop.lateness, 99),
        "server_grant_minus_promise_p50_bucket_s": server_error[50],
        "server_grant_minus_promise_p99_bucket_s": server_error[99],
        "client_wait_total_s": loop.waited_s,
        "latency_p50_s": percentile(latencies, 50),
        "latency_p99_s": percentile(latencies, 99),
        "mean_retries": sum(r for _, _, r in loop.done) / len(loop.done) if loop.done else None,
        "errors": loop.errors,
        "retry_bookings": admission.get("retry_bookings"),
        "sdk": sdk,
    }


def fmt(x, pattern="{:.3f}"):
    return "n/a" if x is None else pattern.format(x)


def pct(x):
    return fmt(None if x is None else 100 * x, "{:.1f} %")


def report_md(args, results):
    on, off = results["on"], results["off"]
    lines = [
        "# Booked retries against the baseline",
        "",
        f"Command: `bench/retry_booking.py {' '.join(sys.argv[1:])}`".rstrip(),
        "",
        f"Server: tinylm (`{args.model_dir}`), `--max-batch {args.max_batch} --max-queue {args.max_queue} "
        f"--test-step-delay-ms {args.step_delay_ms}`, one compute thread; requests of {args.max_tokens} tokens "
        "(`ignore_eos`), so device time bounds throughput. Same build and traffic for both modes; only "
        "`--retry-bookings` changes. 1-minute load average before / after the run: "
        f"{args.load_average[0]} / {args.load_average[1]} (2 cores, shared with other work).",
        "",
        f"Unloaded peak: {args.max_batch} closed-loop clients for {args.peak_s} s. Overload: {args.clients} "
        f"closed-loop clients ({args.clients / args.max_batch:.0f}x the batch) for {args.overload_s} s, each "
        "retrying a refused request after exactly the retry-after-ms (else Retry-After) it was given. Goodput "
        f"counts completions after a {args.warmup_s} s warm-up. admitted - promised: the retry's send time plus "
        "the server's X-Queue-Wait-Ms, minus the refusal's arrival plus its retry-after.",
        "",
        "| | bookings on | bookings off (baseline) |",
        "| --- | --- | --- |",
        f"| retries admitted on their first retry | {pct(on['first_retry_admitted_share'])} "
        f"({on['refused_then_retried']} retried) | {pct(off['first_retry_admitted_share'])} "
        f"({off['refused_then_retried']} retried) |",
        f"| admitted - promised, p50 | {fmt(on['admitted_minus_promised_p50_s'])} s | "
        f"{fmt(off['admitted_minus_promised_p50_s'])} s |",
        f"| admitted - promised, p99 | {fmt(on['admitted_minus_promised_p99_s'])} s | "
        f"{fmt(off['admitted_minus_promised_p99_s'])} s |",
        f"| server's grant - promise (histogram bucket bound), p50 / p99 | "
        f"{fmt(on['server_grant_minus_promise_p50_bucket_s'])} / {fmt(on['server_grant_minus_promise_p99_bucket_s'])} s"
        " | (no bookings) |",
        f"| unloaded peak goodput | {fmt(on['peak_goodput_rps'], '{:.1f}')} req/s | "
        f"{fmt(off['peak_goodput_rps'], '{:.1f}')} req/s |",
        f"| goodput under overload | {fmt(on['overload_goodput_rps'], '{:.1f}')} req/s | "
        f"{fmt(off['overload_goodput_rps'], '{:.1f}')} req/s |",
        f"| overload / peak | {fmt(on['goodput_ratio'], '{:.2f}')} | {fmt(off['goodput_ratio'], '{:.2f}')} |",
        f"| total client wait on retry-after | {fmt(on['client_wait_total_s'], '{:.1f}')} s | "
        f"{fmt(off['client_wait_total_s'], '{:.1f}')} s |",
        f"| completed | {on['completed']} | {off['completed']} |",
        f"| latency p50 / p99 (first send to answer) | {fmt(on['latency_p50_s'], '{:.2f}')} / "
        f"{fmt(on['latency_p99_s'], '{:.2f}')} s | {fmt(off['latency_p50_s'], '{:.2f}')} / "
        f"{fmt(off['latency_p99_s'], '{:.2f}')} s |",
        f"| mean retries per completion | {fmt(on['mean_retries'], '{:.2f}')} | {fmt(off['mean_retries'], '{:.2f}')} |",
    ]
    if on.get("sdk") and off.get("sdk"):
        s_on, s_off = on["sdk"], off["sdk"]
        lines += [
            f"| OpenAI JS SDK: calls that succeed within its retries | {pct(s_on['success_share'])} "
            f"({s_on['succeeded']} of {s_on['calls']}, {s_on['attempts']} attempts) | "
            f"{pct(s_off['success_share'])} ({s_off['succeeded']} of {s_off['calls']}, "
            f"{s_off['attempts']} attempts) |",
        ]
    lines += [
        "",
        f"Server's own count (bookings on): {json.dumps(on['retry_bookings'])}.",
        "",
        "Targets: first-retry admission >= 80 % with bookings: "
        f"{'met' if (on['first_retry_admitted_share'] or 0) >= 0.8 else 'NOT met'}; goodput under overload >= 0.9 "
        f"x the unloaded peak: {'met' if (on['goodput_ratio'] or 0) >= 0.9 else 'NOT met'}.",
        "",
    ]
    if results.get("choices"):
        import retry_choices
        lines += retry_choices.report_lines(args, results["choices"])
    if args.tiny:
        lines.insert(2, "**Tiny smoke run: seconds of traffic, figures not meaningful.**\n")
    return "\n".join(lines)


# -- Clients behind one proxy, all sending the same body ---------------------
# Many users of one upstream service asking the same thing reach the server
# from one address (the proxy's). A refused request's retry is recognised by
# body within a client, so an identical fresh request could take the booking
# meant for another's retry, and a per-client share counted everyone behind
# the proxy as one client. `--proxy-case` measures it under each policy.

PROXY_POLICIES = [
    # (name, server args, clients send x-stainless-retry-count)
    ("before: the count not read, proxy not trusted", [], False),
    ("after, default: the count read, proxy not trusted", [], True),
    ("after: the count read, --trusted-proxy 127.0.0.1", ["--trusted-proxy", "127.0.0.1"], True),
    ("--trusted-proxy 127.0.0.1, no count sent", ["--trusted-proxy", "127.0.0.1"], False),
    # Fewer places: the per-client share binds (one client holds at most half).
    ("--max-retry-bookings 12, the count read, proxy not trusted", ["--max-retry-bookings", "12"], True),
    ("--max-retry-bookings 12, the count read, --trusted-proxy 127.0.0.1",
     ["--max-retry-bookings", "12", "--trusted-proxy", "127.0.0.1"], True),
]


class SameBodyLoop(Loop):
    """Loop's closed-loop clients, all sending one body through a proxy on
    127.0.0.1 that names each client in X-Forwarded-For; with `send_count`,
    each attempt carries x-stainless-retry-count (0 first, then the retry's
    number) as the OpenAI SDKs send it."""

    def __init__(self, url, max_tokens, end, tag, send_count):
        super().__init__(url, max_tokens, end, tag)
        self.send_count = send_count

    def client(self, i):
        session = requests.Session()
        body = {"prompt": f"{self.tag} the same question", "max_tokens": self.max_tokens, "ignore_eos": True}
        while time.monotonic() < self.end:
            t0 = time.monotonic()
            retries = 0
            promised = None
            while True:
                headers = {"X-Forwarded-For": f"10.0.{i}.1"}
                if self.send_count:
                    headers["x-stainless-retry-count"] = str(retries)
                sent = time.monotonic()
                try:
                    r = session.post(self.url + "/v1/completions", json=body, headers=headers, timeout=120)
                except requests.RequestException as e:
                    with self.lock:
                        self.errors[type(e).__name__] = self.errors.get(type(e).__name__, 0) + 1
                    break
                now = time.monotonic()
                with self.lock:
                    if r.status_code == 200:
                        self.done.append((now, now - t0, retries))
                        if retries == 1:
                            self.first_retry.append(True)
                            self.lateness.append(sent + float(r.headers.get("X-Queue-Wait-Ms", "0")) / 1000 - promised)
                    elif r.status_code != 503:
                        self.errors[str(r.status_code)] = self.errors.get(str(r.status_code), 0) + 1
                    elif retries == 1:
                        self.first_retry.append(False)
                if r.status_code != 503:
                    break
                wait = retry_wait_s(r)
                if now + wait >= self.end:
                    return
                promised = now + wait
                retries += 1
                with self.lock:
                    self.waited_s += wait
                time.sleep(wait)  # the client honours the server's retry-after


def proxy_policy(args, name, extra, send_count):
    server = Server(args.binary, "--model-dir", args.model_dir, "--threads", "1", "--max-batch", str(args.max_batch),
                    "--max-queue", str(args.max_queue), "--test-step-delay-ms", str(args.step_delay_ms), *extra)
    try:
        start = time.monotonic()
        loop = SameBodyLoop(server.url, args.max_tokens, start + args.overload_s, "proxy", send_count)
        loop.run(args.clients)
        admission = requests.get(server.url + "/v1/admission", timeout=30).json()
    finally:
        server.stop()
    first = loop.first_retry
    return {
        "policy": name,
        "server_args": extra,
        "sends_retry_count": send_count,
        "refused_then_retried": len(first),
        "first_retry_admitted_share": sum(first) / len(first) if first else None,
        "admitted_minus_promised_p50_s": percentile(loop.lateness, 50),
        "admitted_minus_promised_p99_s": percentile(loop.lateness, 99),
        "completed": len(loop.done),
        "goodput_rps": goodput(loop, start + args.warmup_s, start + args.overload_s),
        "mean_retries": sum(r for _, _, r in loop.done) / len(loop.done) if loop.done else None,
        "errors": loop.errors,
        "retry_bookings": admission.get("retry_bookings"),
    }


def proxy_report_md(args, results):
    lines = [
        "# Booked retries behind one proxy: clients sending the same body",
        "",
        f"Command: `bench/retry_booking.py {' '.join(sys.argv[1:])}`".rstrip(),
        "",
        f"Server: tinylm, `--max-batch {args.max_batch} --max-queue {args.max_queue} --test-step-delay-ms "
        f"{args.step_delay_ms}`, one compute thread, `--retry-bookings on`; requests of {args.max_tokens} tokens "
        f"(`ignore_eos`). {args.clients} closed-loop clients for {args.overload_s} s, all from 127.0.0.1 with one "
        "and the same body, each named by its own `X-Forwarded-For` (as a proxy in front writes it), each "
        "retrying a refused request after exactly the retry-after-ms it was given. 1-minute load average before / "
        f"after: {args.load_average[0]} / {args.load_average[1]} (2 cores, shared with other work).",
        "",
        "| policy | retries admitted on their first retry | goodput | completed | mean retries | bookings "
        "booked / claimed / expired / early / refused |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        b = r["retry_bookings"] or {}
        counts = " / ".join(str(b.get(k, "n/a")) for k in ("booked", "claimed", "expired", "early", "refused"))
        lines.append(f"| {r['policy']} | {pct(r['first_retry_admitted_share'])} ({r['refused_then_retried']} "
                     f"retried) | {fmt(r['goodput_rps'], '{:.1f}')} req/s | {r['completed']} | "
                     f"{fmt(r['mean_retries'], '{:.2f}')} | {counts} |")
    lines += [
        "",
        "Before: the server could not tell a fresh request from a retry: an identical fresh request from behind "
        "the proxy took the booking of a refused one, whose retry then found none, or, when that booking was not "
        "yet due, was itself refused as an early retry (the early count). After: a request that says it is a "
        "first attempt (`x-stainless-retry-count: 0`, as the OpenAI SDKs send it) is never matched by its body, "
        "and one that says it is a retry takes an open booking of its client and body, so the default "
        "configuration admits every first retry; `--trusted-proxy` makes each forwarded client its own client "
        "(its own share, its own body matches), which is enough even for clients that send no count.",
        "",
        "With fewer places (`--max-retry-bookings 12`) the places, not identity, bound first-retry admission. "
        "Behind an untrusted proxy everyone is one client holding at most half of them; a refusal beyond them "
        "books nothing, but its retry (same client, same body) takes whichever of that client's bookings is open, "
        "so the clients use each other's places (and a retry that finds only ones not yet due is told to come "
        "back: the early count). Behind a trusted proxy each client keeps its own place and no one takes it, "
        "and the refusals that find all 12 held book nothing.",
        "",
    ]
    if args.tiny:
        lines.insert(2, "**Tiny smoke run: seconds of traffic, figures not meaningful.**\n")
    return "\n".join(lines)


def proxy_case(args):
    load_before = os.getloadavg()[0]
    results = [proxy_policy(args, name, extra, send_count) for name, extra, send_count in PROXY_POLICIES]
    args.load_average = [round(load_before, 2), round(os.getloadavg()[0], 2)]
    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, "retry-booking-proxy.json"), "w") as f:
        json.dump({"config": vars(args), "results": results}, f, indent=2)
    md = proxy_report_md(args, results)
    with open(os.path.join(args.out_dir, "retry-booking-proxy.md"), "w") as f:
        f.write(md)
    print(md)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default=os.path.join(ROOT, "build/release/vramgate"))
    ap.add_argument("--model-dir", default=os.path.join(ROOT, "models/tinylm"))
    ap.add_argument("--out-dir", default=os.path.join(ROOT, "bench/reports"))
    ap.add_argument("--max-batch", type=int, default=8)
    ap.add_argument("--max-queue", type=int, default=2)
    ap.add_argument("--step-delay-ms", type=float, default=20)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--clients", type=int, default=None, help="overload clients (default 3 x --max-batch)")
    ap.add_argument("--peak-s", type=float, default=10)
    ap.add_argument("--overload-s", type=float, default=30)
    ap.add_argument("--sdk-s", type=float, default=15)
    ap.add_argument("--warmup-s", type=float, default=2)
    ap.add_argument("--skip-sdk", action="store_true", help="without the OpenAI SDK phase")
    ap.add_argument("--choices-s", type=float, default=20, help="seconds of each run of the n = 4 case")
    ap.add_argument("--choices-tokens", type=int, default=40, help="tokens of a request in the n = 4 case")
    ap.add_argument("--skip-choices", action="store_true", help="without the n = 4 case (retry_choices.py)")
    ap.add_argument("--tiny", action="store_true", help="a few seconds per phase (smoke test)")
    ap.add_argument("--proxy-case", action="store_true",
                    help="only clients behind one proxy sending the same body, under each policy "
                         "(writes retry-booking-proxy.md and .json)")
    args = ap.parse_args()
    if args.tiny:
        args.max_batch, args.max_queue, args.max_tokens = 2, 1, 4
        args.peak_s, args.overload_s, args.sdk_s, args.warmup_s = 1.5, 2.5, 2, 0.2
        args.choices_s, args.choices_tokens = 2.5, 8
    if args.clients is None:
        args.clients = 3 * args.max_batch
    if args.proxy_case:
        proxy_case(args)
        return
    load_before = os.getloadavg()[0]
    results = {mode: run_mode(args, mode) for mode in ("on", "off")}
    if not args.skip_choices:
        import retry_choices  # the n = 4 case
        results["choices"] = retry_choices.run_both(args)
    args.load_average = [round(load_before, 2), round(os.getloadavg()[0], 2)]
    os.makedirs(args.out_dir, exist_ok=True)
    config = {k: v for k, v in vars(args).items()}
    with open(os.path.join(args.out_dir, "retry-booking.json"), "w") as f:
        json.dump({"config": config, "results": results}, f, indent=2)
    md = report_md(args, results)
    with open(os.path.join(args.out_dir, "retry-booking.md"), "w") as f:
        f.write(md)
    print(md)


if __name__ == "__main__":
    main()
