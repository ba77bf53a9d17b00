/* attn_emu_gen.c — writes the GQA attention kernels over the paged cache
 * (codegen/attention.c: the split attention kernel and its merge kernel)
 * of a set of cases as C++ for the CPU emulator (tests/cuda_emu.h,
 * tests/attn_emu.cc, tests/test_attn_emu.sh): the prologue's moec_ldw,
 * ldv, stv, warp_sum, warp_max and moec_attn_merge as the generator emits
 * them, each case's kernels in a namespace of their own with a function
 * that launches them, and a table of the cases. Cases: one to 16 tokens,
 * 1, 2, 4 and 8 lanes a position (MOEC_ATTN_LPP) and the kernel's choice
 * at run time, head dims that are not
 * multiples of the lanes' 16-byte chunks, a window, pages of 16 and 64
 * rows; splits merged by the merge kernel (MOEC_ATTN_MERGE=0) or by the
 * attention kernel's last block (=2), or of those only the splits that may
 * hold positions (=3); the tensor cores' form (MOEC_ATTN_TC=1, tiles of 16
 * positions). Then the fused prologue's cases
 * (PRO_CASES): the one kernel and the two it replaces, for the harness to
 * compare. Then the MLA attention's tensor-core kernel
 * (codegen/mla_attention.c) at tiny shapes (MLA_CASES).
 * usage: attn_emu_gen OUT.inc */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/cg.h"
#include "emu_gen.h"
#include "kern_modules.h"

typedef struct gen_case {
    int H, HKV, DK, DV, T, lpp, window, bs;
    const char *merge;  /* MOEC_ATTN_MERGE: "0" a merge kernel, "2" the last block */
    const char *target; /* MOEC_ATTN_TARGET_BLOCKS (NULL: the default's 64 splits at
                           one token), fewer blocks for the emulator's threads */
    int tc;             /* MOEC_ATTN_TC: 1 the tensor cores' form (lpp 1) */
} gen_case;

static const gen_case CASES[] = {
    {8, 2, 64, 64, 1, 1, 0, 16, "0", NULL, 0},  {8, 2, 64, 64, 1, 4, 0, 16, "0", "32", 0},
    {8, 2, 64, 64, 1, 8, 0, 64, "0", "32", 0},  {8, 2, 64, 64, 3, 2, 37, 16, "0", "32", 0},
    {6, 2, 24, 40, 2, 8, 0, 16, "0", "32", 0},  {6, 2, 24, 40, 2, 4, 5, 16, "2", "32", 0},
    {4, 1, 3, 5, 2, 4, 0, 16, "0", "32", 0},    {8, 2, 64, 64, 16, 4, 0, 16, "0", "64", 0},
    {8, 2, 64, 64, 16, 1, 0, 16, "2", "64", 0}, {8, 2, 64, 64, 1, 4, 0, 16, "2", NULL, 0},
    /* lanes chosen at run time: 4 at one token (64 splits), 2 and 4 at
       three (6 splits: 300 positions against 192 and 384), 1, 2 and 4 at
       16 (2 splits: 64 and 128), with a window, both merges */
    {8, 2, 64, 64, 1, 0, 0, 16, "0", NULL, 0},  {8, 2, 64, 64, 3, 0, 0, 16, "0", "32", 0},
    {8, 2, 64, 64, 16, 0, 0, 16, "0", "64", 0}, {6, 2, 24, 40, 16, 0, 100, 64, "2", "64", 0},
    /* the last block merging only the splits that may hold positions
       (MOEC_ATTN_MERGE=3): one token over 16 splits (3 hold positions
       with 1 lane, 10 with 4), tokens of their own split counts, vectors
       of 4 and of 1 channel */
    {8, 2, 64, 64, 1, 1, 0, 16, "3", "32", 0},  {8, 2, 64, 64, 1, 4, 0, 16, "3", "32", 0},
    {8, 2, 64, 64, 3, 0, 0, 16, "3", "32", 0},  {6, 2, 24, 40, 2, 4, 5, 16, "3", "32", 0},
    {4, 1, 3, 5, 2, 4, 0, 16, "3", "32", 0},
    /* the tensor cores' form (MOEC_ATTN_TC=1): one token over 64 splits
       (of 64 positions: a tile of 16 a warp), three with a window, 16
       tokens merged by the last block, 8 query heads of 16 a kv head (two
       blocks a head group), 4 of 4 (A's rows 4..7 unused) with 96 key
       channels and 128 value ones, pages of 64, the live splits' merge,
       one query head a kv head (rows 1..7 unused) */
    {8, 2, 64, 64, 1, 1, 0, 16, "0", NULL, 1},   {8, 2, 64, 64, 3, 1, 37, 16, "0", "32", 1},
    {8, 2, 64, 64, 16, 1, 0, 16, "2", "64", 1},  {16, 1, 64, 64, 2, 1, 0, 64, "0", "32", 1},
    {12, 3, 96, 128, 3, 1, 5, 16, "0", "32", 1}, {8, 2, 64, 64, 1, 1, 0, 16, "3", "32", 1},
    {4, 4, 64, 64, 2, 1, 0, 16, "0", "32", 1},
};
enum { N_CASES = sizeof CASES / sizeof CASES[0] };

