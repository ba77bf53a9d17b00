/* test_engine.c — the multi-sequence engine (moec_engine_*) on the CPU, on
 * every tiny model in tests/data: the golden prompt greedy-decoded in one
 * slot gives transformers' greedy ids (deepseek_v32, whose goldens are
 * pending: a session's, over a context past its index_topk); three sequences whose prompts are
 * chunked and interleaved with each other's decode tokens (a slot's tokens
 * split into runs that are not adjacent in the step, one sequence starting
 * while the others decode) give bit for bit the logits and ids each gives
 * alone in a moec_session; a new sequence in a used slot equals a fresh
 * run; the defaults; every bad argument, with its status and message, and a
 * rejected step runs nothing. */
#include <cjson/cJSON.h>
#include <string.h>

#include "testlib.h"

static const char *MODELS[] = {"deepseek_v2", "deepseek_v2_qlora", "deepseek_v3", "qwen2_moe",
                               "qwen3_moe",   "deepseek_v32"};

#define N_SEQ 3
#define DECODE 4     /* greedy steps after each prompt */
#define MAX_LEN 16   /* the longest prompt + DECODE */
#define SLOTS 4
#define SEQ_LEN 64

static const int PROMPT_LEN[N_SEQ] = {8, 5, 11};
static const int SLOT_OF[N_SEQ] = {1, 3, 0};
static const int CHUNK[N_SEQ] = {3, 5, 4}; /* prompt tokens a sequence gets per step */
static const int START_STEP[N_SEQ] = {0, 0, 1};

static int32_t seq_token(int s, int i, int V) { return (int32_t)((s * 53 + i * 29 + 3) % V); }

/* t_json_ints, -1 when the array holds more than cap. */
static int read_ints(const cJSON *arr, int32_t *out, int cap)
{
    int n = t_json_ints(arr, out, cap);
    return n <= cap ? n : -1;
}

/* A sequence run alone in a CPU session: prompt, then DECODE greedy tokens;
 * rows gets (P + DECODE) rows, ids the DECODE + 1 greedy ids. */
static void run_alone(const moec_model_t *m, const char *dir, const int32_t *prompt, int P,
                      float *rows, int32_t *ids)
{
    int V = moec_model_vocab_size(m);
    moec_session_t *s = NULL;
    T_OK(moec_session_init(m, dir, MOEC_BACKEND_CPU, P + DECODE, &s));
    if (!s)
        return;
    T_OK(moec_session_forward(s, prompt, P, rows));
    for (int k = 0; k <= DECODE; k++) {
        ids[k] = t_argmax(rows + (size_t)(P - 1 + k) * V, V);
        if (k < DECODE)
            T_OK(moec_session_forward(s, &ids[k], 1, rows + (size_t)(P + k) * V));
    }
    moec_session_free(s);
}

/* The greedy ids to expect from the golden prompt: transformers' from
 * golden.json; for a model whose goldens are pending (test_golden's
 * GOLDENS_PENDING: deepseek_v32) those of prompt.json's prompt run alone
 * in a CPU session, DECODE + 1 of them. Returns the count (0: none). */
static int golden_ids(const moec_model_t *m, const char *dir, int32_t *prompt, int *P,
                      int32_t *greedy, const char **against)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/golden.json", dir);
    FILE *f = fopen(path, "rb");
    int pending = !f;
    if (f)
        fclose(f);
    else
        snprintf(path, sizeof path, "%s/prompt.json", dir);
    char *text = t_read_file(path, NULL);
    cJSON *g = cJSON_Parse(text);
    free(text);
    *P = read_ints(cJSON_GetObjectItem(g, "prompt_ids"), prompt, 64);
    int G = pending ? 0 : read_ints(cJSON_GetObjectItem(g, "greedy_ids"), greedy, 64);
    cJSON_Delete(g);
    *against = pending ? "a session" : "transformers";
    if (!pending || *P <= 0 || *P + DECODE > SEQ_LEN)
        return G;
    float *rows = calloc((size_t)(*P + DECODE) * (size_t)moec_model_vocab_size(m), sizeof(float));
    T_CHECK(rows != NULL);
    if (!rows)
        return 0;
    run_alone(m, dir, prompt, *P, rows, greedy);
    free(rows);
    return DECODE + 1;
}

/* The golden prompt in slot 2: one step for the prompt, then one step per
 * greedy token, next_out feeding the next step. */
