"""The Markdown report and the console summary of bench/gpu.py, from the data
it writes as JSON. Standard library only."""
import os

TABLE_HEADER = "| model, dtype | clients/batch | vramgate tokens/s | HF tokens/s | note |"


def num(x, unit=""):
    """A figure for the report: n/a for None, thousands separated from 100 on."""
    if x is None:
        return "n/a"
    return (f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}") + unit


def model_label(entry):
    return f"`{entry['checkpoint']}` {entry['dtype']}"


def hf_round(entry, batch):
    for r in (entry.get("hf") or {}).get("rounds", []):
        if r["batch"] == batch:
            return r
    return None


def hf_why(entry):
    hf = entry.get("hf") or {}
    return hf.get("skipped") or hf.get("error")


def round_note(vg_round, hf):
    parts = []
    if vg_round:
        parts.append(f"vramgate {num(vg_round['ms_per_step'], ' ms')}/step, mean batch {num(vg_round['mean_batch'])}")
        if vg_round["ok"] != vg_round["requests"]:
            parts.append(f"{vg_round['ok']}/{vg_round['requests']} ok: {vg_round['statuses']}")
    if hf:
        parts.append(f"HF {num(hf['ms_per_step'], ' ms')}/step")
    return "; ".join(parts)


def table_rows(data):
    rows = [TABLE_HEADER, "| --- | --- | --- | --- | --- |"]
    for entry in data["models"].values():
        vg = entry.get("vramgate") or {}
        if vg.get("error") or not vg:
            why = vg.get("error") or entry["written"].get("note") or "not run (see Skipped)"
            rows.append(f"| {model_label(entry)} | all | n/a | n/a | {why.splitlines()[0][:200]} |")
            continue
        for r in vg.get("rounds", []):
            hf = hf_round(entry, r["clients"])
            hf_cell = num(hf["tokens_per_s"]) if hf else "n/a"
            rows.append(f"| {model_label(entry)} | {r['clients']} | {num(r['tokens_per_s'])} | {hf_cell} | "
                        f"{round_note(r, hf)} |")
        peer = (entry.get("hf") or {}).get("peer")
        if peer:
            rows.append(f"| {model_label(entry)} | {peer['requests']} requests, semaphore {peer['concurrency']} | "
                        f"n/a | {num(peer['tokens_per_s'])} | HF, one generate() per request (the design peer) |")
    reasons = {}
    for entry in data["models"].values():
        if hf_why(entry):
            reasons.setdefault(hf_why(entry), []).append(model_label(entry))
    return rows + [""] + [f"HF not run for {', '.join(labels)}: {why}." for why, labels in reasons.items()]


def agreement_lines(data):
    lines = []
    for entry in data["models"].values():
        a = entry.get("agreement")
        if a:
            diff = a["first_difference"]
            where = "all equal" if diff is None else f"first difference at token {diff}"
            lines.append(f"- {model_label(entry)}, batch 1: {a['equal']} of {a['of']} equal ({where})")
        else:
            lines.append(f"- {model_label(entry)}: not compared ({hf_why(entry) or 'no ids'})")
    return lines


def floor_lines(data):
    bw = data.get("bandwidth") or {}
    if "bytes_per_s" not in bw:
        return [f"Not measured: {bw.get('skipped', 'unknown')}."]
    lines = [f"Device-to-device copy: {bw['bytes_per_s'] / 1e9:,.0f} GB/s (bytes read + written per second, "
             f"{bw['iters']} copies of {bw['copy_bytes'] / 2**20:,.0f} MiB).", "",
             "| model, dtype | weights | floor ms/step | vramgate ms/step, 1 client | x floor |",
             "| --- | --- | --- | --- | --- |"]
    for entry in data["models"].values():
        fl = entry.get("floor")
        if not fl:
            continue
        one = next((r for r in (entry.get("vramgate") or {}).get("rounds", []) if r["clients"] == 1), None)
        ms = one["ms_per_step"] if one else None
        ratio = ms / fl["floor_ms_per_step"] if ms else None
        lines.append(f"| {model_label(entry)} | {fl['weights_bytes'] / 2**20:,.0f} MiB | "
                     f"{fl['floor_ms_per_step']:.3f} | {num(ms)} | {num(ratio)} |")
    return lines


