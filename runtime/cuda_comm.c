/* cuda_comm.c — the communicators of a group of ranks on the GPUs of one
 * process (issue 13, docs/PARALLEL.md): NCCL, opened with dlopen like
 * cuBLASLt (so the CPU paths, CI and plans without collectives never need
 * it), a communicator per rank made at once by ncclCommInitAll, and the
 * collective steps of a plan enqueued on the rank's stream, where CUDA Graph
 * capture records them like any kernel.
 *
 * The few NCCL types and entry points used are declared here (nccl.h need
 * not be installed); where it is, their values are checked against it.
 *
 * A decode step's all-reduces are a few tokens of the hidden state, where
 * NCCL's latency (10-20 us on H100) dominates; a one-shot all-reduce over
 * peer memory takes 4-6 us. rt_comm_set_small_allreduce is the seam for
 * one: all-reduces up to its byte limit go to it instead of NCCL. The
 * group installs cuda_oneshot.c's as MOEC_ALLREDUCE says (allreduce_mode). */
#ifdef MOEC_HAVE_CUDA

#include <dlfcn.h>

#include "runtime/cuda_internal.h"

/* NCCL's ABI, as nccl.h (2.x) declares it. */
typedef struct rt_nccl_comm *rt_nccl_comm_t;
typedef int rt_nccl_result;
enum { RT_NCCL_SUCCESS = 0, RT_NCCL_IN_PROGRESS = 7 };
enum { RT_NCCL_INT32 = 2, RT_NCCL_FLOAT16 = 6, RT_NCCL_FLOAT32 = 7, RT_NCCL_BFLOAT16 = 9 };
enum { RT_NCCL_SUM = 0 };

#if defined(__has_include)
#if __has_include(<nccl.h>)
#include <nccl.h>
_Static_assert((int)RT_NCCL_SUCCESS == (int)ncclSuccess &&
                   (int)RT_NCCL_IN_PROGRESS == (int)ncclInProgress,
               "NCCL result codes");
_Static_assert((int)RT_NCCL_INT32 == (int)ncclInt32 && (int)RT_NCCL_FLOAT16 == (int)ncclFloat16 &&
                   (int)RT_NCCL_FLOAT32 == (int)ncclFloat32 &&
                   (int)RT_NCCL_BFLOAT16 == (int)ncclBfloat16,
               "NCCL data types");
_Static_assert((int)RT_NCCL_SUM == (int)ncclSum, "NCCL reduction ops");
#endif
#endif

typedef struct rt_nccl_api {
    void *dl;
    rt_nccl_result (*GetVersion)(int *version);
    rt_nccl_result (*CommInitAll)(rt_nccl_comm_t *comms, int n, const int *devs);
    rt_nccl_result (*CommDestroy)(rt_nccl_comm_t comm);
    rt_nccl_result (*CommAbort)(rt_nccl_comm_t comm);
    rt_nccl_result (*CommGetAsyncError)(rt_nccl_comm_t comm, rt_nccl_result *err);
    const char *(*GetErrorString)(rt_nccl_result r);
    rt_nccl_result (*AllReduce)(const void *send, void *recv, size_t count, int dtype, int op,
                                rt_nccl_comm_t comm, cudaStream_t stream);
    rt_nccl_result (*AllGather)(const void *send, void *recv, size_t count, int dtype,
                                rt_nccl_comm_t comm, cudaStream_t stream);
    rt_nccl_result (*ReduceScatter)(const void *send, void *recv, size_t recv_count, int dtype,
                                    int op, rt_nccl_comm_t comm, cudaStream_t stream);
    rt_nccl_result (*Send)(const void *send, size_t count, int dtype, int peer,
                           rt_nccl_comm_t comm, cudaStream_t stream);
    rt_nccl_result (*Recv)(void *recv, size_t count, int dtype, int peer, rt_nccl_comm_t comm,
                           cudaStream_t stream);
    rt_nccl_result (*GroupStart)(void);
    rt_nccl_result (*GroupEnd)(void);
} rt_nccl_api;

struct rt_comm {
    rt_nccl_api *api;     /* shared by the group; rank 0's comm owns it */
    rt_oneshot *oneshot;  /* shared likewise; NULL: NCCL for every all-reduce */
    rt_nccl_comm_t nccl;
    int rank, size, device;
    int aborted;
    rt_small_allreduce small; /* the one-shot seam (NULL: NCCL for everything) */
    size_t small_max_bytes;
    void *small_user;
};

