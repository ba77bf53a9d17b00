/* write_sample.c — writes a random-weight model in the Hugging Face layout
 * (config.json + model.safetensors) for any config moec reads, so that every
 * family can be run, tested and compared with `transformers` without
 * downloading a checkpoint. The tensor list comes from the model itself
 * (moec_model_tensor_info), so the file holds exactly what moec binds, under
 * the published names.
 *
 * Initialisation keeps activations of order one in tiny models: embeddings
 * N(0, 1); matrices N(0, 1/in_features); norm weights 1 + N(0, 0.1^2);
 * biases and DeepSeek-V3's e_score_correction_bias N(0, 0.1^2). */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "file.h"
#include "json.h"
#include "moec.h"

static const char *USAGE =
    "usage: moec-sample CONFIG_JSON OUT_DIR [--seed N] [--fast] [--force] [--fp8]\n"
    "\n"
    "Writes OUT_DIR/config.json (a copy of CONFIG_JSON) and OUT_DIR/model.safetensors\n"
    "with random weights for every tensor the model reads, in the dtype its config\n"
    "names (torch_dtype / dtype), the linears it quantizes (quantization_config) as\n"
    "F8_E4M3 with F32 block scales. Refuses to overwrite an existing model unless\n"
    "--force is given. Says the model's size first, and refuses when OUT_DIR's\n"
    "file system has less space free; both files are written under temporary\n"
    "names and renamed into place at the end, so a run that fails or is stopped\n"
    "leaves no partial model (and no OUT_DIR it created).\n"
    "\n"
    "options:\n"
    "  --seed N    random seed (default 1)\n"
    "  --fast      uniform instead of normal draws of the same mean and variance,\n"
    "              written by one thread per CPU (for benchmark-sized models)\n"
    "  --force     overwrite OUT_DIR/config.json and OUT_DIR/model.safetensors\n"
    "  --fp8       an fp8 block-scaled checkpoint: OUT_DIR/config.json gets the\n"
    "              quantization_config DeepSeek-V3 publishes (quant_method fp8, fmt\n"
    "              e4m3, activation_scheme dynamic, weight_block_size [128, 128])\n"
    "              unless CONFIG_JSON has one\n"
    "  -h, --help  this help\n";

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static float rng_normal(uint64_t *s)
{
    double u1 = ((double)(rng_next(s) >> 11) + 0.5) / 9007199254740992.0;
    double u2 = ((double)(rng_next(s) >> 11) + 0.5) / 9007199254740992.0;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

/* The mean and standard deviation of tensor t's elements. An fp8 linear's
 * codes are drawn N(0, 1) and its block scales 1/sqrt(in_features) give the
 * product the variance of an unquantized one (in_features taken as the
 * scale grid's columns times 128, the usual block). */
static void tensor_distribution(const moec_tensor_info *t, float *mean, float *std)
{
    *mean = 0.0f;
    *std = 1.0f;
    if (ends_with(t->name, "_scale_inv")) {
        *mean = 1.0f / sqrtf((float)t->shape[t->rank - 1] * 128.0f);
        *std = 0.25f * *mean;
    } else if (t->dtype == MOEC_DTYPE_F8_E4M3) {
        *std = 1.0f;
    } else if (ends_with(t->name, "norm.weight")) {
        *mean = 1.0f;
        *std = 0.1f;
    } else if (ends_with(t->name, ".bias") || ends_with(t->name, "e_score_correction_bias")) {
        *std = 0.1f;
    } else if (!strstr(t->name, "embed_tokens") && t->rank == 2) {
        *std = 1.0f / sqrtf((float)t->shape[1]);
    }
}

/* A standard normal draw, or with `fast` a uniform one of unit variance
 * (for benchmark-sized models, where the distribution does not matter and
 * Box-Muller would take minutes). */
static float draw(uint64_t *rng, int fast)
{
    if (!fast)
        return rng_normal(rng);
    return ((float)(rng_next(rng) >> 40) * (1.0f / 16777216.0f) - 0.5f) * 3.4641016f;
}

/* One element of tensor t: mean + std * draw, block scales kept positive. */
static float sample_value(const moec_tensor_info *t, float mean, float std, uint64_t *rng, int fast)
{
    float v = mean + std * draw(rng, fast);
    return ends_with(t->name, "_scale_inv") ? fabsf(v) : v;
}

static uint16_t f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even */
    return (uint16_t)(u >> 16);
}

