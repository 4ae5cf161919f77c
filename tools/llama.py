"""LLaMA architecture in plain PyTorch, written from the architecture (no
transformers package): the reference the C++ llama forward pass is checked
against (tools/reference_forward.py) and the model tools/make_random_llama.py
fills with random weights.

Tensor names and layouts follow Hugging Face LlamaForCausalLM checkpoints
(nn.Linear weights stored [out, in]):
  model.embed_tokens.weight                      [vocab, hidden]
  model.layers.N.input_layernorm.weight          [hidden]
  model.layers.N.self_attn.{q,k,v,o}_proj.weight [heads*head_dim, hidden] ([hidden, heads*head_dim] for o)
  model.layers.N.post_attention_layernorm.weight [hidden]
  model.layers.N.mlp.{gate,up,down}_proj.weight  [inter, hidden] ([hidden, inter] for down)
  model.norm.weight                              [hidden]
  lm_head.weight                                 [vocab, hidden] (absent when tie_word_embeddings)

Block: x += o(attn(rope(q(n1(x))), rope(k(n1(x))), v(n1(x)))); x += down(silu(gate(n2(x))) * up(n2(x)))
with n = RMSNorm (x / sqrt(mean(x^2) + eps) * w), RoPE in the rotate-half form
(x * cos + [-x2, x1] * sin, angle = position * theta^(-2i/head_dim)), and
grouped-query attention (query head h reads KV head h // (heads / kv_heads)).
"""
import torch
import torch.nn.functional as F


def config_dims(cfg):
    """The llama hyper-parameters of a config.json dict, with HF defaults."""
    heads = cfg["num_attention_heads"]
    hidden = cfg["hidden_size"]
    return {
        "layers": cfg["num_hidden_layers"], "heads": heads, "hidden": hidden,
        "kv_heads": cfg.get("num_key_value_heads") or heads,
        "head_dim": cfg.get("head_dim") or hidden // heads,
        "inter": cfg["intermediate_size"], "vocab": cfg["vocab_size"],
        "eps": cfg.get("rms_norm_eps", 1e-6), "theta": cfg.get("rope_theta", 10000.0),
        "tied": bool(cfg.get("tie_word_embeddings", False)),
    }


def tensor_shapes(cfg):
    """Hugging Face tensor name -> shape for a llama config."""
    d = config_dims(cfg)
    h, hd, inter = d["hidden"], d["head_dim"], d["inter"]
    shapes = {"model.embed_tokens.weight": (d["vocab"], h), "model.norm.weight": (h,)}
    for i in range(d["layers"]):
        p = f"model.layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (d["heads"] * hd, h),
            p + "self_attn.k_proj.weight": (d["kv_heads"] * hd, h),
            p + "self_attn.v_proj.weight": (d["kv_heads"] * hd, h),
            p + "self_attn.o_proj.weight": (h, d["heads"] * hd),
            p + "mlp.gate_proj.weight": (inter, h), p + "mlp.up_proj.weight": (inter, h),
            p + "mlp.down_proj.weight": (h, inter),
        })
    if not d["tied"]:
        shapes["lm_head.weight"] = (d["vocab"], h)
    return shapes


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def forward(cfg, tensors, ids):
    """Logits [T, vocab] (float64) of token ids [T] under a causal mask.
    `tensors` maps HF names to tensors of any float dtype."""
    d = config_dims(cfg)
    W = {k: v.to(torch.float64) for k, v in tensors.items()}
    T = len(ids)
    H, KV, hd, eps = d["heads"], d["kv_heads"], d["head_dim"], d["eps"]
    inv_freq = 1.0 / (d["theta"] ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    angles = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)
    cos = torch.cat([angles, angles], -1).cos()  # [T, hd]
    sin = torch.cat([angles, angles], -1).sin()
    mask = torch.full((T, T), float("-inf"), dtype=torch.float64).triu(1)
    x = W["model.embed_tokens.weight"][torch.tensor(ids, dtype=torch.int64)]
    for i in range(d["layers"]):
        p = f"model.layers.{i}."
        h = rms_norm(x, W[p + "input_layernorm.weight"], eps)
        q = (h @ W[p + "self_attn.q_proj.weight"].t()).view(T, H, hd).transpose(0, 1)   # [H, T, hd]
        k = (h @ W[p + "self_attn.k_proj.weight"].t()).view(T, KV, hd).transpose(0, 1)  # [KV, T, hd]
        v = (h @ W[p + "self_attn.v_proj.weight"].t()).view(T, KV, hd).transpose(0, 1)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(H // KV, dim=0)
        v = v.repeat_interleave(H // KV, dim=0)
        att = (q @ k.transpose(-2, -1)) / hd ** 0.5 + mask
        y = (att.softmax(-1) @ v).transpose(0, 1).reshape(T, H * hd)
        x = x + y @ W[p + "self_attn.o_proj.weight"].t()
        h = rms_norm(x, W[p + "post_attention_layernorm.weight"], eps)
        gate = h @ W[p + "mlp.gate_proj.weight"].t()
        up = h @ W[p + "mlp.up_proj.weight"].t()
        x = x + (F.silu(gate) * up) @ W[p + "mlp.down_proj.weight"].t()
    x = rms_norm(x, W["model.norm.weight"], eps)
    head = W["model.embed_tokens.weight"] if d["tied"] else W["lm_head.weight"]
    return x @ head.t()


def greedy(cfg, tensors, ids, n):
    """The n tokens greedy decoding appends to ids (full recompute per token)."""
    ids = list(ids)
    out = []
    for _ in range(n):
        nxt = int(forward(cfg, tensors, ids)[-1].argmax())
        out.append(nxt)
        ids.append(nxt)
    return out
