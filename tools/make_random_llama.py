#!/usr/bin/python3
"""Writes a tiny LLaMA-family checkpoint with random weights, in the exact
Hugging Face layout: config.json with the keys LlamaConfig writes, and
model.safetensors (or --shards N shards plus model.safetensors.index.json).

Every weight is random (RMSNorm weights around 1, none exactly 0 or 1), so a
forward pass that drops or misplaces one shows in the logits. Used by the C++
unit tests (tests/unit/model) and tests/e2e/test_llama.py with
tools/reference_forward.py. Variants:

    /usr/bin/python3 tools/make_random_llama.py --out /tmp/m                 # 2 layers, 4 heads, F32
    ... --kv-heads 2              # grouped-query attention
    ... --dtype BF16              # BF16 storage (also F16, F32)
    ... --shards 3                # sharded, with model.safetensors.index.json
    ... --tie                     # tie_word_embeddings: no lm_head.weight
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama import tensor_shapes  # noqa: E402
from tinylm import DTYPES, save_checkpoint  # noqa: E402


def make_config(args):
    """config.json as transformers' LlamaConfig.to_json_string writes it."""
    return {
        "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu", "hidden_size": args.hidden,
        "initializer_range": 0.02, "intermediate_size": args.intermediate,
        "max_position_embeddings": args.positions, "mlp_bias": False, "model_type": "llama",
        "num_attention_heads": args.heads, "num_hidden_layers": args.layers,
        "num_key_value_heads": args.kv_heads or args.heads, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
        "rope_scaling": None, "rope_theta": args.rope_theta, "tie_word_embeddings": args.tie,
        "torch_dtype": {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}[args.dtype],
        "transformers_version": "4.44.0", "use_cache": True, "vocab_size": args.vocab,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="folder to write (created if missing)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=0, help="key/value heads (default: --heads)")
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--intermediate", type=int, default=160)
    ap.add_argument("--positions", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=300)
    ap.add_argument("--rope-theta", type=float, default=10000.0)
    ap.add_argument("--dtype", default="F32", choices=["F32", "F16", "BF16"], help="stored dtype")
    ap.add_argument("--shards", type=int, default=1, help="split into this many safetensors files")
    ap.add_argument("--tie", action="store_true", help="tie_word_embeddings (no lm_head.weight)")
    args = ap.parse_args()

    cfg = make_config(args)
    gen = torch.Generator().manual_seed(args.seed)
    tensors = {}
    for name, shape in tensor_shapes(cfg).items():
        if len(shape) == 1:  # RMSNorm weights
            t = 1.0 + 0.2 * torch.randn(shape, generator=gen, dtype=torch.float64)
        else:
            t = torch.randn(shape, generator=gen, dtype=torch.float64) * (0.7 / shape[-1] ** 0.5)
            if name == "model.embed_tokens.weight":
                t = t * 8  # embeddings of unit scale, as trained models have
        tensors[name] = t.to(DTYPES[args.dtype])
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
    with open(os.path.join(args.out, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 1, "eos_token_id": 2, "transformers_version": "4.44.0"}, f, indent=2)
    save_checkpoint(args.out, tensors, shards=args.shards)


if __name__ == "__main__":
    main()