static void check_golden(moec_engine_t *e, const moec_model_t *m, const char *name,
                         const char *dir)
{
    int32_t prompt[64], greedy[64], got[64], pos[64], slot[64], next[64];
    const char *against;
    int P, G = golden_ids(m, dir, prompt, &P, greedy, &against);
    T_CHECK(P > 0 && G > 0);
    if (P <= 0 || G <= 0)
        return;
    for (int i = 0; i < P; i++) {
        pos[i] = i;
        slot[i] = 2;
    }
    T_OK(moec_engine_step(e, P, prompt, pos, slot, next, NULL));
    got[0] = next[P - 1];
    for (int k = 1; k < G; k++) {
        int32_t p = P + k - 1, s = 2;
        T_OK(moec_engine_step(e, 1, &got[k - 1], &p, &s, &got[k], NULL));
    }
    int same = !memcmp(got, greedy, (size_t)G * sizeof *got);
    printf("%-18s greedy ids in slot 2 vs %s: %s\n", name, against,
           same ? "identical" : "DIFFER");
    T_CHECK(same);
}

/* One sequence of the interleaving test. */
typedef struct seq {
    int32_t tokens[MAX_LEN]; /* the prompt, then the generated ids */
    int known;               /* tokens known (prompt + generated) */
    int fed;                 /* tokens whose K/V are written */
    float *rows;             /* a row per fed token */
} seq;

/* Runs the three sequences together until each has DECODE generated tokens
 * fed and one more generated: each step, every started sequence gives its
 * next CHUNK prompt tokens or its one decode token; the order of the
 * sequences rotates, and on odd steps a sequence's tokens are split, the
 * first half at the front of the step and the rest at its end. */
static void run_together(moec_engine_t *e, int V, seq *sq, int32_t gen[N_SEQ][DECODE + 1])
{
    for (int step = 0; step < 64; step++) {
        int32_t tok[64], pos[64], slot[64], next[64], who[64];
        int front = 0, back = 0; /* tokens at the front; at the back (stored from 63 down) */
        int32_t btok[64], bpos[64], bslot[64], bwho[64];
        int active = 0;
        for (int r = 0; r < N_SEQ; r++) {
            int s = (r + step) % N_SEQ;
            seq *q = &sq[s];
            if (step < START_STEP[s] || q->known - PROMPT_LEN[s] > DECODE)
                continue;
            active = 1;
            int k = q->fed < PROMPT_LEN[s] ? PROMPT_LEN[s] - q->fed : 1;
            if (k > CHUNK[s])
                k = CHUNK[s];
            int split = step % 2 && k > 1 ? k / 2 : k;
            for (int i = 0; i < k; i++) {
                int p = q->fed + i;
                if (i < split) {
                    tok[front] = q->tokens[p], pos[front] = p, slot[front] = SLOT_OF[s];
                    who[front++] = s;
                } else {
                    btok[back] = q->tokens[p], bpos[back] = p, bslot[back] = SLOT_OF[s];
                    bwho[back++] = s;
                }
            }
            q->fed += k;
        }
        if (!active)
            return;
        int n = front;
        for (int i = 0; i < back; i++) {
            tok[n] = btok[i], pos[n] = bpos[i], slot[n] = bslot[i];
            who[n++] = bwho[i];
        }
        float *rows = malloc((size_t)n * V * sizeof *rows);
        T_OK(moec_engine_step(e, n, tok, pos, slot, next, rows));
        for (int i = 0; i < n; i++) {
            seq *q = &sq[who[i]];
            memcpy(q->rows + (size_t)pos[i] * V, rows + (size_t)i * V, (size_t)V * sizeof *rows);
            T_CHECK(next[i] == t_argmax(rows + (size_t)i * V, V));
            /* The last known token's next id is the next generated token. */
            if (pos[i] == q->known - 1 && q->fed == q->known) {
                gen[who[i]][q->known - PROMPT_LEN[who[i]]] = next[i];
                if (q->known < MAX_LEN)
                    q->tokens[q->known] = next[i];
                q->known++;
            }
        }
        free(rows);
    }
    T_CHECK(!"the interleaved sequences did not finish");
}