/* The fused prologue (MOEC_ATTN_FUSE_PROLOGUE=1, one token): an
 * attn_prologue feeding the attention, emitted twice, as two kernels (the
 * prologue writing the cache row, then the attention) and as one; the
 * harness runs both on the same row and pools and wants the same bits.
 * Cases: Qwen3's q/k norms or none, a row longer than its heads, 1 or 4
 * lanes a position or the choice at run time, split 16 ways (the merge
 * kernel or the last block) or not split, several query-head groups a kv
 * head (gb < G: blocks that write the same row), a window, odd heads with
 * a partial interleaved YaRN rotation. */
typedef struct pro_case {
    int H, HKV, D, qk_norm, XN, lpp, window, bs;
    const char *merge, *target;
    int all_pos;      /* the harness's every position (else two: time) */
    const char *rope; /* the rope attributes (NULL: Qwen3's) */
    int tc;           /* MOEC_ATTN_TC: 1 the tensor cores' form (lpp 1) */
} pro_case;

/* Odd heads of 10 channels, 6 of them rotated, interleaved, with YaRN */
#define ODD_ROPE                                                                                   \
    "style = \"interleave\", theta = 500.0, scaling = \"yarn\", factor = 4.0, yarn_low = 1.0, "    \
    "yarn_high = 3.0, attn_factor = 1.25, rotary_dim = 6"

static const pro_case PRO_CASES[] = {
    {8, 2, 64, 1, 0, 1, 0, 16, "0", "32", 0, NULL, 0},
    {8, 2, 64, 1, 8, 4, 0, 16, "2", "32", 0, NULL, 0},
    {8, 2, 64, 0, 0, 0, 0, 64, "0", "32", 0, NULL, 0},
    {8, 2, 64, 1, 0, 1, 0, 16, "1", "1", 1, NULL, 0},
    {32, 2, 32, 1, 0, 1, 37, 16, "0", "32", 0, NULL, 0},
    {6, 2, 10, 1, 3, 1, 5, 16, "0", "32", 0, ODD_ROPE, 0},
    {8, 2, 64, 1, 0, 4, 0, 16, "3", "32", 0, NULL, 0},
    /* the tensor cores' form: Qwen3's norms, split 16 ways, or merged by
       the last block with a window */
    {8, 2, 64, 1, 0, 1, 0, 16, "0", "32", 0, NULL, 1},
    {8, 2, 64, 1, 8, 1, 37, 16, "2", "32", 0, NULL, 1},
};
enum { N_PRO = sizeof PRO_CASES / sizeof PRO_CASES[0] };

