"""Report of a bench/scenarios.py sweep: the Markdown tables, the targets and
the PNG plots (matplotlib, Agg backend). write(data, base) is called by the
runner; `bench/report.py <name>.json` redraws a report from its JSON."""
import collections
import json
import os
import statistics
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

MIB = 2 ** 20


def _median(xs):
    return statistics.median(xs) if xs else None


def _policy_order(p):
    if p == "none":
        return (0, 0)
    if p.startswith("fixed:"):
        return (1, int(p.split(":")[1]))
    return (2, 0)


def _mean_running(samples):
    """Mean running sequences over a run's samples, without the ramp at either end."""
    inner = samples[2:-2] if len(samples) > 6 else samples
    return statistics.mean(x["running"] for x in inner) if inner and "running" in inner[0] else None


def aggregate(runs):
    """{mix: {policy: row}} with medians over repeats and worst cases."""
    by = collections.defaultdict(lambda: collections.defaultdict(list))
    running = collections.defaultdict(dict)
    for r in runs:
        by[r["mix"]][r["policy"]].append(r["summary"])
        if r["samples"]:
            running[r["mix"]][r["policy"]] = _mean_running(r["samples"])
    out = {}
    for mix, pols in by.items():
        out[mix] = {}
        for pol, ss in sorted(pols.items(), key=lambda kv: _policy_order(kv[0])):
            out[mix][pol] = {
                "repeats": len(ss),
                "goodput_rps": _median([s["goodput_rps"] for s in ss]),
                "goodput_tokens_per_s": _median([s["goodput_tokens_per_s"] for s in ss]),
                "succeeded": _median([s["succeeded"] for s in ss]), "requests": ss[0]["requests"],
                "oom_failures": sum(s["out_of_memory_failures"] for s in ss),
                "oom_events": sum(s["server_out_of_memory_events"] for s in ss),
                "other_failures": sum(s["requests"] - s["succeeded"] - s["out_of_memory_failures"] for s in ss),
                "latency_p50_s": _median([s["latency_s"]["p50"] for s in ss if s["latency_s"]["p50"] is not None]),
                "latency_p99_s": _median([s["latency_s"]["p99"] for s in ss if s["latency_s"]["p99"] is not None]),
                "ttft_p50_s": _median([s["ttft_s"]["p50"] for s in ss if s["ttft_s"]["p50"] is not None]),
                "ttft_p99_s": _median([s["ttft_s"]["p99"] for s in ss if s["ttft_s"]["p99"] is not None]),
                "server_cpu_ms_per_1k_tokens": _median([
                    1e6 * s["server_cpu_s"] / (s["goodput_tokens_per_s"] * s["wall_s"])
                    for s in ss if s.get("server_cpu_s") is not None and s["goodput_tokens_per_s"] > 0]),
                "server_cpu_share": _median([s["server_cpu_s"] / s["wall_s"] for s in ss
                                             if s.get("server_cpu_s") is not None]),
                "client_cpu_share": _median([s["client_cpu_s"] / s["wall_s"] for s in ss if "client_cpu_s" in s]),
                "goodput_rps_range": [min(s["goodput_rps"] for s in ss), max(s["goodput_rps"] for s in ss)],
                "mean_running": running[mix].get(pol),
                "peak_device_bytes": max(s["peak_device_bytes"] for s in ss),
                "peak_reserved_bytes": max(s["peak_reserved_bytes"] for s in ss),
                "capacity_bytes": ss[0]["capacity_bytes"], "budget_bytes": ss[0]["budget_bytes"],
                "statuses": dict(sum((collections.Counter(s["statuses"]) for s in ss), collections.Counter())),
            }
    return out


