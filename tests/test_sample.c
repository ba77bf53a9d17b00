/* test_sample.c — the host sampler (engine/sample.c), the CPU twin of the
 * device sampler, on rows of logits made here:
 *   - its integer weights: 2^40 at 0, 0 below -28, never increasing as x
 *     falls, within 1.5e-6 of e^x * 2^40 (float arithmetic);
 *   - 400 random rows and settings (every filter and penalty, ties, -0 and
 *     +0, huge logits, vocabularies of 2 to 4099) against tests/sample_ref.py,
 *     an independent reference of docs/SAMPLING.md's definition: the same
 *     token every time;
 *   - the same seed and counter give the same token, another seed or
 *     counter mostly others;
 *   - the empirical distribution of 40000 draws (counters 0 .. 39999) under
 *     temperature, top_k, top_p, min_p and penalties against the exact
 *     softmax of the filtered row, computed here in double: chi-square
 *     below the 1e-6 quantile, nothing drawn outside the support;
 *   - each filter's exact support (flat enough rows that every id kept
 *     shows up), with ties at top_k's and top_p's thresholds going to the
 *     lower ids; top_k 1, a tiny top_p and min_p 1 are greedy;
 *   - penalties: the entries moec_sample_penalties lists (distinct ids,
 *     output counts, the prompt only with a repetition penalty, -1 past
 *     the room), their effect on greedy tokens, and an overflow to
 *     infinity reported as IR_SAMPLED_NONFINITE;
 *   - rt_sample_check's refusals, each by its message. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/sample.h"
#include "runtime/step_check.h"
#include "testlib.h"

#define VMAX 4099

static moec_sampler g_s[VMAX + 1]; /* a sampler per vocabulary size, made on use */

static moec_sampler *sampler(int V)
{
    if (!g_s[V].vocab)
        T_OK(moec_sampler_init(&g_s[V], V));
    return &g_s[V];
}

static float frand(uint64_t *s) { return (float)(t_rand_u64(s) >> 40) * 0x1p-24f; }

/* One row through moec_sample_row with sp's settings and counter, penalty
 * entries from tokens[0, n_known) (n_prompt of them the prompt). */
static int32_t draw(const float *logits, int V, const moec_sampling *sp, int counter,
                    const int32_t *tokens, int n_prompt, int n_known)
{
    moec_sampler *s = sampler(V);
    static ir_sample_pen pens[VMAX];
    ir_sample_row row;
    moec_sample_row_init(sp, V, counter, &row);
    row.pen_count = tokens ? moec_sample_penalties(s, sp, tokens, n_prompt, n_known, pens, V) : 0;
    return moec_sample_row(s, &row, pens, logits);
}

/* ---- the weights ------------------------------------------------------------- */

static void test_weights(void)
{
    T_CHECK(moec_sample_weight(0.0f) == 1ull << 40);
    T_CHECK(moec_sample_weight(-0.0f) == 1ull << 40);
    T_CHECK(moec_sample_weight(-28.0001f) == 0 && moec_sample_weight(-INFINITY) == 0 &&
            moec_sample_weight(NAN) == 0);
    uint64_t last = moec_sample_weight(0.0f);
    double worst = 0;
    int monotone = 1;
    for (float x = 0; x >= -28.0f; x -= 0x1p-10f) {
        uint64_t w = moec_sample_weight(x);
        monotone &= w <= last;
        last = w;
        double want = exp((double)x) * 0x1p40;
        if (want > 1e6)
            worst = fmax(worst, fabs((double)w - want) / want);
    }
    printf("weights            monotone: %s; largest relative error %.2e\n",
           monotone ? "yes" : "NO", worst);
    T_CHECK(monotone && worst < 1.5e-6);
}

/* ---- against the reference ----------------------------------------------------- */

static uint32_t bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

#define N_REF 400

/* Random cases written for sample_ref.py, drawn here too; the reference's
 * tokens must be these. */
