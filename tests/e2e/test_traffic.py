"""Traffic policies end to end (docs/admission-and-memory.md "Traffic policies"): API keys (401),
rate limits (429 that never touch the queue), priorities (a high request
overtakes queued low ones) and Idempotency-Key retries (the work runs once).
Order and counts come from the server's own state, never from timing."""
import concurrent.futures
import json
import re
import socket
import subprocess

import requests

from conftest import BIN, MODEL_DIR, sse_events, wait_until

KEYS = """# tenants of the test server
sk-calm-0001 priority=high
sk-flood-0002 rate=0.01 burst=2   # one token per 100 s after the burst
sk-low-0003 priority=low
"""


def write_keys(tmp_path):
    path = tmp_path / "keys.txt"
    path.write_text(KEYS)
    return str(path)


def auth(key):
    return {"Authorization": f"Bearer {key}"}


def metric(server, name, **labels):
    """The value of one sample of /metrics (0 when absent)."""
    text = server.get("/metrics", headers=auth("sk-calm-0001")).text
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    pattern = re.escape(name) + (r"\{" + re.escape(want) + r"\}" if want else "") + r" (\S+)"
    m = re.search("^" + pattern + "$", text, re.M)
    return float(m.group(1)) if m else 0.0


def request_log(server):
    """The request log lines written so far, as dicts, in order."""
    out = []
    for line in server.logs().splitlines():
        i = line.find(" request {")
        if i >= 0:
            out.append(json.loads(line[i + len(" request "):]))
    return out


def logged(server, count, status=None):
    """The request log lines (of `status`, if given), once `count` of them are there."""
    pick = lambda: [l for l in request_log(server) if status is None or l["status"] == status]
    wait_until(lambda: len(pick()) >= count, what=f"{count} request log lines")
    return pick()


def small(**kw):
    return dict({"prompt": "Hello", "max_tokens": 2}, **kw)


def test_api_keys(make_server, tmp_path):
    server = make_server("--api-keys", write_keys(tmp_path), "--metrics-auth")
    for headers in ({}, auth("sk-wrong"), {"Authorization": "sk-calm-0001"}, {"Authorization": "Basic x"}):
        r = server.post("/v1/completions", small(), headers=headers)
        assert r.status_code == 401, r.text
        assert r.json()["error"]["type"] == "unauthorized"
        assert r.headers["WWW-Authenticate"] == "Bearer"
    assert server.get("/v1/models").status_code == 401
    assert server.get("/metrics").status_code == 401  # --metrics-auth
    assert server.get("/health").status_code == 200
    assert server.get("/ready").status_code == 200
    r = server.post("/v1/completions", small(), headers=auth("sk-calm-0001"))
    assert r.status_code == 200, r.text
    assert server.get("/v1/models", headers=auth("sk-low-0003")).status_code == 200
    assert metric(server, "vramgate_unauthorized_total") == 6
    # A key's priority is its requests' default and cap.
    assert server.post("/v1/completions", small(priority="high"), headers=auth("sk-low-0003")).status_code == 200
    lines = logged(server, 2, status=200)
    assert [l["priority"] for l in lines] == ["high", "low"]
    assert all(re.fullmatch(r"[0-9a-f]{8}", l["key_id"]) for l in lines)
    assert lines[0]["key_id"] != lines[1]["key_id"]
    # Keys never appear in the logs.
    server.stop()
    assert "sk-calm-0001" not in server.logs() and "sk-low-0003" not in server.logs()


def test_flooding_key_is_limited_other_keys_are_served(make_server, tmp_path):
    server = make_server("--api-keys", write_keys(tmp_path))
    statuses = []
    for _ in range(6):
        r = server.post("/v1/completions", small(), headers=auth("sk-flood-0002"))
        statuses.append(r.status_code)
        if r.status_code == 429:
            assert r.json()["error"]["type"] == "rate_limited"
            assert 1 <= int(r.headers["Retry-After"]) <= 100
        calm = server.post("/v1/completions", small(), headers=auth("sk-calm-0001"))
        assert calm.status_code == 200, calm.text
    assert statuses == [200, 200, 429, 429, 429, 429]
    # Refusals never reached the queue: 2 + 6 admitted.
    assert server.get("/v1/admission", headers=auth("sk-calm-0001")).json()["admitted"] == 8
    assert metric(server, "vramgate_rate_limited_total") == 4
    refused = logged(server, 4, status=429)
    assert len(refused) == 4 and all(l["reason"] == "rate_limited" for l in refused)


