#!/usr/bin/env python3
"""Write a small random Hugging Face-format MoE checkpoint and a token file (Python standard library only).

    python3 scripts/make_tiny_hf_model.py --family qwen3_moe --out /tmp/tiny-qwen3-moe

writes OUT/config.json, OUT/model.safetensors (F32, the family's tensor names) and OUT/tokens.bin with its
sidecar OUT/tokens.bin.json ({"dtype": "uint16", "vocab_size": V}): what `expar eval` and `expar generate`
read. Families: mixtral, qwen2_moe, qwen3_moe, olmoe. The weights are random (seeded): the model predicts
nothing, but every layout of expar gives it the same loss.

The sizes default to a tiny model; --vocab, --hidden, --layers, --heads, --kv-heads, --head-dim,
--experts, --experts-per-token, --intermediate, --shared and --max-pos set them, e.g. the Mixtral-architecture model
`expar bench generate` is measured on (docs/performance.md):

    python3 scripts/make_tiny_hf_model.py --family mixtral --out /tmp/mixtral-1024 --vocab 32000 \
        --hidden 1024 --layers 8 --heads 16 --kv-heads 8 --head-dim 64 --experts 8 --experts-per-token 2 \
        --intermediate 2048 --max-pos 2048

Tensors of more than 65536 values are filled from a pool of seeded normal values (random offsets into it,
scaled per tensor), so a model of gigabytes is written in seconds; small tensors are drawn one by one.
"""
import argparse
import json
import math
import os
import random
import struct

VOCAB, HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM = 64, 32, 2, 4, 2, 8
EXPERTS, TOP_K, INTER, SHARED, MAX_POS = 8, 2, 16, 24, 64
POOL = 1 << 20  # values in the pool large tensors are filled from


def config(family):
    c = {"model_type": family, "vocab_size": VOCAB, "hidden_size": HIDDEN, "num_hidden_layers": LAYERS,
         "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "max_position_embeddings": MAX_POS,
         "rms_norm_eps": 1e-6, "num_experts_per_tok": TOP_K, "tie_word_embeddings": False,
         "hidden_act": "silu"}
    if family == "mixtral":
        c.update(num_local_experts=EXPERTS, intermediate_size=INTER, head_dim=HEAD_DIM, rope_theta=1e6,
                 sliding_window=None)
    elif family == "qwen2_moe":
        c.update(num_experts=EXPERTS, moe_intermediate_size=INTER, shared_expert_intermediate_size=SHARED,
                 norm_topk_prob=False, rope_theta=1e6)
        c["num_key_value_heads"] = HEADS
    elif family == "qwen3_moe":
        # transformers v5 layout: the rope under rope_parameters
        c.update(num_experts=EXPERTS, moe_intermediate_size=INTER, head_dim=HEAD_DIM, norm_topk_prob=True,
                 rope_parameters={"rope_type": "default", "rope_theta": 1e6})
    elif family == "olmoe":
        c.update(num_experts=EXPERTS, intermediate_size=INTER, norm_topk_prob=False, rope_theta=10000.0,
                 clip_qkv=None)
    else:
        raise SystemExit(f"unknown family {family!r}: use mixtral, qwen2_moe, qwen3_moe or olmoe")
    return c


def tensors(family, rng):
    hd = HIDDEN // HEADS if family in ("qwen2_moe", "olmoe") else HEAD_DIM
    kv = HEADS if family == "qwen2_moe" else KV_HEADS
    qd, kd = HEADS * hd, kv * hd
    t = {}

    def normal(name, shape, std, mean=0.0):
        n = math.prod(shape)
        # Small tensors drawn now, in this order (the tiny model's values do not depend on the large path).
        t[name] = (shape, [mean + rng.gauss(0.0, std) for _ in range(n)] if n <= 65536 else (std, mean))

    s = 1.0 / math.sqrt(HIDDEN)
    normal("model.embed_tokens.weight", [VOCAB, HIDDEN], 1.0)
    normal("model.norm.weight", [HIDDEN], 0.1, 1.0)
    normal("lm_head.weight", [VOCAB, HIDDEN], s)
    for l in range(LAYERS):
        p = f"model.layers.{l}."
        normal(p + "input_layernorm.weight", [HIDDEN], 0.1, 1.0)
        normal(p + "post_attention_layernorm.weight", [HIDDEN], 0.1, 1.0)
        normal(p + "self_attn.q_proj.weight", [qd, HIDDEN], s)
        normal(p + "self_attn.k_proj.weight", [kd, HIDDEN], s)
        normal(p + "self_attn.v_proj.weight", [kd, HIDDEN], s)
        normal(p + "self_attn.o_proj.weight", [HIDDEN, qd], 1.0 / math.sqrt(qd))
        if family == "qwen2_moe":
            for x, n in (("q", qd), ("k", kd), ("v", kd)):
                normal(p + f"self_attn.{x}_proj.bias", [n], 0.1)
        if family == "qwen3_moe":
            normal(p + "self_attn.q_norm.weight", [hd], 0.1, 1.0)
            normal(p + "self_attn.k_norm.weight", [hd], 0.1, 1.0)
        if family == "olmoe":
            normal(p + "self_attn.q_norm.weight", [qd], 0.1, 1.0)
            normal(p + "self_attn.k_norm.weight", [kd], 0.1, 1.0)
        moe = p + ("block_sparse_moe." if family == "mixtral" else "mlp.")
        normal(moe + "gate.weight", [EXPERTS, HIDDEN], s)
        names = ("w1", "w3", "w2") if family == "mixtral" else ("gate_proj", "up_proj", "down_proj")
        for e in range(EXPERTS):
            x = f"{moe}experts.{e}."
            normal(x + names[0] + ".weight", [INTER, HIDDEN], s)
            normal(x + names[1] + ".weight", [INTER, HIDDEN], s)
            normal(x + names[2] + ".weight", [HIDDEN, INTER], 1.0 / math.sqrt(INTER))
        if family == "qwen2_moe":
            normal(moe + "shared_expert.gate_proj.weight", [SHARED, HIDDEN], s)
            normal(moe + "shared_expert.up_proj.weight", [SHARED, HIDDEN], s)
            normal(moe + "shared_expert.down_proj.weight", [HIDDEN, SHARED], 1.0 / math.sqrt(SHARED))
            normal(moe + "shared_expert_gate.weight", [1, HIDDEN], s)
    return t


