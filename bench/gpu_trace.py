"""Summaries of a Chrome trace (the JSON that torch's profiler, Kineto, and
vramgate's `--profile-trace` write): GPU kernels and host ops by total time,
kernel launches per step, and the steps themselves (events named
`vg::decode_step`). Standard library only.

Times in the trace are microseconds ("ts", "dur"); the summary keeps them in
microseconds (`*_us`) and gives per-step figures in milliseconds (`*_ms`).
Works on any Chrome trace: a JSON object with "traceEvents" or a bare list of
events; complete events ("ph": "X") and begin/end pairs ("B"/"E") count."""
import json
import os
import statistics

STEP_NAME = "vg::decode_step"
KERNEL_CATS = {"kernel"}
HOST_OP_CATS = {"cpu_op", "operator"}
RUNTIME_CATS = {"cuda_runtime", "cuda_driver"}
LAUNCH_MARKERS = ("LaunchKernel", "LaunchCooperativeKernel", "GraphLaunch")


def load_events(path):
    """The events of the trace at `path`, or None when it is missing or is not
    a Chrome trace."""
    if not path or not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    events = data.get("traceEvents") if isinstance(data, dict) else data
    return [e for e in events if isinstance(e, dict)] if isinstance(events, list) else None


def complete_events(events):
    """Complete events {name, cat, ph, pid, tid, ts, dur} in microseconds:
    "X" events as they are, and each "B" matched with the next "E" of the same
    pid/tid (innermost first). Other phases (counters, flows, metadata) drop."""
    out, open_by_thread = [], {}
    for e in events:
        ph = e.get("ph")
        if ph == "X" and _number(e.get("ts")) is not None:
            out.append(dict(e, ts=float(e["ts"]), dur=_number(e.get("dur")) or 0.0))
        elif ph == "B":
            open_by_thread.setdefault((e.get("pid"), e.get("tid")), []).append(e)
        elif ph == "E":
            stack = open_by_thread.get((e.get("pid"), e.get("tid")))
            if stack and _number(e.get("ts")) is not None and _number(stack[-1].get("ts")) is not None:
                b = stack.pop()
                out.append(dict(b, ph="X", ts=float(b["ts"]), dur=float(e["ts"]) - float(b["ts"])))
    return out


def _number(v):
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def _cat(e):
    return str(e.get("cat", "")).lower()


def is_kernel(e):
    return _cat(e) in KERNEL_CATS


def is_launch(e):
    """A host call that launches GPU work (cudaLaunchKernel, cuLaunchKernel,
    cudaGraphLaunch, ...)."""
    return _cat(e) in RUNTIME_CATS and any(m in str(e.get("name", "")) for m in LAUNCH_MARKERS)


def step_events(events, name=STEP_NAME):
    """The step markers on the host side (annotations on the GPU timeline,
    "gpu_user_annotation", repeat them); the GPU ones when the host has none."""
    steps = [e for e in events if e.get("name") == name]
    host = [e for e in steps if not _cat(e).startswith("gpu_")]
    return host or steps


def _inside(e, steps):
    """True when host event `e` lies within one of the host `steps` on its thread."""
    end = e["ts"] + e["dur"]
    return any(s.get("pid") == e.get("pid") and s.get("tid") == e.get("tid") and s["ts"] <= e["ts"]
               and end <= s["ts"] + s["dur"] for s in steps)


def _correlation(e):
    args = e.get("args")
    return args.get("correlation") if isinstance(args, dict) else None


def step_work(done, steps):
    """(launches, kernels, how) of the recorded steps. The GPU side of a
    Kineto trace covers the whole process, so work outside the steps (the
    prefill worker, sampling between steps, a step with a prefill chunk that
    ran unmarked) is in it too: launches count when they lie within a host
    step range on its thread, kernels when their "correlation" id is one of
    those launches'. Without correlation ids every kernel counts (how:
    "all kernels"); without step ranges every launch does."""
    launches = [e for e in done if is_launch(e)]
    if steps:
        launches = [e for e in launches if _inside(e, steps)]
    kernels = [e for e in done if is_kernel(e)]
    if any(_correlation(k) is not None for k in kernels):
        ids = {_correlation(e) for e in launches} - {None}
        return launches, [k for k in kernels if _correlation(k) in ids], "by correlation"
    return launches, kernels, "all kernels"