static void check_interleaved(moec_engine_t *e, const moec_model_t *m, const char *name,
                              const char *dir)
{
    int V = moec_model_vocab_size(m);
    seq sq[N_SEQ];
    float *ref[N_SEQ];
    int32_t ref_ids[N_SEQ][DECODE + 1], gen[N_SEQ][DECODE + 1];
    for (int s = 0; s < N_SEQ; s++) {
        memset(&sq[s], 0, sizeof sq[s]);
        for (int i = 0; i < PROMPT_LEN[s]; i++)
            sq[s].tokens[i] = seq_token(s, i, V);
        sq[s].known = PROMPT_LEN[s];
        sq[s].rows = calloc((size_t)MAX_LEN * V, sizeof(float));
        ref[s] = calloc((size_t)MAX_LEN * V, sizeof(float));
        run_alone(m, dir, sq[s].tokens, PROMPT_LEN[s], ref[s], ref_ids[s]);
    }
    run_together(e, V, sq, gen);
    int rows_same = 1, ids_same = 1;
    for (int s = 0; s < N_SEQ; s++) {
        size_t n = (size_t)(PROMPT_LEN[s] + DECODE) * V;
        rows_same &= !memcmp(sq[s].rows, ref[s], n * sizeof(float));
        ids_same &= !memcmp(gen[s], ref_ids[s], sizeof gen[s]);
    }
    printf("%-18s %d sequences interleaved (chunked prompts, split runs): rows %s, ids %s\n",
           name, N_SEQ, rows_same ? "bit-identical to each alone" : "DIFFER",
           ids_same ? "identical" : "DIFFER");
    T_CHECK(rows_same);
    T_CHECK(ids_same);

    /* Slot reuse: sequence 1's prompt again in slot 1, which held the longer
     * sequence 0, from position 0: the same rows as the fresh run. */
    int P = PROMPT_LEN[1];
    int32_t pos[MAX_LEN], slot[MAX_LEN], next[MAX_LEN];
    float *rows = malloc((size_t)MAX_LEN * V * sizeof *rows);
    for (int i = 0; i < P; i++)
        pos[i] = i, slot[i] = SLOT_OF[0];
    T_OK(moec_engine_step(e, P, sq[1].tokens, pos, slot, next, rows));
    int32_t tok = next[P - 1];
    for (int k = 0; k < DECODE; k++) {
        int32_t p = P + k, s = SLOT_OF[0];
        T_OK(moec_engine_step(e, 1, &tok, &p, &s, &tok, rows + (size_t)(P + k) * V));
    }
    int reuse_same = !memcmp(rows, ref[1], (size_t)(P + DECODE) * V * sizeof *rows);
    printf("%-18s a new sequence in a used slot: rows %s\n", name,
           reuse_same ? "bit-identical to a fresh run" : "DIFFER");
    T_CHECK(reuse_same);
    free(rows);
    for (int s = 0; s < N_SEQ; s++) {
        free(sq[s].rows);
        free(ref[s]);
    }
}

static void check_model(const char *name)
{
    const char *dir;
    moec_model_t *m = t_open_tiny(name, &dir);
    if (!m)
        return;
    moec_engine_options o = {.backend = MOEC_BACKEND_CPU, .max_seqs = SLOTS,
                             .max_seq_len = SEQ_LEN};
    moec_engine_t *e = NULL;
    T_OK(moec_engine_open(m, dir, &o, &e));
    if (!e) {
        moec_model_free(m);
        return;
    }
    T_CHECK(moec_engine_backend(e) == MOEC_BACKEND_CPU);
    T_CHECK(moec_engine_max_tokens(e) == 64);
    T_CHECK(moec_engine_max_seqs(e) == SLOTS);
    T_CHECK(moec_engine_max_seq_len(e) == SEQ_LEN);
    T_CHECK(moec_engine_vocab_size(e) == moec_model_vocab_size(m));
    T_CHECK(moec_engine_eos_token(e) == moec_model_eos_token(m));
    check_golden(e, m, name, dir);
    check_interleaved(e, m, name, dir);
    moec_engine_free(e);
    moec_model_free(m);
}

