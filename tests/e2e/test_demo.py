"""scripts/demo end to end: the same burst against --admission none and
--admission memory on one small virtual device. The naive server loses
requests to out-of-memory errors; memory-aware admission loses none, and
refuses what it cannot hold with 503 + Retry-After."""
import json
import os
import re
import subprocess

import pytest

from conftest import BIN, MODEL_DIR

# Starts no server in the run's mode: run once, by the default-mode run.
pytestmark = pytest.mark.same_in_both_modes

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


def row(text, label):
    m = re.search(r"^" + re.escape(label) + r"\s+(\S+)\s+(\S+)", text, re.M)
    assert m, f"no row {label!r} in:\n{text}"
    return m.group(1), m.group(2)


def test_demo_shows_oom_failures_for_none_and_none_for_memory(tmp_path):
    out = subprocess.run([os.path.join(ROOT, "scripts/demo"), "--binary", BIN, "--model-dir", MODEL_DIR,
                          "--out-dir", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    text = out.stdout
    assert re.search(r"--admission none\s+--admission memory", text), text
    none_oom, memory_oom = row(text, "500 out_of_memory (failed)")
    assert int(none_oom) > 0 and int(memory_oom) == 0, text
    none_ok, memory_ok = row(text, "200 answered")
    assert int(memory_ok) > 0, text
    # Every memory client was answered or told when to retry.
    rows = json.loads((tmp_path / "demo.json").read_text())
    memory = rows[1]
    assert memory["policy"] == "memory"
    assert memory["ok"] + memory["overloaded_with_retry_after"] == memory["clients"], memory
    assert memory["peak_reserved_bytes"] <= memory["budget_bytes"]
    assert memory["peak_bytes"] <= memory["capacity_bytes"]
    assert rows[0]["out_of_memory"] == int(none_oom)
    png = tmp_path / "device-memory.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
