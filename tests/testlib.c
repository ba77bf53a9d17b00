/* testlib.c — shared test helpers (see testlib.h). */
#include "testlib.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <string.h>
#include <ftw.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

int t_failures;
int t_checks;

void t_expect_err(moec_status got, moec_status want, const char *needle, const char *expr,
                  const char *file, int line)
{
    t_checks++;
    if (got != want) {
        t_failures++;
        fprintf(stderr, "%s:%d: %s -> %s, want %s (%s)\n", file, line, expr, moec_status_name(got),
                moec_status_name(want), moec_last_error());
        return;
    }
    if (needle && !strstr(moec_last_error(), needle)) {
        t_failures++;
        fprintf(stderr, "%s:%d: %s: error \"%s\" does not contain \"%s\"\n", file, line, expr,
                moec_last_error(), needle);
    }
}

int t_finish(const char *name)
{
    printf("%s: %d passed, %d failed\n", name, t_checks - t_failures, t_failures);
    return t_failures ? 1 : 0;
}

static char *t_ring(void)
{
    static char bufs[8][4096];
    static int next;
    return bufs[next++ & 7];
}

const char *t_src(const char *rel)
{
    const char *root = getenv("MOEC_SOURCE_DIR");
    char *b = t_ring();
    snprintf(b, 4096, "%s/%s", root ? root : ".", rel);
    return b;
}

/* Every directory t_tmpdir makes is removed when the test exits (set
 * MOEC_KEEP_TMP=1 to keep them for a post-mortem). */
enum { T_TMPDIRS_MAX = 64 };
static char t_tmpdirs[T_TMPDIRS_MAX][4096];
static int t_n_tmpdirs;

static int t_rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    remove(path);
    return 0;
}

static void t_tmpdirs_remove(void)
{
    const char *keep = getenv("MOEC_KEEP_TMP");
    if (keep && *keep && strcmp(keep, "0") != 0)
        return;
    for (int i = 0; i < t_n_tmpdirs; i++)
        nftw(t_tmpdirs[i], t_rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

const char *t_tmpdir(const char *tag)
{
    const char *tmp = getenv("TMPDIR");
    char *b = t_ring();
    snprintf(b, 4096, "%s/moec-%s-XXXXXX", tmp ? tmp : "/tmp", tag);
    if (!mkdtemp(b)) {
        fprintf(stderr, "mkdtemp %s: %s\n", b, strerror(errno));
        exit(2);
    }
    if (t_n_tmpdirs == 0)
        atexit(t_tmpdirs_remove);
    if (t_n_tmpdirs < T_TMPDIRS_MAX)
        snprintf(t_tmpdirs[t_n_tmpdirs++], 4096, "%s", b);
    return b;
}

char *t_read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "cannot open %s: %s\n", path, strerror(errno));
        exit(2);
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n) {
        fprintf(stderr, "cannot read %s\n", path);
        exit(2);
    }
    buf[n] = '\0';
    fclose(f);
    if (len)
        *len = (size_t)n;
    return buf;
}

void t_write_file(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, len, f) != len || fclose(f) != 0) {
        fprintf(stderr, "cannot write %s\n", path);
        exit(2);
    }
}

/* The bytes [*at, *at + *len) of row `row` of tensor `name` in the data
 * section of a safetensors file whose JSON header is `header`. */
static void nan_row_span(const char *header, const char *name, int row, size_t *at, size_t *len)
{
    cJSON *h = cJSON_Parse(header);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(h, name);
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(t, "shape");
    const cJSON *offs = cJSON_GetObjectItemCaseSensitive(t, "data_offsets");
    const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(t, "dtype");
    if (!cJSON_IsArray(shape) || cJSON_GetArraySize(shape) < 1 || !cJSON_IsArray(offs) ||
        !cJSON_IsString(dtype)) {
        fprintf(stderr, "t_write_nan_model: no tensor %s\n", name);
        exit(2);
    }
    size_t elems = 1;
    for (int d = 1; d < cJSON_GetArraySize(shape); d++)
        elems *= (size_t)cJSON_GetArrayItem(shape, d)->valuedouble;
    size_t esize = !strcmp(dtype->valuestring, "F32") ? 4 : 2;
    *len = elems * esize;
    *at = (size_t)cJSON_GetArrayItem(offs, 0)->valuedouble + (size_t)row * *len;
    if (row < 0 || row >= cJSON_GetArrayItem(shape, 0)->valuedouble) {
        fprintf(stderr, "t_write_nan_model: %s has no row %d\n", name, row);
        exit(2);
    }
    cJSON_Delete(h);
}

