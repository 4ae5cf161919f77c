#!/usr/bin/python3
"""Scenario runner: the same traffic against the same build under
`--admission none`, `fixed:N` for N = 1..k and `memory`, then a report.

Everything the sweep does is fixed in its config file (bench/scenarios.toml):
the server flags, the device capacity, the traffic mixes (closed loop), the
repeats, and an open-loop load curve. Each (policy, mix, repeat) runs on a
fresh server, so the server's peak counters are those of that run.

    bench/scenarios.py --config bench/scenarios.toml --binary build/release/vramgate

writes bench/reports/<name>.md (tables and the targets), <name>.json
(summaries and the samples the plots use) and <name>-memory.png,
<name>-latency-cdf.png, <name>-goodput.png. Per-run load generator output
(one record per request) goes to --work (default /tmp/vramgate-bench/<name>).
`--quick` runs one repeat of a reduced sweep for trying changes out.
"""
import argparse
import json
import os
import sys
import time
import tomllib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import loadgen  # noqa: E402
import report  # noqa: E402
from common import raise_priority  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
from server_process import ServerProcess  # noqa: E402


class Server(ServerProcess):
    """A vramgate server on a free port, logging to a file."""

    def __init__(self, binary, args, log_path):
        super().__init__([binary, "serve", "--port", "0", *args], ready_timeout=120, keep_lines=200,
                         log_path=log_path)

    def cpu_seconds(self):
        """User + system CPU time of the server process so far (Linux /proc)."""
        try:
            with open(f"/proc/{self.proc.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError):
            return None


def server_args(cfg, policy):
    s = cfg["server"]
    args = ["--model-dir", s["model_dir"], "--device", s["device"], "--threads", str(s["threads"]),
            "--admission", policy]
    return args + [str(a) for a in s.get("extra_args", [])]


def one_run(cfg, binary, policy, work, tag, **load):
    sw = cfg["sweep"]
    server = Server(binary, server_args(cfg, policy), os.path.join(work, tag + ".log"))
    try:
        load1 = os.getloadavg()[0]
        cpu0 = server.cpu_seconds()
        result = loadgen.run(server.url, timeout=sw["timeout_s"], sample_interval=sw["sample_interval_s"],
                             seed=sw["seed"], **load)
        cpu1 = server.cpu_seconds()
        result["summary"]["server_cpu_s"] = cpu1 - cpu0 if cpu0 is not None and cpu1 is not None else None
        result["summary"]["loadavg_1m"] = load1
    finally:
        server.stop()
    with open(os.path.join(work, tag + ".json"), "w") as f:
        json.dump(result, f)
    s = result["summary"]
    print(f"{tag:28s} ok {s['succeeded']:4d}/{s['requests']:<4d} goodput {s['goodput_rps']:6.2f} req/s "
          f"{s['goodput_tokens_per_s']:7.0f} tok/s  oom {s['out_of_memory_failures']:3d}/"
          f"{s['server_out_of_memory_events']:<3d} p99 {s['latency_s']['p99'] or 0:6.2f}s  "
          f"peak {s['peak_device_bytes'] / 2**20:5.1f} MiB reserved {s['peak_reserved_bytes'] / 2**20:5.1f} MiB "
          f"wall {s['wall_s']:5.1f}s cpu server {s['server_cpu_s'] or 0:5.1f}s client {s['client_cpu_s']:4.1f}s",
          flush=True)
    return result


def policies(cfg):
    return ["none"] + [f"fixed:{n}" for n in range(1, cfg["sweep"]["fixed_max"] + 1)] + ["memory"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="bench/scenarios.toml")
    ap.add_argument("--binary", default="build/release/vramgate")
    ap.add_argument("--out-dir", default="bench/reports")
    ap.add_argument("--work", default=None, help="per-run JSON and server logs (default /tmp/vramgate-bench/<name>)")
    ap.add_argument("--quick", action="store_true", help="one repeat, fewer policies, no load curve")
    ap.add_argument("--nice", type=int, default=0,
                    help="niceness for the runner, its load generator and the servers it starts, and for its "
                         "session's autogroup (negative: ahead of other work on a shared machine; needs root)")
    ap.add_argument("--note", default="", help="a line for the report (which build, what else ran)")
    args = ap.parse_args()
    priority = raise_priority(args.nice) if args.nice else ""
    if priority:
        print(priority, flush=True)
    with open(args.config, "rb") as f:
        cfg = tomllib.load(f)
    name = cfg["name"] + ("-quick" if args.quick else "")
    work = args.work or os.path.join("/tmp/vramgate-bench", name)
    os.makedirs(work, exist_ok=True)
    os.makedirs(args.out_dir, exist_ok=True)
    repeats = 1 if args.quick else cfg["sweep"]["repeats"]
    pols = policies(cfg)
    if args.quick:
        pols = ["none", "fixed:1", f"fixed:{cfg['sweep']['fixed_max'] // 2}", f"fixed:{cfg['sweep']['fixed_max']}",
                "memory"]

    t_start = time.monotonic()
    runs = []  # {"mix", "policy", "repeat", "summary", "samples", "latencies"}
    # Repeat-major, so that each policy's repeats spread over the sweep (the
    # machine is shared: a busy minute should not land on one policy only).
    for rep in range(repeats):
        for mix in cfg["mix"]:
            for policy in pols:
                tag = f"{mix['name']}-{policy.replace(':', '')}-r{rep}"
                res = one_run(cfg, args.binary, policy, work, tag, mix=mix["classes"], users=mix["users"],
                              requests=mix["requests"])
                # The plots use the first repeat's samples; later ones stay in --work.
                runs.append({"mix": mix["name"], "policy": policy, "repeat": rep, "summary": res["summary"],
                             "samples": res["samples"] if rep == 0 else [],
                             "latencies": sorted(round(r["latency_s"], 4) for r in res["records"]
                                                   if r["status"] == 200)})
    curve = []
    lc = cfg.get("load_curve")
    if lc and not args.quick:
        mix = next(m for m in cfg["mix"] if m["name"] == lc["mix"])
        for policy in lc["policies"]:
            for rate in lc["rates"]:
                tag = f"curve-{policy.replace(':', '')}-{rate}"
                res = one_run(cfg, args.binary, policy, work, tag, mix=mix["classes"], rate=rate,
                              duration=lc["duration_s"])
                curve.append({"policy": policy, "rate": rate, "summary": res["summary"]})
    elapsed = time.monotonic() - t_start

    data = {"config": cfg, "config_file": args.config, "binary": args.binary, "quick": args.quick,
            "elapsed_s": elapsed, "host_cpus": os.cpu_count(), "runs": runs, "load_curve": curve,
            "command": " ".join([os.path.relpath(sys.argv[0])] + sys.argv[1:]), "note": args.note}
    base = os.path.join(args.out_dir, name)
    text = report.write(data, base)
    print(text)
    print(f"sweep took {elapsed:.0f} s; report {base}.md")


if __name__ == "__main__":
    main()
