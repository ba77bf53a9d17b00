/* test_codegen.c — the CUDA code generator on a machine without a GPU: the
 * launch steps each emitter records (kernel names, grid and block, argument
 * order, the cuBLASLt GEMM shapes, which an emulation of cuBLASLt's
 * column-major reading checks against the ops' formulas), reshape, fork
 * and join launching nothing once plan_memory aliases them, the NVRTC cache
 * (hit, corrupt entry, compile errors with the numbered source), and the CI
 * compile check of issue 4: every bucket of the five tiny models and the
 * layer shapes of DeepSeek-V2-Lite, DeepSeek-V3 and Qwen3-30B-A3B (quantized
 * to fp8 too) generates,
 * and every kernel form of each compiles for sm_90 with NVRTC (through
 * cg_plan_build of the buckets that hold them all: see "kernel forms"),
 * into a fresh cache so that CI really compiles. Ops whose emitter is still
 * a placeholder ("not implemented yet") are counted and reported rather
 * than failed. */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <math.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "codegen/cg.h"
#include "compiler/frontend.h"
#include "compiler/passes.h"
#include "testlib.h"

static char g_cache[4096]; /* t_tmpdir's buffer is reused: keep a copy */
static int g_missing;      /* ops whose emitter has not landed yet */

#ifdef MOEC_HAVE_CUDA
enum { HAVE_NVRTC = 1 };
#else
enum { HAVE_NVRTC = 0 };
#endif

/* ---- helpers ------------------------------------------------------------------ */

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* A placeholder emitter of someone else's op. */
static int not_yet(moec_status st)
{
    return st == MOEC_ERR_UNSUPPORTED && strstr(moec_last_error(), "not implemented yet");
}

static void ctx_init(cg_ctx *c, const ir_module *m, const cg_options *o, int T)
{
    memset(c, 0, sizeof *c);
    c->m = m;
    c->opt = o;
    c->T = T;
    cg_emit_prologue(&c->src);
}

/* Every activation its own 16-byte aligned slot (for modules that did not
 * go through plan_memory). */
static void plan_trivially(ir_module *m)
{
    int64_t off = 0;
    for (int i = 0; i < m->n_values; i++) {
        ir_value *v = m->values[i];
        if (v->kind == IR_VALUE_WEIGHT)
            continue;
        v->mem_offset = off;
        off += (ir_type_numel(&v->type, 1) * 4 + 15) / 16 * 16;
    }
    T_OK(ir_module_set_meta_int(m, "arena_bytes_per_token", off));
}

/* The steps of op `id` in c (first at *first). */
static int steps_of(const cg_ctx *c, int id, int *first)
{
    int n = 0;
    *first = -1;
    for (int i = 0; i < c->n_steps; i++)
        if (c->steps[i].op_id == id) {
            if (*first < 0)
                *first = i;
            n++;
        }
    return n;
}

/* Compiles src for sm_90 and checks a cubin came back. */
static void compile_src(const char *src, const char *what)
{
    void *cubin = NULL;
    size_t n = 0;
    moec_status st = cg_compile(src, "sm_90", g_cache, &cubin, &n);
    if (!HAVE_NVRTC) {
        T_ERR(st, MOEC_ERR_UNSUPPORTED, "without NVRTC");
        return;
    }
    if (st != MOEC_OK)
        fprintf(stderr, "compiling %s failed\n", what);
    T_OK(st);
    T_CHECK(st != MOEC_OK || (n > 4 && !memcmp(cubin, "\177ELF", 4)));
    free(cubin);
}

/* Checks what the runtime relies on in every step. */
static void check_steps(const cg_ctx *c)
{
    int bad = 0;
    for (int i = 0; i < c->n_steps; i++) {
        const ir_step *s = &c->steps[i];
        if (s->stream < 0 || s->stream > 1 || s->n_args < 0 || s->n_args > IR_MAX_ARGS)
            bad++;
        if (s->kind == IR_STEP_KERNEL) {
            unsigned threads = s->block[0] * s->block[1] * s->block[2];
            if (s->kernel < 0 || s->kernel >= c->n_kernels || threads == 0 || threads > 1024 ||
                threads % 32 || s->grid[0] == 0 || s->grid[1] == 0 || s->grid[2] == 0)
                bad++;
        }
        const ir_arg *args = s->kind == IR_STEP_GEMM ? &s->gemm.a : s->args;
        int n = s->kind == IR_STEP_GEMM ? 3 : s->n_args;
        for (int a = 0; a < n; a++)
            if ((args[a].kind == IR_ARG_ACT || args[a].kind == IR_ARG_WEIGHT) &&
                (args[a].index < 0 || args[a].index >= c->m->n_values ||
                 (args[a].kind == IR_ARG_ACT) !=
                     (c->m->values[args[a].index]->kind == IR_VALUE_OP)))
                bad++;
        if (s->kind == IR_STEP_GEMM &&
            (s->gemm.m < 1 || s->gemm.n != c->T || s->gemm.k < 1 || s->gemm.batch < 1))
            bad++;
    }
    if (bad)
        fprintf(stderr, "%d malformed steps in bucket T=%d of %s\n", bad, c->T, c->m->name);
    T_CHECK(bad == 0);
}

/* Generates bucket T of m op by op into c (as cg_plan_build does, but going
 * past placeholder emitters) and checks its steps; 1 when it generated. */
static int generate(const ir_module *m, const cg_options *o, int T, cg_ctx *c)
{
    ctx_init(c, m, o, T);
    int ok = 1;
    for (int k = 0; k < m->n_ops && ok; k++) {
        /* each op's scratch in its stream's region, as cg_plan_build */
        c->stream = m->ops[k]->stream;
        c->scratch_cur[0] = c->scratch_cur[1] = 0;
        moec_status st = cg_emit_op(c, m->ops[k]);
        if (st != MOEC_OK && not_yet(st))
            g_missing++;
        else if (st != MOEC_OK) {
            fprintf(stderr, "%s T=%d: %s\n", m->name, T, moec_last_error());
            ok = 0;
        }
    }
    c->stream = 0;
    c->scratch_cur[0] = 0;
    moec_status st = cg_emit_argmax(c, m->outputs[0]);
    if (st != MOEC_OK && not_yet(st))
        g_missing++;
    else if (st != MOEC_OK) {
        fprintf(stderr, "%s T=%d argmax: %s\n", m->name, T, moec_last_error());
        ok = 0;
    }
    cg_place_forks(c);
    T_CHECK(ok && !c->src.oom);
    if (ok)
        check_steps(c);
    return ok && !c->src.oom;
}

/* generate() under the default options; c freed where it did not generate */
static int generate_default(const ir_module *m, int T, cg_ctx *c)
{
    cg_options o;
    cg_options_default(&o);
    if (generate(m, &o, T, c))
        return 1;
    cg_ctx_free(c);
    return 0;
}

/* ---- kernel forms ------------------------------------------------------------ */

/* NVRTC takes one to a few seconds per bucket program, and the buckets of a
 * model are mostly the same kernels with other numbers baked in (T, rows per
 * expert block, attention splits): compiling all seven buckets of eight
 * models took two minutes of CI. So every bucket is generated and its steps
 * checked, but only enough buckets are compiled that every kernel *form*
 * compiles at least once. A form is a kernel's source, from its
 * `extern "C" __global__` to the next one, with each run of digits read as
 * one '#'. Two kernels of one form are the same code with other constants,
 * which NVRTC checks alike (the kernels are not templates, so both sides of
 * an `if constexpr (NSPLIT > 1)` are type-checked whatever NSPLIT is); a
 * different emitter path (GEMV or not, CUDA-core or tensor-core experts,
 * split or unsplit attention) is a different form. What a constant alone
 * could break is a size limit or a helper template's instantiation (ldv<VE>
 * with another vector width, which comes from the model's dims, not T): the
 * smallest and the largest bucket, with the largest constants, always
 * compile, and on the GPU machine gpu_model and gpu_engine compile and run
 * every default bucket. */
enum { MAX_FORMS = 128 };

typedef struct form_set {
    int n;
    char *f[MAX_FORMS];
} form_set;

static int form_set_has(const form_set *s, const char *f)
{
    for (int i = 0; i < s->n; i++)
        if (!strcmp(s->f[i], f))
            return 1;
    return 0;
}

/* The text p[0, len) with digit runs as '#' (malloc'd). */
static char *form_of(const char *p, size_t len)
{
    char *f = malloc(len + 1);
    size_t k = 0;
    for (size_t i = 0; f && i < len; i++)
        if (p[i] < '0' || p[i] > '9')
            f[k++] = p[i];
        else if (!k || f[k - 1] != '#')
            f[k++] = '#';
    if (f)
        f[k] = '\0';
    return f;
}

/* Adds the forms of the kernels in src to s. */
static void add_forms(form_set *s, const char *src)
{
    static const char KERNEL[] = "extern \"C\" __global__";
    int ok = 1;
    for (const char *p = strstr(src, KERNEL), *q; p; p = q) {
        q = strstr(p + 1, KERNEL);
        char *f = form_of(p, q ? (size_t)(q - p) : strlen(p));
        ok = ok && f && s->n < MAX_FORMS;
        if (f && s->n < MAX_FORMS && !form_set_has(s, f))
            s->f[s->n++] = f;
        else
            free(f);
    }
    T_CHECK(ok);
}

/* Whether a bucket in take (of nb) has form f. */
static int covered(const form_set *per, const int *take, int nb, const char *f)
{
    for (int b = 0; b < nb; b++)
        if (take[b] && form_set_has(&per[b], f))
            return 1;
    return 0;
}

/* The buckets of o to compile into chosen (returns how many): the smallest
 * and the largest, then, while a bucket has forms none taken has, the one
 * with the most such forms. */
static int covering_buckets(const form_set *per, const cg_options *o, int *chosen)
{
    int take[16] = {0}, nb = o->n_buckets;
    take[0] = take[nb - 1] = 1;
    for (;;) {
        int best = -1, most = 0;
        for (int b = 0; b < nb; b++) {
            int n = 0;
            for (int i = 0; !take[b] && i < per[b].n; i++)
                n += !covered(per, take, nb, per[b].f[i]);
            if (n > most) {
                best = b;
                most = n;
            }
        }
        if (best < 0)
            break;
        take[best] = 1;
    }
    int n = 0;
    for (int b = 0; b < nb; b++)
        if (take[b])
            chosen[n++] = o->buckets[b];
    return n;
}

/* The forms of all buckets, each counted once. */
static int distinct_forms(const form_set *per, int nb)
{
    int n = 0;
    for (int b = 0; b < nb; b++)
        for (int i = 0; i < per[b].n; i++) {
            int seen = 0;
            for (int e = 0; e < b && !seen; e++)
                seen = form_set_has(&per[e], per[b].f[i]);
            n += !seen;
        }
    return n;
}

/* The fully passed module, or (while a pass fails) the unfused one with a
 * trivial memory plan. */
static ir_module *planned(ir_module *m, ir_module *(*rebuild)(const void *), const void *arg)
{
    moec_status st = pass_run_pipeline(m, NULL, NULL, NULL, NULL, NULL);
    if (st == MOEC_OK)
        return m;
    fprintf(stderr, "note: pipeline fails on %s (%s); using the unfused module\n", m->name,
            moec_last_error());
    ir_module_free(m);
    m = rebuild(arg);
    if (m)
        plan_trivially(m);
    return m;
}

static ir_module *load_model(const void *name)
{
    char rel[256];
    snprintf(rel, sizeof rel, "tests/data/%s", (const char *)name);
    ir_module *m = NULL;
    T_OK(fe_model_load(t_src(rel), &m));
    return m;
}

static ir_module *build_json(const void *text)
{
    ir_module *m = NULL;
    T_OK(fe_config_build(text, "config.json", &m));
    return m;
}

/* Removes a flat directory this test made. */
static void remove_dir(const char *dir)
{
    DIR *d = opendir(dir);
    char path[4352];
    for (struct dirent *e; d && (e = readdir(d));) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        unlink(path);
    }
    if (d)
        closedir(d);
    rmdir(dir);
}

/* ---- NVRTC and its cache -------------------------------------------------- */

static const char GOOD_SRC[] =
    "extern \"C\" __global__ void moec_test_k(float *p) { p[0] = 1.0f; }\n";

/* The one file in dir whose name starts with prefix and ends with suffix. */
static int find_file(const char *dir, const char *prefix, const char *suffix, char *path,
                     size_t cap)
{
    DIR *d = opendir(dir);
    int n = 0;
    if (!d)
        return 0;
    for (struct dirent *e; (e = readdir(d));) {
        size_t l = strlen(e->d_name), ls = strlen(suffix);
        if (!strncmp(e->d_name, prefix, strlen(prefix)) && l >= ls &&
            !strcmp(e->d_name + l - ls, suffix)) {
            snprintf(path, cap, "%s/%s", dir, e->d_name);
            n++;
        }
    }
    closedir(d);
    return n;
}