static moec_status nccl_open(rt_nccl_api *n)
{
    static const char *const names[] = {"libnccl.so.2", "libnccl.so"};
    const char *err = NULL;
    for (size_t i = 0; i < sizeof names / sizeof *names && !n->dl; i++) {
        n->dl = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (!n->dl && !err)
            err = dlerror();
    }
    if (!n->dl)
        return MOEC_ERR(MOEC_ERR_CUDA,
                        "cannot load NCCL (%s), which a plan split over ranks needs: %s",
                        names[0], err ? err : "not found");
    static const char *const syms[] = {
        "ncclGetVersion",     "ncclCommInitAll", "ncclCommDestroy",   "ncclCommAbort",
        "ncclCommGetAsyncError", "ncclGetErrorString", "ncclAllReduce", "ncclAllGather",
        "ncclReduceScatter",  "ncclSend",        "ncclRecv",          "ncclGroupStart",
        "ncclGroupEnd"};
    void **slots[] = {(void **)&n->GetVersion,        (void **)&n->CommInitAll,
                      (void **)&n->CommDestroy,       (void **)&n->CommAbort,
                      (void **)&n->CommGetAsyncError, (void **)&n->GetErrorString,
                      (void **)&n->AllReduce,         (void **)&n->AllGather,
                      (void **)&n->ReduceScatter,     (void **)&n->Send,
                      (void **)&n->Recv,              (void **)&n->GroupStart,
                      (void **)&n->GroupEnd};
    _Static_assert(sizeof syms / sizeof *syms == sizeof slots / sizeof *slots, "NCCL symbols");
    for (size_t i = 0; i < sizeof syms / sizeof *syms; i++) {
        void *sym = dlsym(n->dl, syms[i]);
        if (!sym)
            return MOEC_ERR(MOEC_ERR_CUDA, "NCCL (%s) has no %s", names[0], syms[i]);
        memcpy(slots[i], &sym, sizeof sym);
    }
    return MOEC_OK;
}

static moec_status nccl_check(const rt_nccl_api *n, rt_nccl_result r, const char *call,
                              const char *where)
{
    if (r == RT_NCCL_SUCCESS)
        return MOEC_OK;
    return MOEC_ERR(MOEC_ERR_CUDA, "%s: %s failed: %s (NCCL error %d)", where, call,
                    n->GetErrorString ? n->GetErrorString(r) : "?", r);
}

/* MOEC_ALLREDUCE: "nccl" (the default: every all-reduce on NCCL), "oneshot"
 * (the one-shot all-reduce for every message up to RT_ONESHOT_MAX_BYTES,
 * whatever the ranks; an error where the GPUs lack peer access) or "auto"
 * (the one-shot for messages up to RT_ONESHOT_AUTO_BYTES on groups of 2 or
 * more ranks that have peer access, NCCL otherwise). *max_bytes: 0 for
 * NCCL alone. NCCL is the default because it was faster at every decode
 * batch where both were timed: two H200s over NVLink (NCCL 2.28,
 * 2026-11-24 and again 2026-11-28), DeepSeek-V2-Lite at tp 2, batch 1 / 8
 * / 32 / 64: 2.328 / 4.425 / 7.731 / 10.123 ms a step with NCCL against
 * 2.435 / 5.064 / 8.487 / 10.866 with the one-shot (docs/PARALLEL.md,
 * BENCHMARKS.md). */
#define RT_ONESHOT_MAX_BYTES ((size_t)1 << 20)
#define RT_ONESHOT_AUTO_BYTES ((size_t)256 << 10)
static moec_status allreduce_mode(int n, int *required, size_t *max_bytes)
{
    const char *m = getenv("MOEC_ALLREDUCE");
    *required = 0;
    *max_bytes = 0;
    if (!m || !*m || !strcmp(m, "nccl"))
        return MOEC_OK;
    if (!strcmp(m, "auto")) {
        *max_bytes = n > 1 ? RT_ONESHOT_AUTO_BYTES : 0;
        return MOEC_OK;
    }
    if (!strcmp(m, "oneshot")) {
        *required = 1;
        *max_bytes = RT_ONESHOT_MAX_BYTES;
        return MOEC_OK;
    }
    return MOEC_ERR(MOEC_ERR_INVALID_ARG, "MOEC_ALLREDUCE=%s is not nccl, oneshot or auto", m);
}