static void test_reference(void)
{
    const char *dir = t_tmpdir("sample_ref");
    char in_path[4200], out_path[4200], cmd[9000];
    snprintf(in_path, sizeof in_path, "%s/cases.txt", dir);
    snprintf(out_path, sizeof out_path, "%s/tokens.txt", dir);
    FILE *f = fopen(in_path, "w");
    T_CHECK(f != NULL);
    if (!f)
        return;
    static const int vocabs[] = {2, 5, 17, 64, 1000, 4099};
    static int32_t got[N_REF];
    static float logits[VMAX];
    static int32_t tokens[300];
    static ir_sample_pen pens[VMAX];
    uint64_t rng = 16;
    int kinds[8] = {0};
    for (int c = 0; c < N_REF; c++) {
        int V = vocabs[c % 6];
        /* rows: normal logits at a random scale, a few ties, zeros of both
         * signs, and now and then a huge one or a flat row */
        float scale = 0.1f + 8 * frand(&rng);
        for (int i = 0; i < V; i++)
            logits[i] = t_rand_normal(&rng) * scale;
        for (int i = 0; i < V / 4; i++)
            logits[t_rand_u64(&rng) % (uint64_t)V] = logits[t_rand_u64(&rng) % (uint64_t)V];
        logits[t_rand_u64(&rng) % (uint64_t)V] = 0.0f;
        logits[t_rand_u64(&rng) % (uint64_t)V] = -0.0f;
        if (c % 23 == 0) /* id 0 is in every prompt: a repetition penalty below 1 overflows */
            logits[0] = 3e38f;
        if (c % 37 == 1)
            logits[V - 1] = NAN;
        if (c % 31 == 5)
            for (int i = 0; i < V; i++)
                logits[i] = 1.5f;
        moec_sampling sp = {.seed = t_rand_u64(&rng)};
        int k = c % 8;
        kinds[k]++;
        sp.temperature = k == 7 ? 0 : 0.05f + 2 * frand(&rng);
        if (k == 1 || k == 4 || k == 6)
            sp.top_k = 1 + (int)(t_rand_u64(&rng) % (uint64_t)(V + 2));
        if (k == 2 || k == 4 || k == 6)
            sp.top_p = frand(&rng);
        if (k == 3 || k == 6)
            sp.min_p = frand(&rng) * 0.5f;
        if (k == 5 || k == 6 || k == 7) {
            sp.repetition_penalty = 0.2f + 1.8f * frand(&rng);
            sp.presence_penalty = 4 * frand(&rng) - 2;
            sp.frequency_penalty = 4 * frand(&rng) - 2;
        }
        int n_prompt = 1 + (int)(t_rand_u64(&rng) % 100), n_known = n_prompt + (int)(t_rand_u64(&rng) % 200);
        for (int i = 0; i < n_known; i++)
            tokens[i] = (int32_t)(t_rand_u64(&rng) % (uint64_t)(V < 50 ? V : 50));
        tokens[0] = 0;
        int counter = (int)(t_rand_u64(&rng) % 1000);
        ir_sample_row row;
        moec_sample_row_init(&sp, V, counter, &row);
        int n_pen = moec_sample_penalties(sampler(V), &sp, tokens, n_prompt, n_known, pens, V);
        row.pen_count = n_pen;
        got[c] = moec_sample_row(sampler(V), &row, pens, logits);
        fprintf(f, "%d %08x %08x %d %u %llu %08x %08x %08x %llu %u %d", V, bits(row.temperature),
                bits(row.inv_temp), row.top_k, row.top_p,
                (unsigned long long)row.min_p_hi << 32 | row.min_p_lo, bits(row.repetition),
                bits(row.presence), bits(row.frequency), (unsigned long long)sp.seed,
                row.counter, n_pen);
        for (int j = 0; j < n_pen; j++)
            fprintf(f, " %d %d", pens[j].id, pens[j].count);
        for (int i = 0; i < V; i++)
            fprintf(f, " %08x", bits(logits[i]));
        fputc('\n', f);
    }
    T_CHECK(fclose(f) == 0);
    snprintf(cmd, sizeof cmd, "python3 %s %s %s", t_src("tests/sample_ref.py"), in_path, out_path);
    int rc = system(cmd);
    T_CHECK(rc == 0);
    char *text = rc == 0 ? t_read_file(out_path, NULL) : NULL;
    int same = 0, nonfinite = 0, n = 0;
    for (char *p = text; p && *p && n < N_REF; n++) {
        long want = strtol(p, &p, 10);
        if (want != got[n] && n - same < 4)
            fprintf(stderr, "case %d: host %d, reference %ld\n", n, got[n], want);
        same += want == got[n];
        nonfinite += got[n] == IR_SAMPLED_NONFINITE;
    }
    free(text);
    printf("reference          %d of %d random rows and settings give the reference's token "
           "(%d not finite once penalized)\n",
           same, N_REF, nonfinite);
    T_CHECK(n == N_REF && same == N_REF && nonfinite > 0 && nonfinite < N_REF / 5);
}

