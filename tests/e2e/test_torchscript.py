"""TorchScript models through the KServe v2 API: the test models of
tools/make_torchscript_models.py, served next to tinylm from one
multi-model folder. The forward pass through vramgate equals the Python
TorchScript module's; GET /v2/models/{name} shows the memory profile; bad
input is a 400 naming the input; the binary tensor data extension answers
what the JSON path answers, and refuses inconsistent bodies by input;
requests of different lengths padded into one batch get what each gets
alone, within the budget; tensor requests move /metrics and write request
log lines; a shape that can never fit is 413 at once;
mixed resolutions at 32 concurrent clients on a small virtual device run
out of memory under --admission none and never under memory (every request
200 or 503 + Retry-After); batches grow until the reserved bytes would pass
the budget; a batch that runs out of memory is split and retried."""
import http.client
import json
import math
import os
import shutil
import struct
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
import torch

from conftest import MODEL_DIR, Server

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIG_BODY = ["--max-body-bytes", str(16 << 20)]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("ts")
    subprocess.run(["/usr/bin/python3", os.path.join(ROOT, "tools", "make_torchscript_models.py"), str(root)],
                   check=True, stdout=subprocess.DEVNULL)
    return root


@pytest.fixture(scope="module")
def mixed_root(models, tmp_path_factory):
    root = tmp_path_factory.mktemp("mixed")
    shutil.copytree(MODEL_DIR, root / "tinylm")
    for name in ("image_classifier", "image_to_image", "audio_classifier"):
        shutil.copytree(models / name, root / name)
    return root


@pytest.fixture(scope="module")
def server(mixed_root):
    s = Server("--device", "virt:0=256MiB", *BIG_BODY, model_dir=str(mixed_root))
    yield s
    assert s.stop() == 0, s.logs()


def tensor(name, values):
    return {"name": name, "shape": list(values.shape), "datatype": "FP32", "data": values.flatten().tolist()}


def infer(server, model, body, **kw):
    return server.post(f"/v2/models/{model}/infer", body, **kw)


def error_of(resp):
    body = resp.json()
    assert set(body) == {"error"}, body
    return body["error"]


@pytest.mark.parametrize("name,shape", [("image_classifier", (2, 3, 100, 120)), ("image_to_image", (1, 3, 97, 110)),
                                        ("audio_classifier", (3, 25000))])
