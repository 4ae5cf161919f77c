#!/usr/bin/python3
"""TorchScript serving: the image-to-image test model (tools/make_torchscript_models.py)
at mixed resolutions on one small virtual device.

1. Admission: 32 clients in a closed loop, each sending images of 96, 128,
   192 and 256 pixels a side in turn, under --admission none, fixed:N for
   several N, and memory. For each: goodput (images answered 200 per second),
   out-of-memory failures, 503s, peak device memory against capacity.
2. Dynamic batching: 16 clients sending 96 x 96 images, memory admission,
   --max-batch 8 against --max-batch 1 (images/s).
3. The peer most teams start from: bench/torchscript_peer.py (FastAPI +
   uvicorn + an asyncio.Semaphore(N) around torch.jit.load's module) on
   the same traffic as 1. It runs on plain CPU memory with no capacity, so its
   peak memory is its process's peak RSS growth, which a device of the same
   capacity would have had to hold.

    bench/torchscript.py --binary build/release/vramgate --out bench/reports/torchscript
"""
import argparse
import collections
import concurrent.futures
import json
import os
import subprocess
import sys
import tempfile
import time

import requests

from common import Server, percentile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SIDES = [96, 128, 192, 256]


def image_body(side, batch=1):
    n = batch * 3 * side * side
    return json.dumps({"inputs": [{"name": "image", "shape": [batch, 3, side, side], "datatype": "FP32",
                                   "data": [0.5] * n}]})


BODIES = {}


def one(url, model, side):
    body = BODIES.setdefault(side, image_body(side))
    t0 = time.perf_counter()
    try:
        r = requests.post(f"{url}/v2/models/{model}/infer", data=body, timeout=600,
                          headers={"Content-Type": "application/json"})
        status = r.status_code
        err = None if status == 200 else r.json().get("error", {}).get("type")
        batch = r.json().get("parameters", {}).get("batch_requests") if status == 200 else None
    except requests.RequestException as e:
        status, err, batch = "client_error", type(e).__name__, None
    return {"status": status, "error": err, "side": side, "latency_s": time.perf_counter() - t0, "batch": batch}


def closed_loop(url, model, clients, per_client, sides):
    def client(i):
        return [one(url, model, sides[(i + k) % len(sides)]) for k in range(per_client)]
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(clients) as ex:
        records = [r for rs in ex.map(client, range(clients)) for r in rs]
    return records, time.perf_counter() - t0


def summarize(name, records, wall, extra):
    ok = [r for r in records if r["status"] == 200]
    statuses = collections.Counter(f"{r['status']}" + (f" {r['error']}" if r["error"] else "") for r in records)
    out = {"config": name, "requests": len(records), "ok": len(ok), "wall_s": wall, "goodput_images_s": len(ok) / wall,
           "out_of_memory": sum(1 for r in records if r["error"] in ("out_of_memory", "internal")),
           "overloaded_503": sum(1 for r in records if r["status"] == 503),
           "statuses": dict(statuses),
           "latency_p50_s": percentile([r["latency_s"] for r in ok], 50) if ok else None,
           "latency_p99_s": percentile([r["latency_s"] for r in ok], 99) if ok else None}
    batches = [r["batch"] for r in ok if r["batch"]]
    if batches:
        out["mean_batch"] = sum(batches) / len(batches)
    out.update(extra)
    return out


def vramgate_run(binary, model_dir, capacity, policy, clients, per_client, sides, max_batch=8, threads=2):
    server = Server(binary, "--model-dir", model_dir, "--device", f"virt:0={capacity}", "--admission", policy,
                    "--max-batch", str(max_batch), "--max-queue", "256", "--threads", str(threads),
                    "--max-body-bytes", str(64 << 20), "--queue-timeout", "120")
    try:
        model = os.path.basename(os.path.normpath(model_dir))
        records, wall = closed_loop(server.url, model, clients, per_client, sides)
        state = requests.get(server.url + "/v1/admission", timeout=30).json()
    finally:
        server.stop()
    dev = state["devices"][0]
    return records, wall, {"capacity_bytes": dev["capacity_bytes"], "budget_bytes": dev["budget_bytes"],
                           "peak_device_bytes": dev["peak_bytes"], "server_out_of_memory": state["out_of_memory"]}