void t_write_nan_model(const char *src, const char *dst, const char *tensor, int row)
{
    char path[4096];
    if (mkdir(dst, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "mkdir %s: %s\n", dst, strerror(errno));
        exit(2);
    }
    size_t len;
    snprintf(path, sizeof path, "%s/config.json", src);
    char *config = t_read_file(path, &len);
    snprintf(path, sizeof path, "%s/config.json", dst);
    t_write_file(path, config, len);
    free(config);
    snprintf(path, sizeof path, "%s/model.safetensors", src);
    char *st = t_read_file(path, &len);
    uint64_t hlen = 0;
    for (int i = 7; len >= 8 && i >= 0; i--)
        hlen = hlen << 8 | (uint8_t)st[i];
    if (len < 8 || hlen > len - 8) {
        fprintf(stderr, "t_write_nan_model: %s is not a safetensors file\n", path);
        exit(2);
    }
    size_t data = 8 + (size_t)hlen, at = 0, span = len - data;
    if (tensor) {
        char *header = malloc((size_t)hlen + 1);
        memcpy(header, st + 8, (size_t)hlen);
        header[hlen] = '\0';
        nan_row_span(header, tensor, row, &at, &span);
        free(header);
    }
    if (at + span > len - data) {
        fprintf(stderr, "t_write_nan_model: %s: row %d of %s is past the data\n", path, row, tensor);
        exit(2);
    }
    memset(st + data + at, 0xff, span);
    snprintf(path, sizeof path, "%s/model.safetensors", dst);
    t_write_file(path, st, len);
    free(st);
}

/* Removes a model t_write_nan_model wrote. */
static void remove_model(const char *dir)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    unlink(path);
    rmdir(dir);
}

/* Sessions: all NaN fails at once; NaN at token 59 only where it is fed. */
static void nonfinite_sessions(moec_backend backend, const char *all_nan, const char *nan59)
{
    moec_model_t *m = NULL;
    moec_session_t *s = NULL;
    int32_t ids[3] = {1, 2, 3}, t59 = 59, t5 = 5;
    T_OK(moec_model_open(all_nan, &m));
    T_OK(moec_session_init(m, all_nan, backend, 16, &s));
    if (s) {
        float *rows = malloc(3 * (size_t)moec_session_vocab_size(s) * sizeof *rows);
        T_ERR(moec_session_forward(s, ids, 3, rows), MOEC_ERR_NUMERIC,
              "step 0, position 0: the logits hold a NaN or an infinity (a NaN in the "
              "checkpoint, or an overflow)");
        T_CHECK(moec_session_length(s) == 3);
        free(rows);
    }
    moec_session_free(s);
    moec_model_free(m);
    s = NULL;
    m = NULL;
    T_OK(moec_model_open(nan59, &m));
    T_OK(moec_session_init(m, nan59, backend, 16, &s));
    if (s) {
        float *rows = malloc(2 * (size_t)moec_session_vocab_size(s) * sizeof *rows);
        T_OK(moec_session_forward(s, ids, 2, rows));
        T_CHECK(rows && t_all_finite(rows, 2 * (size_t)moec_session_vocab_size(s)));
        T_ERR(moec_session_forward(s, &t59, 1, rows), MOEC_ERR_NUMERIC,
              "step 1, position 2: the logits hold a NaN or an infinity");
        /* no logits wanted: still checked */
        T_ERR(moec_session_forward(s, &t5, 1, NULL), MOEC_ERR_NUMERIC, "step 2, position 3:");
        T_CHECK(moec_session_length(s) == 4);
        free(rows);
    }
    moec_session_free(s);
    moec_model_free(m);
}