/* ---- seeds ------------------------------------------------------------------------ */

static void test_seeds(void)
{
    enum { V = 1000 };
    static float row[V];
    uint64_t rng = 5;
    for (int i = 0; i < V; i++)
        row[i] = t_rand_normal(&rng) * 2;
    moec_sampling sp = {.temperature = 1.0f, .seed = 42, .top_p = 0.95f};
    int32_t a = draw(row, V, &sp, 7, NULL, 0, 0);
    T_CHECK(draw(row, V, &sp, 7, NULL, 0, 0) == a);
    int other_counter = 0, other_seed = 0;
    for (int k = 0; k < 20; k++) {
        other_counter += draw(row, V, &sp, 8 + k, NULL, 0, 0) != a;
        moec_sampling sq = sp;
        sq.seed = 43 + (uint64_t)k;
        other_seed += draw(row, V, &sq, 7, NULL, 0, 0) != a;
    }
    printf("seeds              seed 42, counter 7 twice: the same; 20 other counters: %d "
           "differ; 20 other seeds: %d differ\n",
           other_counter, other_seed);
    T_CHECK(other_counter >= 15 && other_seed >= 15);
}

/* ---- distributions ---------------------------------------------------------------- */

typedef struct cand {
    double v;
    int id;
} cand;

static int by_rank(const void *pa, const void *pb)
{
    const cand *a = pa, *b = pb;
    return a->v > b->v ? -1 : a->v < b->v ? 1 : a->id - b->id;
}

/* The exact distribution of sp over row (penalties applied: v) in double:
 * prob[i] 0 outside the support. */
static void exact(const float *v, int V, const moec_sampling *sp, double *prob)
{
    cand c[64];
    double mx = -INFINITY;
    for (int i = 0; i < V; i++)
        mx = fmax(mx, v[i]);
    for (int i = 0; i < V; i++)
        c[i] = (cand){v[i], i};
    qsort(c, (size_t)V, sizeof *c, by_rank);
    double w[64], z = 0;
    int n = sp->top_k > 0 && sp->top_k < V ? sp->top_k : V;
    for (int j = 0; j < n; j++)
        z += w[j] = exp((c[j].v - mx) / sp->temperature);
    if (sp->top_p > 0 && sp->top_p < 1) {
        double cum = 0;
        int keep = 0;
        while (keep < n && cum < sp->top_p * z)
            cum += w[keep++];
        n = keep;
    }
    double total = 0;
    memset(prob, 0, (size_t)V * sizeof *prob);
    for (int j = 0; j < n; j++)
        if (w[j] >= sp->min_p) {
            prob[c[j].id] = w[j];
            total += w[j];
        }
    for (int i = 0; i < V; i++)
        prob[i] /= total;
}

/* Chi-square of 40000 draws of sp from row against exact(); every draw
 * inside the support. */
