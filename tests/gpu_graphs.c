/* gpu_graphs.c — CUDA Graph replay and the two-stream step on every tiny
 * model in tests/data, in fp32 and bf16. One context per model and dtype
 * holds 64 sequences with a few tokens of context each; then for every
 * bucket and for batch sizes between buckets (1, 2, 3, 4, 5, 7, 8, 9, 15,
 * 16, 17, 31, 32, 33, 63, 64) the same step is run four ways — graph
 * replay and eager launches, each with the shared experts on a second
 * stream and on one — and:
 *   graph replay == eager launches, logits and sampled ids bit for bit, in
 *   both stream modes (eager twice is checked identical first, so that a
 *   difference means the graph);
 *   one stream vs two: within 1e-5 of the row's largest logit in fp32
 *   (the same kernels on the same data; only their order differs).
 * Then 10,000 replays with changing tokens, positions and batch sizes (the
 * sequences' KV caches filling, sequences restarting when full): every
 * 1000th step is rerun eagerly on the same inputs and must match the
 * replay bit for bit (no drift), every row stays finite, and the device's
 * free memory is the same before and after (no leak). Without a device:
 * "SKIP: no CUDA device", exit 0. */
#include <math.h>
#include <string.h>

#include "compiler/api_internal.h"
#include "testlib.h"
#include "timer.h"

#ifdef MOEC_HAVE_CUDA
#include <cuda_runtime_api.h>

static size_t device_free_bytes(void)
{
    size_t free_b = 0, total_b = 0;
    if (cudaFree(NULL) != cudaSuccess || cudaMemGetInfo(&free_b, &total_b) != cudaSuccess)
        return 0;
    return free_b;
}
#else
static size_t device_free_bytes(void) { return 0; }
#endif

static const char *MODELS[] = {"deepseek_v2", "deepseek_v2_qlora", "deepseek_v3", "qwen2_moe",
                               "qwen3_moe",   "deepseek_v3_fp8",   "qwen3_moe_fp8",
                               "deepseek_v32"};
static const int SIZES[] = {1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64};

#define SEQS 64
#define SEQ_LEN 96
#define REPLAYS 10000

/* Context tokens slot s holds before the checks. */
static int context_of(int s) { return 3 + s % 11; }

/* One step in a given way: graphs on or off, one stream or two. */
static moec_status step_as(moec_cuda_model *c, int graph, int single, int n, const int32_t *tok,
                           const int32_t *pos, const int32_t *slot, float *logits, int32_t *ids)
{
    graph_set_enabled(c->graphs, graph);
    rt_cuda_set_single_stream(c->cuda, single);
    moec_status st = graph_step(c->graphs, c->cuda, n, tok, pos, slot, logits, ids);
    graph_set_enabled(c->graphs, 1);
    rt_cuda_set_single_stream(c->cuda, 0);
    return st;
}

/* Every slot gets its context, eagerly, up to 64 tokens a step. */
static void prefill(moec_cuda_model *c, int V, uint64_t *rng)
{
    int32_t tok[64], pos[64], slot[64];
    int n = 0;
    for (int s = 0; s < SEQS; s++)
        for (int p = 0; p < context_of(s); p++) {
            tok[n] = (int32_t)(t_rand_u64(rng) % (uint64_t)V);
            pos[n] = p;
            slot[n] = s;
            if (++n == 64) {
                T_OK(step_as(c, 0, 0, n, tok, pos, slot, NULL, NULL));
                n = 0;
            }
        }
    if (n)
        T_OK(step_as(c, 0, 0, n, tok, pos, slot, NULL, NULL));
}

/* The four ways agree on every batch size. */
static void check_ways(const char *name, const char *dt, moec_cuda_model *c, int V, uint64_t *rng)
{
    size_t cap = (size_t)64 * V;
    float *L[5];
    int32_t ids[5][64];
    for (int k = 0; k < 5; k++)
        L[k] = malloc(cap * sizeof(float));
    int graph_same = 1, eager_same = 1, finite = 1;
    double worst_single = 0;
    for (size_t i = 0; i < sizeof SIZES / sizeof *SIZES; i++) {
        int n = SIZES[i];
        if (n > rt_cuda_max_tokens(c->cuda))
            continue;
        int32_t tok[64], pos[64], slot[64];
        for (int k = 0; k < n; k++) {
            tok[k] = (int32_t)(t_rand_u64(rng) % (uint64_t)V);
            slot[k] = k;
            pos[k] = context_of(k); /* rewritten with the same values by every way */
        }
        /* 0: eager dual, 1: eager dual again, 2: graph dual, 3: eager single, 4: graph single */
        T_OK(step_as(c, 0, 0, n, tok, pos, slot, L[0], ids[0]));
        T_OK(step_as(c, 0, 0, n, tok, pos, slot, L[1], ids[1]));
        T_OK(step_as(c, 1, 0, n, tok, pos, slot, L[2], ids[2]));
        T_OK(step_as(c, 0, 1, n, tok, pos, slot, L[3], ids[3]));
        T_OK(step_as(c, 1, 1, n, tok, pos, slot, L[4], ids[4]));
        size_t bytes = (size_t)n * V * sizeof(float);
        int e = !memcmp(L[0], L[1], bytes) && !memcmp(ids[0], ids[1], n * sizeof(int32_t));
        int g = !memcmp(L[0], L[2], bytes) && !memcmp(ids[0], ids[2], n * sizeof(int32_t)) &&
                !memcmp(L[3], L[4], bytes) && !memcmp(ids[3], ids[4], n * sizeof(int32_t));
        if (!g)
            fprintf(stderr, "%s %s: batch %d: graph replay differs from eager launches\n", name, dt,
                    n);
        eager_same &= e;
        graph_same &= g;
        for (int k = 0; k < 5; k++)
            finite &= t_all_finite(L[k], (size_t)n * V);
        for (int r = 0; r < n; r++)
            worst_single = fmax(worst_single, t_row_error(L[3] + (size_t)r * V, L[0] + (size_t)r * V, V));
    }
    printf("%-18s %s: batch sizes 1..64: eager twice %s; graph vs eager %s; one stream vs two: "
           "max row error %.3g\n",
           name, dt, eager_same ? "identical" : "DIFFER", graph_same ? "bit-identical" : "DIFFER",
           worst_single);
    T_CHECK(eager_same);
    T_CHECK(graph_same);
    T_CHECK(finite);
    if (!strcmp(dt, "fp32"))
        T_CHECK(worst_single <= 1e-5);
    for (int k = 0; k < 5; k++)
        free(L[k]);
}

