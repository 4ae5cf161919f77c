"""Memory-aware admission end to end: scenarios S2, S3, S6-S10 of
docs/scenarios.md against the real binary on a small virtual device.
Expected counts come from the server's own costs and budget."""
import concurrent.futures
import json
import threading

import requests

from conftest import sse_events, wait_until
from scenario_util import (BUDGET_TOKENS, body_for_tokens, budget_server, check_invariants, cost_of, idle,
                           open_request, read_status)


def test_s2_impossible_request_and_boundaries(make_server):
    server = budget_server(make_server)
    # Past the budget (one token, or with a paged KV cache one block) can never fit: 413 at once, never queued.
    for stream in (False, True):
        r = server.post("/v1/completions", body_for_tokens(server.never_fits, stream=stream))
        assert r.status_code == 413, r.text
        err = r.json()["error"]
        assert err["type"] == "exceeds_device_memory"
        assert err["needed_bytes"] == cost_of(server.profile, server.never_fits)
        assert err["budget_bytes"] == server.budget
    assert server.admission()["admitted"] == 0
    # Five small ones succeed.
    for _ in range(5):
        assert server.post("/v1/completions", body_for_tokens(20)).status_code == 200
    # Exactly the budget is admitted on an empty device and succeeds.
    r = server.post("/v1/completions", body_for_tokens(BUDGET_TOKENS, temperature=0))
    assert r.status_code == 200, r.text
    wait_until(lambda: idle(server))
    check_invariants(server)


def test_s3_deadline_and_two_large_never_together(make_server):
    server = budget_server(make_server, "--test-step-delay-ms", "10")
    large = body_for_tokens(int(0.9 * BUDGET_TOKENS))
    r = server.post("/v1/completions", dict(large, timeout=1.0))
    assert r.status_code == 504, r.text
    assert r.json()["error"]["type"] == "timeout"
    second = server.post("/v1/completions", large)
    assert second.status_code == 200, second.text
    a = server.admission()
    # Two large requests never held leases together.
    assert a["devices"][0]["peak_reserved_bytes"] < 2 * cost_of(server.profile, int(0.9 * BUDGET_TOKENS))
    wait_until(lambda: idle(server))
    check_invariants(server)


def test_s6_queue_limit_and_prompt_503s(make_server):
    server = budget_server(make_server, "--test-step-delay-ms", "30", "--max-queue", "8", "--max-batch", "16")
    small = BUDGET_TOKENS // 6  # 6 fit, the 7th does not
    assert 6 * cost_of(server.profile, small) <= server.budget < 7 * cost_of(server.profile, small)
    body = body_for_tokens(small)

    def one(_):
        return requests.post(server.url + "/v1/completions", json=body, timeout=120)

    with concurrent.futures.ThreadPoolExecutor(50) as ex:
        results = list(ex.map(one, range(50)))
    codes = [r.status_code for r in results]
    assert codes.count(200) == 14, codes
    assert codes.count(503) == 36, codes
    for r in results:
        if r.status_code == 503:
            assert r.json()["error"]["type"] == "overloaded"
            assert int(r.headers["Retry-After"]) >= 1
    a = server.admission()
    assert a["rejected_queue_full"] == 36
    assert a["devices"][0]["peak_reserved_bytes"] <= 6 * cost_of(server.profile, small)
    wait_until(lambda: idle(server))
    check_invariants(server)


def test_s7_large_request_is_not_starved_by_small_ones(make_server):
    server = budget_server(make_server, "--test-step-delay-ms", "5", "--max-bypass", "1")
    small = body_for_tokens(BUDGET_TOKENS // 4)
    large = body_for_tokens(int(0.9 * BUDGET_TOKENS), prompt_len=150)
    done = threading.Event()
    small_codes = []

    def small_client():
        for _ in range(300):
            if done.is_set():
                return
            small_codes.append(requests.post(server.url + "/v1/completions", json=small, timeout=120).status_code)

    clients = [threading.Thread(target=small_client) for _ in range(3)]
    for c in clients:
        c.start()
    wait_until(lambda: server.admission()["running"] >= 2, what="small requests running")
    r = server.post("/v1/completions", large)
    done.set()
    for c in clients:
        c.join(120)
    assert r.status_code == 200, r.text
    assert all(code == 200 for code in small_codes), small_codes
    wait_until(lambda: idle(server))
    check_invariants(server)


def test_s8_streaming_queue_timeout_ends_with_sse_error(make_server):
    server = budget_server(make_server, "--test-step-delay-ms", "20", "--queue-timeout", "1")
    holder = open_request(server.port, body_for_tokens(int(0.9 * BUDGET_TOKENS)))
    wait_until(lambda: server.admission()["running"] == 1, what="large request running")
    # Impossible and invalid: identical status and body, stream or not.
    for body in (body_for_tokens(server.never_fits), {"prompt": "x", "max_tokens": -1}):
        a = server.post("/v1/completions", dict(body, stream=False))
        b = server.post("/v1/completions", dict(body, stream=True))
        assert (a.status_code, a.json()) == (b.status_code, b.json())
    with server.post("/v1/completions", body_for_tokens(int(0.9 * BUDGET_TOKENS), stream=True), stream=True) as r:
        assert r.status_code == 200
        payloads = list(sse_events(r))
    errors = [json.loads(p) for p in payloads if p.startswith("{") and "error" in json.loads(p)]
    assert errors, payloads
    assert errors[0]["error"]["type"] == "overloaded"
    assert errors[0]["error"].get("retry_after_s", 0) >= 1
    holder.close()
    wait_until(lambda: idle(server))
    check_invariants(server)


def test_s9_clients_gone_while_queued_are_never_run(make_server):
    server = budget_server(make_server, "--test-step-delay-ms", "20")
    holder = open_request(server.port, body_for_tokens(int(0.9 * BUDGET_TOKENS)))
    wait_until(lambda: server.admission()["running"] == 1, what="large request running")
    waiting = [open_request(server.port, body_for_tokens(int(0.9 * BUDGET_TOKENS))) for _ in range(10)]
    wait_until(lambda: server.admission()["queue_depth"] == 10, what="10 queued")
    for s in waiting:
        s.close()
    wait_until(lambda: server.admission()["queue_depth"] == 0, what="queue emptied by disconnects")
    a = server.admission()
    # Never admitted: counted as left while queued, not among the finished.
    assert a["admitted"] == 1 and a["cancelled_queued"] == 10 and a["cancelled"] == 0, a
    holder.close()
    wait_until(lambda: idle(server))
    assert server.admission()["admitted"] == 1
    check_invariants(server)


def test_s10_partial_bodies_reserve_nothing(make_server):
    server = budget_server(make_server, "--read-timeout", "1")
    import socket
    gone = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    gone.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 10000\r\n\r\n" + b"{" * 1000)
    gone.close()
    stalled = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    stalled.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 10000\r\n\r\n" + b" " * 1000)
    assert read_status(stalled) == 408
    stalled.close()
    assert server.admission()["admitted"] == 0
    check_invariants(server)


def test_naive_baseline_reports_oom_as_500(make_server):
    server = make_server("--admission", "none", "--test-inject-oom-step", "2")
    r = server.post("/v1/completions", {"prompt": "Hi", "max_tokens": 8, "ignore_eos": True})
    assert r.status_code == 500, r.text
    assert r.json()["error"]["type"] == "out_of_memory"
    assert server.get("/health").status_code == 200
    assert server.post("/v1/completions", {"prompt": "Hi", "max_tokens": 8}).status_code == 200
