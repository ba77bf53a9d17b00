/* sample.c — host sampling (sample.h): the CPU twin of the device sampler
 * (codegen/sample.c), the algorithm of ir/ir_sample.h. The order and meaning
 * of the settings follow vLLM's sampler: repetition penalty over prompt and
 * output, presence and frequency penalties over the output, then
 * temperature, top_k, top_p and min_p, then one draw. The kernel finds its
 * thresholds by radix selection; here top_k keeps a heap of k and top_p
 * finds its nucleus by a quickselect on the weights, unsorted: the same
 * sets, since both rank by (logit, id). Every float operation is the
 * kernel's, in its order, and this file is built without contraction into
 * fused multiply-adds (CMakeLists.txt), so the weights, and so the tokens,
 * are bit for bit the device's. */
#include "engine/sample.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "runtime/interp.h"

#if !defined(FLT_EVAL_METHOD) || FLT_EVAL_METHOD != 0
#error "host sampling needs float arithmetic evaluated in float (FLT_EVAL_METHOD 0), as the GPU does"
#endif

/* A candidate: an id and its (processed) logit. */
typedef struct cand {
    float v;
    int32_t id;
} cand;

moec_status moec_sampler_init(moec_sampler *s, int vocab)
{
    memset(s, 0, sizeof *s);
    s->vocab = vocab;
    size_t n = (size_t)(vocab > 0 ? vocab : 1);
    s->work = malloc(n * sizeof *s->work);
    s->cands = malloc(n * sizeof(cand));
    s->weight = malloc(n * sizeof *s->weight);
    s->keep = malloc(n * sizeof *s->keep);
    s->stamp = calloc(n, sizeof *s->stamp);
    s->count = calloc(n, sizeof *s->count);
    s->pens = malloc(n * sizeof *s->pens);
    if (!s->work || !s->cands || !s->weight || !s->keep || !s->stamp || !s->count || !s->pens) {
        moec_sampler_free(s);
        return MOEC_ERR(MOEC_ERR_OOM, "out of memory for sampling rows of %d ids", vocab);
    }
    return MOEC_OK;
}

void moec_sampler_free(moec_sampler *s)
{
    free(s->work);
    free(s->cands);
    free(s->weight);
    free(s->keep);
    free(s->stamp);
    free(s->count);
    free(s->pens);
    memset(s, 0, sizeof *s);
}

/* A setting out of [lo, hi] (or not finite). */
static moec_status out_of_range(const char *name, double v, double lo, double hi)
{
    if (isfinite(hi))
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "%s must be a number from %g to %g, got %g", name,
                        lo, hi, v);
    return MOEC_ERR(MOEC_ERR_INVALID_ARG, "%s must be a finite number >= %g, got %g", name, lo,
                    v);
}

static int within(double v, double lo, double hi) { return isfinite(v) && v >= lo && v <= hi; }

moec_status moec_sampling_check(const moec_sampling *sp)
{
    if (!sp)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "moec_sampling_check: NULL sampling");
    if (!within(sp->temperature, 0, HUGE_VAL))
        return out_of_range("temperature", sp->temperature, 0, HUGE_VAL);
    if (sp->top_k < 0)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "top_k must be 0 (all) or more, got %d",
                        sp->top_k);
    if (!within(sp->top_p, 0, 1))
        return out_of_range("top_p", sp->top_p, 0, 1);
    if (!within(sp->min_p, 0, 1))
        return out_of_range("min_p", sp->min_p, 0, 1);
    if (!within(sp->repetition_penalty, 0, HUGE_VAL))
        return out_of_range("repetition_penalty", sp->repetition_penalty, 0, HUGE_VAL);
    if (!within(sp->presence_penalty, -2, 2))
        return out_of_range("presence_penalty", sp->presence_penalty, -2, 2);
    if (!within(sp->frequency_penalty, -2, 2))
        return out_of_range("frequency_penalty", sp->frequency_penalty, -2, 2);
    if (sp->logprob != 0 && sp->logprob != 1)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "logprob must be 0 or 1, got %d", sp->logprob);
    if (sp->top_logprobs < 0 || sp->top_logprobs > MOEC_TOP_LOGPROBS_MAX)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "top_logprobs must be from 0 to %d, got %d",
                        MOEC_TOP_LOGPROBS_MAX, sp->top_logprobs);
    return MOEC_OK;
}

static int has_repetition(const moec_sampling *sp)
{
    return sp->repetition_penalty != 0 && sp->repetition_penalty != 1;
}