/* An engine: slot 1's tokens from its 59 on fail, slot 0's go on. */
static void nonfinite_engine(moec_backend backend, const char *nan59)
{
    moec_model_t *m = NULL;
    moec_engine_t *e = NULL;
    T_OK(moec_model_open(nan59, &m));
    moec_engine_options o = {.backend = backend, .max_seqs = 2, .max_seq_len = 16};
    T_OK(moec_engine_open(m, nan59, &o, &e));
    moec_model_free(m);
    if (!e)
        return;
    size_t V = (size_t)moec_engine_vocab_size(e);
    int32_t tok[5] = {1, 2, 3, 59, 7}, pos[5] = {0, 1, 0, 1, 2}, slot[5] = {0, 0, 1, 1, 1};
    int32_t next[5];
    float *rows = malloc(5 * V * sizeof *rows);
    T_ERR(moec_engine_step(e, 5, tok, pos, slot, next, rows), MOEC_ERR_NUMERIC,
          "step 0: the logits of token 3 (slot 1, position 1) hold a NaN or an infinity, and "
          "those of 2 of the step's 5 tokens in all");
    T_CHECK(next[0] >= 0 && next[1] >= 0 && next[2] >= 0 && next[3] == -1 && next[4] == -1);
    T_CHECK(rows && t_all_finite(rows, 3 * V) && !t_all_finite(rows + 3 * V, V) &&
            !t_all_finite(rows + 4 * V, V));
    if (rows)
        T_CHECK(next[1] == t_argmax(rows + V, (int)V));
    /* slot 0 goes on; a 59 in slot 1 again, and no ids or logits wanted */
    int32_t tok2[2] = {5, 59}, pos2[2] = {2, 3}, slot2[2] = {0, 1};
    T_ERR(moec_engine_step(e, 2, tok2, pos2, slot2, NULL, NULL), MOEC_ERR_NUMERIC,
          "step 1: the logits of token 1 (slot 1, position 3) hold a NaN or an infinity, and "
          "those of 1 of the step's 2 tokens in all");
    T_OK(moec_engine_step(e, 1, tok2, pos2, slot2, next, rows));
    T_CHECK(next[0] >= 0 && rows && t_all_finite(rows, V));
    free(rows);
    moec_engine_free(e);
}

/* The scheduler's requests for nonfinite_sched: greedy and sampled, with a
 * 59 in the prompt, one whose first token is 59 (on the CPU), ones that
 * never meet a 59, and one whose repetition penalty overflows the row it
 * samples from (1e-45 divides a positive logit past FLT_MAX). */
#define NF_REQ 6
static const int32_t NF_PROMPT[NF_REQ][8] = {
    {1, 2}, {3, 250, 7}, {1, 59, 2}, {1, 59, 2}, {3, 250, 7}, {3, 250, 7, 11, 40, 90, 120, 200}};
static const int NF_N_PROMPT[NF_REQ] = {2, 3, 3, 3, 3, 8};
static const int NF_MAX_NEW[NF_REQ] = {4, 5, 3, 3, 5, 2};

typedef struct nf_result {
    int32_t out[8];
    int n_out;
    moec_finish finish;
    char error[128];
} nf_result;

/* Submits the NF_REQ requests to a fresh engine on dir and runs it dry:
 * each request's tokens, finish and error into res[], each run's status
 * and error (for the first two) into st[] and err[]. */
static void nf_run(moec_backend backend, const char *dir, nf_result *res, moec_status st[2],
                   char err[2][256])
{
    moec_model_t *m = NULL;
    moec_engine_t *e = NULL;
    memset(res, 0, NF_REQ * sizeof *res);
    T_OK(moec_model_open(dir, &m));
    moec_engine_options o = {.backend = backend, .max_seqs = NF_REQ, .max_seq_len = 32};
    T_OK(moec_engine_open(m, dir, &o, &e));
    moec_model_free(m);
    if (!e)
        return;
    for (int r = 0; r < NF_REQ; r++) {
        moec_request q = {.prompt = NF_PROMPT[r], .n_prompt = NF_N_PROMPT[r],
                          .max_tokens = NF_MAX_NEW[r], .ignore_eos = 1,
                          .user = (void *)(intptr_t)r};
        if (r == 3 || r == 4)
            q.sampling = (moec_sampling){.temperature = 0.9f, .top_k = r == 4 ? 5 : 0,
                                         .seed = 7, .logprob = 1};
        if (r == 5)
            q.sampling.repetition_penalty = 1e-45f;
        uint64_t id;
        T_OK(moec_engine_submit(e, &q, &id));
        T_CHECK(id == (uint64_t)r + 1);
    }
    for (int k = 0; moec_engine_pending(e) && k < 100; k++) {
        const moec_event *ev;
        int n;
        moec_status rs = moec_engine_run(e, &ev, &n);
        if (k < 2) {
            st[k] = rs;
            snprintf(err[k], sizeof err[k], "%s", rs == MOEC_OK ? "" : moec_last_error());
        } else {
            T_OK(rs);
        }
        for (int i = 0; i < n; i++) {
            nf_result *r = &res[(intptr_t)ev[i].user];
            if (ev[i].finish == MOEC_FINISH_ERROR)
                snprintf(r->error, sizeof r->error, "%s", ev[i].error);
            else if (r->n_out < 8)
                r->out[r->n_out++] = ev[i].token;
            r->finish = ev[i].finish;
        }
    }
    T_CHECK(moec_engine_pending(e) == 0);
    moec_engine_free(e);
}

