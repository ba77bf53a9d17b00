/* kern_modules.h — small modules around the heavy kernel ops (attention,
 * mla_attention, moe_topk, moe_routed, moe_experts, DeepSeek-V3.2's
 * dsa_topk feeding a sparse mla_attention, the MLA prologue ops feeding an
 * mla_attention whose cache they write, GQA's attn_prologue feeding an
 * attention whose cache it writes, and linears of fp8 weights, which
 * run generated kernels only) for the codegen tests:
 * every operand comes from an embedding of the tokens (table row t is
 * whatever the test writes there), so the interpreter can run them and the
 * generated kernels see the same values. Shared by test_codegen_kernels.c
 * (codegen and NVRTC) and gpu_kernels.c (GPU against the interpreter). */
#ifndef MOEC_TEST_KERN_MODULES_H
#define MOEC_TEST_KERN_MODULES_H

#include <stdio.h>
#include <string.h>

#include "codegen/cg.h"
#include "ir/ir.h"

enum { KM_NONE = 0, KM_GQA, KM_MLA, KM_MLA_PRO, KM_GQA_PRO };
enum { KM_MOE_NONE = 0, KM_ROUTED, KM_ROUTED_SPLIT, KM_EXPERTS, KM_EXPERTS_SPLIT };

typedef struct km_spec {
    const char *name;
    int vocab;                 /* rows of every table: the most distinct tokens */
    int attn;                  /* KM_NONE, KM_GQA, KM_MLA, KM_MLA_PRO, KM_GQA_PRO */
    int H, HKV, DK, DV;        /* GQA; KM_GQA_PRO: an attn_prologue of a row [H | HKV | HKV
                                  heads of DK | XN more] feeds the attention (DV = DK) */
    int qk_norm;               /* KM_GQA_PRO: with q_norm and k_norm (Qwen3) */
    int R, DR;                 /* MLA (with H) */
    int DN, QR, XN;            /* KM_MLA_PRO: q_nope's head dim, the q latent (0: no q LoRA,
                                  one mla_prologue; else mla_prologue_kv and mla_prologue_q),
                                  columns past the sections in their inputs */
    const char *rope;          /* KM_MLA_PRO, KM_GQA_PRO: the rope attributes (NULL:
                                  DeepSeek-V3's YaRN; Qwen3's neox, theta 1e6) */
    int window;
    double attn_scale;
    int E, K;                  /* moe_topk (E > 0) */
    int router;                /* with moe: the logits are linear(x, rw), rw bf16 [E, HID] (the
                                  router, which the top-k kernel may compute itself), else a
                                  table */
    int sigmoid, NG, TG, top2, norm, bias;
    double scaling;
    int moe;                   /* KM_MOE_* (needs E, K) */
    int HID, I;
    const char *wdt;           /* expert weights' IR dtype: "bf16", "f32", "f16", "f8e4m3" */
    double moe_scale;
    int TOPK, HI, DI;          /* with KM_MLA and TOPK > 0: dsa_topk over HI heads of DI
                                  channels selects TOPK positions for the mla_attention */
    double dsa_scale, dsa_wscale;
    int IRD, IPRE, IQPRE;      /* IRD > 0: the fused indexer (pass fuse_dsa_indexer): the key
                                  from dsa_prologue_k of a row [IPRE | key DI | weights HI],
                                  rotating IRD channels, and dsa_topk reading q at column IQPRE
                                  of a row [IQPRE | HI * DI] and the weights in place, rotating
                                  q's first IRD channels (and, for the tests' reference,
                                  iq_rot_ref [T, HI, DI]: q rotated by a rope op) */
    const char *irope;         /* their rope attributes (NULL: V3.2's neox YaRN) */
    int LN, LK;                /* a linear ly [T, LN] = lx [T, LK] lw^T when LN > 0 */
    const char *ldt;           /* its weight's IR dtype */
    int BN, BK;                /* the block scales of f8e4m3 weights (0: 128) */
    int AN;                    /* an_s, an_n [T, AN] = add_rms_norm(an_a, an_b, an_w, an_c)
                                  {alpha = an_alpha} when AN > 0 (the residual add with the
                                  routed and shared experts' sum) */
    double an_alpha;
    int an_moe;                /* with KM_ROUTED(_SPLIT) and AN = HID: the routed experts'
                                  result is unsummed ([T, K, HID]) and the add_rms_norm's b
                                  (fuse_moe_sum), an_b unused */
    int lact;                  /* the linear is act silu_mul: lx [T, 2 LK] */
    int AH, ADN, ADV, AR;      /* ab_qc [T, AH, AR] = mla_qabsorb(ab_qn, ab_kvb) and ab_o [T, AH,
                                  ADV] = mla_vabsorb(ab_qc, ab_kvb) when AH > 0 */
} km_spec;