/* The MLA attention on tensor cores (codegen/mla_attention.c's MMA_BODY)
 * at tiny shapes: 16 heads a block, r 64 and dr 16 (5 k steps of 16, 8
 * channels a warp) or 64, or r 128 over 16 warps; tiles by bulk copies on
 * mbarriers (sm_90's default) or by cp.async (MOEC_MLA_TMA=0); the
 * softmax two rows a warp (default) or one (MOEC_MLA_SM2=0); 32- or
 * 16-position tiles; one or two column tiles a warp (MOEC_MLA_CT); split
 * and merged by the merge kernel or the last block, or not split; two head
 * groups; a window; the first tiles loaded before the wait (MOEC_MLA_EARLY,
 * by default) or after it, with the weights by 2^x (MOEC_MLA_EX2) or expf;
 * the step's tokens each a sequence of its own, or (chunk, the first
 * position) one sequence's consecutive positions, as a prefill chunk,
 * whose rows the tiles before the wait must leave out, or (chunk -1) two
 * sequences that share a block one of them writes. */
typedef struct mla_gen_case {
    int H, R, DR, T, window, bs;
    const char *merge, *target, *env; /* env: knobs NAME=VALUE apart by spaces */
    int chunk;
} mla_gen_case;

static const mla_gen_case MLA_CASES[] = {
    {16, 64, 16, 3, 0, 16, "0", "8", NULL, 0},
    {16, 64, 16, 3, 0, 64, "2", "8", "MOEC_MLA_TMA=0", 0},
    {16, 64, 16, 1, 0, 16, "0", "16", "MOEC_MLA_SM2=0", 0},
    {32, 64, 16, 2, 37, 16, "2", "8", "MOEC_MLA_PT=16", 0},
    {16, 128, 16, 2, 0, 16, "0", "4", "MOEC_MLA_WARPS=16", 0},
    {16, 64, 16, 2, 0, 16, "0", "1", "MOEC_MLA_NBUF=3", 0},
    /* one column tile a warp (MOEC_MLA_CT=1; the default takes two,
       sharing q's fragments): with 8 and 16 warps, 16-position tiles */
    {16, 64, 16, 3, 0, 16, "0", "8", "MOEC_MLA_CT=1", 0},
    {32, 64, 16, 2, 37, 16, "2", "8", "MOEC_MLA_CT=1 MOEC_MLA_PT=16", 0},
    {16, 128, 16, 2, 0, 64, "0", "4", "MOEC_MLA_CT=1 MOEC_MLA_WARPS=16", 0},
    /* dr 64 (8 k steps of 16, whole for each part of k): the scores' steps
       unrolled from shared addresses (MOEC_MLA_QK2), two and one column
       tiles a warp */
    {16, 64, 64, 3, 0, 16, "0", "8", NULL, 0},
    {16, 64, 64, 2, 37, 16, "2", "8", "MOEC_MLA_CT=1", 0},
    /* a prefill chunk at 95..97 (2 splits: the second's first tile holds
       95, so nothing before the wait), then at 60..62 in 3 buffers unsplit
       (tile 0 before the wait, tile 1, which holds 60, after it); the
       expf form with every tile after the wait */
    {16, 64, 16, 3, 0, 16, "0", "8", NULL, 95},
    {16, 64, 16, 3, 0, 16, "0", "1", "MOEC_MLA_NBUF=3", 60},
    {16, 64, 16, 3, 0, 16, "0", "8", "MOEC_MLA_EX2=0 MOEC_MLA_EARLY=0", 0},
    /* two sequences sharing a block: sequence 1 at 5 writes a row of the
       block sequence 0 (at 100) maps at its first tile, which the other
       row's write keeps until after the wait */
    {16, 64, 16, 2, 0, 16, "0", "8", NULL, -1},
};
enum { N_MLA = sizeof MLA_CASES / sizeof MLA_CASES[0] };

