"""The official OpenAI JS SDK (npm `openai`, a dev dependency installed by
scripts/install-deps --test) against the real binary: completions with
logprobs and n, echo scoring, chat with logprobs, a streamed chat with n and
usage; its parsed objects carry the values. Skipped only where node or the
package is missing (CI installs both)."""
import json
import os
import shutil
import subprocess

import pytest

from conftest import wait_until
from scenario_util import BUDGET_TOKENS, body_for_tokens, budget_server, open_request

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
SDK = os.path.join(ROOT, "node_modules", "openai", "package.json")


NEEDS_SDK = pytest.mark.skipif(not shutil.which("node") or not os.path.exists(SDK),
                               reason="node or node_modules/openai missing: run scripts/install-deps --test")


@NEEDS_SDK
def test_openai_js_sdk_parses_logprobs_choices_and_stream_usage(server):
    run = subprocess.run(["node", os.path.join(ROOT, "tests", "e2e", "openai_sdk_client.mjs"), server.url],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert run.returncode == 0, run.stdout + run.stderr
    out = json.loads(run.stdout)

    c = out["completion"]
    assert [ch["index"] for ch in c["choices"]] == [0, 1]
    for ch in c["choices"]:
        assert len(ch["tokens"]) == len(ch["token_logprobs"]) == len(ch["text_offset"]) >= 1
        assert "".join(ch["tokens"]) == ch["text"]
        assert all(lp <= 0 for lp in ch["token_logprobs"])
        assert all(2 <= n <= 3 for n in ch["top"])
    assert c["usage"]["completion_tokens"] >= 2

    assert out["echo"]["text"] == "The cat"
    assert out["echo"]["token_logprobs"][0] is None and len(out["echo"]["token_logprobs"]) == 7

    chat = out["chat"]
    assert len(chat["logprobs"]) == chat["usage"]["completion_tokens"]
    assert "".join(bytes(e["bytes"]).decode() for e in chat["logprobs"]) == chat["content"]
    assert all(e["top"] == 2 for e in chat["logprobs"])

    s = out["chat_stream"]
    assert set(s["finish"]) == {"0", "1"}
    assert s["text"]["0"] == s["text"]["1"]  # greedy choices agree
    assert s["usage"]["completion_tokens"] >= 2 and s["logprob_entries"] >= 2

    assert out["refused"]["status"] == 400 and "best_of" in out["refused"]["message"]

    assert out["model"] == {"id": "tinylm", "object": "model", "context_length": 256}
    assert out["missing_model"] == {"status": 404, "type": "not_found"}
    d = out["developer"]
    assert d["finish_reason"] == "length" and d["usage"]["total_tokens"] == 256, d


@NEEDS_SDK
def test_openai_js_sdk_sees_the_code_and_param_of_each_refusal(make_server):
    # 400 (a field out of range, a prompt past the context), 413 (never fits
    # the device), 503 (the queue is full) on a server whose budget holds one
    # request; 429 (over the client's rate) on another.
    server = budget_server(make_server, "--test-step-delay-ms", "20", "--max-queue", "1", "--max-batch", "1")
    limited = make_server("--rate-limit", "0.01", "--rate-burst", "1")
    assert limited.post("/v1/completions", {"prompt": "x", "max_tokens": 1}).status_code == 200
    held = [open_request(server.port, body_for_tokens(BUDGET_TOKENS)) for _ in range(2)]
    try:
        wait_until(lambda: server.admission()["running"] == 1 and server.admission()["queued"] == 1,
                   what="one request running, one waiting")
        cases = [
            {"url": server.url, "route": "completions", "body": {"model": "tinylm", "prompt": "x", "temperature": 5}},
            {"url": server.url, "route": "chat",
             "body": {"model": "tinylm", "messages": [{"role": "user"}], "max_tokens": 2}},
            {"url": server.url, "route": "completions",
             "body": {"model": "tinylm", "prompt": "x" * 200, "max_tokens": 100}},
            {"url": server.url, "route": "completions",
             "body": dict(body_for_tokens(server.never_fits), model="tinylm")},
            {"url": server.url, "route": "completions", "body": dict(body_for_tokens(8), model="tinylm")},
            {"url": limited.url, "route": "completions", "body": {"model": "tinylm", "prompt": "x", "max_tokens": 1}},
        ]
        run = subprocess.run(["node", os.path.join(ROOT, "tests", "e2e", "openai_sdk_errors.mjs"), json.dumps(cases)],
                             capture_output=True, text=True, timeout=120, cwd=ROOT)
    finally:
        for s in held:
            s.close()
    assert run.returncode == 0, run.stdout + run.stderr
    field, content, context, never, full, rate = json.loads(run.stdout)
    assert field["class"] == "BadRequestError" and field["status"] == 400, field
    assert (field["type"], field["code"], field["param"]) == ("invalid_request", "invalid_request", "temperature")
    assert content["status"] == 400 and content["param"] == "messages[0].content", content
    assert context["status"] == 400 and context["code"] == "context_length_exceeded", context
    assert context["param"] == "max_tokens", context
    assert never["status"] == 413 and never["code"] == "exceeds_device_memory" and never["param"] is None, never
    assert full["class"] == "InternalServerError" and full["status"] == 503, full
    assert full["code"] == "overloaded" and full["param"] is None, full
    assert rate["class"] == "RateLimitError" and rate["status"] == 429, rate
    assert rate["code"] == "rate_limit_exceeded" and rate["type"] == "rate_limited", rate
