"""Operability against the real binary: the /metrics exposition (its grammar,
HELP/TYPE for every metric, histogram consistency) and how its counters move,
the JSON request log on stderr, debug memory snapshots, and the watchdog
behind /health. Tests wait on conditions the server reports, never on sleeps."""
import json
import re
import threading

import requests

from conftest import sse_events, wait_until
from scenario_util import idle, open_request

NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*"'
SAMPLE = re.compile(rf"^({NAME})(\{{(?:{LABEL}(?:,{LABEL})*)?\}})? (\S+)$")
LABEL_PAIR = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"')
TYPES = ("counter", "gauge", "histogram", "summary", "untyped")


def parse_exposition(text):
    """Checks the text format 0.0.4 and returns {(name, labels): value}, where
    labels is a sorted tuple of (name, value) pairs."""
    helps, types, samples = set(), {}, {}
    assert text.endswith("\n")
    for line in text.splitlines():
        if line.startswith("# HELP "):
            helps.add(line.split(" ", 3)[2])
            continue
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert kind in TYPES, line
            assert name not in types, f"second TYPE for {name}"
            types[name] = kind
            continue
        assert line and not line.startswith("#"), repr(line)
        m = SAMPLE.match(line)
        assert m, f"not a sample line: {line!r}"
        name, labels, value = m.group(1), m.group(2) or "", m.group(3)
        float(value)  # also accepts +Inf, -Inf, NaN
        family = name
        for suffix in ("_bucket", "_sum", "_count"):
            if name.endswith(suffix) and types.get(name[: -len(suffix)]) == "histogram":
                family = name[: -len(suffix)]
        assert family in types, f"{name} has no TYPE before it"
        assert family in helps, f"{name} has no HELP"
        key = (name, tuple(sorted(LABEL_PAIR.findall(labels))))
        assert key not in samples, f"duplicate sample {line}"
        samples[key] = float(value)
    check_histograms(types, samples)
    return samples


# Histograms labelled by model: no series until a request of such a model
# (the registry shows a labelled family without children as HELP and TYPE only).
LABELLED_HISTOGRAMS = {"vramgate_tensor_queue_wait_seconds", "vramgate_tensor_request_duration_seconds",
                       "vramgate_tensor_batch_size"}


def check_histograms(types, samples):
    for family, kind in types.items():
        if kind != "histogram":
            continue
        series = {}
        for (name, labels), value in samples.items():
            if name == family + "_bucket":
                rest = tuple(kv for kv in labels if kv[0] != "le")
                le = dict(labels)["le"]
                series.setdefault(rest, []).append((float(le), value))
        if family in LABELLED_HISTOGRAMS and not series:
            continue
        assert series, f"histogram {family} has no buckets"
        for rest, buckets in series.items():
            buckets.sort()
            counts = [v for _, v in buckets]
            assert counts == sorted(counts), f"{family} buckets not cumulative: {buckets}"
            assert buckets[-1][0] == float("inf"), f"{family} lacks le=+Inf"
            assert samples[(family + "_count", rest)] == counts[-1], family
            assert (family + "_sum", rest) in samples, family


def scrape(server):
    r = server.get("/metrics")
    assert r.status_code == 200, r.text
    assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    return parse_exposition(r.text)


def value(samples, name, **labels):
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_metrics_exposition_and_counters_move(make_server):
    server = make_server("--test-step-delay-ms", "10", "--max-batch", "1", "--max-queue", "1")
    before = scrape(server)

    ok = server.post("/v1/completions", {"prompt": "Hi", "max_tokens": 4, "ignore_eos": True})
    assert ok.status_code == 200, ok.text
    with requests.post(server.url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 4, "stream": True,
                                                             "ignore_eos": True}, stream=True, timeout=60) as r:
        assert list(sse_events(r))[-1] == "[DONE]"
    assert server.post("/v1/completions", {"prompt": 5}).status_code == 400
    assert server.get("/no/such/route").status_code == 404

    running = open_request(server.port, {"prompt": "A", "max_tokens": 200, "ignore_eos": True})
    wait_until(lambda: server.admission()["running"] == 1, what="first running")
    queued = open_request(server.port, {"prompt": "B", "max_tokens": 200, "ignore_eos": True})
    wait_until(lambda: server.admission()["queue_depth"] == 1, what="second queued")
    during = scrape(server)
    assert value(during, "vramgate_queue_depth") == 1
    assert value(during, "vramgate_running_sequences") == 1
    full = server.post("/v1/completions", {"prompt": "C", "max_tokens": 5})
    assert full.status_code == 503, full.text
    # The queued one leaves first: were the running one to leave first, the
    # queued one could start before its own client's close is seen.
    queued.close()
    wait_until(lambda: server.admission()["queue_depth"] == 0, what="queued one left the queue")
    running.close()
    wait_until(lambda: idle(server), what="idle after clients left")

    after = scrape(server)

    def delta(name, **labels):
        return value(after, name, **labels) - value(before, name, **labels)

    route = "/v1/completions"
    assert delta("vramgate_http_requests_total", route=route, status="200") == 2
    assert delta("vramgate_http_requests_total", route=route, status="400") == 1
    assert delta("vramgate_http_requests_total", route=route, status="503") == 1
    assert delta("vramgate_http_requests_total", route="other", status="404") == 1
    assert delta("vramgate_admission_outcomes_total", reason="queue_full") == 1
    assert delta("vramgate_admission_outcomes_total", reason="admitted") >= 3
    assert delta("vramgate_requests_finished_total", outcome="completed") == 2
    # The running one; the queued one is counted as it left the queue.
    assert delta("vramgate_requests_finished_total", outcome="cancelled") == 1
    assert delta("vramgate_admission_outcomes_total", reason="cancelled") == 1
    assert delta("vramgate_generated_tokens_total") >= 8
    assert delta("vramgate_time_to_first_token_seconds_count") >= 2
    assert delta("vramgate_inter_token_latency_seconds_count") >= 6
    assert delta("vramgate_queue_wait_seconds_count") >= 3
    assert delta("vramgate_request_duration_seconds_count") == 4
    assert delta("vramgate_batch_size_count") >= 8
    assert value(after, "vramgate_out_of_memory_total") == 0
    assert ("vramgate_preemptions_total", ()) in after
    assert value(after, "vramgate_queue_depth") == 0
    assert value(after, "vramgate_running_sequences") == 0
    assert value(after, "vramgate_ready") == 1

    adm = server.admission()["devices"][0]
    name = adm["name"]
    for kind in ("capacity", "budget", "effective_budget", "reserved", "used", "peak"):
        assert ("vramgate_device_bytes", tuple(sorted({"device": name, "kind": kind}.items()))) in after, kind
    assert value(after, "vramgate_device_bytes", device=name, kind="capacity") == adm["capacity_bytes"]
    assert value(after, "vramgate_device_bytes", device=name, kind="budget") == adm["budget_bytes"]
    assert value(after, "vramgate_device_bytes", device=name, kind="reserved") == 0
    assert 0 < value(after, "vramgate_device_bytes", device=name, kind="used") <= adm["capacity_bytes"]


