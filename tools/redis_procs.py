"""Processes of Redis mode for the end-to-end tests and the benchmarks:
redis-server on a free loopback port with a temporary folder (persistence
off unless asked for), ready once it answers PING (polled with a deadline),
one-shot RESP commands to look inside it, and `vramgate engine` processes
whose output is kept for the caller to read."""
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time


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


class Pausable:
    """pause() / resume() of self.proc with SIGSTOP / SIGCONT (a stall)."""

    paused = False

    def pause(self):
        self.proc.send_signal(signal.SIGSTOP)
        self.paused = True

    def resume(self):
        self.proc.send_signal(signal.SIGCONT)
        self.paused = False


class RedisServer(Pausable):
    """redis-server on a free loopback port with a temporary folder, ready
    once it answers PING. kill() is a crash; start() brings it back on the
    same port (and, with appendfsync, the same append-only file); stop()
    ends it and removes its folder."""

    def __init__(self, appendfsync=None, prefix="vg-redis-"):
        """appendfsync: None for no persistence, or "always" / "everysec"."""
        self.appendfsync = appendfsync
        self.binary = shutil.which("redis-server")
        if self.binary is None:
            raise RuntimeError("redis-server is not on PATH: Redis mode's tests and benchmarks start their own "
                               "Redis. Install the Debian package redis-server (scripts/install-deps --test does).")
        self.dir = tempfile.mkdtemp(prefix=prefix)
        self.port = free_port()
        self.proc = None
        self.start()

    def start(self):
        """Starts it (again, on the same port) and waits until it answers PING."""
        self.paused = False
        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.dir, "--save", "",
             *(["--appendonly", "yes", "--appendfsync", self.appendfsync] if self.appendfsync else
               ["--appendonly", "no"]),
             "--daemonize", "no", "--logfile", os.path.join(self.dir, "redis.log")],
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, process_group=0)
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
            time.sleep(0.005)  # polls the server's PING, with a deadline

    @property
    def url(self):
        return f"redis://127.0.0.1:{self.port}"

    def log(self):
        try:
            with open(os.path.join(self.dir, "redis.log")) as f:
                return f.read()[-3000:]
        except OSError:
            return ""

    def kill(self):
        """SIGKILL, as a crash; start() brings it back on the same port."""
        if self.proc and self.proc.poll() is None:
            if self.paused:
                self.resume()
            self.proc.kill()
            self.proc.wait()

    def stop(self):
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


class EngineProcess(Pausable):
    """`vramgate engine` on the socket `sock` (its folder must exist, mode
    0700), its output kept (logs())."""

    def __init__(self, binary, model_dir, sock, redis_url, device="virt:0=64MiB", *extra, threads="1"):
        self.sock = sock
        self.argv = [binary, "engine", "--model-dir", model_dir, "--device", device, "--threads", threads,
                     "--listen", "unix:" + sock, *(["--queue", redis_url] if redis_url else []), *extra]
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     process_group=0)
        self.lines = []
        self.paused = False

        def pump():
            for line in self.proc.stdout:
                self.lines.append(line)

        self.reader = threading.Thread(target=pump, daemon=True)
        self.reader.start()

    @property
    def pid(self):
        return self.proc.pid

    def logs(self):
        return "".join(self.lines)

    def wait_listening(self, timeout=60):
        """Until it serves on its socket; RuntimeError if it exits first or the deadline passes."""
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None and "engine serving on" not in self.logs():
            if time.monotonic() > deadline:
                raise RuntimeError(f"the engine did not serve on its socket within {timeout} s")
            time.sleep(0.02)  # polls its log, with a deadline
        if self.proc.poll() is not None:
            raise RuntimeError("engine exited at start-up:\n" + self.logs()[-3000:])

    def kill(self):
        if self.proc.poll() is None:
            if self.paused:
                self.resume()
            self.proc.kill()
        self.proc.wait()
        self.reader.join(5)

    def stop(self):
        """SIGTERM (a drain), then SIGKILL after 30 s."""
        if self.proc.poll() is None:
            if self.paused:
                self.resume()
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.reader.join(5)
