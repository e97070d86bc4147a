#!/usr/bin/env python3
"""Write a random Hugging Face-format MoE checkpoint and a token file (Python standard library only).

    python3 scripts/make_tiny_hf_model.py --family qwen3_moe --out /tmp/tiny-qwen3-moe

writes OUT/config.json, OUT/model.safetensors (the family's tensor names, in --dtype: f32, bf16 or fp8) and
OUT/tokens.bin with its sidecar OUT/tokens.bin.json ({"dtype": "uint16" or, past 65536 tokens of vocabulary,
"uint32", "vocab_size": V}): what `expar eval` and `expar generate` read. Families: mixtral, qwen2_moe,
qwen3_moe, olmoe, gpt_oss (its experts stored as the Hub stores them: MXFP4 blocks and E8M0 scales, with
quantization_config mxfp4), deepseek_v3 and deepseek_v2 (latent attention, shared experts, the first layers
dense; V3's sigmoid router with groups and an F32 e_score_correction_bias, V2's softmax greedy one; tiny
defaults: hidden 64, 3 layers, 8 experts, top-2). The weights are random (seeded): the model predicts nothing,
but every layout of expar gives it the same loss.

--dtype fp8 stores the checkpoint as DeepSeek-V3's and Qwen3's FP8 releases on the Hub do (e.g.
Qwen/Qwen3-30B-A3B-FP8; quantization_config fp8, e4m3, weight_block_size [128, 128]): every linear layer's
weight of attention and of the MLPs (q/k/v/o_proj, DeepSeek's q_a/q_b/kv_a_proj_with_mqa/kv_b; the routed
experts', the shared experts' and DeepSeek's dense layers' gate, up and down) as NAME.weight in F8_E4M3 (OCP
E4M3: bias 7, max normal 448, no infinities, NaN = S.1111.111) with NAME.weight_scale_inv in F32
[ceil(out/128), ceil(in/128)], value = e4m3(code) * weight_scale_inv[r//128][c//128]; everything else
(embeddings, lm_head, norms, router gates, biases) in BF16, but DeepSeek-V3's e_score_correction_bias, F32 in
every --dtype as the Hub's. The rule: for each 128 x 128 block (ragged at the edges) of the BF16 weight (the
one --dtype bf16 writes), scale = amax(|block|) / 448 in f32 (1 for a block of zeros) and code = the E4M3 value
nearest to w / scale, ties to even, saturating at +-448; so each block's largest code is +-448. gpt_oss is
refused (it ships MXFP4 experts: use --dtype bf16). --self-test checks the E4M3 encoder against a brute-force
search over all 256 codes.

    python3 scripts/make_tiny_hf_model.py --family qwen3_moe --dtype fp8 --hidden 160 --intermediate 96 \
        --out /tmp/tiny-qwen3-moe-fp8

A checkpoint larger than --max-shard-bytes is written as shards model-0000i-of-0000n.safetensors with
model.safetensors.index.json, as the Hub's are. --preset writes a real model's exact shapes and storage:
gpt-oss-20b (BF16, MXFP4 experts; 12.8 GiB), olmoe-1b-7b (BF16; 13.8 GB; with --dtype fp8, its shapes in
FP8: 7.1 GB), deepseek-v3 (FP8 as published, without its multi-token-prediction layer: 673 GB) or
deepseek-v2-lite (BF16; 31.4 GB); --dry-run prints the config and the bytes it would write (for fp8: codes,
scales and BF16 rest), and writes nothing. --layers N and --experts N cut a preset to fewer layers and routed
experts of its real widths (DeepSeek-V3: --experts a multiple of its 8 groups, at least 16 for its top-8 of
the best 4 groups), e.g. 6.6 GiB of DeepSeek-V3 with 3 dense layers and one MoE layer of 32 experts:

    python3 scripts/make_tiny_hf_model.py --preset gpt-oss-20b --out /tmp/gpt-oss-20b --dry-run
    python3 scripts/make_tiny_hf_model.py --preset deepseek-v3 --layers 4 --experts 32 --out /tmp/v3 --dry-run

The sizes default to a tiny model; --vocab, --hidden, --layers, --heads, --kv-heads, --head-dim,
--experts, --experts-per-token, --intermediate, --shared and --max-pos set them, e.g. the Mixtral-architecture model
`expar bench generate` is measured on (docs/performance.md):

    python3 scripts/make_tiny_hf_model.py --family mixtral --out /tmp/mixtral-1024 --vocab 32000 \
        --hidden 1024 --layers 8 --heads 16 --kv-heads 8 --head-dim 64 --experts 8 --experts-per-token 2 \
        --intermediate 2048 --max-pos 2048

DeepSeek's own widths have flags named as their config.json keys: --q-lora-rank (0: null, a plain q_proj),
--kv-lora-rank, --qk-nope-head-dim, --qk-rope-head-dim, --v-head-dim, --n-group, --topk-group,
--n-shared-experts, --first-k-dense-replace, --dense-intermediate (intermediate_size) and --rope-factor (YaRN's;
original_max_position_embeddings = --max-pos / factor); --intermediate is moe_intermediate_size there, the key
and value heads are --heads, and --kv-heads, --head-dim and --shared are refused.

Tensors of more than 65536 values are filled from a pool of seeded normal values (random offsets into it,
scaled per tensor), so a model of gigabytes is written in seconds; small tensors are drawn one by one. With --dtype
fp8, a large linear weight's 128 x 128 blocks are drawn from a pool of blocks quantised once by the rule above.
"""
import argparse
import array
import json
import math
import os
import random
import re
import struct

