/* test_sched.c — the engine's scheduler (moec_engine_submit / _run /
 * _cancel) on the CPU, on every tiny model: 40 requests with random prompts
 * (many sharing prefixes), lengths and sampling settings, submitted at once
 * to an engine of 5 rows over a pool too small for them all (so they queue,
 * and decoding ones preempt the newest), give the very tokens and log
 * probabilities each gives run alone on an engine without prefix caching;
 * prefix caching saved prefill (cached_tokens) and preemption happened; a
 * prefix shared by hand through the block table gives bit-identical logits
 * to computing it; the same seed gives the same tokens and other seeds
 * others; top_k 1, a tiny top_p and min_p 1 are greedy, and a sampled token
 * lies in its top_k; stop ids, eos and length end requests with their
 * reasons; cancelling frees a request's blocks; stats count what happened;
 * every refusal with its status and message. The first three hold too for
 * models split over ranks (tp, ep: every rank's interpreter with its shard
 * of each block of the pool, one block table for them all), a split's
 * requests together against the same split's alone. */
#include <math.h>
#include <string.h>

#include "testlib.h"

static const char *MODELS[] = {"deepseek_v2", "deepseek_v2_qlora", "deepseek_v3", "qwen2_moe",
                               "qwen3_moe",   "deepseek_v32"};

#define N_REQ 40
#define MAX_PROMPT 40
#define MAX_NEW 24
#define BS 4 /* tokens per KV block */

typedef struct spec {
    int32_t prompt[MAX_PROMPT];
    int n_prompt, max_new;
    int32_t stop[2];
    int n_stop;
    moec_sampling sp;
} spec;

typedef struct result {
    int32_t tokens[MAX_NEW];
    float logprob[MAX_NEW];
    int32_t top[MAX_NEW][3];
    int n;
    moec_finish finish;
    int cached, n_prompt, n_output;
    double ttft, itl;
    int events_after_end; /* events that came after the last one */
} result;

/* Random requests: a third start with one of three shared 20-token
 * prefixes; sampling greedy, seeded temperature, top_k, top_p, min_p,
 * penalties, with log probabilities here and there. */
static void make_specs(spec *sp, int n, int V, uint64_t seed)
{
    int32_t shared[3][20];
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < 20; i++)
            shared[k][i] = (int32_t)(t_rand_u64(&seed) % (uint64_t)V);
    for (int r = 0; r < n; r++) {
        spec *s = &sp[r];
        memset(s, 0, sizeof *s);
        s->n_prompt = 1 + (int)(t_rand_u64(&seed) % MAX_PROMPT);
        s->max_new = 1 + (int)(t_rand_u64(&seed) % MAX_NEW);
        int share = r % 3 == 0 ? (int)(t_rand_u64(&seed) % 3) : -1;
        for (int i = 0; i < s->n_prompt; i++)
            s->prompt[i] = share >= 0 && i < 20 ? shared[share][i]
                                                : (int32_t)(t_rand_u64(&seed) % (uint64_t)V);
        moec_sampling *p = &s->sp;
        p->seed = t_rand_u64(&seed);
        switch (r % 6) {
        case 0: break; /* greedy */
        case 1: p->temperature = 0.8f; break;
        case 2: p->temperature = 1.2f, p->top_k = 5; break;
        case 3: p->temperature = 1.0f, p->top_p = 0.7f, p->min_p = 0.05f; break;
        case 4: p->temperature = 0.7f, p->repetition_penalty = 1.3f, p->presence_penalty = 0.5f,
                p->frequency_penalty = 0.3f; break;
        case 5: p->repetition_penalty = 1.5f; break; /* greedy with a penalty */
        }
        p->logprob = r % 4 == 1;
        p->top_logprobs = r % 5 == 2 ? 3 : 0;
    }
}

static moec_request request_of(const spec *s, void *user)
{
    return (moec_request){.prompt = s->prompt,
                          .n_prompt = s->n_prompt,
                          .max_tokens = s->max_new,
                          .stop_ids = s->stop,
                          .n_stop = s->n_stop,
                          .ignore_eos = 1,
                          .sampling = s->sp,
                          .user = user};
}

