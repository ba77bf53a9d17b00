/* sched.c — the engine's scheduler (moec_engine_submit / _cancel / _run in
 * moec_rt.h), after nano-vllm's Scheduler and BlockManager: a waiting queue
 * and a running set over one pool of KV blocks (kv_pool.c), decode tokens
 * first and chunked prefill after them, preemption of the newest sequence
 * when a decoding one needs a block and none is free, prefix caching by
 * chained block hashes, sampling on the GPU (the device sampler, with the
 * argmax for plain greedy requests) or the host (sample.c), and the metrics
 * a service reports. The engine's backend runs the steps (engine.c); this file
 * decides what they hold and owns the block table while requests exist. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine_internal.h"
#include "engine/kv_pool.h"
#include "engine/sample.h"
#include "err.h"
#include "hash.h"
#include "timer.h"

/* A request: its tokens are the prompt then its output; `fed` of them have
 * their K/V in its blocks; known - fed (at least 1) wait to be fed, the last
 * of which gives the next token. */
typedef struct seq {
    uint64_t id;
    void *user;
    int32_t *tokens;     /* n_prompt + max_new */
    int n_prompt, known, max_new;
    int fed;
    int32_t *blocks;     /* held, in position order */
    int n_blocks;
    int n_hashed;        /* leading blocks cached (found, or published) */
    uint64_t chain;      /* the hash of the last of them */
    int row;             /* its block-table row while running, else -1 */
    int admitted;        /* it has been admitted once (preemption readmits) */
    int cached_tokens;   /* prompt tokens the prefix cache saved at first admission */
    int32_t *stop;
    int n_stop;
    int ignore_eos;
    int plain;           /* plain greedy: the GPU's argmax serves it */
    moec_sampling sp;
    double t_submit, t_first, t_last;
    struct seq *next;    /* in the waiting queue */
} seq;

struct moec_sched {
    moec_kv_pool pool;
    moec_sampler sampler;
    int prefix_cache;
    seq **running;       /* admission order, oldest first */
    int n_running;
    int row_cap;         /* rows, and no more than a step's tokens: every one decodes */
    int *free_rows;
    int n_free_rows;
    seq *wait_head, *wait_tail;
    int n_waiting;
    int watermark;       /* blocks admission leaves free for the running ones' growth */
    uint64_t next_id;
    /* one step */
    int32_t *tok, *pos, *slot, *next;
    seq **who;
    float *logits;       /* host rows of the step's sampled tokens (made on first need) */
    /* the device sampler's part of the step (engine sample_cap >= 0) */
    ir_sample_row *srow; /* per step row: its parameters (off: not sampled there) */
    ir_sample_pen *spen; /* sample_cap entries */
    unsigned char *on_dev; /* per step row: the device samples it */
    int32_t *drawn;      /* per step row: the token the device drew, */
    float *dlogprob;     /* and its log probability */
    moec_event *events;
    int n_events, cap_events;
    char **msgs;         /* the texts its error events point to */
    int n_msgs, cap_msgs;
    int n_bad;           /* requests its non-finite logits ended, the first's id */
    uint64_t bad_id;     /* and error (for moec_engine_run's) */
    const char *bad_msg;
    moec_engine_stats stats;
};

/* ---- set-up --------------------------------------------------------------- */