static uint64_t fnv(const void *p, size_t n)
{
    const unsigned char *b = p;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

static void test_cache(void)
{
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", t_tmpdir("cg-cache-test"));
    void *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    if (!HAVE_NVRTC) {
        T_ERR(cg_compile(GOOD_SRC, "sm_90", dir, &a, &na), MOEC_ERR_UNSUPPORTED, "without NVRTC");
        return;
    }
    T_ERR(cg_compile(GOOD_SRC, "compute_90", dir, &a, &na), MOEC_ERR_INVALID_ARG, "compute_90");
    T_OK(cg_compile(GOOD_SRC, "sm_90", dir, &a, &na));
    char path[4096];
    T_CHECK(find_file(dir, "", ".cubin", path, sizeof path) == 1);
    /* a hit returns the same bytes */
    T_OK(cg_compile(GOOD_SRC, "sm_90", dir, &b, &nb));
    T_CHECK(na == nb && a && b && !memcmp(a, b, na));
    free(b);
    /* ...and really comes from the file: an entry with another (well-formed)
     * payload is returned as it is */
    size_t len;
    char *entry = t_read_file(path, &len);
    const size_t head = 8 + 32 + 8 + 8;
    T_CHECK(len == head + na && !memcmp(entry, "MOECCUB1", 8));
    if (len == head + na) {
        memset(entry + head, 0x5a, na);
        uint64_t sum = fnv(entry + head, na);
        memcpy(entry + 48, &sum, 8);
        t_write_file(path, entry, len);
        T_OK(cg_compile(GOOD_SRC, "sm_90", dir, &b, &nb));
        T_CHECK(nb == na && b && ((unsigned char *)b)[0] == 0x5a &&
                ((unsigned char *)b)[na - 1] == 0x5a);
        free(b);
        /* a corrupt entry (checksum off) is recompiled and replaced */
        entry[head + 7] ^= 1;
        t_write_file(path, entry, len);
        T_OK(cg_compile(GOOD_SRC, "sm_90", dir, &b, &nb));
        T_CHECK(nb == na && b && !memcmp(a, b, na));
        free(b);
        size_t len2;
        char *fixed = t_read_file(path, &len2);
        T_CHECK(len2 == len && !memcmp(fixed + head, a, na));
        free(fixed);
        /* a truncated one too */
        t_write_file(path, entry, head + 10);
        T_OK(cg_compile(GOOD_SRC, "sm_90", dir, &b, &nb));
        T_CHECK(nb == na && b && !memcmp(a, b, na));
        free(b);
    }
    free(entry);
    /* other options or source: another entry; MOEC_NVRTC_FAST (set by
       ctest for the CPU tests) is an option, and a value it does not know
       is refused by name */
    T_OK(cg_compile(GOOD_SRC, "sm_80", dir, &b, &nb));
    free(b);
    char *fast = getenv("MOEC_NVRTC_FAST") ? strdup(getenv("MOEC_NVRTC_FAST")) : NULL;
    setenv("MOEC_NVRTC_FAST", "fast", 1);
    b = (void *)1;
    T_ERR(cg_compile(GOOD_SRC, "sm_90", dir, &b, &nb), MOEC_ERR_INVALID_ARG,
          "MOEC_NVRTC_FAST=\"fast\": not min, mid, max or 0");
    T_CHECK(b == NULL);
    setenv("MOEC_NVRTC_FAST", fast && !strcmp(fast, "max") ? "0" : "max", 1);
    T_OK(cg_compile(GOOD_SRC, "sm_90", dir, &b, &nb));
    T_CHECK(b && nb > 4 && !memcmp(b, "\177ELF", 4));
    free(b);
    if (fast)
        setenv("MOEC_NVRTC_FAST", fast, 1);
    else
        unsetenv("MOEC_NVRTC_FAST");
    free(fast);
    int n = 0;
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));)
        n += strstr(e->d_name, ".cubin") != NULL;
    if (d)
        closedir(d);
    T_CHECK(n == 3);
    free(a);
    remove_dir(dir);
}

static void test_compile_error(void)
{
    if (!HAVE_NVRTC)
        return;
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", t_tmpdir("cg-fail-test"));
    const char *src = "// line 1\n"
                      "extern \"C\" __global__ void broken(float *p)\n"
                      "{\n"
                      "    p[0] = undefined_name + 1.0f;\n"
                      "}\n";
    void *cubin = (void *)1;
    size_t n = 1;
    T_ERR(cg_compile(src, "sm_90", dir, &cubin, &n), MOEC_ERR_CUDA, "error");
    T_CHECK(cubin == NULL && n == 0);
    const char *msg = moec_last_error();
    T_CHECK(strstr(msg, "undefined_name") != NULL);
    T_CHECK(strstr(msg, "   4|     p[0] = undefined_name + 1.0f;") != NULL);
    T_CHECK(strstr(msg, "failed-") != NULL);
    char path[4096];
    T_CHECK(find_file(dir, "failed-", ".cu.txt", path, sizeof path) == 1);
    if (find_file(dir, "failed-", ".cu.txt", path, sizeof path) == 1) {
        T_CHECK(strstr(msg, path) != NULL);
        char *text = t_read_file(path, NULL);
        T_CHECK(strstr(text, "error") && strstr(text, "   1| // line 1") &&
                strstr(text, "   5| }"));
        free(text);
    }
    /* nothing was cached */
    T_CHECK(find_file(dir, "", ".cubin", path, sizeof path) == 0);
    remove_dir(dir);
}

/* ---- one op of each emitter ------------------------------------------------- */

static const char UNIT_IR[] =
    "module unit {\n"
    "  input %tokens : i32[T]\n"
    "  input %positions : i32[T]\n"
    "  weight %embed : bf16[256, 64] = \"e\"\n"
    "  weight %norm : bf16[64] = \"n\"\n"
    "  weight %wide_norm : bf16[2048] = \"wn\"\n"
    "  weight %w1 : bf16[96, 64] = \"w1\"\n"
    "  weight %b1 : bf16[96] = \"b1\"\n"
    "  weight %w2048 : bf16[2048, 64] = \"w2\"\n"
    "  weight %kv_b : bf16[128, 32] = \"kvb\"\n"
    "  %x : f32[T, 64] = embedding(%tokens, %embed)\n"
    "  %h : f32[T, 64] = rms_norm(%x, %norm) {eps = 1e-06}\n"
    "  %y : f32[T, 96] = linear(%h, %w1, %b1)\n"
    "  %y2 : f32[T, 96] = linear(%h, %w1) {alpha = 0.5}\n"
    "  %wide : f32[T, 2048] = linear(%h, %w2048)\n"
    "  %wn : f32[T, 2048] = rms_norm(%wide, %wide_norm) {eps = 1e-05}\n"
    "  %q : f32[T, 4, 24] = reshape(%y)\n"
    "  %qn : f32[T, 4, 16] = slice(%q) {axis = 2, start = 0, size = 16}\n"
    "  %qp : f32[T, 4, 8] = slice(%q) {axis = 2, start = 16, size = 8}\n"
    "  %qr : f32[T, 4, 8] = rope(%qp, %positions) {style = \"interleave\", theta = 1e+04, scaling = \"yarn\", factor = 40.0, yarn_low = 1.0, yarn_high = 3.0, attn_factor = 1.2}\n"
    "  %qx : f32[T, 4, 8] = rope(%qp, %positions) {style = \"neox\", theta = 1e+06}\n"
    "  %qf : f32[T, 4, 24] = concat(%qn, %qr) {axis = 2}\n"
    "  %qc : f32[T, 4, 32] = mla_qabsorb(%qn, %kv_b) {qk_nope_head_dim = 16, v_head_dim = 16}\n"
    "  %o : f32[T, 4, 16] = mla_vabsorb(%qc, %kv_b) {qk_nope_head_dim = 16, v_head_dim = 16}\n"
    "  %k1 : f32[T, 1, 8] = slice(%qx) {axis = 1, start = 0, size = 1}\n"
    "  %ke : f32[T, 4, 8] = expand(%k1)\n"
    "  %s : f32[T, 64] = silu(%h)\n"
    "  %g : f32[T, 64] = sigmoid(%h)\n"
    "  %a : f32[T, 64] = add(%s, %g) {alpha = 2.0}\n"
    "  %w3 : f32[T, 4, 1] = slice(%qn) {axis = 2, start = 0, size = 1}\n"
    "  %ob : f32[T, 4, 16] = mul(%o, %w3)\n"
    "  %r : f32[T, 16] = reduce_sum(%ob) {axis = 1}\n"
    "  %sm : f32[T, 48] = silu_mul(%y2)\n"
    "  %f : f32[T, 64] = fork(%a) stream 1\n"
    "  %fs : f32[T, 64] = silu(%f) stream 1\n"
    "  %j : f32[T, 64] = join(%fs)\n"
    "  %h2 : f32[T, 64] = rms_norm(%j, %norm) {eps = 1e-06}\n"
    "  %lg : f32[T, 256] = linear(%h2, %embed)\n"
    "  %logits : f32[T, 256] = reshape(%lg)\n"
    "  output %logits\n"
    "}\n";

static const ir_op *op_of(const ir_module *m, const char *result)
{
    const ir_value *v = ir_module_find_value(m, result);
    return v && v->def ? v->def : NULL;
}

/* The step op `result` recorded (its only kernel or GEMM step). */
static const ir_step *step_of(const cg_ctx *c, const char *result)
{
    const ir_op *op = op_of(c->m, result);
    int first;
    if (!op || steps_of(c, op->id, &first) < 1) {
        fprintf(stderr, "no step for %%%s\n", result);
        return NULL;
    }
    for (int i = first; i < c->n_steps; i++)
        if (c->steps[i].op_id == op->id &&
            (c->steps[i].kind == IR_STEP_KERNEL || c->steps[i].kind == IR_STEP_GEMM))
            return &c->steps[i];
    return &c->steps[first];
}

static const char *kname(const cg_ctx *c, const ir_step *s)
{
    return s && s->kind == IR_STEP_KERNEL && s->kernel >= 0 && s->kernel < c->n_kernels
               ? c->kernel_names[s->kernel]
               : "";
}

static int is_arg(ir_arg a, ir_arg_kind kind, int index)
{
    return a.kind == kind && a.index == index;
}

static int vid(const cg_ctx *c, const char *name)
{
    const ir_value *v = ir_module_find_value(c->m, name);
    return v ? v->id : -1;
}

static void expect_kernel(const cg_ctx *c, const char *result, const char *name, unsigned grid0,
                          unsigned grid1, unsigned block0, int n_args)
{
    const ir_step *s = step_of(c, result);
    int ok = s && s->kind == IR_STEP_KERNEL && !strcmp(kname(c, s), name) && s->grid[0] == grid0 &&
             s->grid[1] == grid1 && s->grid[2] == 1 && s->block[0] == block0 && s->block[1] == 1 &&
             s->n_args == n_args;
    if (!ok && s)
        fprintf(
            stderr,
            "%%%s: kernel %s grid %u,%u,%u block %u args %d; want %s grid %u,%u block %u args %d\n",
            result, kname(c, s), s->grid[0], s->grid[1], s->grid[2], s->block[0], s->n_args, name,
            grid0, grid1, block0, n_args);
    T_CHECK(ok);
}

static void expect_gemm(const cg_ctx *c, const char *result, int ta, int m, int n, int k, int batch,
                        int64_t lda, int64_t ldb, int64_t ldc, int64_t sa, int64_t sb, int64_t sc)
{
    const ir_step *s = step_of(c, result);
    const ir_gemm *g = s ? &s->gemm : NULL;
    int ok = s && s->kind == IR_STEP_GEMM && g->trans_a == ta && g->trans_b == 0 && g->m == m &&
             g->n == n && g->k == k && g->batch == batch && g->lda == lda && g->ldb == ldb &&
             g->ldc == ldc && g->stride_a == sa && g->stride_b == sb && g->stride_c == sc;
    if (!ok && g)
        fprintf(
            stderr,
            "%%%s: gemm ta %d m %d n %d k %d batch %d ld %lld %lld %lld strides %lld %lld %lld\n",
            result, g->trans_a, g->m, g->n, g->k, g->batch, (long long)g->lda, (long long)g->ldb,
            (long long)g->ldc, (long long)g->stride_a, (long long)g->stride_b,
            (long long)g->stride_c);
    T_CHECK(ok);
}

/* Buckets of up to 4 tokens: the linears of the unit module as generated
 * kernels (a block of 8 warps per 1 to 8 weight rows: 96 rows make 96
 * blocks, 2048 rows 512 blocks of 4), alpha and the bias as arguments;
 * at 8 the tensor-core kernel (a block of 8 warps per 16 rows; K 64 is 2
 * chunks: no K split), at 16 (MOEC_LINEAR_TC_MAX_T=16) the staged one (x
 * in shared memory; 4 warps of 16 rows a block, K one chunk: no split);
 * compiled by NVRTC. Their numbers are checked on the GPU against the
 * interpreter (tests/gpu_model.c, gpu_engine.c, gpu_kernels.c). */
static void test_gemv(void)
{
    ir_module *m = NULL;
    T_OK(ir_module_parse(UNIT_IR, "unit.mir", &m));
    if (!m)
        return;
    plan_trivially(m);
    cg_options o;
    cg_options_default(&o);
    setenv("MOEC_LINEAR_TC_MAX_T", "16", 1);
    for (int T = 1; T <= 16; T *= 2) {
        cg_ctx c;
        ctx_init(&c, m, &o, T);
        for (int k = 0; k < m->n_ops; k++)
            T_OK(cg_emit_op(&c, m->ops[k]));
        const ir_step *s = step_of(&c, "y");
        char want[128];
        if (T == 8) {
            expect_kernel(&c, "y", "linear_mma_n96_k64_t8_w8_rt1_u8_bf16_bf16_bf16_bbf16", 6, 1,
                          256, 5);
            T_CHECK(s && is_arg(s->args[0], IR_ARG_ACT, vid(&c, "h")) &&
                    is_arg(s->args[1], IR_ARG_WEIGHT, vid(&c, "w1")) &&
                    is_arg(s->args[2], IR_ARG_WEIGHT, vid(&c, "b1")) &&
                    s->args[3].kind == IR_ARG_F32 && s->args[3].f == 1.0 &&
                    is_arg(s->args[4], IR_ARG_ACT, vid(&c, "y")) && s->smem == 0);
            expect_kernel(&c, "wide", "linear_mma_n2048_k64_t8_w8_rt1_u8_bf16_bf16_bf16", 128, 1,
                          256, 5);
            compile_src(c.src.data, "the unit module's tensor-core linears");
        }
        if (T == 16) {
            /* the staged kernel where MOEC_LINEAR_TC_MAX_T lets it: one
               chunk of K, 64 rows a block (4 warps of one 16-row tile),
               one group of 16 tokens; the first weights before the wait */
            expect_kernel(&c, "y", "linear_tc_n96_k64_t16_tg16_w4_rt1_s1_u4_pre_bf16_bf16_bf16_bbf16",
                          2, 1, 128, 5);
            T_CHECK(s && is_arg(s->args[0], IR_ARG_ACT, vid(&c, "h")) &&
                    is_arg(s->args[1], IR_ARG_WEIGHT, vid(&c, "w1")) &&
                    is_arg(s->args[2], IR_ARG_WEIGHT, vid(&c, "b1")) &&
                    s->args[3].kind == IR_ARG_F32 && s->args[3].f == 1.0 &&
                    is_arg(s->args[4], IR_ARG_ACT, vid(&c, "y")) && s->smem == 16 * 72 * 2);
            expect_kernel(&c, "wide", "linear_tc_n2048_k64_t16_tg16_w4_rt1_s1_u4_pre_bf16_bf16_bf16",
                          32, 1, 128, 5);
            compile_src(c.src.data, "the unit module's staged linears");
        }
        if (T > 4) {
            cg_ctx_free(&c);
            continue;
        }
        snprintf(want, sizeof want, "linear_gemv_n96_k64_rb1_t%d_bf16_bf16_bf16_bbf16", T);
        expect_kernel(&c, "y", want, 96, 1, 256, 5);
        T_CHECK(s && is_arg(s->args[0], IR_ARG_ACT, vid(&c, "h")) &&
                is_arg(s->args[1], IR_ARG_WEIGHT, vid(&c, "w1")) &&
                is_arg(s->args[2], IR_ARG_WEIGHT, vid(&c, "b1")) && s->args[3].kind == IR_ARG_F32 &&
                s->args[3].f == 1.0 && is_arg(s->args[4], IR_ARG_ACT, vid(&c, "y")));
        snprintf(want, sizeof want, "linear_gemv_n96_k64_rb1_t%d_bf16_bf16_bf16", T);
        expect_kernel(&c, "y2", want, 96, 1, 256, 5);
        s = step_of(&c, "y2");
        T_CHECK(s && s->args[3].f == 0.5);
        snprintf(want, sizeof want, "linear_gemv_n2048_k64_rb4_t%d_bf16_bf16_bf16", T);
        expect_kernel(&c, "wide", want, 512, 1, 256, 5);
        compile_src(c.src.data, "the unit module's few-rows linears");
        cg_ctx_free(&c);
    }
    unsetenv("MOEC_LINEAR_TC_MAX_T");
    ir_module_free(m);
}

