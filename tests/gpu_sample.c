/* gpu_sample.c — the device sampler (codegen/sample.c) against its CPU twin
 * (engine/sample.c, moec_sample_row) on the same rows of logits, settings,
 * penalty entries, seeds and counters. For vocabularies of DeepSeek-V3
 * (129280), Qwen3 (151936), and 1000, 50 and 7 ids, at buckets of 64 and 3
 * rows: the argmax and sampler kernels generated and compiled as a plan's
 * last two steps are, then rounds of random rows, each row with its own
 * settings (off, greedy, greedy with penalties, temperature alone, top_k,
 * top_p, min_p, all three, penalties with the filters, flat rows full of
 * ties, a NaN row, a row whose penalties overflow), launched
 *   - eagerly, and
 *   - replayed from a CUDA Graph captured once, the logits, rows and
 *     entries rewritten between replays as the runtime rewrites its inputs;
 * every row's token must be the host's (IR_SAMPLED_NONFINITE for the
 * non-finite ones): docs/SAMPLING.md says why they are equal, not merely
 * close. Its log probability must be within 1e-4 of the host's (double)
 * log-softmax, rows off left alone, and the logits the same bytes after
 * the kernel as before (the penalties undone). The sampler's time for 64
 * rows of 129280 is printed per setting (not checked). MOEC_SAMPLE_SANITIZE=1
 * (scripts/gpu_sanitize.sh) runs one round each way, of 129280 and 50 ids,
 * untimed: every setting under compute-sanitizer in minutes.
 * Without a device: "SKIP: no CUDA device", exit 0. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/cg.h"
#include "engine/sample.h"
#include "err.h"
#include "testlib.h"

#ifdef MOEC_HAVE_CUDA
#include "cuda_check.h"

#define TMAX 64
#define HIST 300 /* tokens of a row's request: prompt and output */
#define N_KINDS 12

static int g_sanitize; /* MOEC_SAMPLE_SANITIZE=1: a short run */

static const char *KIND_NAME[N_KINDS] = {
    "off",           "greedy",        "greedy+penalties", "temperature", "top_k",
    "top_p",         "min_p",         "top_k+top_p+min_p", "penalties+filters", "flat (ties)",
    "NaN row",       "overflow"};

/* The argmax and the sampler of one vocabulary and bucket, and their
 * buffers. */
typedef struct bench {
    int V, T;
    cudaLibrary_t lib;
    cudaKernel_t kern[2]; /* argmax, sample */
    unsigned grid[2], block[2];
    float *logits;
    int32_t *sampled, *drawn;
    float *logprobs;
    ir_sample_row *rows;
    ir_sample_pen *pens;
    int cap;
    void *args[2][6];
    void *vals[6];
} bench;

static ir_module *logits_module(int V)
{
    char text[512];
    snprintf(text, sizeof text,
             "module gpu_sample {\n  meta vocab_size = %d\n  input %%tokens : i32[T]\n"
             "  input %%positions : i32[T]\n  weight %%tab : f32[4, %d] = \"tab\"\n"
             "  %%logits : f32[T, %d] = embedding(%%tokens, %%tab)\n  output %%logits\n}\n",
             V, V, V);
    ir_module *m = NULL;
    T_OK(ir_module_parse(text, "gpu_sample", &m));
    return m;
}

/* Generates, compiles and loads the argmax and the sampler for V and T,
 * and allocates their buffers. */