moec_status moec_sched_init(moec_engine_t *e, int prefix_cache)
{
    moec_sched *s = calloc(1, sizeof *s);
    if (!s)
        return MOEC_ERR(MOEC_ERR_OOM, "out of memory for the scheduler");
    e->sched = s;
    s->prefix_cache = prefix_cache;
    s->row_cap = e->max_seqs < e->max_tokens ? e->max_seqs : e->max_tokens;
    s->watermark = e->kv_blocks / 100 > 1 ? e->kv_blocks / 100 : 1;
    s->next_id = 1;
    MOEC_TRY(moec_kv_pool_init(&s->pool, e->kv_blocks, e->block_size));
    MOEC_TRY(moec_sampler_init(&s->sampler, e->vocab));
    size_t T = (size_t)e->max_tokens;
    s->running = calloc((size_t)e->max_seqs, sizeof *s->running);
    s->free_rows = malloc((size_t)e->max_seqs * sizeof *s->free_rows);
    s->tok = malloc(T * sizeof *s->tok);
    s->pos = malloc(T * sizeof *s->pos);
    s->slot = malloc(T * sizeof *s->slot);
    s->next = malloc(T * sizeof *s->next);
    s->who = malloc(T * sizeof *s->who);
    if (!s->running || !s->free_rows || !s->tok || !s->pos || !s->slot || !s->next || !s->who)
        return MOEC_ERR(MOEC_ERR_OOM, "out of memory for the scheduler");
    if (e->sample_cap >= 0) {
        s->srow = calloc(T, sizeof *s->srow);
        s->spen = malloc((size_t)(e->sample_cap ? e->sample_cap : 1) * sizeof *s->spen);
        s->on_dev = calloc(T, sizeof *s->on_dev);
        s->drawn = malloc(T * sizeof *s->drawn);
        s->dlogprob = malloc(T * sizeof *s->dlogprob);
        if (!s->srow || !s->spen || !s->on_dev || !s->drawn || !s->dlogprob)
            return MOEC_ERR(MOEC_ERR_OOM, "out of memory for the scheduler's sampling rows");
    }
    for (int r = e->max_seqs - 1; r >= 0; r--)
        s->free_rows[s->n_free_rows++] = r;
    s->stats.kv_blocks = e->kv_blocks;
    s->stats.kv_block_size = e->block_size;
    return MOEC_OK;
}

static void seq_free(seq *q)
{
    free(q->tokens);
    free(q->blocks);
    free(q->stop);
    free(q);
}

/* Frees the texts of the last step's error events. */
static void msgs_clear(moec_sched *s)
{
    for (int i = 0; i < s->n_msgs; i++)
        free(s->msgs[i]);
    s->n_msgs = 0;
}

void moec_sched_free(moec_engine_t *e)
{
    moec_sched *s = e->sched;
    if (!s)
        return;
    for (int i = 0; i < s->n_running; i++)
        seq_free(s->running[i]);
    for (seq *q = s->wait_head, *n; q; q = n) {
        n = q->next;
        seq_free(q);
    }
    moec_kv_pool_free(&s->pool);
    moec_sampler_free(&s->sampler);
    free(s->running);
    free(s->free_rows);
    free(s->tok);
    free(s->pos);
    free(s->slot);
    free(s->next);
    free(s->who);
    free(s->logits);
    free(s->srow);
    free(s->spen);
    free(s->on_dev);
    free(s->drawn);
    free(s->dlogprob);
    free(s->events);
    msgs_clear(s);
    free(s->msgs);
    free(s);
    e->sched = NULL;
}

int moec_sched_busy(const moec_engine_t *e)
{
    return e->sched && (e->sched->n_running || e->sched->n_waiting);
}

void moec_sched_forget(moec_engine_t *e)
{
    if (e->sched)
        moec_kv_forget(&e->sched->pool);
}

/* ---- requests ------------------------------------------------------------- */

static int blocks_for(const moec_engine_t *e, int64_t tokens)
{
    return (int)((tokens + e->block_size - 1) / e->block_size);
}

/* The checks of a request's fields; MOEC_ERR_CAPACITY when it could never
 * run. */
