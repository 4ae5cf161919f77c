"""Engine processes per device: with several --devices, `serve` starts one
engine process per device (the default). Each device has its own admission
queue; the gateway places each request on the engine with the most free
budget (its last status, less what it placed there since), passes one too
large for an engine's devices to an engine with a larger budget, and moves
a request waiting in one engine's queue to an engine where room freed first,
so clients see what one queue over the devices gives them: test_multi_device
checks that in this mode, and test_one_engine.py with --one-engine (one
engine process for all devices). Then what a process per device adds: a crash stops
one device, and the other serves on; the server exits only when no engine
can start. Waits are on conditions the server reports."""
import concurrent.futures as cf
import json
import os
import signal
import subprocess
import threading

import pytest
import requests

import test_multi_device as multi
from conftest import BIN, IN_PROCESS, MODEL_DIR, Server, wait_until

pytestmark = pytest.mark.skipif(IN_PROCESS, reason="engine processes: the default mode only")


def engines(server):
    return server.engines()


def settled(server):
    return server.engines_settled()


@pytest.fixture
def tracked(make_server):
    """make_server that keeps the servers it started (make.started)."""
    started = []

    def make(*args, **kw):
        s = make_server(*args, **kw)
        started.append(s)
        return s

    make.started = started
    return make


def test_a_busy_device_sends_the_next_request_to_the_free_one(tracked):
    """test_multi_device's test, and how the default got there: the third
    request waited in virt:0's queue (both devices full, a tie: the earlier
    device); when virt:1 freed room first, the gateway took it back from
    virt:0's queue and it ran on virt:1."""
    multi.test_a_busy_device_sends_the_next_request_to_the_free_one(tracked)
    server = tracked.started[-1]
    assert len({e["pid"] for e in engines(server)}) == 2
    assert 'vramgate_requests_resumed_total{reason="moved"} 1' in multi.metric_lines(server)
    assert "moved to engine virt:1" in server.logs()
    # virt:0's engine counts it as moved (its two cancellations are the
    # test's own, as in one process); virt:1's as admitted.
    admission = server.admission()
    assert admission["moved"] == 1 and admission["cancelled"] == 2, admission
    assert 'vramgate_admission_outcomes_total{reason="moved"} 1' in multi.metric_lines(server)


def stream_text(server, prompt, max_tokens, seen=None):
    """A greedy streamed completion's text; `seen` (an Event) is set at its first token."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True}
    r = requests.post(server.url + "/v1/completions", json=body, stream=True, timeout=120)
    assert r.status_code == 200, r.text
    text, finished = "", None
    for line in r.iter_lines():
        if not line.startswith(b"data: "):
            continue
        if line[6:] == b"[DONE]":
            break
        chunk = json.loads(line[6:])
        assert "error" not in chunk, chunk
        for c in chunk["choices"]:
            text += c["text"]
            finished = c.get("finish_reason") or finished
        if seen is not None and text:
            seen.set()
    assert finished == "length", (finished, text)
    return text


def test_each_device_has_its_own_engine_and_a_crash_stops_only_that_one(make_server):
    server = make_server("--device", "virt:0=64MiB", "--device", "virt:1=64MiB", "--test-step-delay-ms", "20")
    before = {e["device"]: e for e in engines(server)}
    assert set(before) == {"virt:0=64MiB", "virt:1=64MiB"}, before
    assert len({e["pid"] for e in before.values()}) == 2, before
    assert all(e["state"] == "ready" and e["restarts"] == 0 for e in before.values()), before
    names = {e["device"]: e["models"] for e in before.values()}
    assert all(m == ["tinylm"] for m in names.values()), names

    prompts = ["A dragon on virt zero", "A castle on virt one"]
    reference = [server.post("/v1/completions", {"prompt": p, "max_tokens": 60, "temperature": 0,
                                                 "ignore_eos": True}).json()["choices"][0]["text"] for p in prompts]
    wait_until(lambda: multi.all_idle(server), what="idle")

    seen = [threading.Event(), threading.Event()]
    with cf.ThreadPoolExecutor(2) as pool:
        # Both devices empty: the first goes to virt:0 (ties go to the earlier
        # device), the second to virt:1, which then has more free budget.
        first = pool.submit(stream_text, server, prompts[0], 60, seen[0])
        assert seen[0].wait(60)
        second = pool.submit(stream_text, server, prompts[1], 60, seen[1])
        assert seen[1].wait(60)
        d = multi.devices(server)
        assert d["virt:0"]["running"] == 1 and d["virt:1"]["running"] == 1, d
        os.kill(before["virt:0=64MiB"]["pid"], signal.SIGKILL)
        texts = [first.result(timeout=120), second.result(timeout=120)]
    # Greedy: the stream cut by the crash resumed without a repeated or lost
    # token; the other never saw it.
    assert texts == reference

    wait_until(lambda: settled(server) and all(e["state"] == "ready" for e in engines(server)),
               what="the killed engine restarted")
    after = {e["device"]: e for e in engines(server)}
    assert after["virt:1=64MiB"]["pid"] == before["virt:1=64MiB"]["pid"], after
    assert after["virt:1=64MiB"]["restarts"] == 0, after
    assert after["virt:0=64MiB"]["restarts"] == 1, after
    assert after["virt:0=64MiB"]["pid"] != before["virt:0=64MiB"]["pid"], after
    assert after["virt:0=64MiB"]["last_exit"] == "signal 9", after
    lines = multi.metric_lines(server)
    assert 'vramgate_engine_restarts_total{device="virt:0"} 1' in lines
    assert 'vramgate_engine_restarts_total{device="virt:1"} 0' in lines
    # Both serve again.
    for i in range(4):
        r = server.post("/v1/completions", {"prompt": f"Again {i}", "max_tokens": 4})
        assert r.status_code == 200, r.text
    wait_until(lambda: multi.all_idle(server), what="idle")


def test_the_server_exits_when_no_engine_can_start():
    p = subprocess.run([BIN, "serve", "--model-dir", MODEL_DIR, "--port", "0", "--device", "virt:0=1MiB",
                        "--device", "virt:1=1MiB"], capture_output=True, text=True, timeout=120)
    out = p.stdout + p.stderr
    assert p.returncode == 2, out  # every engine exited 2: the devices cannot hold the weights
    assert "start-up failed" in out and "could not start" in out, out
    assert "out of memory on virt:0" in out and "out of memory on virt:1" in out, out
    assert "Traceback" not in out and "terminate" not in out, out


@pytest.mark.parametrize("other", [["--in-process"], ["--engine", "unix:/tmp/x.sock"]])
def test_one_engine_is_refused_where_serve_starts_no_engines(other):
    p = subprocess.run([BIN, "serve", "--model-dir", MODEL_DIR, "--port", "0", "--one-engine", *other],
                       capture_output=True, text=True, timeout=60)
    out = p.stdout + p.stderr
    assert p.returncode == 2, out
    assert "one_engine" in out or "one-engine" in out, out
