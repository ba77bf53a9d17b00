/* gpu_allreduce.c — the one-shot all-reduce (runtime/cuda_oneshot.c, its
 * kernel codegen/allreduce_oneshot.c) on ONE GPU: N "ranks" that all live
 * on the same device, each with its own stream and buffers, run at once
 * (2 and 4 ranks; bf16 and f32; 1, 7 and 64 tokens of hidden 2048 and
 * 7168), every rank's result checked bit for bit against the sum on the
 * host (fp32, in rank order, then rounded as the device stores it):
 *   eager: three calls in a row, new inputs each time (the epochs advance)
 *   CUDA Graphs: each rank's call captured once and replayed three times
 *   with new inputs (the epoch lives on the device, not in the arguments)
 * Then a rank that never comes: its peer gives up after the timeout with
 * an error naming it, and an aborted group's waiting rank stops at once.
 *
 * `gpu_allreduce bench` times NCCL against the one-shot all-reduce over
 * every GPU of the machine (a thread each, 20 calls per CUDA Graph):
 * 1..64 tokens of hidden 2048 and 7168 in bf16, the microseconds per
 * all-reduce of each (issue 14's two-GPU run). Without a device: "SKIP: no
 * CUDA device", exit 0. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "codegen/cg.h"
#include "testlib.h"

#ifdef MOEC_HAVE_CUDA
#include "runtime/cuda_internal.h"

#define MAX_RANKS 8

/* The one-shot kernel over `ranks` in dt, compiled for this GPU. */
static cudaKernel_t load_kernel(int ranks, ir_dtype dt, cudaLibrary_t *lib)
{
    int major = 0, minor = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0);
    char arch[16], name[96];
    snprintf(arch, sizeof arch, "sm_%d%d", major, minor);
    moec_buf src = {0};
    cg_emit_prologue(&src);
    cg_oneshot_source(&src, ranks, dt);
    void *cubin = NULL;
    size_t n = 0;
    cudaKernel_t k = NULL;
    *lib = NULL;
    T_OK(cg_compile(src.data, arch, NULL, &cubin, &n));
    moec_buf_free(&src);
    if (!cubin)
        return NULL;
    ir_oneshot_kernel_name(name, sizeof name, ranks, dt);
    T_OK(CK(cudaLibraryLoadData(lib, cubin, NULL, NULL, 0, NULL, NULL, 0), "loading"));
    if (*lib)
        T_OK(CK(cudaLibraryGetKernel(&k, *lib, name), name));
    free(cubin);
    return k;
}

/* x[r] for every rank: the floats, their stored form (bf16 bits or f32) */
typedef struct case_bufs {
    int R;
    ir_dtype dt;
    size_t count;
    cudaStream_t s[MAX_RANKS];
    void *x[MAX_RANKS], *y[MAX_RANKS];
    float *host[MAX_RANKS];
    void *stored, *got;
} case_bufs;