static int bench_init(bench *b, int V, int T)
{
    memset(b, 0, sizeof *b);
    b->V = V;
    b->T = T;
    ir_module *m = logits_module(V);
    if (!m)
        return 0;
    cg_options o;
    cg_options_default(&o);
    cg_ctx c = {.m = m, .opt = &o, .T = T};
    cg_emit_prologue(&c.src);
    T_OK(cg_emit_argmax(&c, m->outputs[0]));
    T_OK(cg_emit_sample(&c, m->outputs[0]));
    cg_add_pdl_waits(&c.src);
    void *cubin = NULL;
    size_t size = 0;
    int ok = c.n_steps == 2 && !c.src.oom;
    T_CHECK(ok);
    if (ok) {
        moec_status st = cg_compile(c.src.data, "sm_90", NULL, &cubin, &size);
        T_OK(st);
        ok = st == MOEC_OK;
    }
    if (ok) {
        CK(cudaLibraryLoadData(&b->lib, cubin, NULL, NULL, 0, NULL, NULL, 0));
        for (int k = 0; k < 2; k++) {
            CK(cudaLibraryGetKernel(&b->kern[k], b->lib, c.kernel_names[c.steps[k].kernel]));
            b->grid[k] = c.steps[k].grid[0];
            b->block[k] = c.steps[k].block[0];
        }
    }
    free(cubin);
    cg_ctx_free(&c);
    ir_module_free(m);
    if (!ok)
        return 0;
    b->cap = T * HIST;
    CK(cudaMalloc((void **)&b->logits, (size_t)T * V * 4));
    CK(cudaMalloc((void **)&b->sampled, (size_t)T * 4));
    CK(cudaMalloc((void **)&b->drawn, (size_t)T * 4));
    CK(cudaMalloc((void **)&b->logprobs, (size_t)T * 4));
    CK(cudaMalloc((void **)&b->rows, (size_t)T * sizeof *b->rows));
    CK(cudaMalloc((void **)&b->pens, (size_t)b->cap * sizeof *b->pens));
    /* the arguments the plan's steps pass: argmax (logits, sampled);
       sample (logits, sampled, rows, pens, drawn, logprobs) */
    b->vals[0] = b->logits;
    b->vals[1] = b->sampled;
    b->vals[2] = b->rows;
    b->vals[3] = b->pens;
    b->vals[4] = b->drawn;
    b->vals[5] = b->logprobs;
    for (int k = 0; k < 2; k++)
        for (int a = 0; a < 6; a++)
            b->args[k][a] = &b->vals[a];
    return 1;
}

static void bench_free(bench *b)
{
    if (!b->lib)
        return;
    CK(cudaFree(b->logits));
    CK(cudaFree(b->sampled));
    CK(cudaFree(b->drawn));
    CK(cudaFree(b->logprobs));
    CK(cudaFree(b->rows));
    CK(cudaFree(b->pens));
    CK(cudaLibraryUnload(b->lib));
}

/* Launch k (0: the argmax, 1: the sampler) on stream s. */
static void launch_one(bench *b, int k, cudaStream_t s)
{
    dim3 grid = {b->grid[k], 1, 1}, block = {b->block[k], 1, 1};
    CK(cudaLaunchKernel((const void *)b->kern[k], grid, block, b->args[k], 0, s));
}

/* The two launches on stream s. */
static void launch(bench *b, cudaStream_t s)
{
    launch_one(b, 0, s);
    launch_one(b, 1, s);
}

/* ---- one round: rows, settings, host answers ------------------------------------ */

typedef struct round {
    int T, V;
    float *logits;          /* T rows */
    ir_sample_row rows[TMAX];
    ir_sample_pen *pens;    /* cap */
    int n_pen;
    int kind[TMAX];
    int32_t want[TMAX];
    float want_lp[TMAX];
} round_t;

static float frand(uint64_t *s) { return (float)(t_rand_u64(s) >> 40) * 0x1p-24f; }

/* Row r of a round: its logits, its settings of kind k, its penalty
 * entries from a random history, and the host's token and log prob. */
static void make_row(round_t *rd, moec_sampler *s, int r, int k, uint64_t *rng)
{
    int V = rd->V;
    float *row = rd->logits + (size_t)r * V;
    float scale = 0.5f + 6 * frand(rng);
    for (int i = 0; i < V; i++)
        row[i] = t_rand_normal(rng) * scale;
    for (int i = 0; i < V / 50; i++) /* ties */
        row[t_rand_u64(rng) % (uint64_t)V] = row[t_rand_u64(rng) % (uint64_t)V];
    row[t_rand_u64(rng) % (uint64_t)V] = -0.0f;
    if (k == 9)
        for (int i = 0; i < V; i++)
            row[i] = (float)(int)(row[i] * 0.5f); /* a handful of values: ties at every threshold */
    if (k == 10)
        row[t_rand_u64(rng) % (uint64_t)V] = NAN;
    moec_sampling sp = {.seed = t_rand_u64(rng), .logprob = (int)(t_rand_u64(rng) % 2)};
    if (k >= 3)
        sp.temperature = 0.1f + 1.9f * frand(rng);
    if (k == 4 || k == 7 || k == 8 || k == 9)
        sp.top_k = 1 + (int)(t_rand_u64(rng) % (uint64_t)(V < 200 ? V : 200));
    if (k == 5 || k == 7 || k == 8 || k == 9)
        sp.top_p = 0.05f + 0.9f * frand(rng);
    if (k == 6 || k == 7 || k == 8)
        sp.min_p = 0.3f * frand(rng);
    if (k == 2 || k == 8 || k == 11) {
        sp.repetition_penalty = k == 11 ? 0.05f : 0.5f + frand(rng);
        sp.presence_penalty = 4 * frand(rng) - 2;
        sp.frequency_penalty = 4 * frand(rng) - 2;
    }
    int32_t hist[HIST];
    int n_prompt = 1 + (int)(t_rand_u64(rng) % (HIST / 2));
    int n_known = n_prompt + (int)(t_rand_u64(rng) % (HIST / 2));
    for (int i = 0; i < n_known; i++)
        hist[i] = (int32_t)(t_rand_u64(rng) % (uint64_t)V);
    if (k == 11) /* a huge logit, seen: divided by 0.05 it overflows */
        row[hist[0]] = 3e38f;
    ir_sample_row *p = &rd->rows[r];
    memset(p, 0, sizeof *p);
    rd->kind[r] = k;
    if (k == 0) {
        rd->want[r] = -7; /* untouched */
        return;
    }
    moec_sample_row_init(&sp, V, (int)(t_rand_u64(rng) % 4096), p);
    int n = moec_sample_penalties(s, &sp, hist, n_prompt, n_known, rd->pens + rd->n_pen, HIST);
    p->pen_first = rd->n_pen;
    p->pen_count = n;
    rd->n_pen += n;
    rd->want[r] = moec_sample_row(s, p, rd->pens + p->pen_first, row);
    rd->want_lp[r] = rd->want[r] >= 0 && p->logprob ? moec_sample_logprob(row, V, rd->want[r]) : 0;
}

