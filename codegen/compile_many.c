/* compile_many.c — many NVRTC compiles at once, on up to one thread per CPU:
 * each compile is independent and single-threaded, and a plan's buckets (or
 * a test's kernels) are many. The one worker queue for plan_build.c and the
 * tests. */
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>

#include "codegen/cg.h"
#include "err.h"

#define MAX_THREADS 16

typedef struct queue {
    cg_compile_job *jobs;
    int n, next;
    const char *arch, *cache_dir;
    int weight_done, weight_total;
    void (*progress)(int done, int total, void *user);
    void *user;
    pthread_mutex_t lock;
} queue;

static void *worker(void *arg)
{
    queue *q = arg;
    for (;;) {
        pthread_mutex_lock(&q->lock);
        int i = q->next++;
        pthread_mutex_unlock(&q->lock);
        if (i >= q->n)
            return NULL;
        cg_compile_job *j = &q->jobs[i];
        j->st = cg_compile(j->src, q->arch, q->cache_dir, &j->cubin, &j->size);
        if (j->st != MOEC_OK)
            snprintf(j->err, sizeof j->err, "%s", moec_last_error());
        /* one progress call at a time, as each job finishes */
        pthread_mutex_lock(&q->lock);
        q->weight_done += j->weight;
        if (j->st == MOEC_OK && q->progress)
            q->progress(q->weight_done, q->weight_total, q->user);
        pthread_mutex_unlock(&q->lock);
    }
}

void cg_compile_many(cg_compile_job *jobs, int n, const char *arch, const char *cache_dir,
                     void (*progress)(int done, int total, void *user), void *user)
{
    queue q = {.jobs = jobs, .n = n, .arch = arch, .cache_dir = cache_dir,
               .progress = progress, .user = user};
    pthread_mutex_init(&q.lock, NULL);
    for (int i = 0; i < n; i++)
        q.weight_total += jobs[i].weight;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int n_threads = cpus < 1 ? 1 : cpus > n ? n : (int)cpus;
    pthread_t th[MAX_THREADS];
    int started = 0;
    for (int i = 1; i < n_threads && i < MAX_THREADS; i++)
        if (pthread_create(&th[started], NULL, worker, &q) == 0)
            started++;
    worker(&q);
    for (int i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    pthread_mutex_destroy(&q.lock);
}
