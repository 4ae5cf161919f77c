#!/usr/bin/python3
"""The design most teams start from, for a TorchScript model: FastAPI +
uvicorn + PyTorch, the model loaded at start-up with torch.jit.load,
inference in a thread pool behind an asyncio.Semaphore(N) (PEER_MODE=sem:N,
or naive: every request at once). It speaks the same KServe v2 JSON as
vramgate (POST /v2/models/{name}/infer, GET /v2/health/ready), so
bench/torchscript.py sends both the same traffic.

    PEER_MODEL=/tmp/ts/image_to_image PEER_MODE=sem:2 \\
        /usr/bin/python3 -m uvicorn torchscript_peer:app --app-dir bench --port 8100

Needs Debian's python3-fastapi, python3-uvicorn and python3-torch.
"""
import asyncio
import os
from concurrent.futures import ThreadPoolExecutor

import torch
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

MODE = os.environ.get("PEER_MODE", "sem:2")
MODEL_DIR = os.environ["PEER_MODEL"]
NAME = os.path.basename(os.path.normpath(MODEL_DIR))
torch.set_num_threads(int(os.environ.get("PEER_TORCH_THREADS", "1")))
MODULE = torch.jit.load(os.path.join(MODEL_DIR, "model.pt"))
EXEC = ThreadPoolExecutor(64)
SEM = asyncio.Semaphore(int(MODE.split(":")[1])) if MODE.startswith("sem:") else None
app = FastAPI()


def run(inputs):
    with torch.no_grad():
        out = MODULE(*inputs)
    return out if isinstance(out, tuple) else (out,)


@app.get("/v2/health/ready")
async def ready():
    return {"ready": True}


@app.post("/v2/models/{name}/infer")
async def infer(name: str, request: Request):
    if name != NAME:
        return JSONResponse({"error": {"type": "model_not_found", "message": name}}, status_code=404)
    body = await request.json()
    inputs = [torch.tensor(t["data"], dtype=torch.float32).reshape(t["shape"]) for t in body["inputs"]]
    loop = asyncio.get_running_loop()
    try:
        if SEM is None:
            outs = await loop.run_in_executor(EXEC, run, inputs)
        else:
            async with SEM:
                outs = await loop.run_in_executor(EXEC, run, inputs)
    except RuntimeError as e:  # what an out-of-memory error becomes in such an app
        return JSONResponse({"error": {"type": "internal", "message": str(e)[:200]}}, status_code=500)
    return {"model_name": NAME, "outputs": [{"name": f"output{i}", "datatype": "FP32", "shape": list(o.shape),
                                             "data": o.flatten().tolist()} for i, o in enumerate(outs)]}