# The decode-step targets, per checkpoint and dtype: a batch-1 step within
# `floor_ratio_max` x weights / bandwidth, `tokens_per_s_min` at the most
# clients, `hf_ratio_min` x Hugging Face's batched tokens/s there. Every
# model: no more launches per step at the most clients than at one; and a
# bfloat16 GPT-2 step at batch 1 no slower than the float32 one.
TARGETS = {
    ("llama-1.1b", "bfloat16"): {"floor_ratio_max": 1.5, "tokens_per_s_min": 25000},
    ("gpt2-12x768", "float32"): {"hf_ratio_min": 3.0},
}


def verdict(value, ok):
    return "n/a" if value is None else ("met" if ok else "NOT met")


def round_at(entry, clients):
    return next((r for r in (entry.get("vramgate") or {}).get("rounds", []) if r["clients"] == clients), None)


def launches(entry, clients):
    prof = ((entry.get("vramgate") or {}).get("profiles") or {}).get(str(clients)) or {}
    s = prof.get("summary") or {}
    return s.get("launches_per_step") if s.get("status") == "ok" and s.get("has_gpu_events") else None


def target_rows(entry, top):
    """(what, measured, verdict) of each target that applies to `entry`."""
    want = TARGETS.get((entry["checkpoint"], entry["dtype"]), {})
    rows = []
    one, most = round_at(entry, 1), round_at(entry, top)
    fl = entry.get("floor")
    if "floor_ratio_max" in want:
        ratio = one["ms_per_step"] / fl["floor_ms_per_step"] if one and fl else None
        rows.append((f"batch-1 step <= {want['floor_ratio_max']}x floor", num(ratio, "x"),
                     verdict(ratio, ratio is not None and ratio <= want["floor_ratio_max"])))
    if "tokens_per_s_min" in want:
        tps = most["tokens_per_s"] if most else None
        rows.append((f">= {want['tokens_per_s_min']:,} tokens/s at {top} clients", num(tps),
                     verdict(tps, tps is not None and tps >= want["tokens_per_s_min"])))
    if "hf_ratio_min" in want:
        hf = hf_round(entry, top)
        ratio = most["tokens_per_s"] / hf["tokens_per_s"] if most and hf and hf["tokens_per_s"] else None
        rows.append((f">= {want['hf_ratio_min']}x HF batched at {top} clients", num(ratio, "x"),
                     verdict(ratio, ratio is not None and ratio >= want["hf_ratio_min"])))
    at_one, at_top = launches(entry, 1), launches(entry, top)
    both = None if at_one is None or at_top is None else (at_one, at_top)
    rows.append((f"launches per step at {top} clients <= at 1",
                 f"{num(at_top)} vs {num(at_one)}" if both else "n/a", verdict(both, both and at_top <= at_one)))
    return rows


def target_lines(data):
    top = max((r["clients"] for e in data["models"].values() for r in (e.get("vramgate") or {}).get("rounds", [])),
              default=1)
    lines = ["| model, dtype | target | measured | |", "| --- | --- | --- | --- |"]
    for entry in data["models"].values():
        for what, measured, v in target_rows(entry, top):
            lines.append(f"| {model_label(entry)} | {what} | {measured} | {v} |")
    by_key = {(e["checkpoint"], e["dtype"]): e for e in data["models"].values()}
    f32, bf16 = by_key.get(("gpt2-12x768", "float32")), by_key.get(("gpt2-12x768", "bfloat16"))
    if f32 and bf16:
        a, b = round_at(f32, 1), round_at(bf16, 1)
        ms = (b["ms_per_step"], a["ms_per_step"]) if a and b else None
        lines.append(f"| `gpt2-12x768` | bfloat16 batch-1 step <= float32's | "
                     f"{f'{num(ms[0])} vs {num(ms[1])} ms' if ms else 'n/a'} | {verdict(ms, ms and ms[0] <= ms[1])} |")
    return lines


def top_table(rows, title):
    """Rows of a top list; a self-time column where the rows have one."""
    if not rows:
        return [f"{title}: none in the trace.", ""]
    has_self = "self_us" in rows[0]
    out = [f"| {title} | calls | total ms | per step us |" + (" self ms |" if has_self else ""),
           "| --- | --- | --- | --- |" + (" --- |" if has_self else "")]
    for r in rows:
        name = r["name"].replace("|", "\\|")
        name = name if len(name) <= 90 else name[:87] + "..."
        out.append(f"| `{name}` | {r['count']} | {r['total_us'] / 1000:.3f} | {num(r['per_step_us'])} |"
                   + (f" {r['self_us'] / 1000:.3f} |" if has_self else ""))
    return out + [""]


