"""bench/gpu.py --virtual end to end (every model at every client count, the
JSON and the Markdown report, the Hugging Face and bandwidth parts skipped
with their reason, the step profile or its absence), the profile plumbing
through a stand-in binary that accepts the profile flags and writes a trace,
and the Chrome-trace parser on a hand-written trace."""
import json
import os
import subprocess
import sys

from conftest import BIN, MODE_ARGS

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "bench"))
import gpu  # noqa: E402
import gpu_trace  # noqa: E402
from gpu_report import TABLE_HEADER  # noqa: E402

MODELS = ["gpt2-2x64/float32", "gpt2-2x64/bfloat16", "llama-2x64/bfloat16"]


def run_bench(tmp_path, binary, *extra):
    out, report = tmp_path / "gpu.json", tmp_path / "gpu.md"
    run = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "gpu.py"), "--virtual", "--binary", binary,
                          "--out-json", str(out), "--report", str(report), "--time-budget-s", "200",
                          *[f"--server-arg={a}" for a in MODE_ARGS], *extra],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    return json.loads(out.read_text()), report.read_text()


def test_virtual_run_measures_every_model_at_every_client_count(tmp_path):
    data, md = run_bench(tmp_path, BIN)
    assert data["mode"] == "virtual" and data["skipped"] == []
    assert list(data["models"]) == MODELS
    for key, entry in data["models"].items():
        rounds = entry["vramgate"]["rounds"]
        assert [r["clients"] for r in rounds] == [1, 4], key
        for r in rounds:
            assert r["ok"] == r["requests"] == r["clients"], (key, r)
            assert r["tokens"] == 32 * r["clients"] and r["tokens_per_s"] > 0, (key, r)
            assert abs(r["tokens_per_s"] - r["tokens"] / r["wall_s"]) < 1e-6 * r["tokens_per_s"]
            assert r["steps"] > 0 and r["ms_per_step"] > 0, (key, r)
        assert len(entry["vramgate"]["greedy_ids"]) == 32 and None not in entry["vramgate"]["greedy_ids"]
        assert "virtual device" in entry["hf"]["skipped"]
        assert entry["vramgate"]["served"]["dtype"] == entry["dtype"]
    assert "virtual device" in data["bandwidth"]["skipped"]
    assert TABLE_HEADER in md and "## Decode-step targets" in md
    assert "| `llama-2x64` bfloat16 | 4 |" in md and "| `gpt2-2x64` float32 | 1 |" in md
    help_text = subprocess.run([BIN, "serve", "--help"], capture_output=True, text=True, timeout=60).stdout
    if all(f in help_text for f in gpu.PROFILE_FLAGS):
        for key, entry in data["models"].items():
            profiles = entry["vramgate"]["profiles"]
            assert sorted(profiles) == ["1", "4"], key
            for p in profiles.values():
                assert p["summary"]["status"] == "ok" and p["summary"]["steps"] == 20, (key, p)
    else:
        assert data["profile_support"]["note"] == "profile: flags not supported by this build"
        assert "profile: flags not supported by this build" in md


# A stand-in for a build with the profile flags: lists them in `serve --help`,
# writes a trace whose kernel name carries the min batch it was given, then
# runs the real binary without them.
FAKE_BINARY = r'''#!{python}
import json, os, subprocess, sys
REAL = {real!r}
args = sys.argv[1:]
if "--help" in args:
    out = subprocess.run([REAL, *args], capture_output=True, text=True).stdout
    sys.stdout.write(out + "  --profile-steps N\n  --profile-min-batch B\n  --profile-trace PATH\n")
    sys.exit(0)
def take(flag):
    i = args.index(flag)
    value = args[i + 1]
    del args[i:i + 2]
    return value
if "--profile-trace" in args:
    steps, batch, path = int(take("--profile-steps")), int(take("--profile-min-batch")), take("--profile-trace")
    events = []
    for s in range(steps):
        t = 1000.0 * s
        events.append({{"ph": "X", "cat": "user_annotation", "name": "vg::decode_step", "ts": t, "dur": 500,
                        "pid": 1, "tid": 1}})
        for k in range(3):
            events.append({{"ph": "X", "cat": "kernel", "name": f"gemm_b{{batch}}", "ts": t + 10 * k, "dur": 100,
                            "pid": 0, "tid": 7}})
    with open(path, "w") as f:
        json.dump({{"traceEvents": events}}, f)
os.execv(REAL, [REAL, *args])
'''


