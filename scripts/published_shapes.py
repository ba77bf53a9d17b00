#!/usr/bin/env python3
"""published_shapes.py — configs of published MoE models, cut for a check.

Writes OUT_DIR/NAME.json for each published model below: its config.json's
fields as published (hidden size, heads, head dims, expert and shared
expert sizes, routing, rope scaling, biases), with the depth, the routed
expert count and the vocabulary cut so that a random-weight checkpoint
(`moec-sample --fast`) and the CPU interpreter stay small. The cuts keep
every shape a kernel is specialized on (hidden, heads, head dims, the
intermediate sizes, the experts a token takes, the group structure of
grouped routing) and a dense first layer where the model has one.

  python3 scripts/published_shapes.py OUT_DIR [NAME ...]

scripts/gpu_shapes.sh runs each on the GPU against the CPU interpreter.
"""
import json
import os
import sys

QWEN_COMMON = {
    "attention_dropout": 0.0, "bos_token_id": 151643, "eos_token_id": 151645,
    "hidden_act": "silu", "initializer_range": 0.02, "mlp_only_layers": [],
    "output_router_logits": False, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
    "router_aux_loss_coef": 0.001, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "use_cache": True, "use_sliding_window": False,
    "decoder_sparse_step": 1,
}


def qwen2_moe(**kw):
    c = dict(QWEN_COMMON, architectures=["Qwen2MoeForCausalLM"], model_type="qwen2_moe",
             norm_topk_prob=False, sliding_window=32768, max_window_layers=28,
             qkv_bias=True)
    c.pop("qkv_bias")
    c.update(kw)
    return c


def qwen3_moe(**kw):
    c = dict(QWEN_COMMON, architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe",
             norm_topk_prob=True, sliding_window=None, attention_bias=False, head_dim=128,
             max_window_layers=48, rope_scaling=None)
    c.update(kw)
    return c


YARN = {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 4096, "type": "yarn"}


def deepseek(arch, mtype, **kw):
    c = {"architectures": [arch], "model_type": mtype, "attention_bias": False,
         "attention_dropout": 0.0, "bos_token_id": 0, "eos_token_id": 1, "ep_size": 1,
         "hidden_act": "silu", "initializer_range": 0.02, "kv_lora_rank": 512,
         "max_position_embeddings": 163840, "moe_layer_freq": 1, "qk_nope_head_dim": 128,
         "qk_rope_head_dim": 64, "v_head_dim": 128, "rms_norm_eps": 1e-06,
         "rope_theta": 10000, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
         "use_cache": True, "first_k_dense_replace": 1}
    c.update(kw)
    return c


