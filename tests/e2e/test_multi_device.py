"""Several devices in one server (`--device` repeated) against the real binary
on tinylm: requests spread over the devices, a busy device sends work to a
free one, a request waits in the one queue until a device frees room, a
device that fails at start-up is left out and shown unhealthy, and a request
that fits on no device is refused with 413. Slow steps come from the
--test-step-delay-ms hook; the tests wait on the server's own state
(/v1/admission), never on sleeps. Placement rule (admission): a request goes
to the device where it fits with the most free budget; ties go to the device
with fewer running sequences, then to the lower index."""
import concurrent.futures
import subprocess
import threading

import requests

from conftest import BIN, IN_PROCESS, MODE_ARGS, MODEL_DIR, Server, sse_events, wait_until
from scenario_util import body_for_tokens, cost_of, never_fits, profile_of

TWO = ("--device", "virt:0=64MiB", "--device", "virt:1=64MiB")


def devices(server):
    return {d["name"]: d for d in server.admission()["devices"]}


def all_idle(server):
    a = server.admission()
    return (a["running"] == 0 and a["queued"] == 0 and
            all(d["reserved_bytes"] == 0 and d["running"] == 0 for d in a["devices"]))


def metric_lines(server):
    return set(server.get("/metrics").text.splitlines())


def open_stream(server, body):
    """Starts a streaming completion and returns (response, its SSE events)."""
    r = requests.post(server.url + "/v1/completions", json=dict(body, stream=True), stream=True, timeout=120)
    assert r.status_code == 200, r.text
    return r, sse_events(r)


def test_concurrent_requests_spread_over_both_devices(make_server):
    server = make_server(*TWO, "--max-batch", "2", "--test-step-delay-ms", "5")
    n, max_tokens = 8, 48
    start = threading.Barrier(n)

    def one(i):
        start.wait()
        return server.post("/v1/completions", {"prompt": f"Story {i}:", "max_tokens": max_tokens, "seed": 100 + i,
                                               "temperature": 1.0, "ignore_eos": True})

    with concurrent.futures.ThreadPoolExecutor(n) as pool:
        results = list(pool.map(one, range(n)))
    for r in results:
        assert r.status_code == 200, r.text
    bodies = [r.json() for r in results]
    for b in bodies:
        assert b["usage"]["completion_tokens"] == max_tokens, b
        assert b["choices"][0]["text"], b
    # Each request answered once, with its own id and text.
    assert len({b["id"] for b in bodies}) == n, [b["id"] for b in bodies]
    assert len({b["choices"][0]["text"] for b in bodies}) == n

    wait_until(lambda: all_idle(server), what="both devices idle")
    a = server.admission()
    assert [d["name"] for d in a["devices"]] == ["virt:0", "virt:1"]
    for d in a["devices"]:
        assert d["state"] == "ready" and d["ready"] is True, d
        assert "reason" not in d, d
        assert d["models"] == ["tinylm"], d
        assert d["completed"] > 0, a  # both devices took work
        assert 0 < d["peak_reserved_bytes"] <= d["budget_bytes"], d
        assert d["out_of_memory"] == 0 and d["preemptions"] == 0, d
    # Nothing lost, nothing run twice: the per-device counts add up.
    assert sum(d["completed"] for d in a["devices"]) == n, a
    assert a["completed"] == n and a["admitted"] == n, a
    lines = metric_lines(server)
    for name in ("virt:0", "virt:1"):
        assert f'vramgate_device_running_sequences{{device="{name}"}} 0' in lines
        assert f'vramgate_device_ready{{device="{name}"}} 1' in lines
    assert 'vramgate_requests_finished_total{outcome="completed"} 8' in lines


def test_a_busy_device_sends_the_next_request_to_the_free_one(make_server):
    """virt:0 holds a long stream (max-batch 1: it is full); a second request
    runs on virt:1 and completes while the first still runs on virt:0; a third
    waits in the one queue and runs where room frees first."""
    server = make_server(*TWO, "--max-batch", "1", "--test-step-delay-ms", "40")
    long = {"prompt": "The", "max_tokens": 250, "ignore_eos": True}
    first, first_events = open_stream(server, long)
    next(first_events)  # a token came: it runs, on virt:0 (both empty: the lower index)
    d = devices(server)
    assert d["virt:0"]["running"] == 1 and d["virt:0"]["reserved_bytes"] > 0, d
    assert d["virt:1"]["running"] == 0 and d["virt:1"]["reserved_bytes"] == 0, d
    lines = metric_lines(server)
    assert 'vramgate_device_running_sequences{device="virt:0"} 1' in lines
    assert 'vramgate_device_running_sequences{device="virt:1"} 0' in lines

    r = server.post("/v1/completions", {"prompt": "Hi", "max_tokens": 4, "ignore_eos": True})
    assert r.status_code == 200, r.text
    d = devices(server)
    assert d["virt:1"]["completed"] == 1, d
    assert d["virt:0"]["completed"] == 0 and d["virt:0"]["running"] == 1, d  # the stream still holds virt:0

    # Both devices full: the next request waits in the queue ...
    second, second_events = open_stream(server, long)
    next(second_events)
    d = devices(server)
    assert d["virt:0"]["running"] == 1 and d["virt:1"]["running"] == 1, d
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        queued = pool.submit(server.post, "/v1/completions", {"prompt": "Yo", "max_tokens": 4, "ignore_eos": True})
        wait_until(lambda: server.admission()["queue_depth"] == 1, what="third request queued")
        # ... until virt:1 frees room (its stream's client leaves); virt:0 stays busy.
        second.close()
        r = queued.result(timeout=120)
    assert r.status_code == 200, r.text
    d = devices(server)
    assert d["virt:1"]["completed"] == 2, d
    assert d["virt:0"]["completed"] == 0 and d["virt:0"]["running"] == 1, d
    first.close()
    wait_until(lambda: all_idle(server), what="both devices idle")
    a = server.admission()
    assert a["cancelled"] == 2 and a["completed"] == 2, a
    assert sum(x["completed"] for x in a["devices"]) == 2, a


