"""Hostile HTTP against the real binary: oversized headers, URLs and bodies,
slow-loris headers, pipelining, invalid UTF-8, huge max_tokens, deeply nested
JSON, odd content types, thousands of idle connections. Each gets a bounded,
clear answer or a closed connection, and the server keeps serving others
(checked with a normal request during or after each case)."""
import json
import resource
import select
import socket
import time

import pytest

from conftest import Server, wait_until

SMALL = {"prompt": "Hi", "max_tokens": 2}


@pytest.fixture(scope="module")
def hostile():
    s = Server("--max-body-bytes", "65536", "--read-timeout", "2")
    yield s
    assert s.stop() == 0, s.logs()


def connect(server):
    return socket.create_connection(("127.0.0.1", server.port), timeout=30)


def read_response(sock, buf=b""):
    """Reads one Content-Length response from `sock`; returns (status, headers,
    body, rest of the bytes read). Status 0 when the server closed first."""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            return 0, {}, b"", b""
        buf += chunk
    head, buf = buf.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, v in (l.split(":", 1) for l in lines[1:])}
    length = int(headers.get("content-length", "0"))
    while len(buf) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        buf += chunk
    return status, headers, buf[:length], buf[length:]


def raw(server, data):
    """Sends `data` on a new connection; returns (status, parsed JSON body or None)."""
    with connect(server) as s:
        s.sendall(data)
        status, _, body, _ = read_response(s)
    return status, (json.loads(body) if body else None)


def error_type(body):
    return body["error"]["type"]


def post_raw(server, body_bytes, content_type="application/json", path="/v1/completions"):
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body_bytes)}\r\n"
    if content_type is not None:
        head += f"Content-Type: {content_type}\r\n"
    return raw(server, head.encode() + b"Connection: close\r\n\r\n" + body_bytes)


def serves(server):
    r = server.post("/v1/completions", SMALL)
    assert r.status_code == 200, r.text
    return True


def readable(socks, timeout):
    """The sockets of `socks` that turn readable within `timeout` s (poll:
    file descriptors may exceed select()'s 1024)."""
    poller = select.poll()
    by_fd = {s.fileno(): s for s in socks}
    for fd in by_fd:
        poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    return [by_fd[fd] for fd, _ in poller.poll(timeout * 1000)]


def closed_by_peer(sock, timeout):
    """True when the server closes `sock` (EOF or reset) within `timeout` s."""
    if not readable([sock], timeout):
        return False
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_oversized_header_is_431(hostile):
    status, body = raw(hostile, b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"b" * 20000 + b"\r\n\r\n")
    assert status == 431 and error_type(body) == "header_too_large", body
    many = b"".join(b"X-%d: v\r\n" % i for i in range(3000))
    status, body = raw(hostile, b"GET /health HTTP/1.1\r\n" + many + b"\r\n")
    assert status == 431 and error_type(body) == "header_too_large", body
    assert serves(hostile)


