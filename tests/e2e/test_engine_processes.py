"""Engine processes: the default `serve` is a gateway that supervises an
engine process for its devices (one per device: test_engine_per_device.py). These tests kill, stop and share engines and
gateways with real processes on loopback, and check what clients see: every
request ends with its complete answer or one clear error, streams resume
without a repeated or lost token, and the device limit holds however many
gateways there are. Waits are on conditions the servers report."""
import concurrent.futures as cf
import json
import os
import signal
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import time

import pytest
import requests

from conftest import BIN, IN_PROCESS, MODEL_DIR, Server, wait_until

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
from server_process import ServerProcess  # noqa: E402

PROMPTS = [f"Once upon a time {i}" for i in range(16)]

pytestmark = pytest.mark.skipif(IN_PROCESS, reason="engine processes: the default mode only")


def engines(server):
    return server.get("/v1/engines").json()["data"]


def engine_pid(server):
    data = engines(server)
    assert len(data) == 1, data
    return data[0]["pid"]


def pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped) is not alive.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def complete(server, prompt, stream, max_tokens=40):
    """One greedy completion; returns (status, text or error body, headers)."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": stream}
    r = requests.post(server.url + "/v1/completions", json=body, stream=stream, timeout=120)
    if r.status_code != 200:
        return r.status_code, r.json(), r.headers
    if not stream:
        return 200, r.json()["choices"][0]["text"], r.headers
    text, finished, error = "", None, None
    for line in r.iter_lines():
        if not line.startswith(b"data: "):
            continue
        data = line[6:]
        if data == b"[DONE]":
            break
        chunk = json.loads(data)
        if "error" in chunk:
            error = chunk["error"]
            continue
        for c in chunk["choices"]:
            text += c["text"]
            finished = c.get("finish_reason") or finished
    if error:
        return 503 if error.get("type") == "overloaded" else 500, {"error": error}, r.headers
    assert finished in ("length", "stop"), (finished, text)
    return 200, text, r.headers


def metric(server, name):
    total = 0.0
    for line in server.get("/metrics").text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_kill_engine_under_load_resumes_every_request():
    s = Server("--test-step-delay-ms", "15", "--max-batch", "8")
    try:
        gateway_pid = s.proc.pid
        reference = {p: complete(s, p, stream=False)[1] for p in PROMPTS[:4]}
        # Same text for the other prompts from one fault-free pass (greedy).
        with cf.ThreadPoolExecutor(16) as pool:
            for p, (st, text, _) in zip(PROMPTS, pool.map(lambda p: complete(s, p, False), PROMPTS)):
                assert st == 200
                reference[p] = text
        wait_until(lambda: s.admission()["queued"] == 0 and s.admission()["running"] == 0, what="idle")
        idle_used = s.admission()["devices"][0]["used_bytes"]
        old_pid = engine_pid(s)

        with cf.ThreadPoolExecutor(16) as pool:
            futures = [pool.submit(complete, s, p, i % 2 == 0) for i, p in enumerate(PROMPTS)]
            # Kill it while streams are under way and others wait in the queue.
            wait_until(lambda: s.admission()["running"] >= 4, what="requests running")
            os.kill(old_pid, signal.SIGKILL)
            results = [f.result() for f in futures]
        for p, (status, text, headers) in zip(PROMPTS, results):
            if status == 503:
                assert "Retry-After" in headers, text
                continue
            assert status == 200, (p, status, text)
            assert text == reference[p], (p, text, reference[p])
        assert sum(1 for r in results if r[0] == 200) >= 12, [r[0] for r in results]
        assert s.proc.poll() is None and s.proc.pid == gateway_pid
        wait_until(lambda: engines(s)[0]["state"] == "ready", what="new engine ready")
        e = engines(s)[0]
        assert e["pid"] != old_pid and e["restarts"] == 1 and e["last_exit"] == "signal 9", e
        assert metric(s, "vramgate_engine_restarts_total") == 1
        assert metric(s, 'vramgate_requests_resumed_total{reason="resumed"}') >= 1
        assert "resumed on engine" in s.logs()
        wait_until(lambda: s.admission()["queued"] == 0 and s.admission()["running"] == 0, what="idle again")
        assert s.admission()["devices"][0]["used_bytes"] == idle_used
        assert complete(s, PROMPTS[0], True)[1] == reference[PROMPTS[0]]
    finally:
        assert s.stop() == 0, s.logs()


def test_gateway_killed_and_restarted_keeps_the_engine(tmp_path):
    runtime = str(tmp_path / "run")
    a = Server("--runtime-dir", runtime, "--test-step-delay-ms", "20")
    engine = engine_pid(a)
    with cf.ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(requests.post, a.url + "/v1/completions",
                               json={"prompt": p, "max_tokens": 200, "stream": True}, timeout=60, stream=True)
                   for p in PROMPTS[:4]]
        wait_until(lambda: a.admission()["running"] >= 2, what="requests running")
        a.proc.send_signal(signal.SIGKILL)  # the gateway only: its engine stays
        a.proc.wait()
        for f in futures:
            try:
                r = f.result()
                for _ in r.iter_lines():
                    pass
            except requests.RequestException:
                pass  # their gateway is gone
    assert pid_alive(engine)
    b = Server("--runtime-dir", runtime, "--test-step-delay-ms", "20")
    try:
        assert engine_pid(b) == engine
        assert "re-attached" in b.logs()
        assert "vramgate engine starting" not in b.logs()  # no second weight load
        # The vanished clients' work was cancelled.
        wait_until(lambda: b.admission()["running"] == 0 and b.admission()["queued"] == 0, what="cancelled")
        status, text, _ = complete(b, "Hello", stream=False, max_tokens=4)
        assert status == 200 and text
    finally:
        assert b.stop() == 0, b.logs()
    wait_until(lambda: not pid_alive(engine), what="the released engine to exit")


def test_two_gateways_share_one_engine_and_its_limit(tmp_path):
    sock = str(tmp_path / "e.sock")
    os.chmod(tmp_path, 0o700)
    engine = ServerProcess.__new__(ServerProcess)  # not an HTTP server: run it plainly
    proc = subprocess.Popen([BIN, "engine", "--model-dir", MODEL_DIR, "--device", "virt:0=64MiB", "--threads", "1",
                             "--max-batch", "4", "--test-step-delay-ms", "5", "--listen", "unix:" + sock],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    del engine
    try:
        wait_until(lambda: os.path.exists(sock) and os.path.exists(sock + ".secret"), what="engine socket and secret")
        assert stat.S_IMODE(os.stat(sock).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(sock + ".secret").st_mode) == 0o600
        g1 = Server("--engine", "unix:" + sock)
        g2 = Server("--engine", "unix:" + sock)
        try:
            budget = g1.admission()["devices"][0]["budget_bytes"]
            samples = []
            stop = False

            def sample():
                while not stop:
                    for g in (g1, g2):
                        d = g.admission()["devices"][0]
                        samples.append((d["reserved_bytes"], d["running"]))

            def call(i):
                g = (g1, g2)[i % 2]
                r = g.post("/v1/completions", {"prompt": PROMPTS[i % 16], "max_tokens": 24})
                return r.status_code, r.headers

            with cf.ThreadPoolExecutor(25) as pool:
                sampler = pool.submit(sample)
                results = list(pool.map(call, range(24)))  # 3x --max-batch from each side
                stop = True
                sampler.result()
            for status, headers in results:
                assert status in (200, 503), status
                if status == 503:
                    assert "Retry-After" in headers
            assert sum(1 for st, _ in results if st == 200) >= 8
            assert samples
            assert max(r for r, _ in samples) <= budget
            assert max(n for _, n in samples) <= 4
            # One ledger: both gateways see the same completed count.
            assert g1.admission()["completed"] == g2.admission()["completed"]
        finally:
            assert g1.stop() == 0 and g2.stop() == 0
        assert proc.poll() is None  # an engine given with --engine is not stopped by its gateways
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0



def test_the_gateway_renders_chats_and_tokenizes_prompts(tmp_path):
    # The engine's --chat-template says zephyr, the gateway's chatml: the
    # gateway renders and tokenizes, so the engine runs the ChatML prompt
    # (tinylm's byte tokenizer: one token per byte of the rendered text).
    sock = str(tmp_path / "e.sock")
    os.chmod(tmp_path, 0o700)
    with open(tmp_path / "engine.log", "w") as log:
        proc = subprocess.Popen([BIN, "engine", "--model-dir", MODEL_DIR, "--device", "virt:0=64MiB", "--threads", "1",
                                 "--chat-template", "zephyr", "--listen", "unix:" + sock],
                                stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: os.path.exists(sock) and os.path.exists(sock + ".secret"), what="engine socket and secret")
        g = Server("--engine", "unix:" + sock, "--chat-template", "chatml")
        try:
            assert "encodes the prompts of model 'tinylm'" in g.logs()
            r = g.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
            assert r.status_code == 200, r.text
            chatml = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
            zephyr = "<|user|>\nhi</s>\n<|assistant|>\n"
            assert len(chatml) != len(zephyr)
            assert r.json()["usage"]["prompt_tokens"] == len(chatml.encode())
            # A text prompt echoes exactly as sent (the engine saw its token ids).
            r = g.post("/v1/completions", {"prompt": "h\u00e9llo", "echo": True, "max_tokens": 1})
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["text"].startswith("h\u00e9llo")
            assert r.json()["usage"]["prompt_tokens"] == len("h\u00e9llo".encode())
            # A chat in a format no one knows is the gateway's 400.
            r = g.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                "chat_template": "no-such-format", "max_tokens": 2})
            assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request", r.text
        finally:
            assert g.stop() == 0
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0


def test_logprobs_from_an_engine_process_equal_those_of_one_process():
    # Bit for bit: a logprob crosses the engine socket as an exact decimal.
    body = {"prompt": "Hello there", "max_tokens": 12, "logprobs": 3, "echo": True, "temperature": 0}
    chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8, "logprobs": True,
            "top_logprobs": 2, "temperature": 0}
    answers = []
    for args in ((), ("--in-process",)):
        s = Server(*args)
        try:
            r = s.post("/v1/completions", body)
            c = s.post("/v1/chat/completions", chat)
            assert r.status_code == 200 and c.status_code == 200, (r.text, c.text)
            answers.append((r.json()["choices"], c.json()["choices"]))
        finally:
            assert s.stop() == 0
    assert answers[0][0][0]["logprobs"]["token_logprobs"][1] is not None
    assert answers[0] == answers[1]

def test_poison_request_ends_engine_crashed_and_others_complete():
    s = Server("--test-crash-on-prompt", "POISON", "--max-crash-retries", "2", "--test-step-delay-ms", "10")
    try:
        with cf.ThreadPoolExecutor(7) as pool:
            # The others run first; the poison joins their steps.
            others = [pool.submit(complete, s, p, i % 2 == 0, 40) for i, p in enumerate(PROMPTS[:6])]
            wait_until(lambda: s.admission()["running"] >= 6, what="the others running")
            poison = pool.submit(s.post, "/v1/completions", {"prompt": "a POISON pill", "max_tokens": 8},
                                 headers={"X-Request-Id": "poison-1"})
            r = poison.result()
            results = [f.result() for f in others]
        assert r.status_code == 500, r.text
        err = r.json()["error"]
        assert err["type"] == "engine_crashed" and "poison-1" in err["message"], err
        assert r.headers.get("x-should-retry") == "false"
        for status, text, headers in results:
            assert status == 200 or (status == 503 and "Retry-After" in headers), (status, text)
        assert all(r[0] == 200 for r in results), [r[:2] for r in results]
        wait_until(lambda: engines(s)[0]["state"] == "ready", what="engine up after the crashes")
        assert engines(s)[0]["restarts"] == 2
        assert complete(s, "Hello", False, 4)[0] == 200
    finally:
        assert s.stop() == 0, s.logs()


def test_stopped_engine_is_restarted_after_its_heartbeat_timeout():
    s = Server("--engine-heartbeat-timeout", "1")
    try:
        old = engine_pid(s)
        os.kill(old, signal.SIGSTOP)
        wait_until(lambda: engines(s)[0]["restarts"] == 1, what="a restart")
        wait_until(lambda: engines(s)[0]["state"] == "ready", what="the new engine")
        e = engines(s)[0]
        assert e["pid"] != old
        assert "heartbeat" in s.logs()
        assert not pid_alive(old)
        assert complete(s, "Hello", False, 4)[0] == 200
    finally:
        assert s.stop() == 0, s.logs()


def test_engine_that_dies_while_loading_backs_off_and_never_hangs():
    argv = [BIN, "serve", "--model-dir", MODEL_DIR, "--port", "0", "--threads", "1", "--test-engine-crash-at-start"]
    s = ServerProcess.__new__(ServerProcess)
    # Not ready ever: start it without waiting for /ready.
    proc_dir = tempfile.mkdtemp(prefix="vg-run-")
    proc = subprocess.Popen(argv + ["--runtime-dir", proc_dir], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    del s
    try:
        port = None
        lines = []
        deadline = time.monotonic() + 60
        while port is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            lines.append(line)
            if "listening on http://" in line:
                port = int(line.rsplit(":", 1)[1])
        assert port, "".join(lines)
        url = f"http://127.0.0.1:{port}"

        def restarts():
            return requests.get(url + "/v1/engines", timeout=10).json()["data"][0]["restarts"]

        wait_until(lambda: restarts() >= 3, timeout=60, what="three restarts")
        r = requests.get(url + "/ready", timeout=10)
        assert r.status_code == 503 and "engine on" in r.text, r.text
        r = requests.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}, timeout=10)
        assert r.status_code == 503 and int(r.headers["Retry-After"]) >= 1, r.text
        assert r.json()["error"]["type"] == "overloaded"
        proc.send_signal(signal.SIGTERM)
        out = proc.communicate(timeout=60)[0]
        log = "".join(lines) + out
        assert proc.returncode == 0, log
        # The delays grew: 0.5, 1, 2 s ...
        assert "restart 1 in 0.5 s" in log and "restart 3 in 2.0 s" in log, log
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def frame(obj):
    payload = json.dumps(obj).encode()
    return struct.pack(">I", len(payload)) + payload


def read_frame(sock):
    head = b""
    while len(head) < 4:
        chunk = sock.recv(4 - len(head))
        if not chunk:
            return None
        head += chunk
    n = struct.unpack(">I", head)[0]
    body = b""
    while len(body) < n:
        chunk = sock.recv(n - len(body))
        if not chunk:
            return None
        body += chunk
    return json.loads(body)


def test_a_reconnect_to_the_same_engine_process_counts_nothing_twice(tmp_path):
    # A stopped engine given with --engine is not killed: its gateway closes the link after the heartbeat
    # timeout and connects again once it runs. Its counters, carried over at the close, must leave the
    # carried sum when the same process reports them again.
    sock = str(tmp_path / "e.sock")
    os.chmod(tmp_path, 0o700)
    proc = subprocess.Popen([BIN, "engine", "--model-dir", MODEL_DIR, "--device", "virt:0=64MiB", "--threads", "1",
                             "--listen", "unix:" + sock], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: os.path.exists(sock) and os.path.exists(sock + ".secret"), what="engine socket and secret")
        g = Server("--engine", "unix:" + sock, "--engine-heartbeat-timeout", "1")
        try:
            for _ in range(3):
                assert complete(g, "Hello", False, 4)[0] == 200
            wait_until(lambda: g.admission()["completed"] == 3, what="3 completed")
            proc.send_signal(signal.SIGSTOP)
            try:
                wait_until(lambda: engines(g)[0]["state"] != "ready", what="the gateway to leave the stopped engine")
            finally:
                proc.send_signal(signal.SIGCONT)
            wait_until(lambda: engines(g)[0]["state"] == "ready", what="the same engine connected again")
            assert engines(g)[0]["pid"] == proc.pid
            assert complete(g, "Hello", False, 4)[0] == 200
            wait_until(lambda: g.admission()["completed"] >= 4, what="the fourth completion counted")
            st = g.admission()
            assert (st["admitted"], st["completed"], st["failed"], st["cancelled"]) == (4, 4, 0, 0), st
        finally:
            assert g.stop() == 0
    finally:
        proc.send_signal(signal.SIGCONT)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0


def test_engine_socket_refuses_a_wrong_secret_and_bad_frames():
    s = Server()
    try:
        sock_path = engines(s)[0]["address"][len("unix:"):]
        folder = os.path.dirname(sock_path)
        assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
        assert stat.S_IMODE(os.stat(sock_path).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(sock_path + ".secret").st_mode) == 0o600
        cases = [frame({"t": "hello", "v": 3, "secret": "wrong"}),
                 frame({"t": "hello", "v": 99, "secret": open(sock_path + ".secret").read()}),
                 frame({"t": "submit", "rid": 1}),
                 struct.pack(">I", 1 << 30),     # oversized
                 struct.pack(">I", 5) + b"nope!",  # not JSON
                 b"\x00\x00"]                    # truncated
        for data in cases:
            c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            c.settimeout(10)
            c.connect(sock_path)
            c.sendall(data)
            if data == b"\x00\x00":
                c.shutdown(socket.SHUT_WR)
            reply = read_frame(c)
            assert reply is None or reply["t"] == "refused", reply
            assert c.recv(1) == b""  # closed
            c.close()
        # The engine logs each refusal as it closes; the log reaches this
        # process through a pipe, a moment later.
        wait_until(lambda: "wrong or missing secret" in s.logs() and "protocol version mismatch" in s.logs(),
                   what="the refusals in the engine's log")
        # On a good gateway connection, a submit whose request the wire refuses is that request's 400,
        # and the connection stays; a message that is no request (an unknown type) closes it.
        c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        c.settimeout(10)
        c.connect(sock_path)
        c.sendall(frame({"t": "hello", "v": 3, "secret": open(sock_path + ".secret").read()}))
        assert read_frame(c)["t"] == "hello"
        c.sendall(frame({"t": "submit", "rid": 7, "request": {"prompt": "x", "max_tokens": -5}}))
        m = read_frame(c)
        while m is not None and m["t"] == "status":
            m = read_frame(c)
        assert m is not None and m["t"] == "rejected" and m["rid"] == 7, m
        assert m["error"]["type"] == "invalid_request" and "max_tokens" in m["error"]["message"], m
        c.sendall(frame({"t": "bogus"}))
        while True:
            m = read_frame(c)
            if m is None:
                break
            assert m["t"] == "status", m
        c.close()
        wait_until(lambda: "refused: \"max_tokens\"" in s.logs() and "unknown message type" in s.logs(),
                   what="the refused submit and the unknown message in the engine's log")
        # The engine never went down.
        assert engines(s)[0]["restarts"] == 0
        assert complete(s, "Hello", False, 4)[0] == 200
    finally:
        assert s.stop() == 0, s.logs()


PEER_AS_ANOTHER_USER = """
import os, socket, struct, sys
c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
c.settimeout(10)
c.connect(sys.argv[1])
hello = ('{"t":"hello","v":3,"secret":"%s"}' % os.environ["SECRET"]).encode()
try:
    c.sendall(struct.pack(">I", len(hello)) + hello)
    data = b""
    while True:
        chunk = c.recv(65536)
        if not chunk:
            break
        data += chunk
    print(data[4:].decode() if len(data) > 4 else "closed")