def test_profile_rounds_reach_the_server_and_the_report(tmp_path):
    fake = tmp_path / "vramgate-with-profile"
    fake.write_text(FAKE_BINARY.format(python=sys.executable, real=os.path.abspath(BIN)))
    fake.chmod(0o755)
    data, md = run_bench(tmp_path, str(fake), "--models", "gpt2-2x64/float32", "--profile-steps", "7")
    assert data["profile_support"]["supported"] is True
    profiles = data["models"]["gpt2-2x64/float32"]["vramgate"]["profiles"]
    assert sorted(profiles) == ["1", "4"]
    for clients, p in profiles.items():
        s = p["summary"]
        assert p["round"]["ok"] == p["round"]["requests"] == int(clients)
        assert s["status"] == "ok" and s["steps"] == 7 and s["kernels_per_step"] == 3.0
        assert [k["name"] for k in s["top_kernels"]] == [f"gemm_b{clients}"]
    assert "### `gpt2-2x64` float32, 4 client(s)" in md and "`gemm_b4`" in md


def trace_fixture():
    """Two decode steps (each also on the GPU timeline); kernels whose order by
    total time differs from their order by count; launch calls and other
    runtime calls; host ops nested in one another, one as a B/E pair."""
    x = lambda cat, name, ts, dur, tid=1: {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur,  # noqa: E731
                                           "pid": 1, "tid": tid}
    events = [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "engine"}}]
    for step, t in enumerate((0, 1000)):
        events += [x("user_annotation", "vg::decode_step", t, 400 + 200 * step),
                   x("gpu_user_annotation", "vg::decode_step", t + 5, 300, tid=9),
                   x("cpu_op", "aten::linear", t + 10, 100), x("cpu_op", "aten::addmm", t + 20, 80),
                   x("kernel", "sgemm_128x64", t + 30, 10, 9), x("kernel", "sgemm_128x64", t + 50, 10, 9),
                   x("kernel", "layer_norm", t + 70, 5, 9),
                   x("cuda_runtime", "cudaLaunchKernel", t + 25, 3), x("cuda_runtime", "cudaLaunchKernel", t + 45, 3),
                   x("cuda_runtime", "cudaMemcpyAsync", t + 60, 2),
                   x("cuda_runtime", "cudaStreamSynchronize", t + 90, 8)]
    events += [x("kernel", "flash_attn_fwd", 1500, 60, 9), x("cuda_driver", "cuLaunchKernel", 1490, 4),
               x("cuda_runtime", "cudaGraphLaunch", 1495, 2),
               {"ph": "B", "cat": "cpu_op", "name": "aten::softmax", "ts": 1200, "pid": 1, "tid": 2},
               {"ph": "E", "cat": "cpu_op", "ts": 1250, "pid": 1, "tid": 2},
               {"ph": "s", "cat": "ac2g", "name": "flow", "ts": 25, "id": 1, "pid": 1, "tid": 1}]
    return {"traceEvents": events}


def test_trace_parser_on_a_hand_written_trace(tmp_path):
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(trace_fixture()))
    s = gpu_trace.parse_trace(str(path), top=3)
    assert s["status"] == "ok" and s["steps"] == 2
    assert s["step_ms"]["median"] == 0.5 and s["step_ms"]["max"] == 0.6
    # flash_attn 60 us once > sgemm 4 x 10 us > layer_norm 2 x 5 us.
    assert [(k["name"], k["count"], k["total_us"]) for k in s["top_kernels"]] == [
        ("flash_attn_fwd", 1, 60.0), ("sgemm_128x64", 4, 40.0), ("layer_norm", 2, 10.0)]
    assert s["kernels"] == 7 and s["kernels_per_step"] == 3.5
    assert s["launch_calls"] == 6 and s["launches_per_step"] == 3.0
    assert abs(s["kernel_ms_per_step"] - 0.055) < 1e-12
    ops = {o["name"]: o for o in s["top_host_ops"]}
    assert [o["name"] for o in s["top_host_ops"]] == ["aten::linear", "aten::addmm", "aten::softmax"]
    assert ops["aten::linear"]["total_us"] == 200 and ops["aten::linear"]["self_us"] == 40
    assert ops["aten::addmm"]["self_us"] == 160 and ops["aten::softmax"]["total_us"] == 50
    assert gpu_trace.parse_trace(str(path), top=1)["top_kernels"][0]["name"] == "flash_attn_fwd"
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps(trace_fixture()["traceEvents"]))
    assert gpu_trace.parse_trace(str(bare))["kernels"] == 7
    host_only = tmp_path / "host.json"
    host_only.write_text(json.dumps([e for e in trace_fixture()["traceEvents"] if e.get("cat") == "cpu_op"
                                     or e.get("name") == "vg::decode_step"]))
    h = gpu_trace.parse_trace(str(host_only))
    assert h["has_gpu_events"] is False and h["kernels_per_step"] is None and h["steps"] == 2
    assert gpu_trace.parse_trace(str(tmp_path / "missing.json"))["status"] == "no trace"
    (tmp_path / "cut.json").write_text('{"traceEvents": [')
    assert gpu_trace.parse_trace(str(tmp_path / "cut.json"))["status"] == "no trace"


