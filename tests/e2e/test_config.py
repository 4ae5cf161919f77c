"""The config file (`serve --config`), `serve --print-config` and the capacity
planner (`vramgate plan`) against the real binary. Expected numbers come from
a server started with the same settings, never from constants."""
import os
import json
import re
import subprocess
import tomllib

import pytest

from conftest import BIN, MODEL_DIR
from scenario_util import cost_of


ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


def run(*args, timeout=120):
    return subprocess.run([BIN, *args], capture_output=True, text=True, timeout=timeout)


def write(tmp_path, text, name="vramgate.toml"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_config_file_takes_effect_and_flags_win(tmp_path, make_server):
    path = write(tmp_path, '[model]\ndevice = "virt:0=1GiB"\n[memory]\nadmission = "fixed:2"\n'
                           'memory_reserve = "1MiB"\n')
    from_file = make_server("--config", path)
    state = from_file.admission()
    assert state["policy"] == "fixed:2"
    device = state["devices"][0]
    assert device["capacity_bytes"] == 1 << 30
    model = from_file.get("/v1/models").json()["data"][0]
    expected = int((1 << 30) * 0.9) - model["resident_bytes"] - model["workspace_bytes"] - (1 << 20)
    assert abs(device["budget_bytes"] - expected) <= 1, (device, model)

    overridden = make_server("--config", path, "--admission", "fixed:3", "--memory-reserve", "0")
    state = overridden.admission()
    assert state["policy"] == "fixed:3"
    assert state["devices"][0]["capacity_bytes"] == 1 << 30  # still from the file
    assert state["devices"][0]["budget_bytes"] == device["budget_bytes"] + (1 << 20)


def test_print_config_shows_effective_values_and_reads_back(tmp_path):
    path = write(tmp_path, "max_queue = 5\n[scheduling]\nmax_batch = 3\n")
    out = run("serve", "--config", path, "--max-batch", "6", "--port", "0", "--print-config")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert re.search(r"^max_queue = 5$", text, re.M), text
    assert re.search(r"^max_batch = 6$", text, re.M), text
    assert re.search(r"^port = 0$", text, re.M), text
    assert re.search(r'^admission = "memory"$', text, re.M), text
    assert "listening" not in out.stderr + text  # no model loaded, no server started
    # The printed file is a config file that gives the same values.
    again = run("serve", "--config", write(tmp_path, text, "printed.toml"), "--print-config")
    assert again.returncode == 0, again.stderr
    assert again.stdout == text


@pytest.mark.parametrize("text,named", [
    ("max_batch = 8\nmax_bach = 4\n", r":2: unknown key 'max_bach'"),
    ('max_queue = "many"\n', r":1: key 'max_queue': expected an integer, got a string"),
    ("[memory]\nmemory_utilization = 1.5\n", r":2: key 'memory_utilization': must be in \(0, 1\]"),
    ("max_batch = \n", r":1:\d+: not valid TOML"),
])
def test_bad_config_file_exits_nonzero_naming_the_key(tmp_path, text, named):
    path = write(tmp_path, text)
    out = run("serve", "--config", path, "--port", "0")
    assert out.returncode != 0
    assert re.search(re.escape(path) + named, out.stderr), out.stderr


def test_missing_config_file(tmp_path):
    out = run("serve", "--config", str(tmp_path / "absent.toml"), "--print-config")
    assert out.returncode != 0
    assert "cannot read config file" in out.stderr and "absent.toml" in out.stderr


SETTINGS = ["--device", "virt:0=1GiB", "--max-batch", "4", "--max-batch-tokens", "256",
            "--memory-reserve", "1MiB", "--memory-utilization", "0.8"]


def test_plan_agrees_with_a_server_with_the_same_settings(make_server):
    server = make_server(*SETTINGS)
    model = server.get("/v1/models").json()["data"][0]
    device = server.admission()["devices"][0]

    text = run("plan", "--model-dir", MODEL_DIR, "--threads", "1", *SETTINGS)
    assert text.returncode == 0, text.stderr
    budget = device["budget_bytes"]
    assert "budget = capacity x utilization - resident - workspace - reserve" in text.stdout
    assert (f"= {1 << 30} x 0.8 - {model['resident_bytes']} - {model['workspace_bytes']} - {1 << 20} "
            f"= {budget} bytes") in text.stdout, text.stdout
    rows = re.findall(r"^\s+(\d+)\s+(\d+)\s+(\d+)\s+\S+ \S+\s+(\d+)\s+(\d+)\s+(.+)$", text.stdout, re.M)
    sizes = [(p, m) for p in (16, 64, 128, 256) for m in (16, 64, 256) if p + m <= model["context_length"]]
    assert [(int(r[0]), int(r[1])) for r in rows] == sizes, text.stdout
    for prompt, max_tokens, cost, memory_fit, concurrent, bound_by in rows:
        expected_cost = cost_of(model, int(prompt) + int(max_tokens))
        assert int(cost) == expected_cost
        assert int(memory_fit) == budget // expected_cost
        assert int(concurrent) == min(4, budget // expected_cost)
        assert bound_by == ("max_batch" if budget // expected_cost >= 4 else "memory")

    as_json = run("plan", "--model-dir", MODEL_DIR, "--threads", "1", "--json", *SETTINGS)
    assert as_json.returncode == 0, as_json.stderr
    plan = json.loads(as_json.stdout)
    assert plan["budget_bytes"] == budget
    for key in ("resident_bytes", "workspace_bytes", "kv_bytes_per_token", "sequence_overhead_bytes",
                "context_length"):
        assert plan[key] == model[key], key
    assert [(r["prompt_tokens"], r["max_tokens"], r["cost_bytes"]) for r in plan["rows"]] == \
        [(p, m, cost_of(model, p + m)) for p, m in sizes]


def test_plan_where_memory_binds(make_server):
    settings = ["--device", "virt:0=8MiB", "--max-batch", "8", "--max-batch-tokens", "64"]
    server = make_server(*settings)
    model = server.get("/v1/models").json()["data"][0]
    budget = server.admission()["devices"][0]["budget_bytes"]
    out = run("plan", "--model-dir", MODEL_DIR, "--threads", "1", "--json", *settings)
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)["rows"]
    assert rows
    for r in rows:
        fit = budget // cost_of(model, r["prompt_tokens"] + r["max_tokens"])
        assert r["memory_fit"] == fit
        assert r["concurrent"] == min(8, fit)
    assert any(r["bound_by"] == "memory" for r in rows), rows


def test_plan_errors_name_the_problem(tmp_path):
    bad_dir = run("plan", "--model-dir", str(tmp_path / "nomodel"), "--device", "virt:0=1GiB")
    assert bad_dir.returncode != 0
    assert "nomodel" in bad_dir.stderr
    bad_device = run("plan", "--model-dir", MODEL_DIR, "--device", "gpu0")
    assert bad_device.returncode != 0
    assert "--device" in bad_device.stderr and "virt:N=SIZE" in bad_device.stderr


def test_relative_paths_in_a_config_file_are_relative_to_its_folder(tmp_path):
    folder = tmp_path / "etc" / "vramgate"
    folder.mkdir(parents=True)
    model = os.path.abspath(MODEL_DIR)
    path = write(folder, f'model_dir = "{os.path.relpath(model, folder)}"\n[traffic]\napi_keys = "keys.txt"\n')
    (folder / "keys.txt").write_text("sk-one-0001\n")
    out = run("serve", "--config", path, "--print-config")  # from the repository's folder, not etc/vramgate
    assert out.returncode == 0, out.stderr
    assert re.search(r'^model_dir = "' + re.escape(model) + '"$', out.stdout, re.M), out.stdout
    assert re.search(r'^api_keys = "' + re.escape(str(folder / "keys.txt")) + '"$', out.stdout, re.M), out.stdout


def test_example_deploy_config_is_valid():
    example = os.path.join(ROOT, "deploy", "vramgate.toml")
    out = run("serve", "--config", example, "--print-config")
    assert out.returncode == 0, out.stderr
    assert re.search(r'^device = "virt:0=2GiB"$', out.stdout, re.M), out.stdout


def documented_config_excerpt():
    """The TOML block of the Config file section of docs/operations.md (the excerpt of deploy/vramgate.toml)."""
    page = open(os.path.join(ROOT, "docs", "operations.md"), encoding="utf-8").read()
    section = page[page.index("### Config file"):]
    section = section[:section.index("\n### ")]
    blocks = re.findall(r"^```toml\n(.*?)^```", section, re.M | re.S)
    assert len(blocks) == 1, blocks
    return tomllib.loads(blocks[0])


def test_the_documented_config_example_is_an_excerpt_of_the_deploy_file():
    excerpt = documented_config_excerpt()
    with open(os.path.join(ROOT, "deploy", "vramgate.toml"), "rb") as f:
        deploy = tomllib.load(f)
    assert excerpt, "docs/operations.md shows no keys"
    for table, keys in excerpt.items():
        assert isinstance(keys, dict), f"{table} is not a table"
        for key, value in keys.items():
            assert deploy.get(table, {}).get(key, "(missing)") == value, f"[{table}] {key}"


def test_a_budget_too_small_for_any_request_fails_start_up():
    out = subprocess.run([BIN, "serve", "--model-dir", MODEL_DIR, "--port", "0", "--device", "virt:0=12MiB",
                          "--memory-reserve", "100GiB"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2  # the settings cannot serve
    assert "cannot hold even a 2-token request" in out.stdout + out.stderr


def test_the_engine_offers_engine_settings_only():
    """`vramgate engine` lists and takes the device's settings, not the HTTP side's."""
    out = run("engine", "--help")
    assert out.returncode == 0, out.stderr
    for flag in ("--max-batch", "--memory-reserve", "--queue", "--claim-idle", "--orphan-timeout", "--listen"):
        assert flag in out.stdout, flag
    for flag in ("--port", "--api-keys", "--rate-limit", "--cors-allow-origin", "--gateway-only", "--engine "):
        assert flag not in out.stdout, flag
    refused = run("engine", "--listen", "unix:/nonexistent/e.sock", "--port", "9000")
    assert refused.returncode != 0
    assert "--port" in refused.stdout + refused.stderr
