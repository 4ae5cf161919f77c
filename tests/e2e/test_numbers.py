"""Numbers as people write them, in the bytes the real binary sends: no
exponent form (Boost.JSON's "1.1E0", std::to_chars' "5e-04") in JSON bodies
or in the Prometheus exposition."""
import re

EXPONENT = re.compile(r"\d[eE][+-]?\d")


def test_json_bodies_have_plain_decimals(server):
    models = server.get("/v1/models").text
    assert '"safety_factor":1.1' in models, models
    infer = server.post("/infer", {"prompt": "Hi", "max_tokens": 4})
    assert infer.status_code == 200
    assert re.search(r'"latency_ms":\d+(\.\d+)?,', infer.text), infer.text
    for text in (models, infer.text, server.get("/v1/admission").text):
        assert not EXPONENT.search(text), text


def test_metrics_have_plain_decimals(server):
    server.post("/v1/completions", {"prompt": "Hi", "max_tokens": 2})
    text = server.get("/metrics").text
    assert 'le="0.0005"' in text  # vramgate_inter_token_latency_seconds' first bucket
    samples = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert samples and not [line for line in samples if EXPONENT.search(line)]