static moec_status request_check(const moec_engine_t *e, const moec_request *r)
{
    if (!r->prompt || r->n_prompt < 1)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "a request needs a prompt of at least one token");
    for (int i = 0; i < r->n_prompt; i++)
        if (r->prompt[i] < 0 || r->prompt[i] >= e->vocab)
            return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                            "prompt token %d: id %d is outside the vocabulary (%d ids)", i,
                            r->prompt[i], e->vocab);
    if (r->max_tokens < 1)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "max_tokens must be at least 1, got %d",
                        r->max_tokens);
    if (r->n_stop < 0 || (r->n_stop && !r->stop_ids))
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "%d stop ids and no list of them", r->n_stop);
    for (int i = 0; i < r->n_stop; i++)
        if (r->stop_ids[i] < 0 || r->stop_ids[i] >= e->vocab)
            return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                            "stop id %d is outside the vocabulary (%d ids)", r->stop_ids[i],
                            e->vocab);
    MOEC_TRY(moec_sampling_check(&r->sampling));
    int64_t total = (int64_t)r->n_prompt + r->max_tokens;
    if (total > e->max_seq_len)
        return MOEC_ERR(MOEC_ERR_CAPACITY,
                        "too long: %d prompt + %d new = %lld tokens, more than the %d a "
                        "sequence may hold (max_seq_len)",
                        r->n_prompt, r->max_tokens, (long long)total, e->max_seq_len);
    /* the last token generated is never fed, so needs no KV */
    int need = blocks_for(e, total - 1);
    if (need > e->kv_blocks)
        return MOEC_ERR(MOEC_ERR_CAPACITY,
                        "too long: %d prompt + %d new tokens need %d KV blocks of %d tokens, "
                        "and the whole pool has %d",
                        r->n_prompt, r->max_tokens, need, e->block_size, e->kv_blocks);
    return MOEC_OK;
}

moec_status moec_engine_submit(moec_engine_t *e, const moec_request *r, uint64_t *id)
{
    if (!e || !r || !id)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "moec_engine_submit: NULL argument");
    *id = 0;
    MOEC_TRY(request_check(e, r));
    moec_sched *s = e->sched;
    seq *q = calloc(1, sizeof *q);
    if (q) {
        q->tokens = malloc(((size_t)r->n_prompt + (size_t)r->max_tokens) * sizeof *q->tokens);
        q->blocks = malloc((size_t)blocks_for(e, (int64_t)r->n_prompt + r->max_tokens) *
                           sizeof *q->blocks);
        q->stop = malloc((size_t)(r->n_stop ? r->n_stop : 1) * sizeof *q->stop);
    }
    if (!q || !q->tokens || !q->blocks || !q->stop) {
        if (q)
            seq_free(q);
        return MOEC_ERR(MOEC_ERR_OOM, "out of memory for a request of %d + %d tokens",
                        r->n_prompt, r->max_tokens);
    }
    memcpy(q->tokens, r->prompt, (size_t)r->n_prompt * sizeof *q->tokens);
    if (r->n_stop)
        memcpy(q->stop, r->stop_ids, (size_t)r->n_stop * sizeof *q->stop);
    q->id = s->next_id++;
    q->user = r->user;
    q->n_prompt = q->known = r->n_prompt;
    q->max_new = r->max_tokens;
    q->n_stop = r->n_stop;
    q->ignore_eos = r->ignore_eos;
    q->sp = r->sampling;
    q->plain = moec_sampling_is_plain_greedy(&r->sampling);
    q->row = -1;
    q->t_submit = moec_now_s();
    if (s->wait_tail)
        s->wait_tail->next = q;
    else
        s->wait_head = q;
    s->wait_tail = q;
    s->n_waiting++;
    *id = q->id;
    return MOEC_OK;
}

int moec_engine_pending(const moec_engine_t *e)
{
    return e && e->sched ? e->sched->n_running + e->sched->n_waiting : 0;
}

/* ---- blocks and rows -------------------------------------------------------- */

/* Gives back q's blocks (its last first, so that its prefix stays cached
 * longest) and its row, whose entries go back to -1. */
static void seq_unplace(moec_engine_t *e, seq *q)
{
    moec_sched *s = e->sched;
    for (int i = q->n_blocks - 1; i >= 0; i--) {
        moec_kv_release(&s->pool, q->blocks[i]);
        q->blocks[i] = -1;
    }
    if (q->row >= 0) {
        /* cannot fail: the row and range are the engine's own */
        (void)moec_engine_table_set(e, q->row, 0, q->n_blocks, q->blocks);
        s->free_rows[s->n_free_rows++] = q->row;
    }
    q->n_blocks = 0;
    q->row = -1;
    q->fed = 0;
    q->n_hashed = 0;
}