static void make_round(round_t *rd, moec_sampler *s, uint64_t *rng, int kind_shift)
{
    rd->n_pen = 0;
    for (int r = 0; r < rd->T; r++)
        make_row(rd, s, r, (r + kind_shift) % N_KINDS, rng);
}

static void upload(bench *b, const round_t *rd, cudaStream_t s)
{
    CK(cudaMemcpyAsync(b->logits, rd->logits, (size_t)rd->T * rd->V * 4, cudaMemcpyHostToDevice,
                       s));
    CK(cudaMemcpyAsync(b->rows, rd->rows, (size_t)rd->T * sizeof *rd->rows,
                       cudaMemcpyHostToDevice, s));
    if (rd->n_pen)
        CK(cudaMemcpyAsync(b->pens, rd->pens, (size_t)rd->n_pen * sizeof *rd->pens,
                           cudaMemcpyHostToDevice, s));
    int32_t poison[TMAX];
    for (int r = 0; r < TMAX; r++)
        poison[r] = -7;
    CK(cudaMemcpyAsync(b->drawn, poison, (size_t)rd->T * 4, cudaMemcpyHostToDevice, s));
    /* rows that ask for no logprob get none written: poison (NaN) what the
       check reads back, so that initcheck sees every byte copied set */
    CK(cudaMemsetAsync(b->logprobs, 0xff, (size_t)rd->T * 4, s));
}

typedef struct tally {
    int rows, same, lp_bad, logits_changed, by_kind[N_KINDS], kind_same[N_KINDS];
    double lp_worst;
} tally;