static int has_presence_frequency(const moec_sampling *sp)
{
    return sp->presence_penalty != 0 || sp->frequency_penalty != 0;
}

int moec_sampling_is_plain_greedy(const moec_sampling *sp)
{
    return sp->temperature == 0 && !has_repetition(sp) && !has_presence_frequency(sp) &&
           !sp->logprob && !sp->top_logprobs;
}

/* ---- the row's parameters and penalties ------------------------------------ */

void moec_sample_row_init(const moec_sampling *sp, int vocab, int counter, ir_sample_row *row)
{
    memset(row, 0, sizeof *row);
    row->mode = IR_SAMPLE_ON;
    row->logprob = sp->logprob;
    row->temperature = sp->temperature;
    double inv = sp->temperature > 0 ? 1.0 / sp->temperature : 0;
    row->inv_temp = inv >= FLT_MAX ? FLT_MAX : (float)inv;
    row->top_k = sp->top_k > 0 && sp->top_k < vocab ? sp->top_k : 0;
    if (sp->top_p > 0 && sp->top_p < 1) {
        /* a float below 1 is at most 1 - 2^-24: this fits 32 bits; a
         * top_p too small to show stays a filter (of the likeliest id) */
        double p = nearbyint((double)sp->top_p * 0x1p32);
        row->top_p = p < 1 ? 1u : (uint32_t)p;
    }
    uint64_t min_w = sp->min_p > 0 ? (uint64_t)ceil((double)sp->min_p * 0x1p40) : 0;
    row->min_p_lo = (uint32_t)min_w;
    row->min_p_hi = (uint32_t)(min_w >> 32);
    row->repetition = has_repetition(sp) ? sp->repetition_penalty : 1.0f;
    row->presence = sp->presence_penalty;
    row->frequency = sp->frequency_penalty;
    row->seed_lo = (uint32_t)sp->seed;
    row->seed_hi = (uint32_t)(sp->seed >> 32);
    row->counter = (uint32_t)counter;
}

static uint32_t next_epoch(moec_sampler *s)
{
    if (++s->epoch == 0) {
        memset(s->stamp, 0, (size_t)s->vocab * sizeof *s->stamp);
        s->epoch = 1;
    }
    return s->epoch;
}

int moec_sample_penalties(moec_sampler *s, const moec_sampling *sp, const int32_t *tokens,
                          int n_prompt, int n_known, ir_sample_pen *pens, int cap)
{
    int from = has_repetition(sp) ? 0 : has_presence_frequency(sp) ? n_prompt : n_known;
    if (from == n_known)
        return 0;
    /* counts in the output under one epoch, then each id listed once under
     * the next */
    uint32_t counted = next_epoch(s);
    for (int i = n_prompt; i < n_known; i++) {
        int32_t id = tokens[i];
        if (s->stamp[id] != counted) {
            s->stamp[id] = counted;
            s->count[id] = 0;
        }
        s->count[id]++;
    }
    uint32_t listed = next_epoch(s);
    int n = 0;
    for (int i = from; i < n_known; i++) {
        int32_t id = tokens[i];
        if (s->stamp[id] == listed)
            continue;
        int32_t c = s->stamp[id] == counted ? s->count[id] : 0;
        s->stamp[id] = listed;
        if (n == cap)
            return -1;
        pens[n++] = (ir_sample_pen){.id = id, .count = c};
    }
    return n;
}

/* ---- the algorithm ------------------------------------------------------------ */

uint64_t moec_sample_weight(float x)
{
    if (!(x >= IR_SAMPLE_X_MIN))
        return 0;
    float k = rintf(x * IR_SAMPLE_LOG2E);
    float r = (x - k * IR_SAMPLE_LN2_HI) - k * IR_SAMPLE_LN2_LO;
    float p = IR_SAMPLE_EXP_C6;
    p = p * r + IR_SAMPLE_EXP_C5;
    p = p * r + IR_SAMPLE_EXP_C4;
    p = p * r + IR_SAMPLE_EXP_C3;
    p = p * r + IR_SAMPLE_EXP_C2;
    p = p * r + IR_SAMPLE_EXP_C1;
    p = p * r + IR_SAMPLE_EXP_C0;
    return (uint64_t)(p * ldexpf(1.0f, IR_SAMPLE_WEIGHT_BITS + (int)k));
}