/* ", block_scale[BN, BK] = "<name>_s"" for an f8e4m3 weight, else "". */
static inline const char *km_scale(char *buf, size_t cap, const km_spec *s, const char *dt,
                                   const char *name)
{
    if (strcmp(dt, "f8e4m3")) {
        buf[0] = '\0';
        return buf;
    }
    snprintf(buf, cap, ", block_scale[%d, %d] = \"%s_s\"", s->BN ? s->BN : 128,
             s->BK ? s->BK : 128, name);
    return buf;
}

/* A float attribute as IR text: always with a '.' or an exponent. */
static inline const char *km_float(char *buf, double v)
{
    snprintf(buf, 40, "%.17g", v);
    if (!strpbrk(buf, ".eEn"))
        strcat(buf, ".0");
    return buf;
}

/* `%name : f32[T, n] = embedding(%tokens, %tab_name)` with its table. */
static inline void km_table(moec_buf *w, moec_buf *o, const km_spec *s, const char *name, int n,
                            const char *dt)
{
    moec_buf_printf(w, "  weight %%tab_%s : %s[%d, %d] = \"tab_%s\"\n", name, dt, s->vocab, n, name);
    moec_buf_printf(o, "  %%%s : f32[T, %d] = embedding(%%tokens, %%tab_%s)\n", name, n, name);
}

/* The module text of s (malloc'd, NULL when out of memory). Values: q, k, v
 * or q_c, q_pe, kv_c, k_pe and o; logits, ids, w; x, y. Output: out
 * [T, 40], an embedding, for the argmax. */
