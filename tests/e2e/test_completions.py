"""The serving slice: completions (plain and streaming), /infer, models,
health and readiness, concurrency, and the error table."""
import concurrent.futures
import http.client
import json
import re

from conftest import sse_events, wait_until


def english_like(text):
    # Mostly letters and spaces, with some real-looking words.
    letters = sum(c.isalpha() or c.isspace() for c in text)
    words = re.findall(r"[A-Za-z]{2,}", text)
    return len(text) > 0 and letters / len(text) > 0.7 and len(words) >= 2


def test_health_ready_models(server):
    assert server.get("/health").status_code == 200
    r = server.get("/ready")
    assert r.status_code == 200
    m = server.get("/v1/models").json()
    assert m["object"] == "list"
    assert m["data"][0]["id"] == "tinylm"
    assert m["data"][0]["object"] == "model"
    assert m["data"][0]["context_length"] == 256
    assert m["data"][0]["family"] == "gpt2"


def test_one_model_by_its_id(server):
    """GET /v1/models/{id}, what the SDKs' models.retrieve sends: the list's
    object for that model, its id percent-decoded; an unknown one is 404."""
    listed = server.get("/v1/models").json()["data"][0]
    for path in ("/v1/models/tinylm", "/v1/models/tiny%6Cm"):
        r = server.get(path)
        assert r.status_code == 200, r.text
        assert r.json() == listed
    missing = server.get("/v1/models/gpt-4o")
    assert missing.status_code == 404, missing.text
    assert missing.json()["error"]["type"] == "not_found" and "gpt-4o" in missing.json()["error"]["message"]
    # Sent as is (requests would re-quote the stray '%').
    conn = http.client.HTTPConnection(server.url.split("//")[1], timeout=30)
    conn.request("GET", "/v1/models/tiny%zz")
    broken = conn.getresponse()
    assert broken.status == 400
    assert "escape" in json.loads(broken.read())["error"]["message"]
    conn.close()
    assert server.post("/v1/models/tinylm", {}).status_code == 405


def test_completion_returns_english_text_and_usage(server):
    r = server.post("/v1/completions", {"prompt": "The meaning of life is", "max_tokens": 48, "seed": 1,
                                        "temperature": 0.7})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "text_completion"
    choice = body["choices"][0]
    assert choice["finish_reason"] in ("stop", "length")
    assert body["usage"]["prompt_tokens"] == len("The meaning of life is")
    assert 1 <= body["usage"]["completion_tokens"] <= 48
    assert body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"] + body["usage"]["completion_tokens"]
    assert "X-Request-Id" in r.headers
    assert "X-Queue-Position" in r.headers and "X-Queue-Wait-Ms" in r.headers


def test_greedy_output_is_english_like(server):
    r = server.post("/v1/completions", {"prompt": "When I was young, ", "max_tokens": 60, "temperature": 0})
    assert r.status_code == 200, r.text
    assert english_like(r.json()["choices"][0]["text"]), r.json()


def test_same_seed_same_text_and_greedy_is_deterministic(server):
    body = {"prompt": "A man walks into", "max_tokens": 32, "temperature": 1.0, "top_p": 0.9, "seed": 42}
    a = server.post("/v1/completions", body).json()["choices"][0]["text"]
    b = server.post("/v1/completions", body).json()["choices"][0]["text"]
    assert a == b
    g1 = server.post("/v1/completions", {"prompt": "Love is", "max_tokens": 20, "temperature": 0}).json()
    g2 = server.post("/v1/completions", {"prompt": "Love is", "max_tokens": 20, "temperature": 0}).json()
    assert g1["choices"][0]["text"] == g2["choices"][0]["text"]


def test_max_tokens_absent_means_16(server):
    r = server.post("/v1/completions", {"prompt": "Hello", "temperature": 0})
    assert r.status_code == 200
    body = r.json()
    n = body["usage"]["completion_tokens"]
    if body["choices"][0]["finish_reason"] == "length":
        assert n == 16
    else:
        assert n <= 16


def test_stop_string_is_honoured(server):
    free = server.post("/v1/completions", {"prompt": "The ", "max_tokens": 60, "temperature": 0}).json()
    text = free["choices"][0]["text"]
    # Stop at the first space the model generates.
    assert " " in text, text
    r = server.post("/v1/completions", {"prompt": "The ", "max_tokens": 60, "temperature": 0, "stop": [" "]}).json()
    assert r["choices"][0]["text"] == text[:text.index(" ")]
    assert r["choices"][0]["finish_reason"] == "stop"


def test_streaming_sends_chunks_then_done(server):
    with server.post("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 40, "stream": True,
                                         "temperature": 0}, stream=True) as r:
        assert r.status_code == 200
        assert r.headers["Content-Type"].startswith("text/event-stream")
        payloads = list(sse_events(r))
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    text_chunks = [c for c in chunks if "choices" in c]
    assert len(text_chunks) >= 2
    assert text_chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    streamed = "".join(c["choices"][0]["text"] for c in text_chunks)
    plain = server.post("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 40,
                                            "temperature": 0}).json()["choices"][0]["text"]
    assert streamed == plain


