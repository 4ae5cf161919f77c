"""The parts of bench/gpu.py that need torch, and for the Hugging Face
baselines transformers (imported on first use): machine facts, device copy
bandwidth, a random LLaMA checkpoint written from the device, and
`generate()` timings. Times are seconds unless a name says otherwise."""
import argparse
import gc
import json
import math
import os
import statistics
import struct
import sys
import threading
import time

import torch

TOOLS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
SAFETENSORS_NAMES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}


def transformers_version():
    """(version, None), or (None, why it cannot be imported)."""
    try:
        import transformers
        return transformers.__version__, None
    except Exception as e:  # any failure to import means no baseline, with its reason
        return None, f"transformers not importable: {type(e).__name__}: {e}"


def machine_info(device):
    """GPU name and memory (bytes), torch, CUDA and transformers versions."""
    dev = torch.device(device)
    info = {"torch": torch.__version__, "cuda": torch.version.cuda, "transformers": transformers_version()[0]}
    if dev.type == "cuda" and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(dev)
        info.update(gpu=props.name, gpu_memory_bytes=props.total_memory,
                    compute_capability=f"{props.major}.{props.minor}", cudnn=torch.backends.cudnn.version())
    return info


def sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def release(device):
    """Returns this process's cached device blocks, so a server sees them free."""
    gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()


def copy_bandwidth(device, nbytes=1 << 30, iters=50):
    """Device-to-device copy rate: bytes read + bytes written per second, over
    `iters` copies of an `nbytes` buffer after one untimed copy."""
    src = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    sync(device)
    t0 = time.perf_counter()
    for _ in range(iters):
        dst.copy_(src)
    sync(device)
    seconds = time.perf_counter() - t0
    del src, dst
    release(device)
    return {"bytes_per_s": 2.0 * nbytes * iters / seconds, "copy_bytes": nbytes, "iters": iters, "seconds": seconds}


def llama_config(spec):
    """config.json of a LLaMA checkpoint, as tools/make_random_llama.py writes it."""
    sys.path.insert(0, TOOLS)
    from make_random_llama import make_config
    ns = argparse.Namespace(hidden=spec["hidden"], intermediate=spec["intermediate"], positions=spec["positions"],
                            heads=spec["heads"], layers=spec["layers"], kv_heads=spec["kv_heads"], tie=False,
                            rope_theta=10000.0, dtype="BF16", vocab=spec["vocab"])
    return make_config(ns)


def random_tensor(name, shape, gen, device):
    """make_random_llama.py's initialisation: RMSNorm weights around 1, other
    weights of scale 0.7/sqrt(fan-in), embeddings 8x that."""
    t = torch.randn(shape, generator=gen, device=device, dtype=torch.float32)
    if len(shape) == 1:
        return 1.0 + 0.2 * t
    scale = 0.7 / shape[-1] ** 0.5
    return t * (scale * 8 if name == "model.embed_tokens.weight" else scale)


def safetensors_header(shapes, dtype):
    """The header bytes (length-prefixed, padded to 8) for `shapes` in name order."""
    size = torch.tensor([], dtype=dtype).element_size()
    header, offset = {}, 0
    for name in sorted(shapes):
        n = math.prod(shapes[name]) * size
        header[name] = {"dtype": SAFETENSORS_NAMES[dtype], "shape": list(shapes[name]),
                        "data_offsets": [offset, offset + n]}
        offset += n
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text)) + text


def raw_bytes(t):
    t = t.detach().contiguous().cpu()
    return (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy().tobytes()


def write_llama(folder, spec, device, seed=1, dtype=torch.bfloat16):
    """Writes a random LLaMA (config.json, generation_config.json,
    model.safetensors) in the Hugging Face layout, each tensor drawn on
    `device` and streamed to the file. Returns {seconds, bytes, parameters}."""
    sys.path.insert(0, TOOLS)
    from llama import tensor_shapes
    t0 = time.perf_counter()
    cfg = llama_config(spec)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
    with open(os.path.join(folder, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 1, "eos_token_id": 2}, f, indent=2)
    shapes = tensor_shapes(cfg)
    gen = torch.Generator(device=device).manual_seed(seed)
    path = os.path.join(folder, "model.safetensors")
    with open(path, "wb") as f:
        f.write(safetensors_header(shapes, dtype))
        for name in sorted(shapes):
            f.write(raw_bytes(random_tensor(name, shapes[name], gen, device).to(dtype)))
    release(device)
    return {"seconds": time.perf_counter() - t0, "bytes": os.path.getsize(path),
            "parameters": sum(math.prod(s) for s in shapes.values())}


def load_hf(folder, dtype, device):
    """AutoModelForCausalLM of `folder` in `dtype` on `device`, in eval mode."""
    import transformers
    major_minor = tuple(int(x) for x in transformers.__version__.split(".")[:2])
    key = "dtype" if major_minor >= (4, 56) else "torch_dtype"
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, **{key: DTYPES[dtype]})
    return model.to(device).eval()