/* Files n events into res by each event's user index. */
static void record(result *res, const moec_event *ev, int n)
{
    for (int i = 0; i < n; i++) {
        result *r = &res[(intptr_t)ev[i].user];
        if (r->finish != MOEC_FINISH_NONE) {
            r->events_after_end++;
            continue;
        }
        if (ev[i].finish != MOEC_FINISH_ERROR && r->n < MAX_NEW) {
            T_CHECK(ev[i].index == r->n);
            r->logprob[r->n] = ev[i].logprob;
            for (int k = 0; k < ev[i].n_top && k < 3; k++)
                r->top[r->n][k] = ev[i].top_ids[k];
            r->tokens[r->n++] = ev[i].token;
        }
        if (ev[i].finish != MOEC_FINISH_NONE) {
            r->finish = ev[i].finish;
            r->cached = ev[i].cached_tokens;
            r->n_prompt = ev[i].n_prompt;
            r->n_output = ev[i].n_output;
            r->ttft = ev[i].ttft_s;
            r->itl = ev[i].itl_s;
        }
    }
}

/* One step of e, its events filed into res. */
static void step(moec_engine_t *e, result *res)
{
    const moec_event *ev;
    int n;
    T_OK(moec_engine_run(e, &ev, &n));
    record(res, ev, n);
}

/* Runs e until nothing is pending, filing the events into res. */
static void drain(moec_engine_t *e, result *res, int *max_waiting, int *max_running)
{
    for (int guard = 0; moec_engine_pending(e) && guard < 100000; guard++) {
        step(e, res);
        moec_engine_stats st;
        moec_engine_get_stats(e, &st);
        if (max_waiting && st.waiting > *max_waiting)
            *max_waiting = st.waiting;
        if (max_running && st.running > *max_running)
            *max_running = st.running;
    }
}

/* The split the engines of open_cpu are opened with (zeroed: none). */
static moec_parallel g_par;

static moec_engine_t *open_cpu(const moec_model_t *m, const char *dir, int max_seqs, int blocks,
                               int no_prefix)
{
    moec_engine_options o = {.backend = MOEC_BACKEND_CPU, .max_seqs = max_seqs,
                             .max_seq_len = 128, .kv_blocks = blocks, .kv_block_size = BS,
                             .no_prefix_cache = no_prefix, .par = g_par};
    moec_engine_t *e = NULL;
    T_OK(moec_engine_open(m, dir, &o, &e));
    return e;
}

static int same_result(const result *a, const result *b)
{
    return a->n == b->n && a->finish == b->finish &&
           !memcmp(a->tokens, b->tokens, (size_t)a->n * sizeof *a->tokens) &&
           !memcmp(a->logprob, b->logprob, (size_t)a->n * sizeof *a->logprob) &&
           !memcmp(a->top, b->top, (size_t)a->n * sizeof *a->top);
}

/* The requests alone (one at a time, no prefix cache) and together (5 rows,
 * 40 blocks of 4 tokens, prefix cache on). */
