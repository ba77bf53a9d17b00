/* fp8_emu_gen.c — writes the staged fp8 kernels (codegen/fp8_tc.c), the
 * few-token fp8 linear and the tensor-core bf16 one (codegen/linear.c) and the
 * streaming, tile-streaming and tensor-core (mma) expert GEMMs
 * (codegen/moe_routed.c) of a set of cases as
 * C++ for the CPU emulator (tests/cuda_emu.h, tests/test_fp8_emu.sh): the
 * prologue's moec_silu_mul_frag, moec_e4m3x4_bf16, moec_x16, moec_tc_chunk,
 * ldv, moec_prefetch_rows, warp_sum, moec_w16 and moec_silu_mul8 as the
 * generator emits them, each case's kernels in a namespace of their own,
 * and a table of the cases with their launches. Cases: linears and routed experts at odd shapes (partial
 * scale blocks, slabs with dead warps, uneven K splits over clusters, up
 * inside a row block, gate and up apart; fp8 linears with act silu_mul)
 * and buckets 1, 3, 8, 32, 64, 128,
 * with the default kernel choice or the staged kernels forced, and the
 * shape knobs set otherwise (test_fp8_emu.sh runs cases 9, 16, 17, 31, 38
 * and 45 under the thread sanitizer: keep them a split linear, the two
 * expert forms, the bf16 tensor-core linear split over a cluster, plain
 * and act, and the staged bf16 linear's act split over a cluster).
 * usage: fp8_emu_gen OUT.inc */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/cg.h"
#include "emu_gen.h"
#include "kern_modules.h"

typedef struct gen_case {
    km_spec s;
    int T, fp8;
    const char *env; /* shape knobs NAME=VALUE apart by spaces, or NULL */
} gen_case;

#define LIN(n, k, bn, bk) \
    {.name = "lin", .vocab = 8, .LN = n, .LK = k, .ldt = "f8e4m3", .BN = bn, .BK = bk}
#define MOE(e, kk, h, i, sp, bn, bk)                                                              \
    {.name = "moe", .vocab = 8, .E = e, .K = kk, .NG = 1, .TG = 1, .norm = 1, .scaling = 1.0,      \
     .moe = sp ? KM_ROUTED_SPLIT : KM_ROUTED, .HID = h, .I = i, .wdt = "f8e4m3",                  \
     .moe_scale = 0.75, .BN = bn, .BK = bk}

/* an fp8 weight, act silu_mul */
#define LINA(n, k, bn, bk)                                                                         \
    {.name = "lin", .vocab = 8, .LN = n, .LK = k, .ldt = "f8e4m3", .BN = bn, .BK = bk, .lact = 1}

/* a bf16 weight (the tensor-core linear past the few-token bound), act
   silu_mul where a */
#define LIN16(n, k, a) {.name = "lin", .vocab = 8, .LN = n, .LK = k, .ldt = "bf16", .lact = a}

/* bf16 experts (the streaming form) */
#define MOE16(e, kk, h, i, sp)                                                                     \
    {.name = "moe", .vocab = 8, .E = e, .K = kk, .NG = 1, .TG = 1, .norm = 1, .scaling = 1.0,      \
     .moe = sp ? KM_ROUTED_SPLIT : KM_ROUTED, .HID = h, .I = i, .wdt = "bf16", .moe_scale = 0.75}

