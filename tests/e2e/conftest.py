"""End-to-end fixtures: start the real vramgate binary on a free port, wait for
/ready, and stop it with SIGTERM. Tests wait on conditions the server reports,
never on sleeps."""
import os
import sys
import time

import pytest
import requests

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
from server_process import ServerProcess  # noqa: E402

BIN = os.environ.get("VRAMGATE_BIN", "build/release/vramgate")
MODEL_DIR = os.environ.get("VRAMGATE_MODEL_DIR", "models/tinylm")
# VRAMGATE_E2E_IN_PROCESS=1: every server runs --in-process (HTTP and the
# engines in one process) instead of the default gateway + engine processes,
# and reserves KV cache blocks for the worst case (--kv-reservation full)
# instead of on demand, so that the suites run under both policies.
IN_PROCESS = os.environ.get("VRAMGATE_E2E_IN_PROCESS") == "1"
MODE_ARGS = ["--in-process", "--kv-reservation", "full"] if IN_PROCESS else []
# Fixtures that start a server in the run's mode (MODE_ARGS).
MODE_FIXTURES = {"server", "make_server"}


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "same_in_both_modes: starts no server in the run's mode (no Server, no MODE_ARGS), so the "
                   "--in-process run would repeat the default run exactly; only the default run runs it")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("same_in_both_modes") is None:
            continue
        if MODE_FIXTURES & set(getattr(item, "fixturenames", ())):
            raise pytest.UsageError(f"{item.nodeid} is marked same_in_both_modes but starts a server in the "
                                    f"run's mode (fixture {sorted(MODE_FIXTURES & set(item.fixturenames))})")
        if IN_PROCESS:
            item.add_marker(pytest.mark.skip(reason="the same in both modes: the default-mode run runs it"))


class Server(ServerProcess):
    def __init__(self, *extra_args, model_dir=None):
        super().__init__([BIN, "serve", "--model-dir", model_dir or MODEL_DIR, "--port", "0", "--threads", "1",
                          *MODE_ARGS, *extra_args])
        # /ready turns 200 once an engine serves each model; with a process
        # per device the others may still be loading. Tests start with every
        # engine up (or left out: it could not start). With --api-keys
        # (tests that count unauthorized requests; one device) /v1/engines
        # is not asked.
        if "--api-keys" in extra_args:
            return
        try:
            wait_until(self.engines_settled, what="every engine ready or left out")
        except AssertionError:
            self.stop()
            raise

    def engines(self):
        return self.get("/v1/engines").json()["data"]

    def engines_settled(self):
        r = self.get("/v1/engines")
        if r.status_code == 401:  # API keys from a config file: one device in those tests
            return True
        assert r.status_code == 200, r.text
        return all(e["state"] in ("ready", "gone") for e in r.json()["data"])

    def get(self, path, **kw):
        return requests.get(self.url + path, timeout=kw.pop("timeout", 60), **kw)

    def post(self, path, body=None, **kw):
        return requests.post(self.url + path, json=body, timeout=kw.pop("timeout", 120), **kw)

    def admission(self):
        return self.get("/v1/admission").json()

    def logs(self):
        return "".join(self.log)


def wait_until(cond, timeout=60.0, what="condition"):
    """Polls `cond` until it is true; fails after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            if cond():
                return
        except requests.RequestException as e:  # server still starting
            last = e
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what} ({last})")


@pytest.fixture(scope="module")
def server():
    s = Server()
    yield s
    assert s.stop() == 0, s.logs()


@pytest.fixture
def make_server():
    started = []

    def make(*args, **kw):
        s = Server(*args, **kw)
        started.append(s)
        return s

    yield make
    for s in started:
        s.stop()


def sse_events(resp):
    """Yields the data payloads of an SSE response, as strings. Lines end at
    CR or LF only, so the bytes are split before decoding (str.splitlines
    would also split at U+2028 or U+0085 inside JSON strings)."""
    for raw in resp.iter_lines():
        line = raw.decode("utf-8")
        if line and line.startswith("data: "):
            yield line[len("data: "):]
