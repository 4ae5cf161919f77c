"""The shared queue of Redis mode end to end (docs/redis.md "Redis mode"): gateways
(`serve --queue URL --gateway-only`) place completions in Redis, engines
(`vramgate engine --queue URL`) of different sizes pull only what fits their
free budget; an engine killed or stalled mid-stream has its requests claimed
by another engine, which resumes them after the tokens already sent (greedy
output equals a fault-free run, nothing repeated); a stalled engine's late
output is fenced out; a killed gateway's requests stop; a Redis killed and
restarted (appendfsync always) loses no accepted request; a poison request
is dead-lettered with engine_crashed; a malformed entry written by hand is
dead-lettered and the engine goes on; an Idempotency-Key sent to several
gateways causes one computation (followed while it runs, replayed after it
completed, 422 with another body); an engine at its max batch leaves the
next entry to another engine. Redis and the engines are started here
(loopback, temporary folders); nothing waits on sleeps (conditions are
polled with deadlines). Multi-process mode only: --in-process servers do not
use the shared queue."""
import concurrent.futures as cf
import json
import os
import subprocess
import sys
import threading
import time

import pytest
import requests

from conftest import BIN, IN_PROCESS, MODEL_DIR, sse_events, wait_until
from redis_util import EngineProcess, RedisServer, resp_command
from scenario_util import cost_of

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
from server_process import ServerProcess  # noqa: E402

pytestmark = pytest.mark.skipif(IN_PROCESS, reason="the shared queue is a multi-process feature")


class Engine(EngineProcess):
    """`vramgate engine --queue URL` on its own socket, its log kept."""

    def __init__(self, tmp_path, name, redis_url, device="virt:0=64MiB", *extra):
        folder = tmp_path / ("run-" + name)
        folder.mkdir(mode=0o700)
        super().__init__(BIN, MODEL_DIR, str(folder / "e.sock"), redis_url, device, *extra)


class Gateway(ServerProcess):
    def __init__(self, redis_url, *args):
        super().__init__([BIN, "serve", "--model-dir", MODEL_DIR, "--port", "0", "--queue", redis_url,
                          "--gateway-only", *args])

    def post(self, path, body, timeout=60, **kw):
        return requests.post(self.url + path, json=body, timeout=timeout, **kw)

    def get(self, path, timeout=10):
        return requests.get(self.url + path, timeout=timeout)

    def engines(self):
        return [e for e in self.get("/v1/engines").json()["data"] if e["address"].startswith("redis:")]

    def logs(self):
        return "".join(self.log)


@pytest.fixture
def redis():
    r = RedisServer()
    yield r
    r.stop()


@pytest.fixture
def cluster(tmp_path):
    """make_engine(...) and make_gateway(...), all stopped at the end."""
    engines, gateways = [], []

    class Cluster:
        def engine(self, redis_url, *args, **kw):
            e = Engine(tmp_path, str(len(engines)), redis_url, *args, **kw)
            engines.append(e)
            return e

        def gateway(self, redis_url, *args):
            g = Gateway(redis_url, *args)
            gateways.append(g)
            return g

    yield Cluster()
    for g in gateways:
        g.kill()
    for e in engines:
        e.stop()


def wait_registered(gateway, engines):
    pids = {e.pid for e in engines}
    wait_until(lambda: pids <= {e["pid"] for e in gateway.engines() if e["state"] == "ready"}, timeout=60,
               what="the engines registered in the shared queue")


def events_text(events):
    """(text, chunks) of the rest of an SSE stream's events, up to [DONE]; fails on an error event."""
    text, chunks = "", 0
    for data in events:
        if data == "[DONE]":
            return text, chunks
        event = json.loads(data)
        assert "error" not in event, event
        text += event["choices"][0]["text"]
        chunks += 1
    pytest.fail("the stream ended without [DONE]")


def stream_text(resp):
    """(text, chunks) of a completed SSE stream."""
    return events_text(sse_events(resp))


def sse_text(resp):
    return stream_text(resp)[0]


