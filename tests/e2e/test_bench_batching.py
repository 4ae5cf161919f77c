"""bench/batching.py end to end on tinylm with tiny counts: every mode runs
every level, the start-up burst is told apart from steady state, the ratios
are computed from the rows, and the JSON and Markdown reports are written."""
import json
import os
import subprocess
import sys

import pytest

from conftest import BIN, MODEL_DIR

# Starts no server in the run's mode: run once, by the default-mode run.
pytestmark = pytest.mark.same_in_both_modes

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


def test_batching_benchmark_runs_every_mode_and_level(tmp_path):
    out = tmp_path / "batching"
    run = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "batching.py"), "--binary", BIN,
                          "--model-dir", MODEL_DIR, "--levels", "1,3", "--requests", "6", "--max-tokens", "6",
                          "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads((tmp_path / "batching.json").read_text())
    modes = ["batched", "batched_prefill_worker", "one_at_a_time"]
    assert list(report["results"]) == modes
    for m in modes:
        rows = report["results"][m]
        assert [r["clients"] for r in rows] == [1, 3]
        for r in rows:
            # 6 requests split over the clients; each client's first is the burst.
            assert r["requests"] == r["ok"] == r["clients"] * r["per_client"], r
            assert r["burst_requests"] == r["clients"]
            assert r["steady_requests"] == r["requests"] - r["clients"]
            assert r["tokens"] >= r["requests"] * 3 and r["tokens_per_s"] > 0, r
            assert 0 < r["steady_ttft_p50_ms"] <= r["steady_ttft_p99_ms"], r
    by_level = {e["clients"]: e for e in report["ratios"]}
    for m in ("batched", "batched_prefill_worker"):
        row, ref = report["results"][m][1], report["results"]["one_at_a_time"][1]
        assert abs(by_level[3][m]["tokens_per_s_over_one_at_a_time"] - row["tokens_per_s"] / ref["tokens_per_s"]) < 1e-9
        assert by_level[1][m]["steady_ttft_p99_over_single_client"] == 1.0
    md = (tmp_path / "batching.md").read_text()
    assert "## Results" in md and "`batched_prefill_worker`" in md and "--prefill-worker" in md