/* The device's answers to rd against the host's. */
static void check_round(bench *b, const round_t *rd, float *after, tally *t, const char *how)
{
    int32_t got[TMAX];
    float lp[TMAX];
    CK(cudaMemcpy(got, b->drawn, (size_t)rd->T * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(lp, b->logprobs, (size_t)rd->T * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(after, b->logits, (size_t)rd->T * rd->V * 4, cudaMemcpyDeviceToHost));
    t->logits_changed += memcmp(after, rd->logits, (size_t)rd->T * rd->V * 4) != 0;
    for (int r = 0; r < rd->T; r++) {
        int k = rd->kind[r], same = got[r] == rd->want[r];
        t->rows++;
        t->by_kind[k]++;
        t->kind_same[k] += same;
        t->same += same;
        if (!same && t->rows - t->same <= 5)
            fprintf(stderr, "  V=%d T=%d %s row %d (%s): device %d, host %d\n", rd->V, rd->T, how,
                    r, KIND_NAME[k], got[r], rd->want[r]);
        if (same && rd->want[r] >= 0 && rd->rows[r].logprob) {
            double d = fabs((double)lp[r] - rd->want_lp[r]);
            t->lp_worst = fmax(t->lp_worst, d);
            t->lp_bad += !(d <= 1e-4);
        }
    }
}

/* The sampler's time (the argmax's subtracted) for T rows of one kind. */
static void time_kind(bench *b, round_t *rd, moec_sampler *s, uint64_t *rng, int k, cudaStream_t st)
{
    rd->n_pen = 0;
    for (int r = 0; r < rd->T; r++)
        make_row(rd, s, r, k, rng);
    cudaEvent_t e[3];
    for (int i = 0; i < 3; i++)
        CK(cudaEventCreate(&e[i]));
    float ms_sample = 0, ms_argmax = 0;
    for (int rep = 0; rep < 2; rep++) { /* the first pass warms up */
        upload(b, rd, st);
        CK(cudaEventRecord(e[0], st));
        launch_one(b, 0, st);
        CK(cudaEventRecord(e[1], st));
        launch_one(b, 1, st);
        CK(cudaEventRecord(e[2], st));
        CK(cudaEventSynchronize(e[2]));
        CK(cudaEventElapsedTime(&ms_argmax, e[0], e[1]));
        CK(cudaEventElapsedTime(&ms_sample, e[1], e[2]));
    }
    printf("  time V=%d, %d rows of %-18s argmax %6.1f us, sampler %6.1f us\n", b->V, b->T,
           KIND_NAME[k], ms_argmax * 1e3, ms_sample * 1e3);
    for (int i = 0; i < 3; i++)
        CK(cudaEventDestroy(e[i]));
}

static void check_vocab(int V)
{
    moec_sampler s;
    T_OK(moec_sampler_init(&s, V));
    round_t rd = {.V = V};
    rd.logits = malloc((size_t)TMAX * V * 4);
    rd.pens = malloc((size_t)TMAX * HIST * sizeof *rd.pens);
    float *after = malloc((size_t)TMAX * V * 4);
    if (!rd.logits || !rd.pens || !after)
        exit(1);
    uint64_t rng = 0x5eed0000u + (uint64_t)V;
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    static const int Ts[2] = {TMAX, 3};
    for (int ti = 0; ti < 2; ti++) {
        bench b;
        if (!bench_init(&b, V, Ts[ti]))
            continue;
        rd.T = b.T;
        tally eager = {0}, graph = {0};
        int rounds = g_sanitize ? 1 : V > 10000 ? 3 : 12;
        for (int i = 0; i < rounds; i++) {
            make_round(&rd, &s, &rng, i);
            upload(&b, &rd, st);
            launch(&b, st);
            CK(cudaStreamSynchronize(st));
            check_round(&b, &rd, after, &eager, "eager");
        }
        /* one graph, captured once, replayed over rewritten inputs */
        cudaGraph_t g;
        cudaGraphExec_t ge;
        CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
        launch(&b, st);
        CK(cudaStreamEndCapture(st, &g));
        CK(cudaGraphInstantiate(&ge, g, 0));
        for (int i = 0; i < rounds; i++) {
            make_round(&rd, &s, &rng, i + 5);
            upload(&b, &rd, st);
            CK(cudaGraphLaunch(ge, st));
            CK(cudaStreamSynchronize(st));
            check_round(&b, &rd, after, &graph, "graph");
        }
        CK(cudaGraphExecDestroy(ge));
        CK(cudaGraphDestroy(g));
        for (int p = 0; p < 2; p++) {
            tally *t = p ? &graph : &eager;
            printf("V=%-6d T=%-2d %-5s %4d rows: %4d tokens as the host's (", V, b.T,
                   p ? "graph" : "eager", t->rows, t->same);
            for (int k = 0; k < N_KINDS; k++)
                printf("%s%s %d/%d", k ? ", " : "", KIND_NAME[k], t->kind_same[k], t->by_kind[k]);
            printf("); log probs within %.1e (%d past 1e-4); logits %s\n", t->lp_worst, t->lp_bad,
                   t->logits_changed ? "CHANGED" : "restored");
            T_CHECK(t->same == t->rows && t->lp_bad == 0 && t->logits_changed == 0);
        }
        if (V == 129280 && b.T == TMAX && !g_sanitize)
            for (int k = 1; k < N_KINDS - 2; k++)
                time_kind(&b, &rd, &s, &rng, k, st);
        bench_free(&b);
    }
    CK(cudaStreamDestroy(st));
    free(rd.logits);
    free(rd.pens);
    free(after);
    moec_sampler_free(&s);
}

int main(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1) {
        printf("SKIP: no CUDA device\n");
        return 0;
    }
    const char *san = getenv("MOEC_SAMPLE_SANITIZE");
    g_sanitize = san && *san && strcmp(san, "0");
    static const int vocabs[] = {129280, 151936, 1000, 50, 7};
    for (size_t i = 0; i < sizeof vocabs / sizeof *vocabs; i++)
        if (!g_sanitize || vocabs[i] == 129280 || vocabs[i] == 50)
            check_vocab(vocabs[i]);
    return t_finish("gpu_sample");
}

#else

int main(void)
{
    printf("SKIP: no CUDA device (built without the CUDA toolkit)\n");
    return 0;
}

#endif