/* The first position of 59 in request r's prompt and its first n output
 * tokens, -1 if none. */
static int nf_first59(int r, const nf_result *x, int n)
{
    for (int i = 0; i < NF_N_PROMPT[r] + n; i++)
        if ((i < NF_N_PROMPT[r] ? NF_PROMPT[r][i] : x->out[i - NF_N_PROMPT[r]]) == 59)
            return i;
    return -1;
}

/* The scheduler on a model whose token 59 has a NaN embedding row: a
 * request ends with an error at the first position of a 59 it feeds
 * (prompt or output), greedy or sampled, having streamed what came before;
 * a request that feeds none runs to its length; a penalty that overflows
 * ends its request too. On the CPU, exactly: which requests, their
 * positions and the runs' errors, and the others' tokens as on the clean
 * model. */
static void nonfinite_sched(moec_backend backend, const char *clean, const char *nan59)
{
    static nf_result got[NF_REQ], ref[NF_REQ];
    moec_status st[2] = {MOEC_OK, MOEC_OK}, st_ref[2];
    char err[2][256] = {"", ""}, err_ref[2][256];
    nf_run(backend, nan59, got, st, err);
    for (int r = 0; r < 5; r++) {
        const nf_result *x = &got[r];
        int at = nf_first59(r, x, x->n_out);
        if (x->finish == MOEC_FINISH_ERROR) {
            char want[128];
            snprintf(want, sizeof want, "the logits at position %d hold a NaN or an infinity", at);
            T_CHECK(at >= 0 && !strcmp(x->error, want));
            T_CHECK(x->n_out == (at + 1 > NF_N_PROMPT[r] ? at + 1 - NF_N_PROMPT[r] : 0));
        } else {
            T_CHECK(x->finish == MOEC_FINISH_LENGTH && x->n_out == NF_MAX_NEW[r]);
            T_CHECK(nf_first59(r, x, x->n_out - 1) < 0);
        }
    }
    T_CHECK(got[2].finish == MOEC_FINISH_ERROR && got[3].finish == MOEC_FINISH_ERROR);
    T_CHECK(st[0] == MOEC_ERR_NUMERIC &&
            strstr(err[0], "step 0, request 3: the logits at position 1 hold a NaN or an "
                           "infinity ("));
    if (backend != MOEC_BACKEND_CPU)
        return;
    /* deepseek_v3's [1,2] continues 59; the penalty overflows on either
     * model; the clean model's other requests give the same tokens */
    nf_run(backend, clean, ref, st_ref, err_ref);
    T_CHECK(got[0].n_out == 1 && got[0].out[0] == 59 && got[0].finish == MOEC_FINISH_ERROR);
    T_CHECK(got[5].finish == MOEC_FINISH_ERROR && ref[5].finish == MOEC_FINISH_ERROR &&
            !strcmp(got[5].error, "the logits at position 7 hold a NaN or an infinity once "
                                  "the penalties apply"));
    T_CHECK(strstr(err[0], "(3 of the step's 6 requests end with such an error)"));
    T_CHECK(st[1] == MOEC_ERR_NUMERIC &&
            strstr(err[1], "step 1, request 1: the logits at position 2 hold a NaN or an "
                           "infinity (1 of the step's 3 requests end with such an error)"));
    T_CHECK(st_ref[0] == MOEC_ERR_NUMERIC && st_ref[1] == MOEC_OK);
    static const int ok[] = {1, 4};
    for (int k = 0; k < 2; k++) {
        const nf_result *a = &got[ok[k]], *b = &ref[ok[k]];
        T_CHECK(a->finish == MOEC_FINISH_LENGTH && a->n_out == b->n_out &&
                !memcmp(a->out, b->out, (size_t)a->n_out * sizeof *a->out));
    }
}

void t_check_nonfinite(moec_backend backend)
{
    const char *src = t_src("tests/data/deepseek_v3");
    char all_nan[4096], nan59[4096];
    snprintf(all_nan, sizeof all_nan, "%s", t_tmpdir("nan"));
    snprintf(nan59, sizeof nan59, "%s", t_tmpdir("nan59"));
    t_write_nan_model(src, all_nan, NULL, 0);
    t_write_nan_model(src, nan59, "model.embed_tokens.weight", 59);
    nonfinite_sessions(backend, all_nan, nan59);
    nonfinite_engine(backend, nan59);
    nonfinite_sched(backend, src, nan59);
    remove_model(all_nan);
    remove_model(nan59);
}

