/* cuda_weights.c — the weight upload: every weight of the module read from
 * the checkpoint, converted to its storage dtype and copied to the device
 * by a few threads. Weights kept in fp8 are copied as the checkpoint
 * stores them, codes then block scales (ir_weight_scale_offset), never
 * widened; the routed experts' codes in fragment tiles where the plan says
 * (fp8_tiles, ir_weight_tiled). */
#ifdef MOEC_HAVE_CUDA

#include <pthread.h>
#include <unistd.h>

#include "runtime/cuda_internal.h"

/* The weight upload: one queue of weights, filled by up to
 * RT_UPLOAD_THREADS threads, each reading its weight to fp32 from the
 * checkpoint's mapping, converting it to bf16 where it is stored so (an
 * fp8 weight: its codes and scales, unconverted), and copying it to the
 * device; the first error stops the others. */
#define RT_UPLOAD_THREADS 8
typedef struct upload_queue {
    rt_cuda *c;
    const rt_weights *w;
    pthread_mutex_t lock;
    int next;
    moec_status st;
    char err[1024];
} upload_queue;

/* Reads, converts and copies weight value i (allocated: c->weight_bytes[i]).
 * host (of host_cap floats) and stage (RT_CUDA_CHUNK bf16) are the calling
 * thread's buffers. */
static moec_status upload_one(rt_cuda *c, const rt_weights *w, int i, float **host,
                              size_t *host_cap, uint16_t *stage)
{
    const ir_module *m = c->plan->module;
    const ir_value *v = m->values[i];
    ir_dtype dt = ir_value_storage_dtype(m, v, c->plan->compute_dtype);
    size_t numel = (size_t)ir_type_numel(&v->type, 0);
    char where[512];
    snprintf(where, sizeof where, "weight %%%s (stored as %s)", v->name, ir_dtype_name(dt));
    /* floats for a float weight; an fp8 one's whole buffer, in bytes */
    size_t need = dt == IR_DTYPE_F8E4M3 ? (c->weight_bytes[i] + 3) / 4 : numel;
    if (need > *host_cap) {
        free(*host);
        *host = malloc(need * sizeof **host);
        *host_cap = *host ? need : 0;
        if (!*host)
            return MOEC_ERR(MOEC_ERR_OOM, "%s: out of host memory (%zu bytes)", where,
                            need * sizeof **host);
    }
    if (dt == IR_DTYPE_F8E4M3) {
        /* codes, zero padding, scales: the buffer as ir_weight_scale_offset lays it out */
        size_t bytes = c->weight_bytes[i], off = ir_weight_scale_offset(v);
        uint8_t *raw = (uint8_t *)*host;
        memset(raw + numel, 0, off - numel);
        MOEC_TRY(rt_weights_read_f8(w, v, raw, (float *)(raw + off)));
        int64_t K = v->type.dims[v->type.rank - 1];
        if (ir_weight_tiled(m, v, c->plan->fp8_tiles) &&
            ir_tile_codes(raw, (int64_t)numel / K, K) != 0)
            return MOEC_ERR(MOEC_ERR_OOM, "%s: out of host memory", where);
        return CK(cudaMemcpy(c->weights[i], raw, bytes, cudaMemcpyHostToDevice), where);
    }
    MOEC_TRY(rt_weights_read_f32(w, v, *host));
    if (dt == IR_DTYPE_F32)
        return CK(cudaMemcpy(c->weights[i], *host, numel * sizeof **host, cudaMemcpyHostToDevice),
                  where);
    for (size_t off = 0; off < numel; off += RT_CUDA_CHUNK) {
        size_t n = numel - off < RT_CUDA_CHUNK ? numel - off : RT_CUDA_CHUNK;
        rt_cuda_to_bf16(*host + off, stage, n);
        MOEC_TRY(CK(cudaMemcpy((uint16_t *)c->weights[i] + off, stage, n * sizeof *stage,
                               cudaMemcpyHostToDevice),
                    where));
    }
    return MOEC_OK;
}

static void *upload_worker(void *arg)
{
    upload_queue *q = arg;
    float *host = NULL;
    size_t host_cap = 0;
    uint16_t *stage = malloc(RT_CUDA_CHUNK * sizeof *stage);
    moec_status st = stage ? CK(cudaSetDevice(q->c->device), "uploading the weights")
                           : MOEC_ERR(MOEC_ERR_OOM, "uploading the weights: out of host memory");
    const ir_module *m = q->c->plan->module;
    for (;;) {
        pthread_mutex_lock(&q->lock);
        if (st != MOEC_OK && q->st == MOEC_OK) {
            q->st = st;
            snprintf(q->err, sizeof q->err, "%s", moec_last_error());
        }
        while (q->next < m->n_values && m->values[q->next]->kind != IR_VALUE_WEIGHT)
            q->next++; /* the next weight */
        int i = q->st == MOEC_OK ? q->next++ : m->n_values;
        pthread_mutex_unlock(&q->lock);
        if (i >= m->n_values)
            break;
        st = upload_one(q->c, q->w, i, &host, &host_cap, stage);
    }
    free(host);
    free(stage);
    return NULL;
}

/* Allocates every weight of the module in its storage dtype (one by one,
 * so that running out of memory names the weight), then fills them in
 * parallel. */
moec_status rt_cuda_upload_weights(rt_cuda *c, const rt_weights *w)
{
    const ir_module *m = c->plan->module;
    ir_dtype compute = c->plan->compute_dtype;
    char where[512];
    for (int i = 0; i < m->n_values; i++) {
        const ir_value *v = m->values[i];
        if (v->kind != IR_VALUE_WEIGHT)
            continue;
        char ty[64];
        ir_type_format(&v->type, ty, sizeof ty);
        ir_dtype dt = ir_value_storage_dtype(m, v, compute);
        if (dt != IR_DTYPE_F32 && dt != IR_DTYPE_BF16 && dt != IR_DTYPE_F8E4M3)
            return MOEC_ERR(MOEC_ERR_UNSUPPORTED,
                            "weight %%%s (%s): storage dtype %s is not supported by the CUDA runtime",
                            v->name, ty, ir_dtype_name(dt));
        int64_t numel = ir_type_numel(&v->type, 0);
        if (numel <= 0)
            return MOEC_ERR(MOEC_ERR_INTERNAL, "weight %%%s (%s) has no elements", v->name, ty);
        size_t bytes = ir_weight_storage_bytes(m, v, compute);
        snprintf(where, sizeof where, "weight %%%s (%s, stored as %s)", v->name, ty,
                 ir_dtype_name(dt));
        MOEC_TRY(rt_cuda_alloc(c, &c->weights[i], bytes, where));
        c->weight_bytes[i] = bytes;
    }
    upload_queue q = {.c = c, .w = w, .lock = PTHREAD_MUTEX_INITIALIZER, .st = MOEC_OK};
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int n_threads = cpus < 1 ? 1 : cpus > RT_UPLOAD_THREADS ? RT_UPLOAD_THREADS : (int)cpus;
    pthread_t th[RT_UPLOAD_THREADS];
    int started = 0;
    for (int i = 1; i < n_threads; i++)
        if (pthread_create(&th[started], NULL, upload_worker, &q) == 0)
            started++;
    upload_worker(&q);
    for (int i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    pthread_mutex_destroy(&q.lock);
    if (q.st != MOEC_OK)
        return MOEC_ERR(q.st, "%s", q.err);
    return MOEC_OK;
}

#endif