/* The name of kernel k, which is also its function's name. */
static const char *kname(const cg_ctx *c, int k) { return c->kernel_names[k]; }

/* c's step whose kernel's name starts with prefix (the last), or NULL. */
static const ir_step *step_named(const cg_ctx *c, const char *prefix)
{
    const ir_step *s = NULL;
    for (int k = 0; k < c->n_steps; k++)
        if (!strncmp(kname(c, c->steps[k].kernel), prefix, strlen(prefix)))
            s = &c->steps[k];
    return s;
}

/* An attention kernel's splits, from its name (_nsN), and in *merged
 * whether its last block merges them itself (_m, or _ml: the live ones). */
static int name_splits(const char *n, int *merged)
{
    const char *p = strstr(n, "_ns");
    *merged = strstr(n, "_m_") != NULL || strstr(n, "_ml_") != NULL;
    return p ? atoi(p + 3) : 1;
}

static int is_attention(const ir_op *op) { return op->kind == IR_OP_ATTENTION; }

/* A case's codegen knobs (target NULL: the default's), and back. */
static void set_knobs(int lpp, const char *merge, const char *target, int tc)
{
    char v[8];
    snprintf(v, sizeof v, "%d", lpp);
    setenv("MOEC_ATTN_LPP", v, 1);
    setenv("MOEC_ATTN_TC", tc ? "1" : "0", 1);
    setenv("MOEC_ATTN_MERGE", merge, 1);
    if (target)
        setenv("MOEC_ATTN_TARGET_BLOCKS", target, 1);
}

static void clear_knobs(void)
{
    unsetenv("MOEC_ATTN_LPP");
    unsetenv("MOEC_ATTN_TC");
    unsetenv("MOEC_ATTN_MERGE");
    unsetenv("MOEC_ATTN_TARGET_BLOCKS");
}

/* Inside a run(bufs &b): the attention step a's launch (its dynamic
 * shared memory too), its first arguments `first` and its pools `pools`
 * (the rest alike in every buffers' struct), and the merge kernel cb's
 * where there is one. */
static void put_attn_launch(FILE *f, const cg_ctx *c, const ir_step *a, const ir_step *cb,
                            const char *first, const char *pools, int ns, int merged)
{
    fprintf(f,
            "    emu_launch_z(%u, %u, %u, %u, [&] {\n"
            "        %s(%s, b.pos, b.slots, b.bt, b.max_blocks, %s, b.out, b.scale, b.window%s);\n"
            "    }, %u);\n",
            a->grid[0], a->grid[1], a->grid[2], a->block[0], kname(c, a->kernel), first, pools,
            ns == 1 ? "" : merged ? ", b.part_ml, b.part_o, b.cnt" : ", b.part_ml, b.part_o",
            a->smem);
    if (cb)
        fprintf(f,
                "    emu_launch(%u, %u, %u, 0, 1, [&] {\n"
                "        %s(b.pos, b.slots, b.max_blocks, b.part_ml, b.part_o, b.out);\n"
                "    });\n",
                cb->grid[0], cb->grid[1], cb->block[0], kname(c, cb->kernel));
}

/* A case's namespace `name`: its attention kernel a and merge kernel cb
 * (where there is one), and run(bufs &b) launching them. */
static void put_attn_case(FILE *f, const cg_ctx *c, const char *name, const char *bufs,
                          const ir_step *a, const ir_step *cb, const char *first,
                          const char *pools, int ns, int merged)
{
    fprintf(f, "namespace %s {\n", name);
    put_kernel(f, c->src.data, kname(c, a->kernel));
    if (cb)
        put_kernel(f, c->src.data, kname(c, cb->kernel));
    fprintf(f, "static void run(%s &b)\n{\n", bufs);
    put_attn_launch(f, c, a, cb, first, pools, ns, merged);
    fprintf(f, "}\n} // namespace %s\n\n", name);
}