VOCAB, HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM = 64, 32, 2, 4, 2, 8
EXPERTS, TOP_K, INTER, SHARED, MAX_POS = 8, 2, 16, 24, 64
POOL = 1 << 20  # values in the pool large tensors are filled from
FAMILIES = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "gpt_oss", "deepseek_v3", "deepseek_v2")
DEEPSEEK = ("deepseek_v3", "deepseek_v2")
# DeepSeek's latent attention, router groups, shared experts and dense layers (set from --q-lora-rank etc.).
Q_LORA, KV_LORA, NOPE, ROPE, V_DIM = 32, 32, 16, 8, 16  # Q_LORA 0: q_lora_rank null, a plain q_proj
N_GROUP, TOPK_GROUP, N_SHARED, FIRST_DENSE, DENSE_INTER, ROPE_FACTOR = 4, 2, 1, 1, 96, 4
FP8_BLOCK, FP8_MAX = 128, 448.0  # the Hub's FP8 releases: 128 x 128 blocks of E4M3 codes, max normal 448
FP8_TILES = 32  # quantised blocks in each pool large FP8 weights are drawn from
# The weights --dtype fp8 stores as E4M3 codes and block scales: the linear layers of attention and the MLPs.
# DeepSeek's too: the latent attention's q_a, q_b, kv_a_proj_with_mqa and kv_b, the shared experts and the dense
# layers' MLP (as deepseek-ai/DeepSeek-V3 stores them; its router, correction bias and norms stay unquantised).
FP8_LINEAR = re.compile(r"\.self_attn\.([qkvo]|q_a|q_b|kv_b)_proj\.weight$|\.self_attn\.kv_a_proj_with_mqa\.weight$"
                        r"|\.experts\.\d+\.(w1|w2|w3|gate_proj|up_proj|down_proj)\.weight$"
                        r"|\.shared_experts?\.(gate|up|down)_proj\.weight$|\.mlp\.(gate|up|down)_proj\.weight$")
FP8_QUANTIZATION = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                    "weight_block_size": [FP8_BLOCK, FP8_BLOCK]}