static void check_distribution(const char *what, const float *row, int V, const moec_sampling *sp,
                               const int32_t *tokens, int n_prompt, int n_known)
{
    enum { N = 40000 };
    double prob[64];
    float v[64];
    memcpy(v, row, (size_t)V * sizeof *v);
    /* the penalties as the definition says, for the exact distribution */
    for (int i = 0; i < V; i++) {
        int in_prompt = 0, out = 0;
        for (int j = 0; j < n_known; j++)
            if (tokens && tokens[j] == i) {
                in_prompt |= j < n_prompt;
                out += j >= n_prompt;
            }
        float r = sp->repetition_penalty;
        if ((in_prompt || out) && r != 0 && r != 1)
            v[i] = v[i] > 0 ? v[i] / r : v[i] * r;
        if (out)
            v[i] -= sp->presence_penalty + sp->frequency_penalty * (float)out;
    }
    exact(v, V, sp, prob);
    int count[64] = {0}, outside = 0;
    for (int k = 0; k < N; k++) {
        int32_t t = draw(row, V, sp, k, tokens, n_prompt, n_known);
        if (t < 0 || t >= V || prob[t] == 0)
            outside++;
        else
            count[t]++;
    }
    double chi2 = 0;
    int dof = -1;
    for (int i = 0; i < V; i++)
        if (prob[i] > 0) {
            double e = prob[i] * N;
            chi2 += (count[i] - e) * (count[i] - e) / e;
            dof++;
        }
    /* the 1e-6 upper quantile of chi-square, dof <= 15: below 52 */
    double bound = dof < 1 ? 1e-9 : 52;
    printf("distribution       %-34s %2d ids kept: chi-square %6.2f (dof %d, bound %.0f), %d "
           "outside\n",
           what, dof + 1, chi2, dof, bound, outside);
    T_CHECK(outside == 0 && chi2 < bound && dof >= 0);
}

static void test_distributions(void)
{
    enum { V = 16 };
    float row[V];
    uint64_t rng = 99;
    for (int i = 0; i < V; i++)
        row[i] = t_rand_normal(&rng) * 1.5f;
    /* keep the filters' thresholds away from ties and rounding: the
     * definition's exact support must be this test's */
    moec_sampling sp = {.temperature = 1.0f, .seed = 3};
    check_distribution("temperature 1", row, V, &sp, NULL, 0, 0);
    sp.temperature = 0.6f;
    check_distribution("temperature 0.6", row, V, &sp, NULL, 0, 0);
    sp = (moec_sampling){.temperature = 1.3f, .top_k = 5, .seed = 4};
    check_distribution("top_k 5", row, V, &sp, NULL, 0, 0);
    sp = (moec_sampling){.temperature = 0.9f, .top_p = 0.8f, .seed = 5};
    check_distribution("top_p 0.8", row, V, &sp, NULL, 0, 0);
    sp = (moec_sampling){.temperature = 1.0f, .min_p = 0.15f, .seed = 6};
    check_distribution("min_p 0.15", row, V, &sp, NULL, 0, 0);
    sp = (moec_sampling){.temperature = 1.1f, .top_k = 9, .top_p = 0.9f, .min_p = 0.05f,
                         .seed = 7};
    check_distribution("top_k 9, top_p 0.9, min_p 0.05", row, V, &sp, NULL, 0, 0);
    const int32_t tokens[] = {3, 3, 7, 1, 7, 7, 12, 3};
    sp = (moec_sampling){.temperature = 1.0f, .repetition_penalty = 1.7f,
                         .presence_penalty = 0.8f, .frequency_penalty = -0.3f, .seed = 8};
    check_distribution("penalties (prompt 3, output 5)", row, V, &sp, tokens, 3, 8);
}

/* ---- supports ------------------------------------------------------------------- */

/* The set of ids 4000 draws of sp from row give, as a bit mask. */
static uint64_t drawn_set(const float *row, int V, const moec_sampling *sp)
{
    uint64_t set = 0;
    for (int k = 0; k < 4000; k++) {
        int32_t t = draw(row, V, sp, k, NULL, 0, 0);
        if (t >= 0 && t < 64)
            set |= 1ull << t;
    }
    return set;
}