static inline char *km_text(const km_spec *s)
{
    moec_buf w = {0}, o = {0}, all = {0};
    char f1[40], f2[40];
    km_table(&w, &o, s, "out", 40, "f32");
    if (s->attn == KM_GQA) {
        km_table(&w, &o, s, "q_flat", s->H * s->DK, "bf16");
        km_table(&w, &o, s, "k_flat", s->HKV * s->DK, "bf16");
        km_table(&w, &o, s, "v_flat", s->HKV * s->DV, "bf16");
        moec_buf_printf(&o, "  %%q : f32[T, %d, %d] = reshape(%%q_flat)\n", s->H, s->DK);
        moec_buf_printf(&o, "  %%k : f32[T, %d, %d] = reshape(%%k_flat)\n", s->HKV, s->DK);
        moec_buf_printf(&o, "  %%v : f32[T, %d, %d] = reshape(%%v_flat)\n", s->HKV, s->DV);
        moec_buf_printf(&o,
                      "  %%o : f32[T, %d, %d] = attention(%%q, %%k, %%v, %%positions) {scale = %s, "
                      "window = %d}\n",
                      s->H, s->DV, km_float(f1, s->attn_scale), s->window);
    } else if (s->attn == KM_GQA_PRO) {
        const char *rope = s->rope ? s->rope : "style = \"neox\", theta = 1e+06";
        int D = s->DK;
        km_table(&w, &o, s, "qkv", (s->H + 2 * s->HKV) * D + s->XN, "bf16");
        if (s->qk_norm) {
            moec_buf_printf(&w, "  weight %%q_norm : bf16[%d] = \"q_norm\"\n", D);
            moec_buf_printf(&w, "  weight %%k_norm : bf16[%d] = \"k_norm\"\n", D);
        }
        moec_buf_printf(&o,
                      "  %%q : f32[T, %d, %d], %%k : f32[T, %d, %d], %%v : f32[T, %d, %d] = "
                      "attn_prologue(%%qkv, %%positions%s) {heads = %d, kv_heads = %d, "
                      "head_dim = %d, %s%s}\n",
                      s->H, D, s->HKV, D, s->HKV, D,
                      s->qk_norm ? ", %q_norm, %k_norm" : "", s->H, s->HKV, D,
                      s->qk_norm ? "eps = 1e-06, " : "", rope);
        moec_buf_printf(&o,
                      "  %%o : f32[T, %d, %d] = attention(%%q, %%k, %%v, %%positions) {scale = %s, "
                      "window = %d}\n",
                      s->H, D, km_float(f1, s->attn_scale), s->window);
    } else if (s->attn == KM_MLA_PRO) {
        const char *rope = s->rope ? s->rope
                                   : "style = \"interleave\", theta = 1e+04, scaling = \"yarn\", "
                                     "factor = 40.0, yarn_low = 10.0, yarn_high = 23.0, "
                                     "attn_factor = 1.0";
        int qw = s->H * (s->DN + s->DR);
        km_table(&w, &o, s, "qc_flat", s->H * s->R, "bf16");
        moec_buf_printf(&o, "  %%q_c : f32[T, %d, %d] = reshape(%%qc_flat)\n", s->H, s->R);
        moec_buf_printf(&w, "  weight %%kv_norm : bf16[%d] = \"kv_norm\"\n", s->R);
        if (s->QR > 0) {
            km_table(&w, &o, s, "qkv", s->QR + s->R + s->DR + s->XN, "bf16");
            km_table(&w, &o, s, "qb", qw + s->XN, "bf16");
            moec_buf_printf(&w, "  weight %%q_norm : bf16[%d] = \"q_norm\"\n", s->QR);
            moec_buf_printf(&o,
                          "  %%q_a : f32[T, %d], %%kv_c : f32[T, %d], %%k_pe : f32[T, 1, %d] = "
                          "mla_prologue_kv(%%qkv, %%positions, %%kv_norm, %%q_norm) "
                          "{qk_rope_head_dim = %d, eps = 1e-06, %s}\n",
                          s->QR, s->R, s->DR, s->DR, rope);
            moec_buf_printf(&o,
                          "  %%q_nope : f32[T, %d, %d], %%q_pe : f32[T, %d, %d] = "
                          "mla_prologue_q(%%qb, %%positions) {heads = %d, qk_nope_head_dim = %d, "
                          "qk_rope_head_dim = %d, %s}\n",
                          s->H, s->DN, s->H, s->DR, s->H, s->DN, s->DR, rope);
        } else {
            km_table(&w, &o, s, "qkv", qw + s->R + s->DR + s->XN, "bf16");
            moec_buf_printf(&o,
                          "  %%q_nope : f32[T, %d, %d], %%q_pe : f32[T, %d, %d], %%kv_c : f32[T, "
                          "%d], %%k_pe : f32[T, 1, %d] = mla_prologue(%%qkv, %%positions, "
                          "%%kv_norm) {heads = %d, qk_nope_head_dim = %d, qk_rope_head_dim = %d, "
                          "eps = 1e-06, %s}\n",
                          s->H, s->DN, s->H, s->DR, s->R, s->DR, s->H, s->DN, s->DR, rope);
        }
        moec_buf_printf(&o,
                      "  %%o : f32[T, %d, %d] = mla_attention(%%q_c, %%q_pe, %%kv_c, %%k_pe, "
                      "%%positions) {scale = %s}\n",
                      s->H, s->R, km_float(f1, s->attn_scale));
    } else if (s->attn == KM_MLA) {
        km_table(&w, &o, s, "qc_flat", s->H * s->R, "bf16");
        km_table(&w, &o, s, "qpe_flat", s->H * s->DR, "bf16");
        km_table(&w, &o, s, "kv_c", s->R, "bf16");
        km_table(&w, &o, s, "kpe_flat", s->DR, "bf16");
        moec_buf_printf(&o, "  %%q_c : f32[T, %d, %d] = reshape(%%qc_flat)\n", s->H, s->R);
        moec_buf_printf(&o, "  %%q_pe : f32[T, %d, %d] = reshape(%%qpe_flat)\n", s->H, s->DR);
        moec_buf_printf(&o, "  %%k_pe : f32[T, 1, %d] = reshape(%%kpe_flat)\n", s->DR);
        if (s->TOPK > 0 && s->IRD > 0) {
            const char *irope = s->irope ? s->irope
                                         : "style = \"neox\", theta = 1e+04, scaling = \"yarn\", "
                                           "factor = 40.0, yarn_low = 10.0, yarn_high = 23.0, "
                                           "attn_factor = 1.0";
            km_table(&w, &o, s, "ikx", s->IPRE + s->DI + s->HI, "bf16");
            km_table(&w, &o, s, "iqx", s->IQPRE + s->HI * s->DI, "bf16");
            moec_buf_printf(&w, "  weight %%ik_norm : bf16[%d] = \"ik_norm\"\n", s->DI);
            moec_buf_printf(&w, "  weight %%ik_bias : bf16[%d] = \"ik_bias\"\n", s->DI);
            moec_buf_printf(&o,
                          "  %%ik : f32[T, %d] = dsa_prologue_k(%%ikx, %%positions, %%ik_norm, "
                          "%%ik_bias) {col = %d, eps = 1e-06, %s, rotary_dim = %d}\n",
                          s->DI, s->IPRE, irope, s->IRD);
            /* q rotated by a rope op of its own: the tests' reference (no kernel runs it) */
            moec_buf_printf(&o,
                          "  %%iq_ref_flat : f32[T, %d] = slice(%%iqx) {axis = 1, start = %d, "
                          "size = %d}\n"
                          "  %%iq_ref : f32[T, %d, %d] = reshape(%%iq_ref_flat)\n"
                          "  %%iq_rot_ref : f32[T, %d, %d] = rope(%%iq_ref, %%positions) {%s, "
                          "rotary_dim = %d}\n",
                          s->HI * s->DI, s->IQPRE, s->HI * s->DI, s->HI, s->DI, s->HI, s->DI, irope,
                          s->IRD);
            moec_buf_printf(&o,
                          "  %%sel : i32[T, %d] = dsa_topk(%%iqx, %%ik, %%ikx, %%positions) {top_k = "
                          "%d, scale = %s, weight_scale = %s, heads = %d, q_col = %d, w_col = %d, "
                          "%s, rotary_dim = %d}\n",
                          s->TOPK, s->TOPK, km_float(f1, s->dsa_scale), km_float(f2, s->dsa_wscale),
                          s->HI, s->IQPRE, s->IPRE + s->DI, irope, s->IRD);
            moec_buf_printf(&o,
                          "  %%o : f32[T, %d, %d] = mla_attention(%%q_c, %%q_pe, %%kv_c, %%k_pe, "
                          "%%positions, %%sel) {scale = %s}\n",
                          s->H, s->R, km_float(f1, s->attn_scale));
        } else if (s->TOPK > 0) {
            km_table(&w, &o, s, "iq_flat", s->HI * s->DI, "bf16");
            km_table(&w, &o, s, "ik", s->DI, "bf16");
            km_table(&w, &o, s, "iw", s->HI, "bf16");
            moec_buf_printf(&o, "  %%iq : f32[T, %d, %d] = reshape(%%iq_flat)\n", s->HI, s->DI);
            moec_buf_printf(&o,
                          "  %%sel : i32[T, %d] = dsa_topk(%%iq, %%ik, %%iw, %%positions) {top_k = "
                          "%d, scale = %s, weight_scale = %s}\n",
                          s->TOPK, s->TOPK, km_float(f1, s->dsa_scale), km_float(f2, s->dsa_wscale));
            moec_buf_printf(&o,
                          "  %%o : f32[T, %d, %d] = mla_attention(%%q_c, %%q_pe, %%kv_c, %%k_pe, "
                          "%%positions, %%sel) {scale = %s}\n",
                          s->H, s->R, km_float(f1, s->attn_scale));
        } else {
            moec_buf_printf(&o,
                          "  %%o : f32[T, %d, %d] = mla_attention(%%q_c, %%q_pe, %%kv_c, %%k_pe, "
                          "%%positions) {scale = %s, window = %d}\n",
                          s->H, s->R, km_float(f1, s->attn_scale), s->window);
        }
    }
    /* the experts' input first: the moe_routed follows its moe_topk with
       nothing between them, as in a model (its align runs in the topk's
       kernel in small buckets) */
    if (s->moe != KM_MOE_NONE)
        km_table(&w, &o, s, "x", s->HID, "bf16");
    if (s->E > 0 && s->router && s->moe != KM_MOE_NONE) {
        moec_buf_printf(&w, "  weight %%rw : bf16[%d, %d] = \"rw\"\n", s->E, s->HID);
        moec_buf_printf(&o, "  %%logits : f32[T, %d] = linear(%%x, %%rw)\n", s->E);
    } else if (s->E > 0) {
        km_table(&w, &o, s, "logits", s->E, "f32");
    }
    if (s->E > 0) {
        if (s->bias)
            moec_buf_printf(&w, "  weight %%bias : f32[%d] = \"bias\"\n", s->E);
        moec_buf_printf(&o,
                      "  %%ids : i32[T, %d], %%w : f32[T, %d] = moe_topk(%%logits%s) {scoring = "
                      "\"%s\", top_k = %d, n_group = %d, topk_group = %d, group_score = \"%s\", "
                      "norm_topk_prob = %d, scaling = %s}\n",
                      s->K, s->K, s->bias ? ", %bias" : "", s->sigmoid ? "sigmoid" : "softmax",
                      s->K, s->NG, s->TG, s->top2 ? "top2_sum" : "max", s->norm,
                      km_float(f1, s->scaling));
    }
    char sc[96];
    if (s->moe != KM_MOE_NONE) {
        int split = s->moe == KM_ROUTED_SPLIT || s->moe == KM_EXPERTS_SPLIT;
        if (split) {
            moec_buf_printf(&w, "  weight %%gate : %s[%d, %d, %d] = \"gate\"%s\n", s->wdt, s->E,
                          s->I, s->HID, km_scale(sc, sizeof sc, s, s->wdt, "gate"));
            moec_buf_printf(&w, "  weight %%up : %s[%d, %d, %d] = \"up\"%s\n", s->wdt, s->E, s->I,
                          s->HID, km_scale(sc, sizeof sc, s, s->wdt, "up"));
        } else {
            moec_buf_printf(&w, "  weight %%gate_up : %s[%d, %d, %d] = \"gate_up\"%s\n", s->wdt,
                          s->E, 2 * s->I, s->HID, km_scale(sc, sizeof sc, s, s->wdt, "gate_up"));
        }
        moec_buf_printf(&w, "  weight %%down : %s[%d, %d, %d] = \"down\"%s\n", s->wdt, s->E, s->HID,
                      s->I, km_scale(sc, sizeof sc, s, s->wdt, "down"));
        const char *ws = split ? "%gate, %up, %down" : "%gate_up, %down";
        if ((s->moe == KM_ROUTED || s->moe == KM_ROUTED_SPLIT) && s->an_moe)
            moec_buf_printf(&o,
                          "  %%y : f32[T, %d, %d] = moe_routed(%%x, %%ids, %%w, %s) {scale = %s, "
                          "unsummed = 1}\n",
                          s->K, s->HID, ws, km_float(f2, s->moe_scale));
        else if (s->moe == KM_ROUTED || s->moe == KM_ROUTED_SPLIT)
            moec_buf_printf(&o, "  %%y : f32[T, %d] = moe_routed(%%x, %%ids, %%w, %s) {scale = %s}\n",
                          s->HID, ws, km_float(f2, s->moe_scale));
        else
            moec_buf_printf(&o, "  %%y : f32[T, %d, %d] = moe_experts(%%x, %%ids, %s)\n", s->K,
                          s->HID, ws);
    }
    if (s->LN > 0) {
        km_table(&w, &o, s, "lx", s->lact ? 2 * s->LK : s->LK, "bf16");
        moec_buf_printf(&w, "  weight %%lw : %s[%d, %d] = \"lw\"%s\n", s->ldt, s->LN, s->LK,
                      km_scale(sc, sizeof sc, s, s->ldt, "lw"));
        moec_buf_printf(&o, "  %%ly : f32[T, %d] = linear(%%lx, %%lw)%s\n", s->LN,
                      s->lact ? " {act = \"silu_mul\"}" : "");
    }
    if (s->AN > 0) {
        km_table(&w, &o, s, "an_a", s->AN, "bf16");
        if (!s->an_moe)
            km_table(&w, &o, s, "an_b", s->AN, "bf16");
        km_table(&w, &o, s, "an_c", s->AN, "bf16");
        moec_buf_printf(&w, "  weight %%an_w : bf16[%d] = \"an_w\"\n", s->AN);
        moec_buf_printf(&o,
                      "  %%an_s : f32[T, %d], %%an_n : f32[T, %d] = add_rms_norm(%%an_a, %s, "
                      "%%an_w, %%an_c) {eps = 1e-06, alpha = %s}\n",
                      s->AN, s->AN, s->an_moe ? "%y" : "%an_b", km_float(f1, s->an_alpha));
    }
    if (s->AH > 0) {
        moec_buf_printf(&w, "  weight %%ab_kvb : bf16[%d, %d] = \"ab_kvb\"\n",
                        s->AH * (s->ADN + s->ADV), s->AR);
        km_table(&w, &o, s, "ab_qn_flat", s->AH * s->ADN, "bf16");
        moec_buf_printf(&o, "  %%ab_qn : f32[T, %d, %d] = reshape(%%ab_qn_flat)\n", s->AH, s->ADN);
        moec_buf_printf(&o,
                        "  %%ab_qc : f32[T, %d, %d] = mla_qabsorb(%%ab_qn, %%ab_kvb) "
                        "{qk_nope_head_dim = %d, v_head_dim = %d}\n"
                        "  %%ab_o : f32[T, %d, %d] = mla_vabsorb(%%ab_qc, %%ab_kvb) "
                        "{qk_nope_head_dim = %d, v_head_dim = %d}\n",
                        s->AH, s->AR, s->ADN, s->ADV, s->AH, s->ADV, s->ADN, s->ADV);
    }
    moec_buf_printf(&all,
                  "module %s {\n  meta vocab_size = 40\n  input %%tokens : i32[T]\n"
                  "  input %%positions : i32[T]\n%s%s  output %%out\n}\n",
                  s->name, w.data ? w.data : "", o.data ? o.data : "");
    int bad = w.oom || o.oom || all.oom;
    moec_buf_free(&w);
    moec_buf_free(&o);
    if (bad) {
        moec_buf_free(&all);
        return NULL;
    }
    return all.data;
}

