"""Redis for the end-to-end tests of Redis mode: redis-server on a free
loopback port with a temporary folder (persistence off unless asked for),
ready once it answers PING (polled with a deadline), and one-shot RESP
commands to look inside it."""
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import pytest


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def resp_command(port, *args, timeout=2.0):
    """One command over a fresh connection (RESP); the first reply line."""
    payload = f"*{len(args)}\r\n".encode()
    for a in args:
        b = a.encode() if isinstance(a, str) else a
        payload += f"${len(b)}\r\n".encode() + b + b"\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(payload)
        data = b""
        while not data.endswith(b"\r\n"):
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
    return data.decode(errors="replace").split("\r\n")[0]


class RedisServer:
    """redis-server on a free loopback port with a temporary folder, ready
    once it answers PING (polled with a deadline)."""

    def __init__(self, appendfsync=None):
        """appendfsync: None for no persistence, or "always" / "everysec" (an
        append-only file in the temporary folder, kept across kill and start)."""
        self.appendfsync = appendfsync
        self.binary = shutil.which("redis-server")
        if self.binary is None:
            pytest.fail("redis-server is not on PATH: these tests start their own Redis. Install the Debian "
                        "package redis-server (scripts/install-deps --test does).")
        self.dir = tempfile.mkdtemp(prefix="vg-redis-")
        self.port = free_port()
        self.start()

    def start(self):
        """Starts it (again, on the same port) and waits until it answers PING."""
        self.paused = False
        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.dir, "--save", "",
             *(["--appendonly", "yes", "--appendfsync", self.appendfsync] if self.appendfsync else
               ["--appendonly", "no"]),
             "--daemonize", "no", "--logfile", os.path.join(self.dir, "redis.log")],
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 10
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError("redis-server exited at start-up:\n" + self.log())
            try:
                if resp_command(self.port, "PING", timeout=0.5) == "+PONG":
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("redis-server did not answer PING within 10 s:\n" + self.log())
            time.sleep(0.01)  # polls the server's PING, with a deadline

    @property
    def url(self):
        return f"redis://127.0.0.1:{self.port}"

    def log(self):
        try:
            with open(os.path.join(self.dir, "redis.log")) as f:
                return f.read()[-2000:]
        except OSError:
            return ""

    def pause(self):
        self.proc.send_signal(signal.SIGSTOP)
        self.paused = True

    def resume(self):
        self.proc.send_signal(signal.SIGCONT)
        self.paused = False

    def kill(self):
        """SIGKILL, as a crash; start() brings it back on the same port."""
        if self.proc.poll() is None:
            if self.paused:
                self.resume()
            self.proc.kill()
            self.proc.wait()

    def stop(self):
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


