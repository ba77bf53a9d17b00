/* cupti_trace.c — a kernel trace of any CUDA program, graph nodes included,
 * where the machine has no Nsight Systems: built as a shared library and
 * named in CUDA_INJECTION64_PATH, it is loaded by the CUDA driver at
 * initialization (InitializeInjection), records every kernel's start and
 * end through CUPTI's activity API (concurrent kernels: the two streams'
 * kernels are not serialized; kernels replayed from a CUDA graph each get
 * a record), and writes one CSV row per kernel to $MOEC_CUPTI_OUT (default
 * cupti_trace.csv): "Start (ns)", "Duration (ns)", "Strm", "Name", the
 * columns bench/timeline.py reads (as nsys's cuda_gpu_trace report).
 *   build: cc -O2 -shared -fPIC -I/usr/local/cuda/include -o libcupti_trace.so
 *          bench/cupti_trace.c -L/usr/local/cuda/lib64 -lcupti
 *   run:   CUDA_INJECTION64_PATH=$PWD/libcupti_trace.so MOEC_CUPTI_OUT=t.csv prog
 * (scripts/gpu_timeline.sh does both.) A tool for measurement only: errors
 * go to stderr and tracing stops; the program runs on. */
#include <cupti.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#define TRACE_BUF (16u << 20)

static FILE *trace_out;
static pthread_mutex_t trace_lock = PTHREAD_MUTEX_INITIALIZER;

static void warn(const char *what, CUptiResult r)
{
    const char *s = NULL;
    cuptiGetResultString(r, &s);
    fprintf(stderr, "cupti_trace: %s: %s\n", what, s ? s : "?");
}

static void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records)
{
    *buffer = aligned_alloc(ACTIVITY_RECORD_ALIGNMENT, TRACE_BUF);
    *size = *buffer ? TRACE_BUF : 0;
    *max_records = 0;
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size,
                                      size_t valid)
{
    (void)ctx;
    (void)stream;
    (void)size;
    CUpti_Activity *rec = NULL;
    pthread_mutex_lock(&trace_lock);
    while (trace_out && cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
        if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL &&
            rec->kind != CUPTI_ACTIVITY_KIND_KERNEL)
            continue;
        const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)rec;
        fprintf(trace_out, "%llu,%llu,%u,\"%s\"\n", (unsigned long long)k->start,
                (unsigned long long)(k->end - k->start), k->streamId, k->name ? k->name : "?");
    }
    pthread_mutex_unlock(&trace_lock);
    free(buffer);
}

static void trace_flush(void)
{
    cuptiActivityFlushAll(1);
    pthread_mutex_lock(&trace_lock);
    if (trace_out)
        fclose(trace_out);
    trace_out = NULL;
    pthread_mutex_unlock(&trace_lock);
}

int InitializeInjection(void)
{
    const char *path = getenv("MOEC_CUPTI_OUT");
    trace_out = fopen(path && *path ? path : "cupti_trace.csv", "w");
    if (!trace_out) {
        perror("cupti_trace: the output");
        return 0;
    }
    fprintf(trace_out, "\"Start (ns)\",\"Duration (ns)\",\"Strm\",\"Name\"\n");
    CUptiResult r = cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed);
    if (r == CUPTI_SUCCESS)
        r = cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
    if (r != CUPTI_SUCCESS) {
        warn("enabling the kernel activity", r);
        fclose(trace_out);
        trace_out = NULL;
        return 0;
    }
    atexit(trace_flush);
    return 1;
}
