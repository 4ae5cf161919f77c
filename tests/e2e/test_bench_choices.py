"""bench/choices.py end to end with tiny counts: both forms run every round,
produce n outputs of max_tokens each, and the ratio is computed from the rows."""
import json
import os
import subprocess
import sys

import pytest

from conftest import BIN, MODEL_DIR

# Starts no server in the run's mode: run once, by the default-mode run.
pytestmark = pytest.mark.same_in_both_modes

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


def test_choices_benchmark_compares_both_forms(tmp_path):
    out = tmp_path / "choices"
    run = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "choices.py"), "--binary", BIN, "--model-dir",
                          MODEL_DIR, "--n", "3", "--max-tokens", "5", "--rounds", "2", "--out", str(out)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads((tmp_path / "choices.json").read_text())
    for name in ("n_choices", "separate"):
        rows = report["rows"][name]
        assert len(rows) == 2
        assert all(r["tokens"] == 15 and r["outputs"] == 3 and r["tokens_per_s"] > 0 for r in rows)
    s = report["summary"]
    assert abs(report["n_choices_over_separate_tokens_per_s"]
               - s["n_choices"]["tokens_per_s_median"] / s["separate"]["tokens_per_s_median"]) < 1e-9
    assert "n=3" in (tmp_path / "choices.md").read_text()