except ConnectionError:
    print("reset")
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="connecting as another user needs root")
def test_engine_socket_refuses_a_connection_from_another_user():
    """The engine checks its peer's uid (SO_PEERCRED) before it reads a byte:
    even with its folder and socket opened to everyone (a mistaken chmod),
    and with the right secret, a process of another user is told why, closed
    and logged."""
    s = Server()
    try:
        sock_path = engines(s)[0]["address"][len("unix:"):]
        folder = os.path.dirname(sock_path)
        with open(sock_path + ".secret") as f:
            secret = f.read().strip()
        os.chmod(folder, 0o755)
        os.chmod(sock_path, 0o777)
        try:
            peer = subprocess.run([sys.executable, "-c", PEER_AS_ANOTHER_USER, sock_path], user=65534, group=65534,
                                  env={"SECRET": secret}, capture_output=True, text=True, timeout=30)
        finally:
            os.chmod(sock_path, 0o600)
            os.chmod(folder, 0o700)
        assert peer.returncode == 0, peer.stdout + peer.stderr
        answer = json.loads(peer.stdout)
        assert answer["t"] == "refused" and f"uid {os.geteuid()}" in answer["reason"], answer
        wait_until(lambda: "refused a connection from uid 65534" in s.logs(), what="the refusal in the engine's log")
        assert engines(s)[0]["restarts"] == 0
        assert complete(s, "Hello", False, 4)[0] == 200
    finally:
        assert s.stop() == 0, s.logs()


