"""The step profile (--profile-steps, --profile-min-batch, --profile-trace)
against the real binary: concurrent requests on tinylm and a virtual device
make decode steps of several sequences; the first engine writes a Chrome
trace with one vg::decode_step range per recorded step. Without a trace path
the server does not start."""
import concurrent.futures
import json
import subprocess

import pytest
import requests

from conftest import BIN, MODEL_DIR, wait_until

STEPS = 3


def test_trace_holds_the_requested_decode_steps(tmp_path, make_server):
    trace = tmp_path / "steps.json"
    # The step delay keeps requests running, so the later ones join the first.
    server = make_server("--device", "virt:0=1GiB", "--max-batch", "4", "--test-step-delay-ms", "5",
                         "--profile-steps", str(STEPS), "--profile-min-batch", "2", "--profile-trace", str(trace))
    body = {"prompt": "The step profile", "max_tokens": 24, "temperature": 0, "ignore_eos": True}

    def one(_):
        return requests.post(server.url + "/v1/completions", json=body, timeout=120)

    with concurrent.futures.ThreadPoolExecutor(4) as ex:
        codes = [r.status_code for r in ex.map(one, range(4))]
    assert codes == [200] * 4, codes

    # Written by the engine thread after the last recorded step; the log line follows it.
    wait_until(lambda: trace.exists() and "profile: " + str(STEPS) + " decode steps" in server.logs(),
               what="the trace file and its log line")
    events = json.loads(trace.read_text())["traceEvents"]
    ranges = [e for e in events if e.get("name") == "vg::decode_step" and e.get("ph") == "X"]
    assert len(ranges) == STEPS, [e for e in events if "decode_step" in str(e.get("name"))]
    assert all(e["cat"] == "user_annotation" for e in ranges)
    assert f"decode steps of batch >= 2 written to {trace}" in server.logs()


@pytest.mark.same_in_both_modes
def test_steps_without_a_trace_path_refuse_to_start():
    out = subprocess.run([BIN, "serve", "--model-dir", MODEL_DIR, "--device", "virt:0=1GiB", "--port", "0",
                          "--profile-steps", "2"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out.stderr
    assert "--profile-trace" in out.stderr and "--profile-steps" in out.stderr, out.stderr