static int gen_case_src(FILE *f, moec_buf *table, int i, const gen_case *g)
{
    km_spec s = {.name = "attn", .vocab = 8, .attn = KM_GQA, .H = g->H, .HKV = g->HKV,
                 .DK = g->DK, .DV = g->DV, .window = g->window, .attn_scale = 0.3};
    set_knobs(g->lpp, g->merge, g->target, g->tc);
    ir_module *m = km_module(&s);
    if (!m)
        return -1;
    cg_options o;
    cg_options_default(&o);
    o.kv_block_size = g->bs;
    cg_ctx c;
    int rc = emu_gen_emit(&c, m, &o, g->T, is_attention, "attn_emu_gen", i);
    clear_knobs();
    /* the steps: the cache write (not run: the harness fills the pages),
       the attention, and the merge where the sequence is split */
    const ir_step *a = rc ? NULL : step_named(&c, "attn_h"),
                  *cb = rc ? NULL : step_named(&c, "attn_combine_");
    char tail[32];
    snprintf(tail, sizeof tail, "_t%d_bf16", g->T);
    /* a fixed count past one names itself (_lppN), the choice at run time
       _lppa where the sequence is split */
    char want[16] = "";
    if (g->lpp > 1)
        snprintf(want, sizeof want, "_lpp%d_", g->lpp);
    const char *an = a ? kname(&c, a->kernel) : "";
    int split = strstr(an, "_ns1_") == NULL;
    if (g->lpp == 0 && split)
        snprintf(want, sizeof want, "_lppa_");
    int split_tc = split && strstr(an, "_tc_") != NULL;
    if (!rc && (!a || !strstr(an, tail) || (*want ? !strstr(an, want) : !!strstr(an, "_lpp")) ||
                (strstr(an, "_tc_") != NULL) != (g->tc != 0))) {
        fprintf(stderr, "attn_emu_gen: case %d: no bf16 attention step of the lanes asked for\n",
                i);
        rc = -1;
    }
    int ns = 1, merged = 0;
    if (!rc) {
        /* the splits, from the kernel's name (_nsN); a merge kernel exists
           exactly where there is more than one and the kernel does not
           merge them itself (_m) */
        const char *n = kname(&c, a->kernel);
        ns = name_splits(n, &merged);
        int own = ns > 1 && (!strcmp(g->merge, "2") || !strcmp(g->merge, "3"));
        if ((ns > 1 && !merged) != (cb != NULL) || merged != own ||
            (strstr(n, "_ml_bs") != NULL) != (own && !strcmp(g->merge, "3"))) {
            fprintf(stderr, "attn_emu_gen: case %d: %d splits but %s merge kernel\n", i, ns,
                    cb ? "a" : "no");
            rc = -1;
        }
    }
    if (!rc) {
        char name[16];
        snprintf(name, sizeof name, "a%d", i);
        put_attn_case(f, &c, name, "attn_bufs", a, cb, "b.q", "b.kpool, b.vpool", ns, merged);
        /* the tensor cores' form: the fewest positions of a split, from
           the name (_mpN), for the harness's count of the live splits */
        const char *mp = strstr(an, "_mp");
        moec_buf_printf(table,
                        "    {\"%s\", %d, %d, %d, %d, %d, %d, %d, %d, %d, %d, %d, a%d::run},\n",
                        kname(&c, a->kernel), g->H, g->HKV, g->DK, g->DV, g->T, g->window, g->bs,
                        ns, g->lpp, merged, split_tc && mp ? atoi(mp + 3) : 0, i);
    }
    cg_ctx_free(&c);
    ir_module_free(m);
    return rc;
}

static int is_mla(const ir_op *op) { return op->kind == IR_OP_MLA_ATTENTION; }