def test_non_finite_logits_restart_the_engine_and_the_stream_resumes():
    # Step 12 of each engine process counts as producing NaN logits: the
    # first engine exits (status 3) mid-stream; the restarted one finishes
    # the stream within its first 12 steps.
    reference_server = Server("--in-process")
    try:
        reference = complete(reference_server, "Once upon a time", True, 20)[1]
    finally:
        assert reference_server.stop() == 0
    s = Server("--test-poison-logits-step", "12")
    try:
        status, text, _ = complete(s, "Once upon a time", True, 20)
        assert status == 200 and text == reference, (status, text, reference)
        wait_until(lambda: engines(s)[0]["state"] == "ready", what="the restarted engine")
        e = engines(s)[0]
        assert e["restarts"] == 1 and e["last_exit"] == "exit 3", e
        assert "are not finite" in s.logs() and "engine is poisoned" in s.logs()
    finally:
        assert s.stop() == 0, s.logs()


def test_tensor_requests_survive_an_engine_crash(tmp_path):
    """TorchScript requests go through the engine process too: killed while
    they run or wait, they are resubmitted and each ends 200 with the same
    outputs as before the crash."""
    tools = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools")
    subprocess.run(["/usr/bin/python3", os.path.join(tools, "make_torchscript_models.py"), str(tmp_path)],
                   check=True, stdout=subprocess.DEVNULL)
    s = Server("--test-step-delay-ms", "200", "--max-batch", "2", model_dir=str(tmp_path / "image_classifier"))
    try:
        assert engines(s)[0]["models"] == ["image_classifier"], engines(s)

        def infer(i):
            values = [((i * 7 + k) % 13) / 13.0 for k in range(3 * 96 * 96)]
            body = {"inputs": [{"name": "image", "shape": [1, 3, 96, 96], "datatype": "FP32", "data": values}]}
            r = requests.post(s.url + "/v2/models/image_classifier/infer", json=body, timeout=120)
            return r.status_code, r.json(), r.headers

        reference = {i: infer(i)[1]["outputs"] for i in range(6)}
        old_pid = engine_pid(s)
        before = s.admission()["admitted"]

        def all_in_the_engine():  # granted or queued: each of the 6 (one sent after the kill would get 503)
            a = s.admission()
            return a["admitted"] - before + a["queued"] >= 6 and a["queued"] >= 1

        with cf.ThreadPoolExecutor(6) as pool:
            futures = [pool.submit(infer, i) for i in range(6)]
            wait_until(all_in_the_engine, what="the tensor requests in the engine, some queued")
            os.kill(old_pid, signal.SIGKILL)
            results = [f.result() for f in futures]
        for i, (status, body, headers) in enumerate(results):
            assert status == 200, (i, status, body)
            assert body["outputs"] == reference[i], i
        wait_until(lambda: engines(s)[0]["state"] == "ready", what="new engine ready")
        e = engines(s)[0]
        assert e["pid"] != old_pid and e["restarts"] == 1, e
        assert metric(s, 'vramgate_requests_resumed_total{reason="resubmitted"}') >= 1
        wait_until(lambda: s.admission()["queued"] == 0 and s.admission()["running"] == 0, what="idle")
        assert s.admission()["devices"][0]["reserved_bytes"] == 0
    finally:
        assert s.stop() == 0, s.logs()