static void running_remove(moec_sched *s, int i)
{
    memmove(&s->running[i], &s->running[i + 1],
            (size_t)(s->n_running - i - 1) * sizeof *s->running);
    s->n_running--;
}

/* Preempts running[i]: its blocks freed, it goes back to the front of the
 * queue, to be recomputed. */
static void preempt(moec_engine_t *e, int i)
{
    moec_sched *s = e->sched;
    seq *q = s->running[i];
    running_remove(s, i);
    seq_unplace(e, q);
    q->next = s->wait_head;
    s->wait_head = q;
    if (!s->wait_tail)
        s->wait_tail = q;
    s->n_waiting++;
    s->stats.preemptions++;
}

/* Ends running[i] or a waiting request, freeing everything. */
static void seq_end(moec_engine_t *e, seq *q)
{
    moec_sched *s = e->sched;
    for (int i = 0; i < s->n_running; i++)
        if (s->running[i] == q) {
            running_remove(s, i);
            break;
        }
    seq_unplace(e, q);
    seq_free(q);
}

/* The leading full blocks of q's known tokens that the prefix cache holds,
 * up to the last token (always computed): into found, their count
 * returned, *chain the hash of the last. */
static int prefix_match(moec_sched *s, const seq *q, int32_t *found, uint64_t *chain)
{
    int bs = s->pool.block_size, n = 0;
    *chain = MOEC_FNV_SEED;
    if (!s->prefix_cache)
        return 0;
    while ((n + 1) * bs <= q->known - 1) {
        const int32_t *ids = q->tokens + (size_t)n * bs;
        uint64_t h = moec_kv_hash(*chain, ids, bs);
        int b = moec_kv_lookup(&s->pool, h, ids);
        if (b < 0)
            break;
        found[n++] = b;
        *chain = h;
    }
    return n;
}

/* Admits the head of the queue if a row and the blocks of its known tokens
 * are there (beyond the reserve, when others run): cached blocks held, the
 * rest taken, its row written. 0 when it must wait. */
static int admit(moec_engine_t *e, seq *q)
{
    moec_sched *s = e->sched;
    if (!s->n_free_rows)
        return 0;
    uint64_t chain;
    int matched = prefix_match(s, q, q->blocks, &chain);
    int need = blocks_for(e, q->known), revived = 0;
    for (int i = 0; i < matched; i++)
        revived += s->pool.ref[q->blocks[i]] == 0;
    int reserve = s->n_running ? s->watermark : 0;
    if (s->pool.n_free - revived - (need - matched) < reserve)
        return 0;
    for (int i = 0; i < matched; i++)
        moec_kv_hold(&s->pool, q->blocks[i]);
    for (int i = matched; i < need; i++)
        q->blocks[i] = moec_kv_take(&s->pool); /* there are enough: checked above */
    q->n_blocks = need;
    q->n_hashed = matched;
    q->chain = chain;
    q->fed = matched * e->block_size;
    q->row = s->free_rows[--s->n_free_rows];
    (void)moec_engine_table_set(e, q->row, 0, need, q->blocks);
    if (!q->admitted) {
        q->admitted = 1;
        q->cached_tokens = q->fed;
        s->stats.prompt_tokens += (uint64_t)q->n_prompt;
        s->stats.cached_tokens += (uint64_t)q->fed;
    }
    s->wait_head = q->next;
    if (!s->wait_head)
        s->wait_tail = NULL;
    q->next = NULL;
    s->n_waiting--;
    s->running[s->n_running++] = q;
    return 1;
}

/* Every decoding sequence whose next position starts a block gets one,
 * oldest first; while none is free the newest running sequence is
 * preempted (perhaps the one in need). Returns 1 if any was preempted. */