/* Parses km_text(s); NULL (error printed) on failure. */
static inline ir_module *km_module(const km_spec *s)
{
    char *text = km_text(s);
    ir_module *m = NULL;
    if (!text || ir_module_parse(text, s->name, &m) != MOEC_OK) {
        fprintf(stderr, "%s: %s\n", s->name, text ? moec_last_error() : "out of memory");
        m = NULL;
    }
    free(text);
    return m;
}

/* Whether codegen/attention.c ... codegen/moe_experts.c or codegen/dsa_topk.c
 * emit op, or it is
 * a linear of an fp8 weight (codegen/linear.c: generated kernels in every
 * bucket, never a cuBLASLt step). */
static inline int km_is_heavy(const ir_op *op)
{
    return op->kind == IR_OP_ATTENTION || op->kind == IR_OP_MLA_ATTENTION ||
           op->kind == IR_OP_MOE_TOPK || op->kind == IR_OP_MOE_ROUTED ||
           op->kind == IR_OP_MOE_EXPERTS || op->kind == IR_OP_DSA_TOPK ||
           op->kind == IR_OP_MLA_PROLOGUE || op->kind == IR_OP_MLA_PROLOGUE_KV ||
           op->kind == IR_OP_MLA_PROLOGUE_Q || op->kind == IR_OP_DSA_PROLOGUE_K ||
           op->kind == IR_OP_ATTN_PROLOGUE ||
           (op->kind == IR_OP_LINEAR && op->in[1]->type.dtype == IR_DTYPE_F8E4M3);
}

