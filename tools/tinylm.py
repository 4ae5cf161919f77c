"""GPT-2 architecture in plain PyTorch, plus a minimal safetensors reader/writer.

Used by tools/train_tinylm.py (training) and tools/reference_forward.py (the
reference the C++ forward pass is checked against). Tensor names and layouts
follow Hugging Face GPT-2 checkpoints: Conv1D weights are stored [in, out].
"""
import json
import math
import os
import struct

import torch
import torch.nn.functional as F

DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}


def save_safetensors(path, tensors, metadata=None):
    """Writes tensors (name -> contiguous CPU tensor) in the safetensors layout:
    u64 little-endian header size, JSON header, then the raw little-endian data."""
    header = {}
    blobs = []
    offset = 0
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous().cpu()
        raw = t.numpy().tobytes() if t.dtype != torch.bfloat16 else t.view(torch.int16).numpy().tobytes()
        header[name] = {"dtype": DTYPE_NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    if metadata:
        header["__metadata__"] = metadata
    hjson = json.dumps(header, separators=(",", ":")).encode()
    hjson += b" " * ((8 - len(hjson) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hjson)))
        f.write(hjson)
        for b in blobs:
            f.write(b)


def load_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        dt = DTYPES[info["dtype"]]
        buf = bytearray(data[base + b:base + e])
        if dt == torch.bfloat16:
            t = torch.frombuffer(buf, dtype=torch.int16).view(torch.bfloat16)
        else:
            t = torch.frombuffer(buf, dtype=dt)
        out[name] = t.reshape(info["shape"]).clone()
    return out


def save_checkpoint(folder, tensors, shards=1, metadata=None):
    """Writes tensors as Hugging Face does: model.safetensors, or with shards > 1
    model-0000i-of-0000n.safetensors plus model.safetensors.index.json
    ({"metadata": {"total_size": bytes}, "weight_map": {name: shard file}})."""
    os.makedirs(folder, exist_ok=True)
    metadata = metadata or {"format": "pt"}
    if shards <= 1:
        save_safetensors(os.path.join(folder, "model.safetensors"), tensors, metadata)
        return
    names = sorted(tensors)
    weight_map = {}
    total = 0
    for i in range(shards):
        part = names[i::shards]
        fname = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        save_safetensors(os.path.join(folder, fname), {n: tensors[n] for n in part}, metadata)
        for n in part:
            weight_map[n] = fname
            total += tensors[n].numel() * tensors[n].element_size()
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}, f, indent=2)


def load_checkpoint(folder):
    """All tensors of a model folder: model.safetensors, else the shards that
    model.safetensors.index.json names."""
    single = os.path.join(folder, "model.safetensors")
    if os.path.exists(single):
        return load_safetensors(single)
    with open(os.path.join(folder, "model.safetensors.index.json")) as f:
        weight_map = json.load(f)["weight_map"]
    out = {}
    for fname in sorted(set(weight_map.values())):
        shard = load_safetensors(os.path.join(folder, fname))
        out.update({n: t for n, t in shard.items() if weight_map.get(n) == fname})
    return out


class GPT2(torch.nn.Module):
    """Pre-LayerNorm GPT-2 with tied LM head and gelu_new (tanh) MLP."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        d, L, V, P = cfg["n_embd"], cfg["n_layer"], cfg["vocab_size"], cfg["n_positions"]
        self.wte = torch.nn.Parameter(torch.randn(V, d) * 0.02)
        self.wpe = torch.nn.Parameter(torch.randn(P, d) * 0.01)
        self.blocks = torch.nn.ModuleList()
        for _ in range(L):
            blk = torch.nn.ParameterDict({
                "ln_1__weight": torch.nn.Parameter(torch.ones(d)), "ln_1__bias": torch.nn.Parameter(torch.zeros(d)),
                "attn__c_attn__weight": torch.nn.Parameter(torch.randn(d, 3 * d) * 0.02),
                "attn__c_attn__bias": torch.nn.Parameter(torch.zeros(3 * d)),
                "attn__c_proj__weight": torch.nn.Parameter(torch.randn(d, d) * 0.02 / math.sqrt(2 * L)),
                "attn__c_proj__bias": torch.nn.Parameter(torch.zeros(d)),
                "ln_2__weight": torch.nn.Parameter(torch.ones(d)), "ln_2__bias": torch.nn.Parameter(torch.zeros(d)),
                "mlp__c_fc__weight": torch.nn.Parameter(torch.randn(d, 4 * d) * 0.02),
                "mlp__c_fc__bias": torch.nn.Parameter(torch.zeros(4 * d)),
                "mlp__c_proj__weight": torch.nn.Parameter(torch.randn(4 * d, d) * 0.02 / math.sqrt(2 * L)),
                "mlp__c_proj__bias": torch.nn.Parameter(torch.zeros(d)),
            })
            self.blocks.append(blk)
        self.ln_f_weight = torch.nn.Parameter(torch.ones(d))
        self.ln_f_bias = torch.nn.Parameter(torch.zeros(d))

    def state_tensors(self):
        """Tensors under GPT-2's Hugging Face names."""
        out = {"wte.weight": self.wte, "wpe.weight": self.wpe,
               "ln_f.weight": self.ln_f_weight, "ln_f.bias": self.ln_f_bias}
        for i, blk in enumerate(self.blocks):
            for k, v in blk.items():
                out[f"h.{i}." + k.replace("__", ".")] = v
        return out

    def load_tensors(self, tensors):
        with torch.no_grad():
            for name, p in self.state_tensors().items():
                p.copy_(tensors[name].to(p.dtype))

    def forward(self, idx):
        """idx: [B, T] int64 token ids -> logits [B, T, vocab]."""
        cfg = self.cfg
        B, T = idx.shape
        d, H = cfg["n_embd"], cfg["n_head"]
        eps = cfg.get("layer_norm_epsilon", 1e-5)
        x = self.wte[idx] + self.wpe[torch.arange(T)]
        mask = torch.full((T, T), float("-inf"), dtype=x.dtype).triu(1)
        for blk in self.blocks:
            h = F.layer_norm(x, (d,), blk["ln_1__weight"], blk["ln_1__bias"], eps)
            qkv = h @ blk["attn__c_attn__weight"] + blk["attn__c_attn__bias"]
            q, k, v = qkv.split(d, dim=-1)
            q = q.view(B, T, H, d // H).transpose(1, 2)
            k = k.view(B, T, H, d // H).transpose(1, 2)
            v = v.view(B, T, H, d // H).transpose(1, 2)
            att = (q @ k.transpose(-2, -1)) / math.sqrt(d // H) + mask
            y = att.softmax(-1) @ v
            y = y.transpose(1, 2).reshape(B, T, d)
            x = x + y @ blk["attn__c_proj__weight"] + blk["attn__c_proj__bias"]
            h = F.layer_norm(x, (d,), blk["ln_2__weight"], blk["ln_2__bias"], eps)
            h = F.gelu(h @ blk["mlp__c_fc__weight"] + blk["mlp__c_fc__bias"], approximate="tanh")
            x = x + h @ blk["mlp__c_proj__weight"] + blk["mlp__c_proj__bias"]
        x = F.layer_norm(x, (d,), self.ln_f_weight, self.ln_f_bias, eps)
        return x @ self.wte.t()