def test_a_device_fault_restarts_the_engine_and_the_stream_resumes():
    # At step 12 of each engine process the virtual device's next allocation
    # raises the c10::Error a CUDA fault raises ("CUDA error: an illegal
    # memory access was encountered"): the step fails, the error is
    # classified as a device fault (not out of memory, which is recovered in
    # place), and the engine exits with status 3; the restarted one resumes
    # the stream and finishes it within its first 12 steps.
    reference_server = Server("--in-process")
    try:
        reference = complete(reference_server, "Once upon a time", True, 20)[1]
    finally:
        assert reference_server.stop() == 0
    s = Server("--test-device-fault-step", "12")
    try:
        assert metric(s, "vramgate_engine_restarts_total") == 0
        status, text, _ = complete(s, "Once upon a time", True, 20)
        assert status == 200 and text == reference, (status, text, reference)
        wait_until(lambda: engines(s)[0]["state"] == "ready", what="the restarted engine")
        e = engines(s)[0]
        assert e["restarts"] == 1 and e["last_exit"] == "exit 3", e
        assert metric(s, "vramgate_engine_restarts_total") == 1
        assert metric(s, 'vramgate_requests_resumed_total{reason="resumed"}') >= 1
        logs = s.logs()
        assert "device fault in step 12" in logs and "an illegal memory access" in logs, logs
        assert "engine is poisoned" in logs
        assert "out of memory in step" not in logs  # not taken for an out-of-memory error
    finally:
        assert s.stop() == 0, s.logs()