def peak_rss(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def rss(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def peer_run(model_dir, mode, clients, per_client, sides, port=8791, threads=2):
    env = dict(os.environ, PEER_MODEL=model_dir, PEER_MODE=mode, PEER_TORCH_THREADS=str(threads))
    proc = subprocess.Popen(["/usr/bin/python3", "-m", "uvicorn", "torchscript_peer:app", "--app-dir", HERE,
                             "--port", str(port), "--log-level", "warning"], env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if requests.get(url + "/v2/health/ready", timeout=2).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("peer did not start")
            time.sleep(0.1)
        one(url, os.path.basename(os.path.normpath(model_dir)), 96)  # warm-up
        base = rss(proc.pid)
        records, wall = closed_loop(url, os.path.basename(os.path.normpath(model_dir)), clients, per_client, sides)
        grown = peak_rss(proc.pid) - base
    finally:
        proc.terminate()
        proc.wait(30)
    return records, wall, {"peak_rss_growth_bytes": grown}


def mib(b):
    return f"{b / 2**20:.1f} MiB" if b is not None else "-"


def write_report(out, results, meta):
    with open(out + ".json", "w") as f:
        json.dump({"meta": meta, "results": results}, f, indent=2)
    lines = ["# TorchScript serving: image-to-image at mixed resolutions", "",
             f"Generated by `bench/torchscript.py` ({meta['date']}). Model: `image_to_image` of "
             "`tools/make_torchscript_models.py` (3 convolutions, 16 channels at full resolution: "
             "activations grow with H x W). One virtual device of "
             f"{mib(meta['capacity_bytes'])}; {meta['clients']} clients in a closed loop, "
             f"{meta['per_client']} requests each, sides {SIDES} in turn; {meta['threads']} compute threads; "
             f"machine: {meta['machine']}.", "",
             "## 1. Admission at mixed resolutions", "",
             "| config | ok / sent | goodput images/s | out-of-memory failures | out-of-memory events (recovered or not) | 503 | peak device memory | capacity | p50 s | p99 s |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in results["admission"]:
        peak = r.get("peak_device_bytes", r.get("peak_rss_growth_bytes"))
        cap = mib(r.get("capacity_bytes")) if "capacity_bytes" in r else "none (CPU)"
        note = "" if "capacity_bytes" in r else " (RSS growth)"
        events = r.get("server_out_of_memory", "-")
        lines.append(f"| {r['config']} | {r['ok']} / {r['requests']} | {r['goodput_images_s']:.2f} | "
                     f"{r['out_of_memory']} | {events} | {r['overloaded_503']} | {mib(peak)}{note} | {cap} | "
                     f"{(r['latency_p50_s'] or 0):.2f} | {(r['latency_p99_s'] or 0):.2f} |")
    best_fixed = max((r for r in results["admission"] if r["config"].startswith("fixed")),
                     key=lambda r: (r["out_of_memory"] == 0, r.get("server_out_of_memory", 0) == 0,
                                    r["goodput_images_s"]))
    mem = next(r for r in results["admission"] if r["config"] == "memory")
    lines += ["", f"Best hand-tuned `fixed:N` (no out-of-memory failure or event first, then goodput): "
              f"`{best_fixed['config']}`. memory / best fixed goodput: "
              f"**{mem['goodput_images_s'] / best_fixed['goodput_images_s']:.2f}x**."]
    peers = [r for r in results["admission"] if r["config"].startswith("FastAPI")]
    for p in peers:
        lines.append(f"memory / {p['config']} goodput: **{mem['goodput_images_s'] / p['goodput_images_s']:.2f}x**; "
                     f"the peer's process grew by {mib(p['peak_rss_growth_bytes'])} (host memory: the JSON bodies "
                     "as Python lists as well as the tensors). It has no device and no byte budget: only its "
                     "semaphore bounds how many forward passes hold activations at once, whatever their size.")
    none = next(r for r in results["admission"] if r["config"] == "none")
    recovered = [r["config"] for r in results["admission"] if r.get("server_out_of_memory") and not r["out_of_memory"]]
    lines += ["", "Reading the table: `none` runs every waiting request at once and "
              f"{'ran out of memory ' + str(none['out_of_memory']) + ' times' if none['out_of_memory'] else 'did not run out of memory in this run'}"
              f" (peak {mib(none['peak_device_bytes'])} of {mib(none['capacity_bytes'])}); `memory` reserved each "
              "request's predicted peak and "
              f"{'never ran out of memory' if not mem['server_out_of_memory'] else 'still saw out-of-memory events'}"
              f" (peak {mib(mem['peak_device_bytes'])}, budget {mib(mem['budget_bytes'])})."]
    if recovered:
        lines.append("Counting slots does not know sizes: " + ", ".join(f"`{c}`" for c in recovered) +
                     " ran out of memory when large images met, and only the engine's out-of-memory recovery "
                     "(batch split, retry) kept the failures from reaching clients.")
    lines.append("Here a forward pass of these small test images costs less than decoding and encoding their "
                 "JSON tensors, so goodput differences between the vramgate configurations are within the noise "
                 "of a loaded 2-core machine; the peer pays for Python JSON parsing on top.")
    lines += ["", "## 2. Dynamic batching (96 x 96 images, memory admission)", "",
              "| config | ok / sent | images/s | mean batch |", "| --- | ---: | ---: | ---: |"]
    for r in results["batching"]:
        lines.append(f"| {r['config']} | {r['ok']} / {r['requests']} | {r['goodput_images_s']:.2f} | "
                     f"{r.get('mean_batch', 1):.2f} |")
    b8, b1 = results["batching"][0], results["batching"][1]
    lines += ["", f"Dynamic batching / --max-batch 1: **{b8['goodput_images_s'] / b1['goodput_images_s']:.2f}x** images/s.",
              "", "On CPU cores a convolution over a batch costs about the sum of its images (there is no idle "
              "parallel hardware for a batch to fill, as on a GPU), and each partial batch may wait "
              "--max-batch-delay-ms for company; what batching buys on this machine is bounded by that."]
    with open(out + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")


def report_only(out):
    with open(out + ".json") as f:
        data = json.load(f)
    write_report(out, data["results"], data["meta"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--binary", default=os.path.join(ROOT, "build/release/vramgate"))
    ap.add_argument("--out", default=os.path.join(ROOT, "bench/reports/torchscript"))
    ap.add_argument("--capacity", default="24MiB")
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--per-client", type=int, default=3)
    ap.add_argument("--fixed", default="1,2,4,8")
    ap.add_argument("--peer-sem", default="2,4")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--report-only", action="store_true", help="rewrite OUT.md from OUT.json")
    args = ap.parse_args()
    if args.report_only:
        report_only(args.out)
        return
    tmp = tempfile.mkdtemp(prefix="vg-ts-bench-")
    subprocess.run(["/usr/bin/python3", os.path.join(ROOT, "tools", "make_torchscript_models.py"), tmp,
                    "--only", "image_to_image"], check=True, stdout=subprocess.DEVNULL)
    model_dir = os.path.join(tmp, "image_to_image")
    capacity = int(args.capacity[:-3]) << 20 if args.capacity.endswith("MiB") else int(args.capacity)
    results = {"admission": [], "batching": []}
    policies = ["none"] + [f"fixed:{n}" for n in args.fixed.split(",")] + ["memory"]
    for policy in policies:
        records, wall, extra = vramgate_run(args.binary, model_dir, capacity, policy, args.clients, args.per_client,
                                            SIDES, threads=args.threads)
        results["admission"].append(summarize(policy, records, wall, extra))
        print(json.dumps(results["admission"][-1]), flush=True)
    for n in args.peer_sem.split(","):
        try:
            records, wall, extra = peer_run(model_dir, f"sem:{n}", args.clients, args.per_client, SIDES,
                                            threads=args.threads)
        except (RuntimeError, FileNotFoundError) as e:
            print(f"peer sem:{n} skipped: {e}", file=sys.stderr)
            continue
        results["admission"].append(summarize(f"FastAPI sem:{n}", records, wall, extra))
        print(json.dumps(results["admission"][-1]), flush=True)
    for max_batch in (8, 1):
        records, wall, extra = vramgate_run(args.binary, model_dir, 256 << 20, "memory", 16, 8, [96],
                                            max_batch=max_batch, threads=args.threads)
        results["batching"].append(summarize(f"--max-batch {max_batch}", records, wall, extra))
        print(json.dumps(results["batching"][-1]), flush=True)
    meta = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "capacity_bytes": capacity,
            "clients": args.clients, "per_client": args.per_client, "threads": args.threads,
            "machine": f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the end"}
    write_report(args.out, results, meta)
    print("wrote", args.out + ".md")


if __name__ == "__main__":
    main()