static void check_together(const moec_model_t *m, const char *name, const char *dir)
{
    int V = moec_model_vocab_size(m);
    static spec specs[N_REQ];
    static result alone[N_REQ], together[N_REQ];
    make_specs(specs, N_REQ, V, 0x5eed + (uint64_t)V);
    memset(alone, 0, sizeof alone);
    memset(together, 0, sizeof together);

    moec_engine_t *e = open_cpu(m, dir, 1, 0, 1);
    if (!e)
        return;
    for (int r = 0; r < N_REQ; r++) {
        moec_request q = request_of(&specs[r], (void *)(intptr_t)r);
        uint64_t id;
        T_OK(moec_engine_submit(e, &q, &id));
        drain(e, alone, NULL, NULL);
    }
    moec_engine_free(e);

    e = open_cpu(m, dir, 5, 40, 0);
    if (!e)
        return;
    T_CHECK(moec_engine_kv_blocks(e) == 40 && moec_engine_kv_block_size(e) == BS);
    for (int r = 0; r < N_REQ; r++) {
        moec_request q = request_of(&specs[r], (void *)(intptr_t)r);
        uint64_t id;
        T_OK(moec_engine_submit(e, &q, &id));
    }
    int max_waiting = 0, max_running = 0;
    drain(e, together, &max_waiting, &max_running);
    moec_engine_stats st;
    moec_engine_get_stats(e, &st);
    int same = 0, cached = 0, ends = 0, timed = 1;
    for (int r = 0; r < N_REQ; r++) {
        same += same_result(&alone[r], &together[r]);
        cached += together[r].cached;
        ends += together[r].events_after_end;
        timed &= together[r].ttft >= 0 && together[r].itl >= 0 &&
                 together[r].n_output == together[r].n && together[r].n_prompt ==
                 specs[r].n_prompt && together[r].finish == MOEC_FINISH_LENGTH;
    }
    printf("%-18s %d requests together (5 rows, 40 blocks of %d; up to %d waiting): %d of %d "
           "identical to alone; %d prompt tokens cached, %llu preemptions\n",
           name, N_REQ, BS, max_waiting, same, N_REQ, cached,
           (unsigned long long)st.preemptions);
    T_CHECK(same == N_REQ);
    T_CHECK(ends == 0 && timed);
    T_CHECK(max_waiting > 0 && max_running == 5);
    T_CHECK(cached > 0 && st.preemptions > 0);
    T_CHECK(st.running == 0 && st.waiting == 0 && st.kv_blocks_used == 0);
    T_CHECK(st.requests_done == N_REQ && st.cached_tokens == (uint64_t)cached);
    T_CHECK(st.prefix_hit_rate > 0 && st.prefix_hit_rate < 1 && st.tokens_per_s > 0);
    T_CHECK(st.kv_blocks == 40 && st.kv_block_size == BS && st.steps > 0);
    T_CHECK(moec_engine_max_len(e) == 128); /* max_seq_len: the pool holds 161 */
    moec_engine_free(e);
}

/* Row 1 starts with row 0's first two blocks (8 tokens computed there) and
 * computes the rest: its logits are bit-identical to row 2 computing the
 * whole prompt. */
static void check_shared_blocks(const moec_model_t *m, const char *name, const char *dir)
{
    int V = moec_model_vocab_size(m);
    moec_engine_t *e = open_cpu(m, dir, 3, 30, 0);
    if (!e)
        return;
    enum { P = 13 };
    int32_t tok[P], pos[P], row[P];
    for (int i = 0; i < P; i++)
        tok[i] = (int32_t)((i * 71 + 9) % V), pos[i] = i;
    int32_t b0[4] = {0, 1, 2, 3}, b1[4] = {0, 1, 4, 5}, b2[4] = {6, 7, 8, 9};
    T_OK(moec_engine_set_blocks(e, 0, 0, 4, b0));
    T_OK(moec_engine_set_blocks(e, 1, 0, 4, b1));
    T_OK(moec_engine_set_blocks(e, 2, 0, 4, b2));
    float *fresh = malloc((size_t)P * V * sizeof *fresh), *shared = malloc((size_t)P * V * 4);
    for (int i = 0; i < P; i++)
        row[i] = 0;
    T_OK(moec_engine_step(e, 8, tok, pos, row, NULL, NULL));
    for (int i = 0; i < P; i++)
        row[i] = 1;
    T_OK(moec_engine_step(e, P - 8, tok + 8, pos + 8, row, NULL, shared));
    for (int i = 0; i < P; i++)
        row[i] = 2;
    T_OK(moec_engine_step(e, P, tok, pos, row, NULL, fresh));
    int same = !memcmp(shared, fresh + (size_t)8 * V, (size_t)(P - 8) * V * sizeof *fresh);
    printf("%-18s a prefix of 2 blocks shared through the block table: logits %s\n", name,
           same ? "bit-identical to computing it" : "DIFFER");
    T_CHECK(same);
    free(fresh);
    free(shared);
    moec_engine_free(e);
}