@pytest.mark.parametrize("length", [9000, 40000])  # within and beyond the 16 KiB header limit
def test_oversized_url_is_414(hostile, length):
    status, body = raw(hostile, b"GET /health?q=" + b"a" * length + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    assert status == 414 and error_type(body) == "uri_too_long", body
    assert serves(hostile)


def test_oversized_body_is_413(hostile):
    status, body = post_raw(hostile, b'{"prompt": "' + b"a" * 70000 + b'"}')
    assert status == 413 and error_type(body) == "body_too_large", body
    # A declared length over the limit is refused before the body is sent.
    status, body = raw(hostile, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 999999999\r\n\r\n")
    assert status == 413 and error_type(body) == "body_too_large", body
    assert serves(hostile)


def test_slow_loris_headers_get_408(hostile):
    """Headers trickled a byte at a time never complete: the read deadline
    covers the whole request, not each read, so 408 comes and the connection
    closes, while other clients are served meanwhile."""
    s = connect(hostile)
    s.sendall(b"GET /health HTTP/1.1\r\n")
    trickle = b"X-Slow: " + b"z" * 10000
    got = b""
    deadline = time.monotonic() + 60
    for i in range(len(trickle)):
        if time.monotonic() > deadline:
            break
        try:
            s.sendall(trickle[i:i + 1])
        except (BrokenPipeError, ConnectionResetError):
            break
        if readable([s], 0.1):  # the client's pace: one byte per 0.1 s
            got = s.recv(65536)
            break
        if i == 3:
            assert serves(hostile)  # others are served while the slow client holds its connection
    status, _, body, _ = read_response(s, got)
    assert status == 408 and error_type(json.loads(body)) == "request_timeout", (status, body)
    assert closed_by_peer(s, 30)
    s.close()
    assert serves(hostile)


def test_pipelined_requests_are_answered_in_order(hostile):
    infer = json.dumps({"prompt": "Hello", "max_tokens": 3}).encode()
    data = (b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
            b"POST /infer HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
            b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n"
            b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n") % (len(infer), infer)
    with connect(hostile) as s:
        s.sendall(data)
        answers, rest = [], b""
        for _ in range(4):
            status, _, body, rest = read_response(s, rest)
            answers.append((status, json.loads(body)))
    assert [a[0] for a in answers] == [200, 200, 404, 200], answers
    assert answers[0][1]["status"] == "ok"
    assert "result" in answers[1][1]
    assert answers[3][1]["object"] == "list"


def test_invalid_utf8_in_prompt_is_400(hostile):
    status, body = post_raw(hostile, b'{"prompt": "abc \xff\xfe \xc3", "max_tokens": 4}')
    assert status == 400 and error_type(body) == "invalid_request", body
    # A lone surrogate escape is well-formed JSON text: it is answered with a
    # clear result either way, never a 5xx, and the answer is valid JSON.
    status, body = post_raw(hostile, b'{"prompt": "abc \\ud800 def", "max_tokens": 4}')
    assert status in (200, 400), body
    assert serves(hostile)


@pytest.mark.parametrize("max_tokens", ["1000000", "2147483648", "1e300", "1e400", "99999999999999999999999"])
def test_huge_max_tokens_is_400(hostile, max_tokens):
    status, body = post_raw(hostile, b'{"prompt": "Hi", "max_tokens": %s}' % max_tokens.encode())
    assert status == 400 and error_type(body) == "invalid_request", body
    assert "max_tokens" in body["error"]["message"] or "JSON" in body["error"]["message"], body
    assert serves(hostile)


# Each document stays under the 64 KiB body limit of the fixture.
@pytest.mark.parametrize("doc", [b"[" * 60000, b'{"prompt": ' + b"[" * 30000 + b"]" * 30000 + b"}",
                                 b'{"a":' * 10000 + b"1" + b"}" * 10000])
def test_deeply_nested_json_is_400(hostile, doc):
    status, body = post_raw(hostile, doc)
    assert status == 400 and error_type(body) == "invalid_request", body
    assert serves(hostile)


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded",
                                          "application/json; charset=utf-8"])
def test_any_content_type_is_read_as_json(hostile, content_type):
    """Bodies are read as JSON whatever Content-Type says (curl -d sends
    form-urlencoded): a JSON body succeeds, anything else is a 400."""
    status, body = post_raw(hostile, json.dumps(SMALL).encode(), content_type)
    assert status == 200, body
    status, body = post_raw(hostile, b"--xyz\r\nContent-Disposition: form-data; name=prompt\r\n\r\nHi\r\n--xyz--",
                            content_type="multipart/form-data; boundary=xyz")
    assert status == 400 and error_type(body) == "invalid_request", body


def test_thousands_of_idle_connections(make_server):
    """Beyond --max-connections new connections are closed at once while the
    open ones keep working; idle connections close after --idle-timeout."""
    cap, idle_timeout = 40, 10
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 2000
    if soft < want + 200:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, want + 200), hard))
        soft = min(hard, want + 200)
    n = min(want, soft - 200)
    server = make_server("--max-connections", str(cap), "--idle-timeout", str(idle_timeout))
    socks = []
    try:
        for _ in range(n):
            socks.append(connect(server))
        # The server closes all but `cap` of them at once.
        open_socks, deadline = list(socks), time.monotonic() + 60
        while len(open_socks) > cap and time.monotonic() < deadline:
            for s in readable(open_socks, 1):
                if closed_by_peer(s, 0):
                    open_socks.remove(s)
        assert len(open_socks) <= cap
        assert len(open_socks) >= cap - 5  # nearly every slot went to a flood connection
        # The connections that were kept are served.
        for s in open_socks:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        for s in open_socks:
            status, _, body, _ = read_response(s)
            assert status == 200, body
        # Idle, they are closed after the idle timeout.
        for s in open_socks:
            assert closed_by_peer(s, idle_timeout + 30)
    finally:
        for s in socks:
            s.close()
    wait_until(lambda: server.get("/health").status_code == 200, what="served after the flood")
    assert serves(server)
    assert "connection refused" in server.logs()
