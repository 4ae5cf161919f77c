"""--prefill-worker (disaggregated prefill) against the real binary on tinylm:
new prompts are prefilled on a second compute thread while decode steps run.
Greedy output in the float64 test mode is token-for-token what the same
requests give one at a time without the worker, for concurrent requests of
different lengths, streaming or not; and the device sets aside twice the
step workspace, since a prefill step and a decode step may run at once."""
import concurrent.futures
import json
import subprocess
import threading

import requests

from conftest import BIN, MODEL_DIR, sse_events, wait_until

PROMPTS = ["Once", "The quick brown fox jumps over the lazy dog and then",
           "In a hole in the ground there lived", "A", "Rain, rain, go away; come again another day.",
           "Numbers: 1 2 3 4 5 6 7 8 9", "She said", "Why is the sky"]


def body(i):
    return {"prompt": PROMPTS[i], "max_tokens": 40 + 5 * i, "temperature": 0, "ignore_eos": True}


def complete(server, b, stream, first_token=None):
    """The completion's text; `first_token` (an Event) is set when a stream's
    first event arrives."""
    if not stream:
        r = server.post("/v1/completions", b)
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["text"]
    r = requests.post(server.url + "/v1/completions", json=dict(b, stream=True), stream=True, timeout=120)
    assert r.status_code == 200, r.text
    text = ""
    for e in sse_events(r):
        if first_token:
            first_token.set()
        if e != "[DONE]":
            text += "".join(c["text"] for c in json.loads(e).get("choices", []))
    return text


def idle(server):
    a = server.admission()
    return a["running"] == 0 and a["queued"] == 0 and all(d["reserved_bytes"] == 0 for d in a["devices"])


def test_concurrent_greedy_output_matches_one_at_a_time(make_server):
    alone = make_server("--dtype", "float64", "--max-batch", "1")
    expected = [complete(alone, body(i), stream=False) for i in range(len(PROMPTS))]
    alone.stop()

    server = make_server("--dtype", "float64", "--max-batch", "8", "--prefill-worker")
    # Streams (even i) start together; request i + 1 is sent once stream i
    # has its first token, so its prompt is prefilled while i decodes.
    start = threading.Barrier(len(PROMPTS) // 2)
    first = [threading.Event() for _ in PROMPTS]

    def one(i):
        if i % 2 == 0:
            start.wait()
            return complete(server, body(i), stream=True, first_token=first[i])
        assert first[i - 1].wait(60)
        return complete(server, body(i), stream=False)

    with concurrent.futures.ThreadPoolExecutor(len(PROMPTS)) as pool:
        got = list(pool.map(one, range(len(PROMPTS))))
    assert got == expected
    wait_until(lambda: idle(server), what="idle")
    a = server.admission()
    assert a["completed"] == len(PROMPTS) and a["failed"] == 0 and a["out_of_memory"] == 0, a


def test_the_worker_sets_aside_a_second_step_workspace(make_server):
    # The same batch as the worker's (8: no block pool with a worker), so the same step workspace.
    plain = make_server("--device", "virt:0=64MiB", "--max-batch", "8")
    with_worker = make_server("--device", "virt:0=64MiB", "--prefill-worker")
    p, w = plain.admission()["devices"][0], with_worker.admission()["devices"][0]
    assert p["workspace_bytes"] > 0
    assert w["workspace_bytes"] == 2 * p["workspace_bytes"], (p, w)
    assert w["resident_bytes"] == p["resident_bytes"]
    assert w["budget_bytes"] == p["budget_bytes"] - p["workspace_bytes"], (p, w)
    # `vramgate plan` computes the same budget.
    out = subprocess.run([BIN, "plan", "--model-dir", MODEL_DIR, "--threads", "1", "--json", "--device",
                          "virt:0=64MiB", "--prefill-worker"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    assert plan["workspace_bytes"] == w["workspace_bytes"] and plan["budget_bytes"] == w["budget_bytes"], plan


def test_injected_out_of_memory_with_the_worker_is_recovered_and_nothing_leaks(make_server):
    alone = make_server("--dtype", "float64", "--max-batch", "1")
    expected = [complete(alone, body(i), stream=False) for i in range(len(PROMPTS))]
    alone.stop()

    # Steps 2 and 3 (the worker's prefills or the engine's decode steps,
    # whichever start them) fail with out-of-memory.
    server = make_server("--dtype", "float64", "--max-batch", "8", "--prefill-worker", "--test-inject-oom-step", "2",
                         "--test-inject-oom-count", "2", "--oom-quiet-period", "0.2")
    resident = server.admission()["devices"][0]["resident_bytes"]
    start = threading.Barrier(len(PROMPTS))

    def one(i):
        start.wait()
        return complete(server, body(i), stream=i % 2 == 0)

    with concurrent.futures.ThreadPoolExecutor(len(PROMPTS)) as pool:
        got = list(pool.map(one, range(len(PROMPTS))))
    assert got == expected  # preempted requests were recomputed to the same text
    wait_until(lambda: idle(server), what="idle")
    a = server.admission()
    assert a["completed"] == len(PROMPTS) and a["failed"] == 0, a
    assert a["preemptions"] >= 1, a
    assert a["devices"][0]["used_bytes"] == resident, a  # every KV cache freed