static uint16_t f32_to_f16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000u;
    int exp = (int)((u >> 23) & 0xff) - 127 + 15;
    uint32_t mant = u & 0x7fffffu;
    if (exp >= 31)
        return (uint16_t)(sign | 0x7c00u);
    if (exp <= 0) {
        if (exp < -10)
            return (uint16_t)sign;
        mant |= 0x800000u;
        uint32_t shift = (uint32_t)(14 - exp);
        uint32_t h = mant >> shift;
        uint32_t rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (h & 1)))
            h++;
        return (uint16_t)(sign | h);
    }
    uint32_t h = ((uint32_t)exp << 10) | (mant >> 13);
    uint32_t rem = mant & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1)))
        h++;
    return (uint16_t)(sign | h);
}

static const char *st_dtype(moec_dtype dt)
{
    return dt == MOEC_DTYPE_F32    ? "F32"
           : dt == MOEC_DTYPE_F16  ? "F16"
           : dt == MOEC_DTYPE_BF16 ? "BF16"
                                   : "F8_E4M3";
}

static size_t elem_size(moec_dtype dt)
{
    return dt == MOEC_DTYPE_F32 ? 4 : dt == MOEC_DTYPE_F8_E4M3 ? 1 : 2;
}

/* Stores v as one element of dtype dt at p. */
static void put_elem(uint8_t *p, moec_dtype dt, float v)
{
    if (dt == MOEC_DTYPE_F32) {
        memcpy(p, &v, 4);
    } else if (dt == MOEC_DTYPE_F8_E4M3) {
        *p = moec_f32_to_f8e4m3(v);
    } else {
        uint16_t h = dt == MOEC_DTYPE_BF16 ? f32_to_bf16(v) : f32_to_f16(v);
        memcpy(p, &h, 2);
    }
}

static size_t numel(const moec_tensor_info *t)
{
    size_t n = 1;
    for (int d = 0; d < t->rank; d++)
        n *= (size_t)t->shape[d];
    return n;
}

/* Appends printf output to a growing buffer; returns -1 when out of memory. */
__attribute__((format(printf, 4, 5)))
static int buf_printf(char **buf, size_t *len, size_t *cap, const char *fmt, ...)
{
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(*buf + *len, *cap - *len, fmt, ap);
        va_end(ap);
        if (n < 0)
            return -1;
        if ((size_t)n < *cap - *len) {
            *len += (size_t)n;
            return 0;
        }
        size_t ncap = *cap * 2 + (size_t)n;
        char *g = realloc(*buf, ncap);
        if (!g)
            return -1;
        *buf = g;
        *cap = ncap;
    }
}

/* --fast: the tensors' bytes written by one thread per CPU (up to 16), in
 * units of FAST_UNIT elements, each unit drawn from its own generator
 * seeded by (seed, tensor, unit), so the file is the same whatever the
 * threads' order. */
enum { FAST_UNIT = 1 << 20, FAST_THREADS = 16 };

typedef struct fast_job {
    const moec_model_t *m;
    int fd;
    uint64_t seed;
    const size_t *tensor_off; /* file offset of each tensor's data */
    pthread_mutex_t lock;
    int tensor;               /* the next unit: tensor and element */
    size_t elem;
    int failed;
    double done, total, next_report;
} fast_job;