uint64_t t_rand_u64(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

float t_rand_normal(uint64_t *s)
{
    double u1 = ((double)(t_rand_u64(s) >> 11) + 0.5) / 9007199254740992.0;
    double u2 = ((double)(t_rand_u64(s) >> 11) + 0.5) / 9007199254740992.0;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

int t_argmax(const float *row, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (row[i] > row[best])
            best = i;
    return best;
}

double t_row_error(const float *got, const float *ref, int n)
{
    double maxref = 0, maxdiff = 0;
    for (int i = 0; i < n; i++) {
        maxref = fmax(maxref, fabs(ref[i]));
        maxdiff = fmax(maxdiff, fabs((double)got[i] - ref[i]));
    }
    return maxdiff / (maxref > 0 ? maxref : 1);
}

int t_all_finite(const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i]))
            return 0;
    return 1;
}

moec_model_t *t_open_tiny(const char *name, const char **dir)
{
    char rel[256];
    snprintf(rel, sizeof rel, "tests/data/%s", name);
    *dir = t_src(rel);
    moec_model_t *m = NULL;
    T_OK(moec_model_open(*dir, &m));
    return m;
}

int t_json_ints(const cJSON *arr, int32_t *out, int cap)
{
    int n = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, arr)
    {
        if (n < cap)
            out[n] = (int32_t)it->valuedouble;
        n++;
    }
    return n;
}

static double json_num(const cJSON *obj, const char *key, double dflt)
{
    const cJSON *v = cJSON_GetObjectItem(obj, key);
    return cJSON_IsNumber(v) ? v->valuedouble : dflt;
}

int t_golden_read(const char *dir, t_golden *g)
{
    memset(g, 0, sizeof *g);
    char path[4096];
    snprintf(path, sizeof path, "%s/golden.json", dir);
    char *text = t_read_file(path, NULL);
    cJSON *j = cJSON_Parse(text);
    free(text);
    t_checks++;
    if (!j) {
        t_failures++;
        fprintf(stderr, "FAIL %s: does not parse\n", path);
        return 0;
    }
    g->P = t_json_ints(cJSON_GetObjectItem(j, "prompt_ids"), g->prompt, T_GOLDEN_IDS);
    g->G = t_json_ints(cJSON_GetObjectItem(j, "greedy_ids"), g->greedy, T_GOLDEN_IDS);
    g->rows = (int)json_num(j, "rows", -1);
    g->vocab = (int)json_num(j, "vocab_size", -1);
    const cJSON *tf = cJSON_GetObjectItem(j, "transformers_bf16");
    g->tf_bf16_worst = json_num(tf, "worst_row_error", -1);
    g->tf_bf16_mean = json_num(tf, "mean_row_error", -1);
    cJSON_Delete(j);
    snprintf(path, sizeof path, "%s/logits.bin", dir);
    size_t len = 0;
    g->logits = (float *)t_read_file(path, &len);
    if (g->P < 1 || g->P > T_GOLDEN_IDS || g->G < 1 || g->G > T_GOLDEN_IDS || g->vocab < 1 ||
        g->rows != g->P + g->G - 1 || len != (size_t)g->rows * (size_t)g->vocab * sizeof(float)) {
        t_failures++;
        fprintf(stderr,
                "FAIL %s: %d prompt and %d greedy ids, %d rows of %d, logits.bin of %zu bytes do "
                "not agree\n",
                dir, g->P, g->G, g->rows, g->vocab, len);
        return 0;
    }
    g->n_ids = g->P + g->G;
    memcpy(g->ids, g->prompt, (size_t)g->P * sizeof *g->ids);
    memcpy(g->ids + g->P, g->greedy, (size_t)g->G * sizeof *g->ids);
    return 1;
}

void t_golden_free(t_golden *g)
{
    free(g->logits);
    g->logits = NULL;
}

double t_mean_row_error(const float *got, const float *ref, int rows, int n)
{
    double sum = 0;
    for (int r = 0; r < rows; r++)
        sum += t_row_error(got + (size_t)r * n, ref + (size_t)r * n, n);
    return rows > 0 ? sum / rows : 0;
}