static void test_unit_ops(void)
{
    setenv("MOEC_ABSORB_MAX_T", "0", 1); /* the absorptions as cuBLASLt GEMMs */
    setenv("MOEC_ABSORB_MMA_MAX_T", "0", 1);
    ir_module *m = NULL;
    T_OK(ir_module_parse(UNIT_IR, "unit.mir", &m));
    if (!m)
        return;
    plan_trivially(m);
    cg_options o;
    cg_options_default(&o);
    T_CHECK(!strcmp(o.arch, "sm_90") && o.compute_dtype == IR_DTYPE_BF16 && o.n_buckets == 7 &&
            o.buckets[6] == 64 && o.kv_block_size == 64);
    cg_ctx c;
    ctx_init(&c, m, &o, 8);
    for (int k = 0; k < m->n_ops; k++)
        T_OK(cg_emit_op(&c, m->ops[k]));
    check_steps(&c);

    /* embedding: grid (chunks of 8 per 32-thread block, T) */
    expect_kernel(&c, "x", "embedding_v256_h64_t8_bf16", 1, 8, 32, 3);
    const ir_step *s = step_of(&c, "x");
    T_CHECK(s && is_arg(s->args[0], IR_ARG_INPUT, IR_INPUT_TOKENS) &&
            is_arg(s->args[1], IR_ARG_WEIGHT, vid(&c, "embed")) &&
            is_arg(s->args[2], IR_ARG_ACT, vid(&c, "x")));
    /* rms_norm: short rows one warp each, 4 to a block; long rows a block each */
    expect_kernel(&c, "h", "rms_norm_d64_t8_bf16", 2, 1, 128, 4);
    s = step_of(&c, "h");
    T_CHECK(s && is_arg(s->args[0], IR_ARG_ACT, vid(&c, "x")) &&
            is_arg(s->args[1], IR_ARG_WEIGHT, vid(&c, "norm")) &&
            is_arg(s->args[2], IR_ARG_ACT, vid(&c, "h")) && s->args[3].kind == IR_ARG_F32 &&
            s->args[3].f == 1e-6);
    expect_kernel(&c, "wn", "rms_norm_d2048_t8_bf16", 8, 1, 256, 4);
    /* identical specializations share a kernel */
    const ir_step *h2 = step_of(&c, "h2");
    T_CHECK(h2 && s && h2->kernel == s->kernel);
    /* linear: column-major C(N x T) = W^T x */
    expect_gemm(&c, "y", 1, 96, 8, 64, 1, 64, 64, 96, 0, 0, 0);
    s = step_of(&c, "y");
    T_CHECK(s && s->gemm.has_bias && is_arg(s->gemm.bias, IR_ARG_WEIGHT, vid(&c, "b1")) &&
            s->gemm.type_bias == IR_DTYPE_BF16 && s->gemm.alpha == 1.0f &&
            is_arg(s->gemm.a, IR_ARG_WEIGHT, vid(&c, "w1")) &&
            is_arg(s->gemm.b, IR_ARG_ACT, vid(&c, "h")) &&
            is_arg(s->gemm.c, IR_ARG_ACT, vid(&c, "y")) && s->gemm.type_a == IR_DTYPE_BF16 &&
            s->gemm.type_b == IR_DTYPE_BF16 && s->gemm.type_c == IR_DTYPE_BF16);
    s = step_of(&c, "y2");
    T_CHECK(s && !s->gemm.has_bias && s->gemm.alpha == 0.5f);
    s = step_of(&c, "lg");
    T_CHECK(s && s->gemm.type_c == IR_DTYPE_BF16 && s->gemm.m == 256);
    /* the module output is stored f32: a converting copy */
    expect_kernel(&c, "logits", "copy_n256_t8_f32_bf16", 1, 1, 256, 2);
    /* data movement */
    expect_kernel(&c, "q", "copy_n96_t8_bf16", 1, 1, 256, 2);
    expect_kernel(&c, "qn", "slice_r4_s24_o0_l16_t8_bf16", 1, 1, 256, 2);
    expect_kernel(&c, "qp", "slice_r4_s24_o16_l8_t8_bf16", 1, 1, 256, 2);
    expect_kernel(&c, "qf", "concat_r4_l24_16_8_t8_bf16", 1, 1, 256, 3);
    s = step_of(&c, "qf");
    T_CHECK(s && is_arg(s->args[0], IR_ARG_ACT, vid(&c, "qn")) &&
            is_arg(s->args[1], IR_ARG_ACT, vid(&c, "qr")) &&
            is_arg(s->args[2], IR_ARG_ACT, vid(&c, "qf")));
    expect_kernel(&c, "ke", "expand_1x8_4x8_t8_bf16", 1, 1, 256, 2);
    /* elementwise */
    expect_kernel(&c, "s", "silu_n64_t8_bf16", 1, 1, 256, 2);
    expect_kernel(&c, "g", "sigmoid_n64_t8_bf16", 1, 1, 256, 2);
    expect_kernel(&c, "a", "add_n64_t8_bf16", 1, 1, 256, 4);
    s = step_of(&c, "a");
    T_CHECK(s && s->args[3].kind == IR_ARG_F32 && s->args[3].f == 2.0);
    expect_kernel(&c, "ob", "mul_Tx4x16_bTx4x1_t8_bf16", 1, 1, 256, 3);
    expect_kernel(&c, "sm", "silu_mul_r1_i48_t8_bf16", 1, 1, 256, 2);
    expect_kernel(&c, "r", "reduce_sum_r1_n4_i16_t8_bf16", 1, 1, 256, 2);
    /* rope: one thread per token, head and group of channel pairs */
    s = step_of(&c, "qr");
    T_CHECK(s && !strncmp(kname(&c, s), "rope_interleave_h4_d8_t8_bf16_", 30) && s->grid[0] == 1 &&
            s->block[0] == 256 && s->n_args == 3 &&
            is_arg(s->args[1], IR_ARG_INPUT, IR_INPUT_POSITIONS));
    s = step_of(&c, "qx");
    T_CHECK(s && !strncmp(kname(&c, s), "rope_neox_h4_d8_t8_bf16_", 24));
    /* the YaRN table as docs/IR.md defines it: i = 0 extrapolates (ramp 0),
     * i = 3 interpolates (ramp 1): 1 / (factor * theta^(6/8)) */
    char lit[64];
    snprintf(lit, sizeof lit, "%af", (double)(1.0f / (40.0f * powf(1e4f, 6.0f / 8.0f))));
    T_CHECK(c.src.data && strstr(c.src.data, lit) != NULL);
    float mid = 1.0f / powf(1e4f, 4.0f / 8.0f);
    float mid_interp = 1.0f / (40.0f * powf(1e4f, 4.0f / 8.0f));
    snprintf(lit, sizeof lit, "%af", (double)(mid_interp * 0.5f + mid * 0.5f));
    T_CHECK(c.src.data && strstr(c.src.data, lit) != NULL);
    snprintf(lit, sizeof lit, "cs[q] *= %af;", (double)1.2f);
    T_CHECK(c.src.data && strstr(c.src.data, lit) != NULL);
    /* MLA absorption: per-head batched GEMMs over kv_b [4 * (16 + 16), 32]
       (cuBLASLt's form: MOEC_ABSORB_MAX_T=0 for the whole of this test) */
    expect_gemm(&c, "qc", 0, 32, 8, 16, 4, 32, 64, 128, 1024, 16, 32);
    expect_gemm(&c, "o", 1, 16, 8, 32, 4, 32, 128, 64, 1024, 32, 16);
    s = step_of(&c, "qc");
    T_CHECK(s && s->gemm.a.i == 0 && is_arg(s->gemm.a, IR_ARG_WEIGHT, vid(&c, "kv_b")));
    s = step_of(&c, "o");
    T_CHECK(s && s->gemm.a.i == 16 * 32 * 2 && is_arg(s->gemm.b, IR_ARG_ACT, vid(&c, "qc")));
    /* fork: event then copy on stream 1; join: event then copy on stream 0 */
    int first;
    const ir_op *fork = op_of(m, "f"), *join = op_of(m, "j");
    T_CHECK(fork && steps_of(&c, fork->id, &first) == 2 && c.steps[first].kind == IR_STEP_FORK &&
            c.steps[first].stream == 1 && c.steps[first + 1].kind == IR_STEP_KERNEL &&
            c.steps[first + 1].stream == 1 &&
            !strcmp(kname(&c, &c.steps[first + 1]), "copy_n64_t8_bf16"));
    T_CHECK(join && steps_of(&c, join->id, &first) == 2 && c.steps[first].kind == IR_STEP_JOIN &&
            c.steps[first].stream == 0 && c.steps[first + 1].stream == 0);
    s = step_of(&c, "fs");
    T_CHECK(s && s->stream == 1);
    /* generated source: a header per kernel, unmangled entry points */
    T_CHECK(strstr(c.src.data, "// rms_norm (codegen/rms_norm.c), first for %h\n"
                               "extern \"C\" __global__ void __launch_bounds__(128)\n"
                               "rms_norm_d64_t8_bf16(") != NULL);
    int decls = 0;
    for (const char *p = c.src.data; (p = strstr(p, "extern \"C\" __global__")); p++)
        decls++;
    T_CHECK(decls == c.n_kernels);
    compile_src(c.src.data, "the unit module");
    cg_ctx_free(&c);

    /* f32 compute: every activation and bf16 weight stored f32 */
    o.compute_dtype = IR_DTYPE_F32;
    ctx_init(&c, m, &o, 1);
    for (int k = 0; k < m->n_ops; k++)
        T_OK(cg_emit_op(&c, m->ops[k]));
    expect_kernel(&c, "h", "rms_norm_d64_t1_f32", 1, 1, 128, 4);
    s = step_of(&c, "y");
    T_CHECK(s && s->gemm.type_a == IR_DTYPE_F32 && s->gemm.type_c == IR_DTYPE_F32 &&
            s->gemm.n == 1);
    compile_src(c.src.data, "the unit module in f32");
    cg_ctx_free(&c);

    /* errors name the value */
    ir_op *lin = (ir_op *)op_of(m, "y");
    T_CHECK(lin != NULL);
    if (lin) {
        T_OK(ir_op_set_float(m, lin, "alpha", 3.0));
        o.compute_dtype = IR_DTYPE_BF16;
        ctx_init(&c, m, &o, 2);
        T_ERR(cg_emit_op(&c, lin), MOEC_ERR_UNSUPPORTED, "linear %y: alpha 3 with a bias (%b1)");
        cg_ctx_free(&c);
    }
    ir_module_free(m);
    unsetenv("MOEC_ABSORB_MAX_T");
    unsetenv("MOEC_ABSORB_MMA_MAX_T");
}

/* The unit module through plan_memory: the reshape, fork and join that
 * keep their storage dtype share their operand's bytes and launch nothing
 * (fork and join keep their event step); the reshape into the f32 logits
 * changes storage, so it keeps its own bytes and its converting copy; and
 * forced onto its operand's bytes, codegen refuses it (an in-place
 * conversion would race). */
static void test_aliases(void)
{
    ir_module *m = NULL;
    T_OK(ir_module_parse(UNIT_IR, "unit.mir", &m));
    if (!m)
        return;
    T_OK(pass_plan_memory(m, NULL));
    T_OK(ir_module_verify(m));
    const ir_value *y = ir_module_find_value(m, "y"), *q = ir_module_find_value(m, "q");
    const ir_value *a = ir_module_find_value(m, "a"), *f = ir_module_find_value(m, "f");
    const ir_value *fs = ir_module_find_value(m, "fs"), *j = ir_module_find_value(m, "j");
    ir_value *lg = ir_module_find_value(m, "lg"), *logits = ir_module_find_value(m, "logits");
    T_CHECK(y->mem_offset == q->mem_offset && a->mem_offset == f->mem_offset &&
            fs->mem_offset == j->mem_offset && lg->mem_offset != logits->mem_offset);
    cg_options o;
    cg_options_default(&o);
    for (int dt = 0; dt < 2; dt++) {
        o.compute_dtype = dt ? IR_DTYPE_F32 : IR_DTYPE_BF16;
        cg_ctx c;
        ctx_init(&c, m, &o, 8);
        for (int k = 0; k < m->n_ops; k++)
            T_OK(cg_emit_op(&c, m->ops[k]));
        check_steps(&c);
        int first;
        T_CHECK(steps_of(&c, q->def->id, &first) == 0);
        T_CHECK(steps_of(&c, f->def->id, &first) == 1 && c.steps[first].kind == IR_STEP_FORK &&
                c.steps[first].stream == 1);
        T_CHECK(steps_of(&c, j->def->id, &first) == 1 && c.steps[first].kind == IR_STEP_JOIN &&
                c.steps[first].stream == 0);
        /* the slice of q reads q's (= y's) bytes */
        const ir_step *s = step_of(&c, "qn");
        T_CHECK(s && is_arg(s->args[0], IR_ARG_ACT, vid(&c, "q")));
        if (dt == 0)
            expect_kernel(&c, "logits", "copy_n256_t8_f32_bf16", 1, 1, 256, 2);
        else /* everything f32: the output reshape could alias, but was planned apart */
            expect_kernel(&c, "logits", "copy_n256_t8_f32", 1, 1, 256, 2);
        T_CHECK(!strstr(c.src.data, "copy_n96_t8") && !strstr(c.src.data, "copy_n64_t8"));
        cg_ctx_free(&c);
    }
    int64_t keep = logits->mem_offset;
    logits->mem_offset = lg->mem_offset;
    o.compute_dtype = IR_DTYPE_BF16;
    cg_ctx c;
    ctx_init(&c, m, &o, 8);
    T_ERR(cg_emit_op(&c, logits->def), MOEC_ERR_INVALID_ARG,
          "reshape %logits: shares its arena offset with %lg, which is stored as bf16, not f32");
    cg_ctx_free(&c);
    logits->mem_offset = keep;
    ir_module_free(m);
}