def targets(agg, cfg):
    """The issue's targets, each with its numbers and a verdict."""
    lines, ok_all = [], True
    saturating = {m["name"] for m in cfg["mix"] if m.get("saturating")}

    def add(ok, text):
        nonlocal ok_all
        ok_all &= ok
        lines.append(f"- {'PASS' if ok else 'MISS'}: {text}")

    for mix, rows in agg.items():
        m = rows.get("memory")
        if m:
            add(m["oom_failures"] == 0 and m["oom_events"] == 0,
                f"`{mix}`: `memory` out-of-memory failures {m['oom_failures']}, server OOM events {m['oom_events']} "
                f"(all repeats)")
    none_oom = {mix: rows["none"]["oom_failures"] for mix, rows in agg.items() if "none" in rows}
    if none_oom:
        add(any(v > 0 for v in none_oom.values()),
            "`none` out-of-memory failures per mix: " + ", ".join(f"`{k}` {v}" for k, v in none_oom.items()))
    for mix, rows in agg.items():
        fixed = {p: r["goodput_rps"] for p, r in rows.items() if p.startswith("fixed:")}
        if "memory" in rows and fixed:
            best = max(fixed, key=fixed.get)
            ratio = rows["memory"]["goodput_rps"] / fixed[best]
            add(ratio >= 0.95, f"`{mix}`: `memory` goodput {rows['memory']['goodput_rps']:.2f} req/s = "
                f"{ratio:.3f} x best fixed (`{best}`, {fixed[best]:.2f} req/s), medians of "
                f"{rows['memory']['repeats']} repeats (target >= 0.95)")
    for mix, rows in agg.items():
        m = rows.get("memory")
        if m and mix in saturating:
            frac = m["peak_reserved_bytes"] / m["budget_bytes"]
            add(frac >= 0.85 and m["peak_device_bytes"] <= m["capacity_bytes"],
                f"`{mix}` (saturating): `memory` peak reserved {m['peak_reserved_bytes'] / MIB:.2f} MiB = "
                f"{100 * frac:.1f}% of the budget {m['budget_bytes'] / MIB:.2f} MiB (target >= 85%); peak device "
                f"{m['peak_device_bytes'] / MIB:.2f} MiB of capacity {m['capacity_bytes'] / MIB:.2f} MiB")
    return ok_all, lines


def diagnosis(agg):
    """Per mix, what the goodput comparison rests on: the spread over repeats
    and the server's CPU cost per token, which a busy machine does not change."""
    lines = []
    for mix, rows in agg.items():
        best = _best_fixed(rows)
        m, b = rows.get("memory"), rows.get(best)
        if not m or not b:
            continue
        cpu = ""
        mc, bc = m["server_cpu_ms_per_1k_tokens"], b["server_cpu_ms_per_1k_tokens"]
        if mc and bc:
            cpu = (f"; server CPU per 1k good tokens {mc:.0f} ms vs {bc:.0f} ms (ratio {bc / mc:.2f}), "
                   f"server CPU share {_fmt(m['server_cpu_share'], '.2f')} vs {_fmt(b['server_cpu_share'], '.2f')}")
        if m["mean_running"] is not None and b["mean_running"] is not None:
            cpu += (f"; mean running sequences (first repeat) {m['mean_running']:.2f} vs "
                    f"{b['mean_running']:.2f}")
        lines.append(f"- `{mix}`: `memory` goodput over repeats {m['goodput_rps_range'][0]:.1f}-"
                     f"{m['goodput_rps_range'][1]:.1f} req/s, `{best}` {b['goodput_rps_range'][0]:.1f}-"
                     f"{b['goodput_rps_range'][1]:.1f} req/s{cpu}")
    return lines


def _fmt(x, spec):
    return "-" if x is None else format(x, spec)


