"""Counting requests: every request that ends is counted exactly once by
outcome, whatever its n, its preemptions, its engine's crashes, its moves
between engines and its client's leaving. At rest, on /v1/admission and
/metrics alike:

    admitted = completed + failed + cancelled

(admitted: requests granted a lease, once each; the three: how those
ended), and the requests that never left a queue are counted by how they
left it (cancelled_queued, queue_timeouts, deadline_expired, rejected_*), so
that every request sent is counted once. Random traffic (seeded) drives the
real binary; waits are on conditions the server reports."""
import concurrent.futures as cf
import json
import os
import random
import signal

import pytest
import requests

import test_multi_device as multi
from conftest import IN_PROCESS, Server, sse_events, wait_until


def at_rest(server):
    a = server.admission()
    return a["running"] == 0 and a["queued"] == 0


def metric_values(server):
    out = {}
    for line in server.get("/metrics").text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def check_balance(server, sent=None):
    """The counting identity on /v1/admission and /metrics, at rest; with
    `sent`, every request sent is counted once among the ends."""
    wait_until(lambda: at_rest(server), what="nothing running or queued")
    a = server.admission()
    assert a["admitted"] == a["completed"] + a["failed"] + a["cancelled"], a
    m = metric_values(server)
    finished = sum(m[f'vramgate_requests_finished_total{{outcome="{o}"}}'] for o in ("completed", "failed", "cancelled"))
    assert m['vramgate_admission_outcomes_total{reason="admitted"}'] == finished == a["admitted"], m
    if sent is not None:
        never_admitted = (a["cancelled_queued"] + a["queue_timeouts"] + a["deadline_expired"] +
                          a["rejected_queue_full"] + a["rejected_never_fits"])
        assert a["admitted"] + never_admitted == sent, a
    return a


def run_client(url, body, leave_after):
    """One completion; the client leaves after `leave_after` stream events
    (None: it reads to the end). Returns (status, outcome): outcome is
    "done", "left" or the error type."""
    if leave_after is None and not body.get("stream"):
        r = requests.post(url + "/v1/completions", json=body, timeout=120)
        return r.status_code, "done" if r.status_code == 200 else r.json()["error"]["type"]
    with requests.post(url + "/v1/completions", json=dict(body, stream=True), stream=True, timeout=120) as r:
        if r.status_code != 200:
            return r.status_code, r.json()["error"]["type"]
        for i, payload in enumerate(sse_events(r)):
            if leave_after is not None and i >= leave_after:
                return 200, "left"
            if payload.startswith("{") and "error" in json.loads(payload):
                return 200, json.loads(payload)["error"]["type"]
        return 200, "done"


def random_requests(seed, count, poison_at=None):
    rng = random.Random(seed)
    out = []
    for i in range(count):
        body = {"prompt": f"Count {seed} {i}", "max_tokens": rng.choice([8, 24, 40]), "ignore_eos": True,
                "n": rng.choice([1, 1, 2, 4]), "stream": rng.random() < 0.5}
        if i == poison_at:
            body.update(prompt="a POISON pill", n=1, stream=False)
        leave_after = rng.choice([None, None, None, 0, 3])  # 0: leaves at once, often while queued
        out.append((body, None if i == poison_at else leave_after))
    return out


def drive(server, reqs, workers=8):
    with cf.ThreadPoolExecutor(workers) as pool:
        return list(pool.map(lambda br: run_client(server.url, *br), reqs))


@pytest.mark.parametrize("seed", [1, 2])
def test_choices_preemptions_and_clients_leaving_are_each_counted_once(make_server, seed):
    # Step 6 fails with out-of-memory: running sequences (choices among them)
    # are preempted and granted again; clients leave while queued or running.
    server = make_server("--max-batch", "4", "--max-queue", "64", "--test-step-delay-ms", "5",
                         "--test-inject-oom-step", "6", "--oom-quiet-period", "3600")
    reqs = random_requests(seed, 24)
    results = drive(server, reqs)
    a = check_balance(server, sent=len(reqs))
    assert a["out_of_memory"] == 1 and a["preemptions"] >= 1, a
    done = sum(1 for _, outcome in results if outcome == "done")
    left = sum(1 for _, outcome in results if outcome == "left")
    assert all(outcome in ("done", "left") for _, outcome in results), results
    # A client that left may have left after its request completed.
    assert done <= a["completed"] <= done + left, (results, a)
    assert a["failed"] == 0, a


@pytest.mark.skipif(IN_PROCESS, reason="engine processes: the default mode only")
def test_engine_crashes_resubmissions_and_the_poison_request_are_each_counted_once():
    s = Server("--test-crash-on-prompt", "POISON", "--max-crash-retries", "2", "--test-step-delay-ms", "10",
               "--max-batch", "8")
    try:
        reqs = random_requests(3, 16, poison_at=10)
        results = drive(s, reqs)
        assert (500, "engine_crashed") in results, results
        # Not `sent`: while no engine is ready the gateway refuses new
        # requests at the door (503), before any queue counts them.
        a = check_balance(s)
        crashed = sum(1 for r in results if r == (500, "engine_crashed"))
        assert a["failed"] >= crashed == 1, (results, a)
        m = metric_values(s)
        assert m['vramgate_requests_finished_total{outcome="failed"}'] == a["failed"], m
        # One device label everywhere: the engine's metrics name the device as the device metrics do.
        wait_until(lambda: s.engines()[0]["state"] == "ready", what="engine up after the crashes")
        m = metric_values(s)
        assert m['vramgate_engine_restarts_total{device="virt:0"}'] == 2, m
        assert m['vramgate_engine_up{device="virt:0"}'] == 1, m
        assert not [k for k in m if 'device="auto"' in k], m
        assert m['vramgate_requests_resumed_total{reason="resubmitted"}'] + \
            m['vramgate_requests_resumed_total{reason="resumed"}'] >= 1, m
    finally:
        assert s.stop() == 0, s.logs()