def test_never_fits_is_counted(make_server):
    # 64 KiB of budget left: the KV cache of 250 tokens cannot fit. A set
    # batch, so that the smaller budget does not choose a smaller batch and
    # with it a smaller step workspace.
    probe = make_server("--max-batch", "8")
    d = probe.admission()["devices"][0]
    reserve = d["budget_bytes"] - (64 << 10)
    probe.stop()
    server = make_server("--max-batch", "8", "--memory-reserve", str(reserve))
    r = server.post("/v1/completions", {"prompt": "x" * 50, "max_tokens": 200})
    assert r.status_code == 413, r.text
    samples = scrape(server)
    assert value(samples, "vramgate_admission_outcomes_total", reason="never_fits") == 1
    assert value(samples, "vramgate_http_requests_total", route="/v1/completions", status="413") == 1


def request_logs(server):
    out = []
    for line in list(server.log):
        if " request {" in line:
            out.append(json.loads(line[line.index("{"):]))
    return out


def test_request_log_lines_are_json(make_server):
    server = make_server("--log-request-text", "--log-level", "debug")
    r = server.post("/v1/completions", {"prompt": "Hello", "max_tokens": 3, "ignore_eos": True},
                    headers={"X-Request-Id": "log-ok"})
    assert r.status_code == 200
    assert server.post("/v1/completions", {"prompt": "x" * 250, "max_tokens": 100},
                       headers={"X-Request-Id": "log-bad"}).status_code == 400
    wait_until(lambda: {"log-ok", "log-bad"} <= {x["id"] for x in request_logs(server)}, what="request log lines")
    lines = {x["id"]: x for x in request_logs(server)}
    ok = lines["log-ok"]
    assert ok["outcome"] == "completed" and ok["reason"] == "length", ok
    assert ok["model"] == "tinylm" and ok["status"] == 200
    assert ok["prompt_tokens"] == 5 and ok["completion_tokens"] == 3
    assert ok["reserved_bytes"] > 0
    for k in ("queue_ms", "prefill_ms", "decode_ms", "duration_ms"):
        assert ok[k] >= 0, k
    assert ok["prompt"] == "Hello"
    assert ok["output"] == r.json()["choices"][0]["text"]
    bad = lines["log-bad"]
    assert bad["outcome"] == "failed" and bad["reason"] == "invalid_request" and bad["status"] == 400, bad
    # Debug snapshots of device memory at each milestone of the request.
    for stage in ("enter", "admit", "first token", "finish"):
        assert any(f"request log-ok {stage}: " in ln and "used" in ln for ln in server.log), stage


def test_request_log_has_no_text_by_default(server):
    r = server.post("/v1/completions", {"prompt": "zebra-7341", "max_tokens": 2},
                    headers={"X-Request-Id": "log-plain"})
    assert r.status_code == 200
    wait_until(lambda: any(x["id"] == "log-plain" for x in request_logs(server)), what="request log line")
    line = next(x for x in request_logs(server) if x["id"] == "log-plain")
    assert "prompt" not in line and "output" not in line, line
    assert not any("zebra-7341" in ln for ln in server.log)


def test_watchdog_turns_health_503_while_a_step_is_stuck(make_server):
    server = make_server("--test-step-delay-ms", "1500", "--watchdog-timeout", "0.5")
    assert server.get("/health").status_code == 200
    done = {}

    def client():
        done["r"] = server.post("/v1/completions", {"prompt": "A", "max_tokens": 2, "ignore_eos": True})

    t = threading.Thread(target=client)
    t.start()
    seen = {}

    def unhealthy():
        h = server.get("/health")
        seen["body"] = h.json()
        return h.status_code == 503

    wait_until(unhealthy, what="/health 503")
    assert seen["body"]["status"] == "unhealthy"
    assert re.fullmatch(r"engine on virt:0 stuck in a step for \d+ s", seen["body"]["reason"]), seen
    t.join(60)
    assert done["r"].status_code == 200
    wait_until(lambda: server.get("/health").status_code == 200, what="/health 200 once idle")
