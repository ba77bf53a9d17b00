/* norm_rows.h — the row layout and kernel text that the two RMSNorm
 * emitters (codegen/rms_norm.c, codegen/add_rms_norm.c) share: a row of D
 * in chunks of `vec` elements, one warp per row (four rows to a block) for
 * short rows, one block per row for long ones, and the row's share kept in
 * registers between the sum of squares and the scaling unless it is large.
 * Internal to codegen; static inline so that it needs no source file. */
#ifndef MOEC_CG_NORM_ROWS_H
#define MOEC_CG_NORM_ROWS_H

#include <stdio.h>

#include "codegen/cg.h"

typedef struct cg_norm_rows {
    int vec;          /* elements per chunk: the widest of 8, 4, 2, 1 dividing D */
    int64_t chunks;   /* D / vec */
    int warp_form;    /* one warp per row */
    int stride;       /* threads over a row */
    int nch;          /* chunks per thread */
    int cache;        /* the thread's share stays in registers */
    int wpre;         /* the norm's weight read into registers before the wait */
    int cl;           /* blocks a row (a thread block cluster; 1: one block) */
} cg_norm_rows;

/* What follows from the threads over a row (stride): chunks a thread,
   whether its share stays in registers, whether the weight is read
   before the wait. */
static inline void cg_norm_rows_fit(cg_norm_rows *l)
{
    l->nch = (int)((l->chunks + l->stride - 1) / l->stride);
    l->cache = l->nch * l->vec <= 64;
    l->wpre = !l->warp_form && l->cache && cg_env_int("MOEC_NORM_WPRE", 1, 0, 1);
}

static inline cg_norm_rows cg_norm_rows_of(int64_t D)
{
    cg_norm_rows l;
    l.vec = 8;
    while (l.vec > 1 && D % l.vec)
        l.vec /= 2;
    l.chunks = D / l.vec;
    l.warp_form = l.chunks <= 128;
    l.stride = l.warp_form ? 32 : (int)(l.chunks >= 1024 ? 1024 : (l.chunks + 31) / 32 * 32);
    l.cl = 1;
    cg_norm_rows_fit(&l);
    return l;
}

/* The cluster form of the block form: each row over a thread block cluster
 * of cl blocks (2 to 8), each block a cl-th of the row's chunks (threads in
 * 32s), the sum of squares reduced over the cluster's shared memory
 * (moec_cluster_sum). A row's loads then come from cl SMs, not one: the
 * routed sum's K rows of fp32 are K times the row's bytes. Not for the
 * warp form. (Rounding the blocks' threads up to 32s may leave the last
 * block without chunks: it adds 0 to the sum.) */
static inline void cg_norm_rows_cluster(cg_norm_rows *l, int cl)
{
    if (l->warp_form || cl <= 1)
        return;
    if (cl > 8)
        cl = 8;
    long long per = (l->chunks + cl - 1) / cl;
    int nt = (int)((per + 31) / 32 * 32);
    if (nt > 1024)
        return;
    l->cl = cl;
    l->stride = nt * cl;
    cg_norm_rows_fit(l);
}

/* Threads per block (the kernel's launch bounds). */
static inline int cg_norm_rows_threads(const cg_norm_rows *l)
{
    return l->warp_form ? 128 : l->stride / l->cl;
}

/* The kernel's attributes before its name: the cluster's dimensions in the
 * cluster form, else nothing. */
static inline void cg_norm_rows_attrs(char *buf, size_t cap, const cg_norm_rows *l)
{
    if (l->cl > 1)
        snprintf(buf, cap, "__cluster_dims__(%d, 1, 1) ", l->cl);
    else if (cap)
        buf[0] = 0;
}

/* The thread's place in its row's threads: its index in the block, or in
   the cluster form the block's rank before it. */
static inline void cg_norm_rows_lane(char *buf, size_t cap, const cg_norm_rows *l)
{
    if (l->cl > 1)
        snprintf(buf, cap, "((int)(blockIdx.x %% %dU) * %d + (int)threadIdx.x)", l->cl,
                 cg_norm_rows_threads(l));
    else
        snprintf(buf, cap, "threadIdx.x");
}

/* Before the wait: in the block form with the share in registers (wpre),
 * every thread reads its share of the norm's weight w into wpre (a
 * constant: no kernel before it writes it), so that the scaling after the
 * sum of squares waits for no memory (H200, 2026-11-29: one L2 round trip
 * fewer in every long row's norm; MOEC_NORM_WPRE=0 at codegen keeps the
 * prefetch, for A/Bs); else (cg_emit_prefetch) block 0 asks L2 for w, D
 * elements every row reads (at most the cap). */