def cumulative_values(server):
    """Every counter series of /metrics (names ending in _total, histogram
    _count and _sum) and every count of /v1/admission (its top-level
    integers, booked retries, and each device's counters and KV block
    counts), by name."""
    out = {k: v for k, v in metric_values(server).items()
           if k.split("{")[0].endswith(("_total", "_count", "_sum"))}
    a = server.admission()
    for k, v in a.items():
        if isinstance(v, int) and not isinstance(v, bool) and k not in ("queue_depth", "queued", "running"):
            out["admission." + k] = v
    for k, v in a.get("retry_bookings", {}).items():
        if k not in ("held", "places"):
            out["admission.retry_bookings." + k] = v
    for d in a["devices"]:
        for k in ("completed", "out_of_memory", "preemptions"):
            out[f"admission.{d['name']}.{k}"] = d[k]
        for k, v in d["budget_changes"].items():
            out[f"admission.{d['name']}.budget_changes.{k}"] = v
        for k in ("evicted", "prompt_tokens", "prefix_hit_tokens", "recomputed_tokens", "growth_preemptions"):
            if "kv_blocks" in d:
                out[f"admission.{d['name']}.kv_blocks.{k}"] = d["kv_blocks"][k]
    return out


@pytest.mark.skipif(IN_PROCESS, reason="engine processes: the default mode only")
def test_no_counter_goes_back_when_the_engine_process_is_killed_and_restarted(make_server):
    # Work that moves every kind of counter (prompt tokens computed and from
    # the prefix cache, an out-of-memory step, preemptions, budget cuts),
    # then the engine process is killed: after its restart, every counter
    # series of /metrics and every count of /v1/admission is at least what
    # it was (Prometheus reads a drop as a reset).
    server = make_server("--max-batch", "4", "--test-step-delay-ms", "5", "--test-inject-oom-step", "6",
                         "--oom-quiet-period", "3600")
    drive(server, [({"prompt": "Shared prefix of every request, then " + str(i), "max_tokens": 16,
                     "ignore_eos": True}, None) for i in range(8)])
    wait_until(lambda: at_rest(server), what="nothing running or queued")
    before = cumulative_values(server)
    assert before["admission.virt:0.kv_blocks.prompt_tokens"] > 0 and before["admission.out_of_memory"] == 1, before
    old = server.engines()[0]["pid"]
    os.kill(old, signal.SIGKILL)
    wait_until(lambda: server.engines()[0]["pid"] not in (0, old) and server.engines()[0]["state"] == "ready",
               what="a new engine process ready")
    after_restart = cumulative_values(server)
    went_back = {k: (v, after_restart.get(k)) for k, v in before.items() if after_restart.get(k, -1) < v}
    assert not went_back, went_back
    drive(server, [({"prompt": "One more after the restart", "max_tokens": 4}, None)])
    wait_until(lambda: at_rest(server), what="nothing running or queued")
    after = cumulative_values(server)
    went_back = {k: (v, after.get(k)) for k, v in after_restart.items() if after.get(k, -1) < v}
    assert not went_back, went_back
    assert after["admission.virt:0.kv_blocks.prompt_tokens"] > before["admission.virt:0.kv_blocks.prompt_tokens"]


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


@pytest.mark.skipif(IN_PROCESS, reason="engine processes: the default mode only")
def test_a_request_moved_to_another_engine_is_admitted_once(tracked):
    # test_multi_device's scenario: the third request waits in virt:0's queue
    # and is taken back (withdrawn) and placed on virt:1 when room frees there;
    # two streams are left by their clients while running.
    multi.test_a_busy_device_sends_the_next_request_to_the_free_one(tracked)
    server = tracked.started[-1]
    a = check_balance(server, sent=4)
    assert a["moved"] == 1 and a["admitted"] == 4 and a["cancelled"] == 2, a


def test_a_request_of_three_choices_is_one_completion_and_one_latency_sample(server):
    before = metric_values(server)
    a0 = server.admission()
    r = server.post("/v1/completions", {"prompt": "Three", "max_tokens": 6, "n": 3, "ignore_eos": True})
    assert r.status_code == 200 and len(r.json()["choices"]) == 3, r.text
    a = check_balance(server)
    after = metric_values(server)
    for name in ('vramgate_requests_finished_total{outcome="completed"}', "vramgate_request_duration_seconds_count",
                 "vramgate_time_to_first_token_seconds_count", 'vramgate_admission_outcomes_total{reason="admitted"}'):
        assert after[name] - before.get(name, 0) == 1, (name, before.get(name), after[name])
    assert a["completed"] - a0["completed"] == 1 and a["admitted"] - a0["admitted"] == 1, (a0, a)