static void *fast_worker(void *arg)
{
    fast_job *j = arg;
    uint8_t *buf = malloc((size_t)FAST_UNIT * 4);
    if (!buf) {
        pthread_mutex_lock(&j->lock);
        j->failed = ENOMEM;
        pthread_mutex_unlock(&j->lock);
        return NULL;
    }
    int n = moec_model_tensor_count(j->m);
    for (;;) {
        pthread_mutex_lock(&j->lock);
        moec_tensor_info t;
        while (j->tensor < n && !j->failed) {
            moec_model_tensor_info(j->m, j->tensor, &t);
            if (j->elem < numel(&t))
                break;
            j->tensor++;
            j->elem = 0;
        }
        int ti = j->tensor;
        size_t k = j->elem;
        j->elem += FAST_UNIT;
        int stop = ti >= n || j->failed;
        pthread_mutex_unlock(&j->lock);
        if (stop)
            break;
        float mean, std;
        tensor_distribution(&t, &mean, &std);
        size_t count = numel(&t), es = elem_size(t.dtype);
        size_t part = count - k < FAST_UNIT ? count - k : FAST_UNIT;
        uint64_t rng = j->seed ^ ((uint64_t)ti * 0x9E3779B97F4A7C15ull) ^
                       ((uint64_t)(k / FAST_UNIT) * 0xC2B2AE3D27D4EB4Full);
        rng_next(&rng);
        for (size_t e = 0; e < part; e++)
            put_elem(buf + es * e, t.dtype, sample_value(&t, mean, std, &rng, 1));
        size_t bytes = part * es, put = 0;
        off_t at = (off_t)(j->tensor_off[ti] + k * es);
        while (put < bytes) {
            ssize_t w = pwrite(j->fd, buf + put, bytes - put, at + (off_t)put);
            if (w <= 0)
                break;
            put += (size_t)w;
        }
        pthread_mutex_lock(&j->lock);
        if (put < bytes && !j->failed)
            j->failed = errno ? errno : EIO;
        j->done += (double)bytes;
        if (j->done >= j->next_report) {
            fprintf(stderr, "moec-sample: %.1f of %.1f GB\n", j->done / 1e9, j->total / 1e9);
            j->next_report = j->done + 2e9;
        }
        pthread_mutex_unlock(&j->lock);
    }
    free(buf);
    return NULL;
}

