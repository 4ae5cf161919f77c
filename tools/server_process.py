"""One `vramgate serve` process on a free port, for the end-to-end tests, the
benchmarks, the soak and the GPU check: starts it with `--port 0`, keeps its
log lines, reads the port it prints, waits until /ready answers 200, and
stops it. Standard library only, so that the GPU check can use it on a
machine without the project's Python packages."""
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request

PORT_LINE = re.compile(r"listening on http://[^:]+:(\d+)")


def http_json(url, body=None, timeout=60, method=None):
    """(status, decoded JSON body or None) of one request to `url`, a POST of
    `body` as JSON when given, else a GET (or `method`); status 0, with an
    error body, when the server cannot be reached."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        try:
            return e.code, json.loads(e.read() or b"null")
        except ValueError:
            return e.code, None
    except (OSError, ValueError) as e:
        return 0, {"error": {"type": "connection", "message": str(e)}}


class ServerProcess:
    """`argv` is the whole command line (binary, "serve", flags) and must
    include `--port 0`. Raises RuntimeError, with the end of the log, when the
    server does not print its port within `start_timeout` seconds or does not
    turn ready within `ready_timeout` seconds after that. `keep_lines`
    bounds the log kept in memory (None: all of it); `log_path`, when given,
    also receives every log line as it comes."""

    def __init__(self, argv, env=None, start_timeout=120, ready_timeout=60, keep_lines=None, log_path=None):
        self.args = list(argv)
        # The engine processes `serve` starts get a runtime folder of their
        # own, so that no two servers share (re-attach to) one engine.
        self.runtime_dir = None
        if "serve" in self.args and "--in-process" not in self.args and "--runtime-dir" not in self.args:
            self.runtime_dir = tempfile.mkdtemp(prefix="vg-run-")
            self.args += ["--runtime-dir", self.runtime_dir]
        # Its own process group (in this session, so that its niceness and
        # autogroup stay ours): kill() ends the engine processes with the server.
        self.proc = subprocess.Popen(self.args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env=env, process_group=0)
        self.log = []
        self.port = None
        self.signalled = False
        log_file = open(log_path, "w") if log_path else None
        port_seen = threading.Event()

        def pump():
            for line in self.proc.stdout:
                if log_file:
                    log_file.write(line)
                    log_file.flush()
                self.log.append(line)
                if keep_lines is not None and len(self.log) > keep_lines:
                    del self.log[0]
                m = PORT_LINE.search(line)
                if m:
                    self.port = int(m.group(1))
                    port_seen.set()
            port_seen.set()
            if log_file:
                log_file.close()

        self.reader = threading.Thread(target=pump, daemon=True)
        self.reader.start()
        if not port_seen.wait(start_timeout) or self.port is None:
            self.kill()
            raise RuntimeError("server did not start:\n" + self.tail())
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + ready_timeout
        while self.status("/ready") != 200:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError("server never became ready:\n" + self.tail())
            time.sleep(0.05)  # polls the server's readiness, with a deadline

    def status(self, path, timeout=10):
        """HTTP status of GET `path`, or None when the server cannot be reached."""
        try:
            with urllib.request.urlopen(self.url + path, timeout=timeout) as r:
                return r.status
        except urllib.error.HTTPError as e:
            return e.code
        except OSError:
            return None

    def tail(self, lines=200):
        return "".join(self.log[-lines:])

    def send_signal_once(self, sig=signal.SIGTERM):
        """Sends `sig` once; stop() then only waits for the exit."""
        self.signalled = True
        self.proc.send_signal(sig)

    def stop(self, sig=signal.SIGTERM, timeout=60):
        """Signals the server (unless send_signal_once() did) and waits for its
        exit, killing it after `timeout` seconds. Returns the exit status."""
        if self.proc.poll() is None and not self.signalled:
            self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
        self.reader.join(5)
        self._remove_runtime_dir()
        return self.proc.returncode

    def kill(self):
        """Kills the server and every process of its session (its engines)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        self._remove_runtime_dir()

    def _remove_runtime_dir(self):
        if self.runtime_dir:
            shutil.rmtree(self.runtime_dir, ignore_errors=True)