static int is_main_launch(const ir_step *s)
{
    return s->stream == 0 && (s->kind == IR_STEP_KERNEL || s->kind == IR_STEP_GEMM);
}

/* c's steps (generated with MOEC_FORK_DELAY=0: every fork where its op is)
 * placed again into a copy under MOEC_FORK_DELAY (NULL: unset). */
static ir_step *placed(const cg_ctx *c, const char *delay)
{
    cg_ctx d = *c;
    d.steps = malloc(sizeof *d.steps * (size_t)(c->n_steps + 1));
    if (!d.steps)
        return NULL;
    memcpy(d.steps, c->steps, sizeof *d.steps * (size_t)c->n_steps);
    if (delay)
        setenv("MOEC_FORK_DELAY", delay, 1);
    else
        unsetenv("MOEC_FORK_DELAY");
    cg_place_forks(&d);
    setenv("MOEC_FORK_DELAY", "0", 1);
    return d.steps;
}

static int same_step(const ir_step *a, const ir_step *b)
{
    return a->kind == b->kind && a->op_id == b->op_id && a->stream == b->stream;
}

/* A partial step up to any op (ir_steps_before_op, which the runtime's
 * rt_cuda_run_until runs) over c's steps as placed in d: it holds every
 * step of the ops before that op and ends with one of them, side steps
 * placed ahead of main-stream ones or not. Checks it for every op. */
static void check_prefixes(const cg_ctx *c, const ir_step *d, const char *placement)
{
    int n = c->n_steps, bad = 0;
    for (int op = 0; op <= c->m->n_ops; op++) {
        int end = ir_steps_before_op(d, n, op);
        for (int i = end; i < n; i++)
            bad += d[i].op_id >= 0 && d[i].op_id < op;
        bad += end > 0 && !(d[end - 1].op_id >= 0 && d[end - 1].op_id < op);
    }
    if (bad)
        fprintf(stderr, "%s T=%d, %s: %d steps of earlier ops past a partial step's end\n",
                c->m->name, c->T, placement, bad);
    T_CHECK(bad == 0);
}

/* The shared expert beside the router (MOEC_SHARED_FIRST=1; by default
 * where the side stream reads no fp8) in buckets of two streams from
 * from_t (32) up: each fork whose pair has a moe_routed launch on the
 * main stream has the pair's side steps right after it, then the main
 * steps before that launch, then the join, then the rest; other buckets
 * and pairs keep their order. knob: MOEC_SHARED_FIRST's value, NULL unset. */
static void check_shared_first(const cg_ctx *c, const char *knob)
{
    int n = c->n_steps, bad = 0, moved = 0;
    if (knob)
        setenv("MOEC_SHARED_FIRST", knob, 1);
    int two = cg_two_streams(c);
    ir_step *d = placed(c, NULL);
    unsetenv("MOEC_SHARED_FIRST");
    const ir_step **want = malloc(sizeof *want * (size_t)(n + 1));
    if (!d || !want) {
        free(d);
        free(want);
        T_CHECK(0);
        return;
    }
    int w = 0;
    for (int i = 0; i < n; i++) {
        const ir_step *s = &c->steps[i];
        int j = i + 1, r = -1;
        while (s->kind == IR_STEP_FORK && j < n && c->steps[j].kind != IR_STEP_JOIN)
            j++;
        for (int k = i + 1; two == 2 && s->kind == IR_STEP_FORK && k < j && k < n && r < 0; k++) {
            int op = c->steps[k].op_id;
            if (is_main_launch(&c->steps[k]) && op >= 0 && op < c->m->n_ops &&
                c->m->ops[op]->kind == IR_OP_MOE_ROUTED)
                r = k;
        }
        if (r < 0 || j >= n) {
            want[w++] = s;
            continue;
        }
        want[w++] = s;
        for (int k = i + 1; k < j; k++)
            if (c->steps[k].stream == 1)
                want[w++] = &c->steps[k];
        for (int k = i + 1; k < r; k++)
            if (c->steps[k].stream == 0)
                want[w++] = &c->steps[k];
        want[w++] = &c->steps[j];
        for (int k = r; k < j; k++)
            if (c->steps[k].stream == 0)
                want[w++] = &c->steps[k];
        moved++;
        i = j;
    }
    for (int i = 0; i < n; i++)
        bad += !same_step(&d[i], want[i]);
    check_prefixes(c, d, "the shared expert beside the router");
    free(d);
    free(want);
    if (bad)
        fprintf(stderr, "%s T=%d MOEC_SHARED_FIRST=%s: %d steps out of place\n", c->m->name,
                c->T, knob ? knob : "(unset)", bad);
    int forks = 0;
    for (int i = 0; i < n; i++)
        forks += c->steps[i].kind == IR_STEP_FORK;
    T_CHECK(bad == 0 && (two != 2 || forks == 0 || moved > 0) && (two == 2 || moved == 0));
}

/* cg_place_forks. MOEC_FORK_DELAY=2: each fork step that had two
 * main-stream launches after it has them before it now, one with one
 * launch then something else goes past that one, one with a side-stream
 * step or an event right after it stays, the rest keep their order. By
 * default, in buckets of two streams from from_t up (cg_two_streams 2),
 * where the side stream reads fp8, a fork with a moe_topk among the
 * main-stream launches after it goes right after that moe_topk's last
 * step, others stay; where it reads bf16, check_shared_first's order;
 * elsewhere none moves. Every placement's partial steps hold what they
 * should (check_prefixes). */
static void check_fork_places(const cg_ctx *c)
{
    int n = c->n_steps;
    const ir_step *was = c->steps;
    ir_step *d = placed(c, "2");
    if (!d)
        return;
    int moved = 0, forks = 0, bad = 0;
    for (int i = 0, j = 0; i < n; i++, j++) {
        const ir_step *s = &was[i];
        int l1 = i + 1 < n && is_main_launch(&was[i + 1]);
        int l2 = l1 && i + 2 < n && is_main_launch(&was[i + 2]);
        forks += s->kind == IR_STEP_FORK;
        if (s->kind != IR_STEP_FORK || !l1) {
            bad += d[j].kind != s->kind || d[j].op_id != s->op_id || d[j].stream != s->stream;
            continue;
        }
        int k = l2 ? 2 : 1;
        for (int q = 0; q < k; q++)
            bad += d[j + q].op_id != was[i + 1 + q].op_id;
        bad += d[j + k].kind != IR_STEP_FORK || d[j + k].op_id != s->op_id;
        moved++;
        i += k;
        j += k;
    }
    check_prefixes(c, d, "MOEC_FORK_DELAY=2");
    free(d);
    if (bad)
        fprintf(stderr, "MOEC_FORK_DELAY=2: %d steps out of place\n", bad);
    /* the shared experts' forks have the router after them */
    T_CHECK(bad == 0 && (forks == 0 || moved > 0));

    int two = cg_two_streams(c), after_topk = 0;
    if (two == 2 && !ir_side_stream_fp8(c->m)) { /* the shared expert beside the router */
        check_shared_first(c, NULL);
        return;
    }
    check_shared_first(c, "1");
    d = placed(c, NULL);
    if (!d)
        return;
    bad = 0;
    for (int i = 0, j = 0; i < n; i++, j++) {
        const ir_step *s = &was[i];
        int topk = -1;
        for (int q = i + 1; s->kind == IR_STEP_FORK && q < n && is_main_launch(&was[q]); q++)
            if (was[q].op_id >= 0 && was[q].op_id < c->m->n_ops &&
                c->m->ops[was[q].op_id]->kind == IR_OP_MOE_TOPK)
                topk = q;
        if (two != 2 || topk < 0) {
            bad += d[j].kind != s->kind || d[j].op_id != s->op_id || d[j].stream != s->stream;
            continue;
        }
        for (int q = i + 1; q <= topk; q++, j++)
            bad += d[j].op_id != was[q].op_id;
        bad += d[j].kind != IR_STEP_FORK || d[j].op_id != s->op_id;
        after_topk++;
        i = topk;
    }
    check_prefixes(c, d, "the default placement");
    free(d);
    if (bad)
        fprintf(stderr, "%s T=%d: %d steps out of place\n", c->m->name, c->T, bad);
    T_CHECK(bad == 0 && (two != 2 || forks == 0 || after_topk > 0));
}

/* After the whole pipeline, per bucket: no reshape, fork or join launches
 * a kernel; fork and join are one event step each. Returns bucket T=1's
 * launches (kernels and GEMMs). */
static int check_no_alias_copies(const ir_module *m)
{
    static const int buckets[] = {1, 8, 64};
    cg_options o;
    cg_options_default(&o);
    int launches = -1;
    setenv("MOEC_FORK_DELAY", "0", 1); /* every fork where its op is */
    for (int b = 0; b < 3; b++) {
        cg_ctx c;
        if (!generate(m, &o, buckets[b], &c)) {
            cg_ctx_free(&c);
            continue;
        }
        int bad = 0, n = 0, forks = 0, joins = 0, events = 0;
        for (int i = 0; i < c.n_steps; i++) {
            const ir_step *s = &c.steps[i];
            if (s->kind == IR_STEP_KERNEL || s->kind == IR_STEP_GEMM)
                n++;
            if (s->op_id < 0 || s->op_id >= m->n_ops)
                continue;
            ir_op_kind k = m->ops[s->op_id]->kind;
            if (k == IR_OP_RESHAPE || ((k == IR_OP_FORK || k == IR_OP_JOIN) &&
                                       s->kind != IR_STEP_FORK && s->kind != IR_STEP_JOIN))
                bad++;
            events += s->kind == IR_STEP_FORK || s->kind == IR_STEP_JOIN;
        }
        for (int k = 0; k < m->n_ops; k++) {
            forks += m->ops[k]->kind == IR_OP_FORK;
            joins += m->ops[k]->kind == IR_OP_JOIN;
        }
        if (bad)
            fprintf(stderr, "%s T=%d: %d steps of reshape, fork or join copy\n", m->name,
                    buckets[b], bad);
        T_CHECK(bad == 0 && events == forks + joins);
        if (b == 0)
            launches = n;
        check_fork_places(&c);
        cg_ctx_free(&c);
    }
    unsetenv("MOEC_FORK_DELAY");
    return launches;
}

/* add_rms_norm: warp form for short rows, block form for long ones, a
 * signature of every dtype where they differ, the sum's storage rounding
 * before the norm, and rows too long to keep in registers. */
static const char ADD_NORM_IR[] =
    "module add_norm {\n"
    "  input %tokens : i32[T]\n"
    "  input %positions : i32[T]\n"
    "  weight %embed : bf16[256, 64] = \"e\"\n"
    "  weight %norm : bf16[64] = \"n\"\n"
    "  weight %norm32 : f32[64] = \"n32\"\n"
    "  weight %wide_w : bf16[2048, 64] = \"ww\"\n"
    "  weight %wide_norm : bf16[2048] = \"wn\"\n"
    "  weight %huge_w : bf16[73728, 64] = \"hw\"\n"
    "  weight %huge_norm : bf16[73728] = \"hn\"\n"
    "  %x : f32[T, 64] = embedding(%tokens, %embed)\n"
    "  %x2 : f32[T, 64] = silu(%x)\n"
    "  %r : f32[T, 64], %h : f32[T, 64] = add_rms_norm(%x, %x2, %norm) {eps = 1e-06, alpha = 2.5}\n"
    "  %r2 : f32[T, 64], %h2 : f32[T, 64] = add_rms_norm(%r, %h, %norm) {eps = 1e-05}\n"
    "  %r3 : f32[T, 64], %h3 : f32[T, 64] = add_rms_norm(%r2, %h2, %norm32) {eps = 1e-05}\n"
    "  %r4 : f32[T, 64], %h4 : f32[T, 64] = add_rms_norm(%r3, %h3, %norm, %x2) {eps = 1e-05, alpha = 2.5}\n"
    "  %wd : f32[T, 2048] = linear(%h4, %wide_w)\n"
    "  %wr : f32[T, 2048], %wh : f32[T, 2048] = add_rms_norm(%wd, %wd, %wide_norm) {eps = 1e-06}\n"
    "  %hg : f32[T, 73728] = linear(%r4, %huge_w)\n"
    "  %hr : f32[T, 73728], %hh : f32[T, 73728] = add_rms_norm(%hg, %hg, %huge_norm) {eps = 1e-06}\n"
    "  %lg : f32[T, 256] = linear(%h3, %embed)\n"
    "  %logits : f32[T, 256] = reshape(%lg)\n"
    "  output %logits\n"
    "}\n";