/* Writes every tensor's data after the header (data_start bytes in). */
static int write_fast(const char *path, const moec_model_t *m, uint64_t seed, size_t data_start)
{
    int n = moec_model_tensor_count(m);
    size_t *off = malloc(((size_t)n + 1) * sizeof *off);
    if (!off)
        return ENOMEM;
    off[0] = data_start;
    double total = 0;
    for (int i = 0; i < n; i++) {
        moec_tensor_info t;
        moec_model_tensor_info(m, i, &t);
        off[i + 1] = off[i] + numel(&t) * elem_size(t.dtype);
        total += (double)(off[i + 1] - off[i]);
    }
    int fd = open(path, O_WRONLY);
    if (fd < 0) {
        int e = errno;
        free(off);
        return e;
    }
    fast_job j = {.m = m, .fd = fd, .seed = seed, .tensor_off = off,
                  .lock = PTHREAD_MUTEX_INITIALIZER, .total = total, .next_report = 2e9};
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int nt = cpus < 1 ? 1 : cpus > FAST_THREADS ? FAST_THREADS : (int)cpus;
    pthread_t th[FAST_THREADS];
    int started = 0;
    for (int i = 1; i < nt; i++)
        if (pthread_create(&th[started], NULL, fast_worker, &j) == 0)
            started++;
    fast_worker(&j);
    for (int i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    if (close(fd) != 0 && !j.failed)
        j.failed = errno;
    pthread_mutex_destroy(&j.lock);
    free(off);
    return j.failed;
}

/* The safetensors header of m's tensors (padded to 8 bytes), and the bytes
 * of their data; NULL when out of memory. */
static char *build_header(const moec_model_t *m, size_t *len_out, double *data_bytes)
{
    int n = moec_model_tensor_count(m);
    size_t cap = 4096, len = 0, offset = 0;
    char *hdr = malloc(cap);
    if (!hdr || buf_printf(&hdr, &len, &cap, "{\"__metadata__\":{\"format\":\"pt\"}"))
        goto oom;
    for (int i = 0; i < n; i++) {
        moec_tensor_info t;
        if (moec_model_tensor_info(m, i, &t) != MOEC_OK)
            goto oom;
        size_t bytes = numel(&t) * elem_size(t.dtype);
        if (buf_printf(&hdr, &len, &cap, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[", t.name,
                       st_dtype(t.dtype)))
            goto oom;
        for (int d = 0; d < t.rank; d++)
            if (buf_printf(&hdr, &len, &cap, d ? ",%lld" : "%lld", (long long)t.shape[d]))
                goto oom;
        if (buf_printf(&hdr, &len, &cap, "],\"data_offsets\":[%zu,%zu]}", offset, offset + bytes))
            goto oom;
        offset += bytes;
    }
    if (buf_printf(&hdr, &len, &cap, "}"))
        goto oom;
    while (len % 8)
        if (buf_printf(&hdr, &len, &cap, " "))
            goto oom;
    *len_out = len;
    *data_bytes = (double)offset;
    return hdr;
oom:
    free(hdr);
    return NULL;
}

/* Writes the header hdr[0, len) and every tensor's data to path. */
static int write_safetensors(const char *path, const moec_model_t *m, uint64_t seed, int fast,
                             const char *hdr, size_t len)
{
    int n = moec_model_tensor_count(m);
    FILE *f = fopen(path, "wb");
    if (!f) {
        fprintf(stderr, "moec-sample: cannot write %s: %s\n", path, strerror(errno));
        return 1;
    }
    uint8_t lenbuf[8];
    for (int b = 0; b < 8; b++)
        lenbuf[b] = (uint8_t)((uint64_t)len >> (8 * b));
    int ok = fwrite(lenbuf, 1, 8, f) == 8 && fwrite(hdr, 1, len, f) == len;
    if (fast) {
        int e = ok && fclose(f) == 0 ? 0 : EIO;
        if (!e)
            e = write_fast(path, m, seed, 8 + len);
        if (e) {
            fprintf(stderr, "moec-sample: cannot write %s: %s\n", path, strerror(e));
            return 1;
        }
        return 0;
    }
    uint64_t rng = seed;
    enum { CHUNK = 1 << 16 };
    static uint8_t chunk[CHUNK * 4];
    double total = 0, done = 0, next_report = 0;
    for (int i = 0; i < n; i++) {
        moec_tensor_info t;
        moec_model_tensor_info(m, i, &t);
        total += (double)numel(&t) * (double)elem_size(t.dtype);
    }
    for (int i = 0; ok && i < n; i++) {
        moec_tensor_info t;
        moec_model_tensor_info(m, i, &t);
        float mean, std;
        tensor_distribution(&t, &mean, &std);
        size_t count = numel(&t), es = elem_size(t.dtype);
        for (size_t k = 0; ok && k < count; k += CHUNK) {
            size_t part = count - k < CHUNK ? count - k : CHUNK;
            for (size_t j = 0; j < part; j++)
                put_elem(chunk + es * j, t.dtype, sample_value(&t, mean, std, &rng, fast));
            ok = fwrite(chunk, es, part, f) == part;
            done += (double)(part * es);
            if (total > 1e9 && done >= next_report) {
                fprintf(stderr, "moec-sample: %.1f of %.1f GB\n", done / 1e9, total / 1e9);
                next_report = done + 1e9;
            }
        }
    }
    if (fclose(f) != 0)
        ok = 0;
    if (!ok) {
        fprintf(stderr, "moec-sample: cannot write %s: %s\n", path, strerror(errno));
        return 1;
    }
    return 0;
}

static int copy_file(const char *from, const char *to)
{
    FILE *in = fopen(from, "rb");
    if (!in) {
        fprintf(stderr, "moec-sample: cannot read %s: %s\n", from, strerror(errno));
        return 1;
    }
    FILE *out = fopen(to, "wb");
    if (!out) {
        fprintf(stderr, "moec-sample: cannot write %s: %s\n", to, strerror(errno));
        fclose(in);
        return 1;
    }
    char buf[65536];
    size_t k;
    int ok = 1;
    while (ok && (k = fread(buf, 1, sizeof buf, in)) > 0)
        ok = fwrite(buf, 1, k, out) == k;
    ok = ok && !ferror(in);
    fclose(in);
    if (fclose(out) != 0 || !ok) {
        fprintf(stderr, "moec-sample: cannot write %s\n", to);
        return 1;
    }
    return 0;
}

/* The outputs and the temporary names they are written under, in the same
 * folder (a rename there is atomic): a run that fails or is killed never
 * leaves a partial model.safetensors or config.json. The temporary names
 * do not end in .safetensors, so no loader takes one for a shard. */
typedef struct out_paths {
    char dir[4096], cfg[4096], st[4096];
    char cfg_tmp[4200], st_tmp[4200];
    char fp8_cfg[4200]; /* --fp8: the quantized config under $TMPDIR, or "" */
    int created; /* dir was made by this run: removed with the rest on failure */
} out_paths;

static int out_paths_init(out_paths *o, const char *outdir)
{
    if (strlen(outdir) > sizeof o->cfg - 32) {
        fprintf(stderr, "moec-sample: the path %s is too long\n", outdir);
        return 1;
    }
    snprintf(o->dir, sizeof o->dir, "%s", outdir);
    o->fp8_cfg[0] = '\0';
    o->created = 0;
    snprintf(o->cfg, sizeof o->cfg, "%s/config.json", outdir);
    snprintf(o->st, sizeof o->st, "%s/model.safetensors", outdir);
    snprintf(o->cfg_tmp, sizeof o->cfg_tmp, "%s.tmp.%d", o->cfg, (int)getpid());
    snprintf(o->st_tmp, sizeof o->st_tmp, "%s.tmp.%d", o->st, (int)getpid());
    return 0;
}

/* The temporary files (--fp8's config under $TMPDIR among them, and the
 * folder this run made), removed by the handler of SIGINT, SIGTERM and
 * SIGHUP (unlink and rmdir are async-signal-safe). */
static const out_paths *volatile g_tmp;

static void remove_tmp_and_die(int sig)
{
    if (g_tmp) {
        unlink(g_tmp->st_tmp);
        unlink(g_tmp->cfg_tmp);
        if (g_tmp->fp8_cfg[0])
            unlink(g_tmp->fp8_cfg);
        if (g_tmp->created)
            rmdir(g_tmp->dir);
    }
    signal(sig, SIG_DFL);
    raise(sig);
}

/* The handler on (o) or off (NULL): moec_cleanup_on_signals. */
static void remove_tmp_on_signals(const out_paths *o)
{
    g_tmp = o;
    moec_cleanup_on_signals(o ? remove_tmp_and_die : NULL);
}

/* n bytes in the unit that suits them: "388.6 kB", "61.23 GB". */
static const char *fmt_bytes(double n, char *buf, size_t cap)
{
    if (n >= 1e12)
        snprintf(buf, cap, "%.2f TB", n / 1e12);
    else if (n >= 1e9)
        snprintf(buf, cap, "%.2f GB", n / 1e9);
    else if (n >= 1e6)
        snprintf(buf, cap, "%.1f MB", n / 1e6);
    else
        snprintf(buf, cap, "%.1f kB", n / 1e3);
    return buf;
}

/* Fails, naming dir, when dir's file system has less than `need` bytes
 * free for an unprivileged writer. */
static int check_free_space(const char *dir, double need)
{
    struct statvfs fs;
    if (statvfs(dir, &fs) != 0) {
        fprintf(stderr, "moec-sample: cannot query the free space of %s: %s\n", dir,
                strerror(errno));
        return 1;
    }
    double avail = (double)fs.f_bavail * (double)fs.f_frsize;
    if (avail < need) {
        char a[32], b[32];
        fprintf(stderr, "moec-sample: %s has %s free, but the model needs %s\n", dir,
                fmt_bytes(avail, a, sizeof a), fmt_bytes(need, b, sizeof b));
        return 1;
    }
    return 0;
}

/* The whole of a small text file, NUL-terminated (caller frees); NULL with
 * the reason printed. */
static char *read_text(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "moec-sample: cannot read %s: %s\n", path, strerror(errno));
        return NULL;
    }
    size_t len = 0, cap = 1 << 16;
    char *text = malloc(cap + 1);
    while (text) {
        len += fread(text + len, 1, cap - len, f);
        if (len < cap || cap >= (16u << 20))
            break;
        char *g = realloc(text, cap * 2 + 1);
        if (!g)
            free(text);
        text = g;
        cap *= 2;
    }
    int bad = !text || ferror(f) || len == cap;
    fclose(f);
    if (bad) {
        fprintf(stderr, "moec-sample: cannot read %s (or larger than 16 MiB)\n", path);
        free(text);
        return NULL;
    }
    text[len] = '\0';
    return text;
}

