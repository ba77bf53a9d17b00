/* test_quantize.c — `moec compile --quantize fp8` on the CPU
 * (moec_quantize_fp8): the e4m3 rounding against a brute-force search over
 * every code; the tiny bf16 models quantized: the folder opens as an fp8
 * model, every tensor the frontend quantizes is F8_E4M3 with F32 scales of
 * amax / 448 per 128 x 128 block (edge blocks partial), each code the one
 * nearest to w / scale and the dequantized weight within half an e4m3 step,
 * every other tensor copied bit for bit, and the model's greedy tokens and
 * logits near the source's; a block of zeros gets scale 1; bad input (a
 * model quantized already, an existing folder, a NaN weight, a quantize
 * other than fp8) is refused by name and leaves nothing behind. */
#include <math.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "compiler/frontend.h"
#include "file.h"
#include "runtime/weights.h"
#include "testlib.h"

/* The code of the e4m3 value nearest to f by searching every finite code,
 * ties to the even code (the one whose mantissa is even), saturating. */
static uint8_t brute_e4m3(float f)
{
    if (isnan(f))
        return 0x7f;
    uint8_t sign = signbit(f) ? 0x80 : 0;
    double a = fabs((double)f), best_d = INFINITY;
    int best = 0;
    for (int c = 0; c <= 0x7e; c++) {
        double d = fabs((double)rt_f8e4m3_to_f32((uint8_t)c) - a);
        if (d < best_d || (d == best_d && c % 2 == 0)) {
            best_d = d;
            best = c;
        }
    }
    return sign | (uint8_t)best;
}

static void test_rounding(void)
{
    uint64_t rng = 42;
    int bad = 0;
    float edge[] = {0.0f,   -0.0f,    448.0f,   464.0f,    463.99f, 465.0f, 1e30f,  -1e30f,
                    INFINITY, -INFINITY, 0x1p-6f, 0x1p-7f, 0x1p-10f, 0x1.8p-10f, 0x1p-9f,
                    0x1.8p-9f, 1.0625f, 1.1875f, 3.0f, 0.00048828125f, 240.0f, 248.0f};
    for (size_t i = 0; i < sizeof edge / sizeof *edge; i++)
        if (moec_f32_to_f8e4m3(edge[i]) != brute_e4m3(edge[i]) && bad++ < 5)
            fprintf(stderr, "e4m3 of %a: 0x%02x, want 0x%02x\n", (double)edge[i],
                    moec_f32_to_f8e4m3(edge[i]), brute_e4m3(edge[i]));
    /* every code's value and the midpoints between neighbours (the ties) */
    for (int c = 0; c < 0x7e; c++) {
        float lo = rt_f8e4m3_to_f32((uint8_t)c), hi = rt_f8e4m3_to_f32((uint8_t)(c + 1));
        float mids[3] = {lo, (lo + hi) / 2, -(lo + hi) / 2};
        for (int k = 0; k < 3; k++)
            if (moec_f32_to_f8e4m3(mids[k]) != brute_e4m3(mids[k]) && bad++ < 5)
                fprintf(stderr, "e4m3 of %a: 0x%02x, want 0x%02x\n", (double)mids[k],
                        moec_f32_to_f8e4m3(mids[k]), brute_e4m3(mids[k]));
    }
    for (int i = 0; i < 100000; i++) {
        float f = ldexpf((float)(t_rand_u64(&rng) >> 40) / 16777216.0f - 0.5f,
                         (int)(t_rand_u64(&rng) % 24) - 12);
        if (moec_f32_to_f8e4m3(f) != brute_e4m3(f) && bad++ < 5)
            fprintf(stderr, "e4m3 of %a: 0x%02x, want 0x%02x\n", (double)f,
                    moec_f32_to_f8e4m3(f), brute_e4m3(f));
    }
    T_CHECK(bad == 0);
    T_CHECK(moec_f32_to_f8e4m3(NAN) == 0x7f && moec_f32_to_f8e4m3(1.0f) == 0x38 &&
            moec_f32_to_f8e4m3(-448.0f) == 0xfe && moec_f32_to_f8e4m3(1000.0f) == 0x7e);
}

/* Copies src's config.json and every tensor of its model.safetensors into
 * dst, with `edit` (when not NULL) applied to the F32 widening of BF16
 * tensor `name` (edits that bf16 holds exactly: zeros, NaN). */