def test_rate_limit_per_address_without_keys(make_server):
    server = make_server("--rate-limit", "0.01", "--rate-burst", "1")
    assert server.post("/v1/completions", small()).status_code == 200
    r = server.post("/infer", small())
    assert r.status_code == 429, r.text
    assert int(r.headers["Retry-After"]) >= 99
    # Every POST work route is metered: chat too.
    chat = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 2}
    r = server.post("/v1/chat/completions", chat)
    assert r.status_code == 429, r.text
    # GET routes are not metered.
    assert server.get("/v1/admission").status_code == 200
    assert server.admission()["admitted"] == 1


def test_rate_limit_per_forwarded_client_behind_a_trusted_proxy(make_server):
    def xff(address):
        return {"X-Forwarded-For": address}

    server = make_server("--rate-limit", "0.01", "--rate-burst", "1", "--trusted-proxy", "127.0.0.0/8")
    assert server.post("/v1/completions", small(), headers=xff("10.0.0.1")).status_code == 200
    assert server.post("/v1/completions", small(), headers=xff("10.0.0.2")).status_code == 200
    assert server.post("/v1/completions", small(), headers=xff("10.0.0.1")).status_code == 429
    # Entries a client puts to the left of the one the proxy appended are not its identity.
    assert server.post("/v1/completions", small(), headers=xff("10.0.0.9, 10.0.0.2")).status_code == 429
    # Without --trusted-proxy the header is ignored: one address, one bucket.
    plain = make_server("--rate-limit", "0.01", "--rate-burst", "1")
    assert plain.post("/v1/completions", small(), headers=xff("10.0.0.1")).status_code == 200
    assert plain.post("/v1/completions", small(), headers=xff("10.0.0.2")).status_code == 429


def test_high_priority_overtakes_queued_low_ones(make_server):
    server = make_server("--max-batch", "1", "--test-step-delay-ms", "20")
    blocker = dict(prompt="x", max_tokens=200, ignore_eos=True)  # 4 s of steps: time to queue the others
    queued_low = [dict(prompt=f"low {i}", max_tokens=3, ignore_eos=True, priority="low") for i in range(3)]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        first = pool.submit(server.post, "/v1/completions", blocker)
        wait_until(lambda: server.admission()["running"] == 1, what="the blocker running")
        lows = []
        for i, body in enumerate(queued_low):
            lows.append(pool.submit(server.post, "/v1/completions", body))
            wait_until(lambda: server.admission()["queue_depth"] == i + 1, what=f"{i + 1} queued")
        high = server.post("/v1/completions", dict(prompt="high", max_tokens=3, ignore_eos=True),
                           headers={"X-Priority": "high"})
        assert high.status_code == 200, high.text
        assert high.headers["X-Queue-Position"] == "1"  # entered ahead of the three low ones
        results = [f.result() for f in lows]
        assert first.result().status_code == 200
    assert [r.status_code for r in results] == [200, 200, 200]
    assert [r.headers["X-Queue-Position"] for r in results] == ["1", "2", "3"]
    # With one sequence at a time, the log's order is the order of admission.
    order = [l["priority"] for l in logged(server, 5)]
    assert order == ["normal", "high", "low", "low", "low"], order
    # A bad class is refused up front.
    assert server.post("/v1/completions", small(), headers={"X-Priority": "urgent"}).status_code == 400
    assert server.post("/v1/completions", small(priority=3)).status_code == 400