/* --fp8: CONFIG_JSON written to `to` with the quantization_config of
 * DeepSeek-V3's published checkpoints added, unless it has one already.
 * `from` may be `to`: it is read whole first. */
static int write_fp8_config(const char *from, const char *to)
{
    char *text = read_text(from);
    if (!text)
        return 1;
    /* the config's own text kept (moec_json_object_append): transformers
     * must load the checkpoint too */
    cJSON *root = cJSON_Parse(text);
    int has = cJSON_GetObjectItemCaseSensitive(root, "quantization_config") != NULL;
    cJSON_Delete(root);
    char *out = NULL;
    moec_status st = has ? MOEC_OK
                         : moec_json_object_append(
                               text, strlen(text),
                               "\"quantization_config\": {\"quant_method\": \"fp8\", \"fmt\": "
                               "\"e4m3\", \"activation_scheme\": \"dynamic\", "
                               "\"weight_block_size\": [128, 128]}",
                               from, &out);
    if (has)
        out = text;
    else
        free(text);
    if (st != MOEC_OK) {
        fprintf(stderr, "moec-sample: %s\n", moec_last_error_message());
        return 1;
    }
    int ok = 1;
    FILE *f = out ? fopen(to, "wb") : NULL;
    if (f) {
        size_t n = strlen(out);
        ok = fwrite(out, 1, n, f) == n;
        ok = fclose(f) == 0 && ok;
    }
    free(out);
    if (!f || !ok) {
        fprintf(stderr, "moec-sample: cannot write %s\n", to);
        return 1;
    }
    return 0;
}

