"""Out-of-memory recovery end to end (scenario S5 and its repeats): injected
out-of-memory steps preempt running requests, which are recomputed and
complete; streamed text is never sent twice; repeated errors mark the device
not ready instead of serving errors forever; memory returns to the resident
baseline. Expected sizes come from the server's own costs and budget."""
import concurrent.futures
import json

import requests

from conftest import sse_events, wait_until
from scenario_util import BUDGET_TOKENS, body_for_tokens, budget_server, cost_of, idle, kv_pool_bytes, within_pool


def stream_text(server, body):
    """Runs a streaming completion; returns (text, usage)."""
    with requests.post(server.url + "/v1/completions", json=dict(body, stream=True), stream=True,
                       timeout=120) as r:
        assert r.status_code == 200, r.text
        text, usage = "", None
        for data in sse_events(r):
            if data == "[DONE]":
                break
            event = json.loads(data)
            assert "error" not in event, event
            text += event["choices"][0]["text"]
            usage = event.get("usage") or usage
    return text, usage


def test_s5_injected_oom_under_load_preempts_and_every_request_completes(make_server):
    # Four small requests run together; step 6 fails with out-of-memory. The
    # governor halves the effective budget, so the youngest are preempted
    # until the rest fit; they are recomputed and complete.
    server = budget_server(make_server, "--test-inject-oom-step", "6", "--oom-quiet-period", "3600",
                           "--test-step-delay-ms", "5")
    small = BUDGET_TOKENS // 6
    assert 4 * cost_of(server.profile, small) <= server.budget
    resident = server.admission()["devices"][0]["resident_bytes"]
    body = body_for_tokens(small, temperature=0)

    def one(_):
        return requests.post(server.url + "/v1/completions", json=body, timeout=120)

    with concurrent.futures.ThreadPoolExecutor(4) as ex:
        futures = [ex.submit(one, i) for i in range(4)]
        wait_until(lambda: server.admission()["out_of_memory"] == 1, what="the injected out-of-memory step")
        assert server.get("/health").status_code == 200  # I3 during the scenario
        results = [f.result() for f in futures]
    for r in results:
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == body["max_tokens"]
    texts = {r.json()["choices"][0]["text"] for r in results}
    assert len(texts) == 1  # greedy: the preempted ones produced the same text
    wait_until(lambda: idle(server))
    a = server.admission()
    assert a["preemptions"] >= 1, a
    assert a["oom_budget_cuts"] == 1 and a["failed"] == 0, a
    d = a["devices"][0]
    assert d["effective_budget_bytes"] == within_pool(d, server.budget // 2)
    assert d["peak_reserved_bytes"] <= d["budget_bytes"]
    # Every KV cache freed: back to the resident baseline (and the pool, shrunk to the cut budget).
    assert d["used_bytes"] == resident + kv_pool_bytes(d)
    assert server.post("/v1/completions", body).status_code == 200  # the same size runs again


def test_a_preempted_stream_sends_exactly_the_text_of_an_undisturbed_run(make_server):
    # The first request runs 40 steps (one prefill step, 39 decode steps); the
    # second is preempted at its fifth step and recomputed.
    server = make_server("--test-inject-oom-step", "45")
    body = {"prompt": "The meaning of life is", "max_tokens": 40, "temperature": 0, "ignore_eos": True}
    reference, usage = stream_text(server, body)
    assert usage["completion_tokens"] == 40
    assert server.admission()["preemptions"] == 0
    text, usage = stream_text(server, body)
    a = server.admission()
    assert a["out_of_memory"] == 1 and a["preemptions"] == 1, a
    assert usage["completion_tokens"] == 40
    assert text == reference


def test_ten_out_of_memory_steps_in_a_row_are_survived_and_the_device_recovers(make_server):
    server = make_server("--test-inject-oom-step", "2", "--test-inject-oom-count", "10",
                         "--oom-quiet-period", "0.2", "--oom-unready-after", "5")
    resident = server.admission()["devices"][0]["resident_bytes"]
    body = {"prompt": "Hello", "max_tokens": 12, "temperature": 0, "ignore_eos": True}
    statuses = []

    def served():
        r = server.post("/v1/completions", body)
        statuses.append(r.status_code)
        assert r.status_code in (200, 503), r.text
        if r.status_code == 503:
            assert r.json()["error"]["type"] == "overloaded"
            assert int(r.headers["Retry-After"]) >= 1
        assert server.get("/health").status_code == 200
        return r.status_code == 200 and server.admission()["out_of_memory"] == 10

    wait_until(served, what="a completion after ten out-of-memory steps")
    a = server.admission()
    assert a["not_ready_trips"] >= 1, a
    assert a["preemptions"] >= 1, a
    wait_until(lambda: server.get("/ready").status_code == 200, what="ready again")
    wait_until(lambda: idle(server))

    # Every 0.2 s quiet period raises the budget and the idle engine grows the
    # pool to match: /v1/admission read during one of those resizes sees the
    # old storage freed and the new one not yet taken. Once the budget is back
    # at its ceiling the pool stops moving, and only it is above the resident
    # bytes.
    def settled():
        d = server.admission()["devices"][0]
        restored = d["budget_bytes"] - d["effective_budget_bytes"] < d["kv_blocks"]["block_bytes"]  # whole blocks
        return restored and d["reserved_bytes"] == 0 and d["used_bytes"] == resident + kv_pool_bytes(d)

    wait_until(settled, what="the budget restored and memory back to the resident bytes and the pool")
    a = server.admission()
    assert a["devices"][0]["ready"] is True
    assert server.post("/v1/completions", body).status_code == 200
