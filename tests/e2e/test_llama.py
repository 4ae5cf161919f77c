"""Serving a LLaMA-family checkpoint in the Hugging Face layout (written at test
time by tools/make_random_llama.py: grouped-query attention, two shards, no
tokenizer file): token-id prompts generate what the Python reference forward
pass generates, text prompts get 400, /v1/models describes the model, and
--dtype reaches the memory profile."""
import json
import os
import subprocess
import sys

import pytest

from conftest import BIN, sse_events

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import llama  # noqa: E402
from tinylm import load_checkpoint  # noqa: E402

LAYERS, HEADS, KV_HEADS, HIDDEN, POSITIONS, VOCAB = 2, 4, 2, 64, 64, 300
HEAD_DIM = HIDDEN // HEADS


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ckpt") / "tiny-llama"
    subprocess.run(["/usr/bin/python3", os.path.join(ROOT, "tools", "make_random_llama.py"), "--out", str(folder),
                    "--seed", "21", "--layers", str(LAYERS), "--heads", str(HEADS), "--kv-heads", str(KV_HEADS),
                    "--hidden", str(HIDDEN), "--positions", str(POSITIONS), "--vocab", str(VOCAB),
                    "--shards", "2"], check=True)
    with open(folder / "config.json") as f:
        cfg = json.load(f)
    return folder, cfg, load_checkpoint(str(folder))


@pytest.fixture(scope="module")
def llama_server(checkpoint):
    from conftest import Server
    s = Server(model_dir=str(checkpoint[0]))
    yield s
    assert s.stop() == 0, s.logs()


def ids_of(text):
    return [int(t) for t in text.split()]


def test_models_entry_describes_the_checkpoint(llama_server, checkpoint):
    _, cfg, tensors = checkpoint
    m = llama_server.get("/v1/models").json()["data"][0]
    assert m["id"] == "tiny-llama"
    assert m["family"] == "llama"
    assert m["dtype"] == "float32"
    assert m["context_length"] == POSITIONS
    assert m["parameter_count"] == sum(t.numel() for t in tensors.values())
    # KV cache per token: layers x (K and V) x KV heads x head_dim x 4 bytes.
    assert m["kv_bytes_per_token"] == LAYERS * 2 * KV_HEADS * HEAD_DIM * 4
    assert m["resident_bytes"] >= 4 * m["parameter_count"]


def test_token_id_prompt_generates_what_the_reference_generates(llama_server, checkpoint):
    _, cfg, tensors = checkpoint
    prompt = [1, 17, 42, 99, 250]
    expected = llama.greedy(cfg, tensors, prompt, 12)
    eos = cfg["eos_token_id"]
    assert eos in expected  # this seed generates end-of-sequence on the way
    request = {"prompt": prompt, "max_tokens": 12, "temperature": 0, "ignore_eos": True}
    r = llama_server.post("/v1/completions", request)
    assert r.status_code == 200, r.text
    body = r.json()
    assert ids_of(body["choices"][0]["text"]) == expected
    assert body["usage"] == {"prompt_tokens": len(prompt), "completion_tokens": 12, "total_tokens": 17}

    # Without ignore_eos, generation stops at end-of-sequence.
    r = llama_server.post("/v1/completions", {**request, "ignore_eos": False})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert ids_of(choice["text"]) == expected[:expected.index(eos)]

    # Streamed, the same tokens arrive chunk by chunk.
    with llama_server.post("/v1/completions", {**request, "stream": True}, stream=True) as s:
        assert s.status_code == 200
        text = ""
        for data in sse_events(s):
            if data == "[DONE]":
                break
            text += json.loads(data)["choices"][0]["text"]
    assert ids_of(text) == expected


def test_text_prompt_is_refused_with_a_clear_400(llama_server):
    for stream in (False, True):
        r = llama_server.post("/v1/completions", {"prompt": "Hello there", "max_tokens": 4, "stream": stream})
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["type"] == "invalid_request"
        assert "send prompt as a list of token ids" in err["message"]
    r = llama_server.post("/infer", {"prompt": "Hello", "max_tokens": 4})
    assert r.status_code == 400
    assert "list of token ids" in r.json()["error"]["message"]


def test_out_of_vocabulary_ids_and_context_overflow_are_400(llama_server):
    r = llama_server.post("/v1/completions", {"prompt": [1, VOCAB], "max_tokens": 4})
    assert r.status_code == 400
    assert r.json()["error"]["type"] == "invalid_request"
    r = llama_server.post("/v1/completions", {"prompt": [1] * 60, "max_tokens": 10})
    assert r.status_code == 400
    assert "context length" in r.json()["error"]["message"]


def test_bfloat16_halves_the_kv_cache_and_keeps_serving(make_server, checkpoint):
    s = make_server("--dtype", "bfloat16", model_dir=str(checkpoint[0]))
    m = s.get("/v1/models").json()["data"][0]
    assert m["dtype"] == "bfloat16"
    assert m["kv_bytes_per_token"] == LAYERS * 2 * KV_HEADS * HEAD_DIM * 2
    r = s.post("/v1/completions", {"prompt": [1, 2, 3], "max_tokens": 5, "temperature": 0, "ignore_eos": True})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 5


def test_float16_on_a_virtual_device_stops_start_up_with_a_reason(checkpoint):
    p = subprocess.run([BIN, "serve", "--model-dir", str(checkpoint[0]), "--port", "0", "--dtype", "float16"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode != 0
    assert "'float16' is for CUDA devices" in p.stderr + p.stdout