static int gen_mla_case(FILE *f, moec_buf *table, int i, const mla_gen_case *g)
{
    km_spec s = {.name = "mla", .vocab = 8, .attn = KM_MLA, .H = g->H, .R = g->R, .DR = g->DR,
                 .window = g->window, .attn_scale = 0.3};
    set_knobs(1, g->merge, g->target, 0);
    emu_knobs(g->env, 0);
    ir_module *m = km_module(&s);
    cg_options o;
    cg_options_default(&o);
    o.kv_block_size = g->bs;
    cg_ctx c;
    int rc = m ? emu_gen_emit(&c, m, &o, g->T, is_mla, "attn_emu_gen", 200 + i) : -1;
    emu_knobs(g->env, 1);
    clear_knobs();
    const ir_step *a = rc ? NULL : step_named(&c, "mla_attn_mma_"),
                  *cb = rc ? NULL : step_named(&c, "mla_combine_");
    /* the forms the knobs ask for: bulk copies unless MOEC_MLA_TMA=0 (the
       default arch is sm_90), the softmax's two rows unless MOEC_MLA_SM2=0,
       two column tiles a warp unless MOEC_MLA_CT=1 */
    const char *an = a ? kname(&c, a->kernel) : "";
    int want_tma = !(g->env && strstr(g->env, "MOEC_MLA_TMA=0")),
        want_sm1 = g->env && strstr(g->env, "MOEC_MLA_SM2=0"),
        want_ct1 = g->env && strstr(g->env, "MOEC_MLA_CT=1"),
        want_ex2 = !(g->env && strstr(g->env, "MOEC_MLA_EX2=0")),
        want_early = want_tma && !(g->env && strstr(g->env, "MOEC_MLA_EARLY=0"));
    if (!rc && (!a || (strstr(an, "_tma_") != NULL) != want_tma ||
                (strstr(an, "_sm1_") != NULL) != !!want_sm1 ||
                (strstr(an, "_ct1_") != NULL) != !!want_ct1 ||
                (strstr(an, "_ex2_") != NULL) != want_ex2 ||
                (strstr(an, "_early_") != NULL) != want_early)) {
        fprintf(stderr, "attn_emu_gen: MLA case %d: no tensor-core MLA attention step of the form "
                        "asked for\n", i);
        rc = -1;
    }
    int ns = 1, merged = 0;
    if (!rc) {
        ns = name_splits(kname(&c, a->kernel), &merged);
        if ((ns > 1 && !merged) != (cb != NULL)) {
            fprintf(stderr, "attn_emu_gen: MLA case %d: %d splits but %s merge kernel\n", i, ns,
                    cb ? "a" : "no");
            rc = -1;
        }
    }
    if (!rc) {
        char name[16];
        snprintf(name, sizeof name, "m%d", i);
        put_attn_case(f, &c, name, "mla_bufs", a, cb, "b.q_c, b.q_pe", "b.kvpool, b.pepool", ns,
                      merged);
        moec_buf_printf(table, "    {\"%s\", %d, %d, %d, %d, %d, %d, %d, %d, %d, m%d::run},\n",
                        kname(&c, a->kernel), g->H, g->R, g->DR, g->T, g->window, g->bs, ns,
                        merged, g->chunk, i);
    }
    if (m)
        cg_ctx_free(&c);
    ir_module_free(m);
    return rc;
}

static int is_pro_or_attention(const ir_op *op)
{
    return op->kind == IR_OP_ATTENTION || op->kind == IR_OP_ATTN_PROLOGUE;
}

/* Text of src from `from` (inclusive) through the first `to` after it. */
static int put_through(FILE *f, const char *src, const char *from, const char *to)
{
    const char *a = src ? strstr(src, from) : NULL, *b = a ? strstr(a, to) : NULL;
    if (!b)
        return -1;
    fprintf(f, "%.*s\n", (int)(b + strlen(to) - a), a);
    return 0;
}

/* The kernels of case i's module with MOEC_ATTN_FUSE_PROLOGUE=fuse, in
 * namespace pN::fFUSE: a run(pro_bufs &) that launches them in order. */
