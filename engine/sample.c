/* sample.c — host sampling (sample.h). The order and meaning follow vLLM's
 * sampler: repetition penalty over prompt and output, then presence and
 * frequency penalties over the output, then temperature, top_k, top_p and
 * min_p, then one uniform draw. Sorting is avoided where it can be: top_k
 * keeps a heap of k; top_p alone finds its nucleus by a quickselect on
 * probability mass, unsorted; plain sampling walks the row in id order.
 * One exp per id (per top_k id with top_k). */
#include "engine/sample.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "runtime/interp.h"

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
    s->prob = malloc(n * sizeof *s->prob);
    s->stamp = calloc(n, sizeof *s->stamp);
    s->count = calloc(n, sizeof *s->count);
    if (!s->work || !s->cands || !s->prob || !s->stamp || !s->count) {
        moec_sampler_free(s);
        return MOEC_ERR(MOEC_ERR_OOM, "out of memory for sampling rows of %d ids", vocab);
    }
    return MOEC_OK;
}

void moec_sampler_free(moec_sampler *s)
{
    free(s->work);
    free(s->cands);
    free(s->prob);
    free(s->stamp);
    free(s->count);
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

int moec_sampling_is_plain_greedy(const moec_sampling *sp)
{
    return sp->temperature == 0 && !has_repetition(sp) && sp->presence_penalty == 0 &&
           sp->frequency_penalty == 0 && !sp->logprob && !sp->top_logprobs;
}

uint64_t moec_sampling_stream(uint64_t seed) { return seed; }

/* splitmix64: the next draw of a stream, uniform in [0, 1). */
static double next_uniform(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (double)(z >> 11) * 0x1.0p-53;
}

static uint32_t next_epoch(moec_sampler *s)
{
    if (++s->epoch == 0) {
        memset(s->stamp, 0, (size_t)s->vocab * sizeof *s->stamp);
        s->epoch = 1;
    }
    return s->epoch;
}

/* Penalties on s->work: repetition once per id of prompt and output, then
 * presence and frequency once per id of the output. */
static void apply_penalties(moec_sampler *s, const moec_sampling *sp, const int32_t *tokens,
                            int n_prompt, int n_known)
{
    if (has_repetition(sp)) {
        uint32_t e = next_epoch(s);
        float r = sp->repetition_penalty;
        for (int i = 0; i < n_known; i++) {
            int32_t id = tokens[i];
            if (s->stamp[id] == e)
                continue;
            s->stamp[id] = e;
            s->work[id] = s->work[id] > 0 ? s->work[id] / r : s->work[id] * r;
        }
    }
    if (sp->presence_penalty == 0 && sp->frequency_penalty == 0)
        return;
    uint32_t e = next_epoch(s);
    for (int i = n_prompt; i < n_known; i++) {
        int32_t id = tokens[i];
        if (s->stamp[id] != e) {
            s->stamp[id] = e;
            s->count[id] = 0;
        }
        s->count[id]++;
    }
    for (int i = n_prompt; i < n_known; i++) {
        int32_t id = tokens[i];
        if (s->count[id] > 0)
            s->work[id] -= sp->presence_penalty + sp->frequency_penalty * (float)s->count[id];
        s->count[id] = 0;
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

/* Reorders c[0, n) so that its first k (returned) are the nucleus: the
 * fewest first-ranked whose weights w[id] reach `need`, in no particular
 * order. Quickselect on the mass (expected O(n)): partition around a
 * pivot; if the ids ranked above it reach what is still needed the nucleus
 * lies among them, else they and the pivot are in it and the rest is
 * searched. */
static int nucleus(cand *c, int n, const double *w, double need)
{
    int lo = 0, hi = n;
    double taken = 0; /* the weight of c[0, lo), all in the nucleus */
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
        double above = 0;
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

/* The candidates the draw chooses among, into s->cands[0, *n), each id's
 * weight exp((v - mx) / t) into s->prob[id] and their sum over the support
 * (the top_k, or all ids) into *z: the top_k ranked, then, for top_p, the
 * nucleus (the top_k's prefix, or found among all ids); else every id,
 * unranked (returns 0, s->cands unused). */
static int candidates(moec_sampler *s, const moec_sampling *sp, float mx, double t, int *n,
                      double *z)
{
    int V = s->vocab, top_p = sp->top_p > 0 && sp->top_p < 1;
    cand *c = s->cands;
    double *w = s->prob;
    *z = 0;
    if (sp->top_k > 0 && sp->top_k < V) {
        *n = sp->top_k;
        top_ranked(s->work, V, *n, c);
        for (int i = 0; i < *n; i++)
            *z += w[c[i].id] = exp((c[i].v - mx) / t);
        if (top_p) {
            double cum = 0;
            int keep = 0;
            while (keep < *n && cum < sp->top_p * *z)
                cum += w[c[keep++].id];
            *n = keep;
        }
        return 1;
    }
    for (int i = 0; i < V; i++)
        *z += w[i] = exp((s->work[i] - mx) / t);
    *n = V;
    if (!top_p)
        return 0;
    for (int i = 0; i < V; i++)
        c[i] = (cand){s->work[i], i};
    *n = nucleus(c, V, w, sp->top_p * *z);
    return 1;
}

/* A draw from the processed row in s->work (temperature > 0), whose largest
 * value is mx. */
static int32_t draw(moec_sampler *s, const moec_sampling *sp, uint64_t *rng, float mx)
{
    double t = sp->temperature, z;
    int n;
    int ranked = candidates(s, sp, mx, t, &n, &z);
    const cand *c = s->cands;
    const double *w = s->prob;
#define ID_AT(i) (ranked ? c[(i)].id : (int32_t)(i))
    /* min_p: the likeliest id has weight exp(0) = 1 */
    double total = 0;
    for (int i = 0; i < n; i++)
        if (w[ID_AT(i)] >= sp->min_p)
            total += w[ID_AT(i)];
    double u = next_uniform(rng) * total, acc = 0;
    int32_t last = ID_AT(0);
    for (int i = 0; i < n; i++) {
        double wi = w[ID_AT(i)];
        if (wi < sp->min_p)
            continue;
        acc += wi;
        last = ID_AT(i);
        if (u < acc)
            break;
    }
#undef ID_AT
    return last;
}

/* Log probabilities of the raw logits (all finite): the token's, and the
 * top n. */
static void log_probs(moec_sampler *s, const moec_sampling *sp, const float *logits, int32_t tok,
                      moec_event *ev)
{
    int V = s->vocab;
    float mx = logits[rt_logits_argmax(logits, V)];
    double sum = 0;
    for (int i = 0; i < V; i++)
        sum += exp((double)logits[i] - mx);
    double lse = mx + log(sum);
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

int32_t moec_sample(moec_sampler *s, const moec_sampling *sp, uint64_t *rng, const float *logits,
                    const int32_t *tokens, int n_prompt, int n_known, moec_event *ev)
{
    const float *row = logits; /* greedy with nothing to change: read in place */
    if (sp->temperature != 0 || has_repetition(sp) || sp->presence_penalty != 0 ||
        sp->frequency_penalty != 0) {
        memcpy(s->work, logits, (size_t)s->vocab * sizeof *s->work);
        apply_penalties(s, sp, tokens, n_prompt, n_known);
        row = s->work;
    }
    /* one pass finds the greedy id and whether the row is finite; the
     * penalties keep a NaN or an infinity as it is, so a finite row here
     * means finite logits too */
    int32_t top = rt_logits_argmax(row, s->vocab);
    if (top == IR_SAMPLED_NONFINITE)
        return top;
    int32_t tok = sp->temperature == 0 ? top : draw(s, sp, rng, row[top]);
    if (sp->logprob || sp->top_logprobs)
        log_probs(s, sp, logits, tok, ev);
    return tok;
}
