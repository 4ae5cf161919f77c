"""bench/shared_device.py end to end with small counts: the start-up budget
counts only what is free, and mid-burst the memory policy completes every
request with no out-of-memory step while none loses requests."""
import json
import os
import subprocess
import sys

import pytest

from conftest import BIN, MODEL_DIR

# Starts no server in the run's mode: run once, by the default-mode run.
pytestmark = pytest.mark.same_in_both_modes

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


def test_shared_device_benchmark_writes_both_parts(tmp_path):
    report = tmp_path / "shared.md"
    run = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "shared_device.py"), "--binary", BIN,
                          "--model-dir", MODEL_DIR, "--requests", "32", "--clients", "32", "--hold-s", "0.5",
                          "--report", str(report)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    data = json.loads((tmp_path / "shared.json").read_text())
    start = data["start_up"]
    assert start["budget_bytes"] < start["free_bytes"] < start["budget_from_total_bytes"], start
    memory, none = data["bursts"]
    assert memory["policy"] == "memory" and memory["completed"] == 32, memory
    assert memory["out_of_memory_steps"] == 0 and memory["budget_changes"]["foreign_grew"] >= 1, memory
    assert none["policy"] == "none" and none["failed"] > 0 and none["out_of_memory_steps"] > 0, none
    assert "mid-burst" in report.read_text()