def test_token_ids_and_agreement():
    assert [gpu.token_id(t, 256) for t in ["a", "bytes:\\x80", "", " 4096", " "]] == [97, 128, 256, 4096, 32]
    assert gpu.agreement([1, 2, 3, 4], [1, 2, 9, 4]) == {"equal": 3, "of": 4, "first_difference": 2}
    assert gpu.agreement([5, 6], [5, 6]) == {"equal": 2, "of": 2, "first_difference": None}


def test_only_the_steps_own_launches_and_kernels_count(tmp_path):
    """With correlation ids (as Kineto writes them), a kernel launched outside
    a step (another thread, or between steps) is not the step's."""
    x = lambda cat, name, ts, dur, tid=1, corr=None: {  # noqa: E731
        "ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": tid,
        **({"args": {"correlation": corr}} if corr is not None else {})}
    events = [x("user_annotation", "vg::decode_step", 0, 100), x("user_annotation", "vg::decode_step", 200, 100),
              x("cuda_runtime", "cudaLaunchKernel", 10, 2, corr=1), x("kernel", "gemv", 20, 50, tid=9, corr=1),
              x("cuda_runtime", "cudaLaunchKernel", 210, 2, corr=2), x("kernel", "gemv", 220, 50, tid=9, corr=2),
              # between the steps, and on the prefill worker's thread during a step
              x("cuda_runtime", "cudaLaunchKernel", 150, 2, corr=3), x("kernel", "argmax", 155, 5, tid=9, corr=3),
              x("cuda_runtime", "cudaLaunchKernel", 230, 2, tid=2, corr=4),
              x("kernel", "prefill_gemm", 240, 400, tid=9, corr=4)]
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    s = gpu_trace.parse_trace(str(path))
    assert s["kernels_attributed"] == "by correlation"
    assert s["launch_calls"] == 2 and s["launches_per_step"] == 1.0
    assert s["kernels"] == 2 and s["kernels_per_step"] == 1.0
    assert [k["name"] for k in s["top_kernels"]] == ["gemv"]
    assert abs(s["kernel_ms_per_step"] - 0.05) < 1e-12


def test_decode_step_targets_are_judged_from_the_rounds_and_profiles():
    import gpu_report

    def entry(name, dtype, ms_one, tps_top, hf_top, launches_one, launches_top):
        prof = {str(c): {"summary": {"status": "ok", "has_gpu_events": True, "launches_per_step": n}}
                for c, n in ((1, launches_one), (64, launches_top))}
        return {"checkpoint": name, "dtype": dtype,
                "floor": {"floor_ms_per_step": 0.5},
                "vramgate": {"rounds": [{"clients": 1, "ms_per_step": ms_one, "tokens_per_s": 1000 / ms_one},
                                        {"clients": 64, "ms_per_step": 2.0, "tokens_per_s": tps_top}],
                             "profiles": prof},
                "hf": {"rounds": [{"batch": 64, "tokens_per_s": hf_top}]}}

    data = {"models": {
        "llama-1.1b/bfloat16": entry("llama-1.1b", "bfloat16", 0.7, 26000, 1225, 300, 300),
        "gpt2-12x768/float32": entry("gpt2-12x768", "float32", 2.7, 20000, 8751, 180, 240),
        "gpt2-12x768/bfloat16": entry("gpt2-12x768", "bfloat16", 3.7, 30000, 9000, 180, 180),
    }}
    lines = gpu_report.target_lines(data)
    text = "\n".join(lines)
    assert "| `llama-1.1b` bfloat16 | batch-1 step <= 1.5x floor | 1.4x | met |" in text
    assert "| `llama-1.1b` bfloat16 | >= 25,000 tokens/s at 64 clients | 26,000 | met |" in text
    assert "| `gpt2-12x768` float32 | >= 3.0x HF batched at 64 clients | 2.29x | NOT met |" in text
    assert "| `gpt2-12x768` float32 | launches per step at 64 clients <= at 1 | 240 vs 180 | NOT met |" in text
    assert "| `gpt2-12x768` bfloat16 | launches per step at 64 clients <= at 1 | 180 vs 180 | met |" in text
    assert "| `gpt2-12x768` | bfloat16 batch-1 step <= float32's | 3.7 vs 2.7 ms | NOT met |" in text
    # No profile with GPU events (a virtual device): not judged.
    del data["models"]["llama-1.1b/bfloat16"]["vramgate"]["profiles"]["64"]
    assert "| launches per step at 64 clients <= at 1 | n/a | n/a |" in "\n".join(gpu_report.target_lines(data))
