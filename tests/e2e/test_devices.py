"""Device selection (`--device virt:N=SIZE | cuda:N | auto`) and the device
memory counters of /v1/admission, against the real binary. A build or machine
without CUDA must refuse cuda:N at start-up with a clear message; the CUDA
device itself is exercised by scripts/gpu-check on a GPU machine."""
import subprocess

import pytest

from conftest import BIN, MODEL_DIR


def run(*args, timeout=120):
    return subprocess.run([BIN, *args], capture_output=True, text=True, timeout=timeout)


def has_gpu():
    # `auto` resolves to cuda:0 exactly when this build has CUDA and sees a GPU.
    r = run("plan", "--model-dir", MODEL_DIR, "--device", "auto", "--json")
    return r.returncode == 0 and '"cuda:0"' in r.stdout


@pytest.mark.same_in_both_modes
def test_cuda_without_a_gpu_is_a_clear_start_up_error():
    if has_gpu():
        pytest.skip("a GPU is visible: scripts/gpu-check covers cuda:N")
    r = run("serve", "--model-dir", MODEL_DIR, "--port", "0", "--device", "cuda:0")
    assert r.returncode != 0
    out = r.stdout + r.stderr
    assert "cuda:0" in out, out
    assert "without CUDA" in out or "no GPU" in out, out
    assert "Traceback" not in out and "terminate" not in out, out


@pytest.mark.same_in_both_modes
def test_unknown_device_kind_names_the_accepted_forms():
    r = run("serve", "--model-dir", MODEL_DIR, "--port", "0", "--device", "gpu:0")
    assert r.returncode == 2
    assert "--device" in r.stderr and "cuda:N" in r.stderr and "virt:N=SIZE" in r.stderr, r.stderr


def test_auto_without_a_gpu_is_a_two_gib_virtual_device(make_server):
    if has_gpu():
        pytest.skip("a GPU is visible: auto is cuda:0")
    d = make_server("--device", "auto").admission()["devices"][0]
    assert d["name"] == "virt:0"
    assert d["capacity_bytes"] == 2 << 30


def test_virtual_device_reports_allocated_equal_to_used(make_server):
    server = make_server("--device", "virt:0=64MiB")
    d = server.admission()["devices"][0]
    assert d["allocated_bytes"] == d["used_bytes"] == d["cache_reserved_bytes"] > 0
    assert server.post("/v1/completions", {"prompt": "Hello", "max_tokens": 8}).status_code == 200
    d = server.admission()["devices"][0]
    assert d["allocated_bytes"] == d["used_bytes"]
