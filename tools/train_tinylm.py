#!/usr/bin/python3
"""Trains tinylm, vramgate's default model, on the text of Debian's `fortunes` packages.

Byte-level GPT-2: vocabulary = 256 bytes + one end-of-text token (id 256).
Deterministic for a given seed and thread count. Regenerate the committed files with:

    cd tools && /usr/bin/python3 train_tinylm.py --out ../models/tinylm

(needs the Debian packages python3-torch, fortunes and fortunes-min).
"""
import argparse
import glob
import json
import math
import os
import time

import torch
import torch.nn.functional as F

from tinylm import GPT2, save_safetensors

CHATML_TEMPLATE = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
                   "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
                   "{% endif %}")

EOT = 256


def load_corpus(root):
    docs = []
    for path in sorted(glob.glob(os.path.join(root, "*"))):
        if os.path.isdir(path) or path.endswith((".dat", ".u8")) or os.path.islink(path):
            continue
        with open(path, "rb") as f:
            text = f.read()
        for doc in text.split(b"\n%\n"):
            doc = doc.strip(b"%\n")
            if len(doc) >= 8:
                docs.append(doc)
    return docs


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="models/tinylm")
    ap.add_argument("--corpus", default="/usr/share/games/fortunes")
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--embd", type=int, default=128)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--window", type=int, default=128, help="training window in bytes")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=4000)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()

    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    docs = load_corpus(args.corpus)
    stream = []
    for d in docs:
        stream.extend(d)
        stream.append(EOT)
    data = torch.tensor(stream, dtype=torch.long)
    n_val = len(data) // 50
    train, val = data[:-n_val], data[-n_val:]
    print(f"corpus: {len(docs)} documents, {len(data)} tokens", flush=True)

    cfg = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_layer": args.layers,
           "n_head": args.heads, "n_embd": args.embd, "n_positions": args.context, "n_ctx": args.context,
           "vocab_size": 257, "bos_token_id": EOT, "eos_token_id": EOT, "layer_norm_epsilon": 1e-5,
           "activation_function": "gelu_new", "torch_dtype": "float32"}
    model = GPT2(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.01)
    gen = torch.Generator().manual_seed(args.seed)

    def batch(src, n, win):
        # Windows start at random offsets; positions beyond `win` are trained by
        # occasionally drawing full-context windows.
        ix = torch.randint(0, len(src) - win - 1, (n,), generator=gen)
        x = torch.stack([src[i:i + win] for i in ix])
        y = torch.stack([src[i + 1:i + win + 1] for i in ix])
        return x, y

    start = time.time()
    warm = 100
    for step in range(1, args.steps + 1):
        lr = args.lr * min(1.0, step / warm) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / args.steps)))
        for g in opt.param_groups:
            g["lr"] = lr
        if step % 4 == 0:
            x, y = batch(train, args.batch * args.window // args.context, args.context)
        else:
            x, y = batch(train, args.batch, args.window)
        loss = F.cross_entropy(model(x).reshape(-1, 257), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 100 == 0 or step == args.steps:
            print(f"step {step} loss {loss.item():.3f} lr {lr:.2e} {time.time() - start:.0f}s", flush=True)

    model.eval()
    with torch.no_grad():
        g2 = torch.Generator().manual_seed(0)
        losses = []
        for _ in range(20):
            ix = torch.randint(0, len(val) - args.context - 1, (8,), generator=g2)
            x = torch.stack([val[i:i + args.context] for i in ix])
            y = torch.stack([val[i + 1:i + args.context + 1] for i in ix])
            losses.append(F.cross_entropy(model(x).reshape(-1, 257), y.reshape(-1)).item())
        val_loss = sum(losses) / len(losses)
    elapsed = time.time() - start
    print(f"final train loss {loss.item():.3f}, validation loss {val_loss:.3f} nats/byte, {elapsed:.0f}s")

    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    save_safetensors(os.path.join(args.out, "model.safetensors"),
                     {k: v.detach() for k, v in model.state_tensors().items()},
                     metadata={"format": "pt"})
    # ChatML, so that /v1/chat/completions works without a request chat_template.
    # The byte vocabulary has no special tokens: the markers are plain text.
    with open(os.path.join(args.out, "tokenizer_config.json"), "w") as f:
        json.dump({"chat_template": CHATML_TEMPLATE}, f, indent=2)
        f.write("\n")
    with open(os.path.join(args.out, "training.json"), "w") as f:
        json.dump({"steps": args.steps, "seed": args.seed, "batch": args.batch, "window": args.window,
                   "final_train_loss": round(loss.item(), 4), "validation_loss": round(val_loss, 4),
                   "seconds": round(elapsed), "documents": len(docs), "tokens": len(data)}, f, indent=2)
        f.write("\n")

    # A greedy-ish sample, for the model README.
    with torch.no_grad():
        g3 = torch.Generator().manual_seed(7)
        ids = list(b"The ")
        for _ in range(160):
            logits = model(torch.tensor([ids[-args.context:]]))[0, -1] / 0.7
            nxt = torch.multinomial(logits.softmax(-1), 1, generator=g3).item()
            if nxt == EOT:
                break
            ids.append(nxt)
        print("sample:", bytes(ids).decode("utf-8", "replace"))


if __name__ == "__main__":
    main()