static void test_supports(void)
{
    enum { V = 12 };
    /* ranked: 5 (3.0), then 2 and 9 tied (2.5), 0 (2.0), 7 and 11 tied (1.5),
     * then the rest at 1.0 and below */
    const float row[V] = {2.0f, 0.2f, 2.5f, 0.9f, 0.5f, 3.0f, 1.0f, 1.5f, 0.1f, 2.5f, 0.8f, 1.5f};
    moec_sampling sp = {.temperature = 4.0f, .seed = 11};
    T_CHECK(drawn_set(row, V, &sp) == 0xfff);
    sp.top_k = 2; /* 5, then the lower of the tied 2 and 9 */
    T_CHECK(drawn_set(row, V, &sp) == (1u << 5 | 1u << 2));
    sp.top_k = 5; /* 5, 2, 9, 0, then 7 before 11 */
    T_CHECK(drawn_set(row, V, &sp) == (1u << 5 | 1u << 2 | 1u << 9 | 1u << 0 | 1u << 7));
    sp.top_k = 1;
    T_CHECK(drawn_set(row, V, &sp) == 1u << 5);
    /* top_p: weights at temperature 4 are e^((v - 3) / 4): 1, .8825 (x2),
     * .7788, .6873 (x2), .6065, ... (total 8.21); 0.3 of it (2.46) takes 5,
     * 2 and 9 (2.77); 0.2 (1.64) stops at 2, the lower of the tie */
    sp = (moec_sampling){.temperature = 4.0f, .top_p = 0.3f, .seed = 12};
    T_CHECK(drawn_set(row, V, &sp) == (1u << 5 | 1u << 2 | 1u << 9));
    sp.top_p = 0.2f;
    T_CHECK(drawn_set(row, V, &sp) == (1u << 5 | 1u << 2));
    sp.top_p = 1e-6f;
    T_CHECK(drawn_set(row, V, &sp) == 1u << 5);
    /* min_p 0.7: weights at least .7 of the top's: 5, 2, 9, 0 (.7788) */
    sp = (moec_sampling){.temperature = 4.0f, .min_p = 0.7f, .seed = 13};
    T_CHECK(drawn_set(row, V, &sp) == (1u << 5 | 1u << 2 | 1u << 9 | 1u << 0));
    sp.min_p = 1.0f;
    T_CHECK(drawn_set(row, V, &sp) == 1u << 5);
    /* all three: top_k 6 (5, 2, 9, 0, 7, 11: 4.92), top_p 0.6 of those
     * (2.95: 5, 2, 9, 0), min_p 0.8 (5, 2, 9) */
    sp = (moec_sampling){.temperature = 4.0f, .top_k = 6, .top_p = 0.6f, .seed = 14};
    T_CHECK(drawn_set(row, V, &sp) == (1u << 5 | 1u << 2 | 1u << 9 | 1u << 0));
    sp.min_p = 0.8f;
    T_CHECK(drawn_set(row, V, &sp) == (1u << 5 | 1u << 2 | 1u << 9));
    /* temperature 0: the argmax, the lowest id on ties */
    const float tie[4] = {1.0f, 4.0f, 4.0f, -2.0f};
    sp = (moec_sampling){.seed = 1};
    T_CHECK(draw(tie, 4, &sp, 0, NULL, 0, 0) == 1);
    printf("supports           every filter's ids exact, ties to the lower ids\n");
}

/* ---- penalties ------------------------------------------------------------------- */