/* The high 64 bits of a * b. */
static uint64_t mul_hi(uint64_t a, uint64_t b)
{
    uint64_t al = (uint32_t)a, ah = a >> 32, bl = (uint32_t)b, bh = b >> 32;
    uint64_t ll = al * bl, lh = al * bh, hl = ah * bl, hh = ah * bh;
    uint64_t mid = (ll >> 32) + (uint32_t)lh + (uint32_t)hl;
    return hh + (lh >> 32) + (hl >> 32) + (mid >> 32);
}

static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * IR_SAMPLE_MIX1;
    z = (z ^ (z >> 27)) * IR_SAMPLE_MIX2;
    return z ^ (z >> 31);
}

/* The row's random word (ir_sample.h). */
static uint64_t random_word(const ir_sample_row *p)
{
    uint64_t seed = (uint64_t)p->seed_hi << 32 | p->seed_lo;
    return mix64(mix64(seed + IR_SAMPLE_GOLDEN) + ((uint64_t)p->counter + 1) * IR_SAMPLE_GOLDEN);
}

/* The penalties on row, in the kernel's operations. */
static void penalize(float *row, const ir_sample_row *p, const ir_sample_pen *pens)
{
    int rep = p->repetition != 1.0f, pf = p->presence != 0 || p->frequency != 0;
    for (int j = 0; j < p->pen_count; j++) {
        float v = row[pens[j].id];
        if (rep)
            v = v > 0 ? v / p->repetition : v * p->repetition;
        if (pf && pens[j].count > 0)
            v = v - (p->presence + p->frequency * (float)pens[j].count);
        row[pens[j].id] = v;
    }
}

/* a ranks before b: a larger value, or an equal one and a lower id. */
static int before(const cand *a, const cand *b)
{
    return a->v > b->v || (a->v == b->v && a->id < b->id);
}

static int cand_order(const void *pa, const void *pb)
{
    const cand *a = pa, *b = pb;
    return before(a, b) ? -1 : before(b, a) ? 1 : 0;
}

/* Moves h[i] down the heap of n whose root ranks last. */
static void sift_down(cand *h, int n, int i)
{
    for (;;) {
        int worst = i, l = 2 * i + 1, r = l + 1;
        if (l < n && before(&h[worst], &h[l]))
            worst = l;
        if (r < n && before(&h[worst], &h[r]))
            worst = r;
        if (worst == i)
            return;
        cand t = h[i];
        h[i] = h[worst];
        h[worst] = t;
        i = worst;
    }
}

/* The k first-ranked ids of v[0, n) into out[0, k), ranked. */
static void top_ranked(const float *v, int n, int k, cand *out)
{
    if (k >= n) {
        for (int i = 0; i < n; i++)
            out[i] = (cand){v[i], i};
        qsort(out, (size_t)n, sizeof *out, cand_order);
        return;
    }
    for (int i = 0; i < k; i++)
        out[i] = (cand){v[i], i};
    for (int i = k / 2 - 1; i >= 0; i--)
        sift_down(out, k, i);
    for (int i = k; i < n; i++) {
        cand c = {v[i], i};
        if (before(&c, &out[0])) {
            out[0] = c;
            sift_down(out, k, 0);
        }
    }
    qsort(out, (size_t)k, sizeof *out, cand_order);
}

static void cand_swap(cand *a, cand *b)
{
    cand t = *a;
    *a = *b;
    *b = t;
}

/* Reorders c[0, n) so that its first m (returned) are the nucleus: the
 * fewest first-ranked whose weights w[id] reach need (at most their total),
 * in no particular order. Quickselect on the weight (expected O(n)):
 * partition around a pivot; if the ids ranked above it reach what is still
 * needed the nucleus lies among them, else they and the pivot are in it and
 * the rest is searched. */
static int nucleus(cand *c, int n, const uint64_t *w, uint64_t need)
{
    int lo = 0, hi = n;
    uint64_t taken = 0; /* the weight of c[0, lo), all in the nucleus */
    while (hi - lo > 1) {
        int m = lo + (hi - lo) / 2;
        /* the median of three as pivot, moved to hi - 1 */
        if (before(&c[m], &c[lo]))
            cand_swap(&c[m], &c[lo]);
        if (before(&c[hi - 1], &c[lo]))
            cand_swap(&c[hi - 1], &c[lo]);
        if (before(&c[m], &c[hi - 1]))
            cand_swap(&c[m], &c[hi - 1]);
        cand pivot = c[hi - 1];
        int mid = lo;
        uint64_t above = 0;
        for (int i = lo; i < hi - 1; i++)
            if (before(&c[i], &pivot)) {
                above += w[c[i].id];
                cand_swap(&c[i], &c[mid++]);
            }
        cand_swap(&c[hi - 1], &c[mid]);
        if (taken + above >= need) {
            hi = mid;
        } else if (taken + above + w[pivot.id] >= need) {
            return mid + 1;
        } else {
            taken += above + w[pivot.id];
            lo = mid + 1;
        }
    }
    return hi > 0 ? hi : 1;
}

