/* test_golden.c — the CPU interpreter against Hugging Face transformers: for
 * every tiny model in tests/data (one or two per family), the fp32 logits at
 * every prompt position and at each greedy decode step, and the greedy tokens,
 * must match what scripts/make_goldens.py computed with transformers:
 * per row, max |moec - ref| <= 1e-4 * max |ref|; tokens identical. */
#include <cjson/cJSON.h>
#include <math.h>
#include <string.h>

#include "testlib.h"

static const char *MODELS[] = {"deepseek_v2", "deepseek_v2_qlora", "deepseek_v3", "qwen2_moe",
                               "qwen3_moe"};

static int read_ints(const cJSON *arr, int32_t *out, int cap)
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

static int argmax(const float *row, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (row[i] > row[best])
            best = i;
    return best;
}

/* Compares one row; returns the error relative to max |ref|. */
static double row_error(const float *got, const float *ref, int n)
{
    double maxref = 0, maxdiff = 0;
    for (int i = 0; i < n; i++) {
        maxref = fmax(maxref, fabs(ref[i]));
        maxdiff = fmax(maxdiff, fabs((double)got[i] - ref[i]));
    }
    return maxdiff / (maxref > 0 ? maxref : 1);
}

static void check_model(const char *name)
{
    char rel[256];
    snprintf(rel, sizeof rel, "tests/data/%s", name);
    const char *dir = t_src(rel);
    char path[4096];
    snprintf(path, sizeof path, "%s/golden.json", dir);
    char *text = t_read_file(path, NULL);
    cJSON *g = cJSON_Parse(text);
    free(text);
    T_CHECK(g != NULL);
    if (!g)
        return;
    int32_t prompt[64], greedy[64];
    int P = read_ints(cJSON_GetObjectItem(g, "prompt_ids"), prompt, 64);
    int G = read_ints(cJSON_GetObjectItem(g, "greedy_ids"), greedy, 64);
    int rows = cJSON_GetObjectItem(g, "rows")->valueint;
    int vocab = cJSON_GetObjectItem(g, "vocab_size")->valueint;
    cJSON_Delete(g);
    T_CHECK(P <= 64 && G <= 64 && rows == P + G - 1);

    snprintf(path, sizeof path, "%s/logits.bin", dir);
    size_t len;
    float *ref = (float *)t_read_file(path, &len);
    T_CHECK(len == (size_t)rows * (size_t)vocab * sizeof(float));

    moec_model_t *m = NULL;
    moec_session_t *s = NULL;
    T_OK(moec_model_open(dir, &m));
    if (!m) {
        free(ref);
        return;
    }
    T_CHECK(moec_model_vocab_size(m) == vocab);
    T_OK(moec_session_init(m, dir, MOEC_BACKEND_CPU, rows + 1, &s));
    float *got = malloc((size_t)P * (size_t)vocab * sizeof *got);
    double worst = 0;
    int tokens_ok = 1;
    if (s && got && moec_session_forward(s, prompt, P, got) == MOEC_OK) {
        for (int r = 0; r < P; r++)
            worst = fmax(worst, row_error(got + (size_t)r * vocab, ref + (size_t)r * vocab, vocab));
        int32_t next = argmax(got + (size_t)(P - 1) * vocab, vocab);
        tokens_ok &= next == greedy[0];
        for (int k = 1; k < G; k++) {
            T_OK(moec_session_forward(s, &next, 1, got));
            const float *want = ref + (size_t)(P + k - 1) * vocab;
            double e = row_error(got, want, vocab);
            worst = fmax(worst, e);
            next = argmax(got, vocab);
            tokens_ok &= next == greedy[k];
        }
    } else {
        T_CHECK(!"prefill failed");
        fprintf(stderr, "%s: %s\n", name, moec_last_error());
    }
    printf("%-18s prompt %d, %d decode steps: max row error %.3g (limit 1e-4), tokens %s\n", name,
           P, G - 1, worst, tokens_ok ? "identical" : "DIFFER");
    T_CHECK(worst <= 1e-4);
    T_CHECK(tokens_ok);
    free(got);
    free(ref);
    moec_session_free(s);
    moec_model_free(m);
}

int main(void)
{
    for (size_t i = 0; i < sizeof MODELS / sizeof *MODELS; i++)
        check_model(MODELS[i]);
    return t_finish("test_golden");
}