def profile_lines(data):
    if not data["profile_support"]["supported"]:
        return [data["profile_support"]["note"] + "."]
    lines = []
    for entry in data["models"].values():
        for clients, prof in sorted(((entry.get("vramgate") or {}).get("profiles") or {}).items(),
                                    key=lambda kv: int(kv[0])):
            lines += profile_block(entry, clients, prof)
    return lines or ["No profile ran (see Skipped)."]


def profile_block(entry, clients, prof):
    head = f"### {model_label(entry)}, {clients} client(s)"
    s = prof.get("summary") or {}
    if prof.get("error") or s.get("status") != "ok":
        return [head, "", f"no trace ({prof.get('error') or s.get('path') or 'not written'})", ""]
    line = f"{s['steps']} steps, median step {num(s['step_ms']['median'], ' ms')}. "
    if s["has_gpu_events"]:
        line += (f"Per step: {num(s['kernels_per_step'])} kernels, {num(s['launches_per_step'])} launch calls, "
                 f"{num(s['kernel_ms_per_step'], ' ms')} of kernel time. ")
    line += finding(s)
    return [head, "", line, ""] + top_table(s["top_kernels"], "GPU kernel") + top_table(s["top_host_ops"], "host op")


def finding(s):
    """One sentence on what bounds the step, from the kernel time against the
    median step time."""
    busy = s["gpu_busy_fraction"]
    if not s["has_gpu_events"]:
        return "Host ops only: this trace has no GPU events."
    if busy is None:
        return "No step markers: per-step figures unavailable."
    total_us = s["kernel_ms_per_step"] * 1000 * s["steps"]
    bound = "host work and launches bound the step" if busy < 0.5 else "the GPU's kernels bound the step"
    top = (f"; the top kernel is {100 * s['top_kernels'][0]['total_us'] / total_us:.0f}% of kernel time"
           if total_us > 0 else "")
    return f"Kernels fill {100 * busy:.0f}% of the median step: {bound}{top}."


def markdown(data, json_path):
    m = data["machine"]
    gpu = m.get("gpu") or m["device"]
    lines = [f"# vramgate on {gpu}: tokens/s, the Hugging Face baseline, step profiles", "",
             f"Made by `bench/gpu.py`{' --virtual' if data['mode'] == 'virtual' else ''} on {data['started']}: "
             f"torch {m.get('torch') or 'n/a'}, CUDA {m.get('cuda') or 'n/a'}, "
             f"transformers {m.get('transformers') or 'n/a'}, "
             + (f"({m['torch_unavailable']}), " if m.get("torch_unavailable") else "") +
             f"{m['cpus']} CPUs; {data['elapsed_s']:.0f} s of a {data['time_budget_s']:.0f} s budget. "
             f"Random-weight checkpoints; {data['settings']['prompt_tokens']}-token prompts, "
             f"{data['settings']['max_tokens']} tokens per completion, greedy, end-of-text ignored; "
             f"vramgate `--max-batch 64 --threads {data['settings']['threads']}`, one round per client count.",
             "", "## Tokens/s", ""] + table_rows(data)
    lines += ["", "ms/step: vramgate's mean time between a sequence's tokens over the round (/metrics); "
              "HF's generate() wall time / new tokens.", "", "## Greedy agreement", ""] + agreement_lines(data)
    lines += ["", "## Bandwidth floor", ""] + floor_lines(data)
    lines += ["", "## Decode-step targets", ""] + target_lines(data) + ["", "## Step profiles", ""] + profile_lines(data)
    lines += ["", "## Skipped", ""] + ([f"- {s['what']}: {s['reason']}" for s in data["skipped"]] or ["Nothing."])
    lines += ["", "## Raw data", "", f"Every figure and each round's raw data: `{os.path.basename(json_path)}`.", ""]
    return "\n".join(lines)


def summary_lines(data):
    """One line per vramgate round, for the console."""
    out = []
    for key, entry in data["models"].items():
        vg = entry.get("vramgate") or {}
        if vg.get("error"):
            out.append(f"gpu-bench {key}: error {vg['error'].splitlines()[0][:200]}")
        elif not vg:
            out.append(f"gpu-bench {key}: not run ({entry['written'].get('note') or 'time budget'})")
        for r in vg.get("rounds", []):
            hf = hf_round(entry, r["clients"])
            out.append(f"gpu-bench {key} clients {r['clients']}: vramgate {num(r['tokens_per_s'])} tokens/s "
                       f"({num(r['ms_per_step'])} ms/step), HF {num(hf['tokens_per_s']) if hf else 'n/a'} tokens/s")
    out.append(f"gpu-bench: {data['elapsed_s']:.0f} s, {len(data['skipped'])} item(s) skipped")
    return "\n".join(out)