/* A prompt of 20 tokens + 1 computed; then, while it still decodes (its
 * blocks held), one sharing its 20 and one equal to it: each skips 20
 * tokens of prefill (the last prompt token is always computed), with the
 * tokens and log probabilities of an engine without prefix caching. */
static void check_prefix(const moec_model_t *m, const char *name, const char *dir)
{
    int V = moec_model_vocab_size(m);
    spec s[3];
    memset(s, 0, sizeof s);
    for (int r = 0; r < 3; r++) {
        s[r].n_prompt = r == 1 ? 23 : 21;
        s[r].max_new = 12;
        for (int i = 0; i < s[r].n_prompt; i++)
            s[r].prompt[i] = (int32_t)(i < 20 ? (i * 13 + 1) % V : (r * 7 + i) % V);
        s[r].sp = (moec_sampling){.temperature = 0.9f, .seed = 77, .logprob = 1};
    }
    s[2] = s[0];
    static result res[2][3];
    memset(res, 0, sizeof res);
    for (int cache = 0; cache < 2; cache++) {
        moec_engine_t *e = open_cpu(m, dir, 4, 0, !cache);
        if (!e)
            return;
        for (int r = 0; r < 3; r++) {
            moec_request q = request_of(&s[r], (void *)(intptr_t)r);
            uint64_t id;
            T_OK(moec_engine_submit(e, &q, &id));
            if (r == 0)
                for (int k = 0; k < 3; k++)
                    step(e, res[cache]);
        }
        drain(e, res[cache], NULL, NULL);
        moec_engine_stats st;
        moec_engine_get_stats(e, &st);
        T_CHECK(st.cached_tokens == (cache ? 40u : 0u) && st.prompt_tokens == 21 + 23 + 21);
        moec_engine_free(e);
    }
    int same = 1;
    for (int r = 0; r < 3; r++)
        same &= same_result(&res[0][r], &res[1][r]) && res[0][r].n == 12;
    printf("%-18s prefix cache: cached_tokens %d, %d, %d (without: %d, %d, %d); tokens and "
           "log probabilities %s\n",
           name, res[1][0].cached, res[1][1].cached, res[1][2].cached, res[0][0].cached,
           res[0][1].cached, res[0][2].cached, same ? "identical" : "DIFFER");
    T_CHECK(same);
    T_CHECK(res[1][0].cached == 0 && res[1][1].cached == 20 && res[1][2].cached == 20);
    T_CHECK(res[0][1].cached == 0 && res[0][2].cached == 0);

    /* Steps below the scheduler may write any block: the cache forgets. */
    moec_engine_t *e = open_cpu(m, dir, 4, 0, 0);
    if (!e)
        return;
    static result again[2];
    memset(again, 0, sizeof again);
    for (int k = 0; k < 2; k++) {
        moec_request q = request_of(&s[0], (void *)(intptr_t)k);
        uint64_t id;
        T_OK(moec_engine_submit(e, &q, &id));
        drain(e, again, NULL, NULL);
        if (k)
            break;
        int32_t all[8] = {0, 1, 2, 3, 4, 5, 6, 7}, tok[4] = {9, 9, 9, 9}, pos[4] = {0, 1, 2, 3};
        int32_t row[4] = {0, 0, 0, 0};
        T_OK(moec_engine_set_blocks(e, 0, 0, 8, all));
        T_OK(moec_engine_step(e, 4, tok, pos, row, NULL, NULL));
    }
    moec_engine_stats st;
    moec_engine_get_stats(e, &st);
    T_CHECK(again[1].cached == 0 && same_result(&again[0], &again[1]) &&
            same_result(&again[0], &res[0][0]) && st.kv_blocks_cached > 0);
    moec_engine_free(e);
}

static void run_one(moec_engine_t *e, const spec *s, result *r)
{
    memset(r, 0, sizeof *r);
    moec_request q = request_of(s, (void *)0);
    q.ignore_eos = 0;
    uint64_t id;
    T_OK(moec_engine_submit(e, &q, &id));
    drain(e, r, NULL, NULL);
}