int32_t moec_sample_row(moec_sampler *s, const ir_sample_row *p, const ir_sample_pen *pens,
                        const float *logits)
{
    int V = s->vocab;
    const float *v = logits; /* nothing to penalize: read in place */
    if (p->pen_count > 0) {
        memcpy(s->work, logits, (size_t)V * sizeof *s->work);
        penalize(s->work, p, pens);
        v = s->work;
    }
    /* one pass finds the greedy id and whether the row is finite */
    int32_t top = rt_logits_argmax(v, V);
    if (top == IR_SAMPLED_NONFINITE || p->temperature == 0)
        return top;
    float vmax = v[top];
    uint64_t *w = s->weight;
    unsigned char *keep = s->keep;
    for (int i = 0; i < V; i++) {
        w[i] = moec_sample_weight((v[i] - vmax) * p->inv_temp);
        keep[i] = 1;
    }
    cand *c = s->cands;
    int n = V, ranked = 0;
    if (p->top_k > 0 && p->top_k < V) {
        n = p->top_k;
        top_ranked(v, V, n, c);
        ranked = 1;
    }
    if (p->top_p) {
        if (!ranked)
            for (int i = 0; i < V; i++)
                c[i] = (cand){v[i], i};
        uint64_t z = 0;
        for (int j = 0; j < n; j++)
            z += w[c[j].id];
        uint64_t need = mul_hi(z, (uint64_t)p->top_p << 32);
        n = nucleus(c, n, w, need ? need : 1);
        ranked = 1;
    }
    if (ranked) {
        memset(keep, 0, (size_t)V);
        for (int j = 0; j < n; j++)
            keep[c[j].id] = 1;
    }
    uint64_t min_w = (uint64_t)p->min_p_hi << 32 | p->min_p_lo, total = 0;
    for (int i = 0; i < V; i++)
        if (keep[i] && w[i] >= min_w)
            total += w[i];
        else
            keep[i] = 0;
    /* the likeliest id is always kept, with weight 2^40: total > 0 */
    uint64_t u = mul_hi(random_word(p), total), acc = 0;
    for (int i = 0; i < V; i++)
        if (keep[i] && u < (acc += w[i]))
            return i;
    return top; /* not reached: u < total */
}

/* The log of the sum of e^logit over a row (finite), in double. */
static double log_sum_exp(const float *logits, int vocab)
{
    float mx = logits[rt_logits_argmax(logits, vocab)];
    double sum = 0;
    for (int i = 0; i < vocab; i++)
        sum += exp((double)logits[i] - mx);
    return mx + log(sum);
}

float moec_sample_logprob(const float *logits, int vocab, int32_t tok)
{
    return (float)(logits[tok] - log_sum_exp(logits, vocab));
}

/* Log probabilities of the raw logits (all finite): the token's, and the
 * top n. */
static void log_probs(moec_sampler *s, const moec_sampling *sp, const float *logits, int32_t tok,
                      moec_event *ev)
{
    int V = s->vocab;
    double lse = log_sum_exp(logits, V);
    ev->logprob = (float)(logits[tok] - lse);
    ev->n_top = sp->top_logprobs < V ? sp->top_logprobs : V;
    if (!ev->n_top)
        return;
    cand *c = s->cands;
    top_ranked(logits, V, ev->n_top, c);
    for (int i = 0; i < ev->n_top; i++) {
        ev->top_ids[i] = c[i].id;
        ev->top_logprobs[i] = (float)(c[i].v - lse);
    }
}

int32_t moec_sample(moec_sampler *s, const moec_sampling *sp, const float *logits,
                    const int32_t *tokens, int n_prompt, int n_known, moec_event *ev)
{
    ir_sample_row row;
    moec_sample_row_init(sp, s->vocab, n_known - n_prompt, &row);
    /* distinct ids are never more than the vocabulary: they fit */
    row.pen_count = moec_sample_penalties(s, sp, tokens, n_prompt, n_known, s->pens, s->vocab);
    int32_t tok = moec_sample_row(s, &row, s->pens, logits);
    if (tok != IR_SAMPLED_NONFINITE && (sp->logprob || sp->top_logprobs))
        log_probs(s, sp, logits, tok, ev);
    return tok;
}