/* REPLAYS graph steps with changing inputs; every 1000th also eagerly. */
static void check_replays(const char *name, const char *dt, moec_cuda_model *c, int V, uint64_t *rng)
{
    int len[SEQS];
    for (int s = 0; s < SEQS; s++)
        len[s] = context_of(s);
    int tmax = rt_cuda_max_tokens(c->cuda) < SEQS ? rt_cuda_max_tokens(c->cuda) : SEQS;
    float *a = malloc((size_t)tmax * V * sizeof *a), *b = malloc((size_t)tmax * V * sizeof *b);
    int32_t ib[64];
    size_t free_before = device_free_bytes();
    int drift = 0, finite = 1, failed = 0;
    for (int it = 0; it < REPLAYS && !failed; it++) {
        int n = 1 + (int)(t_rand_u64(rng) % (uint64_t)tmax);
        int first = (int)(t_rand_u64(rng) % (uint64_t)SEQS);
        int32_t tok[64], pos[64], slot[64];
        for (int k = 0; k < n; k++) {
            int s = (first + k) % SEQS;
            if (len[s] == SEQ_LEN)
                len[s] = 0; /* a new sequence in this slot */
            tok[k] = (int32_t)(t_rand_u64(rng) % (uint64_t)V);
            pos[k] = len[s]++;
            slot[k] = s;
        }
        int check = it % 1000 == 999;
        moec_status st = step_as(c, 1, 0, n, tok, pos, slot, check ? a : NULL, NULL);
        if (st == MOEC_OK && check) {
            st = step_as(c, 0, 0, n, tok, pos, slot, b, ib);
            drift += memcmp(a, b, (size_t)n * V * sizeof *a) != 0;
            finite &= t_all_finite(a, (size_t)n * V);
        }
        if (st != MOEC_OK) {
            T_OK(st);
            failed = 1;
        }
    }
    size_t free_after = device_free_bytes();
    printf("%-18s %s: %d replays with changing inputs: %d of %d checks differ from eager; device "
           "free memory %zu -> %zu bytes\n",
           name, dt, REPLAYS, drift, REPLAYS / 1000, free_before, free_after);
    T_CHECK(!failed);
    T_CHECK(drift == 0);
    T_CHECK(finite);
    T_CHECK(free_before == free_after);
    free(a);
    free(b);
}

static void check_model(const char *name, ir_dtype dt)
{
    const char *dts = dt == IR_DTYPE_F32 ? "fp32" : "bf16";
    const char *dir;
    moec_model_t *m = t_open_tiny(name, &dir);
    if (!m)
        return;
    int V = moec_model_vocab_size(m);
    moec_cuda_opts o = {.max_seqs = SEQS, .max_seq_len = SEQ_LEN, .eager = 1};
    moec_cuda_model g;
    moec_status st = moec_cuda_model_init(m, dir, dt, &o, &g);
    T_OK(st);
    if (st == MOEC_OK) {
        uint64_t rng = 0x5EEDull + (uint64_t)dt;
        prefill(&g, V, &rng);
        double t0 = moec_now_s();
        T_OK(graph_capture(g.graphs));
        double t_dual = moec_now_s() - t0;
        rt_cuda_set_single_stream(g.cuda, 1);
        t0 = moec_now_s();
        T_OK(graph_capture(g.graphs));
        double t_single = moec_now_s() - t0;
        T_CHECK(graph_captured(g.graphs));
        rt_cuda_set_single_stream(g.cuda, 0);
        T_CHECK(graph_captured(g.graphs));
        printf("%-18s %s: captured every bucket in %.3f s (two streams), %.3f s (one)\n", name,
               dts, t_dual, t_single);
        check_ways(name, dts, &g, V, &rng);
        check_replays(name, dts, &g, V, &rng);
    }
    moec_cuda_model_free(&g);
    moec_model_free(m);
}

int main(void)
{
    int n = 0;
    if (moec_cuda_device_count(&n) != MOEC_OK || n < 1) {
        printf("SKIP: no CUDA device (%s)\n", moec_last_error());
        return 0;
    }
    for (size_t i = 0; i < sizeof MODELS / sizeof *MODELS; i++) {
        check_model(MODELS[i], IR_DTYPE_F32);
        check_model(MODELS[i], IR_DTYPE_BF16);
    }
    return t_finish("gpu_graphs");
}