/* Defaults, open errors, step errors; a rejected step writes nothing. */
static void check_errors(void)
{
    const char *dir = t_src("tests/data/qwen3_moe");
    moec_model_t *m = NULL;
    T_OK(moec_model_open(dir, &m));
    if (!m)
        return;
    moec_engine_t *e = NULL;
    moec_engine_options o = {.backend = MOEC_BACKEND_CPU};
    T_OK(moec_engine_open(m, dir, &o, &e));
    /* 8 slots; max_position_embeddings (512) is less than 4096. */
    T_CHECK(moec_engine_max_seqs(e) == 8 && moec_engine_max_seq_len(e) == 512);
    moec_engine_free(e);
    e = NULL;

    o.max_seqs = -1;
    T_ERR(moec_engine_open(m, dir, &o, &e), MOEC_ERR_INVALID_ARG, "max_seqs must be positive");
    o.max_seqs = 2;
    o.max_seq_len = -5;
    T_ERR(moec_engine_open(m, dir, &o, &e), MOEC_ERR_INVALID_ARG, "max_seq_len must be positive");
    o.max_seq_len = 100000;
    T_ERR(moec_engine_open(m, dir, &o, &e), MOEC_ERR_INVALID_ARG,
          "max_seq_len 100000 exceeds the model's max_position_embeddings 512");
    o.max_seq_len = 8;
    o.backend = (moec_backend)7;
    T_ERR(moec_engine_open(m, dir, &o, &e), MOEC_ERR_INVALID_ARG, "unknown backend 7");
    /* sessions refuse it too (they ran it on the CPU, and
     * moec_session_backend said 7) */
    moec_session_t *s = NULL;
    T_ERR(moec_session_init(m, dir, (moec_backend)7, 8, &s), MOEC_ERR_INVALID_ARG,
          "unknown backend 7 (auto, cpu or cuda)");
    T_CHECK(s == NULL);
    T_ERR(moec_session_init_parallel(m, dir, (moec_backend)-1, 8, &(moec_parallel){.tp = 2}, &s),
          MOEC_ERR_INVALID_ARG, "unknown backend -1 (auto, cpu or cuda)");
    T_CHECK(s == NULL);
    moec_session_free(s);
    /* a session's forward: each refusal names its argument, and nothing
     * runs (the sequence stays empty) */
    T_OK(moec_session_init(m, dir, MOEC_BACKEND_CPU, 4, &s));
    int32_t sid[5] = {3, 4, 5, 6, 7};
    T_ERR(moec_session_forward(NULL, sid, 1, NULL), MOEC_ERR_INVALID_ARG,
          "moec_session_forward: NULL session");
    T_ERR(moec_session_forward(s, NULL, 1, NULL), MOEC_ERR_INVALID_ARG,
          "moec_session_forward: NULL ids");
    T_ERR(moec_session_forward(s, sid, 0, NULL), MOEC_ERR_INVALID_ARG,
          "moec_session_forward: n is 0; it must be at least 1");
    T_ERR(moec_session_forward(s, sid, -2, NULL), MOEC_ERR_INVALID_ARG,
          "moec_session_forward: n is -2; it must be at least 1");
    T_ERR(moec_session_forward(s, sid, 5, NULL), MOEC_ERR_CAPACITY,
          "5 tokens do not fit: the sequence holds 0 of at most 4 tokens");
    sid[1] = 256;
    T_ERR(moec_session_forward(s, sid, 2, NULL), MOEC_ERR_INVALID_ARG,
          "embed: token id 256 is outside the vocabulary [0, 256)");
    T_CHECK(moec_session_length(s) == 0);
    moec_session_free(s);
    /* a failed constructor leaves *out NULL, whatever it held */
    int stale_dummy;
    moec_session_t *stale = (moec_session_t *)&stale_dummy;
    T_ERR(moec_session_init_plan(t_src("tests/data/no-such.moec"), dir, 8, &stale), MOEC_ERR_IO,
          "no-such.moec: No such file or directory");
    T_CHECK(stale == NULL);
    stale = (moec_session_t *)&stale_dummy;
    T_ERR(moec_session_init_plan(t_src("tests/data/no-such.moec"), dir, 0, &stale),
          MOEC_ERR_INVALID_ARG, "max_seq_len must be positive, got 0");
    T_CHECK(stale == NULL);
    s = NULL;
    o.backend = MOEC_BACKEND_CPU;
    T_ERR(moec_engine_open(NULL, dir, &o, &e), MOEC_ERR_INVALID_ARG, "NULL model");
    T_ERR(moec_engine_open(m, t_tmpdir("engine-noweights"), &o, &e), MOEC_ERR_IO,
          "no *.safetensors");
    T_CHECK(e == NULL);
    T_ERR(moec_engine_open_plan("x.moec", dir, &o, &e), MOEC_ERR_INVALID_ARG,
          "the engine's backend must be auto or cuda");
    int n_dev = 0;
    if (moec_cuda_device_count(&n_dev) != MOEC_OK || n_dev < 1) {
        o.backend = MOEC_BACKEND_CUDA;
        T_ERR(moec_engine_open(m, dir, &o, &e), MOEC_ERR_NO_DEVICE, NULL);
        T_ERR(moec_engine_open_plan("x.moec", dir, &o, &e), MOEC_ERR_NO_DEVICE, NULL);
        o.backend = MOEC_BACKEND_AUTO;
        T_OK(moec_engine_open(m, dir, &o, &e));
        T_CHECK(moec_engine_backend(e) == MOEC_BACKEND_CPU);
        moec_engine_free(e);
        e = NULL;
    }
    o.backend = MOEC_BACKEND_CPU;

    /* The engine keeps its own copy of the module: the model may go. */
    T_OK(moec_engine_open(m, dir, &o, &e));
    moec_model_free(m);
    if (!e)
        return;
    int32_t tok[2] = {5, 7}, pos[2] = {0, 1}, slot[2] = {0, 0};
    int32_t bad_slot[2] = {0, 2}, neg_slot[1] = {-1}, bad_tok[2] = {5, 256}, neg_tok[1] = {-3};
    int32_t far[2] = {0, 8}, neg_pos[1] = {-1};
    T_ERR(moec_engine_step(e, 0, tok, pos, slot, NULL, NULL), MOEC_ERR_INVALID_ARG,
          "a step runs 1 to 64 tokens, not 0");
    T_ERR(moec_engine_step(e, 65, tok, pos, slot, NULL, NULL), MOEC_ERR_INVALID_ARG,
          "a step runs 1 to 64 tokens, not 65");
    T_ERR(moec_engine_step(e, 1, NULL, pos, slot, NULL, NULL), MOEC_ERR_INVALID_ARG, "NULL tokens");
    T_ERR(moec_engine_step(NULL, 1, tok, pos, slot, NULL, NULL), MOEC_ERR_INVALID_ARG,
          "NULL engine");
    T_ERR(moec_engine_step(e, 2, tok, pos, bad_slot, NULL, NULL), MOEC_ERR_INVALID_ARG,
          "token 1: slot 2 is not in [0, 2)");
    T_ERR(moec_engine_step(e, 1, tok, pos, neg_slot, NULL, NULL), MOEC_ERR_INVALID_ARG,
          "token 0: slot -1 is not in [0, 2)");
    T_ERR(moec_engine_step(e, 2, bad_tok, pos, slot, NULL, NULL), MOEC_ERR_INVALID_ARG,
          "token 1: id 256 is outside the vocabulary (256 ids)");
    T_ERR(moec_engine_step(e, 1, neg_tok, pos, slot, NULL, NULL), MOEC_ERR_INVALID_ARG,
          "token 0: id -3 is outside the vocabulary (256 ids)");
    T_ERR(moec_engine_step(e, 1, tok, neg_pos, slot, NULL, NULL), MOEC_ERR_INVALID_ARG,
          "token 0: position -1 is negative");
    T_ERR(moec_engine_step(e, 2, tok, far, slot, NULL, NULL), MOEC_ERR_CAPACITY,
          "token 1: position 8 of slot 0 does not fit the KV cache of 8 tokens per sequence");
    /* None of those ran: position 0 of slot 0 was never written, so a token
     * at position 1 finds nothing to attend to. */
    T_ERR(moec_engine_step(e, 1, &tok[1], &pos[1], &slot[0], NULL, NULL), MOEC_ERR_INVALID_ARG,
          "which no forward has written");
    /* Both outputs are optional; the last position fits. */
    T_OK(moec_engine_step(e, 2, tok, pos, slot, NULL, NULL));
    int32_t ids[8], at[8], one[8], next[8];
    for (int i = 0; i < 8; i++)
        ids[i] = (int32_t)(i * 31 % 256), at[i] = i, one[i] = 1;
    T_OK(moec_engine_step(e, 8, ids, at, one, next, NULL));
    T_CHECK(next[7] >= 0 && next[7] < 256);
    moec_engine_free(e);
    moec_engine_free(NULL);
    T_CHECK(moec_engine_max_tokens(NULL) == 0 && moec_engine_eos_token(NULL) == -1);
}