static void test_add_rms_norm(void)
{
    ir_module *m = NULL;
    T_OK(ir_module_parse(ADD_NORM_IR, "add_norm.mir", &m));
    if (!m)
        return;
    plan_trivially(m);
    cg_options o;
    cg_options_default(&o);
    cg_ctx c;
    ctx_init(&c, m, &o, 8);
    for (int k = 0; k < m->n_ops; k++)
        T_OK(cg_emit_op(&c, m->ops[k]));
    check_steps(&c);
    /* 64 wide: a warp per row, 4 rows a block */
    expect_kernel(&c, "r", "add_rms_norm_d64_t8_bf16", 2, 1, 128, 7);
    const ir_step *s = step_of(&c, "r");
    T_CHECK(s && is_arg(s->args[0], IR_ARG_ACT, vid(&c, "x")) &&
            is_arg(s->args[1], IR_ARG_ACT, vid(&c, "x2")) &&
            is_arg(s->args[2], IR_ARG_WEIGHT, vid(&c, "norm")) &&
            is_arg(s->args[3], IR_ARG_ACT, vid(&c, "r")) &&
            is_arg(s->args[4], IR_ARG_ACT, vid(&c, "h")) && s->args[5].kind == IR_ARG_F32 &&
            s->args[5].f == 2.5 && s->args[6].kind == IR_ARG_F32 && s->args[6].f == 1e-6);
    /* one step for the op, whose two results are both named by it */
    int first;
    const ir_op *op = op_of(m, "h");
    T_CHECK(op && op == op_of(m, "r") && steps_of(&c, op->id, &first) == 1);
    /* alpha defaults to 1; the same specialization shares the kernel */
    const ir_step *s2 = step_of(&c, "r2");
    T_CHECK(s && s2 && s2->kernel == s->kernel && s2->args[5].f == 1.0 && s2->args[6].f == 1e-5);
    /* an f32 weight: every dtype in the name (sum, normed, a, b, w) */
    expect_kernel(&c, "r3", "add_rms_norm_d64_t8_bf16_bf16_bf16_bf16_f32", 2, 1, 128, 7);
    /* a second addend, c: (a, b, w, c, sum, normed, alpha, eps); b + c first */
    expect_kernel(&c, "r4", "add3_rms_norm_d64_t8_bf16", 2, 1, 128, 8);
    s = step_of(&c, "r4");
    T_CHECK(s && is_arg(s->args[0], IR_ARG_ACT, vid(&c, "r3")) &&
            is_arg(s->args[1], IR_ARG_ACT, vid(&c, "h3")) &&
            is_arg(s->args[2], IR_ARG_WEIGHT, vid(&c, "norm")) &&
            is_arg(s->args[3], IR_ARG_ACT, vid(&c, "x2")) &&
            is_arg(s->args[4], IR_ARG_ACT, vid(&c, "r4")) &&
            is_arg(s->args[5], IR_ARG_ACT, vid(&c, "h4")) && s->args[6].f == 2.5 &&
            s->args[7].f == 1e-5);
    /* the hidden size: a block per row, 256 threads of 8 elements */
    expect_kernel(&c, "wr", "add_rms_norm_d2048_t8_bf16", 8, 1, 256, 7);
    s = step_of(&c, "wr");
    T_CHECK(s && is_arg(s->args[0], IR_ARG_ACT, vid(&c, "wd")) &&
            is_arg(s->args[1], IR_ARG_ACT, vid(&c, "wd")) &&
            is_arg(s->args[2], IR_ARG_WEIGHT, vid(&c, "wide_norm")) &&
            is_arg(s->args[3], IR_ARG_ACT, vid(&c, "wr")) &&
            is_arg(s->args[4], IR_ARG_ACT, vid(&c, "wh")));
    /* rows too long for registers: 1024 threads, the sum read back */
    expect_kernel(&c, "hr", "add_rms_norm_d73728_t8_bf16", 8, 1, 1024, 7);
    const char *src = c.src.data ? c.src.data : "";
    T_CHECK(strstr(src, "// add_rms_norm (codegen/add_rms_norm.c), first for %r, %h\n"
                        "extern \"C\" __global__ void __launch_bounds__(128)\n"
                        "add_rms_norm_d64_t8_bf16(const __nv_bfloat16 *__restrict__ a, ") != NULL);
    const char *huge = strstr(src, "add_rms_norm_d73728_t8_bf16(");
    T_CHECK(huge && strstr(huge, "ldv<8>(sr + c * 8, t);") && !strstr(huge, "float v["));
    /* bf16: the norm is of the sum as stored */
    T_CHECK(strstr(src, "__nv_bfloat16 q;\n                st(&q, t[j]);\n") != NULL);
    const char *add3 = strstr(src, "add3_rms_norm_d64_t8_bf16(");
    T_CHECK(add3 && strstr(add3, "const __nv_bfloat16 *__restrict__ w, const __nv_bfloat16 "
                                 "*__restrict__ c2, __nv_bfloat16 *__restrict__ sum") &&
            strstr(add3, "ldv<8>(c2 + base + c * 8, u2);") &&
            strstr(add3, "u[j] = u[j] + u2[j];"));
    compile_src(src, "the add_rms_norm module");
    cg_ctx_free(&c);

    /* f32 compute: no rounding of the sum */
    o.compute_dtype = IR_DTYPE_F32;
    ctx_init(&c, m, &o, 1);
    for (int k = 0; k < m->n_ops; k++)
        T_OK(cg_emit_op(&c, m->ops[k]));
    expect_kernel(&c, "r", "add_rms_norm_d64_t1_f32", 1, 1, 128, 7);
    expect_kernel(&c, "wr", "add_rms_norm_d2048_t1_f32", 1, 1, 256, 7);
    T_CHECK(c.src.data && !strstr(c.src.data, " q;\n"));
    compile_src(c.src.data, "the add_rms_norm module in f32");
    cg_ctx_free(&c);
    ir_module_free(m);
}

/* ---- the GEMM steps mean what the ops do ---------------------------------------- */

/* C = alpha * op(A) op(B) (+ bias) per batch, column-major, as cuBLASLt reads
 * an ir_gemm (plan.h); a.i is a byte offset of `esize`-byte elements. */
static void gemm_ref(const ir_gemm *g, const float *a, const float *b, const float *bias, float *c,
                     size_t esize)
{
    a += g->a.i / (int64_t)esize;
    for (int q = 0; q < g->batch; q++) {
        const float *A = a + q * g->stride_a, *B = b + q * g->stride_b;
        float *C = c + q * g->stride_c;
        for (int i = 0; i < g->m; i++)
            for (int j = 0; j < g->n; j++) {
                double acc = 0;
                for (int l = 0; l < g->k; l++) {
                    float av = g->trans_a ? A[l + i * g->lda] : A[i + l * g->lda];
                    float bv = g->trans_b ? B[j + l * g->ldb] : B[l + j * g->ldb];
                    acc += (double)av * bv;
                }
                C[i + j * g->ldc] = (float)(g->alpha * acc + (g->has_bias ? bias[i] : 0.0f));
            }
    }
}

static float *rand_buf(size_t n, uint64_t *rng)
{
    float *p = malloc(n * sizeof *p);
    for (size_t i = 0; p && i < n; i++)
        p[i] = t_rand_normal(rng);
    return p;
}

/* linear, mla_qabsorb and mla_vabsorb of the unit module through gemm_ref
 * against docs/IR.md's formulas. */
static void test_gemm_semantics(void)
{
    setenv("MOEC_ABSORB_MAX_T", "0", 1); /* the absorptions as cuBLASLt GEMMs */
    setenv("MOEC_ABSORB_MMA_MAX_T", "0", 1);
    ir_module *m = NULL;
    T_OK(ir_module_parse(UNIT_IR, "unit.mir", &m));
    if (!m)
        return;
    plan_trivially(m);
    cg_options o;
    cg_options_default(&o);
    enum { T = 3, H = 4, DN = 16, DV = 16, R = 32 };
    cg_ctx c;
    ctx_init(&c, m, &o, T);
    for (int k = 0; k < m->n_ops; k++)
        T_OK(cg_emit_op(&c, m->ops[k]));
    uint64_t rng = 7;
    float *x = rand_buf(T * 64, &rng), *w = rand_buf(96 * 64, &rng), *bias = rand_buf(96, &rng);
    float *kvb = rand_buf(H * (DN + DV) * R, &rng), *q = rand_buf(T * H * DN, &rng);
    float *oc = rand_buf(T * H * R, &rng), *out = calloc(T * H * R + 96 * T, sizeof(float));
    const ir_step *s = step_of(&c, "y");
    double worst = 0;
    if (s && x && w && bias && kvb && q && oc && out) {
        gemm_ref(&s->gemm, w, x, bias, out, 2);
        for (int t = 0; t < T; t++)
            for (int n = 0; n < 96; n++) {
                double want = bias[n];
                for (int k = 0; k < 64; k++)
                    want += (double)x[t * 64 + k] * w[n * 64 + k];
                worst = fmax(worst, fabs(out[t * 96 + n] - want));
            }
        s = step_of(&c, "qc");
        gemm_ref(&s->gemm, kvb, q, NULL, out, 2);
        for (int t = 0; t < T; t++)
            for (int h = 0; h < H; h++)
                for (int j = 0; j < R; j++) {
                    double want = 0;
                    for (int i = 0; i < DN; i++)
                        want += (double)q[(t * H + h) * DN + i] * kvb[(h * (DN + DV) + i) * R + j];
                    worst = fmax(worst, fabs(out[(t * H + h) * R + j] - want));
                }
        s = step_of(&c, "o");
        gemm_ref(&s->gemm, kvb, oc, NULL, out, 2);
        for (int t = 0; t < T; t++)
            for (int h = 0; h < H; h++)
                for (int i = 0; i < DV; i++) {
                    double want = 0;
                    for (int j = 0; j < R; j++)
                        want +=
                            (double)kvb[(h * (DN + DV) + DN + i) * R + j] * oc[(t * H + h) * R + j];
                    worst = fmax(worst, fabs(out[(t * H + h) * DV + i] - want));
                }
    }
    if (worst > 1e-4)
        fprintf(stderr, "GEMM steps differ from the ops by %g\n", worst);
    T_CHECK(s && worst <= 1e-4);
    free(x);
    free(w);
    free(bias);
    free(kvb);
    free(q);
    free(oc);
    free(out);
    cg_ctx_free(&c);
    ir_module_free(m);
    unsetenv("MOEC_ABSORB_MAX_T");
    unsetenv("MOEC_ABSORB_MMA_MAX_T");
}

/* Buckets of up to 2 tokens: the absorptions as generated kernels (qabsorb
 * a block of 16 warps per head and 64 columns of r, vabsorb a block of 8
 * warps per head and 16 rows of W_UV), x, kv_b and the result as
 * arguments (vabsorb reads W_UV itself: no offset in the argument);
 * compiled by NVRTC; from 3 tokens (and at 2 with MOEC_ABSORB_MAX_T=1) the
 * tensor-core form (8 warps a block of 16 output columns of a head, its
 * x rows and weight columns in dynamic shared memory), also compiled; with
 * MOEC_ABSORB_MMA_MAX_T=2, cuBLASLt at 3. Their numbers: tests/gpu_model.c
 * and gpu_kernels.c against the interpreter. */
static void test_absorb_kernels(void)
{
    ir_module *m = NULL;
    T_OK(ir_module_parse(UNIT_IR, "unit.mir", &m));
    if (!m)
        return;
    plan_trivially(m);
    cg_options o;
    cg_options_default(&o);
    cg_ctx c;
    T_CHECK(generate(m, &o, 2, &c));
    expect_kernel(&c, "qc", "mla_qabsorb_h4_dn16_dv16_r32_t2_bf16_bf16_bf16", 4, 1, 512, 3);
    expect_kernel(&c, "o", "mla_vabsorb_h4_dn16_dv16_r32_t2_bf16_bf16_bf16", 4, 1, 256, 3);
    const ir_step *s = step_of(&c, "qc");
    T_CHECK(s && is_arg(s->args[0], IR_ARG_ACT, vid(&c, "qn")) && s->args[1].i == 0 &&
            is_arg(s->args[1], IR_ARG_WEIGHT, vid(&c, "kv_b")) &&
            is_arg(s->args[2], IR_ARG_ACT, vid(&c, "qc")));
    s = step_of(&c, "o");
    T_CHECK(s && is_arg(s->args[0], IR_ARG_ACT, vid(&c, "qc")) && s->args[1].i == 0 &&
            is_arg(s->args[1], IR_ARG_WEIGHT, vid(&c, "kv_b")) &&
            is_arg(s->args[2], IR_ARG_ACT, vid(&c, "o")));
    compile_src(c.src.data, "the unit module's absorptions");
    cg_ctx_free(&c);
    T_CHECK(generate(m, &o, 3, &c));
    /* qabsorb: r 32 in 2 blocks of 16 columns a head; A: 16 rows of dn 16 +
       8, B: 16 rows of 16 + 8 (bf16); vabsorb: dv 16 in one block, A 16 rows
       of r 32 + 8, B 16 rows of 32 + 8 */
    expect_kernel(&c, "qc", "mla_qabsorb_mma_nb16_h4_dn16_dv16_r32_t3_bf16_bf16_bf16", 4, 2, 256, 3);
    expect_kernel(&c, "o", "mla_vabsorb_mma_nb16_h4_dn16_dv16_r32_t3_bf16_bf16_bf16", 4, 1, 256, 3);
    s = step_of(&c, "qc");
    T_CHECK(s && s->smem == (16 * 24 + 16 * 24) * 2);
    s = step_of(&c, "o");
    T_CHECK(s && s->smem == (16 * 40 + 16 * 40) * 2);
    compile_src(c.src.data, "the unit module's absorptions on tensor cores");
    cg_ctx_free(&c);
    setenv("MOEC_ABSORB_MMA_MAX_T", "2", 1);
    T_CHECK(generate(m, &o, 3, &c));
    s = step_of(&c, "qc");
    T_CHECK(s && s->kind == IR_STEP_GEMM);
    cg_ctx_free(&c);
    setenv("MOEC_ABSORB_MAX_T", "1", 1);
    T_CHECK(generate(m, &o, 2, &c));
    expect_kernel(&c, "o", "mla_vabsorb_mma_nb16_h4_dn16_dv16_r32_t2_bf16_bf16_bf16", 4, 1, 256, 3);
    cg_ctx_free(&c);
    setenv("MOEC_ABSORB_MMA_MAX_T", "0", 1);
    T_CHECK(generate(m, &o, 2, &c));
    s = step_of(&c, "o");
    T_CHECK(s && s->kind == IR_STEP_GEMM);
    cg_ctx_free(&c);
    unsetenv("MOEC_ABSORB_MAX_T");
    unsetenv("MOEC_ABSORB_MMA_MAX_T");
    unsetenv("MOEC_ABSORB_MMA_MAX_T");
    ir_module_free(m);
}

/* ---- storage dtypes ------------------------------------------------------- */