def test_infer_short_form(server):
    r = server.post("/infer", {"prompt": "Hello there", "max_tokens": 8})
    assert r.status_code == 200, r.text
    body = r.json()
    assert isinstance(body["result"], str)
    assert body["latency_ms"] >= 0 and body["queue_ms"] >= 0


def test_token_id_prompt(server):
    ids = list(b"Hi there")
    r = server.post("/v1/completions", {"prompt": ids, "max_tokens": 4, "temperature": 0})
    assert r.status_code == 200, r.text
    t = server.post("/v1/completions", {"prompt": "Hi there", "max_tokens": 4, "temperature": 0})
    assert r.json()["choices"][0]["text"] == t.json()["choices"][0]["text"]


def test_eight_concurrent_clients_all_succeed(server):
    prompts = ["The cat", "In the beginning", "My friend said", "Never", "The best way to", "Today I",
               "He who", "Life is"]

    def one(p):
        return server.post("/v1/completions", {"prompt": p, "max_tokens": 40, "temperature": 0.8, "seed": 3})

    with concurrent.futures.ThreadPoolExecutor(8) as ex:
        results = list(ex.map(one, prompts))
    for r in results:
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] >= 1
    texts = [r.json()["choices"][0]["text"] for r in results]
    assert sum(english_like(t) for t in texts if len(t) > 10) >= 4, texts
    wait_until(lambda: server.admission()["running"] == 0, what="engine idle")


def error_of(r, status, etype):
    assert r.status_code == status, (r.status_code, r.text)
    body = r.json()
    assert body["error"]["type"] == etype, body
    assert body["error"]["message"]
    return body["error"]


def test_bad_json_and_bad_values_are_400(server):
    url = server.url + "/v1/completions"
    import requests
    error_of(requests.post(url, data="{not json", headers={"Content-Type": "application/json"}, timeout=30),
             400, "invalid_request")
    error_of(requests.post(url, data="[1,2]", timeout=30), 400, "invalid_request")
    for bad in (0, -1, 1.5, "5", 10**12):
        e = error_of(server.post("/v1/completions", {"prompt": "x", "max_tokens": bad}), 400, "invalid_request")
        assert "max_tokens" in e["message"]
    error_of(server.post("/v1/completions", {"prompt": 5}), 400, "invalid_request")
    error_of(server.post("/v1/completions", {"prompt": "x", "temperature": -1}), 400, "invalid_request")
    error_of(server.post("/v1/completions", {"prompt": "x", "top_p": 0}), 400, "invalid_request")
    error_of(server.post("/v1/completions", {"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}), 400,
             "invalid_request")
    error_of(server.post("/v1/completions", {"prompt": [1, 2, 9999]}), 400, "invalid_request")


def test_unknown_fields_are_ignored(server):
    r = server.post("/v1/completions", {"prompt": "Hi", "max_tokens": 2, "logit_bias": {}, "user": "u1",
                                        "frequency_penalty": 0})
    assert r.status_code == 200, r.text


def test_context_overflow_is_400(server):
    e = error_of(server.post("/v1/completions", {"prompt": "x" * 250, "max_tokens": 10}), 400, "invalid_request")
    assert "context" in e["message"]


def test_unknown_model_route_and_method(server):
    error_of(server.post("/v1/completions", {"model": "nope", "prompt": "x"}), 404, "model_not_found")
    error_of(server.get("/nowhere"), 404, "not_found")
    error_of(server.get("/v1/completions"), 405, "method_not_allowed")
    error_of(server.post("/health", {}), 405, "method_not_allowed")


def test_body_too_large_is_413(server):
    r = server.post("/v1/completions", {"prompt": "x" * (2 << 20)})
    error_of(r, 413, "body_too_large")


def test_request_id_is_echoed(server):
    r = server.post("/v1/completions", {"prompt": "Hi", "max_tokens": 1}, headers={"X-Request-Id": "abc-123"})
    assert r.headers["X-Request-Id"] == "abc-123"
    r = server.get("/nowhere", headers={"X-Request-Id": "zzz"})
    assert r.headers["X-Request-Id"] == "zzz"


def test_stream_and_plain_errors_are_identical(server):
    for body in ({"prompt": "x", "max_tokens": 0}, {"model": "nope", "prompt": "x"},
                 {"prompt": "x" * 250, "max_tokens": 10}):
        a = server.post("/v1/completions", dict(body, stream=False))
        b = server.post("/v1/completions", dict(body, stream=True))
        assert a.status_code == b.status_code
        assert a.json() == b.json()


def test_head_is_answered_on_get_routes(server):
    import requests
    for path in ("/health", "/ready", "/v1/models", "/v1/models/tinylm", "/v1/admission", "/metrics"):
        r = requests.head(server.url + path, timeout=30)
        assert r.status_code == 200, path
        assert r.content == b""
        assert int(r.headers["Content-Length"]) > 0
    r = requests.head(server.url + "/v1/completions", timeout=30)
    assert r.status_code == 405
    assert r.headers["Allow"] == "POST"
