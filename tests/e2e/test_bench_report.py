"""The sweep report of bench/ (bench/report.py) on synthetic runs: medians
over repeats, the target verdicts, and the files it writes. No server."""
import os
import sys

import pytest

# Starts no server in the run's mode: run once, by the default-mode run.
pytestmark = pytest.mark.same_in_both_modes

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
pytest.importorskip("matplotlib")  # python3-matplotlib (scripts/install-deps)
report = pytest.importorskip("report")

MIB = 2 ** 20


def summary(goodput, oom=0, peak_reserved=4 * MIB, peak=8 * MIB, ok=10):
    return {"goodput_rps": goodput, "goodput_tokens_per_s": goodput * 100, "succeeded": ok, "requests": 10,
            "out_of_memory_failures": oom, "server_out_of_memory_events": 1 if oom else 0, "wall_s": 2.0,
            "latency_s": {"p50": 0.1, "p95": 0.2, "p99": 0.3}, "ttft_s": {"p50": 0.01, "p95": 0.02, "p99": 0.03},
            "peak_device_bytes": peak, "peak_reserved_bytes": peak_reserved, "capacity_bytes": 12 * MIB,
            "budget_bytes": 5 * MIB, "statuses": {"200": ok}, "server_cpu_s": 1.0, "client_cpu_s": 0.2,
            "loadavg_1m": 1.0}


def runs_of(table):
    """table: {(mix, policy): [summary per repeat]} -> runner records."""
    out = []
    for (mix, policy), ss in table.items():
        for rep, s in enumerate(ss):
            samples = [{"t_s": 0.1 * k, "used_bytes": 3 * MIB, "reserved_bytes": MIB, "capacity_bytes": 12 * MIB,
                        "budget_bytes": 5 * MIB} for k in range(3)]
            out.append({"mix": mix, "policy": policy, "repeat": rep, "summary": s,
                        "samples": samples if rep == 0 else [], "latencies": [0.1, 0.2, 0.3]})
    return out


CFG = {"name": "t", "server": {"model_dir": "m", "device": "virt:0=12MiB", "threads": 1},
       "sweep": {"repeats": 3}, "mix": [{"name": "long", "users": 4, "requests": 10, "saturating": True,
                                         "classes": [{"name": "c", "prompt": [1, 2], "max_tokens": [3, 4]}]}]}


def verdicts(table):
    agg = report.aggregate(runs_of(table))
    return report.targets(agg, CFG)


def test_all_targets_met_uses_medians_of_repeats():
    ok, lines = verdicts({
        ("long", "none"): [summary(1, oom=5), summary(1, oom=4), summary(1, oom=6)],
        ("long", "fixed:1"): [summary(5), summary(6), summary(50)],  # one outlier: the median is 6
        ("long", "memory"): [summary(5.8, peak_reserved=int(4.5 * MIB)), summary(5.9), summary(1)],
    })
    assert ok, lines
    assert any("0.967 x best fixed" in line for line in lines), lines


def test_each_miss_is_reported():
    ok, lines = verdicts({
        ("long", "none"): [summary(1)] * 3,                                   # no OOM under none
        ("long", "fixed:2"): [summary(10)] * 3,
        ("long", "memory"): [summary(9, oom=1, peak_reserved=4 * MIB, peak=13 * MIB)] * 3,
    })
    assert not ok
    misses = [line for line in lines if line.startswith("- MISS")]
    assert len(misses) == 4, lines  # memory OOM, none without OOM, goodput 0.9, peak over capacity
    assert any("0.900 x best fixed (`fixed:2`" in line for line in misses)


def test_write_makes_markdown_json_and_plots(tmp_path):
    table = {("long", p): [summary(g)] * 3 for p, g in (("none", 1), ("fixed:1", 2), ("memory", 3))}
    data = {"config": dict(CFG, load_curve={"mix": "long", "rates": [1, 2], "duration_s": 1}),
            "config_file": "c.toml", "binary": "b", "quick": False, "elapsed_s": 1.0, "host_cpus": 2,
            "runs": runs_of(table), "command": "bench/scenarios.py",
            "load_curve": [{"policy": p, "rate": r, "summary": summary(r)} for p in ("none", "memory") for r in (1, 2)]}
    text = report.write(data, str(tmp_path / "t"))
    assert "All targets met" in text and "| `memory` | 3.00" in text
    for suffix in (".md", ".json", "-memory.png", "-latency-cdf.png", "-goodput.png"):
        assert (tmp_path / ("t" + suffix)).stat().st_size > 0