MODELS = {
    # Qwen/Qwen1.5-MoE-A2.7B: 16 heads, MHA, 60 experts, top 4, shared 5632
    "qwen1_5_moe_a2_7b": qwen2_moe(
        hidden_size=2048, intermediate_size=5632, moe_intermediate_size=1408,
        shared_expert_intermediate_size=5632, num_attention_heads=16, num_key_value_heads=16,
        num_experts=60, num_experts_per_tok=4, max_position_embeddings=8192,
        eos_token_id=151643),
    # Qwen/Qwen2-57B-A14B: 28 heads over 4 kv heads (7 a group), hidden 3584
    "qwen2_57b_a14b": qwen2_moe(
        hidden_size=3584, intermediate_size=18944, moe_intermediate_size=2560,
        shared_expert_intermediate_size=20480, num_attention_heads=28, num_key_value_heads=4,
        num_experts=64, num_experts_per_tok=8, max_position_embeddings=32768,
        sliding_window=131072, eos_token_id=151643),
    # Qwen/Qwen3-30B-A3B
    "qwen3_30b_a3b": qwen3_moe(
        hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
        num_attention_heads=32, num_key_value_heads=4, num_experts=128, num_experts_per_tok=8,
        max_position_embeddings=40960),
    # Qwen/Qwen3-235B-A22B: 64 heads over 4 (16 a group), hidden 4096
    "qwen3_235b_a22b": qwen3_moe(
        hidden_size=4096, intermediate_size=12288, moe_intermediate_size=1536,
        num_attention_heads=64, num_key_value_heads=4, num_experts=128, num_experts_per_tok=8,
        max_position_embeddings=40960, max_window_layers=94),
    # Qwen/Qwen3-Coder-480B-A35B-Instruct: 96 heads over 8 (12 a group), hidden 6144
    "qwen3_coder_480b": qwen3_moe(
        hidden_size=6144, intermediate_size=8192, moe_intermediate_size=2560,
        num_attention_heads=96, num_key_value_heads=8, num_experts=160, num_experts_per_tok=8,
        max_position_embeddings=262144, max_window_layers=62),
    # deepseek-ai/DeepSeek-V2-Lite
    "deepseek_v2_lite": deepseek(
        "DeepseekV2ForCausalLM", "deepseek_v2", hidden_size=2048, intermediate_size=10944,
        moe_intermediate_size=1408, n_routed_experts=64, n_shared_experts=2,
        num_experts_per_tok=6, n_group=1, topk_group=1, topk_method="greedy",
        norm_topk_prob=False, num_attention_heads=16, num_key_value_heads=16, q_lora_rank=None,
        routed_scaling_factor=1.0, scoring_func="softmax", bos_token_id=100000,
        eos_token_id=100001,
        rope_scaling=dict(YARN, mscale=0.707, mscale_all_dim=0.707)),
    # deepseek-ai/DeepSeek-V2 (and V2.5): 128 heads, q_lora 1536, group-limited routing
    "deepseek_v2": deepseek(
        "DeepseekV2ForCausalLM", "deepseek_v2", hidden_size=5120, intermediate_size=12288,
        moe_intermediate_size=1536, n_routed_experts=160, n_shared_experts=2,
        num_experts_per_tok=6, n_group=8, topk_group=3, topk_method="group_limited_greedy",
        norm_topk_prob=False, num_attention_heads=128, num_key_value_heads=128,
        q_lora_rank=1536, routed_scaling_factor=16.0, scoring_func="softmax",
        bos_token_id=100000, eos_token_id=100001,
        rope_scaling=dict(YARN, mscale=0.707, mscale_all_dim=0.707)),
    # deepseek-ai/DeepSeek-V3 (R1, V3.1): 256 experts in 8 groups, sigmoid, bias
    "deepseek_v3": deepseek(
        "DeepseekV3ForCausalLM", "deepseek_v3", hidden_size=7168, intermediate_size=18432,
        moe_intermediate_size=2048, n_routed_experts=256, n_shared_experts=1,
        num_experts_per_tok=8, n_group=8, topk_group=4, topk_method="noaux_tc",
        norm_topk_prob=True, num_attention_heads=128, num_key_value_heads=128,
        q_lora_rank=1536, routed_scaling_factor=2.5, scoring_func="sigmoid",
        num_nextn_predict_layers=1, rope_scaling=YARN),
    # moonshotai/Moonlight-16B-A3B: deepseek_v3 without q_lora, one group
    "moonlight_16b_a3b": deepseek(
        "DeepseekV3ForCausalLM", "deepseek_v3", hidden_size=2048, intermediate_size=11264,
        moe_intermediate_size=1408, n_routed_experts=64, n_shared_experts=2,
        num_experts_per_tok=6, n_group=1, topk_group=1, topk_method="noaux_tc",
        norm_topk_prob=True, num_attention_heads=16, num_key_value_heads=16, q_lora_rank=None,
        routed_scaling_factor=2.446, scoring_func="sigmoid", rope_scaling=None,
        rope_theta=50000.0, max_position_embeddings=8192, bos_token_id=163584,
        eos_token_id=163585),
    # moonshotai/Kimi-K2-Instruct: deepseek_v3, 64 heads, 384 experts, one group
    "kimi_k2": deepseek(
        "DeepseekV3ForCausalLM", "deepseek_v3", hidden_size=7168, intermediate_size=18432,
        moe_intermediate_size=2048, n_routed_experts=384, n_shared_experts=1,
        num_experts_per_tok=8, n_group=1, topk_group=1, topk_method="noaux_tc",
        norm_topk_prob=True, num_attention_heads=64, num_key_value_heads=64,
        q_lora_rank=1536, routed_scaling_factor=2.827, scoring_func="sigmoid",
        rope_theta=50000.0, max_position_embeddings=131072, bos_token_id=163584,
        eos_token_id=163585,
        rope_scaling=dict(YARN, factor=32.0, original_max_position_embeddings=4096)),
    # deepseek-ai/DeepSeek-V3.2-Exp: V3 with the sparse attention's indexer
    "deepseek_v32": deepseek(
        "DeepseekV32ForCausalLM", "deepseek_v32", hidden_size=7168, intermediate_size=18432,
        moe_intermediate_size=2048, n_routed_experts=256, n_shared_experts=1,
        num_experts_per_tok=8, n_group=8, topk_group=4, topk_method="noaux_tc",
        norm_topk_prob=True, num_attention_heads=128, num_key_value_heads=128,
        q_lora_rank=1536, routed_scaling_factor=2.5, scoring_func="sigmoid",
        index_head_dim=128, index_n_heads=64, index_topk=2048, num_nextn_predict_layers=1,
        rope_scaling=YARN),
}


def cut(name, c):
    """Two layers (a dense one first where the model has one), fewer routed
    experts (keeping the groups of grouped routing and the experts a token
    takes), a 4096-token vocabulary."""
    c = dict(c)
    c["vocab_size"] = 4096
    c["bos_token_id"] = 0
    c["eos_token_id"] = 1
    if c["model_type"].startswith("deepseek"):
        c["num_hidden_layers"] = 2
        groups = c["n_group"]
        per = max(4, -(-c["num_experts_per_tok"] * 2 // groups))
        c["n_routed_experts"] = min(c["n_routed_experts"], groups * per)
    else:
        c["num_hidden_layers"] = 2
        c["max_window_layers"] = 2
        c["num_experts"] = min(c["num_experts"], 2 * c["num_experts_per_tok"])
    return c


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    names = sys.argv[2:] or list(MODELS)
    os.makedirs(out, exist_ok=True)
    for n in names:
        if n not in MODELS:
            sys.exit(f"unknown model {n!r}; known: {' '.join(MODELS)}")
        with open(os.path.join(out, n + ".json"), "w") as f:
            json.dump(cut(n, MODELS[n]), f, indent=1)
        print(n)


if __name__ == "__main__":
    main()