/* The one-shot all-reduce on every communicator, as MOEC_ALLREDUCE says. */
static moec_status install_oneshot(int n, const int *devs, rt_comm **comms)
{
    int required;
    size_t max_bytes;
    MOEC_TRY(allreduce_mode(n, &required, &max_bytes));
    if (!max_bytes)
        return MOEC_OK;
    rt_oneshot *o = NULL;
    moec_status st = rt_oneshot_init(n, devs, RT_ONESHOT_MAX_BYTES, &o);
    if (st != MOEC_OK && !required) {
        moec_err_clear(); /* no peer access: NCCL for everything */
        return MOEC_OK;
    }
    if (st != MOEC_OK)
        return moec_err_wrap(st, "MOEC_ALLREDUCE=oneshot");
    for (int r = 0; r < n; r++)
        rt_comm_set_small_allreduce(comms[r], rt_oneshot_run, max_bytes, o);
    comms[0]->oneshot = o; /* rank 0's owns it, as the NCCL api */
    for (int r = 1; r < n; r++)
        comms[r]->oneshot = o;
    return MOEC_OK;
}

moec_status rt_comm_init_all(int n, const int *devs, rt_comm **out)
{
    if (n < 1 || n > IR_MAX_RANKS || !devs || !out)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "rt_comm_init_all: %d ranks", n);
    for (int r = 0; r < n; r++)
        out[r] = NULL;
    rt_nccl_api *api = calloc(1, sizeof *api);
    rt_nccl_comm_t comms[IR_MAX_RANKS] = {0};
    moec_status st = api ? nccl_open(api) : MOEC_ERR(MOEC_ERR_OOM, "out of memory");
    if (st == MOEC_OK)
        st = nccl_check(api, api->CommInitAll(comms, n, devs), "ncclCommInitAll",
                        "making the ranks' communicators");
    for (int r = 0; st == MOEC_OK && r < n; r++) {
        out[r] = calloc(1, sizeof **out);
        if (!out[r]) {
            st = MOEC_ERR(MOEC_ERR_OOM, "out of memory");
            break;
        }
        *out[r] = (rt_comm){.api = api, .nccl = comms[r], .rank = r, .size = n, .device = devs[r]};
    }
    if (st == MOEC_OK)
        st = install_oneshot(n, devs, out);
    if (st == MOEC_OK)
        return MOEC_OK;
    for (int r = 0; r < n; r++) {
        if (comms[r] && api->CommDestroy)
            api->CommDestroy(comms[r]);
        free(out[r]);
        out[r] = NULL;
    }
    if (api && api->dl)
        dlclose(api->dl);
    free(api);
    return st;
}

void rt_comm_abort(rt_comm *c)
{
    /* called from the failing rank's thread while the others may wait in
     * this communicator's collectives: once only */
    if (!c || __atomic_exchange_n(&c->aborted, 1, __ATOMIC_ACQ_REL))
        return;
    rt_oneshot_abort(c->oneshot); /* its waits end too */
    if (c->api->CommAbort)
        c->api->CommAbort(c->nccl);
}

void rt_comm_free_all(rt_comm **comms, int n)
{
    rt_nccl_api *api = n > 0 && comms[0] ? comms[0]->api : NULL;
    rt_oneshot_free(n > 0 && comms[0] ? comms[0]->oneshot : NULL);
    for (int r = 0; r < n; r++) {
        if (!comms[r])
            continue;
        if (!__atomic_load_n(&comms[r]->aborted, __ATOMIC_ACQUIRE))
            api->CommDestroy(comms[r]->nccl);
        free(comms[r]);
        comms[r] = NULL;
    }
    if (api && api->dl)
        dlclose(api->dl);
    free(api);
}

int rt_comm_rank(const rt_comm *c) { return c ? c->rank : 0; }
int rt_comm_size(const rt_comm *c) { return c ? c->size : 1; }
int rt_comm_device(const rt_comm *c) { return c ? c->device : 0; }

void rt_comm_set_small_allreduce(rt_comm *c, rt_small_allreduce fn, size_t max_bytes, void *user)
{
    c->small = fn;
    c->small_max_bytes = max_bytes;
    c->small_user = user;
}

moec_status rt_comm_small_error(const rt_comm *c, const char *where)
{
    return c && c->oneshot ? rt_oneshot_error(c->oneshot, where) : MOEC_OK;
}