static int gen_pro_form(FILE *f, const ir_module *m, const cg_options *o, int i, int fuse,
                        int qk_norm, int *ns, int *merged)
{
    setenv("MOEC_ATTN_FUSE_PROLOGUE", fuse ? "1" : "0", 1);
    cg_ctx c;
    int rc = emu_gen_emit(&c, m, o, 1, is_pro_or_attention, "attn_emu_gen", 100 + i);
    unsetenv("MOEC_ATTN_FUSE_PROLOGUE");
    const ir_step *pro = rc ? NULL : step_named(&c, "attn_prologue_"),
                  *a = rc ? NULL : step_named(&c, "attn_h"),
                  *cb = rc ? NULL : step_named(&c, "attn_combine_");
    /* fused: one attention kernel that names its prologue, and no prologue
       kernel; else both */
    if (!rc && (!a || (fuse ? pro != NULL || !strstr(kname(&c, a->kernel), "_pro_n")
                           : pro == NULL || strstr(kname(&c, a->kernel), "_pro_n") != NULL))) {
        fprintf(stderr, "attn_emu_gen: prologue case %d, fuse %d: not the kernels asked for\n", i,
                fuse);
        rc = -1;
    }
    if (!rc) {
        *ns = name_splits(kname(&c, a->kernel), merged);
        static int helpers;
        if (!helpers++ && put_through(f, c.src.data, "#ifndef MOEC_ATTN_PROLOGUE_HELPERS",
                                      "#endif\n") != 0) {
            fprintf(stderr, "attn_emu_gen: no prologue helpers\n");
            rc = -1;
        }
    }
    if (!rc) {
        char sym[320];
        snprintf(sym, sizeof sym, "__constant__ float %s_inv_freq[",
                 kname(&c, (fuse ? a : pro)->kernel));
        fprintf(f, "namespace p%d {\nnamespace f%d {\n", i, fuse);
        if (put_through(f, c.src.data, sym, "};\n") != 0) {
            fprintf(stderr, "attn_emu_gen: prologue case %d: no rotation table\n", i);
            rc = -1;
        }
    }
    if (!rc) {
        if (pro)
            put_kernel(f, c.src.data, kname(&c, pro->kernel));
        put_kernel(f, c.src.data, kname(&c, a->kernel));
        if (cb)
            put_kernel(f, c.src.data, kname(&c, cb->kernel));
        fprintf(f, "static void run(pro_bufs &b)\n{\n");
        const char *norm = qk_norm ? ", b.qw, b.kw" : "";
        if (pro)
            fprintf(f,
                    "    emu_launch(%u, %u, %u, 0, 1, [&] {\n"
                    "        %s(b.x, b.pos%s, b.q, b.k, b.v, b.pos, b.slots, b.bt, b.max_blocks, "
                    "b.kpool, b.vpool%s);\n"
                    "    });\n",
                    pro->grid[0], pro->grid[1], pro->block[0], kname(&c, pro->kernel), norm,
                    *norm ? ", b.eps" : "");
        char first[64];
        snprintf(first, sizeof first, "%s%s%s", fuse ? "b.x" : "b.q", fuse ? norm : "",
                 fuse && *norm ? ", b.eps" : "");
        put_attn_launch(f, &c, a, cb, first, "b.kpool, b.vpool", *ns, *merged);
        fprintf(f, "}\n} // namespace f%d\n} // namespace p%d\n\n", fuse, i);
    }
    cg_ctx_free(&c);
    return rc;
}