def self_times(ops):
    """Self time (us) of each host op: its duration minus that of the ops
    nested directly inside it on the same thread. Returns a list parallel to
    `ops`."""
    selfs = [e["dur"] for e in ops]
    by_thread = {}
    for i, e in enumerate(ops):
        by_thread.setdefault((e.get("pid"), e.get("tid")), []).append(i)
    for idxs in by_thread.values():
        idxs.sort(key=lambda i: (ops[i]["ts"], -ops[i]["dur"]))
        stack = []
        for i in idxs:
            while stack and ops[stack[-1]]["ts"] + ops[stack[-1]]["dur"] <= ops[i]["ts"]:
                stack.pop()
            if stack:
                selfs[stack[-1]] -= ops[i]["dur"]
            stack.append(i)
    return [max(0.0, s) for s in selfs]


def top_by_total(events, top, steps, selfs=None):
    """[{name, count, total_us, per_step_us[, self_us]}], largest total first
    (ties by name)."""
    rows = {}
    for i, e in enumerate(events):
        r = rows.setdefault(str(e.get("name", "")), {"name": str(e.get("name", "")), "count": 0, "total_us": 0.0})
        r["count"] += 1
        r["total_us"] += e["dur"]
        if selfs is not None:
            r["self_us"] = r.get("self_us", 0.0) + selfs[i]
    ranked = sorted(rows.values(), key=lambda r: (-r["total_us"], r["name"]))[:top]
    for r in ranked:
        r["per_step_us"] = r["total_us"] / steps if steps else None
    return ranked


def summarize(events, top=10, step_name=STEP_NAME):
    """The figures of one trace's events (see the module docstring)."""
    done = complete_events(events)
    steps_ev = step_events(done, step_name)
    steps = len(steps_ev)
    launch_events, kernels, attributed = step_work(done, [e for e in steps_ev if not _cat(e).startswith("gpu_")])
    host_ops = [e for e in done if _cat(e) in HOST_OP_CATS]
    launches = len(launch_events)
    kernel_us = sum(e["dur"] for e in kernels)
    step_us = [e["dur"] for e in steps_ev]
    median_step_us = statistics.median(step_us) if step_us else None
    per_step = (lambda n: n / steps) if steps else (lambda n: None)
    kernel_ms_per_step = per_step(kernel_us / 1000.0) if kernels else None
    return {
        "status": "ok",
        "events": len(done),
        "steps": steps,
        "step_ms": {"median": _ms(median_step_us), "mean": _ms(statistics.fmean(step_us) if step_us else None),
                    "min": _ms(min(step_us) if step_us else None), "max": _ms(max(step_us) if step_us else None)},
        "has_gpu_events": bool(kernels),
        "kernels": len(kernels),
        "kernels_attributed": attributed if kernels else None,
        "kernel_ms_per_step": kernel_ms_per_step,
        "kernels_per_step": per_step(len(kernels)) if kernels else None,
        "launch_calls": launches,
        "launches_per_step": per_step(launches) if launches else None,
        "gpu_busy_fraction": (kernel_ms_per_step / _ms(median_step_us)
                              if kernel_ms_per_step is not None and median_step_us else None),
        "top_kernels": top_by_total(kernels, top, steps),
        "top_host_ops": top_by_total(host_ops, top, steps, self_times(host_ops)),
    }


def _ms(us):
    return None if us is None else us / 1000.0


def parse_trace(path, top=10, step_name=STEP_NAME):
    """summarize() of the trace at `path`, with "path"; {"status": "no trace"}
    when the file is missing or unreadable."""
    events = load_events(path)
    if events is None:
        return {"status": "no trace", "path": path}
    return dict(summarize(events, top, step_name), path=path)