static void test_storage(void)
{
    ir_module *m = load_model("deepseek_v3");
    if (!m)
        return;
    const ir_value *logits = m->outputs[0];
    const ir_value *router = ir_module_find_value(m, "l1.moe.logits");
    const ir_value *ids = ir_module_find_value(m, "l1.moe.topk_ids");
    const ir_value *w = ir_module_find_value(m, "l1.moe.topk_w");
    const ir_value *bias = ir_module_find_value(m, "l1.moe.router_bias");
    const ir_value *embed = ir_module_find_value(m, "embed_tokens");
    const ir_value *norm = ir_module_find_value(m, "l1.mlp_norm");
    T_CHECK(router && ids && w && bias && embed && norm);
    if (router && ids && w && bias && embed && norm) {
        ir_dtype bf = IR_DTYPE_BF16;
        T_CHECK(ir_value_storage_dtype(m, logits, bf) == IR_DTYPE_F32);
        T_CHECK(ir_value_storage_dtype(m, router, bf) == IR_DTYPE_F32);
        T_CHECK(ir_value_storage_dtype(m, ids, bf) == IR_DTYPE_I32);
        T_CHECK(ir_value_storage_dtype(m, w, bf) == IR_DTYPE_F32);
        T_CHECK(ir_value_storage_dtype(m, bias, bf) == IR_DTYPE_F32);
        T_CHECK(ir_value_storage_dtype(m, embed, bf) == IR_DTYPE_BF16);
        T_CHECK(ir_value_storage_dtype(m, norm, bf) == IR_DTYPE_BF16);
        T_CHECK(ir_value_storage_dtype(m, norm, IR_DTYPE_F16) == IR_DTYPE_F16);
        T_CHECK(ir_value_storage_dtype(m, embed, IR_DTYPE_F32) == IR_DTYPE_F32);
        T_CHECK(ir_value_storage_dtype(m, m->inputs[0], bf) == IR_DTYPE_I32);
    }
    ir_module_free(m);
    T_CHECK(!strcmp(cg_ctype(IR_DTYPE_BF16), "__nv_bfloat16") &&
            !strcmp(cg_ctype(IR_DTYPE_F16), "__half") && !strcmp(cg_ctype(IR_DTYPE_F32), "float") &&
            !strcmp(cg_ctype(IR_DTYPE_I32), "int"));
}

/* ---- whole models --------------------------------------------------------- */

/* Progress: one call per bucket, kernels done rising to the total. */
static int n_progress, last_done, last_total;
static void progress(int done, int total, void *user)
{
    (void)user;
    T_CHECK(done > last_done && done <= total && (!n_progress || total == last_total));
    n_progress++;
    last_done = done;
    last_total = total;
}

/* cg_plan_build of m for the given buckets: what CI compiles with NVRTC
 * (the sources cg_plan_build ships), with a progress call per bucket. */
static void test_plan_build(const ir_module *m, const int *buckets, int nb)
{
    cg_options o;
    cg_options_default(&o);
    o.cache_dir = g_cache;
    o.progress = progress;
    o.n_buckets = nb;
    memcpy(o.buckets, buckets, (size_t)nb * sizeof *buckets);
    n_progress = last_done = last_total = 0;
    ir_plan *p = NULL;
    moec_status st = cg_plan_build(m, &o, &p);
    if (!HAVE_NVRTC) {
        T_ERR(st, MOEC_ERR_UNSUPPORTED, "without NVRTC");
        return;
    }
    if (st != MOEC_OK && not_yet(st)) {
        fprintf(stderr, "note: no full plan for %s yet: %s\n", m->name, moec_last_error());
        return;
    }
    T_OK(st);
    if (!p)
        return;
    int64_t arena = ir_module_meta_int(m, "arena_bytes_per_token", 0);
    T_CHECK(p->n_buckets == nb && p->module == m && !strcmp(p->arch, "sm_90") &&
            p->kv_block_size == 64 && p->compute_dtype == IR_DTYPE_BF16 && n_progress == nb);
    int kernels = 0;
    for (int b = 0; b < p->n_buckets; b++)
        kernels += p->buckets[b].n_kernels;
    T_CHECK(last_done == kernels && last_total == kernels);
    for (int b = 0; b < p->n_buckets; b++) {
        const ir_bucket *bk = &p->buckets[b];
        T_CHECK(bk->T == o.buckets[b] && bk->cubin_size > 4 && !memcmp(bk->cubin, "\177ELF", 4) &&
                bk->n_kernels > 0 && bk->n_steps > m->n_ops / 2 &&
                bk->arena_bytes == (size_t)arena * (size_t)bk->T);
        const ir_step *last = &bk->steps[bk->n_steps - 1];
        T_CHECK(last->kind == IR_STEP_KERNEL && last->stream == 0);
    }
    ir_plan_free(p);
}

/* Every default bucket of m generated and its steps checked; the plan of
 * the buckets that cover every kernel form (see "kernel forms") built,
 * which compiles them. */
static void generate_and_compile(const ir_module *m, const char *what)
{
    double t0 = now();
    cg_options o;
    cg_options_default(&o);
    form_set per[16];
    memset(per, 0, sizeof per);
    for (int b = 0; b < o.n_buckets; b++) {
        cg_ctx c;
        if (generate(m, &o, o.buckets[b], &c))
            add_forms(&per[b], c.src.data);
        cg_ctx_free(&c);
    }
    int chosen[16], n = covering_buckets(per, &o, chosen);
    char list[128] = "";
    for (int i = 0, len = 0; i < n && len < (int)sizeof list; i++)
        len += snprintf(list + len, sizeof list - (size_t)len, "%s%d", i ? "," : "", chosen[i]);
    fprintf(stderr, "%s: %d buckets generated; %d kernel forms, all in buckets T=%s\n", what,
            o.n_buckets, distinct_forms(per, o.n_buckets), list);
    for (int b = 0; b < o.n_buckets; b++)
        for (int i = 0; i < per[b].n; i++)
            free(per[b].f[i]);
    test_plan_build(m, chosen, n);
    fprintf(stderr, "%s: buckets T=%s %s in %.2f s\n", what, list,
            HAVE_NVRTC ? "compiled" : "generated", now() - t0);
}

/* 1 when op is one of DeepSeek-V3.2's indexer ops: dsa_prologue_k,
 * dsa_topk, or a linear only those read (wq_b; in fp8 wk and weights_proj
 * too, which qkv_a leaves; not qkv_a, which the MLA's prologue reads). */
static int is_indexer_op(const ir_module *m, const ir_op *op)
{
    if (op->kind == IR_OP_DSA_TOPK || op->kind == IR_OP_DSA_PROLOGUE_K)
        return 1;
    if (op->kind != IR_OP_LINEAR)
        return 0;
    int indexer = 0, other = 0;
    for (int k = op->id + 1; k < m->n_ops; k++) {
        const ir_op *u = m->ops[k];
        int dsa = u->kind == IR_OP_DSA_TOPK || u->kind == IR_OP_DSA_PROLOGUE_K;
        for (int i = 0; i < u->n_in; i++)
            if (u->in[i] == op->out[0]) {
                indexer += dsa;
                other += !dsa;
            }
    }
    return indexer > 0 && other == 0;
}

/* The staged fp8 linear's warps at 64 tokens (fp8_tc.c, linear_shape):
 * V2-Lite's q_proj with kv_a (3648 rows, 120 blocks at 8 warps) and dense
 * down (2048 x 10944: 128 blocks at 4, one an SM, 64 at 8) take 8; o_proj
 * (2048 x 2048: 64 blocks at 8) and the shared down (2048 x 2816) keep 4,
 * and so does the shared gate_up (5632 x 2048), which would take 8 but
 * runs on the side stream;
 * every staged fp8 linear 4 or 8, and 4 under MOEC_FP8_TC_LIN_W8=0. */
static void check_linear_warps(const ir_module *m, const char *what, int v2lite)
{
    for (int off = 0; off < 2; off++) {
        if (off)
            setenv("MOEC_FP8_TC_LIN_W8", "0", 1);
        cg_ctx c;
        int ok = generate_default(m, 64, &c);
        if (off)
            unsetenv("MOEC_FP8_TC_LIN_W8");
        if (!ok)
            continue;
        static const char *const w8[] = {"n3648_k2048_", "n2048_k10944_"},
                                 *const w4[] = {"n2048_k2048_", "n2048_k2816_", "n5632_k2048_"};
        int bad = 0, seen = 0, named = 0;
        for (int k = 0; k < c.n_kernels; k++) {
            const char *n = c.kernel_names[k];
            if (strncmp(n, "linear_f8tc_", 12))
                continue;
            seen++;
            int want = 0; /* 0: 4 or 8 */
            for (int i = 0; i < 3 && v2lite; i++) {
                int in8 = i < 2 && strstr(n, w8[i]) != NULL;
                want = in8 ? (off ? 4 : 8) : strstr(n, w4[i]) ? 4 : want;
                named += in8 || strstr(n, w4[i]);
            }
            /* groups of 64 or fewer tokens (V3's x of 16384 and 18432 columns
               fits 32): 8 warps only at 64 */
            const char *tg = strstr(n, "_tg"), *w = tg ? strstr(tg, "_w") : NULL;
            int got = w ? atoi(w + 2) : 0;
            if (tg && atoi(tg + 3) < 64)
                want = 4;
            if (!w || (want ? got != want : (got != 4 && got != 8) || (off && got != 4))) {
                fprintf(stderr, "%s T=64%s: %s has %d warps\n", what,
                        off ? " MOEC_FP8_TC_LIN_W8=0" : "", n, got);
                bad++;
            }
        }
        T_CHECK(bad == 0 && seen > 0 && (!v2lite || named == 5));
        cg_ctx_free(&c);
    }
}

/* The MLA prologue is launched plainly (its step's plain) in buckets from
 * 32 tokens (MOEC_MLA_PRO_PLAIN_T; 0: never) where its input is a linear
 * over fp8 weights, else as a programmatic dependent. */
static void check_mla_pro_plain(const ir_module *m, const char *what, int fp8, int mla)
{
    const char *pv = getenv("MOEC_MLA_PRO_PLAIN_T");
    int plain_t = pv && *pv ? atoi(pv) : 32;
    static const int buckets[] = {8, 32, 64};
    for (int b = 0; b < 3; b++) {
        cg_ctx c;
        if (!generate_default(m, buckets[b], &c))
            continue;
        int want = fp8 && plain_t > 0 && buckets[b] >= plain_t, seen = 0, bad = 0;
        for (int i = 0; i < c.n_steps; i++) {
            const ir_step *s = &c.steps[i];
            if (s->op_id < 0 || s->kind != IR_STEP_KERNEL)
                continue;
            ir_op_kind k = m->ops[s->op_id]->kind;
            if (k != IR_OP_MLA_PROLOGUE && k != IR_OP_MLA_PROLOGUE_KV && k != IR_OP_MLA_PROLOGUE_Q)
                continue;
            const ir_op *d = m->ops[s->op_id]->in[0]->def;
            /* V3's kv prologue reads the fused q_a/kv_a projection; its q
               prologue q_b's; both linears in fp8 */
            seen++;
            bad += s->plain != (want && d && d->kind == IR_OP_LINEAR);
        }
        if (bad || (mla && !seen))
            fprintf(stderr, "%s T=%d: %d of %d MLA prologue steps launched %s\n", what,
                    buckets[b], bad, seen, want ? "as dependents" : "plainly");
        T_CHECK(bad == 0 && (!mla || seen > 0));
        cg_ctx_free(&c);
    }
}

/* The shared expert's silu_mul and the down projection reading it launch at
 * the greatest priority (the step's prio) on the side stream where it forks
 * after the routing (fp8, from 32 tokens) and at batch 1 (fp8, where it
 * forks before the router), and no other step; none in bf16, from 2 to 31
 * tokens, or under MOEC_SIDE_PRIO=0. `shared`: the model has a shared
 * expert (so that the check is not empty). */
static void check_side_prio(const ir_module *m, const char *what, int fp8, int shared)
{
    /* the last two under MOEC_SIDE_PRIO=0 */
    static const int buckets[] = {1, 2, 8, 32, 64, 1, 64};
    const int n = (int)(sizeof buckets / sizeof buckets[0]);
    for (int b = 0; b < n; b++) {
        int off = b >= n - 2;
        if (off)
            setenv("MOEC_SIDE_PRIO", "0", 1);
        cg_ctx c;
        int ok = generate_default(m, buckets[b], &c);
        if (off)
            unsetenv("MOEC_SIDE_PRIO");
        if (!ok)
            continue;
        int want = fp8 && !off && (buckets[b] >= 32 || buckets[b] == 1), tail = 0, bad = 0;
        for (int i = 0; i < c.n_steps; i++) {
            const ir_step *s = &c.steps[i];
            const ir_op *o = s->op_id >= 0 ? m->ops[s->op_id] : NULL;
            const ir_op *src = o && o->n_in > 0 && o->in[0]->kind == IR_VALUE_OP ? o->in[0]->def
                                                                                 : NULL;
            int is_tail = s->kind == IR_STEP_KERNEL && s->stream == 1 && o &&
                          (o->kind == IR_OP_SILU_MUL ||
                           (o->kind == IR_OP_LINEAR &&
                            (ir_op_attr(o, "act") || (src && src->kind == IR_OP_SILU_MUL))));
            tail += is_tail;
            bad += s->prio != (want && is_tail);
        }
        if (bad || (shared && !tail))
            fprintf(stderr, "%s T=%d%s: %d steps' prio wrong (%d of the shared expert's tail)\n",
                    what, buckets[b], off ? " MOEC_SIDE_PRIO=0" : "", bad, tail);
        T_CHECK(bad == 0 && (!shared || tail > 0));
        cg_ctx_free(&c);
    }
}

/* DeepSeek-V3.2 (assign_streams): in every layer's steps, the fork's event
 * (stream 1), then the indexer's launches (its wq_b GEMM, dsa_prologue_k,
 * the score and select) all on stream 1 while the q path's (q_b, the
 * prologue, qabsorb) run on stream 0, then the join's event (stream 0)
 * before the attention's kernel; every stream-1 step's scratch past stream
 * 0's region. At T=1 and T=64 (the score kernel's other grid). */