def greedy(prompt, max_tokens, stream=False):
    return {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": stream}


def wait_idle(gateway):
    """Until every registration shows nothing running (they lag a heartbeat)."""
    wait_until(lambda: all(x["running"] == 0 for x in gateway.engines()), timeout=20, what="the engines idle")


def running_engine(gateway, engines):
    """The engine (of `engines`) the gateway's registry shows running something."""
    by_pid = {e.pid: e for e in engines}
    for info in gateway.engines():
        if info["running"] > 0 and info["pid"] in by_pid:
            return by_pid[info["pid"]]
    return None


def test_two_gateways_three_engines_each_pulls_only_what_fits(redis, cluster):
    delay = ("--test-step-delay-ms", "5", "--max-batch", "2")
    big = cluster.engine(redis.url, "virt:0=64MiB", *delay)
    a = cluster.gateway(redis.url)
    wait_registered(a, [big])
    profile = a.get("/v1/models").json()["data"][0]
    big_budget = a.get("/v1/admission").json()["devices"][0]["budget_bytes"]
    # The small engines' budgets hold 128 tokens; the large requests need 200.
    small_budget = cost_of(profile, 128)
    smalls = [cluster.engine(redis.url, "virt:0=64MiB", *delay, "--memory-reserve", str(big_budget - small_budget))
              for _ in range(2)]
    b = cluster.gateway(redis.url)
    wait_registered(a, [big, *smalls])
    wait_registered(b, [big, *smalls])
    budgets = {d["name"]: d["budget_bytes"] for d in a.get("/v1/admission").json()["devices"]}
    assert sorted(budgets.values()) == [small_budget, small_budget, big_budget], budgets
    large_tokens = 200
    assert small_budget < cost_of(profile, large_tokens) <= big_budget
    assert large_tokens <= profile["context_length"]

    samples, stop = [], threading.Event()

    def sample():
        while not stop.is_set():
            for d in a.get("/v1/admission").json()["devices"]:
                samples.append((d["name"], d["reserved_bytes"], d["budget_bytes"]))

    def call(i):
        g = (a, b)[i % 2]
        if i % 4 == 0:
            body = {"prompt": "xxxx", "max_tokens": large_tokens - 4, "ignore_eos": True}
        else:
            body = {"prompt": f"Story {i}:", "max_tokens": 8}
        r = g.post("/v1/completions", body, timeout=120)
        return i % 4 == 0, r.status_code, r.headers, r.text

    with cf.ThreadPoolExecutor(25) as pool:
        sampler = pool.submit(sample)
        results = list(pool.map(call, range(24)))
        stop.set()
        sampler.result()
    for large, status, headers, text in results:
        assert status in (200, 503), text
        if status == 503:
            assert json.loads(text)["error"]["type"] == "overloaded", text
            assert int(headers["Retry-After"]) >= 1
        if large:
            assert status == 200, text  # 30 s of --queue-timeout is ample: only the big engine runs them
    assert samples
    for name, reserved, budget in samples:
        assert reserved <= budget, (name, reserved, budget)
    adm = a.get("/v1/admission").json()
    # No engine was given a request it can never hold (it would have been 413).
    assert adm["rejected_never_fits"] == 0, adm
    ok = sum(1 for _, s, _, _ in results if s == 200)

    def completed():
        return {d["name"]: (d["completed"], d["budget_bytes"]) for d in a.get("/v1/admission").json()["devices"]}

    # Registrations are refreshed every heartbeat: wait for the last one.
    wait_until(lambda: sum(c for c, _ in completed().values()) == ok, timeout=10, what="the counts registered")
    done = completed()
    assert all(c > 0 for c, _ in done.values()), done  # every engine pulled work
    big_done = [c for c, budget in done.values() if budget == big_budget]
    assert big_done and big_done[0] >= 6, done  # the six large requests ran there


def test_an_engine_killed_mid_stream_is_resumed_by_another(redis, cluster):
    args = ("--test-step-delay-ms", "20", "--claim-idle", "1")
    engines = [cluster.engine(redis.url, "virt:0=64MiB", *args) for _ in range(2)]
    g = cluster.gateway(redis.url)
    wait_registered(g, engines)
    prompts = ["Once upon a time", "The quick brown fox"]
    reference = [g.post("/v1/completions", greedy(p, 48)).json()["choices"][0]["text"] for p in prompts]
    wait_idle(g)

    streams = [g.post("/v1/completions", greedy(p, 48, stream=True), stream=True, timeout=120) for p in prompts]
    for s in streams:
        assert s.status_code == 200, s.text
    events = [sse_events(s) for s in streams]
    first = json.loads(next(events[0]))["choices"][0]["text"]
    wait_until(lambda: running_engine(g, engines) is not None, timeout=20, what="an engine running the streams")
    victim = running_engine(g, engines)
    t0 = time.monotonic()
    victim.kill()
    texts = [(first if i == 0 else "") + events_text(ev)[0] for i, ev in enumerate(events)]
    took = time.monotonic() - t0
    assert texts == reference, (texts, reference)
    survivor = next(e for e in engines if e is not victim)
    wait_until(lambda: "claimed request" in survivor.logs(), timeout=10, what="the claim logged")
    assert took < 30, took
    # The survivor serves new work too.
    assert g.post("/v1/completions", greedy(prompts[0], 8)).status_code == 200
    # The counters keep what the dead engine counted: the two references, the two resumed streams and
    # the last request, wherever each ran.
    wait_until(lambda: g.get("/v1/admission").json()["completed"] >= 5, timeout=10,
               what="5 completed, the dead engine's included")


def test_a_stalled_engine_is_fenced_out_and_each_stream_is_one_answer(redis, cluster):
    args = ("--test-step-delay-ms", "20", "--claim-idle", "1")
    engines = [cluster.engine(redis.url, "virt:0=64MiB", *args) for _ in range(2)]
    g = cluster.gateway(redis.url)
    wait_registered(g, engines)
    prompt = "A stalled engine"
    reference = g.post("/v1/completions", greedy(prompt, 60)).json()["choices"][0]["text"]
    wait_idle(g)
    s = g.post("/v1/completions", greedy(prompt, 60, stream=True), stream=True, timeout=120)
    assert s.status_code == 200
    events = sse_events(s)
    text = json.loads(next(events))["choices"][0]["text"]
    wait_until(lambda: running_engine(g, engines) is not None, timeout=20, what="an engine running the stream")
    stalled = running_engine(g, engines)
    stalled.pause()
    other = next(e for e in engines if e is not stalled)
    try:
        wait_until(lambda: "claimed request" in other.logs(), timeout=20, what="the other engine claiming the stream")
    finally:
        stalled.resume()  # wakes up with the stream still in its batch: its output must not reach the client
    text += events_text(events)[0]
    assert text == reference, (text, reference)
    wait_until(lambda: "another engine took it over" in stalled.logs() or
               "taken over by another engine" in stalled.logs(), timeout=20,
               what="the stalled engine noticing it was fenced out")


def test_a_killed_gateway_s_requests_stop(redis, cluster):
    e = cluster.engine(redis.url, "virt:0=64MiB", "--test-step-delay-ms", "40")
    a = cluster.gateway(redis.url)
    b = cluster.gateway(redis.url)
    wait_registered(b, [e])
    s = a.post("/v1/completions", greedy("long", 240, stream=True), stream=True, timeout=120)
    assert s.status_code == 200
    events = sse_events(s)  # kept: the stream stays open until the gateway dies
    next(events)
    wait_until(lambda: any(x["running"] > 0 for x in b.engines()), timeout=20, what="the request running")
    t0 = time.monotonic()
    a.kill()
    wait_until(lambda: all(x["running"] == 0 for x in b.engines()), timeout=10,
               what="the killed gateway's request stopping")
    assert time.monotonic() - t0 < 10
    wait_until(lambda: "its gateway is gone" in e.logs(), timeout=10, what="the stop logged")


def test_redis_killed_and_restarted_loses_no_accepted_request(cluster):
    redis = RedisServer(appendfsync="always")
    try:
        args = ("--test-step-delay-ms", "20", "--claim-idle", "1")
        engines = [cluster.engine(redis.url, "virt:0=64MiB", *args) for _ in range(2)]
        g = cluster.gateway(redis.url)
        wait_registered(g, engines)
        prompts = [f"Request {i} says" for i in range(4)]
        reference = [g.post("/v1/completions", greedy(p, 40)).json()["choices"][0]["text"] for p in prompts]
        two = dict(greedy("Two choices", 40), n=2)
        reference_two = [c["text"] for c in g.post("/v1/completions", two).json()["choices"]]
        wait_idle(g)

        def one(p):
            r = g.post("/v1/completions", greedy(p, 40, stream=True), stream=True, timeout=120)
            assert r.status_code == 200, r.text
            return stream_text(r)[0]

        def choices():
            r = g.post("/v1/completions", two, timeout=120)
            assert r.status_code == 200, r.text
            return [c["text"] for c in r.json()["choices"]]

        with cf.ThreadPoolExecutor(5) as pool:
            futures = [pool.submit(one, p) for p in prompts]
            n2 = pool.submit(choices)
            wait_until(lambda: sum(x["running"] for x in g.engines()) >= 2, timeout=20, what="streams running")
            redis.kill()
            t0 = time.monotonic()
            r = g.post("/v1/completions", greedy("during the outage", 4), timeout=10)
            assert r.status_code == 503, r.text
            assert r.json()["error"]["type"] == "overloaded"
            assert int(r.headers["Retry-After"]) >= 1
            assert time.monotonic() - t0 < 1.5
            redis.start()
            texts = [f.result(timeout=120) for f in futures]
            assert n2.result(timeout=120) == reference_two
        assert texts == reference, (texts, reference)
        # The engines held on to their requests through the restart: none was
        # claimed by another (which would have counted as a crash).
        for e in engines:
            assert "claimed request" not in e.logs(), e.logs()[-3000:]
    finally:
        redis.stop()


def test_a_poison_request_is_dead_lettered_and_others_complete(redis, cluster):
    args = ("--test-crash-on-prompt", "POISON", "--claim-idle", "1", "--max-crash-retries", "2",
            "--test-step-delay-ms", "5")
    engines = [cluster.engine(redis.url, "virt:0=64MiB", *args) for _ in range(3)]
    g = cluster.gateway(redis.url)
    wait_registered(g, engines)
    r = g.post("/v1/completions", {"prompt": "POISON pill", "max_tokens": 4}, timeout=120)
    assert r.status_code == 500, r.text
    err = r.json()["error"]
    assert err["type"] == "engine_crashed", err
    crashed = [e for e in engines if e.proc.poll() is not None]
    assert len(crashed) == 2, [e.proc.poll() for e in engines]
    survivor = next(e for e in engines if e.proc.poll() is None)
    wait_until(lambda: "dead-lettered" in survivor.logs(), timeout=10, what="the dead letter logged")
    assert g.post("/v1/completions", {"prompt": "healthy", "max_tokens": 4}).status_code == 200


def test_a_malformed_entry_is_dead_lettered_and_the_engine_goes_on(redis, cluster):
    e = cluster.engine(redis.url, "virt:0=64MiB")
    g = cluster.gateway(redis.url)
    wait_registered(g, [e])
    model = g.get("/v1/models").json()["data"][0]["id"]
    stream = "vg:q:{" + model + "}:c10"
    assert resp_command(redis.port, "XGROUP", "CREATE", stream, "engines", "0", "MKSTREAM") in ("+OK",)
    assert resp_command(redis.port, "XADD", stream, "*", "cost", "1000", "req", "not a request").startswith("$")
    assert resp_command(redis.port, "RPUSH", "vg:q:{" + model + "}:bell", "1").startswith(":")
    wait_until(lambda: "dead-lettering entry" in e.logs(), timeout=20, what="the entry dead-lettered")
    assert resp_command(redis.port, "XLEN", "vg:q:{" + model + "}:dead") == ":1"
    assert resp_command(redis.port, "XLEN", stream) == ":0"
    assert g.post("/v1/completions", {"prompt": "still serving", "max_tokens": 4}).status_code == 200
    assert e.proc.poll() is None


def test_an_engine_with_a_wrong_password_fails_start_up_clearly(redis, tmp_path):
    reply = resp_command(redis.port, "ACL", "SETUSER", "engine", "on", ">right", "~*", "+@all")
    assert reply == "+OK", reply
    secret = tmp_path / "pw"
    secret.write_text("pw-9f3e-not-it\n")
    folder = tmp_path / "run"
    folder.mkdir(mode=0o700)
    p = subprocess.run([BIN, "engine", "--model-dir", MODEL_DIR, "--device", "virt:0=64MiB", "--threads", "1",
                        "--listen", "unix:" + str(folder / "e.sock"), "--queue", f"redis://engine@127.0.0.1:{redis.port}",
                        "--queue-password-file", str(secret)], capture_output=True, text=True, timeout=120)
    out = p.stdout + p.stderr
    assert p.returncode == 2, out
    assert "start-up failed: --queue" in out and "refused the credentials of user 'engine'" in out, out
    assert "pw-9f3e-not-it" not in out
    assert "loaded on" not in out, out  # refused before the weights load


def test_a_request_no_engine_takes_in_time_is_503_with_retry_after(redis, cluster):
    # One engine, one sequence at a time: it runs one stream (and takes
    # nothing more meanwhile); the next waits in Redis past --queue-timeout.
    e = cluster.engine(redis.url, "virt:0=64MiB", "--max-batch", "1", "--test-step-delay-ms", "50")
    g = cluster.gateway(redis.url, "--queue-timeout", "1")
    wait_registered(g, [e])
    streams = [g.post("/v1/completions", greedy("hold", 100, stream=True), stream=True, timeout=120)]
    for s in streams:
        assert s.status_code == 200
    wait_until(lambda: any(x["running"] > 0 for x in g.engines()), timeout=20, what="the first stream running")
    r = g.post("/v1/completions", greedy("late", 4), timeout=30)
    assert r.status_code == 503, r.text
    err = r.json()["error"]
    assert err["type"] == "overloaded" and "--queue-timeout" in err["message"], err
    assert 1 <= int(r.headers["Retry-After"]) < 60
    for s in streams:
        s.close()


def test_an_idempotency_key_sent_to_another_gateway_attaches_replays_and_conflicts(redis, cluster):
    e = cluster.engine(redis.url, "virt:0=64MiB", "--test-step-delay-ms", "20")
    a = cluster.gateway(redis.url)
    b = cluster.gateway(redis.url)
    wait_registered(a, [e])
    wait_registered(b, [e])
    body = greedy("Idempotent across gateways", 100, stream=True)
    reference = sse_text(a.post("/v1/completions", body, stream=True))
    wait_idle(a)

    def completed():
        return sum(d["completed"] for d in a.get("/v1/admission").json()["devices"])

    before = completed()
    key = {"Idempotency-Key": "retry-me-1"}
    first = a.post("/v1/completions", body, stream=True, headers=key, timeout=120)
    assert first.status_code == 200, first.text
    events = sse_events(first)
    head = json.loads(next(events))["choices"][0]["text"]
    # The client's retry lands on the other gateway while the first runs: the same stream, in full.
    retry = b.post("/v1/completions", body, stream=True, headers=key, timeout=120)
    assert retry.status_code == 200, retry.text
    # And another on the first gateway (which attaches to its own request).
    retry_a = a.post("/v1/completions", body, stream=True, headers=key, timeout=120)
    assert retry_a.status_code == 200, retry_a.text
    assert sse_text(retry) == reference
    assert sse_text(retry_a) == reference
    assert head + events_text(events)[0] == reference
    wait_until(lambda: "follows request" in b.logs(), timeout=10, what="b's follow log line")
    wait_until(lambda: '"idempotency":"attached"' in b.logs(), timeout=10, what="b's request log line")
    # One computation for the three clients (and the replay below).
    wait_until(lambda: completed() == before + 1, timeout=10, what="the completion registered")
    wait_idle(a)
    # After it completed: replayed by a gateway that never saw the key (a and b hold it themselves
    # too), without running again.
    c = cluster.gateway(redis.url)
    wait_registered(c, [e])
    again = c.post("/v1/completions", body, stream=True, headers=key, timeout=60)
    assert again.status_code == 200, again.text
    assert sse_text(again) == reference
    wait_until(lambda: "replays request" in c.logs(), timeout=10, what="c's replay log line")
    wait_until(lambda: '"idempotency":"replayed"' in c.logs(), timeout=10, what="c's request log line")
    # The same key with another body: refused.
    other = c.post("/v1/completions", greedy("Another body", 8), headers=key)
    assert other.status_code == 422, other.text
    assert other.json()["error"]["type"] == "idempotency_key_reused"
    assert completed() == before + 1

    # The first client leaves while a retry on the other gateway follows: it runs on for the retry.
    key2 = {"Idempotency-Key": "retry-me-2"}
    body2 = greedy("A client that leaves", 120, stream=True)
    reference2 = sse_text(b.post("/v1/completions", body2, stream=True))
    leaver = a.post("/v1/completions", body2, stream=True, headers=key2, timeout=120)
    assert leaver.status_code == 200
    next(sse_events(leaver))
    follower = b.post("/v1/completions", body2, stream=True, headers=key2, timeout=120)
    assert follower.status_code == 200
    follower_events = sse_events(follower)
    text = json.loads(next(follower_events))["choices"][0]["text"]
    leaver.close()
    assert text + events_text(follower_events)[0] == reference2


def test_an_idempotency_key_of_a_request_redis_lost_is_run_anew_elsewhere_not_replayed_in_part(cluster):
    redis = RedisServer()  # no persistence: a restart loses everything
    try:
        e = cluster.engine(redis.url, "virt:0=64MiB", "--test-step-delay-ms", "20")
        a = cluster.gateway(redis.url)
        b = cluster.gateway(redis.url)
        wait_registered(a, [e])
        wait_registered(b, [e])
        body = greedy("Lost and added again", 120)
        key = {"Idempotency-Key": "lost-1"}
        with cf.ThreadPoolExecutor(1) as pool:
            first = pool.submit(a.post, "/v1/completions", body, headers=key, timeout=120)
            wait_until(lambda: any(x["running"] > 0 for x in a.engines()), timeout=20, what="the request running")
            redis.kill()
            redis.start()
            answer = first.result()
        assert answer.status_code == 200, answer.text
        text = answer.json()["choices"][0]["text"]
        assert "added again" in a.logs()
        # The other gateway runs it anew (greedy: the same text), never a replay of the events
        # written after the re-add only.
        retry = b.post("/v1/completions", body, headers=key, timeout=120)
        assert retry.status_code == 200, retry.text
        assert retry.json()["choices"][0]["text"] == text
        assert "replays request" not in b.logs()
    finally:
        redis.stop()


def test_an_engine_at_its_max_batch_leaves_the_next_entry_to_another(redis, cluster):
    args = ("--test-step-delay-ms", "50", "--max-batch", "1")  # 240 tokens: 12 s each, to start an engine in
    first = cluster.engine(redis.url, "virt:0=64MiB", *args)
    g = cluster.gateway(redis.url)
    wait_registered(g, [first])

    def call(i):
        # A stream's headers wait for its first event, so the two are sent side by side.
        s = g.post("/v1/completions", greedy(f"Batch of one {i}", 240, stream=True), stream=True, timeout=120)
        assert s.status_code == 200, s.text
        return sse_text(s)

    with cf.ThreadPoolExecutor(2) as pool:
        calls = [pool.submit(call, i) for i in range(2)]
        wait_until(lambda: sum(x["running"] for x in g.engines()) == 1 and g.get("/v1/admission").json()["queued"] == 1,
                   timeout=20, what="one request running, one waiting in the shared queue")
        # The busy engine did not take the second one to queue it behind its only slot: an engine
        # that starts now finds it in the shared queue.
        second = cluster.engine(redis.url, "virt:0=64MiB", *args)
        wait_registered(g, [first, second])
        wait_until(lambda: sorted(x["running"] for x in g.engines()) == [1, 1], timeout=20,
                   what="both engines running one request each")
        for c in calls:
            c.result()
    # An engine that stops cleanly leaves the registry at once (not a stale entry for a minute).
    second.stop()
    wait_until(lambda: second.pid not in {x["pid"] for x in g.engines()}, timeout=10,
               what="the stopped engine gone from /v1/engines")


def test_a_chat_without_max_tokens_runs_to_the_end_of_the_context_through_the_queue(redis, cluster):
    """The gateway queues it with the context's cost bound; the engine that
    takes it fits max_tokens to what the prompt leaves."""
    e = cluster.engine(redis.url)
    g = cluster.gateway(redis.url)
    wait_registered(g, [e])
    messages = [{"role": "developer", "content": "Be terse."}, {"role": "user", "content": "Hi"}]
    r = g.post("/v1/chat/completions", {"messages": messages, "temperature": 0, "ignore_eos": True}, timeout=120)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["total_tokens"] == 256, r.json()  # tinylm's context length
    assert r.json()["choices"][0]["finish_reason"] == "length"