/* Writes the model's safetensors and the config copy under their temporary
 * names, then renames both into place; on any failure removes them. */
static int write_model(const out_paths *o, const char *config, const moec_model_t *m,
                       uint64_t seed, int fast)
{
    size_t len;
    double data;
    char *hdr = build_header(m, &len, &data);
    if (!hdr) {
        fprintf(stderr, "moec-sample: out of memory\n");
        return 1;
    }
    double total = 8.0 + (double)len + data;
    char size[32];
    remove_tmp_on_signals(o); /* before anything is said or written */
    fprintf(stderr, "moec-sample: writing %d tensors, %s, to %s\n", moec_model_tensor_count(m),
            fmt_bytes(total, size, sizeof size), o->st);
    /* copying a file onto itself would empty it */
    struct stat a, b;
    int have_a = stat(config, &a) == 0;
    int same = have_a && stat(o->cfg, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino;
    int rc = check_free_space(o->dir, total + (have_a && !same ? (double)a.st_size : 0));
    if (rc == 0) {
        rc = write_safetensors(o->st_tmp, m, seed, fast, hdr, len);
        if (rc == 0 && !same)
            rc = copy_file(config, o->cfg_tmp);
        /* the config first: a folder with a config but no model.safetensors
         * is a config folder, never a model with the wrong config */
        if (rc == 0 && !same && rename(o->cfg_tmp, o->cfg) != 0) {
            fprintf(stderr, "moec-sample: cannot rename %s to %s: %s\n", o->cfg_tmp, o->cfg,
                    strerror(errno));
            rc = 1;
        }
        if (rc == 0 && rename(o->st_tmp, o->st) != 0) {
            fprintf(stderr, "moec-sample: cannot rename %s to %s: %s\n", o->st_tmp, o->st,
                    strerror(errno));
            rc = 1;
        }
        if (rc != 0) {
            unlink(o->st_tmp);
            unlink(o->cfg_tmp);
        }
    }
    remove_tmp_on_signals(NULL);
    free(hdr);
    if (rc == 0)
        fprintf(stderr, "moec-sample: wrote %d tensors to %s\n", moec_model_tensor_count(m),
                o->st);
    return rc;
}

int main(int argc, char **argv)
{
    const char *config = NULL, *outdir = NULL;
    unsigned long long seed = 1;
    int force = 0, fast = 0, fp8 = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            fputs(USAGE, stdout);
            return 0;
        } else if (!strcmp(argv[i], "--force")) {
            force = 1;
        } else if (!strcmp(argv[i], "--fast")) {
            fast = 1;
        } else if (!strcmp(argv[i], "--fp8")) {
            fp8 = 1;
        } else if (!strcmp(argv[i], "--seed")) {
            /* strtoull alone takes "" for 0, and "-1" or a number past 2^64 - 1
             * for another seed than the one written */
            char *end;
            if (++i == argc) {
                fprintf(stderr, "moec-sample: --seed needs a value\n\n%s", USAGE);
                return 2;
            }
            errno = 0;
            if (!isdigit((unsigned char)argv[i][0]) ||
                (seed = strtoull(argv[i], &end, 10), errno || *end)) {
                fprintf(stderr, "moec-sample: --seed: '%s' is not an integer from 0 to %llu\n\n%s",
                        argv[i], ULLONG_MAX, USAGE);
                return 2;
            }
        } else if (argv[i][0] == '-') {
            fprintf(stderr, "moec-sample: unknown option %s\n\n%s", argv[i], USAGE);
            return 2;
        } else if (!config) {
            config = argv[i];
        } else if (!outdir) {
            outdir = argv[i];
        } else {
            fprintf(stderr, "moec-sample: unexpected argument %s\n\n%s", argv[i], USAGE);
            return 2;
        }
    }
    if (!config || !outdir) {
        fputs(USAGE, stderr);
        return 2;
    }
    /* The config is read (and every error names it) before anything is
     * created; with --fp8 the model is then the one its quantized copy (a
     * temporary file, copied to OUT_DIR/config.json) describes. */
    char fp8_cfg[4200] = "";
    if (fp8) {
        moec_model_t *plain;
        moec_status pst = moec_model_open_config(config, &plain);
        if (pst != MOEC_OK) {
            fprintf(stderr, "moec-sample: %s: %s\n", moec_status_name(pst), moec_last_error());
            return 1;
        }
        moec_model_free(plain);
        const char *tmp = getenv("TMPDIR");
        snprintf(fp8_cfg, sizeof fp8_cfg, "%s/moec-sample-fp8-%d.json", tmp && *tmp ? tmp : "/tmp",
                 (int)getpid());
        if (write_fp8_config(config, fp8_cfg))
            return 1;
        config = fp8_cfg;
    }
    moec_model_t *m;
    moec_status st = moec_model_open_config(config, &m);
    if (st != MOEC_OK) {
        fprintf(stderr, "moec-sample: %s: %s\n", moec_status_name(st), moec_last_error());
        if (fp8_cfg[0])
            unlink(fp8_cfg);
        return 1;
    }
    out_paths o;
    int rc = out_paths_init(&o, outdir);
    snprintf(o.fp8_cfg, sizeof o.fp8_cfg, "%s", fp8_cfg);
    if (rc == 0 && !force && access(o.st, F_OK) == 0) {
        fprintf(stderr, "moec-sample: %s exists (use --force to overwrite)\n", o.st);
        rc = 1;
    }
    if (rc == 0) {
        o.created = mkdir(outdir, 0755) == 0;
        struct stat sb; /* else the error would name a temporary file in it */
        if (!o.created && errno != EEXIST) {
            fprintf(stderr, "moec-sample: cannot create %s: %s\n", outdir, strerror(errno));
            rc = 1;
        } else if (!o.created && (stat(outdir, &sb) != 0 || !S_ISDIR(sb.st_mode))) {
            fprintf(stderr, "moec-sample: OUT_DIR %s is not a directory\n", outdir);
            rc = 1;
        }
    }
    if (rc == 0)
        rc = write_model(&o, config, m, seed, fast);
    if (rc != 0 && o.created)
        rmdir(outdir);
    moec_model_free(m);
    if (fp8_cfg[0])
        unlink(fp8_cfg);
    return rc;
}