static void copy_model(const char *src, const char *dst, const char *name,
                       void (*edit)(float *w, int64_t rows, int64_t cols))
{
    char path[8192];
    snprintf(path, sizeof path, "%s/config.json", src);
    size_t len;
    char *cfg = t_read_file(path, &len);
    snprintf(path, sizeof path, "%s/config.json", dst);
    t_write_file(path, cfg, len);
    free(cfg);
    rt_safetensors *st = NULL;
    snprintf(path, sizeof path, "%s/model.safetensors", src);
    T_OK(rt_safetensors_open_file(path, &st));
    if (!st)
        return;
    int n = rt_safetensors_count(st);
    rt_st_write_tensor *w = calloc((size_t)n, sizeof *w);
    float *edited = NULL;
    for (int i = 0; i < n; i++) {
        const rt_st_tensor *t = rt_safetensors_at(st, i);
        w[i] = (rt_st_write_tensor){t->name, t->dtype, t->rank, t->shape, t->data};
        if (name && !strcmp(t->name, name)) {
            edited = malloc(t->nbytes / rt_st_dtype_size(t->dtype) * sizeof *edited);
            T_OK(rt_tensor_read_f32(t, edited));
            edit(edited, t->shape[0], t->shape[1]);
            T_CHECK(t->dtype == RT_ST_BF16);
            uint16_t *bf = (uint16_t *)edited; /* in place: bf16 is the top half of f32 */
            for (size_t k = 0; k < t->nbytes / 2; k++) {
                uint32_t u;
                memcpy(&u, &edited[k], 4);
                bf[k] = (uint16_t)(u >> 16);
            }
            w[i].data = edited;
        }
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dst);
    T_OK(rt_safetensors_write(path, w, n));
    free(edited);
    free(w);
    rt_safetensors_free(st);
}

/* The quantized tensor `name` of q against the source tensor of s: scales,
 * codes, and the dequantized error; the number of blocks of zeros. */
static int check_tensor(const rt_safetensors *q, const rt_safetensors *s, const char *name,
                        int *bad)
{
    const rt_st_tensor *src = rt_safetensors_find(s, name), *c = rt_safetensors_find(q, name);
    char sname[600];
    snprintf(sname, sizeof sname, "%s_scale_inv", name);
    const rt_st_tensor *sc = rt_safetensors_find(q, sname);
    int64_t rows = src ? src->shape[0] : 0, cols = src ? src->shape[1] : 0;
    int64_t sr = (rows + 127) / 128, scn = (cols + 127) / 128;
    if (!src || !c || !sc || c->dtype != RT_ST_F8_E4M3 || sc->dtype != RT_ST_F32 ||
        c->rank != 2 || c->shape[0] != rows || c->shape[1] != cols || sc->rank != 2 ||
        sc->shape[0] != sr || sc->shape[1] != scn) {
        fprintf(stderr, "quantized '%s' or its scales are missing or misshaped\n", name);
        (*bad)++;
        return 0;
    }
    float *w = malloc((size_t)(rows * cols) * sizeof *w);
    T_OK(rt_tensor_read_f32(src, w));
    const uint8_t *codes = c->data;
    const float *scales = sc->data;
    int zero_blocks = 0;
    for (int64_t bi = 0; bi < sr; bi++)
        for (int64_t bj = 0; bj < scn; bj++) {
            float amax = 0.0f;
            for (int64_t r = bi * 128; r < rows && r < (bi + 1) * 128; r++)
                for (int64_t k = bj * 128; k < cols && k < (bj + 1) * 128; k++)
                    amax = fmaxf(amax, fabsf(w[r * cols + k]));
            float sv = scales[bi * scn + bj];
            zero_blocks += amax == 0.0f;
            if (sv != (amax > 0.0f ? amax / 448.0f : 1.0f) && (*bad)++ < 5)
                fprintf(stderr, "'%s' block [%lld, %lld]: scale %g, amax %g\n", name,
                        (long long)bi, (long long)bj, (double)sv, (double)amax);
            for (int64_t r = bi * 128; r < rows && r < (bi + 1) * 128; r++)
                for (int64_t k = bj * 128; k < cols && k < (bj + 1) * 128; k++) {
                    float x = w[r * cols + k];
                    uint8_t code = codes[r * cols + k];
                    /* within half a step of e4m3 (relative 2^-4, or 2^-10 of the
                       scale among the subnormals) */
                    double err = fabs((double)rt_f8e4m3_to_f32(code) * sv - x);
                    double lim = fmax(fabs((double)x) * 0x1p-4, (double)sv * 0x1p-10) * 1.0001;
                    if ((code != brute_e4m3(x / sv) || err > lim) && (*bad)++ < 5)
                        fprintf(stderr, "'%s' [%lld, %lld]: %g became code 0x%02x (x %g)\n",
                                name, (long long)r, (long long)k, (double)x, code, (double)sv);
                }
        }
    free(w);
    return zero_blocks;
}