/* The value element i of a stored buffer holds. */
static float stored_at(const void *p, ir_dtype dt, size_t i)
{
    if (dt == IR_DTYPE_F32)
        return ((const float *)p)[i];
    uint32_t u = (uint32_t)((const uint16_t *)p)[i] << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static void store(const float *src, void *dst, ir_dtype dt, size_t n)
{
    if (dt == IR_DTYPE_F32)
        memcpy(dst, src, n * sizeof *src);
    else
        rt_cuda_to_bf16(src, dst, n);
}

/* New inputs on every rank, uploaded. */
static void fill(case_bufs *b, uint64_t *seed)
{
    size_t esize = ir_dtype_size(b->dt);
    for (int r = 0; r < b->R; r++) {
        for (size_t i = 0; i < b->count; i++)
            b->host[r][i] = (float)((double)(t_rand_u64(seed) % 20001) / 1000.0 - 10.0);
        store(b->host[r], b->stored, b->dt, b->count);
        /* what the device reads: the stored values */
        for (size_t i = 0; i < b->count; i++)
            b->host[r][i] = stored_at(b->stored, b->dt, i);
        T_OK(CK(cudaMemcpy(b->x[r], b->stored, b->count * esize, cudaMemcpyHostToDevice), "x"));
        T_OK(CK(cudaMemset(b->y[r], 0xff, b->count * esize), "y"));
    }
    /* the ranks' streams do not wait for the legacy stream's memsets */
    T_OK(CK(cudaDeviceSynchronize(), "fill"));
}

/* Every rank's y against the host's sum, bit for bit; 1 when all agree. */
static int check_sum(case_bufs *b, const char *what)
{
    size_t esize = ir_dtype_size(b->dt);
    float *sum = malloc(b->count * sizeof *sum);
    void *want = malloc(b->count * esize);
    int ok = sum && want;
    for (size_t i = 0; ok && i < b->count; i++) {
        float acc = 0.0f;
        for (int r = 0; r < b->R; r++)
            acc += b->host[r][i];
        sum[i] = acc;
    }
    if (ok)
        store(sum, want, b->dt, b->count);
    for (int r = 0; ok && r < b->R; r++) {
        T_OK(CK(cudaMemcpy(b->got, b->y[r], b->count * esize, cudaMemcpyDeviceToHost), "y"));
        for (size_t i = 0; i < b->count; i++)
            if (memcmp((char *)b->got + i * esize, (char *)want + i * esize, esize)) {
                fprintf(stderr, "%s: rank %d element %zu: %g, want %g\n", what, r, i,
                        stored_at(b->got, b->dt, i), stored_at(want, b->dt, i));
                ok = 0;
                break;
            }
    }
    free(sum);
    free(want);
    T_CHECK(ok);
    return ok;
}

static void run_all(case_bufs *b, rt_oneshot *o, cudaKernel_t k)
{
    for (int r = 0; r < b->R; r++)
        T_OK(rt_oneshot_run(o, r, k, b->x[r], b->y[r], b->count, b->dt, b->s[r], "a call"));
}

static void sync_all(case_bufs *b)
{
    for (int r = 0; r < b->R; r++)
        T_OK(CK(cudaStreamSynchronize(b->s[r]), "sync"));
}

/* R ranks on GPU 0 summing tokens x hidden of dt, eager then replayed. */
static void check_case(int R, ir_dtype dt, int tokens, int hidden, cudaKernel_t k)
{
    int devs[MAX_RANKS] = {0};
    rt_oneshot *o = NULL;
    T_OK(rt_oneshot_init(R, devs, (size_t)1 << 20, &o));
    case_bufs b = {.R = R, .dt = dt, .count = (size_t)tokens * (size_t)hidden};
    size_t esize = ir_dtype_size(dt);
    if (!o || b.count * esize > rt_oneshot_max_bytes(o)) {
        rt_oneshot_free(o);
        return;
    }
    b.stored = malloc(b.count * esize);
    b.got = malloc(b.count * esize);
    for (int r = 0; r < R; r++) {
        T_OK(CK(cudaStreamCreateWithFlags(&b.s[r], cudaStreamNonBlocking), "stream"));
        T_OK(CK(cudaMalloc(&b.x[r], b.count * esize), "x"));
        T_OK(CK(cudaMalloc(&b.y[r], b.count * esize), "y"));
        b.host[r] = malloc(b.count * sizeof(float));
    }
    uint64_t seed = 99 + (uint64_t)R * 1000 + (uint64_t)tokens * 7 + (uint64_t)hidden;
    char what[128];
    int ok = 1;
    for (int round = 0; round < 3; round++) {
        fill(&b, &seed);
        run_all(&b, o, k);
        sync_all(&b);
        T_OK(rt_oneshot_error(o, "eager"));
        snprintf(what, sizeof what, "%d ranks %s %dx%d eager call %d", R, ir_dtype_name(dt),
                 tokens, hidden, round);
        ok &= check_sum(&b, what);
    }
    cudaGraphExec_t exec[MAX_RANKS] = {0};
    for (int r = 0; r < R; r++) {
        cudaGraph_t g = NULL;
        T_OK(CK(cudaStreamBeginCapture(b.s[r], cudaStreamCaptureModeThreadLocal), "capture"));
        T_OK(rt_oneshot_run(o, r, k, b.x[r], b.y[r], b.count, dt, b.s[r], "captured"));
        T_OK(CK(cudaStreamEndCapture(b.s[r], &g), "capture"));
        T_OK(CK(cudaGraphInstantiate(&exec[r], g, 0), "instantiate"));
        cudaGraphDestroy(g);
    }
    for (int round = 0; round < 3; round++) {
        fill(&b, &seed);
        for (int r = 0; r < R; r++)
            T_OK(CK(cudaGraphLaunch(exec[r], b.s[r]), "replay"));
        sync_all(&b);
        T_OK(rt_oneshot_error(o, "replayed"));
        snprintf(what, sizeof what, "%d ranks %s %dx%d graph replay %d", R, ir_dtype_name(dt),
                 tokens, hidden, round);
        ok &= check_sum(&b, what);
    }
    printf("one-shot all-reduce, %d ranks on one GPU, %-4s %2d x %4d: 3 eager calls and 3 graph "
           "replays %s\n",
           R, ir_dtype_name(dt), tokens, hidden, ok ? "equal the host's sum, bit for bit" : "WRONG");
    for (int r = 0; r < R; r++) {
        cudaGraphExecDestroy(exec[r]);
        cudaFree(b.x[r]);
        cudaFree(b.y[r]);
        cudaStreamDestroy(b.s[r]);
        free(b.host[r]);
    }
    free(b.stored);
    free(b.got);
    rt_oneshot_free(o);
}

/* Rank 1 never calls: rank 0 gives up after the timeout (or, aborted,
 * at once), its error naming why; y untouched. */
static void check_missing_rank(cudaKernel_t k, int abort_it)
{
    int devs[2] = {0, 0};
    rt_oneshot *o = NULL;
    T_OK(rt_oneshot_init(2, devs, 1 << 16, &o));
    if (!o)
        return;
    rt_oneshot_set_timeout(o, abort_it ? 60 : 0.2);
    void *x = NULL, *y = NULL;
    cudaStream_t s = NULL;
    T_OK(CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream"));
    T_OK(CK(cudaMalloc(&x, 4096 * sizeof(float)), "x"));
    T_OK(CK(cudaMalloc(&y, 4096 * sizeof(float)), "y"));
    T_OK(rt_oneshot_run(o, 0, k, x, y, 4096, IR_DTYPE_F32, s, "rank 0 alone"));
    if (abort_it) {
        usleep(100 * 1000);
        rt_oneshot_abort(o);
    }
    T_OK(CK(cudaStreamSynchronize(s), "sync"));
    if (abort_it)
        T_ERR(rt_oneshot_error(o, "a step"), MOEC_ERR_CUDA,
              "a step: the one-shot all-reduce stopped waiting for its peers: the group was "
              "aborted");
    else
        T_ERR(rt_oneshot_error(o, "a step"), MOEC_ERR_CUDA,
              "a step: the one-shot all-reduce waited 0.2 s for a peer rank that never flagged "
              "its part (a rank failed or is not running this step)");
    printf("one-shot all-reduce, a rank missing: %s\n",
           abort_it ? "the aborted group's waiting rank stopped" : "its peer gave up after 0.2 s");
    cudaFree(x);
    cudaFree(y);
    cudaStreamDestroy(s);
    rt_oneshot_free(o);
}

/* ---- bench: NCCL against the one-shot, a thread per GPU ---------------------- */

typedef struct bench_rank {
    int r, R, oneshot;
    rt_comm *comm;
    rt_oneshot *o;
    cudaKernel_t k;
    size_t count;
    pthread_barrier_t *bar;
    int *failed; /* shared: some rank's setup failed, so none times */
    double us;
    moec_status st;
} bench_rank;

#define BENCH_CALLS 20
#define BENCH_LAUNCHES 20

/* What one rank's bench holds. */
typedef struct bench_res {
    void *x, *y;
    cudaStream_t s;
    cudaGraph_t g;
    cudaGraphExec_t exec;
    cudaEvent_t e0, e1;
} bench_res;

/* Rank b's buffers and its graph of BENCH_CALLS all-reduces, warmed up. */
static moec_status bench_setup(bench_rank *b, bench_res *q)
{
    const char *where = "bench setup";
    size_t bytes = b->count * 2;
    ir_coll coll = {.op = IR_OP_ALL_REDUCE, .dtype = IR_DTYPE_BF16, .count = (int64_t)b->count,
                    .ranks = b->R};
    MOEC_TRY(CK(cudaSetDevice(b->r), where));
    MOEC_TRY(CK(cudaStreamCreateWithFlags(&q->s, cudaStreamNonBlocking), where));
    MOEC_TRY(CK(cudaMalloc(&q->x, bytes), where));
    MOEC_TRY(CK(cudaMalloc(&q->y, bytes), where));
    MOEC_TRY(CK(cudaMemset(q->x, 0, bytes), where));
    MOEC_TRY(CK(cudaEventCreate(&q->e0), where));
    MOEC_TRY(CK(cudaEventCreate(&q->e1), where));
    MOEC_TRY(CK(cudaStreamBeginCapture(q->s, cudaStreamCaptureModeThreadLocal), where));
    moec_status st = MOEC_OK;
    for (int i = 0; i < BENCH_CALLS && st == MOEC_OK; i++)
        st = b->oneshot ? rt_oneshot_run(b->o, b->r, b->k, q->x, q->y, b->count, IR_DTYPE_BF16, q->s,
                                         where)
                        : rt_comm_run(b->comm, &coll, NULL, q->x, q->y, q->s, where);
    /* the capture ended whatever happened, so that the stream is usable */
    moec_status end = CK(cudaStreamEndCapture(q->s, &q->g), where);
    MOEC_TRY(st);
    MOEC_TRY(end);
    return CK(cudaGraphInstantiate(&q->exec, q->g, 0), where);
}

static moec_status bench_warm(bench_rank *b, bench_res *q)
{
    (void)b;
    for (int i = 0; i < 3; i++)
        MOEC_TRY(CK(cudaGraphLaunch(q->exec, q->s), "bench warm-up"));
    return CK(cudaStreamSynchronize(q->s), "bench warm-up");
}

static moec_status bench_timed(bench_rank *b, bench_res *q)
{
    const char *where = "bench";
    MOEC_TRY(CK(cudaEventRecord(q->e0, q->s), where));
    for (int i = 0; i < BENCH_LAUNCHES; i++)
        MOEC_TRY(CK(cudaGraphLaunch(q->exec, q->s), where));
    MOEC_TRY(CK(cudaEventRecord(q->e1, q->s), where));
    MOEC_TRY(CK(cudaEventSynchronize(q->e1), where));
    float ms = 0;
    MOEC_TRY(CK(cudaEventElapsedTime(&ms, q->e0, q->e1), where));
    b->us = 1e3 * ms / (BENCH_CALLS * BENCH_LAUNCHES);
    return b->oneshot ? rt_oneshot_error(b->o, where) : MOEC_OK;
}

/* One part of a rank's bench, run only while no rank has failed; then every
 * rank meets at the barrier whatever happened (a rank that left early would
 * keep the others waiting there, or in a collective, for ever). */
static void bench_part(bench_rank *b, bench_res *q, moec_status (*part)(bench_rank *, bench_res *))
{
    if (b->st == MOEC_OK && !__atomic_load_n(b->failed, __ATOMIC_SEQ_CST)) {
        b->st = part(b, q);
        if (b->st != MOEC_OK) {
            fprintf(stderr, "rank %d: %s\n", b->r, moec_last_error());
            __atomic_store_n(b->failed, 1, __ATOMIC_SEQ_CST);
        }
    }
    pthread_barrier_wait(b->bar);
}

/* One rank: its graph, then the warm-up replays (collectives: every rank
 * at once, and only once every rank has its graph), then the timed ones. */
static void *bench_main(void *arg)
{
    bench_rank *b = arg;
    bench_res q = {0};
    b->st = MOEC_OK;
    bench_part(b, &q, bench_setup);
    bench_part(b, &q, bench_warm);
    bench_part(b, &q, bench_timed);
    if (b->st == MOEC_OK && __atomic_load_n(b->failed, __ATOMIC_SEQ_CST))
        b->st = MOEC_ERR(MOEC_ERR_CUDA, "bench: another rank failed");
    if (q.exec)
        cudaGraphExecDestroy(q.exec);
    if (q.g)
        cudaGraphDestroy(q.g);
    if (q.e0)
        cudaEventDestroy(q.e0);
    if (q.e1)
        cudaEventDestroy(q.e1);
    cudaFree(q.x);
    cudaFree(q.y);
    if (q.s)
        cudaStreamDestroy(q.s);
    return NULL;
}

/* The slowest rank's microseconds per all-reduce of count bf16 elements. */
static double bench_time(int R, rt_comm **comms, rt_oneshot *o, cudaKernel_t k, int oneshot,
                         size_t count)
{
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, (unsigned)R);
    bench_rank b[MAX_RANKS];
    pthread_t th[MAX_RANKS];
    int failed = 0;
    for (int r = 0; r < R; r++) {
        b[r] = (bench_rank){.r = r, .R = R, .oneshot = oneshot, .comm = comms[r], .o = o, .k = k,
                            .count = count, .bar = &bar, .failed = &failed};
        pthread_create(&th[r], NULL, bench_main, &b[r]);
    }
    double us = 0;
    for (int r = 0; r < R; r++) {
        pthread_join(th[r], NULL);
        us = b[r].st != MOEC_OK ? -1 : us < 0 ? us : b[r].us > us ? b[r].us : us;
    }
    pthread_barrier_destroy(&bar);
    return us;
}

static int bench(void)
{
    int R = 0;
    T_OK(moec_cuda_device_count(&R));
    R = R > MAX_RANKS ? MAX_RANKS : R;
    int devs[MAX_RANKS];
    for (int r = 0; r < R; r++)
        devs[r] = r;
    setenv("MOEC_ALLREDUCE", "nccl", 1); /* the communicators without their own one-shot */
    rt_comm *comms[MAX_RANKS] = {0};
    rt_oneshot *o = NULL;
    cudaLibrary_t lib = NULL;
    T_OK(rt_comm_init_all(R, devs, comms));
    T_OK(rt_oneshot_init(R, devs, (size_t)1 << 20, &o));
    cudaKernel_t k = load_kernel(R, IR_DTYPE_BF16, &lib);
    if (!comms[0] || !o || !k)
        return t_finish("gpu_allreduce bench");
    char dev[256] = "";
    struct cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess)
        snprintf(dev, sizeof dev, "%s", prop.name);
    printf("all-reduce of bf16 over %d GPU%s (%s), CUDA Graphs of %d calls, the slowest rank's "
           "time per call\n",
           R, R == 1 ? "" : "s", dev, BENCH_CALLS);
    printf("%7s %7s %9s %9s %11s %8s\n", "tokens", "hidden", "bytes", "nccl_us", "oneshot_us",
           "speedup");
    static const int hidden[] = {2048, 7168};
    static const int tokens[] = {1, 2, 4, 8, 16, 32, 64};
    for (size_t h = 0; h < 2; h++)
        for (size_t t = 0; t < sizeof tokens / sizeof *tokens; t++) {
            size_t count = (size_t)tokens[t] * (size_t)hidden[h];
            double nccl = bench_time(R, comms, o, k, 0, count);
            double one = count * 2 <= rt_oneshot_max_bytes(o) ? bench_time(R, comms, o, k, 1, count)
                                                               : -1;
            printf("%7d %7d %9zu %9.2f %11.2f %8.2f\n", tokens[t], hidden[h], count * 2, nccl, one,
                   nccl > 0 && one > 0 ? nccl / one : 0);
            printf("{\"impl\": \"allreduce\", \"ranks\": %d, \"tokens\": %d, \"hidden\": %d, "
                   "\"bytes\": %zu, \"nccl_us\": %.3f, \"oneshot_us\": %.3f, \"device\": \"%s\"}\n",
                   R, tokens[t], hidden[h], count * 2, nccl, one, dev);
        }
    rt_oneshot_free(o);
    rt_comm_free_all(comms, R);
    if (lib)
        cudaLibraryUnload(lib);
    return t_finish("gpu_allreduce bench");
}