def test_retries_with_one_idempotency_key_compute_once(make_server):
    server = make_server("--test-step-delay-ms", "20")
    body = dict(prompt="Once upon a time", max_tokens=150, ignore_eos=True, temperature=1.0)
    key = {"Idempotency-Key": "order-42"}
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        original = pool.submit(server.post, "/v1/completions", body, headers=key)
        wait_until(lambda: server.admission()["running"] == 1, what="the original running")
        retries = [pool.submit(server.post, "/v1/completions", body, headers=key) for _ in range(3)]
        texts = [f.result().json()["choices"][0]["text"] for f in [original] + retries]
    assert len(set(texts)) == 1 and len(texts[0]) > 0
    a = server.admission()
    assert a["admitted"] == 1 and a["completed"] == 1, a
    # Retries that arrive while it runs attach (a very slow machine may see
    # one arrive after the end: it is replayed instead; either way no new work).
    attached = metric(server, "vramgate_idempotent_replays_total", kind="attached")
    replayed = metric(server, "vramgate_idempotent_replays_total", kind="replayed")
    assert attached + replayed == 3 and attached >= 1
    # After the end, the result is replayed; the work still ran once.
    again = server.post("/v1/completions", body, headers=key)
    assert again.json()["choices"][0]["text"] == texts[0]
    assert metric(server, "vramgate_idempotent_replays_total", kind="replayed") == replayed + 1
    assert server.admission()["admitted"] == 1
    # The same key with another body is refused.
    r = server.post("/v1/completions", dict(body, max_tokens=5), headers=key)
    assert r.status_code == 422, r.text
    assert r.json()["error"]["type"] == "idempotency_key_reused"
    kinds = [l.get("idempotency") for l in logged(server, 5, status=200)]
    assert sorted(kinds) == ["attached"] * int(attached) + ["new"] + ["replayed"] * int(replayed + 1)


def test_streaming_retry_gets_the_same_token_stream(make_server):
    server = make_server("--test-step-delay-ms", "20")
    body = dict(prompt="The sea", max_tokens=30, ignore_eos=True, temperature=1.0, stream=True)
    key = {"Idempotency-Key": "stream-7"}

    def stream_text():
        with requests.post(server.url + "/v1/completions", json=body, headers=key, stream=True, timeout=120) as r:
            assert r.status_code == 200
            chunks = [json.loads(e) for e in sse_events(r) if e != "[DONE]"]
        return "".join(c["choices"][0]["text"] for c in chunks), {c["id"] for c in chunks}

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        first = pool.submit(stream_text)
        # Attach once some tokens were already sent: they are replayed, then followed.
        wait_until(lambda: metric(server, "vramgate_generated_tokens_total") >= 5, what="tokens")
        second = pool.submit(stream_text)
        (t1, ids1), (t2, ids2) = first.result(), second.result()
    assert t1 == t2 and len(t1) > 0
    assert ids1 == ids2 and len(ids1) == 1
    assert server.admission()["admitted"] == 1


def test_work_is_cancelled_only_when_every_client_has_gone(make_server):
    server = make_server("--test-step-delay-ms", "20")
    body = dict(prompt="x", max_tokens=200, ignore_eos=True)

    def open_with_key():
        s = socket.create_connection(("127.0.0.1", server.port), timeout=60)
        data = json.dumps(body).encode()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Idempotency-Key: cancel-1\r\n" + f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
        return s

    a = open_with_key()
    wait_until(lambda: server.admission()["running"] == 1, what="running")
    b = open_with_key()
    wait_until(lambda: metric(server, "vramgate_idempotent_replays_total", kind="attached") == 1, what="attached")
    a.close()
    # One client is still there: the work goes on.
    tokens = metric(server, "vramgate_generated_tokens_total")
    wait_until(lambda: metric(server, "vramgate_generated_tokens_total") >= tokens + 5, what="more tokens")
    assert server.admission()["cancelled"] == 0
    b.close()
    wait_until(lambda: server.admission()["cancelled"] == 1, what="cancelled")
    assert server.admission()["running"] == 0


def test_bad_key_file_stops_the_server_before_loading(tmp_path):
    path = tmp_path / "keys.txt"
    path.write_text("sk-good-1\nsk-secret-9 rate=fast\n")
    p = subprocess.run([BIN, "serve", "--model-dir", MODEL_DIR, "--port", "0", "--api-keys", str(path)],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2, p.stderr
    assert f"{path}:2: rate must be" in p.stderr
    assert "sk-secret-9" not in p.stderr