static void check_indexer_streams(const ir_module *m, const char *what)
{
    static const int buckets[] = {1, 64};
    int dsa = 0;
    for (int k = 0; k < m->n_ops; k++)
        dsa += m->ops[k]->kind == IR_OP_DSA_TOPK;
    for (int b = 0; b < 2 && dsa; b++) {
        cg_ctx c;
        if (!generate_default(m, buckets[b], &c))
            continue;
        cg_scratch_place_streams(&c);
        size_t base = (c.scratch_max[0] + 15) / 16 * 16;
        int fork = -1, join = -1, side = 0, main_q = 0, pairs = 0, attn = 0, bad = 0,
            scratch1 = 0, reported = 0;
        for (int i = 0; i < c.n_steps; i++) {
            const ir_step *s = &c.steps[i];
            const ir_op *op = s->op_id >= 0 ? m->ops[s->op_id] : NULL;
            for (int a = 0; a < s->n_args; a++)
                if (s->args[a].kind == IR_ARG_SCRATCH) {
                    bad += s->stream == 1 ? (size_t)s->args[a].i < base
                                          : (size_t)s->args[a].i >= base && c.scratch_max[1];
                    scratch1 += s->stream == 1;
                }
            if (!op)
                continue;
            int launch = s->kind == IR_STEP_KERNEL || s->kind == IR_STEP_GEMM;
            if (s->kind == IR_STEP_FORK && op->in[0]->def &&
                op->in[0]->def->kind == IR_OP_MLA_PROLOGUE_KV) {
                bad += s->stream != 1 || fork > join;
                fork = i;
                side = main_q = 0;
            } else if (s->kind == IR_STEP_JOIN && op->in[0]->def &&
                       op->in[0]->def->kind == IR_OP_DSA_TOPK) {
                /* wq_b, dsa_prologue_k, score, select (fp8: wk and weights_proj too) */
                /* the q path: q_b, the q prologue and the absorption (one
                   launch with the prologue's where a generated kernel runs it) */
                bad += s->stream != 0 || fork < join || side < 4 || main_q < 2;
                join = i;
                pairs++;
            } else if (launch && is_indexer_op(m, op)) {
                bad += s->stream != 1 || fork <= join;
                side++;
            } else if (launch && op->kind == IR_OP_MLA_ATTENTION) {
                /* its kernels come after the join, which came after the fork */
                bad += s->stream != 0 || join < fork || join < 0;
                attn += i == 0 || c.steps[i - 1].op_id != s->op_id;
            } else if (launch && fork > join) {
                /* inside the pair the main stream runs the q path, and
                   nothing but the indexer runs on stream 1 */
                bad += s->stream != 0;
                main_q++;
            }
            if (bad && !reported) {
                fprintf(stderr, "%s T=%d: step %d (%%%s, stream %d) out of place\n", what,
                        buckets[b], i, op->out[0]->name, s->stream);
                reported = 1;
            }
        }
        fprintf(stderr, "%s T=%d: %d indexer fork/join pairs, %d attentions after their join, "
                        "%d scratch operands on stream 1 past stream 0's %zu bytes\n",
                what, buckets[b], pairs, attn, scratch1, base);
        T_CHECK(bad == 0 && pairs == dsa && attn == dsa);
        cg_ctx_free(&c);
    }
}

/* At one token the side stream's GEMV steps (the shared experts' linears)
 * take the unused shared memory that leaves room for 3 of their blocks a
 * SM, 4 for fp8 weights (sm_90: 228 KiB, 1 KiB kept a block, the kernel's
 * own 256 bytes; cg_side_smem_pad); the main stream's take none. */
static void check_side_pads(const ir_module *m, const char *what)
{
    int side_linears = 0;
    for (int k = 0; k < m->n_ops; k++)
        side_linears += m->ops[k]->stream == 1 && m->ops[k]->kind == IR_OP_LINEAR;
    cg_options o;
    cg_options_default(&o);
    cg_ctx c;
    if (!generate(m, &o, 1, &c)) {
        cg_ctx_free(&c);
        return;
    }
    int side = 0;
    for (int i = 0; i < c.n_steps; i++) {
        const ir_step *s = &c.steps[i];
        const char *name = kname(&c, s);
        if (s->kind != IR_STEP_KERNEL || strncmp(name, "linear_gemv_", 12))
            continue;
        if (s->stream == 1) {
            int per_sm = strstr(name, "_f8e4m3") ? 4 : 3;
            side++;
            T_CHECK(per_sm * (s->smem + 1024 + 256) <= 228 * 1024 &&
                    (per_sm + 1) * (s->smem + 1024) > 228 * 1024);
        } else {
            T_CHECK(s->smem == 0);
        }
    }
    fprintf(stderr, "%s T=1: %d side-stream GEMV steps padded\n", what, side);
    T_CHECK((side > 0) == (side_linears > 0));
    cg_ctx_free(&c);
}

static void test_model(const char *name)
{
    ir_module *m = planned(load_model(name), load_model, name);
    if (!m)
        return;
    generate_and_compile(m, name);
    /* the lm_head GEMM writes the logits in f32 */
    cg_options o;
    cg_options_default(&o);
    cg_ctx c;
    ctx_init(&c, m, &o, 2);
    const ir_op *head = m->outputs[0]->def;
    T_CHECK(head && head->kind == IR_OP_LINEAR);
    if (head && head->kind == IR_OP_LINEAR) {
        T_OK(cg_emit_op(&c, head));
        /* T=2: the generated few-rows kernel, bf16 weight and input, f32 out */
        char want[160];
        /* rows per block: doubled up to 8 while 264 blocks remain */
        long long N = (long long)head->in[1]->type.dims[0];
        int rb = 1;
        while (rb < 8 && N / (2 * rb) >= 264)
            rb *= 2;
        snprintf(want, sizeof want, "linear_gemv_n%lld_k%lld_rb%d_t2_bf16_bf16_f32", N,
                 (long long)head->in[1]->type.dims[1], rb);
        T_CHECK(c.n_steps == 1 && c.steps[0].kind == IR_STEP_KERNEL &&
                !strcmp(kname(&c, &c.steps[0]), want) &&
                c.steps[0].grid[0] == (unsigned)((N + rb - 1) / rb));
    }
    cg_ctx_free(&c);
    int launches = check_no_alias_copies(m);
    fprintf(stderr, "%s: %d launches per step at T=1 (no reshape, fork or join copies)\n", name,
            launches);
    check_indexer_streams(m, name);
    check_side_pads(m, name);
    ir_module_free(m);
}

/* Launches at T=1 of the ops whose first result's name starts with pre
 * ("l1.": layer 1's attention, its MLP or MoE, and the residual
 * add_rms_norm that ends it). */
static int prefix_launches(const ir_module *m, const char *pre)
{
    cg_options o;
    cg_options_default(&o);
    cg_ctx c;
    int n = -1;
    if (generate(m, &o, 1, &c)) {
        size_t len = strlen(pre);
        n = 0;
        for (int i = 0; i < c.n_steps; i++) {
            const ir_step *s = &c.steps[i];
            if ((s->kind == IR_STEP_KERNEL || s->kind == IR_STEP_GEMM) && s->op_id >= 0 &&
                !strncmp(m->ops[s->op_id]->out[0]->name, pre, len))
                n++;
        }
    }
    cg_ctx_free(&c);
    return n;
}

/* The pipeline without the passes `drop` names (and, with no_align, codegen
 * without the moe_topk kernel that aligns the routed experts' slots:
 * MOEC_MOE_TOPK_ALIGN=0): the launches those save in the MoE layer (layer
 * 1) of a 2-layer config, which must be `saved`; those of V3.2's
 * indexer in that layer, with the whole pipeline and without them, when
 * indexer > 0. */
static void launches_saved(const char *json, const char *what, const char *const *drop,
                           int n_drop, int no_align, int saved, int indexer, int indexer_before)
{
    int n;
    const pass_info *pipe = pass_pipeline(&n);
    pass_info old[32];
    int n_old = 0;
    for (int i = 0; i < n && n_old < 32; i++) {
        int keep = 1;
        for (int j = 0; j < n_drop; j++)
            keep &= strcmp(pipe[i].name, drop[j]) != 0;
        if (keep)
            old[n_old++] = pipe[i];
    }
    ir_module *before = build_json(json), *after = build_json(json);
    if (before && after) {
        T_OK(pass_run_passes(before, old, n_old, NULL, NULL, NULL, NULL, NULL));
        T_OK(pass_run_pipeline(after, NULL, NULL, NULL, NULL, NULL));
        if (no_align)
            setenv("MOEC_MOE_TOPK_ALIGN", "0", 1);
        int b = prefix_launches(before, "l1.");
        unsetenv("MOEC_MOE_TOPK_ALIGN");
        int a = prefix_launches(after, "l1.");
        fprintf(stderr, "%s: %d launches per MoE layer at T=1, %d without %s%s%s%s\n", what, a, b,
                drop[0], n_drop > 1 ? " and the other fusions" : "",
                no_align ? " and the aligning moe_topk" : "", "");
        T_CHECK(a > 0 && b - a == saved);
        if (indexer > 0) {
            /* the indexer's own launches (its ops' results are l1.attn.indexer.*) */
            int ib = prefix_launches(before, "l1.attn.indexer."),
                ia = prefix_launches(after, "l1.attn.indexer.");
            fprintf(stderr, "%s: the indexer's launches per layer at T=1: %d, %d without %s\n",
                    what, ia, ib, drop[0]);
            T_CHECK(ia == indexer && ib == indexer_before);
        }
    }
    ir_module_free(before);
    ir_module_free(after);
}

/* fuse_moe_sum and fuse_silu_mul_linear in a 2-layer config's plan: no
 * moe_sum kernel anywhere; each add_rms_norm with an unsummed b runs the
 * summing kernel, one step; each act linear runs the few-token kernel with
 * silu_mul at T = 1, the tensor-core one with silu_mul at T = 8, and at
 * T = 16 the silu_mul kernel into scratch, then its GEMM reading that
 * scratch (bf16 weights) or, with fp8 weights (the pass leaves them), no
 * act at all. */
static void check_fused_kernels(const ir_module *m, const char *what)
{
    static const int buckets[] = {1, 8, 16};
    int uns = 0, acts = 0, routed = 0;
    for (int k = 0; k < m->n_ops; k++) {
        const ir_op *op = m->ops[k];
        uns += op->kind == IR_OP_ADD_RMS_NORM && op->in[1]->type.rank == 3;
        acts += op->kind == IR_OP_LINEAR && ir_op_attr(op, "act") != NULL;
        routed += op->kind == IR_OP_MOE_ROUTED;
    }
    T_CHECK(uns == routed);
    for (int b = 0; b < 3; b++) {
        cg_ctx c;
        if (!generate_default(m, buckets[b], &c))
            continue;
        /* as cg_plan_build places them: a shared expert's act linear runs
           on stream 1, whose scratch lies past stream 0's */
        cg_scratch_place_streams(&c);
        int sums = 0, gemv = 0, mma = 0, pre = 0, gemm = 0, stream1 = 0;
        for (int i = 0; i < c.n_kernels; i++)
            T_CHECK(strncmp(c.kernel_names[i], "moe_sum_", 8) != 0);
        for (int i = 0; i < c.n_steps; i++) {
            const ir_step *s = &c.steps[i];
            const ir_op *op = s->op_id >= 0 ? m->ops[s->op_id] : NULL;
            const char *kn = s->kind == IR_STEP_KERNEL ? c.kernel_names[s->kernel] : "";
            if (op && op->kind == IR_OP_ADD_RMS_NORM && op->in[1]->type.rank == 3)
                sums += strstr(kn, "_rms_norm_sum") != NULL;
            if (!op || op->kind != IR_OP_LINEAR || !ir_op_attr(op, "act"))
                continue;
            gemv += !strncmp(kn, "linear_gemv_", 12) && strstr(kn, "_silu_") != NULL;
            mma += !strncmp(kn, "linear_mma_", 11) && strstr(kn, "_silu_") != NULL;
            pre += !strncmp(kn, "silu_mul_r1_", 12);
            if (s->kind == IR_STEP_GEMM) {
                gemm++;
                /* it reads the silu_mul kernel's output: same stream, same place */
                T_CHECK(s->gemm.b.kind == IR_ARG_SCRATCH && i > 0 &&
                        c.steps[i - 1].stream == s->stream &&
                        c.steps[i - 1].args[1].kind == IR_ARG_SCRATCH &&
                        c.steps[i - 1].args[1].i == s->gemm.b.i);
                stream1 += s->stream == 1;
            }
        }
        fprintf(stderr, "%s T=%d: %d summing add_rms_norm, act linears: %d few-token, %d "
                        "tensor-core, %d silu_mul + GEMM (%d on stream 1)\n",
                what, buckets[b], sums, gemv, mma, gemm, stream1);
        T_CHECK(sums == uns);
        T_CHECK(gemv == (b == 0 ? acts : 0) && mma == (b == 1 ? acts : 0) &&
                pre == (b == 2 ? acts : 0) && gemm == (b == 2 ? acts : 0));
        cg_ctx_free(&c);
    }
}

/* A real config with 2 layers (one dense, one MoE: every specialization of
 * the full model); with fp8, quantized as DeepSeek-V3 publishes
 * (block-scaled e4m3 linears: partial blocks such as kv_a's 576 rows, the
 * fused qkv_a's 2112). */