static int grow(moec_engine_t *e)
{
    moec_sched *s = e->sched;
    int preempted = 0;
    for (int i = 0; i < s->n_running; i++) {
        seq *q = s->running[i];
        if (q->known - q->fed != 1 || q->fed / e->block_size < q->n_blocks)
            continue;
        int b;
        while ((b = moec_kv_take(&s->pool)) < 0) {
            int victim = s->n_running - 1;
            preempt(e, victim);
            preempted = 1;
            if (victim == i)
                break;
        }
        if (b < 0)
            break; /* q itself went back to the queue: it was the newest */
        q->blocks[q->n_blocks] = b;
        (void)moec_engine_table_set(e, q->row, q->n_blocks, 1, &b);
        q->n_blocks++;
    }
    return preempted;
}

/* Caches q's full blocks computed since the last time. */
static void publish(moec_sched *s, seq *q)
{
    int bs = s->pool.block_size;
    if (!s->prefix_cache)
        return;
    while ((q->n_hashed + 1) * bs <= q->fed) {
        const int32_t *ids = q->tokens + (size_t)q->n_hashed * bs;
        q->chain = moec_kv_hash(q->chain, ids, bs);
        moec_kv_publish(&s->pool, q->blocks[q->n_hashed], q->chain, ids);
        q->n_hashed++;
    }
}

/* ---- a step ------------------------------------------------------------------ */

/* Puts k of q's waiting tokens into the step. */
static void feed(moec_sched *s, seq *q, int k, int *n)
{
    for (int j = 0; j < k; j++, (*n)++) {
        s->tok[*n] = q->tokens[q->fed + j];
        s->pos[*n] = q->fed + j;
        s->slot[*n] = q->row;
        s->who[*n] = q;
    }
}

/* Decode tokens, then prompt chunks oldest first, then new requests while
 * the step has room (none after a preemption: blocks are short). */
static int build_step(moec_engine_t *e, int preempted)
{
    moec_sched *s = e->sched;
    int n = 0, T = e->max_tokens;
    for (int i = 0; i < s->n_running; i++)
        if (s->running[i]->known - s->running[i]->fed == 1)
            feed(s, s->running[i], 1, &n);
    for (int i = 0; i < s->n_running && n < T; i++) {
        seq *q = s->running[i];
        int wait = q->known - q->fed;
        if (wait > 1)
            feed(s, q, wait < T - n ? wait : T - n, &n);
    }
    while (!preempted && s->wait_head && n < T && s->n_running < s->row_cap) {
        seq *q = s->wait_head;
        if (!admit(e, q))
            break;
        int wait = q->known - q->fed;
        feed(s, q, wait < T - n ? wait : T - n, &n);
    }
    return n;
}

static moec_event *event_push(moec_sched *s, seq *q)
{
    if (s->n_events == s->cap_events) {
        int cap = s->cap_events ? 2 * s->cap_events : 64;
        moec_event *ev = realloc(s->events, (size_t)cap * sizeof *ev);
        if (!ev)
            return NULL;
        s->events = ev;
        s->cap_events = cap;
    }
    moec_event *ev = &s->events[s->n_events++];
    memset(ev, 0, sizeof *ev);
    ev->request = q->id;
    ev->user = q->user;
    return ev;
}

/* The end of q: the metrics on its last event, then q freed (an error
 * event's text set by the caller). */
static void finish(moec_engine_t *e, seq *q, moec_event *ev, moec_finish why)
{
    moec_sched *s = e->sched;
    int n_out = q->known - q->n_prompt;
    ev->finish = why;
    ev->n_prompt = q->n_prompt;
    ev->n_output = n_out;
    ev->cached_tokens = q->cached_tokens;
    ev->ttft_s = n_out ? q->t_first - q->t_submit : 0;
    ev->itl_s = n_out > 1 ? (q->t_last - q->t_first) / (n_out - 1) : 0;
    if (why != MOEC_FINISH_ERROR)
        s->stats.requests_done++;
    seq_end(e, q);
}

static int in_list(const int32_t *ids, int n, int32_t t)
{
    for (int i = 0; i < n; i++)
        if (ids[i] == t)
            return 1;
    return 0;
}

