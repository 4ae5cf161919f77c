"""The live page at GET / against the real binary: served from the binary with
a strict Content-Security-Policy and no URL of another host, and, in headless
Chromium, drawing the same budget, reserved bytes and queue depth as
/v1/admission reports, before load and while requests are held queued
(--test-step-delay-ms keeps them running, so the state is stable while both
are read). Writes screenshots under the build tree (e2e-artifacts/)."""
import os
import re
import shutil
import subprocess
import tempfile
from html.parser import HTMLParser

import pytest
import requests

from conftest import BIN, Server, wait_until
from scenario_util import body_for_tokens, open_request

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = os.path.join(os.path.dirname(os.path.abspath(BIN)), "e2e-artifacts")
PAGE_FILES = ("/", "/page/app.js", "/page/app.css")
URL_RE = re.compile(r"(?:https?:)?//[A-Za-z0-9]", re.I)


def test_page_is_served_with_a_strict_policy(server):
    r = server.get("/")
    assert r.status_code == 200
    assert r.headers["Content-Type"] == "text/html; charset=utf-8"
    csp = r.headers["Content-Security-Policy"]
    assert csp.startswith("default-src 'self';")
    for directive in ("script-src 'self'", "style-src 'self'", "connect-src 'self'", "frame-ancestors 'none'"):
        assert directive in csp, csp
    assert "unsafe" not in csp and "http" not in csp
    assert r.headers["X-Content-Type-Options"] == "nosniff"
    assert 'id="queue-depth"' in r.text and 'data-loaded="0"' in r.text
    assert server.get("/index.html").text == r.text
    assert server.get("/page/app.js").headers["Content-Type"] == "text/javascript; charset=utf-8"
    assert server.get("/page/app.css").headers["Content-Type"] == "text/css; charset=utf-8"
    assert requests.head(server.url + "/", timeout=30).status_code == 200


def test_page_files_name_no_other_host(server):
    for path in PAGE_FILES:
        text = server.get(path).text
        urls = [text[m.start():m.start() + 60] for m in URL_RE.finditer(text)]
        assert urls == [], (path, urls)
        assert "@import" not in text and "fonts." not in text


def test_unknown_routes_stay_404_json_and_the_page_takes_get_only(server):
    r = server.get("/index.htm")
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found"
    r = server.get("/page/other.js")
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found"
    r = server.post("/", {})
    assert r.status_code == 405 and r.headers["Allow"] == "GET, HEAD"
    assert r.json()["error"]["type"] == "method_not_allowed"


def test_page_needs_no_api_key(make_server, tmp_path):
    keys = tmp_path / "keys.txt"
    keys.write_text("sk-page-1\n")
    s = make_server("--api-keys", str(keys))
    assert s.get("/").status_code == 200
    assert s.get("/page/app.js").status_code == 200
    assert s.get("/v1/admission").status_code == 401


# -- in a browser ------------------------------------------------------------

class NumberScraper(HTMLParser):
    """Collects data-value of elements with an id, and of data-field elements
    per enclosing data-device section."""

    def __init__(self):
        super().__init__()
        self.by_id, self.devices, self.body = {}, {}, {}
        self.stack = []  # data-device of each open element
        self.output, self.output_attrs, self.in_output = "", {}, False
        self.waiting = []  # data-position of each row of the waiting-requests table

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        device = a.get("data-device") or (self.stack[-1] if self.stack else None)
        if tag not in ("meta", "link", "input", "br", "img"):
            self.stack.append(device)
        if tag == "body":
            self.body = a
        if tag == "tr" and "data-position" in a:
            self.waiting.append(int(a["data-position"]))
        if a.get("id") == "completion-output":
            self.output_attrs, self.in_output = a, True
        if "data-value" in a:
            if "id" in a:
                self.by_id[a["id"]] = a["data-value"]
            if "data-field" in a and device:
                self.devices.setdefault(device, {})[a["data-field"]] = a["data-value"]

    def handle_data(self, data):
        if self.in_output:
            self.output += data

    def handle_endtag(self, tag):
        if tag == "pre":
            self.in_output = False
        if tag not in ("meta", "link", "input", "br", "img") and self.stack:
            self.stack.pop()


