#!/usr/bin/python3
"""Writes a small GPT-2 checkpoint with random weights (config.json + model.safetensors or shards).

Every weight, bias and LayerNorm parameter is random (none left at 0 or 1), so a
forward pass that drops or misplaces one of them shows in the logits. Used by
the C++ unit tests (tests/unit/model) together with reference_forward.py:

    /usr/bin/python3 tools/make_random_gpt2.py --out /tmp/m --seed 1 --layers 2 --heads 4 --embd 64
    ... --vocab 50257 --prefix transformer. --shards 2   # a GPT-2 vocabulary, sharded
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tinylm import DTYPES, GPT2, save_checkpoint  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="folder to write (created if missing)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--embd", type=int, default=64)
    ap.add_argument("--positions", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=257)
    ap.add_argument("--dtype", default="F32", choices=sorted(DTYPES), help="stored dtype")
    ap.add_argument("--prefix", default="", help="tensor name prefix, e.g. 'transformer.'")
    ap.add_argument("--shards", type=int, default=1,
                    help="split into this many safetensors files with model.safetensors.index.json")
    ap.add_argument("--attn-bias-buffers", action="store_true",
                    help="also store h.{i}.attn.bias causal-mask buffers, as old HF checkpoints do")
    args = ap.parse_args()

    torch.manual_seed(args.seed)
    cfg = {"model_type": "gpt2", "n_layer": args.layers, "n_head": args.heads, "n_embd": args.embd,
           "n_positions": args.positions, "n_ctx": args.positions, "vocab_size": args.vocab,
           "eos_token_id": args.vocab - 1, "bos_token_id": args.vocab - 1, "layer_norm_epsilon": 1e-5}
    model = GPT2(cfg)
    tensors = {}
    with torch.no_grad():
        for name, p in model.state_tensors().items():
            if name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or name == "ln_f.weight":
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif p.dim() == 1:
                p.copy_(0.1 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) * (0.5 / p.shape[0] ** 0.5))
            tensors[args.prefix + name] = p.detach().to(DTYPES[args.dtype])
    if args.attn_bias_buffers:
        P = args.positions
        for i in range(args.layers):
            tensors[f"{args.prefix}h.{i}.attn.bias"] = torch.tril(torch.ones(P, P)).view(1, 1, P, P)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    save_checkpoint(args.out, tensors, shards=args.shards)


if __name__ == "__main__":
    main()
