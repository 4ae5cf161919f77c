#!/usr/bin/python3
"""One virtual device vs two, on the same build and traffic.

Closed loop: C clients (default 16) each stream R completions back to back
(generated lengths drawn from [max_tokens/2, 3*max_tokens/2] with a fixed seed
per client, end-of-text ignored, so every configuration does exactly the same
work). Measures aggregate decode tokens/s, goodput (successful requests/s) and
time to first token (p50, p99) for three configurations of one server, each
device with the same capacity and the same `--max-batch`:

  1dev-1thr  `--device virt:0=CAP --threads 1`
  1dev-2thr  `--device virt:0=CAP --threads 2`
  2dev-1thr  `--device virt:0=CAP --device virt:1=CAP --threads 1`

`--threads N` is the number of compute threads each engine runs its tensor ops
with, and there is one engine per device. Two devices with one thread each use
two cores for compute, so the fair baselines are one device with one thread
(same per-engine compute) and one device with two threads (same total compute
threads). The configurations run in turn, `--repeats` rounds, each with a fresh
server; every run is reported (no run is dropped), and the summary gives the
median of each configuration. At the end of each 2-device run the per-device
counters of /v1/admission show how the shared queue spread the work; during
each run /v1/admission is sampled for per-device reserved bytes. Writes a JSON
and a Markdown report.

The model is a random GPT-2 of 6 layers x 512, so that a decode step weighs
more than the fixed overheads of a step and of HTTP:

    /usr/bin/python3 tools/make_random_gpt2.py --out /tmp/gpt2-6x512 --seed 3 \
        --layers 6 --heads 8 --embd 512 --positions 256
    /usr/bin/python3 bench/multi_device.py --binary build/release/vramgate \
        --model-dir /tmp/gpt2-6x512 --nice -10 --out bench/reports/multi-device

`--nice -10` (needs root) puts the runner, its load generator and the servers
it starts ahead of other work on a shared machine. Where the kernel groups
processes by session for scheduling (/proc/sys/kernel/sched_autogroup_enabled
= 1), a process's niceness only orders it within its session, so the runner
also sets its session's autogroup niceness (/proc/self/autogroup) for the
run and puts the old value back at the end.
"""
import argparse
import concurrent.futures
import json
import os
import statistics
import threading
import time

import requests

from common import Server, closed_loop, percentile, raise_priority, split_outcomes, stream_completion

CONFIGS = [  # name, devices, compute threads per engine
    ("1dev-1thr", 1, 1),
    ("1dev-2thr", 1, 2),
    ("2dev-1thr", 2, 1),
]


class AdmissionSampler:
    """Samples /v1/admission every `period` s: per-device reserved bytes (and
    running sequences where the server reports them)."""

    def __init__(self, url, period=0.25):
        self.url, self.period = url, period
        self.samples = []
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.thread.start()

    def loop(self):
        while not self.stop_event.wait(self.period):
            try:
                st = requests.get(self.url + "/v1/admission", timeout=5).json()
            except (requests.RequestException, ValueError):
                continue
            self.samples.append({d["name"]: {"reserved": d.get("reserved_bytes", 0), "running": d.get("running")}
                                 for d in st["devices"]})

    def stop(self):
        self.stop_event.set()
        self.thread.join()
        names = sorted({n for s in self.samples for n in s})
        out = {}
        for n in names:
            res = [s[n]["reserved"] for s in self.samples if n in s]
            run = [s[n]["running"] for s in self.samples if n in s and s[n]["running"] is not None]
            out[n] = {"samples": len(res), "mean_reserved_bytes": statistics.fmean(res) if res else None,
                      "mean_running": statistics.fmean(run) if run else None}
        return out