static void config_case(const char *file, int fp8)
{
    char rel[256];
    snprintf(rel, sizeof rel, "tests/data/configs/%s", file);
    char *text = t_read_file(t_src(rel), NULL);
    cJSON *root = cJSON_Parse(text);
    free(text);
    T_CHECK(root != NULL);
    if (!root)
        return;
    cJSON_ReplaceItemInObject(root, "num_hidden_layers", cJSON_CreateNumber(2));
    if (fp8) {
        cJSON *q = cJSON_AddObjectToObject(root, "quantization_config");
        cJSON_AddStringToObject(q, "quant_method", "fp8");
        cJSON_AddStringToObject(q, "fmt", "e4m3");
        cJSON_AddStringToObject(q, "activation_scheme", "dynamic");
    }
    if (cJSON_GetObjectItem(root, "first_k_dense_replace"))
        cJSON_ReplaceItemInObject(root, "first_k_dense_replace", cJSON_CreateNumber(1));
    char *json = cJSON_Print(root);
    cJSON_Delete(root);
    ir_module *m = planned(build_json(json), build_json, json);
    if (m) {
        char what[300];
        snprintf(what, sizeof what, "%s%s (2 layers)", file, fp8 ? " fp8" : "");
        generate_and_compile(m, what);
        int launches = check_no_alias_copies(m);
        fprintf(stderr, "%s: %d launches per step at T=1\n", what, launches);
        check_fused_kernels(m, what);
        check_indexer_streams(m, what);
        check_mla_pro_plain(m, what, fp8, !strncmp(file, "deepseek", 8));
        check_side_prio(m, what, fp8, !strncmp(file, "deepseek", 8));
        if (fp8)
            check_linear_warps(m, what, !strcmp(file, "deepseek_v2_lite.json"));
        /* the prologue's kernel replaces nine (slices, norms, ropes, the
           cache write), the add_rms_norm the expert sum's add
           and the routed sum over k, the shared expert's down projection its
           silu_mul (not of fp8 weights: the pass leaves those), the
           moe_topk's kernel the align and, where the router's weight is at
           most 2 MiB (V2-Lite's 64 x 2048, not V3's 256 x 7168), the
           router's linear, and the prologue's kernel also runs the q
           absorption at a token or two (issue 15) */
        static const char *const i15[] = {"fuse_mla_prologue", "fuse_add3_rms_norm",
                                          "fuse_moe_sum", "fuse_silu_mul_linear"};
        static const char *const i12[] = {"fuse_dsa_indexer"};
        int v32 = strstr(file, "v32") != NULL;
        if (!strncmp(file, "deepseek", 8))
            launches_saved(json, what, i15, 4, 1,
                           14 - (fp8 ? 1 : 0) + !strncmp(file, "deepseek_v2", 11), 0, 0);
        /* V3.2's indexer: dsa_prologue_k replaces the key's slice,
           layer_norm, rope and cache write; dsa_topk q's rope and the slices
           of the head weights: 9 launches a layer, then 4 with wq_b's GEMM
           (issue 12). In fp8 weights_proj (bf16: not quantized) stays a
           linear of its own: 5; wk joins q_a and kv_a (576 rows, 4.5 blocks)
           in blocks of 64 rows (pass_fuse's join_rows) */
        if (v32)
            launches_saved(json, what, i12, 1, 0, fp8 ? 4 : 5, fp8 ? 5 : 4, 9);
        /* Qwen3's attn_prologue replaces eight launches (the slices of q, k
           and v, the q and k norms and ropes, the attention's cache write)
           with one, which the one-token bucket's attention kernel runs
           itself (MOEC_ATTN_FUSE_PROLOGUE, default 1): 8 saved at T = 1 */
        static const char *const gqa[] = {"fuse_attn_prologue"};
        if (!strncmp(file, "qwen3", 5))
            launches_saved(json, what, gqa, 1, 0, 8, 0, 0);
        ir_module_free(m);
    }
    free(json);
}

static void test_config(const char *file) { config_case(file, 0); }
static void test_config_fp8(const char *file) { config_case(file, 1); }

static void test_plan_errors(void)
{
    ir_module *m = load_model("qwen3_moe");
    if (!m)
        return;
    ir_plan *p = (ir_plan *)1;
    T_ERR(cg_plan_build(m, NULL, &p), MOEC_ERR_INVALID_ARG, "arena_bytes_per_token");
    T_CHECK(p == NULL);
    plan_trivially(m);
    ir_value *v = ir_module_find_value(m, "l1.attn.q");
    T_CHECK(v != NULL);
    if (v) {
        int64_t keep = v->mem_offset;
        v->mem_offset = -1;
        T_ERR(cg_plan_build(m, NULL, &p), MOEC_ERR_INVALID_ARG, "%l1.attn.q has no arena offset");
        v->mem_offset = keep + 8;
        T_ERR(cg_plan_build(m, NULL, &p), MOEC_ERR_INVALID_ARG, "%l1.attn.q at");
        v->mem_offset = keep;
    }
    cg_options o;
    cg_options_default(&o);
    o.buckets[3] = 2;
    T_ERR(cg_plan_build(m, &o, &p), MOEC_ERR_INVALID_ARG, "buckets must ascend");
    cg_options_default(&o);
    o.compute_dtype = IR_DTYPE_F32;
    T_OK(ir_module_set_meta_str(m, "compute_dtype", "bf16"));
    T_ERR(cg_plan_build(m, &o, &p), MOEC_ERR_INVALID_ARG, "compute dtype bf16, not f32");
    ir_module_free(m);
}

/* Everything but the whole models. */
/* The collectives of a sharded module as steps: reduce_scatter and
 * all_to_all along the hidden axis. Several tokens: a kernel packs each
 * rank's columns of every row together in scratch, then the collective
 * step (all_to_all into a second scratch buffer, whose blocks the gather
 * kernel puts in place); one token: the step reads x as it is. Every
 * kernel compiles with NVRTC. */
static const char COLL_IR[] =
    "module coll {\n"
    "  input %tokens : i32[T]\n"
    "  weight %embed : f32[256, 64] = \"e\"\n"
    "  %x : f32[T, 64] = embedding(%tokens, %embed)\n"
    "  %s : f32[T, 32] = reduce_scatter(%x) {axis = 1, ranks = 2}\n"
    "  %a : f32[T, 32] = all_to_all(%s) {axis = 1, ranks = 2}\n"
    "  %g : f32[T, 64] = all_gather(%a) {axis = 1, ranks = 2}\n"
    "  %r : f32[T, 64] = all_reduce(%g) {ranks = 2}\n"
    "  %lg : f32[T, 256] = linear(%r, %embed)\n"
    "  output %lg\n"
    "}\n";

static void test_collective_steps(void)
{
    ir_module *m = NULL;
    T_OK(ir_module_parse(COLL_IR, "coll.mir", &m));
    if (!m)
        return;
    plan_trivially(m);
    cg_options o;
    cg_options_default(&o);
    o.compute_dtype = IR_DTYPE_F32;
    for (int T = 1; T <= 8; T += 7) {
        cg_ctx c;
        ctx_init(&c, m, &o, T);
        for (int k = 0; k < m->n_ops; k++)
            T_OK(cg_emit_op(&c, m->ops[k]));
        check_steps(&c);
        int first, n = steps_of(&c, op_of(m, "s")->id, &first);
        const ir_step *st = first >= 0 ? &c.steps[first] : NULL;
        if (T == 1) {
            T_CHECK(n == 1 && st->kind == IR_STEP_COLLECTIVE && st->coll.op == IR_OP_REDUCE_SCATTER &&
                    st->coll.count == 32 && st->coll.ranks == 2 &&
                    is_arg(st->coll.send, IR_ARG_ACT, vid(&c, "x")) &&
                    is_arg(st->coll.recv, IR_ARG_ACT, vid(&c, "s")));
            n = steps_of(&c, op_of(m, "a")->id, &first);
            st = &c.steps[first];
            T_CHECK(n == 1 && st->coll.op == IR_OP_ALL_TO_ALL && st->coll.count == 16 &&
                    is_arg(st->coll.send, IR_ARG_ACT, vid(&c, "s")) &&
                    is_arg(st->coll.recv, IR_ARG_ACT, vid(&c, "a")));
        } else {
            /* pack x (8 rows, 2 blocks of 32), reduce-scatter from scratch into s */
            T_CHECK(n == 2 && !strcmp(kname(&c, st), "scatter_pack_r2_o8_b32_f32_f32") &&
                    st->grid[0] == 2 && is_arg(st->args[0], IR_ARG_ACT, vid(&c, "x")) &&
                    st->args[1].kind == IR_ARG_SCRATCH);
            const ir_step *rs = st + 1;
            T_CHECK(n == 2 && rs->kind == IR_STEP_COLLECTIVE &&
                    rs->coll.op == IR_OP_REDUCE_SCATTER && rs->coll.count == 8 * 32 &&
                    rs->coll.send.kind == IR_ARG_SCRATCH &&
                    rs->coll.send.i == st->args[1].i &&
                    is_arg(rs->coll.recv, IR_ARG_ACT, vid(&c, "s")));
            /* pack s, exchange into a second buffer, put the blocks in place */
            n = steps_of(&c, op_of(m, "a")->id, &first);
            const ir_step *p = &c.steps[first], *x = p + 1, *g = p + 2;
            T_CHECK(n == 3 && !strcmp(kname(&c, p), "scatter_pack_r2_o8_b16_f32_f32") &&
                    x->kind == IR_STEP_COLLECTIVE && x->coll.op == IR_OP_ALL_TO_ALL &&
                    x->coll.count == 8 * 16 && x->coll.send.kind == IR_ARG_SCRATCH &&
                    x->coll.send.i == p->args[1].i &&
                    x->coll.recv.kind == IR_ARG_SCRATCH &&
                    x->coll.recv.i >= x->coll.send.i + 2 * 8 * 16 * 4 &&
                    !strcmp(kname(&c, g), "gather_r2_o8_i16_f32_f32") &&
                    g->args[0].kind == IR_ARG_SCRATCH && g->args[0].i == x->coll.recv.i &&
                    is_arg(g->args[1], IR_ARG_ACT, vid(&c, "a")));
            compile_src(c.src.data, "the collectives' kernels");
        }
        /* the all_reduce: one NCCL step, and the one-shot kernel in the
         * program, launched by no step (the runtime finds it by name) */
        n = steps_of(&c, op_of(m, "r")->id, &first);
        T_CHECK(n == 1 && c.steps[first].kind == IR_STEP_COLLECTIVE &&
                c.steps[first].coll.op == IR_OP_ALL_REDUCE && c.steps[first].coll.count == T * 64);
        int named = 0;
        for (int k = 0; k < c.n_kernels; k++)
            named += !strcmp(c.kernel_names[k], "allreduce_oneshot_r2_f32");
        T_CHECK(named == 1);
        cg_ctx_free(&c);
    }
    ir_module_free(m);
    /* the one-shot kernel in the other dtypes and rank counts compiles */
    moec_buf src = {0};
    cg_emit_prologue(&src);
    cg_oneshot_source(&src, 2, IR_DTYPE_BF16);
    cg_oneshot_source(&src, 8, IR_DTYPE_BF16);
    cg_oneshot_source(&src, 4, IR_DTYPE_F16);
    T_CHECK(src.data && strstr(src.data, "allreduce_oneshot_r8_bf16(const __nv_bfloat16 *__restrict__ x"));
    compile_src(src.data, "the one-shot all-reduce kernels");
    moec_buf_free(&src);
}

static void test_units(const char *unused)
{
    (void)unused;
    test_cache();
    test_compile_error();
    /* the GEMM steps' form and meaning, with every bucket on cuBLASLt */
    setenv("MOEC_GEMV_MAX_T", "0", 1);
    setenv("MOEC_LINEAR_MMA_MAX_T", "0", 1);
    setenv("MOEC_LINEAR_TC_MAX_T", "0", 1);
    test_unit_ops();
    test_gemm_semantics();
    test_absorb_kernels();
    unsetenv("MOEC_GEMV_MAX_T");
    unsetenv("MOEC_LINEAR_MMA_MAX_T");
    unsetenv("MOEC_LINEAR_TC_MAX_T");
    test_gemv();
    test_aliases();
    test_add_rms_norm();
    test_storage();
    test_plan_errors();
    test_collective_steps();
}

typedef struct part {
    const char *name;
    void (*run)(const char *arg);
    const char *arg;
} part;
#define PART(name, run, arg) {name, run, arg}

/* ctest runs each part as its own test, test_codegen_NAME (tests/CMakeLists.txt
 * reads the PART lines), so that none nears the timeout on a busy machine
 * and ctest -j spreads the NVRTC compiles. */
static const part PARTS[] = {
    PART("units", test_units, NULL),
    PART("deepseek_v2", test_model, "deepseek_v2"),
    PART("deepseek_v2_qlora", test_model, "deepseek_v2_qlora"),
    PART("deepseek_v3", test_model, "deepseek_v3"),
    PART("qwen2_moe", test_model, "qwen2_moe"),
    PART("qwen3_moe", test_model, "qwen3_moe"),
    PART("deepseek_v32", test_model, "deepseek_v32"),
    PART("config_deepseek_v2_lite", test_config, "deepseek_v2_lite.json"),
    PART("config_deepseek_v3", test_config, "deepseek_v3.json"),
    PART("config_qwen3_30b_a3b", test_config, "qwen3_30b_a3b.json"),
    PART("config_deepseek_v32", test_config, "deepseek_v32.json"),
    PART("config_deepseek_v2_lite_fp8", test_config_fp8, "deepseek_v2_lite.json"),
    PART("config_deepseek_v3_fp8", test_config_fp8, "deepseek_v3.json"),
    PART("config_qwen3_30b_a3b_fp8", test_config_fp8, "qwen3_30b_a3b.json"),
    PART("config_deepseek_v32_fp8", test_config_fp8, "deepseek_v32.json"),
};
enum { N_PARTS = sizeof PARTS / sizeof PARTS[0] };

/* test_codegen [PART]: that part, or (without one) all of them. */
int main(int argc, char **argv)
{
    double t0 = now();
    int only = -1;
    for (int i = 0; argc > 1 && i < N_PARTS; i++)
        if (!strcmp(argv[1], PARTS[i].name))
            only = i;
    if (argc > 2 || (argc == 2 && only < 0)) {
        fprintf(stderr, "usage: test_codegen [PART]; parts:");
        for (int i = 0; i < N_PARTS; i++)
            fprintf(stderr, " %s", PARTS[i].name);
        fprintf(stderr, "\n");
        return 2;
    }
    /* A fresh cache, so that CI really compiles; MOEC_CODEGEN_TEST_CACHE
     * names a kept one (to rerun under valgrind without NVRTC's time). */
    const char *keep = getenv("MOEC_CODEGEN_TEST_CACHE");
    snprintf(g_cache, sizeof g_cache, "%s", keep && *keep ? keep : t_tmpdir("cg-cubin"));
    if (!HAVE_NVRTC)
        fprintf(stderr, "SKIP: no NVRTC compile checks: moec was built without the CUDA toolkit\n");
    for (int i = 0; i < N_PARTS; i++)
        if (only < 0 || only == i)
            PARTS[i].run(PARTS[i].arg);
    if (g_missing)
        fprintf(stderr, "note: %d ops still have placeholder emitters (not implemented yet)\n",
                g_missing);
    if (!(keep && *keep))
        remove_dir(g_cache);
    fprintf(stderr, "test_codegen %s: %.1f s\n", only < 0 ? "(every part)" : argv[1], now() - t0);
    return t_finish("test_codegen");
}