moec_status rt_comm_error(rt_comm *c, const char *where)
{
    rt_nccl_result err = RT_NCCL_SUCCESS;
    if (!c)
        return MOEC_OK;
    if (__atomic_load_n(&c->aborted, __ATOMIC_ACQUIRE))
        return MOEC_ERR(MOEC_ERR_CUDA, "%s: rank %d's communicator was aborted", where, c->rank);
    MOEC_TRY(nccl_check(c->api, c->api->CommGetAsyncError(c->nccl, &err),
                        "ncclCommGetAsyncError", where));
    return nccl_check(c->api, err, "a collective", where);
}

static int nccl_dtype(ir_dtype dt)
{
    switch (dt) {
    case IR_DTYPE_F16: return RT_NCCL_FLOAT16;
    case IR_DTYPE_BF16: return RT_NCCL_BFLOAT16;
    case IR_DTYPE_I32: return RT_NCCL_INT32;
    default: return RT_NCCL_FLOAT32;
    }
}

/* Part j of send to rank j and part j of recv from it (count elements
 * each): one group of sends and receives, which NCCL runs as one
 * operation (captured as one into a graph). The group is ended even when
 * a call in it failed. */
static moec_status all_to_all(rt_comm *c, const ir_coll *coll, const void *send, void *recv,
                              cudaStream_t stream, const char *where)
{
    const rt_nccl_api *n = c->api;
    size_t count = (size_t)coll->count, bytes = count * ir_dtype_size(coll->dtype);
    int dt = nccl_dtype(coll->dtype);
    MOEC_TRY(nccl_check(n, n->GroupStart(), "ncclGroupStart", where));
    moec_status st = MOEC_OK;
    for (int j = 0; st == MOEC_OK && j < c->size; j++) {
        st = nccl_check(n, n->Send((const char *)send + (size_t)j * bytes, count, dt, j, c->nccl,
                                   stream),
                        "ncclSend", where);
        if (st == MOEC_OK)
            st = nccl_check(n, n->Recv((char *)recv + (size_t)j * bytes, count, dt, j, c->nccl,
                                       stream),
                            "ncclRecv", where);
    }
    moec_status end = nccl_check(n, n->GroupEnd(), "ncclGroupEnd", where);
    return st != MOEC_OK ? st : end;
}

moec_status rt_comm_run(rt_comm *c, const ir_coll *coll, cudaKernel_t oneshot, const void *send,
                        void *recv, cudaStream_t stream, const char *where)
{
    if (!c)
        return MOEC_ERR(MOEC_ERR_INTERNAL, "%s: a collective step with no communicator", where);
    if (coll->ranks != c->size)
        return MOEC_ERR(MOEC_ERR_INTERNAL, "%s: a collective over %d ranks on a group of %d",
                        where, coll->ranks, c->size);
    size_t bytes = (size_t)coll->count * ir_dtype_size(coll->dtype);
    if (coll->op == IR_OP_ALL_REDUCE && c->small && oneshot && bytes <= c->small_max_bytes)
        return c->small(c->small_user, c->rank, oneshot, send, recv, (size_t)coll->count,
                        coll->dtype, stream, where);
    if (coll->op == IR_OP_ALL_REDUCE)
        return nccl_check(c->api,
                          c->api->AllReduce(send, recv, (size_t)coll->count,
                                            nccl_dtype(coll->dtype), RT_NCCL_SUM, c->nccl, stream),
                          "ncclAllReduce", where);
    if (coll->op == IR_OP_ALL_GATHER)
        return nccl_check(c->api,
                          c->api->AllGather(send, recv, (size_t)coll->count,
                                            nccl_dtype(coll->dtype), c->nccl, stream),
                          "ncclAllGather", where);
    if (coll->op == IR_OP_REDUCE_SCATTER)
        return nccl_check(c->api,
                          c->api->ReduceScatter(send, recv, (size_t)coll->count,
                                                nccl_dtype(coll->dtype), RT_NCCL_SUM, c->nccl,
                                                stream),
                          "ncclReduceScatter", where);
    if (coll->op == IR_OP_ALL_TO_ALL)
        return all_to_all(c, coll, send, recv, stream, where);
    return MOEC_ERR(MOEC_ERR_INTERNAL, "%s: collective %s has no NCCL call", where,
                    ir_op_name(coll->op));
}

#endif
