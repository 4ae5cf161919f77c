"""Timeouts, disconnects, overload and shutdown against the real binary.
Slow steps come from the --test-step-delay-ms hook; the tests wait on the
server's own state (/v1/admission), never on sleeps."""
import json
import signal
import socket
import threading

import requests

from conftest import sse_events, wait_until
from scenario_util import idle, open_request as raw_request


def test_partial_body_gets_408_and_nothing_is_reserved(make_server):
    server = make_server("--read-timeout", "1")
    s = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 10000\r\n\r\n" + b"{" + b" " * 999)
    reply = b""
    while b"\r\n\r\n" not in reply:
        chunk = s.recv(4096)
        if not chunk:
            break
        reply += chunk
    assert reply.startswith(b"HTTP/1.1 408"), reply
    s.close()
    assert idle(server)
    r = server.post("/v1/completions", {"prompt": "Hi", "max_tokens": 2})
    assert r.status_code == 200


def test_client_closing_a_stream_stops_the_work(make_server):
    server = make_server("--test-step-delay-ms", "20")
    r = requests.post(server.url + "/v1/completions", json={"prompt": "The", "max_tokens": 200, "stream": True, "ignore_eos": True},
                      stream=True, timeout=60)
    events = sse_events(r)
    for _ in range(5):
        next(events)
    r.close()
    wait_until(lambda: idle(server), what="work stopped after client close")
    wait_until(lambda: "client closed" in server.logs(), what="client-closed log line")
    closed = [ln.split() for ln in server.log if "client closed" in ln]
    assert all(parts[1] == "info" for parts in closed), closed
    ok = server.post("/v1/completions", {"prompt": "Hi", "max_tokens": 2})
    assert ok.status_code == 200


def test_client_closing_a_plain_request_stops_the_work(make_server):
    server = make_server("--test-step-delay-ms", "20")
    s = raw_request(server.port, {"prompt": "The", "max_tokens": 200, "ignore_eos": True})
    wait_until(lambda: server.admission()["running"] == 1, what="request running")
    s.close()
    wait_until(lambda: idle(server), what="work stopped after client close")


def test_total_deadline_gives_504(make_server):
    server = make_server("--test-step-delay-ms", "20")
    r = server.post("/v1/completions", {"prompt": "The", "max_tokens": 200, "timeout": 0.3, "ignore_eos": True})
    assert r.status_code == 504, r.text
    assert r.json()["error"]["type"] == "timeout"
    wait_until(lambda: idle(server), what="idle after timeout")


def test_queue_full_gets_503_with_retry_after(make_server):
    server = make_server("--test-step-delay-ms", "20", "--max-batch", "1", "--max-queue", "1")
    running = raw_request(server.port, {"prompt": "A", "max_tokens": 200, "ignore_eos": True})
    wait_until(lambda: server.admission()["running"] == 1, what="first running")
    queued = raw_request(server.port, {"prompt": "B", "max_tokens": 200, "ignore_eos": True})
    wait_until(lambda: server.admission()["queue_depth"] == 1, what="second queued")
    for stream in (False, True):
        r = server.post("/v1/completions", {"prompt": "C", "max_tokens": 5, "stream": stream})
        assert r.status_code == 503, r.text
        assert r.json()["error"]["type"] == "overloaded"
        assert int(r.headers["Retry-After"]) >= 1
    running.close()
    queued.close()
    wait_until(lambda: idle(server), what="idle after clients left")


def stream_in_background(server, body):
    """Starts a streaming completion on a thread and waits until it runs;
    returns the thread and a dict that receives its SSE payloads."""
    result = {}

    def client():
        with requests.post(server.url + "/v1/completions", json=dict(body, stream=True), stream=True,
                           timeout=60) as r:
            result["payloads"] = list(sse_events(r))

    t = threading.Thread(target=client)
    t.start()
    wait_until(lambda: server.admission()["running"] == 1, what="stream running")
    return t, result


def test_sigterm_finishes_in_flight_work_and_exits_0(make_server):
    server = make_server("--test-step-delay-ms", "5", "--shutdown-grace", "30")
    t, result = stream_in_background(server, {"prompt": "The", "max_tokens": 60, "temperature": 0})
    server.send_signal_once(signal.SIGTERM)
    t.join(60)
    assert server.stop() == 0, server.logs()
    assert result["payloads"][-1] == "[DONE]"
    last = json.loads(result["payloads"][-2])
    assert last["choices"][0]["finish_reason"] in ("stop", "length"), last


def test_sigterm_drains_in_stages(make_server):
    """Not ready and new completions refused (503 + Retry-After) while the
    listener stays open; the in-flight stream finishes; exit 0."""
    server = make_server("--test-step-delay-ms", "50", "--shutdown-grace", "30")
    t, result = stream_in_background(server, {"prompt": "The", "max_tokens": 100, "ignore_eos": True})
    server.send_signal_once(signal.SIGTERM)
    wait_until(lambda: server.get("/ready").status_code == 503, what="/ready 503 while draining")
    assert server.admission()["running"] == 1, "the stream should still be draining"
    for stream in (False, True):
        r = server.post("/v1/completions", {"prompt": "new", "max_tokens": 2, "stream": stream})
        assert r.status_code == 503, r.text
        assert r.json()["error"]["type"] == "overloaded"
        assert int(r.headers["Retry-After"]) >= 1
    assert server.get("/health").status_code == 200
    t.join(60)
    assert server.stop() == 0, server.logs()
    assert result["payloads"][-1] == "[DONE]"
    last = json.loads(result["payloads"][-2])
    assert last["choices"][0]["finish_reason"] == "length", last
    assert last["usage"]["completion_tokens"] == 100
    logs = server.logs()
    assert logs.index("drain finished") < logs.index("stopped accepting connections"), logs


def test_sigterm_during_start_up_exits_0():
    import subprocess
    from conftest import BIN, MODEL_DIR
    proc = subprocess.Popen([BIN, "serve", "--model-dir", MODEL_DIR, "--port", "0"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if "vramgate starting" in line:  # the model is not loaded yet
            proc.send_signal(signal.SIGTERM)
            break
    lines += proc.stdout.readlines()
    assert proc.wait(60) == 0, "".join(lines)
    assert any("received SIGTERM" in ln for ln in lines), "".join(lines)
