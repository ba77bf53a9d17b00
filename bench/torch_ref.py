#!/usr/bin/env python3
"""torch_ref.py — a plain-PyTorch reference of the MoE models moec runs
(deepseek_v2, deepseek_v3, qwen2_moe, qwen3_moe), layer by layer as
transformers 5.17 computes them but without its modelling code, used to time
decode steps on the GPU (eager with the per-expert loop, eager and CUDA-graph
with a grouped expert GEMM, and torch.compile's kernels of the grouped form
captured in a CUDA graph: compile-graph, --compile-mode) and to check itself
against the transformers goldens of the tiny test models in fp32.

usage:
  torch_ref.py MODEL [--batch-sizes 1,8,32,64] [--context 1024] [--modes ...]
               [--random-weights] [--mla-cache auto|expanded|compressed] ...
      MODEL is a model folder (config.json + model.safetensors, or shards named
      by model.safetensors.index.json) or, with --random-weights, a folder or a
      config.json whose weights are drawn on the device instead of read.
      Prints one JSON line per (mode, batch) to stdout and a table to stderr.
  torch_ref.py --check DIR [DIR ...] [--device cpu|cuda]
      Runs each tiny model DIR (config.json, model.safetensors, prompt.json,
      golden.json, logits.bin) in fp32: prefill of the prompt, then greedy
      decode steps, through every MoE form, MLA cache form and attention
      kernel; compares with logits.bin and golden.json's greedy_ids. Exit
      status 1 on any mismatch.
"""
import argparse
import json
import math
import os
import statistics
import sys
from types import SimpleNamespace

import torch
import torch.nn.functional as F

CHECK_TOL = 1e-4  # max |err| of a row over the row's largest |logit|
LATENT_NORM_EPS = 1e-6  # DeepSeek's q_a_layernorm / kv_a_layernorm keep the default eps
ALL_MODES = ("eager-loop", "eager-grouped", "graph-grouped", "compile-graph")


class RefError(Exception):
    """A bad model folder, config or argument: reported in one line, exit 2."""


# ---- config -------------------------------------------------------------------


def _get(cfg, key, default):
    """cfg[key], or default when the key is absent or null."""
    v = cfg.get(key)
    return default if v is None else v


def _rope_dict(cfg):
    """The RoPE parameters as transformers 4 (rope_scaling) or 5
    (rope_parameters) writes them; {} for plain RoPE."""
    rs, rp = cfg.get("rope_scaling"), cfg.get("rope_parameters")
    if isinstance(rs, dict) and rs:
        return rs
    if isinstance(rp, dict):
        if any(isinstance(v, dict) for v in rp.values()):
            raise RefError("per-layer-type RoPE parameters are not supported")
        return rp
    return {}


def _rope(cfg, dim):
    """inv_freq (fp32, computed with the same torch ops as transformers'
    ROPE_INIT_FUNCTIONS), the cos/sin factor and the rope dict."""
    d = _rope_dict(cfg)
    theta = float(d["rope_theta"] if d.get("rope_theta") is not None else _get(cfg, "rope_theta", 10000.0))
    prf = d.get("partial_rotary_factor", cfg.get("partial_rotary_factor"))
    if prf is not None and float(prf) != 1.0:
        raise RefError(f"partial_rotary_factor {prf} is not supported")
    kind = d.get("rope_type", d.get("type", "default")) or "default"
    if dim % 2:
        raise RefError(f"rotary dim {dim} is odd")
    base = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float) / dim))
    if kind == "default":
        return base, 1.0, d
    if kind == "linear":
        return base / float(d["factor"]), 1.0, d
    if kind != "yarn":
        raise RefError(f"rope type {kind!r} is not supported (default, linear, yarn)")
    max_pos = int(_get(cfg, "max_position_embeddings", 2048))
    ompe = cfg.get("original_max_position_embeddings", d.get("original_max_position_embeddings", max_pos))
    factor = d.get("factor")
    if factor is None:
        factor = max_pos / ompe
    factor = float(factor)

    def get_mscale(scale, m=1.0):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attn = d.get("attention_factor")
    if attn is None:
        ms, msa = d.get("mscale"), d.get("mscale_all_dim")
        attn = get_mscale(factor, ms) / get_mscale(factor, msa) if ms and msa else get_mscale(factor)
    beta_fast = d.get("beta_fast") or 32
    beta_slow = d.get("beta_slow") or 1

    def corr_dim(rot):
        return (dim * math.log(ompe / (rot * 2 * math.pi))) / (2 * math.log(theta))

    low, high = corr_dim(beta_fast), corr_dim(beta_slow)
    if d.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    pos_freqs = theta ** (torch.arange(0, dim, 2).to(dtype=torch.float) / dim)
    extrap, interp = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    extrap_factor = 1 - ramp
    return interp * (1 - extrap_factor) + extrap * extrap_factor, float(attn), d


