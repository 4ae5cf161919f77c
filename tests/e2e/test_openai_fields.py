"""The OpenAI request fields clients really send, end to end on tinylm:
logprobs (completions and chat), echo with prompt logprobs (checked against the
reference forward pass in tools/), n choices, penalties and logit_bias,
stream_options.include_usage, null as absent, and the fields vramgate refuses
rather than ignore."""
import json
import math
import os
import subprocess
import sys

import pytest

from conftest import MODEL_DIR, sse_events

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


def complete(server, **body):
    r = server.post("/v1/completions", {"prompt": "Hello there", "max_tokens": 5, "temperature": 0, **body})
    assert r.status_code == 200, r.text
    return r.json()


def reference_logits(ids):
    """Logits [T][V] of the reference forward pass (float64) of tools/reference_forward.py."""
    out = subprocess.run([sys.executable if sys.executable.startswith("/usr/bin") else "/usr/bin/python3",
                          os.path.join(ROOT, "tools", "reference_forward.py"), "--model", MODEL_DIR,
                          "--prompts", json.dumps([ids])], check=True, capture_output=True, text=True).stdout
    return json.loads(out)["logits"][0]


def log_softmax(row):
    m = max(row)
    z = m + math.log(sum(math.exp(x - m) for x in row))
    return [x - z for x in row]


def test_completion_logprobs_have_openais_shape_and_sorted_alternatives(server):
    body = complete(server, logprobs=3)
    lp = body["choices"][0]["logprobs"]
    n = body["usage"]["completion_tokens"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"]) == n
    assert "".join(lp["tokens"]) == body["choices"][0]["text"]
    assert lp["text_offset"] == list(range(n))  # one byte-level character per token
    for tok, value, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]):
        values = list(top.values())
        assert values == sorted(values, reverse=True)
        assert 3 <= len(top) <= 4
        assert value <= 0
        assert top[tok] == pytest.approx(value)  # greedy: the sampled token is the most likely one
        assert values[0] == pytest.approx(value)


def test_echo_scores_the_prompt_like_the_reference_forward_pass(server):
    prompt = "The cat sat"
    body = complete(server, prompt=prompt, max_tokens=0, echo=True, logprobs=1)
    choice = body["choices"][0]
    assert choice["text"] == prompt
    assert body["usage"]["completion_tokens"] == 0
    lp = choice["logprobs"]
    ids = list(prompt.encode())
    assert lp["tokens"] == [chr(b) for b in ids]
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    logits = reference_logits(ids)
    for pos in range(1, len(ids)):
        expected = log_softmax(logits[pos - 1])
        assert lp["token_logprobs"][pos] == pytest.approx(expected[ids[pos]], abs=1e-4)
        best = max(range(len(expected)), key=lambda i: expected[i])
        assert max(lp["top_logprobs"][pos].values()) == pytest.approx(expected[best], abs=1e-4)


def test_echo_precedes_the_completion(server):
    body = complete(server, prompt="Once upon", echo=True, max_tokens=4)
    text = body["choices"][0]["text"]
    plain = complete(server, prompt="Once upon", max_tokens=4)["choices"][0]["text"]
    assert text == "Once upon" + plain


def test_max_tokens_zero_needs_echo(server):
    r = server.post("/v1/completions", {"prompt": "x", "max_tokens": 0})
    assert r.status_code == 400 and "max_tokens" in r.json()["error"]["message"]


def test_chat_logprobs_content_entries(server):
    r = server.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "chat_template": "chatml",
                                             "max_tokens": 6, "temperature": 0, "logprobs": True, "top_logprobs": 2})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    content = choice["logprobs"]["content"]
    assert len(content) == r.json()["usage"]["completion_tokens"]
    assert "".join(bytes(e["bytes"]).decode() for e in content) == choice["message"]["content"]
    for e in content:
        assert len(e["top_logprobs"]) == 2
        assert e["top_logprobs"][0]["logprob"] >= e["top_logprobs"][1]["logprob"]
        assert e["top_logprobs"][0]["token"] == e["token"]  # greedy
    r = server.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "chat_template": "chatml",
                                             "top_logprobs": 2})
    assert r.status_code == 400 and "top_logprobs" in r.json()["error"]["message"]


