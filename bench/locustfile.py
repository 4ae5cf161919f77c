"""Locust load for vramgate, for people who already use Locust (Debian's
python3-locust). Each simulated user sends completions back to back, drawn
from the same traffic mixes as bench/loadgen.py; half of them (by default)
are streamed. Headless, 16 users for 30 s against a running server:

    locust -f bench/locustfile.py --headless -u 16 -r 16 -t 30s --host http://127.0.0.1:8000 \\
        --mix '[{"weight":3,"prompt":[8,32],"max_tokens":[16,48],"stream":0.5},
                {"weight":1,"prompt":[32,64],"max_tokens":[150,190],"stream":0.5}]'

Locust's table then shows `/v1/completions [plain]` and `[stream]` (send to
the last byte), `TTFT` (time to the first streamed token) and, as failures, every
non-200 answer by status and error type (e.g. `503 overloaded`,
`500 out_of_memory`). A 503 with Retry-After makes that user wait as asked
before its next request.
"""
import itertools
import json
import os
import sys
import time

import gevent
from locust import HttpUser, events, task

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from traffic import draw_requests  # noqa: E402

DEFAULT_MIX = '[{"weight":1,"prompt":[8,64],"max_tokens":[16,128],"stream":0.5}]'


@events.init_command_line_parser.add_listener
def _(parser):
    parser.add_argument("--mix", type=str, default=DEFAULT_MIX, include_in_web_ui=True,
                        help="JSON list of request classes: weight, prompt [lo,hi], max_tokens [lo,hi], stream")
    parser.add_argument("--mix-seed", type=int, default=1, help="seed of the drawn requests")


_counter = itertools.count()


class CompletionUser(HttpUser):
    """One client: a completion, then the next one (no think time)."""

    def on_start(self):
        opts = self.environment.parsed_options
        self.mix = json.loads(opts.mix if opts else DEFAULT_MIX)
        self.seed = (opts.mix_seed if opts else 1) * 1000 + next(_counter)
        self.specs = iter(())

    def next_spec(self):
        spec = next(self.specs, None)
        if spec is None:
            self.specs = iter(draw_requests(self.mix, 100, self.seed))
            self.seed += 1_000_000
            spec = next(self.specs)
        return spec

    def failed(self, r, err):
        retry = r.headers.get("Retry-After")
        r.failure(f"{r.status_code} {err.get('type', '?') if isinstance(err, dict) else err}")
        if retry:
            try:
                gevent.sleep(min(float(retry), 30.0))
            except ValueError:
                pass

    @task
    def completion(self):
        spec = self.next_spec()
        body = dict(spec["body"], stream=spec["stream"])
        name = "/v1/completions [stream]" if spec["stream"] else "/v1/completions [plain]"
        t0 = time.perf_counter()
        with self.client.post("/v1/completions", json=body, name=name, stream=spec["stream"],
                              catch_response=True, timeout=120) as r:
            if r.status_code != 200:
                try:
                    err = r.json()["error"]
                except (ValueError, KeyError, TypeError):
                    err = "unparsed"
                self.failed(r, err)
                return
            if not spec["stream"]:
                r.success()
                return
            first = None
            for raw in r.iter_lines():
                if not raw.startswith(b"data: ") or raw == b"data: [DONE]":
                    continue
                if b'"error"' in raw:
                    err = json.loads(raw[6:])["error"]
                    r.failure(f"stream error {err.get('type', '?')}")
                    return
                if first is None:
                    first = time.perf_counter() - t0
                    events.request.fire(request_type="SSE", name="TTFT", response_time=1000 * first,
                                        response_length=0, exception=None, context={})
            # Locust timed the headers only; a stream's time is that of its last event.
            r.request_meta["response_time"] = 1000 * (time.perf_counter() - t0)
            r.success()
