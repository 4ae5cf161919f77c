"""scripts/gpu_check_driver.py, the checks `scripts/gpu-check run` makes on a
GPU, run on a virtual device against the release binary: all pass (the
shared-device one with the foreign-bytes test hook as the other process), and
the inject-oom check finds a leak planted with --test-leak-bytes-on-oom."""
import os
import re
import subprocess
import sys

import pytest

from conftest import BIN, MODEL_DIR

# Starts no server in the run's mode: run once, by the default-mode run.
pytestmark = pytest.mark.same_in_both_modes

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
DRIVER = os.path.join(ROOT, "scripts", "gpu_check_driver.py")


def drive(*args):
    cmd = [sys.executable, DRIVER, "--binary", BIN, "--model-dir", MODEL_DIR, "--device", "virt:0=256MiB",
           "--threads", "1", "--prompt-tokens", "24", "--max-tokens", "12", "--shared-free-mib", "24",
           "--shared-requests", "24", "--shared-clients", "16", "--shared-max-batch", "16", "--shared-max-tokens",
           "100", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


def test_every_check_passes_on_a_virtual_device():
    run = drive("--requests", "12", "--clients", "6", "--fit", "3")
    assert run.returncode == 0, run.stdout + run.stderr
    assert re.search(r"^gpu-check load: PASS: 12/12 completed on virt:0, 0 OOM", run.stdout, re.M), run.stdout
    inject = re.search(r"^gpu-check inject-oom: PASS: .*allocated ([\d.]+) MiB after vs ([\d.]+) MiB before",
                       run.stdout, re.M)
    assert inject, run.stdout
    assert inject.group(1) == inject.group(2)
    shared = re.search(r"^gpu-check shared-device: PASS: another process held ([\d.]+) MiB of 256.0 MiB, "
                       r"24.0 MiB left free; budget ([\d.]+) MiB .* 24/24 completed, 0 OOM", run.stdout, re.M)
    assert shared, run.stdout
    assert float(shared.group(1)) == 232.0 and float(shared.group(2)) < 24.0


def test_the_load_check_sizes_its_budget_with_everything_the_server_sets_aside():
    # A reserve and (emulated) decode graphs are set aside beside the model's
    # weights: a budget sized from the weights alone would hold no request.
    run = drive("--checks", "load", "--requests", "8", "--clients", "4", "--fit", "3",
                "--load-serve-args", "--memory-reserve 4MiB --host-kernels off --test-emulate-cuda-graphs")
    assert run.returncode == 0, run.stdout + run.stderr
    m = re.search(r"^gpu-check load: PASS: 8/8 completed .*\(holds (\d+) requests of", run.stdout, re.M)
    assert m, run.stdout
    assert int(m.group(1)) >= 3


def test_inject_oom_finds_a_planted_leak():
    leak = 3 << 20
    run = drive("--checks", "inject-oom", "--leak-bytes", str(leak))
    assert run.returncode == 1, run.stdout + run.stderr
    line = next((x for x in run.stdout.splitlines() if x.startswith("gpu-check inject-oom:")), "")
    assert line.startswith("gpu-check inject-oom: FAIL (allocated"), run.stdout
    # One recovery per out-of-memory error counted, each leaving `leak` bytes.
    counted = int(re.search(r"\((\d+) counted\)", line).group(1))
    assert counted >= 1
    assert f"(+{counted * leak / (1 << 20):.3f} MiB)" in line, line