def pad_id(model):
    eos = model.generation_config.eos_token_id
    if eos is None:
        eos = model.config.eos_token_id
    return (eos[0] if isinstance(eos, list) else eos) or 0


def generate(model, prompts, new_tokens, device):
    """One batched greedy generate() of exactly `new_tokens` per prompt
    (min_new_tokens = max_new_tokens). Returns {batch, tokens, wall_s,
    tokens_per_s, ms_per_step}."""
    ids = torch.tensor(prompts, device=device)
    sync(device)
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=pad_id(model))
    sync(device)
    wall = time.perf_counter() - t0
    new = out.shape[1] - ids.shape[1]
    return {"batch": len(prompts), "tokens": new * len(prompts), "new_tokens_per_sequence": new, "wall_s": wall,
            "tokens_per_s": new * len(prompts) / wall, "ms_per_step": 1000.0 * wall / max(1, new)}


def greedy_ids(model, prompt, new_tokens, device):
    """Greedy continuation of one prompt by plain forward passes with the KV
    cache: argmax at every step, end-of-text not suppressed (as vramgate's
    ignore_eos decodes it)."""
    out_ids = []
    with torch.inference_mode():
        out = model(input_ids=torch.tensor([prompt], device=device), use_cache=True)
        for _ in range(new_tokens):
            tok = out.logits[0, -1].float().argmax()
            out_ids.append(int(tok))
            if len(out_ids) == new_tokens:
                break
            out = model(input_ids=tok.view(1, 1), past_key_values=out.past_key_values, use_cache=True)
    return out_ids


def semaphore_peer(model, prompts, new_tokens, device, requests=16, concurrency=4):
    """`requests` threads, one generate() each (batch 1), at most `concurrency`
    at once behind a semaphore. Returns {requests, concurrency, tokens, wall_s,
    tokens_per_s, latency_s}."""
    gate = threading.Semaphore(concurrency)
    done = [None] * requests

    def one(i):
        with gate:
            done[i] = generate(model, [prompts[i % len(prompts)]], new_tokens, device)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(requests)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    ok = [r for r in done if r]
    tokens = sum(r["tokens"] for r in ok)
    lat = [r["wall_s"] for r in ok]
    return {"requests": requests, "completed": len(ok), "concurrency": concurrency, "tokens": tokens,
            "wall_s": wall, "tokens_per_s": tokens / wall,
            "latency_s": {"median": statistics.median(lat), "max": max(lat)} if lat else None}


def hf_bench(folder, dtype, device, prompts, batches, new_tokens, keep_going, greedy=True, peer=None):
    """Hugging Face on one checkpoint and dtype: a warm-up, a batched generate
    per entry of `batches` while keep_going() holds, the greedy ids of
    prompts[0] and, with `peer` = {requests, concurrency}, the semaphore peer.
    The model is released from the device on return."""
    t0 = time.perf_counter()
    model = load_hf(folder, dtype, device)
    res = {"load_s": time.perf_counter() - t0, "rounds": [], "skipped": []}
    try:
        generate(model, prompts[:1], 4, device)
        for b in batches:
            if keep_going():
                res["rounds"].append(generate(model, prompts[:b], new_tokens, device))
            else:
                res["skipped"].append(f"batch {b}")
        if greedy:
            if keep_going():
                res["greedy_ids"] = greedy_ids(model, prompts[0], new_tokens, device)
            else:
                res["skipped"].append("greedy ids")
        if peer:
            if keep_going():
                res["peer"] = semaphore_peer(model, prompts, new_tokens, device, **peer)
            else:
                res["skipped"].append("semaphore peer")
    finally:
        del model
        release(device)
    return res
