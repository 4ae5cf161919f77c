"""CORS against the real binary (--cors-allow-origin): an allowed origin's
responses carry Access-Control-Allow-Origin (errors and streams too), a
preflight is answered 204 without an API key, a disallowed or absent origin
gets no CORS headers, and a preflight from a disallowed origin gets 403."""
import subprocess

import pytest
import requests

from conftest import BIN, Server, sse_events

ALLOWED = "http://app.example:3000"
OTHER = "http://localhost:3000"
EVIL = "https://evil.example"
KEY = "sk-cors-test-1"
EXPOSED = {"Retry-After", "retry-after-ms", "x-should-retry", "X-Retry-Token", "X-Request-Id", "X-Queue-Position",
           "X-Queue-Wait-Ms"}


@pytest.fixture(scope="module")
def cors_server(tmp_path_factory):
    keys = tmp_path_factory.mktemp("cors") / "keys.txt"
    keys.write_text(KEY + "\n")
    s = Server("--cors-allow-origin", ALLOWED, "--cors-allow-origin", OTHER, "--api-keys", str(keys))
    yield s
    assert s.stop() == 0, s.logs()


def cors_headers(r):
    return {k: v for k, v in r.headers.items() if k.lower().startswith("access-control-")}


def preflight(server, origin, path="/v1/completions", method="POST", headers="authorization, content-type"):
    h = {"Access-Control-Request-Method": method}
    if origin:
        h["Origin"] = origin
    if headers:
        h["Access-Control-Request-Headers"] = headers
    return requests.options(server.url + path, headers=h, timeout=30)


def assert_allowed(r, origin):
    assert r.headers.get("Access-Control-Allow-Origin") == origin, dict(r.headers)
    assert "Origin" in [v.strip() for v in r.headers.get("Vary", "").split(",")]
    exposed = {v.strip() for v in r.headers["Access-Control-Expose-Headers"].split(",")}
    assert exposed == EXPOSED


def test_preflight_from_an_allowed_origin_needs_no_key(cors_server):
    for origin in (ALLOWED, OTHER):
        r = preflight(cors_server, origin,
                      headers="Authorization, Content-Type, Idempotency-Key, X-Priority, X-Request-Id, bad header, x@y")
        assert r.status_code == 204, r.text
        assert r.content == b""
        assert "Content-Length" not in r.headers
        assert r.headers["Access-Control-Allow-Origin"] == origin
        assert r.headers["Vary"] == "Origin"
        methods = {m.strip() for m in r.headers["Access-Control-Allow-Methods"].split(",")}
        assert methods == {"GET", "POST", "OPTIONS"}
        allowed = [h.strip() for h in r.headers["Access-Control-Allow-Headers"].split(",")]
        assert allowed == ["Authorization", "Content-Type", "Idempotency-Key", "X-Priority", "X-Request-Id"]
        assert int(r.headers["Access-Control-Max-Age"]) > 0
    # A GET route's preflight too, and the origin is compared case-insensitively.
    r = preflight(cors_server, ALLOWED.upper().replace("HTTP://", "http://"), path="/v1/admission", method="GET",
                  headers=None)
    assert r.status_code == 204
    assert "Access-Control-Allow-Headers" not in r.headers


def test_preflight_from_another_origin_is_403_without_cors_headers(cors_server):
    for origin in (EVIL, None, "null"):
        r = preflight(cors_server, origin)
        assert r.status_code == 403, r.text
        assert r.json()["error"]["type"] == "forbidden"
        assert "--cors-allow-origin" in r.json()["error"]["message"]
        assert cors_headers(r) == {}


def test_allowed_origin_gets_headers_on_answers_errors_and_streams(cors_server):
    auth = {"Authorization": f"Bearer {KEY}", "Origin": ALLOWED}
    r = cors_server.post("/v1/completions", {"prompt": "Hi", "max_tokens": 2}, headers=auth)
    assert r.status_code == 200, r.text
    assert_allowed(r, ALLOWED)
    assert "X-Queue-Wait-Ms" in r.headers

    # Errors: 401 without a key, 400 on a bad body, 404 on an unknown route.
    r = cors_server.post("/v1/completions", {"prompt": "Hi"}, headers={"Origin": ALLOWED})
    assert r.status_code == 401
    assert_allowed(r, ALLOWED)
    r = cors_server.post("/v1/completions", {"prompt": "Hi", "max_tokens": -1}, headers=auth)
    assert r.status_code == 400
    assert_allowed(r, ALLOWED)
    r = cors_server.get("/nowhere", headers=auth)
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found"
    assert_allowed(r, ALLOWED)

    with requests.post(cors_server.url + "/v1/chat/completions", stream=True, timeout=60, headers=auth,
                       json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "stream": True}) as s:
        assert s.status_code == 200
        assert_allowed(s, ALLOWED)
        assert list(sse_events(s))[-1] == "[DONE]"


def test_disallowed_or_absent_origin_gets_no_cors_headers(cors_server):
    auth = {"Authorization": f"Bearer {KEY}"}
    for extra in ({"Origin": EVIL}, {}):
        r = cors_server.get("/v1/admission", headers={**auth, **extra})
        assert r.status_code == 200
        assert cors_headers(r) == {}
        assert r.headers["Vary"] == "Origin"  # the answer depends on Origin: caches must know


def test_plain_options_lists_the_methods(cors_server):
    r = requests.options(cors_server.url + "/v1/completions", timeout=30)
    assert r.status_code == 204
    assert r.headers["Allow"] == "POST, OPTIONS"
    r = requests.options(cors_server.url + "/health", timeout=30)
    assert r.headers["Allow"] == "GET, HEAD, OPTIONS"
    r = requests.options(cors_server.url + "/nowhere", headers={"Access-Control-Request-Method": "GET"}, timeout=30)
    assert r.status_code == 404


def test_without_the_flag_there_is_no_cors(server):
    r = server.post("/v1/completions", {"prompt": "Hi", "max_tokens": 2}, headers={"Origin": ALLOWED})
    assert r.status_code == 200
    assert cors_headers(r) == {}
    assert "Vary" not in r.headers
    r = preflight(server, ALLOWED)
    assert r.status_code == 403
    assert cors_headers(r) == {}


def test_config_file_key_and_bad_origins(tmp_path, make_server):
    path = tmp_path / "cors.toml"
    path.write_text(f'[http]\ncors_allow_origin = ["{OTHER}"]\n')
    s = make_server("--config", str(path))
    r = s.get("/v1/models", headers={"Origin": OTHER})
    assert r.headers["Access-Control-Allow-Origin"] == OTHER
    printed = subprocess.run([BIN, "serve", "--config", str(path), "--print-config"], capture_output=True, text=True,
                             timeout=60)
    assert printed.returncode == 0 and f'cors_allow_origin = "{OTHER}"' in printed.stdout, printed.stdout
    for bad in ("app.example", "http://app.example/", "ftp://app.example", "http://"):
        out = subprocess.run([BIN, "serve", "--cors-allow-origin", bad, "--port", "0"], capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 2, (bad, out.stderr)
        assert "--cors-allow-origin" in out.stderr and "not an origin" in out.stderr, out.stderr