def read_spec(path, layers=None):
    """The model's shape and semantics from config.json (a file or a folder)."""
    cfg_path = os.path.join(path, "config.json") if os.path.isdir(path) else path
    try:
        with open(cfg_path) as f:
            cfg = json.load(f)
    except (OSError, ValueError) as e:
        raise RefError(f"{cfg_path}: {e}")
    mt = cfg.get("model_type")
    if mt not in ("deepseek_v2", "deepseek_v3", "qwen2_moe", "qwen3_moe"):
        raise RefError(f"{cfg_path}: model_type {mt!r} is not supported")
    if _get(cfg, "hidden_act", "silu") != "silu":
        raise RefError(f"{cfg_path}: hidden_act {cfg['hidden_act']!r} is not supported (silu)")
    s = SimpleNamespace(model_type=mt, path=cfg_path)
    s.vocab = int(cfg["vocab_size"])
    s.hidden = int(cfg["hidden_size"])
    s.inter = int(cfg["intermediate_size"])
    s.n_layers = int(cfg["num_hidden_layers"])
    if layers:
        s.n_layers = min(s.n_layers, layers)
    s.eps = float(_get(cfg, "rms_norm_eps", 1e-6))
    s.tie = bool(cfg.get("tie_word_embeddings", False))
    s.max_pos = int(_get(cfg, "max_position_embeddings", 2048))
    s.heads = int(cfg["num_attention_heads"])
    if mt.startswith("deepseek"):
        v3 = mt == "deepseek_v3"
        s.mla = True
        s.q_lora = cfg.get("q_lora_rank") or 0
        s.kv_lora = int(cfg["kv_lora_rank"])
        s.nope, s.rope_dim, s.v_dim = int(cfg["qk_nope_head_dim"]), int(cfg["qk_rope_head_dim"]), int(cfg["v_head_dim"])
        kvh = cfg.get("num_key_value_heads", 128 if v3 else None)
        if kvh is not None and int(kvh) != s.heads:
            raise RefError(f"{cfg_path}: MLA needs num_key_value_heads == num_attention_heads")
        s.kv_heads = s.heads
        s.attn_bias = bool(cfg.get("attention_bias", False))
        s.mlp_bias = False if v3 else bool(cfg.get("mlp_bias", False))
        s.inv_freq, s.attn_factor, rd = _rope(cfg, s.rope_dim)
        s.rope_style = "interleave_v3" if v3 and cfg.get("rope_interleave", True) else ("neox" if v3 else "complex")
        s.scale = (s.nope + s.rope_dim) ** -0.5
        if (rd.get("rope_type", rd.get("type", "default")) or "default") != "default" and rd.get("mscale_all_dim"):
            m = 0.1 * rd["mscale_all_dim"] * math.log(rd["factor"]) + 1.0 if rd["factor"] > 1 else 1.0
            s.scale = s.scale * m * m
        n_exp = cfg.get("n_routed_experts", cfg.get("num_local_experts", None if v3 else cfg.get("num_experts")))
        s.n_experts = int(n_exp) if n_exp else 0
        s.top_k = int(cfg.get("num_experts_per_tok") or 0)
        s.moe_inter = int(cfg.get("moe_intermediate_size") or 0)
        ns = cfg.get("n_shared_experts", 1 if v3 else 2)
        s.shared_inter = s.moe_inter * int(ns or 0)
        first_k = int(_get(cfg, "first_k_dense_replace", 3 if v3 else 0))
        freq = int(_get(cfg, "moe_layer_freq", 1))
        s.moe_layers = [s.n_experts > 0 and i >= first_k and i % freq == 0 for i in range(s.n_layers)]
        s.scaling = float(_get(cfg, "routed_scaling_factor", 2.5 if v3 else 1.0))
        if v3:
            s.router = "sigmoid_grouped"
            s.n_group, s.topk_group = int(_get(cfg, "n_group", 8)), int(_get(cfg, "topk_group", 4))
            s.norm_topk = bool(cfg.get("norm_topk_prob", True))
        else:
            if _get(cfg, "scoring_func", "softmax") != "softmax":
                raise RefError(f"{cfg_path}: deepseek_v2 scoring_func must be softmax")
            method = cfg.get("topk_method", "greedy")
            if method not in ("greedy", "group_limited_greedy"):
                raise RefError(f"{cfg_path}: topk_method {method!r} is not supported")
            s.router = "softmax_v2"
            s.n_group = int(cfg["n_group"]) if method == "group_limited_greedy" else 1
            s.topk_group = int(cfg["topk_group"]) if method == "group_limited_greedy" else 1
            s.norm_topk = False  # DeepseekV2TopkRouter never normalizes
    else:
        s.mla = False
        s.kv_heads = int(_get(cfg, "num_key_value_heads", 4 if mt == "qwen3_moe" else 16))
        s.head_dim = int(cfg.get("head_dim") or s.hidden // s.heads)
        if cfg.get("use_sliding_window"):
            raise RefError(f"{cfg_path}: use_sliding_window is not supported by the reference")
        s.qkv_bias = bool(cfg.get("qkv_bias", True)) if mt == "qwen2_moe" else bool(cfg.get("attention_bias", False))
        s.o_bias = False if mt == "qwen2_moe" else s.qkv_bias
        s.qk_norm = mt == "qwen3_moe"
        s.inv_freq, s.attn_factor, _ = _rope(cfg, s.head_dim)
        s.rope_style = "neox"
        s.scale = s.head_dim ** -0.5
        s.n_experts = int(_get(cfg, "num_experts", 128 if mt == "qwen3_moe" else 60))
        s.top_k = int(_get(cfg, "num_experts_per_tok", 8 if mt == "qwen3_moe" else 4))
        s.moe_inter = int(_get(cfg, "moe_intermediate_size", 768 if mt == "qwen3_moe" else 1408))
        s.shared_inter = int(_get(cfg, "shared_expert_intermediate_size", 5632)) if mt == "qwen2_moe" else 0
        step = int(_get(cfg, "decoder_sparse_step", 1))
        only = set(_get(cfg, "mlp_only_layers", []))
        s.moe_layers = [i not in only and s.n_experts > 0 and (i + 1) % step == 0 for i in range(s.n_layers)]
        s.router = "softmax_qwen"
        s.norm_topk = bool(cfg.get("norm_topk_prob", False))
        s.n_group = s.topk_group = 1
        s.scaling = 1.0
    return s


# ---- weights --------------------------------------------------------------------


class Checkpoint:
    """Tensors of a published model folder, read with safetensors' safe_open."""

    def __init__(self, folder):
        from safetensors import safe_open

        self._open_fn = safe_open
        self.folder = folder
        self.files = {}
        idx = os.path.join(folder, "model.safetensors.index.json")
        single = os.path.join(folder, "model.safetensors")
        if os.path.exists(idx):
            with open(idx) as f:
                wm = json.load(f).get("weight_map")
            if not isinstance(wm, dict):
                raise RefError(f"{idx}: no weight_map")
            self.names = {k: os.path.join(folder, v) for k, v in wm.items()}
        elif os.path.exists(single):
            self.names = {k: single for k in self._handle(single).keys()}
        else:
            raise RefError(f"{folder}: neither model.safetensors nor model.safetensors.index.json")

    def _handle(self, path):
        if path not in self.files:
            try:
                self.files[path] = self._open_fn(path, framework="pt", device="cpu")
            except Exception as e:  # safetensors raises its own error types
                raise RefError(f"{path}: {e}")
        return self.files[path]

    def has(self, name):
        return name in self.names

    def get(self, name, shape, kind, dtype, device):
        if name not in self.names:
            raise RefError(f"{self.folder}: missing tensor {name}")
        h = self._handle(self.names[name])
        got = list(h.get_slice(name).get_shape())
        if got != list(shape):
            raise RefError(f"{self.names[name]}: tensor {name} has shape {got}, expected {list(shape)}")
        return h.get_tensor(name).to(device=device, dtype=dtype)

    def experts(self, prefix, n, inter, hidden, dtype, device):
        """gate_up [E, 2I, H] (gate rows first) and down [E, H, I]."""
        if self.has(prefix + "experts.gate_up_proj"):
            gu = self.get(prefix + "experts.gate_up_proj", [n, 2 * inter, hidden], "matrix", dtype, device)
            dn = self.get(prefix + "experts.down_proj", [n, hidden, inter], "matrix", dtype, device)
            return gu, dn
        gu = torch.empty(n, 2 * inter, hidden, dtype=dtype, device=device)
        dn = torch.empty(n, hidden, inter, dtype=dtype, device=device)
        for e in range(n):
            p = f"{prefix}experts.{e}."
            gu[e, :inter] = self.get(p + "gate_proj.weight", [inter, hidden], "matrix", dtype, device)
            gu[e, inter:] = self.get(p + "up_proj.weight", [inter, hidden], "matrix", dtype, device)
            dn[e] = self.get(p + "down_proj.weight", [hidden, inter], "matrix", dtype, device)
        return gu, dn


class RandomWeights:
    """Weights drawn on the device with moec-sample's distributions:
    embeddings N(0, 1), matrices N(0, 1/in_features), norm weights
    1 + N(0, 0.1^2), biases N(0, 0.1^2)."""

    def __init__(self, seed, device):
        self.gen = torch.Generator(device=device)
        self.gen.manual_seed(seed)

    def get(self, name, shape, kind, dtype, device):
        t = torch.empty(shape, dtype=dtype, device=device)
        if kind == "embed":
            return t.normal_(0.0, 1.0, generator=self.gen)
        if kind == "norm":
            return t.normal_(1.0, 0.1, generator=self.gen)
        if kind == "bias":
            return t.normal_(0.0, 0.1, generator=self.gen)
        return t.normal_(0.0, 1.0 / math.sqrt(shape[-1]), generator=self.gen)

    def experts(self, prefix, n, inter, hidden, dtype, device):
        return (self.get(prefix + "gate_up", [n, 2 * inter, hidden], "matrix", dtype, device),
                self.get(prefix + "down", [n, hidden, inter], "matrix", dtype, device))


# ---- layer code (shared by the fp32 check and the bf16 benchmark) ---------------


def rms_norm(x, w, eps):
    dt = x.dtype
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return w * h.to(dt)


def mlp(x, m):
    """gate/up/down with silu, as *MLP in transformers (two separate linears)."""
    return F.linear(F.silu(F.linear(x, m.gate, m.gate_b)) * F.linear(x, m.up, m.up_b), m.down, m.down_b)


def repeat_kv(x, n):
    if n == 1:
        return x
    b, h, s, d = x.shape
    return x[:, :, None].expand(b, h, n, s, d).reshape(b, h * n, s, d)


def _grouped_mm_fn():
    """(function, name) of this torch's grouped GEMM, or (None, None)."""
    if hasattr(F, "grouped_mm"):
        return F.grouped_mm, "F.grouped_mm"
    if hasattr(torch, "_grouped_mm"):
        return torch._grouped_mm, "torch._grouped_mm"
    return None, None


class RefModel:
    """The model's weights on one device and its forward pass over a static
    per-layer KV cache. dtype is the activation and weight dtype (fp32 for the
    check, bf16 for the benchmark); the router and RoPE math follow
    transformers' own dtype choices within it."""

    def __init__(self, spec, src, dtype, device, attn="sdpa", grouped_impl="auto"):
        self.s, self.dtype, self.device, self.attn = spec, dtype, torch.device(device), attn
        gmm, self._gmm_name = _grouped_mm_fn()
        if grouped_impl == "auto":
            ok = gmm is not None and (self.device.type == "cpu" or torch.cuda.get_device_capability(self.device) >= (8, 0))
            grouped_impl = "grouped_mm" if ok else "bmm"
        if grouped_impl == "grouped_mm" and gmm is None:
            raise RefError("this torch has no grouped_mm")
        self.grouped_impl, self._gmm = grouped_impl, gmm
        s, dt, dv = spec, dtype, self.device

        def w(name, shape, kind="matrix", d=None):
            return src.get(name, shape, kind, d or dt, dv)

        def dense(prefix, inter, bias):
            return SimpleNamespace(
                gate=w(prefix + "gate_proj.weight", [inter, s.hidden]),
                up=w(prefix + "up_proj.weight", [inter, s.hidden]),
                down=w(prefix + "down_proj.weight", [s.hidden, inter]),
                gate_b=w(prefix + "gate_proj.bias", [inter], "bias") if bias else None,
                up_b=w(prefix + "up_proj.bias", [inter], "bias") if bias else None,
                down_b=w(prefix + "down_proj.bias", [s.hidden], "bias") if bias else None)

        self.embed = w("model.embed_tokens.weight", [s.vocab, s.hidden], "embed")
        self.layers = []
        for i in range(s.n_layers):
            p = f"model.layers.{i}."
            L = SimpleNamespace(ln1=w(p + "input_layernorm.weight", [s.hidden], "norm"),
                                ln2=w(p + "post_attention_layernorm.weight", [s.hidden], "norm"))
            a = p + "self_attn."
            if s.mla:
                H, qk = s.heads, s.nope + s.rope_dim
                if s.q_lora:
                    L.q_a = w(a + "q_a_proj.weight", [s.q_lora, s.hidden])
                    L.q_a_b = w(a + "q_a_proj.bias", [s.q_lora], "bias") if s.attn_bias else None
                    L.q_a_ln = w(a + "q_a_layernorm.weight", [s.q_lora], "norm")
                    L.q_b = w(a + "q_b_proj.weight", [H * qk, s.q_lora])
                else:
                    L.q = w(a + "q_proj.weight", [H * qk, s.hidden])
                L.kv_a = w(a + "kv_a_proj_with_mqa.weight", [s.kv_lora + s.rope_dim, s.hidden])
                L.kv_a_b = w(a + "kv_a_proj_with_mqa.bias", [s.kv_lora + s.rope_dim], "bias") if s.attn_bias else None
                L.kv_a_ln = w(a + "kv_a_layernorm.weight", [s.kv_lora], "norm")
                L.kv_b = w(a + "kv_b_proj.weight", [H * (s.nope + s.v_dim), s.kv_lora])
                L.o = w(a + "o_proj.weight", [s.hidden, H * s.v_dim])
                L.o_b = w(a + "o_proj.bias", [s.hidden], "bias") if s.attn_bias else None
            else:
                H, Hk, hd = s.heads, s.kv_heads, s.head_dim
                for n, rows in (("q", H * hd), ("k", Hk * hd), ("v", Hk * hd)):
                    setattr(L, n, w(a + f"{n}_proj.weight", [rows, s.hidden]))
                    setattr(L, n + "_b", w(a + f"{n}_proj.bias", [rows], "bias") if s.qkv_bias else None)
                L.o = w(a + "o_proj.weight", [s.hidden, H * hd])
                L.o_b = w(a + "o_proj.bias", [s.hidden], "bias") if s.o_bias else None
                if s.qk_norm:
                    L.q_norm = w(a + "q_norm.weight", [hd], "norm")
                    L.k_norm = w(a + "k_norm.weight", [hd], "norm")
            m = p + "mlp."
            if s.moe_layers[i]:
                E = s.n_experts
                # DeepSeek routers run in fp32 (F.linear on .float() weights):
                # keep an fp32 copy instead of casting every step.
                L.router = w(m + "gate.weight", [E, s.hidden], d=torch.float32 if s.mla else dt)
                if s.router == "sigmoid_grouped":
                    L.router_bias = w(m + "gate.e_score_correction_bias", [E], "bias", d=torch.float32)
                L.gate_up, L.down = src.experts(m, E, s.moe_inter, s.hidden, dt, dv)
                L.shared = None
                if s.shared_inter:
                    name = "shared_experts." if s.mla else "shared_expert."
                    L.shared = dense(m + name, s.shared_inter, s.mlp_bias if s.mla else False)
                L.shared_gate = w(m + "shared_expert_gate.weight", [1, s.hidden]) if s.model_type == "qwen2_moe" else None
                L.mlp = None
            else:
                L.mlp = dense(m, s.inter, s.mlp_bias if s.mla else False)
            self.layers.append(L)
        self.norm = w("model.norm.weight", [s.hidden], "norm")
        self.lm_head = self.embed if s.tie else w("lm_head.weight", [s.vocab, s.hidden])
        self.cache = None

    def grouped_name(self):
        """Which grouped GEMM the grouped MoE form runs."""
        return self._gmm_name if self.grouped_impl == "grouped_mm" else "padded bmm"

    # -- KV cache --

    def cache_bytes(self, batch, seq, mla_cache):
        s, n = self.s, self.s.n_layers
        el = torch.tensor([], dtype=self.dtype).element_size()
        if not s.mla:
            per = 2 * s.kv_heads * s.head_dim
        elif mla_cache == "expanded":
            per = s.heads * (s.nope + s.rope_dim + s.v_dim)
        else:
            per = s.kv_lora + s.rope_dim
        return n * batch * seq * per * el

    def alloc_cache(self, batch, seq, mla_cache="expanded", gen=None):
        """A static cache of seq positions per layer for batch sequences:
        GQA k/v [B, Hkv, S, hd]; MLA expanded (per-head k [B, H, S, dn+dr] and
        v [B, H, S, dv]) or compressed (latent [B, 1, S, r] and rotated k_pe
        [B, 1, S, dr], as transformers 5.17 caches it). Filled with N(0, 1)
        values when gen is given (the benchmark's stand-in for a prefill),
        else zeros."""
        s, dt, dv = self.s, self.dtype, self.device
        self.cache, self.mla_cache = None, mla_cache

        def buf(*shape):
            t = torch.zeros(shape, dtype=dt, device=dv)
            return t.normal_(0.0, 1.0, generator=gen) if gen is not None else t

        cache = []
        for _ in range(s.n_layers):
            if not s.mla:
                cache.append((buf(batch, s.kv_heads, seq, s.head_dim), buf(batch, s.kv_heads, seq, s.head_dim)))
            elif mla_cache == "expanded":
                cache.append((buf(batch, s.heads, seq, s.nope + s.rope_dim), buf(batch, s.heads, seq, s.v_dim)))
            elif mla_cache == "compressed":
                cache.append((buf(batch, 1, seq, s.kv_lora), buf(batch, 1, seq, s.rope_dim)))
            else:
                raise RefError(f"unknown MLA cache form {mla_cache!r}")
        self.cache = cache

    # -- RoPE --

    def rope_tables(self, seq):
        """cos and sin * attn_factor for positions [0, seq), fp32 [seq, D/2],
        from fp32 angles pos * inv_freq as transformers computes them."""
        freqs = torch.arange(seq, dtype=torch.float32)[:, None] * self.s.inv_freq[None, :]
        self.cos = (freqs.cos() * self.s.attn_factor).to(self.device)
        self.sin = (freqs.sin() * self.s.attn_factor).to(self.device)

    def rope(self, x, cos, sin):
        """x [B, h, T, D]; cos, sin fp32 [T, D/2]."""
        style = self.s.rope_style
        if style == "complex":
            # DeepSeek-V2: view_as_complex over channel pairs, in fp32.
            xf = x.float().unflatten(-1, (-1, 2))
            x0, x1 = xf[..., 0], xf[..., 1]
            return torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1).flatten(-2).type_as(x)
        c, sn = cos.to(x.dtype), sin.to(x.dtype)
        if style == "interleave_v3":
            # DeepSeek-V3: even/odd channels rotated, written out as [evens, odds].
            x1, x2 = x[..., 0::2], x[..., 1::2]
            return torch.cat([x1 * c - x2 * sn, x2 * c + x1 * sn], dim=-1)
        c, sn = torch.cat((c, c), -1), torch.cat((sn, sn), -1)
        half = x.shape[-1] // 2
        rot = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * c + rot * sn

    # -- attention --

    def attend(self, q, k, v, pos, kv_len, n_rep):
        """q [B, H, T, dk] against the cache's first kv_len positions. T == 1
        is a decode step at position kv_len - 1 (no mask); T > 1 attends
        causally by absolute position."""
        B, _, T, _ = q.shape
        mask = None
        if T > 1:
            mask = torch.arange(kv_len, device=q.device)[None, :] <= pos[:, None]
        if self.attn == "eager":
            k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)
            w = torch.matmul(q, k.transpose(2, 3)) * self.s.scale
            if mask is not None:
                w = w.masked_fill(~mask, torch.finfo(w.dtype).min)
            w = F.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
            o = torch.matmul(w, v)
        else:
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.s.scale, enable_gqa=n_rep > 1)
        return o.transpose(1, 2).reshape(B, T, -1)

    def expand_kv(self, L, kv, k_pe):
        """Latent [B, 1, S, r] and rotated k_pe [B, 1, S, dr] to per-head
        k [B, H, S, dn+dr] and v [B, H, S, dv] (transformers' expand_kv)."""
        s = self.s
        B, _, S, _ = kv.shape
        kvb = F.linear(kv, L.kv_b).view(B, S, -1, s.nope + s.v_dim).transpose(1, 2)
        k_nope, v = torch.split(kvb, [s.nope, s.v_dim], dim=-1)
        k = kvb.new_empty(*kvb.shape[:-1], s.nope + s.rope_dim)
        k[..., :s.nope].copy_(k_nope)
        k[..., s.nope:].copy_(k_pe.expand(-1, k_nope.shape[1], -1, -1))
        return k, v

    def attn_mla(self, x, L, cache, pos, kv_len, cos, sin):
        s = self.s
        B, T, _ = x.shape
        if s.q_lora:
            q = F.linear(rms_norm(F.linear(x, L.q_a, L.q_a_b), L.q_a_ln, LATENT_NORM_EPS), L.q_b)
        else:
            q = F.linear(x, L.q)
        q = q.view(B, T, -1, s.nope + s.rope_dim).transpose(1, 2)
        q_nope, q_pe = torch.split(q, [s.nope, s.rope_dim], dim=-1)
        ckv = F.linear(x, L.kv_a, L.kv_a_b)
        kv, k_pe = torch.split(ckv, [s.kv_lora, s.rope_dim], dim=-1)
        kv = rms_norm(kv, L.kv_a_ln, LATENT_NORM_EPS).view(B, 1, T, s.kv_lora)
        k_pe = k_pe.reshape(B, 1, T, s.rope_dim)
        q_pe, k_pe = self.rope(q_pe, cos, sin), self.rope(k_pe, cos, sin)
        query = torch.cat((q_nope, q_pe), dim=-1)
        if self.mla_cache == "compressed":
            cache[0].index_copy_(2, pos, kv)
            cache[1].index_copy_(2, pos, k_pe)
            k, v = self.expand_kv(L, cache[0][:, :, :kv_len], cache[1][:, :, :kv_len])
        else:
            k_new, v_new = self.expand_kv(L, kv, k_pe)
            cache[0].index_copy_(2, pos, k_new)
            cache[1].index_copy_(2, pos, v_new)
            k, v = cache[0][:, :, :kv_len], cache[1][:, :, :kv_len]
        return F.linear(self.attend(query, k, v, pos, kv_len, 1), L.o, L.o_b)

    def attn_gqa(self, x, L, cache, pos, kv_len, cos, sin):
        s = self.s
        B, T, _ = x.shape
        shape = (B, T, -1, s.head_dim)
        q = F.linear(x, L.q, L.q_b).view(shape)
        k = F.linear(x, L.k, L.k_b).view(shape)
        v = F.linear(x, L.v, L.v_b).view(shape).transpose(1, 2)
        if s.qk_norm:
            q, k = rms_norm(q, L.q_norm, s.eps), rms_norm(k, L.k_norm, s.eps)
        q, k = self.rope(q.transpose(1, 2), cos, sin), self.rope(k.transpose(1, 2), cos, sin)
        cache[0].index_copy_(2, pos, k)
        cache[1].index_copy_(2, pos, v)
        o = self.attend(q, cache[0][:, :, :kv_len], cache[1][:, :, :kv_len], pos, kv_len, s.heads // s.kv_heads)
        return F.linear(o, L.o, L.o_b)

    # -- MoE --

    def route(self, x, L):
        """(weights [N, K], ids [N, K]) as the family's transformers router."""
        s = self.s
        if s.router == "softmax_qwen":
            logits = F.linear(x, L.router)
            probs = F.softmax(logits, dtype=torch.float, dim=-1)
            w, ids = torch.topk(probs, s.top_k, dim=-1)
            if s.norm_topk:
                w = w / w.sum(dim=-1, keepdim=True)
            return w.to(logits.dtype), ids
        E, G = s.n_experts, s.n_group
        logits = F.linear(x.float(), L.router)
        if s.router == "softmax_v2":
            scores = logits.softmax(dim=-1, dtype=torch.float32)
            if G > 1:
                gs = scores.view(-1, G, E // G).max(dim=-1).values
                keep = torch.zeros_like(gs).scatter_(1, torch.topk(gs, k=s.topk_group, dim=-1, sorted=False)[1], 1)
                keep = keep.unsqueeze(-1).expand(-1, G, E // G).reshape(-1, E)
                scores = scores.masked_fill(~keep.bool(), 0.0)
            w, ids = torch.topk(scores, k=s.top_k, dim=-1, sorted=False)
            return w * s.scaling, ids
        scores = logits.sigmoid()
        choice = scores + L.router_bias
        gs = choice.view(-1, G, E // G).topk(2, dim=-1)[0].sum(dim=-1)
        keep = torch.zeros_like(gs).scatter_(1, torch.topk(gs, k=s.topk_group, dim=-1, sorted=False)[1], 1)
        keep = keep.unsqueeze(-1).expand(-1, G, E // G).reshape(-1, E)
        choice = choice.masked_fill(~keep.bool(), float("-inf"))
        ids = torch.topk(choice, k=s.top_k, dim=-1, sorted=False)[1]
        w = scores.gather(1, ids)
        if s.norm_topk:
            w = w / (w.sum(dim=-1, keepdim=True) + 1e-20)
        return w * s.scaling, ids

    def experts_loop(self, x, ids, w, L):
        """transformers' eager experts: one pass per hit expert (host syncs)."""
        out = torch.zeros_like(x)
        mask = F.one_hot(ids, num_classes=self.s.n_experts).permute(2, 1, 0)
        hit = torch.greater(mask.sum(dim=(-1, -2)), 0).nonzero()
        for e in hit:
            e = e[0]
            kpos, tok = torch.where(mask[e])
            gate, up = F.linear(x[tok], L.gate_up[e]).chunk(2, dim=-1)
            h = F.linear(F.silu(gate) * up, L.down[e])
            h = h * w[tok, kpos, None]
            out.index_add_(0, tok, h.to(out.dtype))
        return out

    def _bmm_grouped(self, a, wt, eid, slot, n_tokens, static):
        """The grouped GEMM as a padded bmm: rows a [S, in] of expert eid at
        slot; when static (capturable) every expert gets a block of n_tokens
        rows (an expert is picked at most once per token), else only the hit
        experts, padded to the largest (host sync)."""
        if static:
            P = a.new_zeros(wt.shape[0], n_tokens, a.shape[1])
            P[eid, slot] = a
            return torch.bmm(P, wt.transpose(1, 2))[eid, slot]
        hit, local = torch.unique(eid, return_inverse=True)
        cap = int(slot.max()) + 1
        P = a.new_zeros(hit.numel(), cap, a.shape[1])
        P[local, slot] = a
        return torch.bmm(P, wt.index_select(0, hit).transpose(1, 2))[local, slot]

    def experts_grouped(self, x, ids, w, L, static):
        """transformers' grouped_mm experts: sort (token, k) pairs by expert,
        one grouped GEMM for gate_up and one for down, weight, restore order,
        sum over k."""
        N, K = ids.shape
        E = self.s.n_experts
        eid, perm = torch.sort(ids.reshape(-1))
        xg = x[perm // K]
        wg = w.reshape(-1)[perm]
        hist = eid.float() if x.device.type == "cpu" else eid.int()
        counts = torch.histc(hist, bins=E, min=0, max=E - 1)
        offs = torch.cumsum(counts, dim=0, dtype=torch.int32)
        if self.grouped_impl == "grouped_mm":
            h = self._gmm(xg, L.gate_up.transpose(-2, -1), offs=offs)
            gate, up = h.chunk(2, dim=-1)
            h = self._gmm(F.silu(gate) * up, L.down.transpose(-2, -1), offs=offs)
        else:
            starts = (offs - counts.to(torch.int32)).long()
            slot = torch.arange(eid.numel(), device=x.device) - starts[eid]
            h = self._bmm_grouped(xg, L.gate_up, eid, slot, N, static)
            gate, up = h.chunk(2, dim=-1)
            h = self._bmm_grouped(F.silu(gate) * up, L.down, eid, slot, N, static)
        h = h * wg.unsqueeze(-1)
        inv = torch.empty_like(perm)
        inv[perm] = torch.arange(perm.numel(), device=x.device)
        return h[inv].view(N, K, -1).sum(dim=1).to(x.dtype)

    def ffn(self, x, L, moe, static):
        if L.mlp is not None:
            return mlp(x, L.mlp)
        B, T, Hd = x.shape
        x2 = x.reshape(-1, Hd)
        if self.s.model_type == "qwen2_moe":
            shared = mlp(x2, L.shared)
        w, ids = self.route(x2, L)
        if moe == "loop":
            routed = self.experts_loop(x2, ids, w, L)
        else:
            routed = self.experts_grouped(x2, ids, w, L, static)
        if self.s.model_type == "qwen2_moe":
            routed = routed + torch.sigmoid(F.linear(x2, L.shared_gate)) * shared
        routed = routed.view(B, T, Hd)
        if self.s.mla and L.shared is not None:
            routed = routed + mlp(x, L.shared)
        return routed

    # -- the whole model --

    def forward(self, tokens, pos, kv_len, moe="grouped", static=False):
        """Logits [B, T, vocab] for tokens [B, T] at positions pos [T] (shared
        by the batch), writing their k/v into the cache and attending over
        its first kv_len positions. moe: "loop" or "grouped"; static: no host
        syncs (for CUDA graph capture)."""
        s = self.s
        h = F.embedding(tokens, self.embed)
        cos, sin = self.cos[pos], self.sin[pos]
        attn = self.attn_mla if s.mla else self.attn_gqa
        for L, cache in zip(self.layers, self.cache):
            r = h
            h = r + attn(rms_norm(h, L.ln1, s.eps), L, cache, pos, kv_len, cos, sin)
            r = h
            h = r + self.ffn(rms_norm(h, L.ln2, s.eps), L, moe, static)
        return F.linear(rms_norm(h, self.norm, s.eps), self.lm_head)


# ---- check mode -----------------------------------------------------------------


def check_one(model, prompt, steps, moe, mla_cache, static):
    """Prefill then greedy steps; (logit rows [P + steps, V], greedy ids)."""
    dev = model.device
    P = len(prompt)
    model.alloc_cache(1, P + steps + 1, mla_cache)
    model.rope_tables(P + steps + 1)
    out = model.forward(torch.tensor([prompt], device=dev), torch.arange(P, device=dev), P, moe, static)
    rows = [out[0].float().cpu()]
    nxt = int(out[0, -1].argmax())
    greedy = [nxt]
    for i in range(steps):
        out = model.forward(torch.tensor([[nxt]], device=dev), torch.tensor([P + i], device=dev), P + i + 1, moe,
                            static)
        rows.append(out[0].float().cpu())
        nxt = int(out[0, -1].argmax())
        greedy.append(nxt)
    return torch.cat(rows, 0), greedy


def run_check(dirs, device):
    if torch.device(device).type == "cpu":
        torch.set_num_threads(1)  # tiny models: threads only add overhead
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    failed = 0
    for d in dirs:
        spec = read_spec(d)
        try:
            with open(os.path.join(d, "prompt.json")) as f:
                prompt = json.load(f)["prompt_ids"]
            with open(os.path.join(d, "golden.json")) as f:
                golden = json.load(f)
            ref = torch.frombuffer(bytearray(open(os.path.join(d, "logits.bin"), "rb").read()), dtype=torch.float32)
        except (OSError, ValueError, KeyError) as e:
            raise RefError(f"{d}: {e}")
        rows, vocab, steps = int(golden["rows"]), int(golden["vocab_size"]), int(golden["decode_steps"])
        if ref.numel() != rows * vocab or rows != len(prompt) + steps or vocab != spec.vocab:
            raise RefError(f"{d}: logits.bin holds {ref.numel()} floats, golden.json says {rows} rows of {vocab}")
        ref = ref.view(rows, vocab)
        want = golden["greedy_ids"]
        with torch.inference_mode():
            model = RefModel(spec, Checkpoint(d), torch.float32, device)
            forms = (("loop", None, False), ("grouped", "grouped_mm", False), ("grouped", "bmm", False),
                     ("grouped", "bmm", True))
            for moe, impl, static in forms:
                if impl:
                    model.grouped_impl = impl
                for mla_cache in (("expanded", "compressed") if spec.mla else ("expanded",)):
                    for attn in ("eager", "sdpa"):
                        model.attn = attn
                        got, greedy = check_one(model, prompt, steps, moe, mla_cache, static)
                        err = ((got - ref).abs().amax(dim=1) / ref.abs().amax(dim=1)).max().item()
                        ok = err <= CHECK_TOL and greedy == want
                        failed += not ok
                        what = f"moe={moe}" + (f"({impl}{', static' if static else ''})" if impl else "")
                        what += f" mla_cache={mla_cache}" if spec.mla else ""
                        gtxt = "matches" if greedy == want else f"{greedy} != {want}"
                        print(f"{'PASS' if ok else 'FAIL'} {d} {what} attn={attn}: max row error {err:.2e} "
                              f"of the row's max |logit| (limit {CHECK_TOL:g}), greedy {gtxt}", flush=True)
    return 1 if failed else 0


# ---- benchmark ------------------------------------------------------------------


def time_steps(fn, warmup, steps):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(steps)]
    for a, b in ev:
        a.record()
        fn()
        b.record()
    torch.cuda.synchronize()
    return [a.elapsed_time(b) for a, b in ev]


def choose_mla_cache(model, batch, seq, want):
    if not model.s.mla or want != "auto":
        return want if model.s.mla else "gqa"
    free = torch.cuda.mem_get_info(model.device)[0]
    need = model.cache_bytes(batch, seq, "expanded")
    # Leave room for one layer's transient expansion and the step's activations.
    return "expanded" if need + 4 * 2**30 < free * 0.9 else "compressed"


def run_bench(a):
    if not torch.cuda.is_available():
        raise RefError("the benchmark needs a CUDA device")
    dev = torch.device("cuda")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[a.dtype]
    spec = read_spec(a.model, a.layers)
    modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    for m in modes:
        if m not in ALL_MODES:
            raise RefError(f"unknown mode {m!r} (one of {', '.join(ALL_MODES)})")
    try:
        batches = [int(b) for b in a.batch_sizes.split(",") if b.strip()]
    except ValueError:
        raise RefError(f"--batch-sizes {a.batch_sizes!r} is not a list of integers")
    if not batches or min(batches) < 1:
        raise RefError("--batch-sizes needs positive integers")
    src = RandomWeights(a.seed, dev) if a.random_weights else Checkpoint(a.model)
    name = torch.cuda.get_device_name(dev)
    results = []
    with torch.inference_mode():
        model = RefModel(spec, src, dtype, dev, attn=a.attn, grouped_impl=a.grouped_impl)
        model.compile_mode = a.compile_mode
        del src
        wbytes = sum(t.numel() * t.element_size() for t in _tensors(model))
        print(f"torch_ref: {spec.model_type}, {spec.n_layers} layers, {wbytes / 1e9:.2f} GB of weights on {name}; "
              f"grouped GEMM: {model.grouped_name()}; attention: {a.attn}", file=sys.stderr)
        seq = a.context + 1
        model.rope_tables(seq)
        gen = torch.Generator(device=dev)
        gen.manual_seed(a.seed + 1)
        base = {"dtype": a.dtype, "attn": a.attn, "weights_gb": round(wbytes / 1e9, 3)}
        for B in batches:
            form = choose_mla_cache(model, B, seq, a.mla_cache)
            info = dict(base, kv_cache=form)
            torch.cuda.reset_peak_memory_stats(dev)
            try:
                model.alloc_cache(B, seq, form if spec.mla else "expanded", gen)
            except torch.OutOfMemoryError:
                model.cache = None
                torch.cuda.empty_cache()
                for m in modes:
                    results.append(_emit(a, m, B, None, name, spec, dict(info, error="out of memory (KV cache)")))
                continue
            tokens = torch.randint(0, spec.vocab, (B, 1), device=dev, generator=gen)
            pos = torch.tensor([a.context], device=dev)
            first = None  # logits of the first mode: every step writes the same
            for m in modes:  # k/v at the same position, so all modes must agree
                extra = dict(info, grouped_impl=model.grouped_name() if m != "eager-loop" else None)
                try:
                    times, out = bench_mode(model, m, tokens, pos, seq, a.warmup, a.steps)
                    out = out.float()
                    extra["finite"] = bool(torch.isfinite(out).all())
                    if first is None:
                        first = (m, out)
                    else:
                        extra["rel_diff_vs_" + first[0]] = round(
                            ((out - first[1]).abs().max() / first[1].abs().max()).item(), 5)
                    extra["peak_gb"] = round(torch.cuda.max_memory_allocated(dev) / 1e9, 2)
                    results.append(_emit(a, m, B, times, name, spec, extra))
                except torch.OutOfMemoryError:
                    results.append(_emit(a, m, B, None, name, spec, dict(extra, error="out of memory")))
                torch.cuda.empty_cache()
            model.cache = first = None
            torch.cuda.empty_cache()
    _table(results, modes, batches, a.context, name)
    return 0


def _tensors(model):
    seen = set()
    for v in [model.embed, model.norm, model.lm_head] + [x for L in model.layers for x in _walk(L)]:
        if isinstance(v, torch.Tensor) and id(v) not in seen:
            seen.add(id(v))
            yield v


def _walk(ns):
    for v in vars(ns).values():
        if isinstance(v, SimpleNamespace):
            yield from _walk(v)
        else:
            yield v


def bench_mode(model, mode, tokens, pos, seq, warmup, steps):
    """Times of each step (ms) and the last step's logits."""
    if mode in ("eager-loop", "eager-grouped"):
        moe = "loop" if mode == "eager-loop" else "grouped"
        last = []

        def step():
            last[:] = [model.forward(tokens, pos, seq, moe)]

        return time_steps(step, warmup, steps), last[0]
    fwd = model.forward
    if mode == "compile-graph":
        # torch.compile's fused kernels (its own CUDA graphs off: the step is
        # captured below like graph-grouped's), compiled for this batch
        fwd = torch.compile(model.forward, mode=model.compile_mode, fullgraph=False, dynamic=False)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fwd(tokens, pos, seq, "grouped", static=True)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fwd(tokens, pos, seq, "grouped", static=True)
    try:
        return time_steps(graph.replay, warmup, steps), out.clone()
    finally:
        del graph


def _emit(a, mode, batch, times, device, spec, extra):
    r = {"impl": "torch", "mode": mode, "batch": batch, "context": a.context,
         "ms": round(statistics.median(times), 4) if times else None, "device": device,
         "model_type": spec.model_type, "layers": spec.n_layers, "steps": len(times) if times else 0}
    if times:
        q = statistics.quantiles(times, n=10)
        r["ms_p10"], r["ms_p90"] = round(q[0], 4), round(q[-1], 4)
    r.update(extra)
    print(json.dumps(r), flush=True)
    return r


def _table(results, modes, batches, context, device):
    w = max(len(m) for m in modes) + 2
    lines = [f"ms per decode step, context {context}, {device}", "mode".ljust(w) + "".join(f"B={b}".rjust(10) for b in batches)]
    for m in modes:
        cells = []
        for b in batches:
            r = next((r for r in results if r["mode"] == m and r["batch"] == b), None)
            cells.append(("%.2f" % r["ms"] if r and r["ms"] is not None else "-").rjust(10))
        lines.append(m.ljust(w) + "".join(cells))
    print("\n".join(lines), file=sys.stderr)


# ---- command line -----------------------------------------------------------------


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", nargs="?", help="model folder (or config.json with --random-weights)")
    ap.add_argument("--check", nargs="+", metavar="DIR", help="check tiny models against their goldens")
    ap.add_argument("--device", default="cpu", help="device of --check (default cpu)")
    ap.add_argument("--batch-sizes", default="1,8,32,64")
    ap.add_argument("--context", type=int, default=1024, help="cached positions before the step (default 1024)")
    ap.add_argument("--modes", default=",".join(ALL_MODES))
    ap.add_argument("--steps", type=int, default=100, help="timed steps per (mode, batch), >= 10 (default 100)")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp16", "fp32"))
    ap.add_argument("--attn", default="sdpa", choices=("sdpa", "eager"),
                    help="attention kernel: F.scaled_dot_product_attention (transformers' default) or eager matmuls")
    ap.add_argument("--mla-cache", default="auto", choices=("auto", "expanded", "compressed"),
                    help="MLA KV cache: per-head k/v, or latent + k_pe expanded every step as transformers "
                         "5.17 does; auto: expanded when it fits in device memory")
    ap.add_argument("--grouped-impl", default="auto", choices=("auto", "grouped_mm", "bmm"))
    ap.add_argument("--compile-mode", default="max-autotune-no-cudagraphs",
                    choices=("default", "max-autotune-no-cudagraphs"),
                    help="torch.compile mode of the compile-graph mode (default max-autotune-no-cudagraphs)")
    ap.add_argument("--random-weights", action="store_true", help="draw weights on the device (no safetensors)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--layers", type=int, help="run only the first N layers")
    a = ap.parse_args(argv)
    try:
        if a.check:
            return run_check(a.check, a.device)
        if not a.model:
            ap.error("give a MODEL folder, or --check DIR")
        if a.steps < 10 or a.warmup < 0 or a.context < 0:
            ap.error("--steps must be >= 10, --warmup and --context >= 0")
        return run_bench(a)
    except RefError as e:
        print(f"torch_ref: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