# The published config.json values of real models (the sizes; the family's other keys are config()'s).
PRESETS = {
    "gpt-oss-20b": {"family": "gpt_oss", "dtype": "bf16", "vocab": 201088, "hidden": 2880, "layers": 24,
                    "heads": 64, "kv_heads": 8, "head_dim": 64, "experts": 32, "experts_per_token": 4,
                    "intermediate": 2880, "max_pos": 131072},
    "olmoe-1b-7b": {"family": "olmoe", "dtype": "bf16", "vocab": 50304, "hidden": 2048, "layers": 16,
                    "heads": 16, "kv_heads": 16, "head_dim": 128, "experts": 64, "experts_per_token": 8,
                    "intermediate": 1024, "max_pos": 4096},
    # deepseek-ai/DeepSeek-V3 (FP8 as published; its multi-token-prediction layer 61 is not written) and
    # deepseek-ai/DeepSeek-V2-Lite (BF16). --layers and --experts may cut them (see main()).
    "deepseek-v3": {"family": "deepseek_v3", "dtype": "fp8", "vocab": 129280, "hidden": 7168, "layers": 61,
                    "heads": 128, "experts": 256, "experts_per_token": 8, "intermediate": 2048,
                    "max_pos": 163840, "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
                    "qk_rope_head_dim": 64, "v_head_dim": 128, "n_group": 8, "topk_group": 4,
                    "n_shared_experts": 1, "first_k_dense_replace": 3, "dense_intermediate": 18432,
                    "rope_factor": 40},
    "deepseek-v2-lite": {"family": "deepseek_v2", "dtype": "bf16", "vocab": 102400, "hidden": 2048,
                         "layers": 27, "heads": 16, "experts": 64, "experts_per_token": 6, "intermediate": 1408,
                         "max_pos": 163840, "q_lora_rank": 0, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
                         "qk_rope_head_dim": 64, "v_head_dim": 128, "n_group": 1, "topk_group": 1,
                         "n_shared_experts": 2, "first_k_dense_replace": 1, "dense_intermediate": 10944,
                         "rope_factor": 40},
}
# The tiny DeepSeek models' sizes (where neither a flag nor a preset sets them): three layers, the first dense.
DEEPSEEK_TINY = {"hidden": 64, "layers": 3, "heads": 4, "experts": 8, "experts_per_token": 2, "intermediate": 32,
                 "q_lora_rank": 32, "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8,
                 "v_head_dim": 16, "n_group": 4, "topk_group": 2, "n_shared_experts": 1,
                 "first_k_dense_replace": 1, "dense_intermediate": 96, "rope_factor": 4}
DEEPSEEK_V2_TINY = dict(DEEPSEEK_TINY, q_lora_rank=0, n_group=1, topk_group=1, n_shared_experts=2)


def config(family, dtype="f32"):
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
    elif family in DEEPSEEK:
        c.update(deepseek_config(family == "deepseek_v3"))
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
    # The dtype the weights are stored in, as every config.json on the Hub says it (what `expar plan` assumes
    # when it plans from the config alone).
    c["torch_dtype"] = "float32" if dtype == "f32" else "bfloat16"
    if dtype == "fp8":  # as Qwen/Qwen3-30B-A3B-FP8's and deepseek-ai/DeepSeek-V3's config.json
        c.update(quantization_config=dict(FP8_QUANTIZATION))
    return c