/* Seeds, filters that reduce to greedy, top_k's support, stop ids and
 * finish reasons. */
static void check_sampling(const moec_model_t *m, const char *dir)
{
    moec_engine_t *e = open_cpu(m, dir, 4, 0, 0);
    if (!e)
        return;
    int V = moec_model_vocab_size(m);
    spec s = {.n_prompt = 5, .max_new = 16};
    for (int i = 0; i < s.n_prompt; i++)
        s.prompt[i] = (int32_t)(i * 37 % V);
    result greedy, a, b, c;
    run_one(e, &s, &greedy);
    s.sp.temperature = 1.5f;
    s.sp.seed = 42;
    run_one(e, &s, &a);
    run_one(e, &s, &b);
    T_CHECK(same_result(&a, &b));
    int differ = 0;
    for (uint64_t seed = 1; seed <= 4; seed++) {
        s.sp.seed = seed;
        run_one(e, &s, &c);
        differ += !same_result(&a, &c);
    }
    printf("sampling           seed 42 twice: %s; 4 other seeds: %d of 4 differ\n",
           same_result(&a, &b) ? "identical" : "DIFFER", differ);
    T_CHECK(differ >= 3);

    const moec_sampling greedy_ways[] = {{.temperature = 1.5f, .top_k = 1, .seed = 3},
                                         {.temperature = 1.5f, .top_p = 1e-6f, .seed = 3},
                                         {.temperature = 1.5f, .min_p = 1.0f, .seed = 3}};
    for (size_t k = 0; k < sizeof greedy_ways / sizeof *greedy_ways; k++) {
        s.sp = greedy_ways[k];
        run_one(e, &s, &c);
        T_CHECK(c.n == greedy.n && !memcmp(c.tokens, greedy.tokens, sizeof c.tokens));
    }
    /* top_k 3: every token among the 3 likeliest (no penalty: the raw ones) */
    s.sp = (moec_sampling){.temperature = 2.0f, .top_k = 3, .seed = 9, .top_logprobs = 3,
                           .logprob = 1};
    run_one(e, &s, &c);
    int inside = 1;
    for (int i = 0; i < c.n; i++)
        inside &= c.tokens[i] == c.top[i][0] || c.tokens[i] == c.top[i][1] ||
                  c.tokens[i] == c.top[i][2];
    T_CHECK(inside && c.n == 16);
    T_CHECK(c.logprob[0] < 0 && c.logprob[0] > -30);

    /* the third greedy token as a stop id: the output ends there */
    s.sp = (moec_sampling){0};
    s.stop[0] = greedy.tokens[2];
    s.n_stop = 1;
    run_one(e, &s, &c);
    int at = 0;
    while (greedy.tokens[at] != s.stop[0])
        at++;
    T_CHECK(c.finish == MOEC_FINISH_STOP && c.n == at + 1);
    T_CHECK(!strcmp(moec_finish_name(c.finish), "stop"));
    T_CHECK(greedy.finish == MOEC_FINISH_LENGTH || greedy.finish == MOEC_FINISH_EOS);
    T_CHECK(!strcmp(moec_finish_name(MOEC_FINISH_LENGTH), "length") &&
            !strcmp(moec_finish_name(MOEC_FINISH_EOS), "eos") &&
            !strcmp(moec_finish_name(MOEC_FINISH_ERROR), "error") &&
            !strcmp(moec_finish_name(MOEC_FINISH_NONE), "none"));
    moec_engine_free(e);
}

/* An eos id among the greedy tokens ends a request unless ignore_eos. */
static void check_eos(const moec_model_t *m, const char *dir)
{
    moec_engine_t *e = open_cpu(m, dir, 2, 0, 0);
    if (!e)
        return;
    const int32_t *eos;
    int n_eos = moec_engine_eos_tokens(e, &eos);
    /* deepseek_v2's [116] continues 64, 1 (eos 1): see test_serve.sh */
    spec s = {.prompt = {116}, .n_prompt = 1, .max_new = 8};
    result r;
    run_one(e, &s, &r);
    T_CHECK(n_eos >= 1 && r.finish == MOEC_FINISH_EOS && r.n == 2 && r.tokens[1] == eos[0]);
    moec_engine_free(e);
}