def cpu_seconds(pid):
    """User + system CPU seconds of process `pid` (all its threads) so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one_run(args, name, devices, threads):
    device_flags = []
    for d in range(devices):
        device_flags += ["--device", f"virt:{d}={args.capacity}"]
    load_before = os.getloadavg()
    server = Server(args.binary, "--model-dir", args.model_dir, *device_flags, "--threads", str(threads),
                    "--max-batch", str(args.max_batch), "--max-queue", "256")
    try:
        # warm-up: one short request per device, at once
        with concurrent.futures.ThreadPoolExecutor(devices) as ex:
            list(ex.map(lambda i: stream_completion(server.url, {"prompt": "warm up", "max_tokens": 8}),
                        range(devices)))
        before = requests.get(server.url + "/v1/admission", timeout=10).json()
        sampler = AdmissionSampler(server.url)
        server_cpu0, own0 = cpu_seconds(server.proc.pid), os.times()
        records, wall = closed_loop(server.url, args.clients, args.per_client, args.max_tokens)
        server_cpu = cpu_seconds(server.proc.pid) - server_cpu0
        own1 = os.times()
        client_cpu = (own1.user - own0.user) + (own1.system - own0.system)
        sampled = sampler.stop()
        after = requests.get(server.url + "/v1/admission", timeout=10).json()
    finally:
        server.stop()
    load_after = os.getloadavg()
    ok, errors = split_outcomes(records)
    per_device = []
    done_before = {d["name"]: d.get("completed") for d in before["devices"]}
    for d in after["devices"]:
        c = d.get("completed")
        per_device.append({
            "name": d["name"], "ready": d.get("ready"), "state": d.get("state"),
            # completions of the measured traffic (the warm-up requests subtracted)
            "completed": None if c is None else c - (done_before.get(d["name"]) or 0),
            "peak_reserved_bytes": d.get("peak_reserved_bytes"), "budget_bytes": d.get("budget_bytes"),
            "mean_reserved_bytes": sampled.get(d["name"], {}).get("mean_reserved_bytes"),
            "mean_running": sampled.get(d["name"], {}).get("mean_running"),
        })
    return {"config": name, "devices": devices, "threads": threads, "requests": len(records), "ok": len(ok),
            "errors": errors, "tokens": sum(r["tokens"] for r in ok), "wall_s": wall,
            "tokens_per_s": sum(r["tokens"] for r in ok) / wall,
            "goodput_rps": len(ok) / wall,
            # cores busy on average during the traffic: the server, and this runner (its clients and sampler)
            "server_cores": server_cpu / wall, "client_cores": client_cpu / wall,
            "ttft_p50_ms": 1000 * (percentile([r["ttft_s"] for r in ok], 50) or 0),
            "ttft_p99_ms": 1000 * (percentile([r["ttft_s"] for r in ok], 99) or 0),
            "admission_completed_total": after.get("completed", 0) - before.get("completed", 0),
            "out_of_memory": after.get("out_of_memory"), "per_device": per_device,
            "loadavg_before": load_before, "loadavg_after": load_after}


def model_desc(model_dir):
    try:
        with open(os.path.join(model_dir, "config.json")) as f:
            c = json.load(f)
    except (OSError, ValueError):
        return "?"
    layers = c.get("n_layer", c.get("num_hidden_layers"))
    width = c.get("n_embd", c.get("hidden_size"))
    return f"{c.get('model_type', '?')}, {layers} layers x {width}"


def mib(b):
    return "-" if b is None else f"{b / 2**20:.1f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default="build/release/vramgate")
    ap.add_argument("--model-dir", default="/tmp/gpt2-6x512")
    ap.add_argument("--capacity", default="256MiB", help="capacity of each virtual device")
    ap.add_argument("--max-batch", type=int, default=8, help="--max-batch of the server (per device)")
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--per-client", type=int, default=8, help="requests per client, back to back")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=4, help="rounds over the three configurations")
    ap.add_argument("--nice", type=int, default=0,
                    help="niceness for the runner, its load generator, the servers it starts and its session's "
                         "autogroup (negative: ahead of other work on a shared machine; needs root)")
    ap.add_argument("--note", default="", help="a line for the report (which build, what else ran)")
    ap.add_argument("--out", default="bench/reports/multi-device")
    args = ap.parse_args()
    priority = raise_priority(args.nice) if args.nice else "niceness 0"

    t_start = time.time()
    runs = []
    for rep in range(args.repeats):
        for name, devices, threads in CONFIGS:
            r = one_run(args, name, devices, threads)
            r["repeat"] = rep + 1
            runs.append(r)
            print(json.dumps({k: v for k, v in r.items() if k != "per_device"}), flush=True)
            for d in r["per_device"]:
                print("   ", json.dumps(d), flush=True)
    elapsed = time.time() - t_start

    summary = {}
    for name, devices, threads in CONFIGS:
        rs = [r for r in runs if r["config"] == name]
        summary[name] = {k: statistics.median(r[k] for r in rs)
                         for k in ("tokens_per_s", "goodput_rps", "ttft_p50_ms", "ttft_p99_ms", "server_cores",
                                   "client_cores")}
    base1, base2, two = summary["1dev-1thr"], summary["1dev-2thr"], summary["2dev-1thr"]
    ratios = {"2dev_vs_1dev_1thr_tokens": two["tokens_per_s"] / base1["tokens_per_s"],
              "2dev_vs_1dev_2thr_tokens": two["tokens_per_s"] / base2["tokens_per_s"],
              "1dev_2thr_vs_1dev_1thr_tokens": base2["tokens_per_s"] / base1["tokens_per_s"],
              "2dev_vs_1dev_1thr_goodput": two["goodput_rps"] / base1["goodput_rps"],
              "2dev_vs_1dev_2thr_goodput": two["goodput_rps"] / base2["goodput_rps"]}

    cores = os.cpu_count()
    loads = [x for r in runs for x in (r["loadavg_before"][0], r["loadavg_after"][0])]
    lines = ["# One virtual device vs two", "",
             f"Model `{args.model_dir}` ({model_desc(args.model_dir)}), each device `virt:N={args.capacity}`, "
             f"`--max-batch {args.max_batch}` per device, {args.clients} closed-loop streaming clients x "
             f"{args.per_client} requests, {args.max_tokens // 2}-{3 * args.max_tokens // 2} generated tokens per "
             "request (same seeded draw in every run, end-of-text ignored); same build, one invocation, a fresh "
             f"server per run, {args.repeats} rounds over the configurations, every run listed. "
             f"Machine: {cores} cores, shared with other jobs; 1-minute load average {min(loads):.2f}-"
             f"{max(loads):.2f} across the runs; runner and servers at {priority}; "
             f"{elapsed / 60:.1f} minutes in all.", "",
             "`--threads N` is per engine, one engine per device: `2dev-1thr` computes on two threads, as "
             "`1dev-2thr` does, and each of its engines computes as `1dev-1thr`'s one does. The load generator "
             f"({args.clients} Python threads) runs on the same {cores} cores.", "",
             f"Reading the numbers: with {args.clients} clients and `--max-batch {args.max_batch}` per device, one "
             f"device runs at most {args.max_batch} sequences while the other clients wait in the queue, so its time "
             "to first token includes that wait; two devices have twice the slots. Tokens/s can only grow as far "
             "as the cores allow: a virtual device is CPU memory, so two of them compute on the same cores as one, "
             "shared with the load generator and, here, with other jobs; less than 2x is expected.", ""]
    if args.note:
        lines += [args.note, ""]
    lines += ["## Medians", "",
             "| config | devices | threads/engine | decode tok/s | goodput (req/s) | TTFT p50 / p99 (ms) | "
             "cores: server / clients |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for name, devices, threads in CONFIGS:
        s = summary[name]
        lines.append(f"| {name} | {devices} | {threads} | {s['tokens_per_s']:.0f} | {s['goodput_rps']:.2f} | "
                     f"{s['ttft_p50_ms']:.0f} / {s['ttft_p99_ms']:.0f} | {s['server_cores']:.2f} / "
                     f"{s['client_cores']:.2f} |")
    lines += ["", "`cores`: CPU seconds used during the traffic divided by its wall time, by the server process "
              "(engines, HTTP threads) and by this runner (its client threads and the sampler).", "",
              f"2 devices vs 1 device x 1 thread: {ratios['2dev_vs_1dev_1thr_tokens']:.2f}x tokens/s, "
              f"{ratios['2dev_vs_1dev_1thr_goodput']:.2f}x goodput; vs 1 device x 2 threads: "
              f"{ratios['2dev_vs_1dev_2thr_tokens']:.2f}x tokens/s, {ratios['2dev_vs_1dev_2thr_goodput']:.2f}x "
              f"goodput. 1 device x 2 threads vs x 1 thread: {ratios['1dev_2thr_vs_1dev_1thr_tokens']:.2f}x "
              "tokens/s.", "",
              "## Every run", "",
              "| round | config | ok / requests | errors | decode tok/s | goodput (req/s) | TTFT p50 / p99 (ms) | "
              "wall (s) | cores: server / clients | load avg before / after |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in runs:
        errs = ", ".join(f"{k}: {v}" for k, v in r["errors"].items()) or "none"
        lines.append(f"| {r['repeat']} | {r['config']} | {r['ok']} / {r['requests']} | {errs} | "
                     f"{r['tokens_per_s']:.0f} | {r['goodput_rps']:.2f} | {r['ttft_p50_ms']:.0f} / "
                     f"{r['ttft_p99_ms']:.0f} | {r['wall_s']:.1f} | {r['server_cores']:.2f} / {r['client_cores']:.2f} | "
                     f"{r['loadavg_before'][0]:.2f} / "
                     f"{r['loadavg_after'][0]:.2f} |")
    lines += ["", "## Balance between devices (2-device runs)", "",
              "Per device at the end of each run, from `/v1/admission` (`completed`: requests it finished in the "
              "measured traffic, warm-up subtracted; `-` where the server does not report it), and the mean "
              "of its reserved bytes and running sequences sampled every 0.25 s during the run.", "",
              "| round | device | completed | mean running | mean reserved (MiB) | peak reserved / budget (MiB) |",
              "| --- | --- | --- | --- | --- | --- |"]
    for r in runs:
        if r["devices"] < 2:
            continue
        for d in r["per_device"]:
            run_s = "-" if d["mean_running"] is None else f"{d['mean_running']:.1f}"
            lines.append(f"| {r['repeat']} | {d['name']} | {'-' if d['completed'] is None else d['completed']} | "
                         f"{run_s} | {mib(d['mean_reserved_bytes'])} | {mib(d['peak_reserved_bytes'])} / "
                         f"{mib(d['budget_bytes'])} |")
    lines.append("")

    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out + ".json", "w") as f:
        json.dump({"settings": vars(args), "priority": priority, "cpu_count": cores, "elapsed_s": elapsed, "runs": runs,
                   "summary": summary, "ratios": ratios}, f, indent=2)
    with open(args.out + ".md", "w") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