def test_n_choices_differ_and_repeat_with_a_seed(server):
    body = {"prompt": "Once upon a time", "max_tokens": 12, "n": 3, "seed": 11, "temperature": 1.0}
    first = complete(server, **body)
    again = complete(server, **body)
    texts = [c["text"] for c in sorted(first["choices"], key=lambda c: c["index"])]
    assert [c["index"] for c in first["choices"]] == [0, 1, 2]
    assert texts == [c["text"] for c in sorted(again["choices"], key=lambda c: c["index"])]
    assert len(set(texts)) > 1
    assert first["usage"]["completion_tokens"] == sum(len(t.encode()) for t in texts) + sum(
        c["finish_reason"] == "stop" for c in first["choices"])  # an end-of-text token counts but writes nothing
    # Greedy choices are all the same text.
    greedy = complete(server, prompt="Once upon a time", max_tokens=8, n=2, temperature=0)
    assert greedy["choices"][0]["text"] == greedy["choices"][1]["text"]


def test_n_streams_every_choice_with_its_index(server):
    with server.post("/v1/completions", {"prompt": "Once", "max_tokens": 6, "n": 2, "seed": 3, "stream": True},
                     stream=True) as r:
        assert r.status_code == 200
        events = list(sse_events(r))
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    text = {0: "", 1: ""}
    finished = set()
    for c in chunks:
        for choice in c["choices"]:
            text[choice["index"]] += choice["text"]
            if choice["finish_reason"]:
                finished.add(choice["index"])
    assert finished == {0, 1}
    assert chunks[-1]["usage"]["completion_tokens"] >= len(text[0].encode()) + len(text[1].encode())


def test_n_beyond_max_n_is_refused(server):
    r = server.post("/v1/completions", {"prompt": "x", "n": 9})
    assert r.status_code == 400 and "--max-n" in r.json()["error"]["message"]


def test_include_usage_sends_openais_chunk_sequence(server):
    for route, body in (("/v1/completions", {"prompt": "Hi"}),
                        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}],
                                                  "chat_template": "chatml"})):
        with server.post(route, {**body, "max_tokens": 4, "stream": True, "stream_options": {"include_usage": True}},
                         stream=True) as r:
            events = list(sse_events(r))
        chunks = [json.loads(e) for e in events[:-1]]
        assert events[-1] == "[DONE]"
        assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] >= 1
        assert all(c["usage"] is None for c in chunks[:-1])
        assert chunks[-2]["choices"][0]["finish_reason"] in ("length", "stop")
    # Without it, usage rides on the last chunk with finish_reason, as before.
    with server.post("/v1/completions", {"prompt": "Hi", "max_tokens": 4, "stream": True}, stream=True) as r:
        chunks = [json.loads(e) for e in list(sse_events(r))[:-1]]
    assert chunks[-1]["choices"][0]["finish_reason"] and "usage" in chunks[-1]
    assert all("usage" not in c for c in chunks[:-1])
    r = server.post("/v1/completions", {"prompt": "Hi", "stream_options": {"include_usage": True}})
    assert r.status_code == 400 and "stream_options" in r.json()["error"]["message"]


def test_null_means_absent(server):
    r = server.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "chat_template": "chatml",
                                             "max_tokens": None, "max_completion_tokens": 24, "temperature": 0,
                                             "ignore_eos": True})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 24
    body = {"prompt": "Hi", "max_tokens": None, "temperature": None, "top_p": None, "stop": None, "n": None,
            "logprobs": None, "seed": None, "stream": None, "presence_penalty": None, "logit_bias": None,
            "ignore_eos": True}
    r = server.post("/v1/completions", body)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 16
    assert r.json()["choices"][0]["logprobs"] is None