static inline void cg_norm_rows_prefetch(const cg_ctx *c, moec_buf *b, const cg_norm_rows *l,
                                         int64_t D)
{
    if (l->wpre) {
        char lane[96];
        cg_norm_rows_lane(lane, sizeof lane, l);
        moec_buf_printf(b,
                        "    float wpre[%d][%d];\n"
                        "#pragma unroll\n"
                        "    for (int i = 0; i < %d; i++) {\n"
                        "        const int c = %s + i * %d;\n"
                        "        if (c < %lld)\n"
                        "            ldv<%d>(w + c * %d, wpre[i]);\n"
                        "    }\n"
                        "    moec_pdl_enter();\n",
                        l->nch, l->vec, l->nch, lane, l->stride, (long long)l->chunks, l->vec,
                        l->vec);
        return;
    }
    char lines[256];
    snprintf(lines, sizeof lines,
             "        const long long wb = %lldLL * (long long)sizeof(*w);\n"
             "        if (blockIdx.x == 0)\n"
             "            moec_prefetch_l2(w, (unsigned long long)(wb < PF_CAP ? wb : PF_CAP));\n",
             (long long)D);
    cg_emit_prefetch(b, cg_prefetch_bytes(c), lines);
}

/* The kernel's first lines after it: `row` and `lane` of this thread (rows
 * in all). */
static inline void cg_norm_rows_begin(moec_buf *b, const cg_norm_rows *l, long long rows)
{
    if (l->warp_form)
        moec_buf_printf(b,
                      "    const int row = blockIdx.x * 4 + (threadIdx.x >> 5);\n"
                      "    const int lane = threadIdx.x & 31;\n"
                      "    if (row >= %lld)\n"
                      "        return;\n",
                      rows);
    else if (l->cl > 1) {
        char lane[96];
        cg_norm_rows_lane(lane, sizeof lane, l);
        moec_buf_printf(b,
                        "    const int row = blockIdx.x / %dU;\n"
                        "    const int lane = %s;\n",
                        l->cl, lane);
    } else
        moec_buf_printf(b, "    const int row = blockIdx.x;\n"
                         "    const int lane = threadIdx.x;\n");
}

/* The rest of the kernel, from inside the first pass's innermost loop over
 * t[j] (the chunk's values): the sum of squares, then y = w * t * inv for
 * every chunk, rereading the chunk from `reread` (a row pointer) when it is
 * not kept in registers; yr and w are the output row and weight. */
static inline void cg_norm_rows_finish(moec_buf *b, const cg_norm_rows *l, int64_t D,
                                       const char *reread)
{
    int vec = l->vec;
    char cl_sum[40];
    snprintf(cl_sum, sizeof cl_sum, "moec_cluster_sum<%d>", l->cl);
    moec_buf_printf(b,
                  "                ss += t[j] * t[j];\n"
                  "%s"
                  "            }\n"
                  "        }\n"
                  "    }\n"
                  "    ss = %s(ss);\n"
                  "    const float inv = 1.0f / sqrtf(ss / %lld.0f + eps);\n"
                  "#pragma unroll\n"
                  "    for (int i = 0; i < %d; i++) {\n"
                  "        const int c = lane + i * %d;\n"
                  "        if (c < %lld) {\n"
                  "            float t[%d], wv[%d];\n",
                  l->cache ? "                v[i][j] = t[j];\n" : "",
                  l->warp_form ? "warp_sum" : l->cl > 1 ? cl_sum : "block_sum", (long long)D,
                  l->nch, l->stride,
                  (long long)l->chunks, vec, vec);
    if (l->cache)
        moec_buf_printf(b,
                      "#pragma unroll\n"
                      "            for (int j = 0; j < %d; j++)\n"
                      "                t[j] = v[i][j];\n",
                      vec);
    else
        moec_buf_printf(b, "            ldv<%d>(%s + c * %d, t);\n", vec, reread, vec);
    if (l->wpre)
        moec_buf_printf(b,
                        "#pragma unroll\n"
                        "            for (int j = 0; j < %d; j++)\n"
                        "                wv[j] = wpre[i][j];\n",
                        vec);
    else
        moec_buf_printf(b, "            ldv<%d>(w + c * %d, wv);\n", vec, vec);
    moec_buf_printf(b,
                  "#pragma unroll\n"
                  "            for (int j = 0; j < %d; j++)\n"
                  "                t[j] = wv[j] * (t[j] * inv);\n"
                  "            stv<%d>(yr + c * %d, t);\n"
                  "        }\n"
                  "    }\n"
                  "}\n\n",
                  vec, vec, vec);
}

/* The launch of a kernel over `rows` rows. */
static inline void cg_norm_rows_launch(ir_step *s, const cg_norm_rows *l, long long rows)
{
    s->grid[0] = (unsigned)(l->warp_form ? (rows + 3) / 4 : rows * l->cl);
    s->block[0] = (unsigned)cg_norm_rows_threads(l);
}

#endif