def test_forward_equals_the_python_torchscript_module(server, models, name, shape):
    module = torch.jit.load(str(models / name / "model.pt"))
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        want = module(x)
    input_name = {"audio_classifier": "audio"}.get(name, "image")
    r = infer(server, name, {"id": "abc", "inputs": [tensor(input_name, x)]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model_name"] == name and body["id"] == "abc"
    (out,) = body["outputs"]
    assert out["datatype"] == "FP32" and out["shape"] == list(want.shape)
    got = torch.tensor(out["data"]).reshape(want.shape)
    assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()
    assert body["parameters"]["reserved_bytes"] > 0
    assert "X-Queue-Position" in r.headers


def test_language_models_still_answer_next_to_tensor_models(server):
    r = server.post("/v1/completions", {"model": "tinylm", "prompt": "Hello", "max_tokens": 3})
    assert r.status_code == 200, r.text
    ids = {m["id"]: m["family"] for m in server.get("/v1/models").json()["data"]}
    assert ids == {"tinylm": "gpt2", "image_classifier": "torchscript", "image_to_image": "torchscript",
                   "audio_classifier": "torchscript"}
    r = server.post("/v1/completions", {"model": "image_classifier", "prompt": "x", "max_tokens": 1})
    assert r.status_code == 400 and "/v2/models/image_classifier/infer" in error_of(r)["message"]
    r = server.get("/v2/models/tinylm")
    assert r.status_code == 404 and error_of(r)["type"] == "model_not_found"


def test_health_and_metadata_with_the_memory_profile(server):
    assert server.get("/v2/health/live").json() == {"live": True}
    assert server.get("/v2/health/ready").json() == {"ready": True}
    assert server.get("/v2/models/image_to_image/ready").status_code == 200
    assert server.get("/v2").json()["name"] == "vramgate"
    meta = server.get("/v2/models/image_to_image").json()
    assert meta["name"] == "image_to_image" and meta["platform"] == "pytorch_torchscript"
    assert meta["inputs"] == [{"name": "image", "datatype": "FP32", "shape": [-1, 3, -1, -1],
                               "dims": ["batch", 3, "height", "width"]}]
    assert meta["dims"]["height"] == {"min": 96, "max": 256}
    p = meta["memory_profile"]
    assert p["bytes_per_element"] > 0 and p["resident_bytes"] > 0 and p["safety_factor"] >= 1
    held = [s for s in p["samples"] if s["held_out"]]
    fitted = [s for s in p["samples"] if not s["held_out"]]
    assert len(held) >= 2 and len(fitted) >= 3
    for s in fitted:
        assert s["peak_bytes"] <= s["predicted_bytes"], s
    for s in held:  # sizes the fit never saw: within the prediction, at most 25 % above it
        assert s["peak_bytes"] <= s["predicted_bytes"] <= 1.25 * s["peak_bytes"], s
    assert server.get("/v2/models/nope").status_code == 404


def test_bad_input_is_a_400_naming_the_input(server):
    good = torch.zeros(1, 3, 96, 96)
    cases = [
        ({"inputs": [dict(tensor("image", good), datatype="INT32")]}, "input 'image': datatype 'INT32'"),
        ({"inputs": [tensor("image", torch.zeros(3, 96, 96))]}, "input 'image': rank 3"),
        ({"inputs": [tensor("image", torch.zeros(1, 3, 4, 96))]}, "input 'image': dimension 'height' is 4"),
        ({"inputs": [tensor("image", torch.zeros(1, 3, 96, 300))]}, "input 'image': dimension 'width' is 300"),
        ({"inputs": [dict(tensor("image", good), data=[0.0] * 10)]}, "input 'image': data has 10 values"),
        ({"inputs": [tensor("picture", good)]}, "input 'picture': unknown input"),
        ({"inputs": [dict(tensor("image", good), data=["a"] * 27648)]}, "input 'image': 'data' must hold only numbers"),
        ({"inputs": [dict(tensor("image", good), parameters={"binary_data_size": 110592})]},
         "input 'image': has both 'data' and parameter 'binary_data_size'"),
        ({"inputs": [tensor("image", good)], "outputs": [{"name": "logits", "parameters": {"binary_data": 1}}]},
         "parameter 'binary_data' must be true or false"),
        ({"inputs": [tensor("image", good)], "extra": 1}, "unknown field 'extra'"),
        ({"inputs": []}, "'inputs'"),
    ]
    for body, expected in cases:
        r = infer(server, "image_classifier", body)
        assert r.status_code == 400, (expected, r.text)
        e = error_of(r)
        assert e["type"] == "invalid_request" and expected in e["message"], (expected, e)
    r = requests.post(server.url + "/v2/models/image_classifier/infer", data=b"{not json")
    assert r.status_code == 400
    assert server.get("/v2/models/image_classifier/infer").status_code == 405


def image_body(side, batch=1):
    n = batch * 3 * side * side
    return {"inputs": [{"name": "image", "shape": [batch, 3, side, side], "datatype": "FP32", "data": [0.5] * n}]}


def test_a_shape_that_can_never_fit_is_413_at_once(models, make_server):
    s = make_server("--device", "virt:0=24MiB", *BIG_BODY, model_dir=str(models / "image_to_image"))
    r = s.post("/v2/models/image_to_image/infer", image_body(256, batch=8))
    assert r.status_code == 413, r.text
    e = error_of(r)
    assert e["type"] == "exceeds_device_memory" and e["needed_bytes"] > e["budget_bytes"] > 0, e
    assert s.post("/v2/models/image_to_image/infer", image_body(96)).status_code == 200


SIDES = [96, 128, 192, 256]


def burst(server, clients=32):
    def one(i):
        return server.post("/v2/models/image_to_image/infer", image_body(SIDES[i % len(SIDES)]), timeout=300)
    with ThreadPoolExecutor(clients) as pool:
        return list(pool.map(one, range(clients)))


def test_mixed_resolutions_at_32_clients_none_runs_out_of_memory_memory_never_does(models, make_server):
    capacity = 24 << 20  # one 256 x 256 forward pass peaks at about 13 MiB: two at once do not fit
    # The step delay stands in for a slow model: requests that arrive meanwhile wait together.
    args = ["--device", f"virt:0={capacity}", *BIG_BODY, "--max-queue", "64", "--test-step-delay-ms", "300"]
    naive = make_server("--admission", "none", *args, model_dir=str(models / "image_to_image"))
    results = burst(naive)
    codes = [r.status_code for r in results]
    assert 500 in codes, codes
    assert any(error_of(r)["type"] == "out_of_memory" for r in results if r.status_code == 500)
    assert naive.admission()["out_of_memory"] > 0
    naive.stop()

    gated = make_server("--admission", "memory", *args, model_dir=str(models / "image_to_image"))
    results = burst(gated)
    for r in results:
        assert r.status_code in (200, 503), r.text
        if r.status_code == 503:
            assert int(r.headers["Retry-After"]) >= 1
    assert sum(r.status_code == 200 for r in results) >= len(SIDES)
    st = gated.admission()
    dev = st["devices"][0]
    assert st["out_of_memory"] == 0, st
    assert dev["peak_bytes"] <= dev["capacity_bytes"], dev
    assert dev["peak_reserved_bytes"] <= dev["budget_bytes"], dev  # I1: leases never pass the budget
    assert st["running"] == 0 and dev["reserved_bytes"] == 0, st  # every lease came back


def test_batches_grow_until_the_reserved_bytes_would_pass_the_budget(models, make_server):
    s = make_server("--device", "virt:0=64MiB", *BIG_BODY, "--max-batch", "16", "--max-batch-delay-ms", "200",
                    "--test-step-delay-ms", "100", model_dir=str(models / "image_to_image"))
    budget = s.admission()["devices"][0]["budget_bytes"]
    side = 128
    with ThreadPoolExecutor(40) as pool:
        results = list(pool.map(lambda _: s.post("/v2/models/image_to_image/infer", image_body(side), timeout=300),
                                range(40)))
    assert all(r.status_code == 200 for r in results), [r.text for r in results if r.status_code != 200]
    cost = results[0].json()["parameters"]["reserved_bytes"]
    bound = min(16, budget // cost)
    assert bound >= 2, (budget, cost)
    batches = [r.json()["parameters"]["batch_requests"] for r in results]
    assert max(batches) <= bound, (batches, bound)  # never beyond what the budget holds
    # Batches grow past one request (how close they come to the bound depends on how fast 40 clients
    # arrive on a loaded machine; tensor_cost_test checks the bound itself).
    assert max(batches) >= 2, (batches, bound)

    # A lone request waits at most --max-batch-delay-ms for company, then runs alone.
    r = s.post("/v2/models/image_to_image/infer", image_body(side))
    p = r.json()["parameters"]
    assert p["batch_requests"] == 1 and p["compute_ms"] >= 200, p


def test_a_batch_that_runs_out_of_memory_is_split_and_retried(models, make_server):
    s = make_server("--device", "virt:0=64MiB", *BIG_BODY, "--max-batch", "8", "--max-batch-delay-ms", "300",
                    "--test-inject-oom-step", "1", "--test-inject-oom-count", "1",
                    model_dir=str(models / "image_to_image"))
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: s.post("/v2/models/image_to_image/infer", image_body(96)), range(4)))
    assert all(r.status_code == 200 for r in results), [r.text for r in results]
    st = s.admission()
    assert st["out_of_memory"] == 1 and st["oom_budget_cuts"] == 1, st
    sizes = [r.json()["parameters"]["batch_requests"] for r in results]
    assert max(sizes) <= 2, sizes  # the batch that failed was retried in halves
    assert st["oom_batch_splits"] == 1, st
    assert "vramgate_oom_batch_splits_total 1" in s.get("/metrics").text.splitlines()


def test_plan_prints_the_fit_and_how_many_of_each_shape_fit(models):
    from conftest import BIN
    out = subprocess.run([BIN, "plan", "--model-dir", str(models / "image_to_image"), "--device", "virt:0=48MiB",
                          "--max-batch", "4", "--json"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    import json
    plan = json.loads(out.stdout)
    assert plan["model"] == "image_to_image" and plan["bytes_per_element"] > 0
    assert [r["shape"] for r in plan["rows"]][0] == [1, 3, 96, 96] and plan["rows"][-1]["shape"] == [1, 3, 256, 256]
    for r in plan["rows"]:
        assert r["cost_bytes"] >= r["predicted_bytes"] > 0
        assert r["memory_fit"] == plan["budget_bytes"] // r["cost_bytes"], r
        assert r["concurrent"] == min(r["memory_fit"], 4), r
    text = subprocess.run([BIN, "plan", "--model-dir", str(models / "image_to_image"), "--device", "virt:0=48MiB"],
                          capture_output=True, text=True, timeout=300).stdout
    assert "peak = " in text and "held-out runs" in text and "[1, 3, 256, 256]" in text


@pytest.mark.parametrize("with_language_model", [False, True])
def test_queue_wait_limit_is_503_with_retry_after(models, mixed_root, make_server, with_language_model):
    # One 256 x 256 pass at a time fits; each is held 1 s, so the others outwait --queue-timeout.
    root = str(mixed_root) if with_language_model else str(models / "image_to_image")
    s = make_server("--device", "virt:0=24MiB", *BIG_BODY, "--queue-timeout", "0.5", "--test-step-delay-ms", "1000",
                    model_dir=root)
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: s.post("/v2/models/image_to_image/infer", image_body(256)), range(4)))
    codes = sorted(r.status_code for r in results)
    assert codes[0] == 200 and codes[-1] == 503, codes
    for r in results:
        if r.status_code == 503:
            assert error_of(r)["type"] == "overloaded" and int(r.headers["Retry-After"]) >= 1
    st = s.admission()
    assert st["queue_timeouts"] >= 1 and st["devices"][0]["reserved_bytes"] == 0, st


def test_a_client_that_leaves_while_queued_is_cancelled(models, make_server):
    import json
    import socket
    s = make_server("--device", "virt:0=24MiB", *BIG_BODY, "--test-step-delay-ms", "1500",
                    model_dir=str(models / "image_to_image"))
    holder = ThreadPoolExecutor(1).submit(lambda: s.post("/v2/models/image_to_image/infer", image_body(256)))
    wait_until_running = __import__("conftest").wait_until
    wait_until_running(lambda: s.admission()["running"] == 1, what="the first request running")
    body = json.dumps(image_body(256)).encode()
    host, port = s.url.split("//")[1].split(":")
    sock = socket.create_connection((host, int(port)))
    sock.sendall(b"POST /v2/models/image_to_image/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    wait_until_running(lambda: s.admission()["queued"] == 1, what="the second request queued")
    sock.close()
    wait_until_running(lambda: s.admission()["queued"] == 0, what="the queued request dropped")
    assert holder.result().status_code == 200
    wait_until_running(lambda: s.admission()["running"] == 0, what="the first request done")
    st = s.admission()
    # The second never ran: it left the queue, it did not end among the admitted.
    assert st["completed"] == 1 and st["admitted"] == 1 and st["cancelled"] == 0 and st["cancelled_queued"] == 1, st
    assert st["devices"][0]["reserved_bytes"] == 0, st


# -- the binary tensor data extension (Triton's), with a raw HTTP client

def raw_post(server, path, body, headers):
    host, port = server.url.split("//")[1].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=120)
    try:
        conn.request("POST", path, body=body, headers=headers)
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    finally:
        conn.close()


def binary_infer(server, model, header, tensors):
    """POSTs `header` (a dict) as the JSON header and `tensors` (float lists) as raw FP32 after it."""
    head = json.dumps(header).encode()
    tail = b"".join(struct.pack(f"<{len(t)}f", *t) for t in tensors)
    return raw_post(server, f"/v2/models/{model}/infer", head + tail,
                    {"Inference-Header-Content-Length": str(len(head)), "Content-Type": "application/octet-stream"})


def f32(values):
    """JSON numbers as the float32 values they print (the JSON path writes each float32's shortest form)."""
    return list(struct.unpack(f"<{len(values)}f", struct.pack(f"<{len(values)}f", *values)))


def split_binary_response(headers, body):
    n = int(headers["Inference-Header-Content-Length"])
    head = json.loads(body[:n])
    rest = body[n:]
    out = {}
    for o in head["outputs"]:
        if "parameters" in o and "binary_data_size" in o["parameters"]:
            size = o["parameters"]["binary_data_size"]
            out[o["name"]] = list(struct.unpack(f"<{size // 4}f", rest[:size]))
            rest = rest[size:]
        else:
            out[o["name"]] = o["data"]
    assert rest == b"", "bytes left after the binary outputs"
    return head, out


def test_binary_tensors_answer_what_the_json_path_answers(server):
    x = torch.randn(2, 3, 100, 120, generator=torch.Generator().manual_seed(11))
    values = x.flatten().tolist()
    by_json = infer(server, "image_classifier", {"inputs": [tensor("image", x)]})
    assert by_json.status_code == 200, by_json.text
    want = by_json.json()["outputs"][0]

    # Binary in, binary out.
    header = {"inputs": [{"name": "image", "shape": list(x.shape), "datatype": "FP32",
                          "parameters": {"binary_data_size": 4 * len(values)}}],
              "outputs": [{"name": "logits", "parameters": {"binary_data": True}}]}
    status, headers, body = binary_infer(server, "image_classifier", header, [values])
    assert status == 200, body[:500]
    assert headers["Content-Type"] == "application/octet-stream"
    head, out = split_binary_response(headers, body)
    (meta,) = head["outputs"]
    assert meta["shape"] == want["shape"] and meta["datatype"] == "FP32" and "data" not in meta
    assert meta["parameters"]["binary_data_size"] == 4 * len(want["data"])
    assert out["logits"] == f32(want["data"])  # the same float32 values

    # Binary in, JSON out (and binary_data_output asks for every output as binary).
    header["outputs"] = [{"name": "logits"}]
    status, headers, body = binary_infer(server, "image_classifier", header, [values])
    assert status == 200 and headers["Content-Type"] == "application/json", body[:500]
    assert json.loads(body)["outputs"][0]["data"] == want["data"]  # binary input, the same result
    del header["outputs"]
    header["parameters"] = {"binary_data_output": True}
    status, headers, body = binary_infer(server, "image_classifier", header, [values])
    assert status == 200, body[:500]
    assert split_binary_response(headers, body)[1]["logits"] == f32(want["data"])
    assert "binary_tensor_data" in server.get("/v2").json()["extensions"]


def test_inconsistent_binary_bodies_are_400_naming_the_input(server):
    n = 3 * 96 * 96
    ok = [0.5] * n

    def header(size, shape=(1, 3, 96, 96), datatype="FP32"):
        return {"inputs": [{"name": "image", "shape": list(shape), "datatype": datatype,
                            "parameters": {"binary_data_size": size}}]}

    cases = [
        # binary_data_size not shape x 4
        (header(4 * n - 4), [ok[:-1]], f"input 'image': binary_data_size is {4 * n - 4} bytes, shape [1, 3, 96, 96] of "
                                        f"FP32 needs {4 * n}"),
        # more bytes than the body holds
        (header(4 * n), [ok[:-1]], f"input 'image': binary_data_size {4 * n} runs past the end of the body"),
        # bytes left over
        (header(4 * n), [ok + [1.0]], f"the body has {4 * n + 4} bytes after the JSON header"),
        (header(4 * n, datatype="BYTES"), [ok], "input 'image': datatype 'BYTES' is not supported"),
        (header(4 * n, datatype="INT32"), [ok], "input 'image': datatype 'INT32' is not served"),
        (header(8, shape=(1, 3, 4, 96)), [[0.0, 0.0]], "input 'image': binary_data_size is 8 bytes"),
    ]
    for head, tensors, expected in cases:
        status, _, body = binary_infer(server, "image_classifier", head, tensors)
        assert status == 400, (expected, body[:300])
        e = json.loads(body)["error"]
        assert e["type"] == "invalid_request" and expected in e["message"], (expected, e)
    # The header's length past the body, or not a number; binary_data_size without the header.
    payload = json.dumps(header(4 * n)).encode() + struct.pack(f"<{n}f", *ok)
    path = "/v2/models/image_classifier/infer"
    for value, expected in [(str(len(payload) + 1), "but the body has only"), ("x1", "must be a byte count"),
                            ("10", "is not valid JSON")]:
        status, _, body = raw_post(server, path, payload, {"Inference-Header-Content-Length": value})
        assert status == 400 and expected in json.loads(body)["error"]["message"], (value, body[:300])
    status, _, body = raw_post(server, path, json.dumps(header(4 * n)).encode(), {"Content-Type": "application/json"})
    assert status == 400 and "needs the header Inference-Header-Content-Length" in json.loads(body)["error"]["message"]
    assert server.get("/v2/health/live").status_code == 200  # none of it hurt the server


# -- padding: requests of different lengths in one forward pass

def audio_body(samples, seed):
    x = torch.randn(1, samples, generator=torch.Generator().manual_seed(seed))
    return x, {"inputs": [tensor("audio", x)]}


def cost_of(profile, shape):
    elements = math.prod(shape)
    peak = math.ceil(profile["fixed_bytes"] + profile["bytes_per_element"] * elements)
    return math.ceil(peak * profile["safety_factor"])


def padded_burst(s, sizes):
    def one(i):
        x, body = audio_body(sizes[i], seed=100 + i)
        return x, s.post("/v2/models/audio_enhancer/infer", body, timeout=300)
    with ThreadPoolExecutor(len(sizes)) as pool:
        return list(pool.map(one, range(len(sizes))))


def check_padded_results(models, s, results):
    """Each output equals the Python module run on that request alone; returns the batches' parameters."""
    module = torch.jit.load(str(models / "audio_enhancer" / "model.pt"))
    meta = s.get("/v2/models/audio_enhancer").json()
    params = []
    for x, r in results:
        assert r.status_code == 200, r.text
        (out,) = r.json()["outputs"]
        assert out["shape"] == list(x.shape), out["shape"]  # cropped back to its own length
        with torch.no_grad():
            want = module(x)
        got = torch.tensor(out["data"]).reshape(want.shape)
        assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()
        p = r.json()["parameters"]
        rows, padded = p["batch_shape"]
        assert rows == p["batch_requests"] and padded >= x.shape[1], p
        # The pass was admitted at the predicted peak of its padded shape.
        assert abs(p["batch_cost_bytes"] - cost_of(meta["memory_profile"], p["batch_shape"])) <= 2, p
        assert p["batch_cost_bytes"] <= meta["budget_bytes"], p
        params.append(p)
    return params


def test_padded_batches_give_each_request_what_it_gets_alone(models, make_server):
    s = make_server("--device", "virt:0=256MiB", *BIG_BODY, "--max-batch", "8", "--max-batch-delay-ms", "3000",
                    model_dir=str(models / "audio_enhancer"))
    meta = s.get("/v2/models/audio_enhancer").json()
    assert meta["pad"] == ["samples"]
    sizes = [24000, 25000, 31000, 40000, 52000, 24001]  # all different: a batch of two is padded
    params = check_padded_results(models, s, padded_burst(s, sizes))
    assert max(p["batch_requests"] for p in params) >= 2, params
    assert any(p["batch_shape"][1] > min(sizes) for p in params if p["batch_requests"] >= 2), params
    st = s.admission()
    assert st["out_of_memory"] == 0 and st["devices"][0]["reserved_bytes"] == 0, st


def test_a_shape_the_wire_refuses_is_a_400_and_the_engine_keeps_its_gateway(models, make_server):
    # A dimension the HTTP layer passes but the wire's decoder refuses: the engine answers that request
    # with a 400 instead of closing the gateway's connection (which would fail or resume every other
    # request on it and count the engine's counters twice on the reconnect).
    s = make_server("--device", "virt:0=64MiB", *BIG_BODY, model_dir=str(models / "audio_enhancer"))
    ok = {"inputs": [{"name": "audio", "shape": [1, 24000], "datatype": "FP32", "data": [0.0] * 24000}]}
    assert s.post("/v2/models/audio_enhancer/infer", ok).status_code == 200
    before = s.admission()
    r = s.post("/v2/models/audio_enhancer/infer",
               {"inputs": [{"name": "audio", "shape": [1, 1099511627776], "datatype": "FP32", "data": [1, 2, 3]}]})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["type"] == "invalid_request", r.text
    assert s.post("/v2/models/audio_enhancer/infer", ok).status_code == 200
    after = s.admission()
    for key in ("completed", "failed", "cancelled"):
        assert after[key] - before[key] == (1 if key == "completed" else 0), (key, before, after)
    engines = s.get("/v1/engines").json()["data"]
    assert all(e["restarts"] == 0 for e in engines), engines


def test_padded_batches_stay_within_the_budget(models, make_server):
    # A device whose budget holds a few long passes: padding a short request up to a long one must be
    # paid for from the free budget, so batches are smaller than --max-batch and never pass it.
    s = make_server("--device", "virt:0=40MiB", *BIG_BODY, "--max-batch", "16", "--max-batch-delay-ms", "500",
                    "--max-queue", "64", model_dir=str(models / "audio_enhancer"))
    sizes = [24000 + (i * 7919) % 72000 for i in range(16)]
    params = check_padded_results(models, s, padded_burst(s, sizes))
    budget = s.get("/v2/models/audio_enhancer").json()["budget_bytes"]
    assert all(p["batch_cost_bytes"] <= budget for p in params)
    st = s.admission()
    dev = st["devices"][0]
    assert st["out_of_memory"] == 0, st
    assert dev["peak_reserved_bytes"] <= dev["budget_bytes"], dev  # I1 with the padding's extra bytes
    assert dev["peak_bytes"] <= dev["capacity_bytes"], dev
    assert dev["reserved_bytes"] == 0 and st["running"] == 0, st


# -- /metrics and the request log

def request_logs(server):
    return [json.loads(line[line.index("{"):]) for line in list(server.log) if " request {" in line]


def metric(text, name, **labels):
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    total = 0.0
    for line in text.splitlines():
        if line.startswith("#") or " " not in line:
            continue
        key, val = line.rsplit(" ", 1)
        base, _, rest = key.partition("{")
        got = ",".join(sorted(p for p in rest.rstrip("}").split(",") if p and not p.startswith("le=")))
        if base == name and got == want:
            total += float(val)
    return total


def test_tensor_requests_move_metrics_and_write_request_log_lines(server):
    before = server.get("/metrics").text
    x = torch.zeros(1, 3, 96, 96)
    ids = [f"ts-log-{i}" for i in range(3)]
    for rid in ids:
        r = infer(server, "image_classifier", {"inputs": [tensor("image", x)]}, headers={"X-Request-Id": rid})
        assert r.status_code == 200, r.text
    bad = infer(server, "image_classifier", {"inputs": [tensor("picture", x)]}, headers={"X-Request-Id": "ts-log-bad"})
    assert bad.status_code == 400
    after = server.get("/metrics").text
    model = {"model": "image_classifier"}

    def delta(name, **labels):
        return metric(after, name, **labels) - metric(before, name, **labels)

    assert delta("vramgate_tensor_requests_total", outcome="completed", **model) == 3
    assert delta("vramgate_tensor_queue_wait_seconds_count", **model) == 3
    assert delta("vramgate_tensor_request_duration_seconds_count", **model) == 3
    assert delta("vramgate_tensor_request_duration_seconds_sum", **model) > 0
    assert delta("vramgate_tensor_batch_size_count", **model) >= 1
    assert delta("vramgate_queue_wait_seconds_count") >= 3  # the server-wide histograms count them too
    assert delta("vramgate_request_duration_seconds_count") >= 3
    assert delta("vramgate_tensor_requests_total", outcome="completed", model="image_to_image") == 0

    from conftest import wait_until
    wait_until(lambda: set(ids + ["ts-log-bad"]) <= {x["id"] for x in request_logs(server)}, what="request log lines")
    lines = {x["id"]: x for x in request_logs(server)}
    for rid in ids:
        line = lines[rid]
        assert line["model"] == "image_classifier" and line["route"] == "/v2/models/{name}/infer", line
        assert line["status"] == 200 and line["outcome"] == "completed" and line["reserved_bytes"] > 0, line
        assert line["batch_requests"] >= 1 and line["compute_ms"] >= 0 and line["queue_ms"] >= 0, line
        assert line["duration_ms"] >= line["compute_ms"], line
    bad_line = lines["ts-log-bad"]
    assert bad_line["outcome"] == "failed" and bad_line["reason"] == "invalid_request" and bad_line["status"] == 400