def test_the_two_length_fields_are_never_silently_ignored(server):
    # max_completion_tokens is chat's: /v1/completions names it rather than
    # generate its own default length; in a chat, two lengths that differ
    # are refused, and an error names the field the client sent.
    r = server.post("/v1/completions", {"prompt": "Hi", "max_completion_tokens": 4})
    assert r.status_code == 400 and "max_completion_tokens" in r.json()["error"]["message"], r.text
    chat = {"messages": [{"role": "user", "content": "Hi"}], "chat_template": "chatml"}
    r = server.post("/v1/chat/completions", dict(chat, max_tokens=4, max_completion_tokens=8))
    assert r.status_code == 400 and "differ" in r.json()["error"]["message"], r.text
    r = server.post("/v1/chat/completions", dict(chat, max_completion_tokens=-1))
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"].startswith("max_completion_tokens must be"), r.text
    r = server.post("/v1/chat/completions", dict(chat, max_tokens=4, max_completion_tokens=4, ignore_eos=True))
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4, r.text


def test_logit_bias_forces_a_token_and_penalties_change_greedy_text(server):
    forced = complete(server, max_tokens=4, logit_bias={str(ord("z")): 100}, ignore_eos=True)
    assert forced["choices"][0]["text"] == "zzzz"
    plain = complete(server, prompt="aaaa", max_tokens=12, ignore_eos=True)["choices"][0]["text"]
    penalised = complete(server, prompt="aaaa", max_tokens=12, ignore_eos=True, frequency_penalty=2.0,
                         presence_penalty=2.0)["choices"][0]["text"]
    # OpenAI's penalties: no generated token repeats much under the largest penalties.
    assert penalised != plain
    assert max(penalised.count(ch) for ch in set(penalised)) <= max(plain.count(ch) for ch in set(plain))
    r = server.post("/v1/completions", {"prompt": "x", "logit_bias": {"99999": 5}})
    assert r.status_code == 400 and "logit_bias" in r.json()["error"]["message"]
    for field, value in (("presence_penalty", 3), ("frequency_penalty", -2.5), ("repetition_penalty", 0),
                         ("logit_bias", {"1": 101}), ("logit_bias", {"a": 1})):
        r = server.post("/v1/completions", {"prompt": "x", field: value})
        assert r.status_code == 400 and field in r.json()["error"]["message"], (field, value, r.text)


@pytest.mark.parametrize("field,value", [
    ("best_of", 3), ("suffix", "tail"), ("tools", [{"type": "function", "function": {"name": "f"}}]),
    ("tool_choice", "required"), ("functions", [{"name": "f"}]), ("function_call", {"name": "f"}),
    ("response_format", {"type": "json_object"}), ("min_tokens", 3), ("use_beam_search", True),
    ("guided_json", {}), ("stop_token_ids", [1]), ("audio", {"voice": "x"}), ("modalities", ["text", "audio"]),
])
def test_fields_that_would_change_the_answer_are_refused(server, field, value):
    for route, body in (("/v1/completions", {"prompt": "x"}),
                        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                                                  "chat_template": "chatml"})):
        r = server.post(route, {**body, field: value})
        assert r.status_code == 400, (route, field, r.text)
        assert r.json()["error"]["type"] == "invalid_request"
        assert field in r.json()["error"]["message"]


def test_harmless_values_and_ignored_fields_are_accepted(server):
    body = {"prompt": "x", "max_tokens": 2, "best_of": 1, "suffix": "", "tools": [], "tool_choice": "none",
            "response_format": {"type": "text"}, "user": "u-1", "metadata": {"a": "b"}, "store": False,
            "service_tier": "auto", "parallel_tool_calls": True}
    assert server.post("/v1/completions", body).status_code == 200
    r = server.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "chat_template": "chatml",
                                             "echo": True})
    assert r.status_code == 400 and "echo" in r.json()["error"]["message"]