static void test_penalties(void)
{
    enum { V = 10 };
    moec_sampler *s = sampler(V);
    ir_sample_pen pens[V];
    /* prompt 4 4 1, output 7 4 7 7 */
    const int32_t tokens[] = {4, 4, 1, 7, 4, 7, 7};
    moec_sampling sp = {.repetition_penalty = 1.2f};
    int n = moec_sample_penalties(s, &sp, tokens, 3, 7, pens, V);
    T_CHECK(n == 3 && pens[0].id == 4 && pens[0].count == 1 && pens[1].id == 1 &&
            pens[1].count == 0 && pens[2].id == 7 && pens[2].count == 3);
    T_CHECK(moec_sample_penalties(s, &sp, tokens, 3, 7, pens, 2) == -1);
    sp = (moec_sampling){.frequency_penalty = 0.5f};
    n = moec_sample_penalties(s, &sp, tokens, 3, 7, pens, V);
    T_CHECK(n == 2 && pens[0].id == 7 && pens[0].count == 3 && pens[1].id == 4 &&
            pens[1].count == 1);
    sp = (moec_sampling){.temperature = 1.0f, .repetition_penalty = 1.0f};
    T_CHECK(moec_sample_penalties(s, &sp, tokens, 3, 7, pens, V) == 0);

    /* greedy after penalties: 7 (3 times in the output) leads 4 (once) by
     * 0.5; a frequency penalty of 0.3 takes 0.9 from 7, 0.3 from 4: 4 wins;
     * a presence penalty of 0.5 more takes both below 9 (never seen); a
     * repetition penalty of 2 halves 7 and 4 */
    float row[V] = {0, 1.0f, 0, 0, 2.6f, 0, 0, 3.1f, 0, 2.0f};
    sp = (moec_sampling){.seed = 1};
    T_CHECK(draw(row, V, &sp, 0, tokens, 3, 7) == 7);
    sp.frequency_penalty = 0.3f;
    T_CHECK(draw(row, V, &sp, 0, tokens, 3, 7) == 4);
    sp.presence_penalty = 0.5f;
    T_CHECK(draw(row, V, &sp, 0, tokens, 3, 7) == 9);
    sp = (moec_sampling){.repetition_penalty = 2.0f, .seed = 1};
    T_CHECK(draw(row, V, &sp, 0, tokens, 3, 7) == 9);
    /* a negative logit is multiplied: 1 (in the prompt) at -0.6 falls to
     * -1.2, below 3 (never seen) at -1 */
    float neg[V] = {-1.5f, -0.6f, -1.5f, -1.0f, -1.5f, -1.5f, -1.5f, -1.5f, -1.5f, -1.5f};
    sp = (moec_sampling){.seed = 1};
    T_CHECK(draw(neg, V, &sp, 0, tokens, 3, 7) == 1);
    sp.repetition_penalty = 2.0f;
    T_CHECK(draw(neg, V, &sp, 0, tokens, 3, 7) == 3);
    /* overflow: 3e38 / 0.1 is infinite */
    sp.repetition_penalty = 0.1f;
    row[4] = 3e38f;
    T_CHECK(draw(row, V, &sp, 0, tokens, 3, 7) == IR_SAMPLED_NONFINITE);
    /* a NaN logit, penalties or not */
    row[4] = NAN;
    sp = (moec_sampling){.temperature = 1.0f, .seed = 2};
    T_CHECK(draw(row, V, &sp, 0, NULL, 0, 0) == IR_SAMPLED_NONFINITE);
    printf("penalties          entries, greedy effects, overflow and NaN as IR_SAMPLED_NONFINITE\n");
}

/* ---- the runtime's check ------------------------------------------------------- */

