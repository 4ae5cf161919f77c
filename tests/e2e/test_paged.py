"""The paged KV cache end to end: the pool and its reservation policy as
/v1/admission and /metrics report them, prompts that start from the prefix
cache and answer as if computed in full, and the settings' validation."""
import subprocess

import pytest

from conftest import BIN, IN_PROCESS, MODEL_DIR, wait_until

PROMPT = "The old lighthouse keeper watched the sea from his window every night, counting ships"


def kv(server):
    return server.admission()["devices"][0]["kv_blocks"]


def metric(server, line_start):
    for line in server.get("/metrics").text.splitlines():
        if line.startswith(line_start):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_the_pool_holds_the_budget_in_blocks_and_is_reported(make_server):
    server = make_server("--device", "virt:0=16MiB")
    dev = server.admission()["devices"][0]
    k = dev["kv_blocks"]
    assert k["reservation"] == ("full" if IN_PROCESS else "on-demand")
    assert k["block_tokens"] == 16
    assert k["total"] == dev["budget_bytes"] // k["block_bytes"]
    assert (k["used"], k["cached"], k["free"]) == (0, 0, k["total"])
    # Admission never hands out more than the pool holds.
    assert dev["effective_budget_bytes"] == k["total"] * k["block_bytes"]
    r = server.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 8, "temperature": 0})
    assert r.status_code == 200, r.text
    wait_until(lambda: server.admission()["running"] == 0 and kv(server)["used"] == 0)
    assert server.admission()["devices"][0]["reserved_bytes"] == 0
    assert kv(server)["cached"] > 0  # its full blocks stay for the prefix cache
    assert metric(server, 'vramgate_kv_blocks{device="virt:0",state="cached"}') == kv(server)["cached"]


def test_a_repeated_prompt_starts_from_the_prefix_cache_and_answers_the_same(make_server):
    server = make_server("--device", "virt:0=16MiB")
    body = {"prompt": PROMPT, "max_tokens": 12, "temperature": 0, "logprobs": 2}
    first = server.post("/v1/completions", body)
    assert first.status_code == 200, first.text
    before = kv(server)
    second = server.post("/v1/completions", body)
    assert second.status_code == 200, second.text
    assert second.json()["choices"][0]["text"] == first.json()["choices"][0]["text"]
    a, b = first.json()["choices"][0]["logprobs"], second.json()["choices"][0]["logprobs"]
    assert b["tokens"] == a["tokens"]
    for x, y in zip(a["token_logprobs"], b["token_logprobs"]):
        assert abs(x - y) < 1e-4
    prompt = second.json()["usage"]["prompt_tokens"]
    wait_until(lambda: kv(server)["prompt_tokens"] == before["prompt_tokens"] + prompt)
    after = kv(server)
    # The whole blocks before its last token came from the cache.
    assert after["prefix_hit_tokens"] - before["prefix_hit_tokens"] == (prompt - 1) // 16 * 16
    assert metric(server, 'vramgate_prompt_tokens_total{device="virt:0",source="prefix_cache"}') == \
        after["prefix_hit_tokens"]


def test_with_the_prefix_cache_off_every_prompt_is_computed(make_server):
    server = make_server("--device", "virt:0=16MiB", "--prefix-cache", "off")
    for _ in range(2):
        r = server.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 4})
        assert r.status_code == 200, r.text
    wait_until(lambda: kv(server)["prompt_tokens"] == 2 * r.json()["usage"]["prompt_tokens"])
    assert kv(server)["prefix_hit_tokens"] == 0
    assert kv(server)["cached"] == 0


def test_a_request_that_can_never_fit_the_pool_is_refused_at_once(make_server):
    server = make_server("--device", "virt:0=16MiB", "--memory-reserve", str(8_600_000))  # about 12 blocks
    k = kv(server)
    tokens = min(256, k["total"] * k["block_tokens"] + 2)
    if tokens <= k["total"] * k["block_tokens"]:
        pytest.skip("the pool holds the model's whole context")
    r = server.post("/v1/completions", {"prompt": "x", "max_tokens": tokens - 1, "ignore_eos": True})
    assert r.status_code == 413, r.text
    assert r.json()["error"]["type"] == "exceeds_device_memory"


@pytest.mark.parametrize("block_tokens", ["7", "24"])
def test_a_request_to_the_last_position_grows_its_cache_to_the_context_not_past_it(make_server, block_tokens):
    # Blocks that do not divide the 256-token context: the last block a
    # sequence grows into ends past the context, and asks only up to it.
    server = make_server("--device", "virt:0=64MiB", "--kv-block-tokens", block_tokens)
    for _ in range(10):  # short answers: an on-demand sequence starts small and grows block by block
        assert server.post("/v1/completions", {"prompt": "ab", "max_tokens": 2}).status_code == 200
    r = server.post("/v1/completions", {"prompt": "x" * 250, "max_tokens": 6, "ignore_eos": True})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 6


@pytest.mark.same_in_both_modes
@pytest.mark.parametrize("flag,value", [("--kv-reservation", "sometimes"), ("--kv-block-tokens", "0"),
                                        ("--prefix-cache", "maybe"), ("--kv-pool", "yes")])
def test_bad_kv_settings_are_refused_naming_the_setting(flag, value):
    out = subprocess.run([BIN, "serve", "--model-dir", MODEL_DIR, "--port", "0", flag, value],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert f"{flag}: must be" in out.stderr, out.stderr
