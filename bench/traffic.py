"""Traffic mixes shared by the load generator (bench/loadgen.py) and the
locustfile: seeded request bodies drawn from a list of request classes, and a
nearest-rank percentile. No network code here."""
import math
import random

# Prompt text: ASCII, so that characters = tokens for a byte-level tokenizer.
_TEXT = ("The quick brown fox jumps over the lazy dog while the old man reads his paper by the window. "
         "Once upon a time there was a little house on a hill, and everyone who lived there was happy. ")


def prompt_of(n, seed):
    """An ASCII prompt of exactly n characters, starting at a seeded offset."""
    start = seed % len(_TEXT)
    return (_TEXT * (2 + n // len(_TEXT)))[start:start + n]


def draw_requests(mix, count, seed):
    """`count` request bodies drawn from `mix` (a list of class dicts: weight,
    prompt [lo, hi], max_tokens [lo, hi], stream fraction) with a seeded RNG."""
    rng = random.Random(seed)
    weights = [c.get("weight", 1) for c in mix]
    out = []
    for i in range(count):
        k = rng.choices(range(len(mix)), weights)[0]
        c = mix[k]
        p = rng.randint(*c["prompt"])
        m = rng.randint(*c["max_tokens"])
        out.append({"class": c.get("name", str(k)), "stream": rng.random() < c.get("stream", 0.0),
                    "body": {"prompt": prompt_of(p, seed * 7919 + i), "max_tokens": m, "ignore_eos": True,
                             "temperature": 0.8, "seed": seed * 100003 + i},
                    "prompt_tokens": p})
    return out


def percentile(values, q):
    """Nearest-rank percentile of the non-None values, or None."""
    values = sorted(v for v in values if v is not None)
    if not values:
        return None
    k = min(len(values) - 1, max(0, math.ceil(q / 100 * len(values)) - 1))
    return values[k]