/* 1 when ids[0, n) are want[0, n). */
static int same_ids(const int32_t *ids, const int32_t *want, int n)
{
    return ids && !memcmp(ids, want, (size_t)n * sizeof *ids);
}

/* Every eos id (generation_config.json's list) reaches the model, a session
 * and an engine, which keeps its own after the model is freed. */
static void check_eos_lists(void)
{
    const char *dir = t_tmpdir("engine-eos");
    char path[4200], weights[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    size_t n;
    char *text = t_read_file(t_src("tests/data/qwen3_moe/config.json"), &n);
    t_write_file(path, text, n);
    free(text);
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    t_write_file(path, "{\"eos_token_id\": [5, 1, 200]}", 29);
    snprintf(weights, sizeof weights, "%s", t_src("tests/data/qwen3_moe"));

    static const int32_t want[3] = {5, 1, 200};
    moec_model_t *m = NULL;
    T_OK(moec_model_open(dir, &m));
    const int32_t *ids = NULL;
    T_CHECK(moec_model_eos_tokens(m, &ids) == 3 && same_ids(ids, want, 3));
    T_CHECK(moec_model_eos_tokens(m, NULL) == 3 && moec_model_eos_token(m) == 5);
    moec_session_t *s = NULL;
    T_OK(moec_session_init(m, weights, MOEC_BACKEND_CPU, 8, &s));
    ids = NULL;
    T_CHECK(moec_session_eos_tokens(s, &ids) == 3 && same_ids(ids, want, 3));
    T_CHECK(moec_session_eos_token(s) == 5);
    moec_session_free(s);
    moec_engine_options o = {.backend = MOEC_BACKEND_CPU, .max_seqs = 1, .max_seq_len = 8};
    moec_engine_t *e = NULL;
    T_OK(moec_engine_open(m, weights, &o, &e));
    moec_model_free(m);
    ids = NULL;
    T_CHECK(moec_engine_eos_tokens(e, &ids) == 3 && same_ids(ids, want, 3));
    T_CHECK(moec_engine_eos_token(e) == 5);
    moec_engine_free(e);

    /* None: 0 ids, -1; NULL handles alike. */
    remove(path);
    snprintf(path, sizeof path, "%s/config.json", dir);
    text = t_read_file(path, &n);
    char *at = strstr(text, "\"eos_token_id\": 1,");
    T_CHECK(at != NULL);
    if (at)
        memcpy(at, "\"eos_token_id\":[],", strlen("\"eos_token_id\": 1,"));
    t_write_file(path, text, n);
    free(text);
    m = NULL;
    T_OK(moec_model_open(dir, &m));
    ids = want;
    T_CHECK(moec_model_eos_tokens(m, &ids) == 0 && ids == NULL && moec_model_eos_token(m) == -1);
    moec_model_free(m);
    ids = want;
    T_CHECK(moec_model_eos_tokens(NULL, &ids) == 0 && ids == NULL);
    T_CHECK(moec_session_eos_tokens(NULL, NULL) == 0 && moec_engine_eos_tokens(NULL, NULL) == 0);
    remove(path);
    remove(dir);
}

/* A CPU session owns what it runs on, as an engine does: the model may be
 * freed (and its memory reused by another) once the session is made, and
 * the session's logits stay those of a session whose model is alive. */
static void check_session_owns_model(void)
{
    const char *dir = t_src("tests/data/qwen3_moe");
    enum { P = 5, V = 256 };
    int32_t prompt[P] = {3, 17, 42, 99, 200};
    float *want = malloc(sizeof(float) * P * V), *got = malloc(sizeof(float) * P * V);
    moec_model_t *m = NULL;
    moec_session_t *a = NULL, *b = NULL;
    T_OK(moec_model_open(dir, &m));
    T_OK(moec_session_init(m, dir, MOEC_BACKEND_CPU, 16, &a));
    T_OK(moec_session_init(m, dir, MOEC_BACKEND_CPU, 16, &b));
    if (a)
        T_OK(moec_session_forward(a, prompt, P, want));
    moec_model_free(m);
    /* another model in the freed memory */
    moec_model_t *other = NULL;
    T_OK(moec_model_open(t_src("tests/data/deepseek_v3"), &other));
    if (b)
        T_OK(moec_session_forward(b, prompt, P, got));
    T_CHECK(a && b && memcmp(want, got, sizeof(float) * P * V) == 0);
    T_CHECK(moec_session_length(b) == P && moec_session_eos_token(b) == 1);
    moec_model_free(other);
    moec_session_free(a);
    moec_session_free(b);
    free(want);
    free(got);
    printf("session            runs on after its model is freed: rows bit-identical\n");
}

int main(void)
{
    for (size_t i = 0; i < sizeof MODELS / sizeof *MODELS; i++)
        check_model(MODELS[i]);
    check_errors();
    check_eos_lists();
    check_session_owns_model();
    return t_finish("test_engine");
}