/* A text the step's error events point to, kept until the next step. */
static const char *step_message(moec_sched *s, const char *text)
{
    static const char oom[] = "out of memory for this error's message";
    if (s->n_msgs == s->cap_msgs) {
        int cap = s->cap_msgs ? 2 * s->cap_msgs : 8;
        char **m = realloc(s->msgs, (size_t)cap * sizeof *m);
        if (!m)
            return oom;
        s->msgs = m;
        s->cap_msgs = cap;
    }
    char *m = strdup(text);
    if (!m)
        return oom;
    s->msgs[s->n_msgs++] = m;
    return m;
}

/* Ends q with an error event saying msg (a step_message). */
static void end_with_error(moec_engine_t *e, seq *q, const char *msg)
{
    moec_event *ev = event_push(e->sched, q);
    if (!ev) {
        seq_end(e, q);
        return;
    }
    ev->token = -1;
    ev->error = msg;
    finish(e, q, ev, MOEC_FINISH_ERROR);
}

/* The error of q, whose logits at position pos hold a NaN or an infinity
 * (`how` says when, if not as they came), as a step_message;
 * moec_engine_run's error names the step's first such. */
static const char *nonfinite_message(moec_sched *s, const seq *q, int pos, const char *how)
{
    char text[128];
    snprintf(text, sizeof text, "the logits at position %d hold a NaN or an infinity%s", pos,
             how);
    const char *msg = step_message(s, text);
    if (!s->n_bad++) {
        s->bad_id = q->id;
        s->bad_msg = msg;
    }
    return msg;
}

/* q's next token from step row i: appended, its event pushed, q ended when
 * it stops, or with an error when the row it samples from is not finite
 * (penalties that overflowed: the raw rows were checked). The token comes
 * from the argmax (plain greedy on CUDA), the device sampler, or the host
 * from the row's logits. MOEC_ERR_OOM when the event cannot be stored. */
static moec_status take_token(moec_engine_t *e, seq *q, int i, int first, double now)
{
    moec_sched *s = e->sched;
    moec_event *ev = event_push(s, q);
    if (!ev)
        return MOEC_ERR(MOEC_ERR_OOM, "out of memory for the step's events");
    int32_t t;
    if (e->backend == MOEC_BACKEND_CUDA && q->plain) {
        t = s->next[i];
    } else if (s->on_dev && s->on_dev[i]) {
        t = s->drawn[i];
        if (t != IR_SAMPLED_NONFINITE && (t < 0 || t >= e->vocab))
            return MOEC_ERR(MOEC_ERR_INTERNAL,
                            "the device sampler drew id %d for request %llu (vocabulary %d)", t,
                            (unsigned long long)q->id, e->vocab);
        ev->logprob = q->sp.logprob ? s->dlogprob[i] : 0;
    } else {
        t = moec_sample(&s->sampler, &q->sp, s->logits + (size_t)(i - first) * (size_t)e->vocab,
                        q->tokens, q->n_prompt, q->known, ev);
    }
    if (t == IR_SAMPLED_NONFINITE) {
        ev->token = -1;
        ev->error = nonfinite_message(s, q, s->pos[i], " once the penalties apply");
        finish(e, q, ev, MOEC_FINISH_ERROR);
        return MOEC_OK;
    }
    q->tokens[q->known++] = t;
    ev->token = t;
    ev->index = q->known - q->n_prompt - 1;
    if (!ev->index)
        q->t_first = now;
    q->t_last = now;
    s->stats.generated_tokens++;
    moec_finish why = in_list(q->stop, q->n_stop, t)                           ? MOEC_FINISH_STOP
                      : !q->ignore_eos && in_list(e->eos.ids, e->eos.n, t)     ? MOEC_FINISH_EOS
                      : ev->index + 1 == q->max_new                            ? MOEC_FINISH_LENGTH
                                                                               : MOEC_FINISH_NONE;
    if (why != MOEC_FINISH_NONE)
        finish(e, q, ev, why);
    return MOEC_OK;
}

