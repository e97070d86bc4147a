#!/usr/bin/env python3
"""Write a random Hugging Face-format MoE checkpoint and a token file (Python standard library only).

    python3 scripts/make_tiny_hf_model.py --family qwen3_moe --out /tmp/tiny-qwen3-moe

writes OUT/config.json, OUT/model.safetensors (the family's tensor names, in --dtype: f32 or bf16) and
OUT/tokens.bin with its sidecar OUT/tokens.bin.json ({"dtype": "uint16" or, past 65536 tokens of vocabulary,
"uint32", "vocab_size": V}): what `expar eval` and `expar generate` read. Families: mixtral, qwen2_moe,
qwen3_moe, olmoe, gpt_oss (its experts stored as the Hub stores them: MXFP4 blocks and E8M0 scales, with
quantization_config mxfp4). The weights are random (seeded): the model predicts nothing, but every layout of
expar gives it the same loss.

A checkpoint larger than --max-shard-bytes is written as shards model-0000i-of-0000n.safetensors with
model.safetensors.index.json, as the Hub's are. --preset writes a real model's exact shapes and storage:
gpt-oss-20b (BF16, MXFP4 experts; 12.8 GiB) or olmoe-1b-7b (BF16; 13.8 GB); --dry-run prints the config and
the bytes it would write, and writes nothing:

    python3 scripts/make_tiny_hf_model.py --preset gpt-oss-20b --out /tmp/gpt-oss-20b --dry-run

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
import array
import json
import math
import os
import random
import struct

VOCAB, HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM = 64, 32, 2, 4, 2, 8
EXPERTS, TOP_K, INTER, SHARED, MAX_POS = 8, 2, 16, 24, 64
POOL = 1 << 20  # values in the pool large tensors are filled from
FAMILIES = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "gpt_oss")

# The published config.json values of real models (the sizes; the family's other keys are config()'s).
PRESETS = {
    "gpt-oss-20b": {"family": "gpt_oss", "dtype": "bf16", "vocab": 201088, "hidden": 2880, "layers": 24,
                    "heads": 64, "kv_heads": 8, "head_dim": 64, "experts": 32, "experts_per_token": 4,
                    "intermediate": 2880, "max_pos": 131072},
    "olmoe-1b-7b": {"family": "olmoe", "dtype": "bf16", "vocab": 50304, "hidden": 2048, "layers": 16,
                    "heads": 16, "kv_heads": 16, "head_dim": 128, "experts": 64, "experts_per_token": 8,
                    "intermediate": 1024, "max_pos": 4096},
}


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
    elif family == "gpt_oss":
        # gpt-oss-20b's config.json apart from the sizes: alternating sliding (128) and full attention, YaRN
        # over 4096 positions, the clamped SwiGLU, MXFP4 experts.
        c.update(num_local_experts=EXPERTS, experts_per_token=TOP_K, intermediate_size=INTER,
                 head_dim=HEAD_DIM, rms_norm_eps=1e-5, rope_theta=150000.0, sliding_window=128,
                 attention_bias=True, swiglu_limit=7.0, hidden_act="silu",
                 layer_types=["sliding_attention" if l % 2 == 0 else "full_attention" for l in range(LAYERS)],
                 rope_scaling={"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096,
                               "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False},
                 quantization_config={"quant_method": "mxfp4",
                                      "modules_to_not_convert": ["model.layers.*.self_attn",
                                                                 "model.layers.*.mlp.router",
                                                                 "model.embed_tokens", "lm_head"]})
    else:
        raise SystemExit(f"--family {family}: unknown; use one of {', '.join(FAMILIES)}")
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

    def mxfp4(name, experts, rows, cols, std):
        # The Hub's layout of a stacked expert matrix [E, cols, rows] (in, out once decoded): NAME_blocks U8
        # [E, rows, cols/32, 16] (two E2M1 codes a byte) and NAME_scales U8 [E, rows, cols/32], every block's
        # scale 2^(s-127) set so that the values are about `std` in size (an E2M1 code averages about 2.3).
        if cols % 32:
            raise SystemExit(f"gpt_oss: {name} has {cols} input features; MXFP4 needs a multiple of 32 "
                             f"(choose --hidden and --intermediate multiples of 32)")
        t[name + "_blocks"] = ([experts, rows, cols // 32, 16], ("bytes",))
        code = 127 + round(math.log2(std / 2.3))
        t[name + "_scales"] = ([experts, rows, cols // 32], ("fill", code))

    s = 1.0 / math.sqrt(HIDDEN)
    normal("model.embed_tokens.weight", [VOCAB, HIDDEN], 1.0)
    normal("model.norm.weight", [HIDDEN], 0.1, 1.0)
    normal("lm_head.weight", [VOCAB, HIDDEN], s)
    for l in range(LAYERS):
        p = f"model.layers.{l}."
        normal(p + "input_layernorm.weight", [HIDDEN], 0.1, 1.0)
        normal(p + "post_attention_layernorm.weight", [HIDDEN], 0.1, 1.0)
        if family == "gpt_oss":
            gpt_oss_layer(p, normal, mxfp4, s)
            continue
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


def gpt_oss_layer(p, normal, mxfp4, s):
    # transformers' GptOssForCausalLM names: q/k/v/o with biases, per-head attention sinks, a router with a
    # bias, and the stacked experts (gate_up_proj interleaves gate and up along its outputs).
    qd, kd = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    for x, n in (("q", qd), ("k", kd), ("v", kd)):
        normal(p + f"self_attn.{x}_proj.weight", [n, HIDDEN], s)
        normal(p + f"self_attn.{x}_proj.bias", [n], 0.1)
    normal(p + "self_attn.o_proj.weight", [HIDDEN, qd], 1.0 / math.sqrt(qd))
    normal(p + "self_attn.o_proj.bias", [HIDDEN], 0.1)
    normal(p + "self_attn.sinks", [HEADS], 1.0)
    normal(p + "mlp.router.weight", [EXPERTS, HIDDEN], s)
    normal(p + "mlp.router.bias", [EXPERTS], 0.1)
    x = p + "mlp.experts."
    mxfp4(x + "gate_up_proj", EXPERTS, 2 * INTER, HIDDEN, s)
    normal(x + "gate_up_proj_bias", [EXPERTS, 2 * INTER], 0.1)
    mxfp4(x + "down_proj", EXPERTS, HIDDEN, INTER, 1.0 / math.sqrt(INTER))
    normal(x + "down_proj_bias", [EXPERTS, HIDDEN], 0.1)


def dtype_of(values, dtype):
    return "U8" if isinstance(values, tuple) and values[0] in ("bytes", "fill") else dtype


def element_bytes(dtype):
    return {"F32": 4, "BF16": 2, "U8": 1}[dtype]


def tensor_bytes(shape, values, dtype, rng, pool):
    n = math.prod(shape)
    if dtype == "U8":
        if values[0] == "fill":
            return bytes([values[1]]) * n
        if "bytes" not in pool:
            one = rng.randbytes(POOL)
            pool["bytes"] = one + one
        return runs(pool["bytes"], n, 1, rng)
    if isinstance(values, list):
        return narrowed(struct.pack(f"<{len(values)}f", *values), dtype)
    # Large: runs of the pool from random offsets, scaled (array arithmetic on bytes would need numpy).
    key = (values, dtype)
    if key not in pool:
        if "base" not in pool:
            pool["base"] = [rng.gauss(0.0, 1.0) for _ in range(POOL)]
        std, mean = values
        scaled = narrowed(struct.pack(f"<{POOL}f", *(mean + std * v for v in pool["base"])), dtype)
        pool[key] = scaled + scaled  # doubled, so any offset has POOL values after it
    return runs(pool[key], n, element_bytes(dtype), rng)


def narrowed(f32_bytes, dtype):
    # BF16: the upper half of each little-endian f32 (rounded toward zero; the values are random anyway).
    return f32_bytes if dtype == "F32" else array.array("H", f32_bytes)[1::2].tobytes()


def runs(src, n, size, rng):
    out, left = [], n
    while left > 0:
        take = min(left, POOL)
        at = rng.randrange(POOL) * size
        out.append(src[at:at + take * size])
        left -= take
    return b"".join(out)


def shard_plan(t, dtype, max_bytes):
    # Tensors in name order, a new shard when the next would pass max_bytes (a tensor larger than it gets a
    # shard of its own), as transformers' save_pretrained splits them.
    shards, size = [[]], 0
    for name in sorted(t):
        shape, values = t[name]
        nbytes = math.prod(shape) * element_bytes(dtype_of(values, dtype))
        if shards[-1] and size + nbytes > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += nbytes
    return shards


def write_safetensors(path, names, t, dtype, rng, pool):
    header, offset = {}, 0
    for name in names:
        shape, values = t[name]
        d = dtype_of(values, dtype)
        size = element_bytes(d) * math.prod(shape)
        header[name] = {"dtype": d, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path + ".partial", "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for name in names:
            shape, values = t[name]
            f.write(tensor_bytes(shape, values, dtype_of(values, dtype), rng, pool))
    os.replace(path + ".partial", path)
    return offset


def write_checkpoint(out, t, dtype, max_bytes, rng):
    shards, pool = shard_plan(t, dtype, max_bytes), {}
    if len(shards) == 1:
        return write_safetensors(os.path.join(out, "model.safetensors"), shards[0], t, dtype, rng, pool)
    weight_map, total = {}, 0
    for i, names in enumerate(shards):
        file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        total += write_safetensors(os.path.join(out, file), names, t, dtype, rng, pool)
        weight_map.update({name: file for name in names})
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    return total


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", choices=FAMILIES)
    ap.add_argument("--preset", choices=sorted(PRESETS), help="a real model's sizes, family and dtype")
    ap.add_argument("--dtype", choices=("f32", "bf16"), help="the weights' dtype (default f32; a preset's own)")
    ap.add_argument("--max-shard-bytes", type=int, default=5 * 10**9,
                    help="shard the checkpoint past this many bytes (default 5e9, as the Hub's)")
    ap.add_argument("--dry-run", action="store_true", help="print what would be written; write nothing")
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokens", type=int, default=1000, help="tokens in OUT/tokens.bin")
    ap.add_argument("--seed", type=int, default=1)
    sizes = {"vocab": VOCAB, "hidden": HIDDEN, "layers": LAYERS, "heads": HEADS, "kv_heads": KV_HEADS,
             "head_dim": HEAD_DIM, "experts": EXPERTS, "experts_per_token": TOP_K, "intermediate": INTER,
             "shared": SHARED, "max_pos": MAX_POS}
    for key in sizes:
        ap.add_argument("--" + key.replace("_", "-"), type=int)
    # expar's vocabulary: routes per token are --experts-per-token (--top-k is sampling's).
    ap.add_argument("--top-k", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.top_k is not None:
        raise SystemExit(f"--top-k {a.top_k}: --top-k is sampling's (expar generate); the routes per token are "
                         f"--experts-per-token: pass --experts-per-token {a.top_k}")
    preset = PRESETS.get(a.preset, {})
    for key, value in preset.items():
        given = getattr(a, key)
        if given is not None and given != value:
            raise SystemExit(f"--{key.replace('_', '-')} {given} contradicts --preset {a.preset} ({value}): "
                             f"leave it out, or drop --preset")
        setattr(a, key, value)
    for key, default in sizes.items():
        if getattr(a, key) is None:
            setattr(a, key, default)
    a.family = a.family or "qwen3_moe"
    a.dtype = a.dtype or "f32"
    if a.max_shard_bytes < 1:
        raise SystemExit(f"--max-shard-bytes {a.max_shard_bytes} must be at least 1")
    g = globals()
    for key, name in (("vocab", "VOCAB"), ("hidden", "HIDDEN"), ("layers", "LAYERS"), ("heads", "HEADS"),
                      ("kv_heads", "KV_HEADS"), ("head_dim", "HEAD_DIM"), ("experts", "EXPERTS"),
                      ("experts_per_token", "TOP_K"), ("intermediate", "INTER"), ("shared", "SHARED"),
                      ("max_pos", "MAX_POS")):
        value = getattr(a, key)
        if value < 1:
            raise SystemExit(f"--{key.replace('_', '-')} {value} must be at least 1")
        g[name] = value
    if a.vocab >= 2**32:
        raise SystemExit(f"--vocab {a.vocab}: tokens.bin holds uint32 tokens, so below 2^32")
    rng = random.Random(a.seed)
    t = tensors(a.family, rng)
    dtype = a.dtype.upper()
    shards = shard_plan(t, dtype, a.max_shard_bytes)
    total = sum(math.prod(shape) * element_bytes(dtype_of(values, dtype)) for shape, values in t.values())
    if a.dry_run:
        print(json.dumps(config(a.family), indent=2))
        print(f"would write {len(t)} tensors, {total} bytes ({total / 2**30:.2f} GiB) of {a.dtype} weights"
              f"{' and mxfp4 experts' if a.family == 'gpt_oss' else ''} in {len(shards)} file(s), and "
              f"{a.tokens} tokens, to {a.out}")
        return
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(config(a.family), f, indent=2)
    write_checkpoint(a.out, t, dtype, a.max_shard_bytes, rng)
    token_type = ("H", "uint16") if VOCAB <= 65536 else ("I", "uint32")
    with open(os.path.join(a.out, "tokens.bin"), "wb") as f:
        f.write(struct.pack(f"<{a.tokens}{token_type[0]}", *(rng.randrange(VOCAB) for _ in range(a.tokens))))
    with open(os.path.join(a.out, "tokens.bin.json"), "w") as f:
        json.dump({"dtype": token_type[1], "vocab_size": VOCAB}, f)
    print(f"wrote a random {a.family} checkpoint ({total} bytes, {a.dtype} weights, {len(shards)} file(s)) "
          f"and {a.tokens} tokens to {a.out}")


if __name__ == "__main__":
    main()