static void test_check(void)
{
    enum { V = 8 };
    uint32_t stamp[V] = {0}, epoch = 0;
    moec_sampling sp = {.temperature = 0.7f, .top_k = 3, .top_p = 0.5f, .min_p = 1.0f,
                        .repetition_penalty = 1.1f, .presence_penalty = -2, .seed = 9};
    ir_sample_row rows[3];
    memset(rows, 0, sizeof rows);
    moec_sample_row_init(&sp, V, 4, &rows[0]);
    moec_sample_row_init(&sp, V, 5, &rows[2]);
    rows[0].pen_count = 2;
    rows[2].pen_first = 2;
    rows[2].pen_count = 1;
    ir_sample_pen pens[3] = {{1, 0, 0}, {5, 2, 0}, {1, 1, 0}};
    T_OK(rt_sample_check(V, 3, rows, 3, pens, stamp, &epoch));
    T_CHECK(rows[0].top_p == 2147483648u && rows[0].min_p_hi == 256 && rows[0].min_p_lo == 0 &&
            rows[0].inv_temp == (float)(1.0 / 0.7f));
    struct {
        int row;
        int field;
        float f;
        int i;
        const char *msg;
    } bad[] = {
        {0, 0, 0, 2, "sampling row 0: mode 2 is neither off nor on"},
        {2, 1, -1, 0, "sampling row 2: temperature -1"},
        {0, 1, INFINITY, 0, "sampling row 0: temperature inf"},
        {0, 2, 0, 0, "(1/t 0) is not finite"},
        {0, 3, 0, 8, "sampling row 0: top_k 8 is not in [0, 8)"},
        {0, 4, 0, 257, "min_p's weight 1103806595072 is over 2^40"},
        {0, 5, 0, 0, "penalties 0, -2, 0 (repetition above 0"},
        {2, 6, 0, 1, "sampling row 2: penalty entries 1 .. 1 are not a range of the 3 after"},
        {2, 7, 0, 3, "sampling row 2: penalty entries 2 .. 4 are not a range"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        ir_sample_row r[3];
        memcpy(r, rows, sizeof r);
        ir_sample_row *p = &r[bad[k].row];
        switch (bad[k].field) {
        case 0: p->mode = bad[k].i; break;
        case 1: p->temperature = bad[k].f; break;
        case 2: p->inv_temp = 0; break;
        case 3: p->top_k = bad[k].i; break;
        case 4: p->min_p_hi = (uint32_t)bad[k].i; break;
        case 5: p->repetition = 0; break;
        case 6: p->pen_first = bad[k].i; break;
        case 7: p->pen_count = bad[k].i; break;
        }
        T_ERR(rt_sample_check(V, 3, r, 3, pens, stamp, &epoch), MOEC_ERR_INVALID_ARG, bad[k].msg);
    }
    pens[1].id = 8;
    T_ERR(rt_sample_check(V, 3, rows, 3, pens, stamp, &epoch), MOEC_ERR_INVALID_ARG,
          "sampling row 0: penalty entry 1: id 8 (vocabulary 8), count 2");
    pens[1].id = 1;
    T_ERR(rt_sample_check(V, 3, rows, 3, pens, stamp, &epoch), MOEC_ERR_INVALID_ARG,
          "sampling row 0: penalty entry 1: id 1 is listed twice");
    pens[1].id = 5;
    /* subnormal settings are settings: a repetition penalty of 1e-45, a
     * temperature whose inverse is below FLT_MIN */
    rows[0].repetition = 1e-45f;
    rows[2].temperature = 3e38f;
    rows[2].inv_temp = (float)(1.0 / 3e38);
    T_OK(rt_sample_check(V, 3, rows, 3, pens, stamp, &epoch));
    /* rows off are not read */
    pens[1].id = 1;
    memset(&rows[0], 0, sizeof rows[0]);
    rows[0].top_k = -5;
    T_OK(rt_sample_check(V, 3, rows, 3, pens, stamp, &epoch));
    /* the public check a service runs before it queues a request: a NULL
     * is a refusal like any bad setting, never a crash */
    T_ERR(moec_sampling_check(NULL), MOEC_ERR_INVALID_ARG, "moec_sampling_check: NULL sampling");
    T_ERR(moec_sampling_check(&(moec_sampling){.top_logprobs = 21}), MOEC_ERR_INVALID_ARG,
          "top_logprobs must be from 0 to 20, got 21");
    T_OK(moec_sampling_check(&sp));
    printf("check              every refusal named\n");
}

int main(void)
{
    test_weights();
    test_reference();
    test_seeds();
    test_distributions();
    test_supports();
    test_penalties();
    test_check();
    for (int v = 0; v <= VMAX; v++)
        if (g_s[v].vocab)
            moec_sampler_free(&g_s[v]);
    return t_finish("test_sample");
}