/* Steps each heavy op emits (moe_routed: align, gate_up, down, sum, no sum
 * when unsummed, no align where its moe_topk's kernel aligned;
 * dsa_topk: key write, scores, select); the attention ops add a merge to
 * their 2 when they split the sequence, and an attention whose cache an
 * attn_prologue writes has no write of its own (1, then; km_steps_of says
 * so), nor an mla_attention whose cache an MLA prologue op writes, nor a
 * dsa_topk whose keys a dsa_prologue_k writes (2); an fp8 linear has one
 * or more (km_steps_of says 1: check its own count). */
static inline int km_steps_of(const ir_module *m, const ir_op *op)
{
    const ir_value *k = op->kind == IR_OP_DSA_TOPK ? op->in[1] : NULL;
    switch (op->kind) {
    case IR_OP_MLA_PROLOGUE:
    case IR_OP_MLA_PROLOGUE_KV:
    case IR_OP_MLA_PROLOGUE_Q:
    case IR_OP_DSA_PROLOGUE_K:
    case IR_OP_ATTN_PROLOGUE: return 1;
    case IR_OP_ATTENTION:
        return 2 - (op->in[1]->kind == IR_VALUE_OP && op->in[1]->def &&
                    cg_attn_prologue_cache(m, op->in[1]->def) == op);
    case IR_OP_MLA_ATTENTION: return 2;
    case IR_OP_MOE_TOPK: return 1;
    case IR_OP_LINEAR: return km_is_heavy(op) ? 1 : 0;
    case IR_OP_MOE_ROUTED: return ir_op_attr_int(op, "unsummed", 0) ? 3 : 4;
    case IR_OP_MOE_EXPERTS: return 3;
    case IR_OP_DSA_TOPK: /* key write, scores, select */
        return k->kind == IR_VALUE_OP && k->def && cg_dsa_prologue_cache(m, k->def) == op ? 2 : 3;
    default: return 0;
    }
}

#endif