def chromium(url, *mode):
    profile = tempfile.mkdtemp(prefix="vg-chromium-")
    try:
        out = subprocess.run(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--disable-dev-shm-usage", f"--user-data-dir={profile}", "--virtual-time-budget=4000", *mode, url],
            capture_output=True, text=True, timeout=120)
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def page_numbers(server, path="/"):
    html = chromium(server.url + path, "--dump-dom")
    scraper = NumberScraper()
    scraper.feed(html)
    assert scraper.body.get("data-loaded") == "1", html[:2000]
    return scraper


def stable_view(server):
    """Page numbers and /v1/admission read around them, once the state read
    before and after the browser run is the same (at most 3 tries)."""
    keys = ("queue_depth", "running")
    for _ in range(3):
        before = server.admission()
        scraper = page_numbers(server)
        after = server.admission()
        same = all(before[k] == after[k] for k in keys) and all(
            b["reserved_bytes"] == a["reserved_bytes"] and b["budget_bytes"] == a["budget_bytes"]
            for b, a in zip(before["devices"], after["devices"]))
        if same:
            return scraper, after
    raise AssertionError(f"admission state kept changing: {before} vs {after}")


def assert_page_matches(scraper, state):
    assert int(scraper.by_id["queue-depth"]) == state["queue_depth"]
    assert int(scraper.by_id["running"]) == state["running"]
    assert int(scraper.by_id["rejected-never-fits"]) == state["rejected_never_fits"]
    assert scraper.by_id["policy"] == state["policy"]
    for d in state["devices"]:
        shown = scraper.devices[d["name"]]
        for field in ("capacity_bytes", "budget_bytes", "reserved_bytes", "foreign_bytes"):
            assert int(shown[field]) == d[field], (field, shown, d)
        assert shown["state"] == d["state"]


@pytest.mark.skipif(not os.access(CHROMIUM, os.X_OK), reason=f"{CHROMIUM} is not installed (scripts/install-deps --test)")
def test_page_in_chromium_matches_admission_before_and_under_load(make_server):
    os.makedirs(ARTIFACTS, exist_ok=True)
    s = make_server("--device", "virt:0=64MiB", "--max-batch", "2", "--test-step-delay-ms", "150",
                    "--queue-timeout", "600", "--shutdown-grace", "1")

    scraper, state = stable_view(s)
    assert state["queue_depth"] == 0 and state["devices"][0]["reserved_bytes"] == 0
    assert_page_matches(scraper, state)
    chromium(s.url + "/", f"--screenshot={os.path.join(ARTIFACTS, 'page-idle.png')}", "--window-size=1200,1100")

    # Two long requests run (max_batch 2) and four wait in the queue.
    socks = [open_request(s.port, body_for_tokens(250, prompt_len=8)) for _ in range(6)]
    try:
        wait_until(lambda: s.admission()["queue_depth"] == 4 and s.admission()["running"] == 2, what="2 running, 4 queued")
        scraper, state = stable_view(s)
        assert state["queue_depth"] == 4 and state["running"] == 2
        assert state["devices"][0]["reserved_bytes"] > 0
        assert_page_matches(scraper, state)
        # Each waiting request has its row, in grant order, with its size.
        assert scraper.waiting == [w["position"] for w in state["waiting"]] == [1, 2, 3, 4]
        assert all(w["cost_bytes"] > 0 for w in state["waiting"])
        shot = os.path.join(ARTIFACTS, "page-load.png")
        chromium(s.url + "/", f"--screenshot={shot}", "--window-size=1200,1100")
        assert os.path.getsize(shot) > 1000
    finally:
        for sock in socks:
            sock.close()


@pytest.mark.skipif(not os.access(CHROMIUM, os.X_OK), reason=f"{CHROMIUM} is not installed (scripts/install-deps --test)")
def test_page_form_streams_a_completion_in_chromium(server):
    """A link that prefills and sends the form (?prompt=...&send): the page
    streams the answer into #completion-output; greedy, so it is the text
    /v1/completions gives for the same request."""
    prompt, n = "Once upon a time", 24
    expected = server.post("/v1/completions", {"prompt": prompt, "max_tokens": n, "temperature": 0}).json()
    for stream in ("1", "0"):
        scraper = page_numbers(server, f"/?prompt=Once%20upon%20a%20time&max_tokens={n}&temperature=0"
                                       f"&stream={stream}&send")
        assert scraper.output_attrs.get("data-state") == "done", (scraper.output_attrs, scraper.output)
        assert scraper.output_attrs.get("data-finish-reason") == expected["choices"][0]["finish_reason"]
        assert scraper.output == expected["choices"][0]["text"]