def tensor_bytes(shape, values, rng, pool):
    if isinstance(values, list):
        return struct.pack(f"<{len(values)}f", *values)
    # Large: runs of the pool from random offsets, scaled (array arithmetic on bytes would need numpy).
    n = math.prod(shape)
    if values not in pool:
        if "base" not in pool:
            pool["base"] = [rng.gauss(0.0, 1.0) for _ in range(POOL)]
        std, mean = values
        scaled = struct.pack(f"<{POOL}f", *(mean + std * v for v in pool["base"]))
        pool[values] = scaled + scaled  # doubled, so any offset has POOL values after it
    src, out, left = pool[values], [], n
    while left > 0:
        take = min(left, POOL)
        at = rng.randrange(POOL) * 4
        out.append(src[at:at + take * 4])
        left -= take
    return b"".join(out)


def write_safetensors(path, t, rng):
    header, offset = {}, 0
    for name in sorted(t):
        shape = t[name][0]
        size = 4 * math.prod(shape)
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    pool = {}
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for name in sorted(t):
            f.write(tensor_bytes(*t[name], rng, pool))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", default="qwen3_moe")
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokens", type=int, default=1000, help="tokens in OUT/tokens.bin")
    ap.add_argument("--seed", type=int, default=1)
    sizes = {"vocab": VOCAB, "hidden": HIDDEN, "layers": LAYERS, "heads": HEADS, "kv_heads": KV_HEADS,
             "head_dim": HEAD_DIM, "experts": EXPERTS, "experts_per_token": TOP_K, "intermediate": INTER,
             "shared": SHARED, "max_pos": MAX_POS}
    for key, default in sizes.items():
        ap.add_argument("--" + key.replace("_", "-"), type=int, default=default)
    # expar's vocabulary: routes per token are --experts-per-token (--top-k is sampling's).
    ap.add_argument("--top-k", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.top_k is not None:
        raise SystemExit(f"--top-k {a.top_k}: --top-k is sampling's (expar generate); the routes per token are "
                         f"--experts-per-token: pass --experts-per-token {a.top_k}")
    g = globals()
    for key, name in (("vocab", "VOCAB"), ("hidden", "HIDDEN"), ("layers", "LAYERS"), ("heads", "HEADS"),
                      ("kv_heads", "KV_HEADS"), ("head_dim", "HEAD_DIM"), ("experts", "EXPERTS"),
                      ("experts_per_token", "TOP_K"), ("intermediate", "INTER"), ("shared", "SHARED"),
                      ("max_pos", "MAX_POS")):
        value = getattr(a, key)
        if value < 1:
            raise SystemExit(f"--{key.replace('_', '-')} {value} must be at least 1")
        g[name] = value
    if a.vocab > 65536:
        raise SystemExit(f"--vocab {a.vocab}: tokens.bin holds uint16 tokens, so at most 65536")
    rng = random.Random(a.seed)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(config(a.family), f, indent=2)
    write_safetensors(os.path.join(a.out, "model.safetensors"), tensors(a.family, rng), rng)
    with open(os.path.join(a.out, "tokens.bin"), "wb") as f:
        f.write(struct.pack(f"<{a.tokens}H", *(rng.randrange(VOCAB) for _ in range(a.tokens))))
    with open(os.path.join(a.out, "tokens.bin.json"), "w") as f:
        json.dump({"dtype": "uint16", "vocab_size": VOCAB}, f)
    print(f"wrote a random {a.family} checkpoint and {a.tokens} tokens to {a.out}")


if __name__ == "__main__":
    main()
