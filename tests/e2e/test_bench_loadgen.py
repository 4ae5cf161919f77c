"""The load generator of bench/ (bench/loadgen.py) against the real server:
its records and summary agree with what the server did, in closed and open
loop, streamed and plain, and it counts out-of-memory failures under the
naive policy. Keeps the benchmark tooling in step with the HTTP API."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
loadgen = pytest.importorskip("loadgen")  # needs python3-aiohttp (scripts/install-deps)

MIX = [{"name": "a", "weight": 1, "prompt": [4, 12], "max_tokens": [3, 9], "stream": 0.5},
       {"name": "b", "weight": 1, "prompt": [20, 30], "max_tokens": [10, 14], "stream": 0.5}]


def test_closed_loop_records_and_summary(server):
    before = server.admission()
    out = loadgen.run(server.url, MIX, users=3, requests=16, seed=5, timeout=60, sample_interval=0.01)
    recs, summary = out["records"], out["summary"]
    assert len(recs) == 16
    assert all(r["status"] == 200 and r["error"] is None for r in recs), recs
    # ignore_eos: every request generates exactly max_tokens tokens.
    assert all(r["tokens"] == r["max_tokens"] for r in recs)
    assert {r["stream"] for r in recs} == {True, False}
    assert all(r["ttft_s"] is not None and r["ttft_s"] <= r["latency_s"] for r in recs if r["stream"])
    assert all(r["queue_wait_ms"] is not None for r in recs if not r["stream"])
    assert summary["succeeded"] == 16 and summary["statuses"] == {"200": 16}
    assert summary["goodput_tokens_per_s"] * summary["wall_s"] == pytest.approx(sum(r["max_tokens"] for r in recs))
    assert summary["out_of_memory_failures"] == 0 and summary["server_out_of_memory_events"] == 0
    assert summary["latency_s"]["p50"] <= summary["latency_s"]["p99"]
    assert out["samples"], "the sampler read /v1/admission during the run"
    assert summary["capacity_bytes"] == before["devices"][0]["capacity_bytes"]
    assert server.admission()["completed"] - before["completed"] == 16


@pytest.mark.same_in_both_modes
def test_same_seed_same_traffic():
    a = loadgen.draw_requests(MIX, 20, seed=9)
    assert a == loadgen.draw_requests(MIX, 20, seed=9)
    assert a != loadgen.draw_requests(MIX, 20, seed=10)
    assert all(len(r["body"]["prompt"]) == r["prompt_tokens"] for r in a)


def test_open_loop_and_oom_failures_under_none(make_server):
    # Everything at once on a device too small for it: the naive policy runs
    # out of memory, and the load generator reports it as such.
    s = make_server("--device", "virt:0=12MiB", "--admission", "none")
    mix = [{"weight": 1, "prompt": [40, 60], "max_tokens": [180, 190], "stream": 0.5}]
    out = loadgen.run(s.url, mix, users=24, requests=24, seed=1, timeout=60)
    summary = out["summary"]
    assert summary["out_of_memory_failures"] > 0
    assert summary["server_out_of_memory_events"] > 0
    assert summary["succeeded"] + summary["out_of_memory_failures"] == 24
    assert summary["peak_device_bytes"] <= summary["capacity_bytes"]
    # Open loop: Poisson arrivals, answered one by one.
    out = loadgen.run(s.url, MIX, rate=40, duration=0.5, seed=3, timeout=60)
    assert out["config"]["mode"] == "open"
    assert all(r["status"] == 200 for r in out["records"])
    assert out["summary"]["requests"] == len(out["records"]) > 0