int main(int argc, char **argv)
{
    int n_dev = 0;
    if (moec_cuda_device_count(&n_dev) != MOEC_OK || n_dev < 1) {
        printf("SKIP: no CUDA device (%s)\n", moec_last_error());
        return 0;
    }
    if (argc > 1 && !strcmp(argv[1], "bench"))
        return bench();
    static const int ranks[] = {2, 4};
    static const ir_dtype dts[] = {IR_DTYPE_BF16, IR_DTYPE_F32};
    static const int tokens[] = {1, 7, 64};
    static const int hidden[] = {2048, 7168};
    for (size_t ri = 0; ri < 2; ri++)
        for (size_t di = 0; di < 2; di++) {
            cudaLibrary_t lib = NULL;
            cudaKernel_t k = load_kernel(ranks[ri], dts[di], &lib);
            for (size_t t = 0; k && t < 3; t++)
                for (size_t h = 0; h < 2; h++)
                    check_case(ranks[ri], dts[di], tokens[t], hidden[h], k);
            if (lib)
                cudaLibraryUnload(lib);
        }
    cudaLibrary_t lib = NULL;
    cudaKernel_t k = load_kernel(2, IR_DTYPE_F32, &lib);
    if (k) {
        check_missing_rank(k, 0);
        check_missing_rank(k, 1);
    }
    if (lib)
        cudaLibraryUnload(lib);
    return t_finish("gpu_allreduce");
}

#else

int main(void)
{
    printf("SKIP: no CUDA device (moec was built without the CUDA toolkit)\n");
    return 0;
}

#endif