def test_in_process_a_device_fault_fails_its_request_with_500_device_fault_and_the_server_goes_on():
    # One process: nothing to restart. The step's request ends with a clear
    # 500; the server keeps serving (a context that stayed broken would fail
    # the next steps the same way).
    s = Server("--in-process", "--test-device-fault-step", "5")
    try:
        status, body, _ = complete(s, "Once upon a time", False, 20)
        assert status == 500 and body["error"]["type"] == "device_fault", (status, body)
        assert "illegal memory access" in body["error"]["message"], body
        assert complete(s, "Hello", False, 4)[0] == 200
        assert s.get("/ready").status_code == 200
    finally:
        assert s.stop() == 0, s.logs()


def test_a_serve_with_other_settings_never_stops_an_engine_another_gateway_uses(tmp_path):
    """Two serves on one device and runtime folder with other settings: the
    second refuses to start (exit 1, naming the engine) and the first keeps
    its engine, its model and its settings file."""
    runtime = str(tmp_path / "run")
    a = Server("--runtime-dir", runtime)
    try:
        engine = engine_pid(a)
        proc = subprocess.run([BIN, "serve", "--model-dir", MODEL_DIR, "--port", "0", "--threads", "1",
                               "--runtime-dir", runtime, "--max-batch", "3"],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 1, proc.stdout + proc.stderr
        out = proc.stdout + proc.stderr
        assert f"(pid {engine}) runs other settings for 1 other gateway" in out, out
        assert pid_alive(engine) and engine_pid(a) == engine
        assert engines(a)[0]["restarts"] == 0
        assert complete(a, "Hello", False, 4)[0] == 200
        # Each settings file is named by its digest: the refused serve left
        # the first one's file as it was.
        tomls = sorted(p for p in os.listdir(runtime) if p.endswith(".toml"))
        assert len(tomls) == 2, tomls
    finally:
        assert a.stop() == 0, a.logs()


def test_a_serve_with_another_layout_stops_the_engine_left_on_its_device(tmp_path):
    """A serve killed with kill -9 leaves its engine running (engines outlive
    their gateway). A serve on the same runtime folder whose device list
    differs (another socket: here one engine over virt:0 and virt:1, then
    virt:0 alone) stops that engine and waits for it to exit before its own
    loads, instead of leaving it to hold the device until --orphan-timeout.
    An engine on another device is left alone."""
    runtime = str(tmp_path / "run")
    left = []  # engines whose gateway this test killed
    try:
        for devices in (["virt:0=64MiB,virt:1=64MiB", "--one-engine"], ["virt:5=64MiB"]):
            s = Server("--runtime-dir", runtime, "--device", *devices)
            left.append(engine_pid(s))
            s.proc.send_signal(signal.SIGKILL)
            s.proc.wait()
        old, kept = left
        assert pid_alive(old) and pid_alive(kept)
        b = Server("--runtime-dir", runtime, "--device", "virt:0=128MiB")
        try:
            assert not pid_alive(old)  # gone before b's engine loaded
            logs = b.logs()
            assert f"(pid {old}): it holds virt:0 with another layout of devices" in logs, logs
            assert f"(pid {kept})" not in logs, logs
            assert pid_alive(kept)
            assert engine_pid(b) not in (old, kept)
            assert complete(b, "Hello", False, 4)[0] == 200
        finally:
            assert b.stop() == 0, b.logs()
    finally:
        for pid in left:
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_device_written_another_way_is_the_same_engine(tmp_path):
    """virt:02=64MiB and virt:2=67108864 are one device with one size: a serve
    written the second way re-attaches to the engine the first left running
    (no second weight load), instead of starting another on that device."""
    runtime = str(tmp_path / "run")
    a = Server("--runtime-dir", runtime, "--device", "virt:02=64MiB")
    engine = engine_pid(a)
    try:
        a.proc.send_signal(signal.SIGKILL)
        a.proc.wait()
        b = Server("--runtime-dir", runtime, "--device", "virt:2=67108864")
        try:
            assert engine_pid(b) == engine and "re-attached" in b.logs(), b.logs()
            assert complete(b, "Hello", False, 4)[0] == 200
            sockets = [n for n in os.listdir(runtime) if n.endswith(".sock")]
            assert len(sockets) == 1, sockets
        finally:
            assert b.stop() == 0, b.logs()
    finally:
        if pid_alive(engine):
            os.kill(engine, signal.SIGKILL)


def test_two_gateways_that_supervise_one_engine_both_recover_when_it_dies(tmp_path):
    runtime = str(tmp_path / "run")
    a = Server("--runtime-dir", runtime)
    b = None
    try:
        b = Server("--runtime-dir", runtime)
        engine = engine_pid(a)
        assert engine_pid(b) == engine and "re-attached" in b.logs()
        os.kill(engine, signal.SIGKILL)
        # Both start a replacement; one takes the socket and the other attaches to it.
        wait_until(lambda: engines(a)[0]["state"] == "ready" and engines(b)[0]["state"] == "ready"
                   and engines(a)[0]["pid"] not in (0, engine), timeout=60, what="both gateways ready")
        wait_until(lambda: engines(a)[0]["pid"] == engines(b)[0]["pid"], what="one engine for both")
        for s in (a, b):
            assert s.status("/ready") == 200
            assert complete(s, "Hello", False, 4)[0] == 200
    finally:
        if b is not None:
            assert b.stop() == 0, b.logs()
        assert a.stop() == 0, a.logs()


def test_a_tensor_request_over_the_frame_limit_is_413_and_breaks_nothing(tmp_path):
    tools = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools")
    subprocess.run(["/usr/bin/python3", os.path.join(tools, "make_torchscript_models.py"), str(tmp_path)],
                   check=True, stdout=subprocess.DEVNULL)
    # The model's images up to 1024 x 1024: four of them are 48 MiB of
    # float32, 64 MiB as base64 (the binary extension keeps the body 48 MiB).
    folder = tmp_path / "image_to_image"
    with open(folder / "config.json") as f:
        config = json.load(f)
    config["dims"]["height"]["max"] = config["dims"]["width"]["max"] = 1024
    with open(folder / "config.json", "w") as f:
        json.dump(config, f)
    s = Server("--max-body-bytes", str(300 << 20), "--device", "virt:0=4GiB", model_dir=str(folder))
    try:
        engine = engine_pid(s)
        n = 4 * 3 * 1024 * 1024
        header = json.dumps({"inputs": [{"name": "image", "shape": [4, 3, 1024, 1024], "datatype": "FP32",
                                         "parameters": {"binary_data_size": n * 4}}]}).encode()
        body = header + struct.pack("<f", 0.5) * n
        r = requests.post(s.url + "/v2/models/image_to_image/infer", data=body, timeout=120,
                          headers={"Inference-Header-Content-Length": str(len(header)),
                                   "Content-Type": "application/octet-stream"})
        assert r.status_code == 413, r.text
        assert "engine wire" in r.json()["error"]["message"], r.text
        assert engine_pid(s) == engine and engines(s)[0]["restarts"] == 0
        assert "exceeds the limit" not in s.logs()
        small = {"inputs": [{"name": "image", "shape": [1, 3, 96, 96], "datatype": "FP32", "data": [0.5] * (3 * 96 * 96)}]}
        assert requests.post(s.url + "/v2/models/image_to_image/infer", json=small, timeout=120).status_code == 200
    finally:
        assert s.stop() == 0, s.logs()