/* Cancelling a running and a waiting request: no more events, blocks back. */
static void check_cancel(const moec_model_t *m, const char *dir)
{
    moec_engine_t *e = open_cpu(m, dir, 2, 0, 0);
    if (!e)
        return;
    spec s = {.n_prompt = 6, .max_new = 20};
    for (int i = 0; i < s.n_prompt; i++)
        s.prompt[i] = (int32_t)(i + 3);
    uint64_t id[3];
    static result res[3];
    memset(res, 0, sizeof res);
    for (int r = 0; r < 3; r++) {
        moec_request q = request_of(&s, (void *)(intptr_t)r);
        T_OK(moec_engine_submit(e, &q, &id[r]));
        T_CHECK(id[r] == (uint64_t)r + 1);
    }
    step(e, res);
    step(e, res);
    moec_engine_stats st;
    moec_engine_get_stats(e, &st);
    T_CHECK(st.running == 2 && st.waiting == 1 && st.kv_blocks_used > 0);
    T_CHECK(res[0].n == 2 && res[1].n == 2 && res[2].n == 0);
    T_OK(moec_engine_cancel(e, id[0]));
    T_OK(moec_engine_cancel(e, id[2]));
    T_ERR(moec_engine_cancel(e, id[2]), MOEC_ERR_INVALID_ARG,
          "no request 3 is waiting or running (finished, cancelled or never submitted)");
    T_ERR(moec_engine_cancel(e, 99), MOEC_ERR_INVALID_ARG, "no request 99");
    T_CHECK(moec_engine_pending(e) == 1);
    drain(e, res, NULL, NULL);
    moec_engine_get_stats(e, &st);
    T_CHECK(res[0].n == 2 && res[0].finish == MOEC_FINISH_NONE && res[2].n == 0 &&
            res[1].n == 20);
    T_CHECK(st.requests_cancelled == 2 && st.requests_done == 1 && st.kv_blocks_used == 0);
    const moec_event *ev;
    int n;
    T_CHECK(moec_engine_run(e, &ev, &n) == MOEC_OK && n == 0);
    moec_engine_free(e);
}

