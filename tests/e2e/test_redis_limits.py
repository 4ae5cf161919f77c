"""Redis mode end to end (docs/redis.md "Redis mode"): two gateways on one Redis of
the test's own share one rate limit; a stalled Redis (SIGSTOP) gets 503 with
Retry-After at once and /ready 503 naming Redis, and SIGCONT brings requests
back without a restart; an ACL user's password comes from a file or the
environment, and a wrong one fails start-up with a clear message. Redis is
started here on a free loopback port with a temporary folder; nothing waits
on sleeps (conditions are polled with deadlines)."""
import concurrent.futures
import os
import signal
import subprocess
import sys
import time

import pytest
import requests

from conftest import BIN, MODE_ARGS, MODEL_DIR, wait_until
from redis_util import RedisServer, resp_command

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
from server_process import ServerProcess  # noqa: E402


@pytest.fixture
def redis():
    r = RedisServer()
    yield r
    r.stop()


def serve_argv(*args):
    return [BIN, "serve", "--model-dir", MODEL_DIR, "--port", "0", "--threads", "1", *MODE_ARGS, *args]


class Gateway(ServerProcess):
    def __init__(self, *args, env=None):
        super().__init__(serve_argv(*args), env=env)

    def post(self, path, body, timeout=60):
        return requests.post(self.url + path, json=body, timeout=timeout)

    def get(self, path, timeout=10):
        return requests.get(self.url + path, timeout=timeout)

    def logs(self):
        return "".join(self.log)


@pytest.fixture
def gateways():
    started = []

    def make(*args, env=None):
        g = Gateway(*args, env=env)
        started.append(g)
        return g

    yield make
    for g in started:
        g.stop()


SMALL = {"prompt": "Hi", "max_tokens": 1}


def test_two_gateways_share_one_bucket(redis, gateways):
    rate, burst = 1.0, 4
    flags = ["--queue", redis.url, "--rate-limit", str(rate), "--rate-burst", str(burst)]
    a = gateways(*flags)
    b = gateways(*flags)
    statuses = []
    t0 = time.monotonic()
    for i in range(16):
        r = (a if i % 2 == 0 else b).post("/v1/completions", SMALL)
        statuses.append(r.status_code)
        if r.status_code == 429:
            assert r.json()["error"]["type"] == "rate_limited", r.text
            assert int(r.headers["Retry-After"]) >= 1
        else:
            assert r.status_code == 200, r.text
    elapsed = time.monotonic() - t0
    ok = statuses.count(200)
    # One bucket for both: its burst plus what refilled while the requests
    # ran (the first take finds it full), never a bucket per gateway.
    assert ok >= burst, statuses
    assert ok <= int(burst + rate * elapsed), (statuses, elapsed)
    assert statuses.count(429) == 16 - ok
    # Each gateway took from it, and each refused some (one bucket).
    assert 200 in statuses[0::2] and 200 in statuses[1::2], statuses
    if rate * elapsed < burst:  # short enough that two buckets would have let 2 x burst through
        assert ok < 2 * burst, statuses


def test_a_shared_limit_holds_its_rate_over_ten_seconds(redis, gateways):
    """Clients of one address push both gateways far past the limit for 10 s:
    together they get the rate (plus the burst), within 10 %, not twice it."""
    rate, burst = 10.0, 1
    flags = ["--queue", redis.url, "--rate-limit", str(rate), "--rate-burst", str(burst)]
    a = gateways(*flags)
    b = gateways(*flags)
    seconds = 10.0
    t0 = time.monotonic()
    stop_at = t0 + seconds

    def client(g):
        passed, session = 0, requests.Session()
        while time.monotonic() < stop_at:
            r = session.post(g.url + "/v1/completions", json=SMALL, timeout=10)
            assert r.status_code in (200, 429), r.text
            passed += r.status_code == 200
        return passed

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        counts = list(pool.map(client, [a, b, a, b]))
    elapsed = time.monotonic() - t0
    total = sum(counts)
    expected = rate * elapsed + burst
    assert abs(total - expected) <= 0.1 * rate * seconds, (counts, total, expected, elapsed)
    assert counts[0] + counts[2] > 0 and counts[1] + counts[3] > 0, counts  # both gateways took from it