def deepseek_config(v3):
    # deepseek-ai/DeepSeek-V3's and DeepSeek-V2-Lite's config.json apart from the sizes: latent attention (a
    # key and value per query head), YaRN with DeepSeek's mscale keys, V3's sigmoid router with groups and a
    # correction bias (noaux_tc) or V2-Lite's softmax greedy one, shared experts, the first layers dense.
    mscale = 1.0 if v3 else 0.707
    c = {"num_key_value_heads": HEADS, "q_lora_rank": Q_LORA or None, "kv_lora_rank": KV_LORA,
         "qk_nope_head_dim": NOPE, "qk_rope_head_dim": ROPE, "v_head_dim": V_DIM, "n_routed_experts": EXPERTS,
         "n_shared_experts": N_SHARED, "moe_intermediate_size": INTER, "intermediate_size": DENSE_INTER,
         "first_k_dense_replace": FIRST_DENSE, "moe_layer_freq": 1, "n_group": N_GROUP, "topk_group": TOPK_GROUP,
         "topk_method": "noaux_tc" if v3 else "greedy", "scoring_func": "sigmoid" if v3 else "softmax",
         "norm_topk_prob": v3, "routed_scaling_factor": 2.5 if v3 else 1.0, "attention_bias": False,
         "rope_theta": 10000.0,
         "rope_scaling": {"type": "yarn", "factor": ROPE_FACTOR, "mscale": mscale, "mscale_all_dim": mscale,
                          "original_max_position_embeddings": max(1, MAX_POS // ROPE_FACTOR), "beta_fast": 32,
                          "beta_slow": 1},
         "aux_loss_alpha": 0.001, "seq_aux": True}
    if v3:  # the checkpoint has no MTP layer; expar and transformers skip it anyway
        c.update(ep_size=1, num_nextn_predict_layers=1)
    else:
        c.update(pretraining_tp=1)
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
        if family in DEEPSEEK:
            deepseek_layer(p, l, family == "deepseek_v3", normal, t, s)
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


def deepseek_layer(p, l, v3, normal, t, s):
    # transformers' DeepseekV3/V2 names: latent attention (q through q_a_proj, its norm and q_b_proj, or a plain
    # q_proj when q_lora_rank is null; the latent and the shared rope key from kv_a_proj_with_mqa; kv_b_proj
    # into each head's nope key and value), then a dense MLP (the first FIRST_DENSE layers) or the experts with
    # the router (V3: plus e_score_correction_bias, F32 in every dtype as the Hub stores it) and shared experts.
    a, qk = p + "self_attn.", NOPE + ROPE
    if Q_LORA:
        normal(a + "q_a_proj.weight", [Q_LORA, HIDDEN], s)
        normal(a + "q_a_layernorm.weight", [Q_LORA], 0.1, 1.0)
        normal(a + "q_b_proj.weight", [HEADS * qk, Q_LORA], 1.0 / math.sqrt(Q_LORA))
    else:
        normal(a + "q_proj.weight", [HEADS * qk, HIDDEN], s)
    normal(a + "kv_a_proj_with_mqa.weight", [KV_LORA + ROPE, HIDDEN], s)
    normal(a + "kv_a_layernorm.weight", [KV_LORA], 0.1, 1.0)
    normal(a + "kv_b_proj.weight", [HEADS * (NOPE + V_DIM), KV_LORA], 1.0 / math.sqrt(KV_LORA))
    normal(a + "o_proj.weight", [HIDDEN, HEADS * V_DIM], 1.0 / math.sqrt(HEADS * V_DIM))

    def mlp(prefix, width):
        normal(prefix + "gate_proj.weight", [width, HIDDEN], s)
        normal(prefix + "up_proj.weight", [width, HIDDEN], s)
        normal(prefix + "down_proj.weight", [HIDDEN, width], 1.0 / math.sqrt(width))

    m = p + "mlp."
    if l < FIRST_DENSE:
        mlp(m, DENSE_INTER)
        return
    normal(m + "gate.weight", [EXPERTS, HIDDEN], s)
    if v3:
        bias = m + "gate.e_score_correction_bias"
        normal(bias, [EXPERTS], 0.1)
        t[bias] = ([EXPERTS], ("f32", t[bias][1]))
    for e in range(EXPERTS):
        mlp(f"{m}experts.{e}.", INTER)
    if N_SHARED:
        mlp(m + "shared_experts.", N_SHARED * INTER)


def dtype_of(values, dtype):
    if isinstance(values, tuple) and values[0] in ("bytes", "fill", "fp8", "fp8_scale", "f32"):
        return {"fp8": "F8_E4M3", "fp8_scale": "F32", "f32": "F32"}.get(values[0], "U8")
    return dtype


def element_bytes(dtype):
    return {"F32": 4, "BF16": 2, "U8": 1, "F8_E4M3": 1}[dtype]


def tensor_bytes(name, shape, values, dtype, rng, pool):
    n = math.prod(shape)
    if dtype == "F8_E4M3":
        codes, scales = fp8_weight(shape, values[1], rng, pool)
        pool.setdefault("scale_inv", {})[name + "_scale_inv"] = scales  # written next, in name order
        return codes
    if values[0] == "fp8_scale":
        return pool["scale_inv"].pop(name)
    if values[0] == "f32":  # kept F32 whatever --dtype (DeepSeek-V3's e_score_correction_bias)
        return tensor_bytes(name, shape, values[1], "F32", rng, pool)
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


# FP8 block-scaled storage (--dtype fp8). The E4M3 encoder and decoder are integer arithmetic on exact floats
# (the script needs no numpy); --self-test checks the encoder against a brute-force search of all 256 codes.
def e4m3_value(code):
    """The value of an OCP E4M3 code: bias 7, subnormals m * 2^-9, S.1111.111 NaN, no infinities."""
    sign = -1.0 if code & 0x80 else 1.0
    e, m = (code >> 3) & 15, code & 7
    if e == 15 and m == 7:
        return math.nan
    return sign * (math.ldexp(m, -9) if e == 0 else math.ldexp(8 + m, e - 10))


def e4m3_code(x):
    """The E4M3 code nearest to x, ties to even, saturating at +-448 (inf too); NaN is 0x7F."""
    if x != x:
        return 0x7F
    sign = 0x80 if math.copysign(1.0, x) < 0 else 0
    a = abs(x)
    if a > FP8_MAX:  # (448, 464] rounds to 448 anyway; past it, to 480, which E4M3 lacks (that code is NaN)
        return sign | 0x7E
    if a == 0.0:
        return sign
    exponent = max(math.frexp(a)[1] - 1, -6)  # a's binary exponent; below 2^-6 the subnormals' quantum 2^-9
    n = round(math.ldexp(a, 3 - exponent))  # a in quanta 2^(exponent-3): 8..16 (normal), 0..8 (subnormal)
    # exponent field exponent+7, mantissa n-8; n = 16 carries into the next exponent, and with exponent -6
    # the subnormals come out as codes 0..8 (8 is 2^-6, the smallest normal).
    return sign | (((exponent + 7) << 3) + n - 8)


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def bf16_values(values):
    # The values --dtype bf16 writes: each f32's upper half (narrowed()), back as floats.
    halves = array.array("H", struct.pack(f"<{len(values)}f", *values))[1::2]
    return array.array("f", array.array("I", (h << 16 for h in halves)).tobytes()).tolist()


def fp8_block(values):
    """One block's quantisation (the rule in --dtype's help): (scale, codes), scale = amax / 448 in f32 (1 for
    zeros), each code the E4M3 value nearest to w / scale (ties to even, saturating); so amax codes to 448."""
    amax = max(map(abs, values), default=0.0)
    scale = f32(amax / FP8_MAX) if amax > 0 else 1.0
    return scale, bytes(e4m3_code(v / scale) for v in values)


def fp8_weight(shape, values, rng, pool):
    """A [rows, cols] weight as (E4M3 codes, F32 weight_scale_inv [ceil(rows/128), ceil(cols/128)]) bytes."""
    rows, cols = shape
    b = FP8_BLOCK
    scales = []
    if isinstance(values, list):  # small: the drawn values, BF16 as --dtype bf16 writes them, block by block
        w, codes = bf16_values(values), bytearray(rows * cols)
        for r0 in range(0, rows, b):
            r1 = min(r0 + b, rows)
            for c0 in range(0, cols, b):
                c1 = min(c0 + b, cols)
                scale, q = fp8_block([w[r * cols + c] for r in range(r0, r1) for c in range(c0, c1)])
                scales.append(scale)
                for i, r in enumerate(range(r0, r1)):
                    codes[r * cols + c0:r * cols + c1] = q[i * (c1 - c0):(i + 1) * (c1 - c0)]
        return bytes(codes), struct.pack(f"<{len(scales)}f", *scales)
    # Large: each block a random one of FP8_TILES blocks of its size (std, h x w), drawn and quantised once;
    # a row of blocks is a run of a pool's blocks laid side by side from a random start.
    std = values[0]
    full, ragged = divmod(cols, b)
    out = []
    for r0 in range(0, rows, b):
        h = min(b, rows - r0)
        parts = [[] for _ in range(h)]
        for width, count in ((b, full), (ragged, 1 if ragged else 0)):
            if not count:
                continue
            tile_rows, tile_scales = fp8_tiles(std, h, width, rng, pool)
            while count:
                take, at = min(count, FP8_TILES), rng.randrange(FP8_TILES)
                for i in range(h):
                    parts[i].append(tile_rows[i][at * width:(at + take) * width])
                scales += tile_scales[at:at + take]
                count -= take
        out.append(b"".join(b"".join(p) for p in parts))
    return b"".join(out), struct.pack(f"<{len(scales)}f", *scales)


def fp8_tiles(std, h, w, rng, pool):
    # FP8_TILES random BF16 blocks of h x w values (normal, `std`), quantised: h rows of codes, the blocks side
    # by side and then again (so any run of up to FP8_TILES blocks is one slice), and the blocks' scales likewise.
    key = ("fp8", std, h, w)
    if key not in pool:
        rows, scales = [bytearray() for _ in range(h)], []
        for _ in range(FP8_TILES):
            scale, q = fp8_block(bf16_values([rng.gauss(0.0, std) for _ in range(h * w)]))
            scales.append(scale)
            for i in range(h):
                rows[i] += q[i * w:(i + 1) * w]
        pool[key] = ([bytes(r) * 2 for r in rows], scales * 2)
    return pool[key]


def fp8_convert(t):
    # --dtype fp8: the linear weights become E4M3 codes, each with its F32 block scales NAME.weight_scale_inv.
    for name in [n for n in t if FP8_LINEAR.search(n)]:
        shape, values = t[name]
        t[name] = (shape, ("fp8", values))
        t[name + "_scale_inv"] = ([-(-shape[0] // FP8_BLOCK), -(-shape[1] // FP8_BLOCK)], ("fp8_scale", name))


def self_test():
    # The encoder against a brute-force search: the nearest of all finite codes of x's sign (ties to the even
    # code), x clamped to +-448 first (saturation).
    magnitudes = [(c, e4m3_value(c)) for c in range(0x7F)]  # 0x00 .. 0x7E: every finite non-negative value

    def nearest(x):
        a = min(abs(x), FP8_MAX)
        code = min(magnitudes, key=lambda cv: (abs(a - cv[1]), cv[0] & 1))[0]
        return code | (0x80 if math.copysign(1.0, x) < 0 else 0)

    rng = random.Random(12345)
    values = [0.0, -0.0, 448.0, -448.0, 464.0, -464.0, 465.0, 479.0, 480.0, 1e30, -math.inf, math.inf]
    values += [math.ldexp(k, -10) for k in range(0, 17)]  # subnormals 2^-9 .. 2^-6 and their midpoints
    values += [math.ldexp(1.0, -12), math.ldexp(1.0, -10), math.ldexp(3.0, -11), 1e-30]
    finite = sorted(v for _, v in magnitudes)
    values += [(x + y) / 2 for x, y in zip(finite, finite[1:])]  # every tie
    values += [(x + y) / 2 * (1 + s * 2.0**-20) for x, y in zip(finite, finite[1:]) for s in (-1, 1)]
    values += [rng.choice((-1, 1)) * math.ldexp(rng.random() + 0.5, rng.randrange(-12, 10)) for _ in range(4000)]
    values += [rng.gauss(0.0, 100.0) for _ in range(1000)]
    bad = [(x, e4m3_code(x), nearest(x)) for x in values if e4m3_code(x) != nearest(x)]
    bad += [(x, e4m3_code(-x), nearest(-x)) for x in values if e4m3_code(-x) != nearest(-x)]
    if bad:
        raise SystemExit(f"self-test failed: {len(bad)} values encode wrongly, e.g. (x, code, nearest) {bad[:5]}")
    for code in range(256):
        value = e4m3_value(code)
        if value == value and e4m3_code(value) != code:
            raise SystemExit(f"self-test failed: code {code:#04x} ({value}) encodes as {e4m3_code(value):#04x}")
    if e4m3_code(math.nan) != 0x7F or not math.isnan(e4m3_value(0xFF)):
        raise SystemExit("self-test failed: NaN")
    # The block rule: the largest |w| codes to 448, and every code within half an E4M3 step of w / scale.
    for shape in ([128, 128], [32, 96], [3, 5]):
        w = bf16_values([rng.gauss(0.0, 0.02) for _ in range(math.prod(shape))])
        scale, q = fp8_block(w)
        if max(abs(e4m3_value(c)) for c in q) != FP8_MAX or not 0 < scale < math.inf:
            raise SystemExit(f"self-test failed: a {shape} block's amax does not code to 448 (scale {scale})")
        for v, c in zip(w, q):
            if abs(e4m3_value(c) - v / scale) > max(abs(v / scale) * 2.0**-4, 2.0**-10):
                raise SystemExit(f"self-test failed: {v} codes to {e4m3_value(c)} * {scale}")
    if fp8_block([0.0] * 16) != (1.0, bytes(16)):
        raise SystemExit("self-test failed: a block of zeros")
    print(f"self-test passed: E4M3 encoding of {2 * len(values)} values and all 256 codes, and the block rule")


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
            f.write(tensor_bytes(name, shape, values, dtype_of(values, dtype), rng, pool))
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


# DeepSeek's own sizes: flag (its config.json key where one has the name), help, the global it sets, minimum.
DEEPSEEK_ARGS = {
    "q_lora_rank": "the query's low rank (0: null, a plain q_proj as DeepSeek-V2-Lite)",
    "kv_lora_rank": "the latent key/value width",
    "qk_nope_head_dim": "each head's key/query width without rope",
    "qk_rope_head_dim": "each head's rope width (even)",
    "v_head_dim": "each head's value width",
    "n_group": "the router's expert groups (V3: must divide --experts)",
    "topk_group": "the groups a token chooses from (V3)",
    "n_shared_experts": "shared experts (one MLP n x --intermediate wide; 0: none)",
    "first_k_dense_replace": "the first layers with a dense MLP instead of experts",
    "dense_intermediate": "the dense MLP's width (intermediate_size)",
    "rope_factor": "YaRN's factor (original_max_position_embeddings = --max-pos / factor)",
}
DEEPSEEK_GLOBALS = {"q_lora_rank": ("Q_LORA", 0), "kv_lora_rank": ("KV_LORA", 1), "qk_nope_head_dim": ("NOPE", 1),
                    "qk_rope_head_dim": ("ROPE", 2), "v_head_dim": ("V_DIM", 1), "n_group": ("N_GROUP", 1),
                    "topk_group": ("TOPK_GROUP", 1), "n_shared_experts": ("N_SHARED", 0),
                    "first_k_dense_replace": ("FIRST_DENSE", 0), "dense_intermediate": ("DENSE_INTER", 1),
                    "rope_factor": ("ROPE_FACTOR", 1)}
PRESET_CUTS = ("layers", "experts")  # what a preset may be given smaller


def deepseek_sizes(a, given):
    # The DeepSeek families: their tiny defaults, the flags that do not apply refused with the ones that do,
    # and the router's groups checked as expar and transformers check them.
    if a.family not in DEEPSEEK:
        for key in DEEPSEEK_ARGS:
            if key in given:
                raise SystemExit(f"--{key.replace('_', '-')} is DeepSeek's (--family deepseek_v3 or deepseek_v2); "
                                 f"leave it out for {a.family}")
        return
    for key, fix in (("head_dim", "--qk-nope-head-dim, --qk-rope-head-dim and --v-head-dim"),
                     ("shared", "--n-shared-experts (a count of --intermediate wide experts)")):
        if key in given:
            raise SystemExit(f"--{key.replace('_', '-')}: {a.family} has no such width; use {fix}")
    for key, value in (DEEPSEEK_TINY if a.family == "deepseek_v3" else DEEPSEEK_V2_TINY).items():
        if getattr(a, key) is None:
            setattr(a, key, value)
    if "kv_heads" in given and a.kv_heads != a.heads:
        raise SystemExit(f"--kv-heads {a.kv_heads}: latent attention has a key and value per query head; "
                         f"leave it out (it is --heads, {a.heads})")
    a.kv_heads = a.heads
    g = globals()
    for key, (name, least) in DEEPSEEK_GLOBALS.items():
        value = getattr(a, key)
        if value < least:
            raise SystemExit(f"--{key.replace('_', '-')} {value} must be at least {least}")
        g[name] = value
    if ROPE % 2:
        raise SystemExit(f"--qk-rope-head-dim {ROPE} must be even (RoPE rotates pairs)")
    if a.experts_per_token > a.experts:
        raise SystemExit(f"--experts-per-token {a.experts_per_token} exceeds --experts {a.experts}")
    if a.family == "deepseek_v3":
        per_group = a.experts // N_GROUP if a.experts % N_GROUP == 0 else 0
        if TOPK_GROUP > N_GROUP or a.experts_per_token > TOPK_GROUP * per_group:
            least = N_GROUP * -(-a.experts_per_token // min(TOPK_GROUP, N_GROUP))
            raise SystemExit(f"--experts {a.experts}: DeepSeek-V3's router takes the top {a.experts_per_token} of "
                             f"the best {TOPK_GROUP} of {N_GROUP} groups, so --experts must be a multiple of "
                             f"--n-group {N_GROUP} with at least {a.experts_per_token} in {TOPK_GROUP} groups "
                             f"(--topk-group <= --n-group): e.g. --experts {least}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", choices=FAMILIES)
    ap.add_argument("--preset", choices=sorted(PRESETS),
                    help="a real model's sizes, family and dtype; --layers N and --experts N may cut it (fewer "
                         "layers, fewer routed experts: e.g. --preset deepseek-v3 --layers 4 --experts 32, whose "
                         "top-8 of 8 groups, best 4, stays valid), the widths stay the model's")
    ap.add_argument("--dtype", choices=("f32", "bf16", "fp8"),
                    help="the weights' dtype (default f32; a preset's own). fp8: as the Hub's FP8 releases "
                         "(DeepSeek-V3, Qwen3-*-FP8): attention's and the MLPs' linear weights in F8_E4M3 with "
                         "F32 NAME.weight_scale_inv per 128 x 128 block, the rest BF16 (DeepSeek-V3's "
                         "e_score_correction_bias F32). For each block (ragged "
                         "at the edges) of the BF16 weight, scale = amax(|block|) / 448 (1 for zeros) and code = "
                         "the E4M3 value nearest to w / scale, ties to even, saturating at +-448. Not gpt_oss "
                         "(MXFP4 experts)")
    ap.add_argument("--max-shard-bytes", type=int, default=5 * 10**9,
                    help="shard the checkpoint past this many bytes (default 5e9, as the Hub's)")
    ap.add_argument("--dry-run", action="store_true", help="print what would be written; write nothing")
    ap.add_argument("--self-test", action="store_true",
                    help="check the FP8 E4M3 encoder against a brute-force search of all 256 codes, and exit")
    ap.add_argument("--out")
    ap.add_argument("--tokens", type=int, default=1000, help="tokens in OUT/tokens.bin")
    ap.add_argument("--seed", type=int, default=1)
    sizes = {"vocab": VOCAB, "hidden": HIDDEN, "layers": LAYERS, "heads": HEADS, "kv_heads": KV_HEADS,
             "head_dim": HEAD_DIM, "experts": EXPERTS, "experts_per_token": TOP_K, "intermediate": INTER,
             "shared": SHARED, "max_pos": MAX_POS}
    for key in sizes:
        ap.add_argument("--" + key.replace("_", "-"), type=int)
    # DeepSeek only (--intermediate is moe_intermediate_size; the heads are the key/value heads too).
    for key, what in DEEPSEEK_ARGS.items():
        ap.add_argument("--" + key.replace("_", "-"), type=int, help=f"{'/'.join(DEEPSEEK)}: {what}")
    # expar's vocabulary: routes per token are --experts-per-token (--top-k is sampling's).
    ap.add_argument("--top-k", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    flags = {key for key in list(sizes) + list(DEEPSEEK_ARGS) if getattr(a, key) is not None}
    if a.self_test:
        self_test()
        return
    if a.out is None:
        ap.error("the following arguments are required: --out")
    if a.top_k is not None:
        raise SystemExit(f"--top-k {a.top_k}: --top-k is sampling's (expar generate); the routes per token are "
                         f"--experts-per-token: pass --experts-per-token {a.top_k}")
    preset = PRESETS.get(a.preset, {})
    for key, value in preset.items():
        given = getattr(a, key)
        if key == "dtype" and given in ("fp8", "bf16"):  # the preset's shapes stored as the Hub's FP8 or BF16
            continue
        if key in PRESET_CUTS and given is not None:  # fewer layers or experts of the preset's widths
            continue
        if given is not None and given != value:
            raise SystemExit(f"--{key.replace('_', '-')} {given} contradicts --preset {a.preset} ({value}): "
                             f"leave it out, or drop --preset")
        setattr(a, key, value)
    a.family = a.family or "qwen3_moe"
    deepseek_sizes(a, flags)
    for key, default in sizes.items():
        if getattr(a, key) is None:
            setattr(a, key, default)
    a.dtype = a.dtype or "f32"
    if a.dtype == "fp8" and a.family == "gpt_oss":
        raise SystemExit("--dtype fp8: gpt_oss is not shipped in FP8; its experts are MXFP4 (quant_method mxfp4), "
                         "which this script writes with --dtype bf16: use --dtype bf16")
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
    dtype = "BF16" if a.dtype == "fp8" else a.dtype.upper()  # fp8: the tensors left unquantised are BF16
    if a.dtype == "fp8":
        fp8_convert(t)
    shards = shard_plan(t, dtype, a.max_shard_bytes)
    by_dtype = {}
    for shape, values in t.values():
        d = dtype_of(values, dtype)
        if d == "F32" and dtype != "F32" and values[0] == "f32":
            d = "F32 kept"  # DeepSeek-V3's correction biases: F32 in every dtype, told apart from block scales
        by_dtype[d] = by_dtype.get(d, 0) + math.prod(shape) * element_bytes(d.split()[0])
    total = sum(by_dtype.values())
    if a.dry_run:
        print(json.dumps(config(a.family, a.dtype), indent=2))
        kept = by_dtype.get("F32 kept", 0)
        biases = f"{kept} of F32 router correction biases" if kept else ""
        fp8 = (f" ({by_dtype['F8_E4M3']} bytes of F8_E4M3 codes + {by_dtype['F32']} of F32 block scales + "
               f"{by_dtype['BF16']} of BF16 other tensors{' + ' + biases if kept else ''})" if a.dtype == "fp8"
               else f" (and {kept} bytes of F32 router correction biases)" if kept else "")
        print(f"would write {len(t)} tensors, {total} bytes ({total / 2**30:.2f} GiB) of {a.dtype} weights{fp8}"
              f"{' and mxfp4 experts' if a.family == 'gpt_oss' else ''} in {len(shards)} file(s), and "
              f"{a.tokens} tokens, to {a.out}")
        return
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(config(a.family, a.dtype), f, indent=2)
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
