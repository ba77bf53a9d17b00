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
} cg_norm_rows;

static inline cg_norm_rows cg_norm_rows_of(int64_t D)
{
    cg_norm_rows l;
    l.vec = 8;
    while (l.vec > 1 && D % l.vec)
        l.vec /= 2;
    l.chunks = D / l.vec;
    l.warp_form = l.chunks <= 128;
    l.stride = l.warp_form ? 32 : (int)(l.chunks >= 1024 ? 1024 : (l.chunks + 31) / 32 * 32);
    l.nch = (int)((l.chunks + l.stride - 1) / l.stride);
    l.cache = l.nch * l.vec <= 64;
    l.wpre = !l.warp_form && l.cache && cg_env_int("MOEC_NORM_WPRE", 1, 0, 1);
    return l;
}

/* Threads per block (the kernel's launch bounds). */
static inline int cg_norm_rows_threads(const cg_norm_rows *l)
{
    return l->warp_form ? 128 : l->stride;
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
        moec_buf_printf(b,
                        "    float wpre[%d][%d];\n"
                        "#pragma unroll\n"
                        "    for (int i = 0; i < %d; i++) {\n"
                        "        const int c = threadIdx.x + i * %d;\n"
                        "        if (c < %lld)\n"
                        "            ldv<%d>(w + c * %d, wpre[i]);\n"
                        "    }\n"
                        "    moec_pdl_enter();\n",
                        l->nch, l->vec, l->nch, l->stride, (long long)l->chunks, l->vec, l->vec);
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
    else
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
                  l->warp_form ? "warp_sum" : "block_sum", (long long)D, l->nch, l->stride,
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
    s->grid[0] = (unsigned)(l->warp_form ? (rows + 3) / 4 : rows);
    s->block[0] = (unsigned)cg_norm_rows_threads(l);
}

#endif