/* Quantizes the model in src into a new folder; checks the folder against
 * src tensor by tensor and their outputs; returns the blocks of zeros seen. */
static int check_quantized(const char *model_name, const char *src)
{
    char qdir[4200];
    snprintf(qdir, sizeof qdir, "%s/q", t_tmpdir("quantize"));
    moec_model_t *m = NULL, *qm = NULL;
    T_OK(moec_model_open(src, &m));
    if (!m)
        return 0;
    moec_quantize_stats stats = {0};
    T_OK(moec_quantize_fp8(m, src, qdir, &stats));
    T_OK(moec_model_open(qdir, &qm));
    rt_safetensors *q = NULL, *s = NULL;
    char path[8400];
    /* the config is the source's text and the quantization_config, not
     * printed again (cJSON would write attention_dropout 0.0 as 0, which
     * transformers refuses for a float field) */
    char *ca = NULL, *cb = NULL;
    size_t na = 0, nb = 0;
    snprintf(path, sizeof path, "%s/config.json", src);
    T_OK(moec_file_read(path, MOEC_FILE_CONFIG_MAX, &ca, &na));
    snprintf(path, sizeof path, "%s/config.json", qdir);
    T_OK(moec_file_read(path, MOEC_FILE_CONFIG_MAX, &cb, &nb));
    const char *close = ca ? strrchr(ca, '}') : NULL;
    T_CHECK(close && cb && nb > (size_t)(close - ca) &&
            !memcmp(ca, cb, (size_t)(close - ca - 1)) &&
            strstr(cb, "\n  \"quantization_config\": {\"quant_method\": \"fp8\", \"fmt\": "
                      "\"e4m3\", \"activation_scheme\": \"dynamic\", \"weight_block_size\": "
                      "[128, 128]}\n}\n"));
    T_CHECK(strstr(ca, "\"attention_dropout\": 0.0") == NULL ||
            strstr(cb, "\"attention_dropout\": 0.0") != NULL);
    free(ca);
    free(cb);
    snprintf(path, sizeof path, "%s/model-00001.safetensors", qdir);
    T_OK(rt_safetensors_open_file(path, &q));
    T_OK(rt_safetensors_open_dir(src, &s));
    int bad = 0, quantized = 0, copied = 0, zeros = 0;
    for (int i = 0; qm && q && s && i < moec_model_tensor_count(qm); i++) {
        moec_tensor_info ti;
        T_OK(moec_model_tensor_info(qm, i, &ti));
        if (ti.dtype == MOEC_DTYPE_F8_E4M3) {
            quantized++;
            zeros += check_tensor(q, s, ti.name, &bad);
        } else if (!strstr(ti.name, "_scale_inv")) {
            const rt_st_tensor *a = rt_safetensors_find(s, ti.name),
                               *b = rt_safetensors_find(q, ti.name);
            int same = a && b && a->dtype == b->dtype && a->nbytes == b->nbytes &&
                       !memcmp(a->data, b->data, a->nbytes);
            if (!same && bad++ < 5)
                fprintf(stderr, "'%s' was not copied as it is\n", ti.name);
            copied++;
        }
    }
    T_CHECK(bad == 0);
    T_CHECK(quantized > 10 && stats.quantized == quantized && stats.copied == copied &&
            stats.shards == 1 && q && rt_safetensors_count(q) == 2 * quantized + copied);
    /* the fp8 model reads as one and runs near its source */
    const int32_t prompt[6] = {0, 64, 128, 7, 19, 222};
    float *a = malloc(6 * 256 * sizeof *a), *b = malloc(6 * 256 * sizeof *b);
    moec_session_t *sa = NULL, *sb = NULL;
    T_OK(moec_session_init(m, src, MOEC_BACKEND_CPU, 8, &sa));
    if (qm)
        T_OK(moec_session_init(qm, qdir, MOEC_BACKEND_CPU, 8, &sb));
    if (sa && sb) {
        T_OK(moec_session_forward(sa, prompt, 6, a));
        T_OK(moec_session_forward(sb, prompt, 6, b));
        double worst = 0;
        for (int r = 0; r < 6; r++)
            worst = fmax(worst, t_row_error(a + r * 256, b + r * 256, 256));
        printf("%-12s quantized: %d tensors fp8, %d copied; logits within %.3g of the source's "
               "(row max)\n",
               model_name, quantized, copied, worst);
        T_CHECK(worst < 0.5 && t_all_finite(b, 6 * 256));
    }
    moec_session_free(sa);
    moec_session_free(sb);
    free(a);
    free(b);
    rt_safetensors_free(q);
    rt_safetensors_free(s);
    moec_model_free(m);
    moec_model_free(qm);
    return zeros;
}