def markdown(data, agg, ok_all, target_lines, images):
    cfg = data["config"]
    s = cfg["server"]
    out = [f"# Admission policies compared: {cfg['name']}", "",
           f"`{s['model_dir']}` on `{s['device']}`, `--threads {s['threads']}"
           f"{''.join(' ' + str(a) for a in s.get('extra_args', []))}`, other flags at their defaults; "
           f"only `--admission` changes. "
           f"Closed loop, each (policy, mix, repeat) on a fresh server; medians of {cfg['sweep']['repeats']} "
           f"repeats{' (quick run: 1 repeat)' if data['quick'] else ''}. The load generator runs on the same "
           f"{data['host_cpus']}-core machine. Config: `{data['config_file']}`; sweep time {data['elapsed_s']:.0f} s.",
           "", "Command:", "", "```sh", data["command"], "```", ""]
    if data.get("note"):
        out += [data["note"], ""]
    out += ["Mixes (tokens; every request generates "
           "exactly `max_tokens`, half of them streamed):", ""]
    for m in cfg["mix"]:
        cls = "; ".join(f"{c.get('name', '?')} x{c.get('weight', 1)}: prompt {c['prompt'][0]}-{c['prompt'][1]}, "
                        f"max_tokens {c['max_tokens'][0]}-{c['max_tokens'][1]}" for c in m["classes"])
        out.append(f"- `{m['name']}`: {m['users']} users, {m['requests']} requests; {cls}")
    loads = [r["summary"].get("loadavg_1m") for r in data["runs"] if r["summary"].get("loadavg_1m") is not None]
    if loads:
        out += ["", f"Machine load (1-minute load average at the start of each run, {data['host_cpus']} cores): "
                f"median {statistics.median(loads):.1f}, range {min(loads):.1f}-{max(loads):.1f}."]
    out += ["", "Goodput: successful requests (or their generated tokens) per second of wall time, from the first "
            "request sent to the last answer. CPU share: CPU seconds of the server process (from /proc) or of the "
            "load generator over the wall time (1.0 = one core busy all the time). Server CPU per 1k good tokens "
            "does not depend on how busy the machine is; goodput does. OOM failures: answers with error type "
            "`out_of_memory` (500, or an SSE error event; `none` only); server OOM events: engine steps that ran out "
            "of memory (under `fixed:N` and `memory` their requests get 503 `overloaded`, counted as other failures). "
            "Failure counts are totals over all repeats; the other columns are medians."]
    out += ["", "## Targets", ""] + target_lines + ["", f"All targets met: **{'yes' if ok_all else 'no'}**.", ""]
    out += ["What the goodput comparison rests on (`memory` vs the best `fixed:N` of each mix): the spread of "
            "goodput over repeats, and the server's CPU time per 1k good tokens, which does not depend on how "
            "much CPU the machine had to spare (ratio > 1: `memory` spent less CPU per token), and how many sequences "
            "each kept running:", ""]
    out += diagnosis(agg) + [""]
    for mix, rows in agg.items():
        out += [f"## Mix `{mix}`", "",
                "| policy | goodput req/s (min-max) | goodput tok/s | ok / requests | "
                "OOM failures / server OOM events | other failures (all repeats) | p50 / p99 latency (s) | "
                "p50 / p99 TTFT (s) | "
                "peak device / capacity (MiB) | peak reserved / budget (MiB) | server CPU ms / 1k good tokens | "
                "CPU share server / client | mean running (first repeat) |",
                "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for pol, r in rows.items():
            out.append(
                f"| `{pol}` | {r['goodput_rps']:.2f} ({r['goodput_rps_range'][0]:.1f}-"
                f"{r['goodput_rps_range'][1]:.1f}) | {r['goodput_tokens_per_s']:.0f} | "
                f"{r['succeeded']:.0f} / {r['requests']} | {r['oom_failures']} / {r['oom_events']} | "
                f"{r['other_failures']} | "
                f"{_fmt(r['latency_p50_s'], '.2f')} / {_fmt(r['latency_p99_s'], '.2f')} | "
                f"{_fmt(r['ttft_p50_s'], '.3f')} / {_fmt(r['ttft_p99_s'], '.3f')} | "
                f"{r['peak_device_bytes'] / MIB:.2f} / {r['capacity_bytes'] / MIB:.2f} | "
                f"{r['peak_reserved_bytes'] / MIB:.2f} / {r['budget_bytes'] / MIB:.2f} | "
                f"{_fmt(r['server_cpu_ms_per_1k_tokens'], '.0f')} | "
                f"{_fmt(r['server_cpu_share'], '.2f')} / {_fmt(r['client_cpu_share'], '.2f')} | "
                f"{_fmt(r['mean_running'], '.2f')} |")
        out.append("")
    if data["load_curve"]:
        lc = cfg["load_curve"]
        out += [f"## Goodput against offered load (open loop, mix `{lc['mix']}`, {lc['duration_s']} s of Poisson "
                "arrivals per point, one run each)", "",
                "| policy | " + " | ".join(f"{r} req/s offered" for r in lc["rates"]) + " |",
                "| --- |" + " --- |" * len(lc["rates"])]
        by = collections.defaultdict(dict)
        for c in data["load_curve"]:
            by[c["policy"]][c["rate"]] = c["summary"]
        for pol, rates in by.items():
            cells = [f"{rates[r]['goodput_rps']:.1f} ({rates[r]['out_of_memory_failures']} OOM)" for r in lc["rates"]]
            out.append(f"| `{pol}` | " + " | ".join(cells) + " |")
        out.append("")
    out += ["## Plots", ""] + [f"![{alt}]({os.path.basename(p)})" for alt, p in images] + [""]
    return "\n".join(out)


def _colour(policy):
    """One colour per policy in every plot: none red, memory blue, fixed:N oranges."""
    if policy == "none":
        return "tab:red"
    if policy == "memory":
        return "tab:blue"
    n = int(policy.split(":")[1])
    return plt.cm.YlOrBr(0.35 + 0.6 * min(n, 10) / 10)


def _best_fixed(rows):
    fixed = {p: r["goodput_rps"] for p, r in rows.items() if p.startswith("fixed:")}
    return max(fixed, key=fixed.get) if fixed else None


def plot_memory(data, agg, path):
    """Device used and reserved bytes over time, first repeat, for none, the best
    fixed:N and memory on each mix."""
    mixes = list(agg)
    fig, axes = plt.subplots(len(mixes), 3, figsize=(15, 3.2 * len(mixes)), squeeze=False)
    for i, mix in enumerate(mixes):
        for j, pol in enumerate(["none", _best_fixed(agg[mix]), "memory"]):
            ax = axes[i][j]
            run = next((r for r in data["runs"] if r["mix"] == mix and r["policy"] == pol and r["repeat"] == 0),
                       None)
            if run is None or not run["samples"]:
                ax.set_visible(False)
                continue
            ss = run["samples"]
            t = [s["t_s"] for s in ss]
            ax.plot(t, [s["used_bytes"] / MIB for s in ss], label="device used", color="tab:blue")
            ax.plot(t, [s["reserved_bytes"] / MIB for s in ss], label="reserved (leases)", color="tab:green")
            ax.axhline(ss[0]["capacity_bytes"] / MIB, color="tab:red", ls="--", label="capacity")
            ax.axhline(ss[0]["budget_bytes"] / MIB, color="tab:orange", ls=":", label="budget")
            ax.set_title(f"{mix}: {pol} (OOM failures {run['summary']['out_of_memory_failures']})", fontsize=9)
            ax.set_xlabel("s")
            ax.set_ylabel("MiB")
            if i == 0 and j == 0:
                ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def plot_cdf(data, agg, path):
    """Latency CDF of successful requests (all repeats pooled) per policy."""
    mixes = list(agg)
    fig, axes = plt.subplots(1, len(mixes), figsize=(5 * len(mixes), 3.8), squeeze=False)
    for i, mix in enumerate(mixes):
        ax = axes[0][i]
        best = _best_fixed(agg[mix])
        for pol in agg[mix]:
            lat = sorted(x for r in data["runs"] if r["mix"] == mix and r["policy"] == pol for x in r["latencies"])
            if not lat:
                continue
            y = [(k + 1) / len(lat) for k in range(len(lat))]
            hi = pol in ("none", "memory", best)
            ax.step(lat, y, where="post", lw=2 if hi else 0.8, color=_colour(pol),
                    label=pol + (" (best fixed)" if pol == best else ""))
        ax.set_title(f"{mix}: latency CDF (successes)", fontsize=9)
        ax.set_xlabel("latency (s)")
        ax.set_ylabel("fraction")
        ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def plot_goodput(data, path):
    """Goodput against offered load (open loop), one line per policy."""
    by = collections.defaultdict(list)
    for c in data["load_curve"]:
        by[c["policy"]].append((c["rate"], c["summary"]["goodput_rps"]))
    fig, ax = plt.subplots(figsize=(6, 4))
    rates = sorted({c["rate"] for c in data["load_curve"]})
    ax.plot(rates, rates, color="grey", ls=":", label="offered")
    for pol, pts in by.items():
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=pol, color=_colour(pol))
    ax.set_xlabel("offered load (requests/s)")
    ax.set_ylabel("goodput (successful requests/s)")
    ax.set_title(f"goodput against offered load, mix {data['config']['load_curve']['mix']}", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def write(data, base):
    """Writes base.md, base.json and base-*.png; returns the Markdown text."""
    agg = aggregate(data["runs"])
    ok_all, tl = targets(agg, data["config"])
    images = [("device memory over time", base + "-memory.png"), ("latency CDF", base + "-latency-cdf.png")]
    plot_memory(data, agg, images[0][1])
    plot_cdf(data, agg, images[1][1])
    if data["load_curve"]:
        images.append(("goodput against offered load", base + "-goodput.png"))
        plot_goodput(data, images[2][1])
    text = markdown(data, agg, ok_all, tl, images)
    data = dict(data, aggregate=agg, targets_met=ok_all, targets=tl)
    keep = ("t_s", "used_bytes", "reserved_bytes", "capacity_bytes", "budget_bytes", "queue_depth", "running")
    for r in data["runs"]:  # compact: what the plots use, for the first repeat (all of it stays in --work)
        r["samples"] = [{k: round(smp[k], 3) if k == "t_s" else smp[k] for k in keep if k in smp}
                        for smp in r["samples"]]
    with open(base + ".json", "w") as f:
        json.dump(data, f, separators=(",", ":"))
    with open(base + ".md", "w") as f:
        f.write(text)
    return text


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        d = json.load(f)
    print(write(d, sys.argv[1][:-len(".json")]))
