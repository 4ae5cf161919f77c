"""Several models in one server: --model-dir is a folder of model folders
(each sub-folder with a config.json is one model, its id the folder name).
Here a copy of tinylm (GPT-2, byte-level tokenizer) and a tiny random LLaMA
(tools/make_random_llama.py, no tokenizer: token-id prompts) on two virtual
devices: /v1/models describes both, each on both devices; requests pick a
model by "model"; an unknown one is 404 naming the available ones; each
device's resident and workspace bytes are the sums of its models'."""
import os
import shutil
import subprocess
import sys

import pytest

from conftest import MODEL_DIR, Server, wait_until

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))
from tinylm import load_checkpoint  # noqa: E402

LAYERS, HEADS, KV_HEADS, HIDDEN, POSITIONS, VOCAB = 2, 4, 2, 64, 64, 300
GPT2_ID, LLAMA_ID = "tinylm", "tiny-llama"
DEVICES = ["virt:0", "virt:1"]


@pytest.fixture(scope="module")
def model_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    shutil.copytree(MODEL_DIR, root / GPT2_ID)
    subprocess.run(["/usr/bin/python3", os.path.join(ROOT, "tools", "make_random_llama.py"), "--out",
                    str(root / LLAMA_ID), "--seed", "5", "--layers", str(LAYERS), "--heads", str(HEADS),
                    "--kv-heads", str(KV_HEADS), "--hidden", str(HIDDEN), "--positions", str(POSITIONS),
                    "--vocab", str(VOCAB)], check=True)
    (root / "notes").mkdir()  # a folder without config.json is not a model
    return root


@pytest.fixture(scope="module")
def server(model_root):
    s = Server("--device", "virt:0=64MiB", "--device", "virt:1=64MiB", model_dir=str(model_root))
    yield s
    assert s.stop() == 0, s.logs()


def models_by_id(server):
    return {m["id"]: m for m in server.get("/v1/models").json()["data"]}


def test_models_lists_both_with_their_description_and_devices(server, model_root):
    models = models_by_id(server)
    assert set(models) == {GPT2_ID, LLAMA_ID}, models
    gpt2, llama = models[GPT2_ID], models[LLAMA_ID]
    assert gpt2["family"] == "gpt2" and llama["family"] == "llama"
    for m, folder in ((gpt2, GPT2_ID), (llama, LLAMA_ID)):
        assert m["object"] == "model" and m["owned_by"] == "vramgate"
        assert m["dtype"] == "float32", m
        assert m["parameter_count"] == sum(t.numel() for t in load_checkpoint(str(model_root / folder)).values()), m
        assert m["resident_bytes"] >= 4 * m["parameter_count"], m
        assert m["workspace_bytes"] > 0 and m["kv_bytes_per_token"] > 0, m
        assert m["sequence_overhead_bytes"] >= 0 and m["safety_factor"] >= 1.0, m
        assert m["devices"] == DEVICES and m["device"] == "virt:0", m
    assert gpt2["context_length"] == 256 and llama["context_length"] == POSITIONS
    # KV cache per token: layers x (K and V) x KV heads x head_dim x 4 bytes.
    assert llama["kv_bytes_per_token"] == LAYERS * 2 * KV_HEADS * (HIDDEN // HEADS) * 4
    assert gpt2["kv_bytes_per_token"] == 3 * 2 * 128 * 4
    assert gpt2["parameter_count"] != llama["parameter_count"]


def test_requests_pick_their_model(server):
    first = server.get("/v1/models").json()["data"][0]["id"]
    r = server.post("/v1/completions", {"model": GPT2_ID, "prompt": "Hello", "max_tokens": 5, "ignore_eos": True})
    assert r.status_code == 200, r.text
    assert r.json()["model"] == GPT2_ID and r.json()["usage"]["completion_tokens"] == 5
    r = server.post("/v1/completions", {"model": LLAMA_ID, "prompt": [1, 7, 42], "max_tokens": 5, "ignore_eos": True})
    assert r.status_code == 200, r.text
    assert r.json()["model"] == LLAMA_ID and r.json()["usage"] == {"prompt_tokens": 3, "completion_tokens": 5,
                                                                   "total_tokens": 8}
    # The same token ids mean different things to the two models: each runs its own.
    r = server.post("/v1/completions", {"model": GPT2_ID, "prompt": [72, 105], "max_tokens": 3})
    assert r.status_code == 200 and r.json()["model"] == GPT2_ID, r.text
    # Without "model": the first one /v1/models lists.
    r = server.post("/v1/completions", {"prompt": [1, 2, 3], "max_tokens": 2})
    assert r.status_code == 200, r.text
    assert r.json()["model"] == first
    # Each model's own limits: the llama's context is 64 tokens, tinylm's 256.
    r = server.post("/v1/completions", {"model": LLAMA_ID, "prompt": [1, 2], "max_tokens": 100})
    assert r.status_code == 400 and "context length of model 'tiny-llama'" in r.json()["error"]["message"], r.text
    r = server.post("/v1/completions", {"model": GPT2_ID, "prompt": [1, 2], "max_tokens": 100, "ignore_eos": True})
    assert r.status_code == 200, r.text
    # The llama has no tokenizer file: text prompts are refused for it only.
    r = server.post("/v1/completions", {"model": LLAMA_ID, "prompt": "Hello", "max_tokens": 2})
    assert r.status_code == 400 and "token ids" in r.json()["error"]["message"], r.text


def test_unknown_model_is_404_naming_the_available_ones(server):
    r = server.post("/v1/completions", {"model": "gpt-4", "prompt": "Hi", "max_tokens": 2})
    assert r.status_code == 404, r.text
    err = r.json()["error"]
    assert err["type"] == "model_not_found"
    assert "gpt-4" in err["message"] and GPT2_ID in err["message"] and LLAMA_ID in err["message"], err


def test_each_device_holds_both_models(server):
    models = models_by_id(server)
    a = server.admission()
    assert [d["name"] for d in a["devices"]] == DEVICES
    for d in a["devices"]:
        assert d["state"] == "ready", d
        assert sorted(d["models"]) == sorted(models), d
        assert d["resident_bytes"] == sum(m["resident_bytes"] for m in models.values()), (d, models)
        assert d["workspace_bytes"] == sum(m["workspace_bytes"] for m in models.values()), (d, models)
        assert d["budget_bytes"] < d["capacity_bytes"] - d["resident_bytes"] - d["workspace_bytes"] + 1, d
    r = server.get("/ready")
    assert r.status_code == 200, r.text
    assert [(d["name"], d["state"]) for d in r.json()["devices"]] == [(n, "ready") for n in DEVICES]


def test_completed_requests_are_counted_on_the_devices(server):
    wait_until(lambda: server.admission()["running"] == 0, what="idle")
    before = server.admission()
    for model, prompt in ((GPT2_ID, "Hi"), (LLAMA_ID, [5, 6])):
        r = server.post("/v1/completions", {"model": model, "prompt": prompt, "max_tokens": 3})
        assert r.status_code == 200, r.text
    wait_until(lambda: server.admission()["running"] == 0, what="idle")
    after = server.admission()
    assert after["completed"] == before["completed"] + 2
    assert (sum(d["completed"] for d in after["devices"]) ==
            sum(d["completed"] for d in before["devices"]) + 2), (before, after)