def test_a_stalled_redis_is_503_at_once_and_requests_pass_again(redis, gateways):
    flags = ["--queue", redis.url, "--rate-limit", "1000", "--rate-burst", "1000", "--queue-command-timeout", "0.25"]
    a = gateways(*flags)
    b = gateways(*flags)
    assert a.post("/v1/completions", SMALL).status_code == 200
    redis.pause()
    try:
        for g in (a, b, a, b):
            t0 = time.monotonic()
            r = g.post("/v1/completions", SMALL, timeout=10)
            took = time.monotonic() - t0
            assert r.status_code == 503, r.text
            assert r.json()["error"]["type"] == "overloaded", r.text
            assert "Redis at redis://127.0.0.1:" in r.json()["error"]["message"], r.text
            assert int(r.headers["Retry-After"]) >= 1
            assert took < 1.5, f"a refusal took {took:.2f} s (deadline 0.25 s)"
        for g in (a, b):
            wait_until(lambda: g.get("/ready").status_code == 503, timeout=10, what="/ready 503")
            body = g.get("/ready").json()
            assert "Redis at redis://127.0.0.1:" in body["reason"], body
            # /health is about the process, not Redis.
            assert g.get("/health").status_code == 200
    finally:
        redis.resume()
    for g in (a, b):
        wait_until(lambda: g.post("/v1/completions", SMALL, timeout=10).status_code == 200, timeout=20,
                   what="requests passing again after SIGCONT")
        wait_until(lambda: g.get("/ready").status_code == 200, timeout=10, what="/ready 200 again")
    # The outage and the recovery are logged once each.
    assert "is unreachable" in a.logs(), a.logs()
    wait_until(lambda: "answers again" in a.logs(), timeout=10, what="the recovery logged")


def test_a_redis_that_dies_is_503_at_once_and_a_restarted_one_is_used_again(redis, gateways):
    a = gateways("--queue", redis.url, "--rate-limit", "1000", "--rate-burst", "1000")
    assert a.post("/v1/completions", SMALL).status_code == 200
    redis.kill()
    wait_until(lambda: a.get("/ready").status_code == 503, timeout=10, what="/ready 503")
    assert "Redis at redis://127.0.0.1:" in a.get("/ready").json()["reason"]
    t0 = time.monotonic()
    r = a.post("/v1/completions", SMALL, timeout=10)
    assert r.status_code == 503 and r.json()["error"]["type"] == "overloaded", r.text
    assert int(r.headers["Retry-After"]) >= 1
    assert time.monotonic() - t0 < 1.0  # refused connections fail without waiting for the deadline
    redis.start()  # an empty Redis (no scripts loaded): the bucket script is loaded again
    wait_until(lambda: a.post("/v1/completions", SMALL, timeout=10).status_code == 200, timeout=20,
               what="requests passing again after the restart")
    wait_until(lambda: a.get("/ready").status_code == 200, timeout=10, what="/ready 200 again")


def add_acl_user(redis, user, password):
    reply = resp_command(redis.port, "ACL", "SETUSER", user, "on", ">" + password, "~*", "+@all")
    assert reply == "+OK", reply


def test_an_acl_user_with_a_password_file_or_variable(redis, gateways, tmp_path):
    password = "pw-7a3f-from-a-file"
    add_acl_user(redis, "gateway", password)
    secret = tmp_path / "redis-password"
    secret.write_text(password + "\n")
    url = f"redis://gateway@127.0.0.1:{redis.port}"
    a = gateways("--queue", url, "--queue-password-file", str(secret), "--rate-limit", "100")
    assert a.post("/v1/completions", SMALL).status_code == 200
    assert password not in a.logs()
    env = dict(os.environ, VRAMGATE_QUEUE_PASSWORD=password)
    b = gateways("--queue", url, "--rate-limit", "100", env=env)
    assert b.post("/v1/completions", SMALL).status_code == 200
    assert password not in b.logs()


def run_serve(tmp_path, *args, timeout=60):
    """Runs `vramgate serve ARGS` expected to fail at start-up: (exit status,
    its output). Its own runtime folder and process group, so that a server
    that does start after all leaves no engine behind."""
    argv = serve_argv(*args)
    if "--in-process" not in argv:
        argv += ["--runtime-dir", str(tmp_path / "run")]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, process_group=0)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail("vramgate serve did not exit:\n" + out[-3000:])
    return proc.returncode, out


def test_a_wrong_password_fails_start_up_clearly(redis, tmp_path):
    add_acl_user(redis, "gateway", "the-right-one")
    secret = tmp_path / "redis-password"
    secret.write_text("not-the-right-one\n")
    t0 = time.monotonic()
    url = f"redis://gateway@127.0.0.1:{redis.port}"
    status, out = run_serve(tmp_path, "--queue", url, "--queue-password-file", str(secret), "--rate-limit", "10")
    assert status == 2, out
    assert "start-up failed: --queue" in out and "refused the credentials of user 'gateway'" in out, out
    assert "not-the-right-one" not in out
    assert time.monotonic() - t0 < 30
    # No password at all for a user that needs one: the same.
    status, out = run_serve(tmp_path, "--queue", url, "--rate-limit", "10")
    assert status == 2, out
    assert "start-up failed: --queue" in out and "'gateway' has no password" in out, out


def test_a_malformed_queue_url_is_a_config_error(tmp_path):
    status, out = run_serve(tmp_path, "--queue", "rediss://127.0.0.1:6379", "--rate-limit", "10")
    assert status == 2, out
    assert "--queue" in out and "TLS" in out, out