def test_a_device_that_fails_at_start_up_is_left_out_and_shown_unhealthy(make_server):
    # 1 MiB cannot hold tinylm's weights (2.5 MiB): virt:1 fails, virt:0 serves.
    server = make_server("--device", "virt:0=64MiB", "--device", "virt:1=1MiB")
    r = server.get("/ready")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["status"] == "ready" and "reason" not in body, body
    shown = {d["name"]: d for d in body["devices"]}
    assert set(shown) == {"virt:0", "virt:1"}, body
    assert shown["virt:0"]["state"] == "ready" and "reason" not in shown["virt:0"], body
    assert shown["virt:1"]["state"] == "unhealthy", body
    assert "out of memory" in shown["virt:1"]["reason"], body

    d = devices(server)
    assert d["virt:1"]["state"] == "unhealthy" and d["virt:1"]["ready"] is False, d
    assert "out of memory on virt:1" in d["virt:1"]["reason"], d
    assert d["virt:0"]["state"] == "ready" and d["virt:0"]["ready"] is True, d
    model = server.get("/v1/models").json()["data"][0]
    assert model["device"] == "virt:0" and model["devices"] == ["virt:0"], model
    lines = metric_lines(server)
    assert 'vramgate_device_ready{device="virt:0"} 1' in lines
    assert 'vramgate_device_ready{device="virt:1"} 0' in lines
    assert "vramgate_ready 1" in lines
    assert "left out" in server.logs()

    for i in range(3):
        r = server.post("/v1/completions", {"prompt": f"Hello {i}", "max_tokens": 4})
        assert r.status_code == 200, r.text
    wait_until(lambda: all_idle(server), what="idle")
    d = devices(server)
    assert d["virt:0"]["completed"] == 3 and d["virt:1"]["completed"] == 0, d


def run_serve(*device_args):
    return subprocess.run([BIN, "serve", "--model-dir", MODEL_DIR, "--port", "0", *MODE_ARGS, *device_args],
                          capture_output=True, text=True, timeout=120)


def test_start_up_fails_when_every_device_fails():
    p = run_serve("--device", "virt:0=1MiB")
    out = p.stdout + p.stderr
    assert p.returncode == 2, out  # the device cannot hold the weights: a setting
    assert "start-up failed" in out and "out of memory on virt:0" in out, out
    # One process serves HTTP only once its devices are up; a gateway listens
    # (its /ready says the engine is starting) and exits once the engine cannot start.
    assert ("listening on" not in out) if IN_PROCESS else ("could not start" in out), out

    p = run_serve("--device", "virt:0=1MiB", "--device", "virt:1=1MiB")
    out = p.stdout + p.stderr
    assert p.returncode == 2, out
    assert "start-up failed" in out, out
    assert "virt:0" in out and "virt:1" in out, out
    assert ("listening on" not in out) if IN_PROCESS else ("could not start" in out), out
    assert "Traceback" not in out and "terminate" not in out, out


def test_a_request_that_fits_on_no_device_is_413(make_server):
    """Unequal budgets from unequal capacities: virt:1's budget is exactly
    the cost of 200 tokens, virt:0's is smaller. One token more (with a paged
    KV cache, one block more) fits nowhere, even on an empty device (413);
    200 tokens fit on virt:1 only."""
    caps = ("--device", "virt:0=12MiB", "--device", "virt:1=12544KiB")  # virt:1: 256 KiB more
    probe = Server(*caps)
    try:
        profile = profile_of(probe, device=1)
        b0_probe, b1_probe = [d["budget_bytes"] for d in probe.admission()["devices"]]
    finally:
        probe.stop()
    target = cost_of(profile, 200)
    reserve = b1_probe - target
    assert reserve > 0, (b1_probe, target)
    server = make_server(*caps, "--memory-reserve", str(reserve))
    b0, b1 = [d["budget_bytes"] for d in server.admission()["devices"]]
    assert b1 == target and b0 == b0_probe - reserve, (b0, b1, target)
    assert cost_of(profile, 20) < b0 < cost_of(profile, 200), (b0, b1)
    too_many = never_fits(profile, b1)
    assert too_many <= profile["context_length"]  # within context: memory refuses them

    for stream in (False, True):
        r = server.post("/v1/completions", body_for_tokens(too_many, stream=stream))
        assert r.status_code == 413, r.text
        err = r.json()["error"]
        assert err["type"] == "exceeds_device_memory", err
        assert err["needed_bytes"] == cost_of(profile, too_many), err
        assert err["budget_bytes"] == b1, err  # the largest budget
        assert "largest device budget" in err["message"], err
    a = server.admission()
    assert a["rejected_never_fits"] == 2 and a["admitted"] == 0, a

    # More than virt:0's budget, within virt:1's: it runs on virt:1.
    over_b0 = next(t for t in range(20, 201) if cost_of(profile, t) > b0)
    for tokens in (over_b0, 200):
        r = server.post("/v1/completions", body_for_tokens(tokens))
        assert r.status_code == 200, r.text
    wait_until(lambda: all_idle(server), what="idle")
    d = devices(server)
    assert d["virt:1"]["completed"] == 2 and d["virt:0"]["completed"] == 0, d
    assert d["virt:1"]["peak_reserved_bytes"] == b1, d  # exactly the budget was held