/* Every refusal, with its status and message. */
static void check_refusals(const moec_model_t *m, const char *dir)
{
    moec_engine_t *e = open_cpu(m, dir, 2, 10, 0); /* 10 blocks of 4, 128 tokens a sequence */
    if (!e)
        return;
    int32_t p[3] = {1, 2, 3}, bad[2] = {1, 256}, stop[1] = {300};
    moec_request r = {.prompt = p, .n_prompt = 3, .max_tokens = 4};
    uint64_t id = 7;
    T_ERR(moec_engine_submit(NULL, &r, &id), MOEC_ERR_INVALID_ARG, "NULL argument");
    T_ERR(moec_engine_submit(e, &r, NULL), MOEC_ERR_INVALID_ARG, "NULL argument");
    moec_request q = r;
    q.n_prompt = 0;
    T_ERR(moec_engine_submit(e, &q, &id), MOEC_ERR_INVALID_ARG,
          "a request needs a prompt of at least one token");
    T_CHECK(id == 0);
    q = r, q.prompt = bad, q.n_prompt = 2;
    T_ERR(moec_engine_submit(e, &q, &id), MOEC_ERR_INVALID_ARG,
          "prompt token 1: id 256 is outside the vocabulary (256 ids)");
    q = r, q.max_tokens = 0;
    T_ERR(moec_engine_submit(e, &q, &id), MOEC_ERR_INVALID_ARG,
          "max_tokens must be at least 1, got 0");
    q = r, q.n_stop = 1;
    T_ERR(moec_engine_submit(e, &q, &id), MOEC_ERR_INVALID_ARG, "1 stop ids and no list of them");
    q = r, q.stop_ids = stop, q.n_stop = 1;
    T_ERR(moec_engine_submit(e, &q, &id), MOEC_ERR_INVALID_ARG,
          "stop id 300 is outside the vocabulary (256 ids)");
    static const struct {
        moec_sampling sp;
        const char *msg;
    } bad_sp[] = {
        {{.temperature = -1}, "temperature must be a finite number >= 0, got -1"},
        {{.temperature = NAN}, "temperature must be a finite number >= 0, got nan"},
        {{.top_k = -2}, "top_k must be 0 (all) or more, got -2"},
        {{.top_p = 1.5f}, "top_p must be a number from 0 to 1, got 1.5"},
        {{.min_p = -0.5f}, "min_p must be a number from 0 to 1, got -0.5"},
        {{.repetition_penalty = -1}, "repetition_penalty must be a finite number >= 0, got -1"},
        {{.presence_penalty = 3}, "presence_penalty must be a number from -2 to 2, got 3"},
        {{.frequency_penalty = -2.5f}, "frequency_penalty must be a number from -2 to 2, got -2.5"},
        {{.logprob = 2}, "logprob must be 0 or 1, got 2"},
        {{.top_logprobs = 21}, "top_logprobs must be from 0 to 20, got 21"},
    };
    for (size_t k = 0; k < sizeof bad_sp / sizeof *bad_sp; k++) {
        q = r, q.sampling = bad_sp[k].sp;
        T_ERR(moec_engine_submit(e, &q, &id), MOEC_ERR_INVALID_ARG, bad_sp[k].msg);
    }
    q = r, q.max_tokens = 126;
    T_ERR(moec_engine_submit(e, &q, &id), MOEC_ERR_CAPACITY,
          "too long: 3 prompt + 126 new = 129 tokens, more than the 128 a sequence may hold "
          "(max_seq_len)");
    q = r, q.max_tokens = 38; /* 41 tokens, the last never fed: exactly the pool */
    T_CHECK(moec_engine_max_len(e) == 41);
    T_OK(moec_engine_submit(e, &q, &id));
    T_CHECK(id == 1);
    int32_t longer[4] = {1, 2, 3, 4};
    q.prompt = longer, q.n_prompt = 4;
    uint64_t none = 5;
    T_ERR(moec_engine_submit(e, &q, &none), MOEC_ERR_CAPACITY,
          "too long: 4 prompt + 38 new tokens need 11 KV blocks of 4 tokens, and the whole pool "
          "has 10");
    /* The scheduler owns the table while it has requests. */
    int32_t t = 1, pos = 0, row = 0, blk = 0;
    T_ERR(moec_engine_step(e, 1, &t, &pos, &row, NULL, NULL), MOEC_ERR_INVALID_ARG,
          "moec_engine_step: the scheduler has 1 requests and owns the block table until they "
          "end");
    T_ERR(moec_engine_set_blocks(e, 0, 0, 1, &blk), MOEC_ERR_INVALID_ARG,
          "moec_engine_set_blocks: the scheduler has 1 requests");
    T_OK(moec_engine_cancel(e, id));
    /* Below it: the table's own checks (this pool has no block per row). */
    T_ERR(moec_engine_step(e, 1, &t, &pos, &row, NULL, NULL), MOEC_ERR_INVALID_ARG,
          "token 0: position 0 of slot 0 has no KV block (entry 0 of its row of the block "
          "table is -1)");
    T_ERR(moec_engine_set_blocks(e, 2, 0, 1, &blk), MOEC_ERR_INVALID_ARG,
          "block table: row 2 is not in [0, 2)");
    T_ERR(moec_engine_set_blocks(e, 0, 31, 2, p), MOEC_ERR_INVALID_ARG,
          "block table: entries 31 .. 32 of row 0: a row has 32 entries");
    /* entries past INT_MAX are named as they are, not wrapped negative */
    T_ERR(moec_engine_set_blocks(e, 0, INT32_MAX, 2, p), MOEC_ERR_INVALID_ARG,
          "block table: entries 2147483647 .. 2147483648 of row 0: a row has 32 entries");
    blk = 10;
    T_ERR(moec_engine_set_blocks(e, 0, 0, 1, &blk), MOEC_ERR_INVALID_ARG,
          "block table: entry 0 of row 0: block 10 is not in [0, 10) or -1");
    T_ERR(moec_engine_set_blocks(NULL, 0, 0, 1, &blk), MOEC_ERR_INVALID_ARG, "NULL engine");
    const moec_event *ev;
    int n;
    T_ERR(moec_engine_run(e, NULL, &n), MOEC_ERR_INVALID_ARG, "moec_engine_run: NULL argument");
    T_ERR(moec_engine_cancel(NULL, 1), MOEC_ERR_INVALID_ARG, "NULL engine");
    T_CHECK(moec_engine_run(e, &ev, &n) == MOEC_OK && n == 0 && moec_engine_pending(e) == 0);
    T_CHECK(moec_engine_pending(NULL) == 0 && moec_engine_kv_blocks(NULL) == 0);
    moec_engine_stats st;
    moec_engine_get_stats(NULL, &st);
    T_CHECK(st.kv_blocks == 0 && st.steps == 0);
    moec_engine_free(e);

    moec_engine_options o = {.backend = MOEC_BACKEND_CPU, .kv_blocks = -1};
    T_ERR(moec_engine_open(m, dir, &o, &e), MOEC_ERR_INVALID_ARG,
          "kv_blocks must be 0 (sized for you) or more, got -1");
    o.kv_blocks = 0, o.kv_memory_fraction = 1.5;
    T_ERR(moec_engine_open(m, dir, &o, &e), MOEC_ERR_INVALID_ARG,
          "kv_memory_fraction must be from 0 to 1 (0: 0.9), got 1.5");
    o.kv_memory_fraction = 0, o.kv_block_size = 5000;
    T_ERR(moec_engine_open(m, dir, &o, &e), MOEC_ERR_INVALID_ARG,
          "kv_block_size must be from 1 to 4096 tokens (0: the default), got 5000");
    /* The CPU pool's default: max_seqs sequences of max_seq_len, blocks of 16. */
    o = (moec_engine_options){.backend = MOEC_BACKEND_CPU, .max_seqs = 3};
    T_OK(moec_engine_open(m, dir, &o, &e));
    T_CHECK(moec_engine_kv_block_size(e) == 16 && moec_engine_kv_blocks(e) == 3 * 512 / 16);
    moec_engine_free(e);
}