static const gen_case CASES[] = {
    {LIN(336, 640, 48, 64), 1, CG_FP8_TC, NULL},
    {LIN(336, 640, 48, 64), 3, CG_FP8_TC, NULL},
    {LIN(336, 640, 48, 64), 8, CG_FP8_AUTO, NULL},
    {LIN(336, 640, 48, 64), 32, CG_FP8_AUTO, NULL},
    {LIN(336, 640, 48, 64), 64, CG_FP8_AUTO, NULL},
    {LIN(336, 640, 48, 64), 128, CG_FP8_AUTO, NULL},
    {LIN(336, 640, 48, 64), 8, CG_FP8_AUTO, "MOEC_FP8_TC_SPLIT=1"},
    {LIN(336, 640, 48, 64), 64, CG_FP8_AUTO, "MOEC_FP8_TC_WARPS=3"},
    {LIN(100, 1280, 16, 128), 8, CG_FP8_AUTO, NULL},
    {LIN(100, 1280, 16, 128), 64, CG_FP8_AUTO, "MOEC_FP8_TC_U=3"},
    {LIN(576, 512, 128, 128), 3, CG_FP8_TC, NULL},
    {LIN(576, 512, 128, 128), 64, CG_FP8_AUTO, NULL},
    {MOE(6, 3, 320, 192, 0, 48, 64), 1, CG_FP8_TC, NULL},
    {MOE(6, 3, 320, 192, 0, 48, 64), 8, CG_FP8_AUTO, NULL},
    {MOE(6, 3, 320, 192, 0, 48, 64), 32, CG_FP8_AUTO, NULL},
    {MOE(4, 2, 192, 64, 0, 32, 64), 128, CG_FP8_AUTO, NULL},
    {MOE(5, 2, 192, 64, 1, 16, 128), 3, CG_FP8_TC, NULL},
    {MOE(5, 2, 192, 64, 1, 16, 128), 32, CG_FP8_AUTO, "MOEC_FP8_TC_RT=2"},
    /* the streaming form (codegen/moe_routed.c) at blocks of 1 and 2 slots:
       partial 128 x 128 and 48 x 64 blocks, gate_up's and down's last
       blocks of rows partly dead (12 and 20 rows a block), H 1040 (3
       chunks of 512 codes, 2 a round: the last round's second chunk
       dead; or 1 a round) */
    {MOE(7, 4, 208, 48, 1, 128, 128), 1, CG_FP8_AUTO, NULL},
    {MOE(6, 3, 320, 48, 0, 48, 64), 1, CG_FP8_AUTO, NULL},
    {MOE(6, 3, 128, 80, 0, 48, 64), 2, CG_FP8_AUTO, "MOEC_MOE_GEMV_RW=3"},
    {MOE(7, 4, 208, 48, 1, 128, 128), 1, CG_FP8_AUTO, "MOEC_MOE_GEMV_RWD=5"},
    {MOE(5, 2, 1040, 48, 0, 128, 128), 1, CG_FP8_AUTO, NULL},
    {MOE(5, 2, 1040, 48, 1, 128, 128), 1, CG_FP8_AUTO, "MOEC_MOE_GEMV_U=1"},
    /* and its bf16 weights: a chunk of 25 (gate_up) and 5 (down) live
       lanes; H 520, 3 chunks of 256 in rounds of 2 */
    {MOE16(6, 3, 200, 40, 0), 2, CG_FP8_AUTO, NULL},
    {MOE16(5, 2, 520, 72, 1), 1, CG_FP8_AUTO, NULL},
    {MOE16(5, 2, 520, 72, 0), 1, CG_FP8_AUTO, "MOEC_MOE_GEMV_RW=3"},
    /* the linears' L2 prefetch before the wait (every case up to 8 tokens
       has the default cap's: the whole slab) at a cap of 1 KiB: each
       row's first bytes; clusters of 8 splits sharing a slab of 64 rows
       (the last one 16), and one block a slab of 3 tokens */
    {LIN(336, 640, 48, 64), 8, CG_FP8_AUTO, "MOEC_PREFETCH_KB=1"},
    {LIN(100, 1280, 16, 128), 3, CG_FP8_TC, "MOEC_PREFETCH_KB=1"},
    /* the few-token linear (codegen/linear.c, gemv in kernel names; a
       thread a CUDA thread: few blocks): a row a block at 3 tokens; 2
       rows a block at 1, the last block 1, the last scale block partial,
       at a cap of 1 KiB (each row's first 512 bytes) */
    {LIN(100, 1280, 16, 128), 3, CG_FP8_AUTO, NULL},
    {LIN(1059, 640, 48, 64), 1, CG_FP8_AUTO, "MOEC_PREFETCH_KB=1"},
    /* the bf16 tensor-core linear (codegen/linear.c, linear_mma_): the last
       16-row tile partly past N (100 rows), K 640 (20 chunks: over a
       cluster of 2 blocks of 8 warps, the last round partial; 6 of 3
       warps; one block), 5 and 8 tokens, and 16 where the knob lets it;
       act silu_mul (h from x [T, 2K]) at K 224 (one block; 13 tokens by
       the knob) and 1024 (a cluster of 4) */
    {LIN16(100, 640, 0), 8, CG_FP8_AUTO, NULL},
    {LIN16(100, 640, 0), 5, CG_FP8_AUTO, NULL},
    {LIN16(100, 640, 0), 8, CG_FP8_AUTO, "MOEC_LINEAR_MMA_WARPS=3"},
    {LIN16(100, 640, 0), 16, CG_FP8_AUTO, "MOEC_LINEAR_MMA_MAX_T=16"},
    {LIN16(100, 640, 0), 8, CG_FP8_AUTO, "MOEC_LINEAR_MMA_KS=1"},
    {LIN16(48, 224, 1), 8, CG_FP8_AUTO, NULL},
    {LIN16(48, 224, 1), 13, CG_FP8_AUTO, "MOEC_LINEAR_MMA_MAX_T=16"},
    {LIN16(48, 1024, 1), 8, CG_FP8_AUTO, NULL},
    /* the staged kernel with bf16 weights (codegen/fp8_tc.c, linear_tc_;
       MOEC_LINEAR_TC_MAX_T lets it) past 8 tokens: the last tile partly
       past N, K 640 over clusters of up to 8 (10 chunks: uneven shares),
       groups of 16, 40 and 64 tokens, the first weights before the wait or
       not, two tiles a warp, three splits; act at K 1024 (h staged from x
       [T, 2K]); and at 8 tokens, with the L2 prefetch before the wait */
#define TC16 "MOEC_LINEAR_TC_MAX_T=64"
    {LIN16(100, 640, 0), 16, CG_FP8_AUTO, TC16},
    {LIN16(100, 640, 0), 64, CG_FP8_AUTO, TC16},
    {LIN16(100, 640, 0), 40, CG_FP8_AUTO, TC16 " MOEC_FP8_TC_RT=2"},
    {LIN16(100, 640, 0), 32, CG_FP8_AUTO, TC16 " MOEC_LINEAR_TC_PRE=0"},
    {LIN16(100, 640, 0), 8, CG_FP8_AUTO, TC16 " MOEC_LINEAR_MMA_MAX_T=0"},
    {LIN16(48, 1024, 1), 24, CG_FP8_AUTO, TC16},
    {LIN16(48, 1024, 1), 64, CG_FP8_AUTO, TC16 " MOEC_FP8_TC_SPLIT=3"},
    /* fp8 weights with act silu_mul (fuse_silu_mul_linear): the few-token
       kernel at 3 tokens, the staged kernel at 3 (forced), 24 and 64
       tokens, K 640 in 48 x 64 blocks (a tile past N) and K 1024 in 16 x
       128 (a cluster of splits) */
    {LINA(100, 640, 48, 64), 3, CG_FP8_AUTO, NULL},
    {LINA(100, 640, 48, 64), 3, CG_FP8_TC, NULL},
    {LINA(100, 640, 48, 64), 64, CG_FP8_AUTO, NULL},
    {LINA(48, 1024, 16, 128), 24, CG_FP8_AUTO, NULL},
    /* the streaming experts with the codes widened by integer operations
       (MOEC_MOE_GEMV_CVT=0; the cases above take the conversion unit):
       gate and up apart, partial blocks; H 1040 */
    {MOE(7, 4, 208, 48, 1, 128, 128), 1, CG_FP8_AUTO, "MOEC_MOE_GEMV_CVT=0"},
    {MOE(5, 2, 1040, 48, 0, 128, 128), 1, CG_FP8_AUTO, "MOEC_MOE_GEMV_CVT=0"},
    /* the tile-streaming form (gt) over weights in fragment tiles
       (ir_weight_tiled; cases 12-17 and 19-20 tile gate_up, down or both,
       19-20 gate_up in this form): both tiled, fused and split, one chunk
       in flight; blocks of 2 slots (kept from the staged kernels), 3 warps
       a block over 5 and 3 chunks, 3 in flight; 8 warps over down's one
       chunk, the codes widened by integer operations */
    {MOE(6, 3, 320, 192, 0, 48, 64), 1, CG_FP8_AUTO, NULL},
    {MOE(5, 2, 192, 64, 1, 16, 128), 1, CG_FP8_AUTO, "MOEC_MOE_GT_U=1 MOEC_MOE_GT_DN_U=1"},
    {MOE(6, 3, 320, 192, 0, 48, 64), 2, CG_FP8_AUTO,
     "MOEC_MOE_FP8_TC_MIN_BM=4 MOEC_MOE_GT_WARPS=3 MOEC_MOE_GT_U=3 MOEC_MOE_GT_DN_WARPS=3 "
     "MOEC_MOE_GT_DN_U=3"},
    {MOE(5, 2, 192, 64, 1, 16, 128), 1, CG_FP8_AUTO,
     "MOEC_MOE_GEMV_CVT=0 MOEC_MOE_GT_WARPS=8 MOEC_MOE_GT_DN_WARPS=8"},
    /* and the same shapes as compiled by default, without tiles: the
       staged kernels at 32 tokens, the streaming form at 1 */
    {MOE(6, 3, 320, 192, 0, 48, 64), 32, CG_FP8_AUTO, "MOEC_FP8_TILES=0"},
    {MOE(5, 2, 192, 64, 1, 16, 128), 1, CG_FP8_AUTO, "MOEC_FP8_TILES=0"},
    /* the tile-streaming down's own shape: 2 warps, 5 chunks in flight */
    {MOE(6, 3, 320, 192, 0, 48, 64), 1, CG_FP8_AUTO, "MOEC_MOE_GT_DN_WARPS=2 MOEC_MOE_GT_DN_U=5"},
    /* the tensor-core expert GEMMs (the mma form, from 4 slots a block)
       with bf16 weights in rows: 16 and 8 slots a block, gate and up fused
       and apart, 3 chunks in flight (the last round partial), one slot a
       block by the knob; and with fp8 weights (the kernels before the
       staged ones), in fragment tiles and in rows */
    {MOE16(6, 3, 256, 64, 0), 32, CG_FP8_AUTO, NULL},
    {MOE16(5, 2, 480, 96, 1), 16, CG_FP8_AUTO, "MOEC_MOE_MMA_U=3 MOEC_MOE_MMA_DN_U=3"},
    {MOE16(6, 3, 256, 64, 0), 3, CG_FP8_AUTO, "MOEC_MOE_MMA_MIN_BM=1"},
    {MOE(6, 3, 320, 192, 0, 48, 64), 32, CG_FP8_OLD, NULL},
    {MOE(6, 3, 320, 192, 0, 48, 64), 32, CG_FP8_OLD, "MOEC_FP8_TILES=0"},
    /* the staged kernels' slots refilled by halves (MOEC_FP8_TC_ROLL=2):
       the experts in tiles, the linear split over a cluster at 3 chunks in
       flight (halves of 2 and 1) */
    {MOE(6, 3, 320, 192, 0, 48, 64), 32, CG_FP8_AUTO, "MOEC_FP8_TC_ROLL=2"},
    {LIN(100, 1280, 16, 128), 64, CG_FP8_AUTO, "MOEC_FP8_TC_ROLL=2 MOEC_FP8_TC_U=3"},
    /* ... in thirds (groups of 2, 2 and 1 slots at 5 in flight) */
    {MOE(6, 3, 320, 192, 0, 48, 64), 32, CG_FP8_AUTO, "MOEC_FP8_TC_ROLL=3 MOEC_FP8_TC_U=5"},
    {LIN(100, 1280, 16, 128), 64, CG_FP8_AUTO, "MOEC_FP8_TC_ROLL=3 MOEC_FP8_TC_U=5"},
    /* 8 warps a block, as the staged linear takes on the main stream at 64
       tokens where the blocks still fill the GPU (fp8_tc.c, linear_shape):
       256 rows a block, the second of two slabs mostly dead warps */
    {LIN(336, 640, 48, 64), 64, CG_FP8_AUTO, "MOEC_FP8_TC_WARPS=8"},
    /* down alone in tiles (MOEC_FP8_TILES=2), gate_up in rows: the staged
       kernels at 32 tokens, the streaming forms at 1 */
    {MOE(6, 3, 320, 192, 0, 48, 64), 32, CG_FP8_AUTO, "MOEC_FP8_TILES=2"},
    {MOE(5, 2, 192, 64, 1, 16, 128), 1, CG_FP8_AUTO, "MOEC_FP8_TILES=2"},
    /* gate_up alone in tiles (=3), down in rows: staged at 32, streaming at 1 */
    {MOE(6, 3, 320, 192, 0, 48, 64), 32, CG_FP8_AUTO, "MOEC_FP8_TILES=3"},
    {MOE(5, 2, 192, 64, 1, 16, 128), 1, CG_FP8_AUTO, "MOEC_FP8_TILES=3"},
    /* the dense linear's weight in fragment tiles (MOEC_FP8_TILES=5: the
       linears' bit): the few-token kernel's tile form at 1 and 3 tokens
       (10 chunks over 8 warps: some warps one, some two), at 2 over 3
       warps of 3 in flight (a partial round), with act at 3, split over
       clusters of 3 blocks a tile (3 + 3 + 4 chunks over 4 warps) and, with
       act, of 2; the staged kernel at 8, 32 and 64 tokens, over
       a cluster of splits and with act at 24 */
    {LIN(336, 640, 48, 64), 1, CG_FP8_AUTO, "MOEC_FP8_TILES=5"},
    {LIN(336, 640, 48, 64), 3, CG_FP8_AUTO, "MOEC_FP8_TILES=5"},
    {LIN(336, 640, 48, 64), 2, CG_FP8_AUTO,
     "MOEC_FP8_TILES=5 MOEC_GEMV_TL_WARPS=3 MOEC_GEMV_TL_U=3"},
    {LINA(48, 1024, 16, 128), 3, CG_FP8_AUTO, "MOEC_FP8_TILES=5"},
    {LIN(336, 640, 48, 64), 2, CG_FP8_AUTO,
     "MOEC_FP8_TILES=5 MOEC_GEMV_TL_S=3 MOEC_GEMV_TL_WARPS=4"},
    {LINA(48, 1024, 16, 128), 4, CG_FP8_AUTO, "MOEC_FP8_TILES=5 MOEC_GEMV_TL_S=2"},
    {LIN(336, 640, 48, 64), 8, CG_FP8_AUTO, "MOEC_FP8_TILES=5"},
    {LIN(336, 640, 48, 64), 32, CG_FP8_AUTO, "MOEC_FP8_TILES=5"},
    {LIN(576, 512, 128, 128), 64, CG_FP8_AUTO, "MOEC_FP8_TILES=5"},
    {LINA(48, 1024, 16, 128), 24, CG_FP8_AUTO, "MOEC_FP8_TILES=5"},
    /* the tile-streaming form with several tiles a warp and warps apart
       over K: down 3 tiles a warp, 4 warps a group (96-row blocks over
       320 rows: the last group partly past them), gate_up 2 tiles a warp,
       2 warps a group; then down 4 tiles over 8 warps (one group),
       gate_up 4 tiles a warp, one warp a group over 64 rows (the second
       group past them) */
    {MOE(6, 3, 320, 192, 0, 48, 64), 1, CG_FP8_AUTO,
     "MOEC_MOE_GT_DN_RT=3 MOEC_MOE_GT_DN_KW=4 MOEC_MOE_GT_DN_WARPS=8 MOEC_MOE_GT_DN_U=3 "
     "MOEC_MOE_GT_RT=2 MOEC_MOE_GT_KW=2 MOEC_MOE_GT_WARPS=4"},
    {MOE(5, 2, 192, 64, 1, 16, 128), 1, CG_FP8_AUTO,
     "MOEC_MOE_GT_DN_RT=4 MOEC_MOE_GT_DN_KW=8 MOEC_MOE_GT_DN_WARPS=8 MOEC_MOE_GT_DN_U=3 "
     "MOEC_MOE_GT_RT=4 MOEC_MOE_GT_KW=1 MOEC_MOE_GT_WARPS=2"},
};
enum { N_CASES = sizeof CASES / sizeof CASES[0] };

