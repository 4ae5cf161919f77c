"""Decode steps through the tensor path on the CPU (--host-kernels off): the
static-shape steps CUDA runs, padded to batch buckets and read through the
KV block table, with the picks made by the device sampler. Greedy and
seeded answers are the host kernels' answers, logprobs within 1e-4, and
requests decoded together in a padded batch answer as they do alone.
Decode graphs, emulated on the CPU (--test-emulate-cuda-graphs), answer as
eager steps do, their bytes are charged to the budget as resident, what
they hold outside the allocator is in the start-up budget's foreign bytes
(so the first turns neither cut the budget nor move the pool), and an
out-of-memory error that moves the KV pool has them recorded again."""
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import BIN, MODEL_DIR

PROMPTS = [
    "Once upon a time",
    "The cat sat on the mat and looked out of the window at the rain",
    "A",
    "She opened the door slowly, and the old house creaked as the wind",
    "In the morning the children went to school",
]


def complete(server, prompt, **extra):
    body = {"prompt": prompt, "max_tokens": 24, "temperature": 0, "logprobs": 2, "ignore_eos": True, **extra}
    r = server.post("/v1/completions", body)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


def assert_same(a, b, what):
    assert a["text"] == b["text"], what
    if a.get("logprobs"):
        assert a["logprobs"]["tokens"] == b["logprobs"]["tokens"], what
        for x, y in zip(a["logprobs"]["token_logprobs"], b["logprobs"]["token_logprobs"]):
            assert abs(x - y) < 1e-4, what


def test_static_decode_steps_answer_as_the_host_kernels_do(make_server):
    host = make_server("--device", "virt:0=32MiB")
    tensor = make_server("--device", "virt:0=32MiB", "--host-kernels", "off")
    for prompt in PROMPTS:
        assert_same(complete(tensor, prompt), complete(host, prompt), f"greedy: {prompt!r}")
        seeded = {"temperature": 0.8, "top_p": 0.9, "seed": 11, "logprobs": None}
        assert_same(complete(tensor, prompt, **seeded), complete(host, prompt, **seeded), f"seeded: {prompt!r}")


def test_requests_decoded_in_one_padded_batch_answer_as_alone(make_server):
    tensor = make_server("--device", "virt:0=32MiB", "--host-kernels", "off")
    alone = [complete(tensor, p) for p in PROMPTS]
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        together = list(pool.map(lambda p: complete(tensor, p), PROMPTS))
    for prompt, a, b in zip(PROMPTS, alone, together):
        assert_same(b, a, prompt)


def test_emulated_decode_graphs_answer_as_eager_steps_and_are_charged(make_server):
    args = ("--device", "virt:0=32MiB", "--host-kernels", "off", "--max-batch", "8")
    eager = make_server(*args)
    graphs = make_server(*args, "--test-emulate-cuda-graphs")
    for prompt in PROMPTS:
        assert_same(complete(graphs, prompt), complete(eager, prompt), f"greedy: {prompt!r}")
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        together = list(pool.map(lambda p: complete(graphs, p), PROMPTS))
    for prompt, b in zip(PROMPTS, together):
        assert_same(b, complete(eager, prompt), f"together: {prompt!r}")
    assert "decode graphs on virt:0 (emulated): 20 graphs for batches up to 8" in graphs.logs()
    with_graphs = graphs.admission()["devices"][0]
    without = eager.admission()["devices"][0]
    assert with_graphs["resident_bytes"] > without["resident_bytes"]
    assert with_graphs["budget_bytes"] < without["budget_bytes"]


def test_what_graphs_hold_outside_the_allocator_is_in_the_start_up_budget(make_server):
    # Emulated graph executables are bytes outside the allocator, as a GPU's
    # are: measured after the budget, they would read as another process
    # taking memory, cut the budget and move the pool at the first turns,
    # wherever the foreign bytes bind the budget (here: utilization 1; on a
    # GPU: beside another process, gpu-check's shared-device check).
    server = make_server("--device", "virt:0=32MiB", "--host-kernels", "off", "--max-batch", "8",
                         "--memory-utilization", "1", "--test-emulate-cuda-graphs", "--log-level", "info")
    start = server.admission()["devices"][0]
    assert start["foreign_bytes"] > 0, start
    for prompt in PROMPTS:
        complete(server, prompt)
    d = server.admission()["devices"][0]
    assert d["budget_changes"]["foreign_grew"] == 0, d
    assert d["effective_budget_bytes"] == start["effective_budget_bytes"]
    assert d["kv_blocks"]["total"] == start["kv_blocks"]["total"]
    logs = server.logs()
    assert "recorded again" not in logs
    assert "outside it; foreign bytes 0 B before they were recorded" in logs, logs[-3000:]


def test_out_of_memory_under_emulated_graphs_records_them_again_and_answers_stay_right(make_server):
    # S20: the OOM governor halves the budget and the KV pool moves; the
    # graphs read its old storage, so they are recorded again after.
    args = ("--device", "virt:0=32MiB", "--host-kernels", "off", "--max-batch", "8")
    eager = make_server(*args)
    graphs = make_server(*args, "--test-emulate-cuda-graphs", "--test-inject-oom-step", "20",
                         "--test-inject-oom-count", "2", "--oom-quiet-period", "1")
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        answers = list(pool.map(lambda p: complete(graphs, p), PROMPTS))
    for prompt, a in zip(PROMPTS, answers):
        assert_same(a, complete(eager, prompt), f"after out-of-memory: {prompt!r}")
    assert graphs.admission()["out_of_memory"] == 2
    assert "recorded again after the KV block pool moved" in graphs.logs()


@pytest.mark.same_in_both_modes
@pytest.mark.parametrize("args,message", [
    (["--cuda-graphs", "sometimes"], "--cuda-graphs: must be on or off"),
    (["--host-kernels", "maybe"], "--host-kernels: must be on or off"),
    (["--test-emulate-cuda-graphs"], "--test-emulate-cuda-graphs: needs --host-kernels off"),
])
def test_a_bad_setting_is_refused_naming_it(args, message):
    out = subprocess.run([BIN, "serve", "--model-dir", MODEL_DIR, "--port", "0", *args],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert message in out.stderr, out.stderr