/* Where each sampled row of the step is sampled. On the CPU every row is
 * computed anyway and sampled here: all rows are host rows. On CUDA a plain
 * greedy request takes the argmax; the device sampler draws the others,
 * their parameter rows and penalty entries handed to it here, except those
 * it cannot serve, whose logits are copied back and sampled on the host:
 * top_logprobs (they need the whole row), penalty entries past the room a
 * step has for them, and every row when the plan has no sampler or
 * MOEC_SAMPLER=host. The host rows are [*first, *first + *count). */
static moec_status plan_rows(moec_engine_t *e, int n, int *first, int *count)
{
    moec_sched *s = e->sched;
    if (e->backend != MOEC_BACKEND_CUDA) {
        *first = 0;
        *count = n;
        return MOEC_OK;
    }
    int lo = n, hi = -1, rows = 0, n_pen = 0;
    if (s->srow)
        memset(s->srow, 0, (size_t)n * sizeof *s->srow);
    for (int i = 0; i < n; i++) {
        const seq *q = s->who[i];
        if (s->on_dev)
            s->on_dev[i] = 0;
        if (s->pos[i] != q->known - 1 || q->plain)
            continue;
        if (s->srow && !q->sp.top_logprobs) {
            int k = moec_sample_penalties(&s->sampler, &q->sp, q->tokens, q->n_prompt, q->known,
                                          s->spen + n_pen, e->sample_cap - n_pen);
            if (k >= 0) {
                moec_sample_row_init(&q->sp, e->vocab, q->known - q->n_prompt, &s->srow[i]);
                s->srow[i].pen_first = n_pen;
                s->srow[i].pen_count = k;
                n_pen += k;
                s->on_dev[i] = 1;
                rows = i + 1;
                continue;
            }
        }
        lo = i < lo ? i : lo;
        hi = i;
    }
    *first = hi < 0 ? 0 : lo;
    *count = hi < 0 ? 0 : hi - lo + 1;
    /* set every step, rows or none: nothing staged outlives its step */
    if (!s->srow)
        return MOEC_OK;
    return moec_engine_set_sampling(e, rows, s->srow, n_pen, s->spen, s->drawn, s->dlogprob);
}

/* Every request of a failed step ends with an error event. */
static void fail_step(moec_engine_t *e, int n)
{
    moec_sched *s = e->sched;
    const char *msg = step_message(s, moec_last_error());
    for (int i = 0; i < n; i++) {
        seq *q = s->who[i];
        if (i + 1 < n && s->who[i + 1] == q)
            continue; /* a request's tokens are adjacent: end it at its last */
        end_with_error(e, q, msg);
    }
}

/* Ends each request of the step with a row of logits that is not finite
 * (its next id IR_SAMPLED_NONFINITE: on CUDA the device's argmax checks
 * every row, copied back or not), naming its first; their rows' who
 * become NULL. Returns how many requests the step holds. */
static int end_nonfinite_rows(moec_engine_t *e, int n)
{
    moec_sched *s = e->sched;
    int requests = 0;
    for (int a = 0, b; a < n; a = b) {
        seq *q = s->who[a];
        int bad = -1;
        for (b = a; b < n && s->who[b] == q; b++) /* a request's tokens are adjacent */
            if (bad < 0 && s->next[b] == IR_SAMPLED_NONFINITE)
                bad = b;
        requests++;
        if (bad < 0)
            continue;
        end_with_error(e, q, nonfinite_message(s, q, s->pos[bad], ""));
        for (int i = a; i < b; i++)
            s->who[i] = NULL;
    }
    return requests;
}