/* A model split over ranks schedules as it does whole. */
static void check_splits(void)
{
    static const struct {
        const char *model;
        moec_parallel par;
    } SPLITS[] = {{"deepseek_v2", {2, 0, 0, 0}}, {"qwen3_moe", {4, 2, 0, 0}}};
    for (size_t i = 0; i < sizeof SPLITS / sizeof *SPLITS; i++) {
        const char *dir;
        moec_model_t *m = t_open_tiny(SPLITS[i].model, &dir);
        if (!m)
            continue;
        char name[64];
        snprintf(name, sizeof name, "%s tp%d ep%d", SPLITS[i].model, SPLITS[i].par.tp,
                 SPLITS[i].par.ep);
        g_par = SPLITS[i].par;
        check_together(m, name, dir);
        check_shared_blocks(m, name, dir);
        check_prefix(m, name, dir);
        memset(&g_par, 0, sizeof g_par);
        moec_model_free(m);
    }
}

int main(void)
{
    for (size_t i = 0; i < sizeof MODELS / sizeof *MODELS; i++) {
        const char *dir;
        moec_model_t *m = t_open_tiny(MODELS[i], &dir);
        if (!m)
            continue;
        check_together(m, MODELS[i], dir);
        check_shared_blocks(m, MODELS[i], dir);
        check_prefix(m, MODELS[i], dir);
        if (!strcmp(MODELS[i], "deepseek_v2")) {
            check_sampling(m, dir);
            check_eos(m, dir);
        }
        if (!strcmp(MODELS[i], "qwen3_moe")) {
            check_cancel(m, dir);
            check_refusals(m, dir);
        }
        moec_model_free(m);
    }
    check_splits();
    return t_finish("test_sched");
}