static int gen_pro_case(FILE *f, moec_buf *table, int i, const pro_case *g)
{
    km_spec s = {.name = "attnpro", .vocab = 8, .attn = KM_GQA_PRO, .H = g->H, .HKV = g->HKV,
                 .DK = g->D, .DV = g->D, .qk_norm = g->qk_norm, .XN = g->XN,
                 .window = g->window, .attn_scale = 0.3, .rope = g->rope};
    set_knobs(g->lpp, g->merge, g->target, g->tc);
    ir_module *m = km_module(&s);
    cg_options o;
    cg_options_default(&o);
    o.kv_block_size = g->bs;
    int ns[2] = {0, 0}, merged[2] = {0, 0};
    int rc = m ? 0 : -1;
    for (int fuse = 0; fuse < 2 && !rc; fuse++)
        rc = gen_pro_form(f, m, &o, i, fuse, g->qk_norm, &ns[fuse], &merged[fuse]);
    clear_knobs();
    if (!rc && (ns[0] != ns[1] || merged[0] != merged[1])) {
        fprintf(stderr, "attn_emu_gen: prologue case %d: the two forms split differently\n", i);
        rc = -1;
    }
    if (!rc)
        moec_buf_printf(table,
                        "    {%d, %d, %d, %d, %d, %d, %d, %d, %d, %d, p%d::f0::run, p%d::f1::run},\n",
                        g->H, g->HKV, g->D, (g->H + 2 * g->HKV) * g->D + g->XN, g->qk_norm,
                        g->window, g->bs, ns[0], merged[0], g->all_pos, i, i);
    ir_module_free(m);
    return rc;
}

int main(int argc, char **argv)
{
    moec_buf pro = {0};
    int erc;
    FILE *f = emu_gen_open(argc, argv, "attn_emu_gen", "the GQA attention kernels for cuda_emu.h",
                           &pro, &erc);
    if (!f)
        return erc;
    put_prologue_part(f, pro.data,
                      "template <typename W, int N, typename T>\n__device__ "
                      "__forceinline__ void moec_ldw",
                      "/* fp8 weights (e4m3, exact in fp16");
    put_prologue_part(f, pro.data,
                      "template <int N, typename T> __device__ __forceinline__ void stv",
                      "template <int N, typename T> __device__ __forceinline__ void cpv");
    put_prologue_part(f, pro.data, "__device__ __forceinline__ float warp_sum",
                      "/* The warp's arg-max");
    put_prologue_part(f, pro.data, "/* The merge weights of the NSPLIT",
                      "__device__ __forceinline__ float block_sum");
    /* the cache row and the rotation of a head (the prologue's last part),
       for the fused prologue's cases */
    const char *rows = strstr(pro.data, "/* the paged-cache row of token t");
    if (!rows || !strstr(rows, "moec_rope_row")) {
        fprintf(stderr, "attn_emu_gen: the prologue has no moec_cache_row and moec_rope_row\n");
        moec_buf_free(&pro);
        fclose(f);
        return 1;
    }
    fputs(rows, f);
    int rc = 0;
    moec_buf_free(&pro);
    moec_buf table = {0};
    for (int i = 0; i < N_CASES && !rc; i++)
        rc = gen_case_src(f, &table, i, &CASES[i]);
    if (!rc)
        fprintf(f, "static const attn_case CASES[] = {\n%s};\n", table.data ? table.data : "");
    moec_buf ptable = {0};
    for (int i = 0; i < N_PRO && !rc; i++)
        rc = gen_pro_case(f, &ptable, i, &PRO_CASES[i]);
    if (!rc)
        fprintf(f, "static const pro_case PRO_CASES[] = {\n%s};\n",
                ptable.data ? ptable.data : "");
    moec_buf mtable = {0};
    for (int i = 0; i < N_MLA && !rc; i++)
        rc = gen_mla_case(f, &mtable, i, &MLA_CASES[i]);
    if (!rc)
        fprintf(f, "static const mla_case MLA_CASES[] = {\n%s};\n",
                mtable.data ? mtable.data : "");
    rc = rc || ptable.oom || mtable.oom;
    moec_buf_free(&mtable);
    moec_buf_free(&ptable);
    rc = rc || table.oom;
    moec_buf_free(&table);
    if (fclose(f) || rc) {
        fprintf(stderr, "attn_emu_gen: could not write %s\n", argv[1]);
        return 1;
    }
    return 0;
}