static int is_fp8_op(const ir_op *op)
{
    return op->kind == IR_OP_LINEAR || op->kind == IR_OP_MOE_ROUTED;
}


int main(int argc, char **argv)
{
    moec_buf pro = {0};
    int erc;
    FILE *f = emu_gen_open(argc, argv, "fp8_emu_gen", "the staged fp8 kernels for cuda_emu.h",
                           &pro, &erc);
    if (!f)
        return erc;
    put_prologue_part(f, pro.data, "template <typename TH>", "/* two floats as a bf16 pair");
    put_prologue_part(f, pro.data, "__device__ __forceinline__ void moec_e4m3x4_bf16",
                      "/* 16 bytes of a weight stream");
    put_prologue_part(f, pro.data, "/* x's 16 staged bf16 elements",
                      "/* Programmatic dependent launch");
    put_prologue_part(f, pro.data,
                      "template <typename W, int N, typename T>\n__device__ __forceinline__ void "
                      "moec_ldw",
                      "template <typename W, int N, typename T>\n__device__ __forceinline__ void "
                      "moec_stw");
    put_prologue_part(f, pro.data, "template <int N, typename T> __device__ __forceinline__ void ldv",
                      "/* fp8 weights (e4m3, exact in fp16");
    put_prologue_part(f, pro.data, "/* The L2 prefetch of a block's weight slice",
                      "__device__ __forceinline__ float warp_sum");
    put_prologue_part(f, pro.data,
                      "template <int N> __device__ __forceinline__ void ldv(const __nv_fp8_e4m3",
                      "template <int N, typename T> __device__ __forceinline__ void stv");
    put_prologue_part(f, pro.data, "__device__ __forceinline__ float warp_sum",
                      "__device__ __forceinline__ float warp_max");
    put_prologue_part(f, pro.data, "/* The 16 bytes of a weight vector",
                      "/* 16 bytes from global to shared memory");
    put_prologue_part(f, pro.data, "/* 8 consecutive weights as the 4 bf16 pairs",
                      "/* fp8 weights on tensor cores with the activations staged");
    moec_buf_free(&pro);
    moec_buf table = {0};
    for (int i = 0; i < N_CASES; i++) {
        const gen_case *gc = &CASES[i];
        emu_knobs(gc->env, 0);
        ir_module *m = km_module(&gc->s);
        if (!m)
            return 1;
        cg_options o;
        cg_options_default(&o);
        o.fp8_kernel = gc->fp8;
        /* the experts' weights in fragment tiles where the shapes allow,
           unless the case says MOEC_FP8_TILES=N (0 none, 2 only down, 3 only
           gate_up; N | 4 the linears' too) */
        const char *ft = gc->env ? strstr(gc->env, "MOEC_FP8_TILES=") : NULL;
        o.fp8_tiles = ft ? atoi(ft + 15) : IR_FP8_TILES_ALL;
        cg_ctx c;
        if (emu_gen_emit(&c, m, &o, gc->T, is_fp8_op, "fp8_emu_gen", i))
            return 1;
        emu_knobs(gc->env, 1);
        const km_spec *s = &gc->s;
        int moe = s->E > 0, w16 = !strcmp(moe ? s->wdt : s->ldt, "bf16");
        /* the experts' slots a block, from the kernels' names; the
           streaming form (gv) keeps h in f32 */
        int bm = 0, h32 = 0, cvt = 0, gv8 = 0, mma = 0;
        for (int k = 0; k < c.n_kernels; k++) {
            const char *b = strstr(c.kernel_names[k], "_bm");
            int gv = strstr(c.kernel_names[k], "_gv_") != NULL || strstr(c.kernel_names[k], "_gt_");
            int tc = b && strstr(c.kernel_names[k], "_mma_w") != NULL;
            if (b && (gv || tc || strstr(c.kernel_names[k], "f8tc")))
                bm = atoi(b + 3);
            mma |= tc;
            h32 |= gv;
            gv8 += gv && strstr(c.kernel_names[k], "f8e4m3") != NULL;
            cvt += gv && strstr(c.kernel_names[k], "_cvt_") != NULL;
        }
        /* the streaming fp8 GEMMs widen by the conversion unit (sm_90, the
           generator's arch) unless the case says MOEC_MOE_GEMV_CVT=0 */
        int want_cvt = !(gc->env && strstr(gc->env, "MOEC_MOE_GEMV_CVT=0"));
        if (want_cvt ? cvt != gv8 : cvt != 0) {
            fprintf(stderr, "fp8_emu_gen: case %d: %d streaming GEMMs widen by conversion\n", i,
                    cvt);
            return 1;
        }
        /* the experts' weights in fragment tiles (ir_weight_tiled), or the
           linear's (tl_gu) */
        int tl_gu = 0, tl_dn = 0;
        for (int k = 0; k < m->n_ops; k++)
            if (m->ops[k]->kind == IR_OP_LINEAR && !moe)
                tl_gu = ir_weight_tiled(m, m->ops[k]->in[1], o.fp8_tiles);
            else if (m->ops[k]->kind == IR_OP_MOE_ROUTED) {
                const ir_op *op = m->ops[k];
                tl_gu = ir_weight_tiled(m, op->in[3], o.fp8_tiles);
                tl_dn = ir_weight_tiled(m, op->in[op->n_in - 1], o.fp8_tiles);
            }
        moec_buf_printf(&table,
                        "    {%d, \"%s%s%s %dx%d s%dx%d T=%d%s%s%s%s\", %d, %d, %d, %d, %d, %d, %d, %d, "
                        "%d, %d, %d, %d, %d, %d, %d, %d, {",
                        moe, moe ? (s->moe == KM_ROUTED_SPLIT ? "moe split" : "moe fused") : "linear",
                        w16 ? " bf16" : "", s->lact ? " silu" : "",
                        moe ? s->HID : s->LN, moe ? s->I : s->LK, s->BN, s->BK, gc->T,
                        gc->env ? " " : "", gc->env ? gc->env : "",
                        tl_gu ? (moe ? " gate_up tiled" : " tiled") : "",
                        tl_dn ? " down tiled" : "", s->LN, s->LK, s->E, s->K, s->HID, s->I, s->BN,
                        s->BK, gc->T, bm, h32, w16, s->lact, tl_gu, tl_dn, mma);
        fprintf(f, "namespace case%d {\n", i);
        int n = 0;
        for (int k = 0; k < c.n_steps; k++) {
            const ir_step *st = &c.steps[k];
            const char *name = c.kernel_names[st->kernel];
            if (!strstr(name, "f8tc") && !strstr(name, "_gv_") && !strstr(name, "_gt_") &&
                !(!strncmp(name, "moe_", 4) && strstr(name, "_mma_w")) &&
                strncmp(name, "linear_gemv_", 12) && strncmp(name, "linear_mma_", 11) &&
                strncmp(name, "linear_tc_", 10))
                continue; /* align and sum: the emulator's host side does them */
            put_kernel(f, c.src.data, name);
            /* the cluster size on the kernel's declaration line */
            char pat[320];
            snprintf(pat, sizeof pat, " %s(", name);
            const char *def = strstr(c.src.data, pat), *line = def;
            while (line > c.src.data && line[-1] != '\n')
                line--;
            const char *cd = strstr(line, "__cluster_dims__(");
            int cluster = cd && cd < def ? atoi(cd + 17) : 1;
            moec_buf_printf(&table, "%s{(void (*)())&case%d::%s, %u, %u, %u, %u, %d}", n ? ", " : "",
                            i, name, st->grid[0], st->grid[1], st->block[0], st->smem, cluster);
            n++;
        }
        fprintf(f, "} // namespace case%d\n", i);
        moec_buf_printf(&table, "}, %d},\n", n);
        if (n != (moe ? 2 : 1)) {
            fprintf(stderr, "fp8_emu_gen: case %d ran %d staged or streaming kernels\n", i, n);
            return 1;
        }
        moec_buf_free(&c.src);
        for (int k = 0; k < c.n_kernels; k++)
            free(c.kernel_names[k]);
        free(c.kernel_names);
        free(c.steps);
        ir_module_free(m);
    }
    if (table.oom)
        return 1;
    fprintf(f, "static const emu_case CASES[] = {\n%s};\n", table.data);
    moec_buf_free(&table);
    return fclose(f) == 0 ? 0 : 1;
}
