#!/usr/bin/python3
"""Reference forward pass of a model folder (config.json + model.safetensors or
its shards), for model_type gpt2 (tools/tinylm.py; tensor names as Hugging Face
GPT-2, an optional 'transformer.' prefix stripped) and llama (tools/llama.py).

Runs each prompt through the full causal forward pass in float64 and writes
the logits of every position. The C++ forward pass is checked against it
(tests/unit/model).

    /usr/bin/python3 tools/reference_forward.py --model models/tinylm --prompts '[[72,105],[1,2,3]]'

--format json (default): {"vocab_size": V, "logits": [[[V floats] per position] per prompt]}
--format text: per prompt one line "<positions> <V*positions floats>" (easy to read from C++).
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama  # noqa: E402
from tinylm import GPT2, load_checkpoint  # noqa: E402


def load_model(folder):
    """(forward: ids -> logits [T, vocab] float64, config dict)."""
    with open(os.path.join(folder, "config.json")) as f:
        cfg = json.load(f)
    tensors = load_checkpoint(folder)
    if cfg.get("model_type") == "llama":
        return (lambda ids: llama.forward(cfg, tensors, ids)), cfg
    if cfg.get("model_type") != "gpt2":
        raise SystemExit(f"{folder}: model_type {cfg.get('model_type')!r} is not gpt2 or llama")
    cfg.setdefault("n_positions", cfg.get("n_ctx"))
    tensors = {(k[len("transformer."):] if k.startswith("transformer.") else k): v for k, v in tensors.items()}
    model = GPT2(cfg).double()
    model.load_tensors(tensors)
    model.eval()
    return (lambda ids: model(torch.tensor([ids], dtype=torch.int64))[0]), cfg


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="model folder")
    ap.add_argument("--prompts", required=True, help="JSON list of token-id lists, or @file holding it")
    ap.add_argument("--out", help="output file (default: stdout)")
    ap.add_argument("--format", choices=["json", "text"], default="json")
    args = ap.parse_args()

    text = args.prompts
    if text.startswith("@"):
        with open(text[1:]) as f:
            text = f.read()
    prompts = json.loads(text)
    forward, cfg = load_model(args.model)
    results = []
    with torch.no_grad():
        for ids in prompts:
            results.append(forward(ids).tolist())
    if args.format == "json":
        out = json.dumps({"vocab_size": cfg["vocab_size"], "logits": results})
    else:
        lines = []
        for rows in results:
            flat = [repr(float(x)) for row in rows for x in row]
            lines.append(f"{len(rows)} " + " ".join(flat))
        out = "\n".join(lines) + "\n"
    if args.out:
        with open(args.out, "w") as f:
            f.write(out)
    else:
        sys.stdout.write(out)


if __name__ == "__main__":
    main()