moec_status moec_engine_run(moec_engine_t *e, const moec_event **events, int *n_events)
{
    if (!e || !events || !n_events)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "moec_engine_run: NULL argument");
    moec_sched *s = e->sched;
    *events = NULL;
    *n_events = s->n_events = 0;
    s->n_bad = 0;
    msgs_clear(s);
    if (!s->n_running && !s->n_waiting)
        return MOEC_OK;
    double t0 = moec_now_s();
    int n = build_step(e, grow(e));
    if (!n) /* cannot happen: the oldest running request always has a token */
        return MOEC_ERR(MOEC_ERR_INTERNAL, "a step with nothing to run (%d running, %d waiting)",
                        s->n_running, s->n_waiting);
    int first, count;
    moec_status st = plan_rows(e, n, &first, &count);
    if (st == MOEC_OK && count && !s->logits) {
        s->logits = malloc((size_t)e->max_tokens * (size_t)e->vocab * sizeof *s->logits);
        if (!s->logits)
            return MOEC_ERR(MOEC_ERR_OOM, "out of memory for %d rows of logits", e->max_tokens);
    }
    if (st == MOEC_OK)
        st = moec_engine_forward(e, n, s->tok, s->pos, s->slot, s->next, first, count,
                                 count ? s->logits : NULL);
    if (st == MOEC_OK) {
        for (int i = 0; i < n; i++)
            s->who[i]->fed = s->pos[i] + 1;
        int requests = end_nonfinite_rows(e, n);
        for (int i = 0; i < n; i++)
            if (s->who[i] && (i + 1 == n || s->who[i + 1] != s->who[i]))
                publish(s, s->who[i]);
        double now = moec_now_s();
        for (int i = 0; i < n && st == MOEC_OK; i++)
            if (s->who[i] && s->pos[i] == s->who[i]->known - 1)
                st = take_token(e, s->who[i], i, first, now);
        if (st == MOEC_OK && s->n_bad)
            st = MOEC_ERR(MOEC_ERR_NUMERIC,
                          "step %llu, request %llu: %s (%d of the step's %d requests end with "
                          "such an error)",
                          (unsigned long long)s->stats.steps, (unsigned long long)s->bad_id,
                          s->bad_msg, s->n_bad, requests);
    } else {
        fail_step(e, n);
    }
    s->stats.steps++;
    s->stats.busy_s += moec_now_s() - t0;
    *events = s->events;
    *n_events = s->n_events;
    return st;
}

/* ---- cancelling, stats ---------------------------------------------------------- */

moec_status moec_engine_cancel(moec_engine_t *e, uint64_t id)
{
    if (!e)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "moec_engine_cancel: NULL engine");
    moec_sched *s = e->sched;
    for (int i = 0; i < s->n_running; i++)
        if (s->running[i]->id == id) {
            seq_end(e, s->running[i]);
            s->stats.requests_cancelled++;
            return MOEC_OK;
        }
    for (seq **at = &s->wait_head; *at; at = &(*at)->next) {
        seq *q = *at;
        if (q->id != id)
            continue;
        *at = q->next;
        if (s->wait_tail == q) {
            s->wait_tail = NULL;
            for (seq *w = s->wait_head; w; w = w->next)
                s->wait_tail = w;
        }
        s->n_waiting--;
        seq_free(q);
        s->stats.requests_cancelled++;
        return MOEC_OK;
    }
    return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                    "no request %llu is waiting or running (finished, cancelled or never "
                    "submitted)",
                    (unsigned long long)id);
}

void moec_engine_get_stats(const moec_engine_t *e, moec_engine_stats *out)
{
    if (!out)
        return;
    memset(out, 0, sizeof *out);
    if (!e || !e->sched)
        return;
    const moec_sched *s = e->sched;
    *out = s->stats;
    out->running = s->n_running;
    out->waiting = s->n_waiting;
    out->kv_blocks_used = s->pool.n_blocks - s->pool.n_free;
    out->kv_blocks_cached = s->pool.n_cached;
    out->prefix_hit_rate =
        out->prompt_tokens ? (double)out->cached_tokens / (double)out->prompt_tokens : 0;
    out->tokens_per_s = out->busy_s > 0 ? (double)out->generated_tokens / out->busy_s : 0;
}

const char *moec_finish_name(moec_finish f)
{
    switch (f) {
    case MOEC_FINISH_NONE: return "none";
    case MOEC_FINISH_LENGTH: return "length";
    case MOEC_FINISH_EOS: return "eos";
    case MOEC_FINISH_STOP: return "stop";
    case MOEC_FINISH_ERROR: return "error";
    }
    return "unknown";
}