/* A block of zeros, and a NaN. */
static void zero_block(float *w, int64_t rows, int64_t cols)
{
    for (int64_t r = 0; r < rows && r < 128; r++)
        for (int64_t k = 0; k < cols && k < 128; k++)
            w[r * cols + k] = 0.0f;
}

static void one_nan(float *w, int64_t rows, int64_t cols)
{
    (void)rows;
    w[cols + 3] = NAN;
}

static int exists(const char *p)
{
    struct stat sb;
    return stat(p, &sb) == 0;
}

static void test_errors(void)
{
    const char *d = t_tmpdir("quantize-bad");
    char nan_dir[4200], out[4200], tmp[4300];
    snprintf(nan_dir, sizeof nan_dir, "%s/nan", d);
    T_CHECK(mkdir(nan_dir, 0755) == 0);
    copy_model(t_src("tests/data/qwen3_moe"), nan_dir, "model.layers.0.self_attn.o_proj.weight",
               one_nan);
    moec_model_t *m = NULL;
    T_OK(moec_model_open(nan_dir, &m));
    snprintf(out, sizeof out, "%s/out", d);
    if (m)
        T_ERR(moec_quantize_fp8(m, nan_dir, out, NULL), MOEC_ERR_MISMATCH,
              "tensor 'model.layers.0.self_attn.o_proj.weight' in");
    if (m)
        T_ERR(moec_quantize_fp8(m, nan_dir, out, NULL), MOEC_ERR_MISMATCH,
              "holds nan at element 99 ([1, 3]): it cannot be quantized");
    snprintf(tmp, sizeof tmp, "%s.tmp%ld", out, (long)getpid());
    T_CHECK(!exists(out) && !exists(tmp));
    /* the folder exists */
    if (m)
        T_ERR(moec_quantize_fp8(m, nan_dir, nan_dir, NULL), MOEC_ERR_IO, "/nan: it exists");
    snprintf(out, sizeof out, "%s/no/such/out", d);
    if (m)
        T_ERR(moec_quantize_fp8(m, nan_dir, out, NULL), MOEC_ERR_IO, "is not a writable folder");
    /* compile's quantize option */
    moec_compile_options o = {0};
    o.quantize = "int4";
    snprintf(out, sizeof out, "%s/x.moec", d);
    if (m)
        T_ERR(moec_compile(m, nan_dir, &o, out), MOEC_ERR_INVALID_ARG,
              "quantize 'int4' is not supported: moec writes block-scaled fp8 (fp8)");
    o.quantize = "fp8";
    if (m)
        T_ERR(moec_compile(m, nan_dir, &o, out), MOEC_ERR_INVALID_ARG,
              "quantize fp8 needs quantized_dir");
    moec_model_free(m);
    /* a model quantized already */
    m = NULL;
    const char *f8 = t_src("tests/data/deepseek_v3_fp8");
    T_OK(moec_model_open(f8, &m));
    snprintf(out, sizeof out, "%s/again", d);
    if (m)
        T_ERR(moec_quantize_fp8(m, f8, out, NULL), MOEC_ERR_INVALID_ARG,
              "is quantized already (its config.json has a quantization_config): nothing to "
              "quantize");
    T_CHECK(!exists(out));
    moec_model_free(m);
}

int main(void)
{
    test_rounding();
    check_quantized("deepseek_v3", t_src("tests/data/deepseek_v3"));
    check_quantized("qwen3_moe", t_src("tests/data/qwen3_moe"));
    /* a block of zeros: scale 1, codes 0 */
    char zdir[4200];
    snprintf(zdir, sizeof zdir, "%s/z", t_tmpdir("quantize-zero"));
    T_CHECK(mkdir(zdir, 0755) == 0);
    copy_model(t_src("tests/data/deepseek_v3"), zdir, "model.layers.0.self_attn.o_proj.weight",
               zero_block);
    T_CHECK(check_quantized("zero block", zdir) == 1);
    test_errors();
    return t_finish("test_quantize");
}
