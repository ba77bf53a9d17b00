/* nvrtc.c — CUDA C source to a cubin with NVRTC, through an on-disk cache
 * keyed by a hash of the source, the options and the NVRTC version, so
 * that recompiling an unchanged model costs a file read. A cache entry
 * carries its own length and checksum: a truncated or corrupt one is
 * recompiled and replaced. A compile error keeps NVRTC's log and the
 * numbered source in a file beside the cache, since the error string is
 * too short for them. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "codegen/cg.h"
#include "err.h"
#include "hash.h"

#ifdef MOEC_HAVE_CUDA

#include <dlfcn.h>
#include <nvrtc.h>
#include <pthread.h>

#ifndef MOEC_NVRTC_SOVERSION
#define MOEC_NVRTC_SOVERSION "13"
#endif

#define CACHE_MAGIC "MOECCUB1"
#define KEY_LEN 32 /* hex digits of the 128-bit key */

/* ---- hashing -------------------------------------------------------------- */

typedef struct key_hash {
    uint64_t a, b; /* FNV-1a 64 from two offset bases: a 128-bit key */
} key_hash;

static void hash_init(key_hash *h)
{
    h->a = 0xcbf29ce484222325ull;
    h->b = 0x84222325cbf29ce4ull;
}

/* Hashes the bytes and a terminating 0, so that ("ab", "c") != ("a", "bc"). */
static void hash_str(key_hash *h, const char *s)
{
    const unsigned char *p = (const unsigned char *)s;
    for (;; p++) {
        h->a = (h->a ^ *p) * 0x100000001b3ull;
        h->b = (h->b ^ *p ^ 0x5a) * 0x100000001b3ull;
        if (!*p)
            break;
    }
}

/* ---- the cache directory -------------------------------------------------- */

/* The cache directory into buf: dir, else $MOEC_CACHE_DIR, else
 * $HOME/.cache/moec/cubin; 0 when there is none. */
static int cache_dir_path(const char *dir, char *buf, size_t cap)
{
    const char *env = getenv("MOEC_CACHE_DIR");
    const char *home = getenv("HOME");
    int n;
    if (dir && *dir)
        n = snprintf(buf, cap, "%s", dir);
    else if (env && *env)
        n = snprintf(buf, cap, "%s", env);
    else if (home && *home)
        n = snprintf(buf, cap, "%s/.cache/moec/cubin", home);
    else
        return 0;
    return n > 0 && (size_t)n < cap;
}

/* mkdir -p; 0 when the directory exists afterwards. */
static int make_dirs(const char *path)
{
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s", path) >= (int)sizeof tmp)
        return -1;
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(tmp, 0777) != 0 && errno != EEXIST)
            return -1;
        *p = '/';
    }
    if (mkdir(tmp, 0777) != 0 && errno != EEXIST)
        return -1;
    struct stat sb;
    return stat(tmp, &sb) == 0 && S_ISDIR(sb.st_mode) ? 0 : -1;
}

/* Cache entry: magic, key, u64 payload size, u64 FNV-1a 64 of the payload,
 * then the cubin. Returns 1 and the payload when the entry is whole. */
static int cache_read(const char *path, const char *key, void **cubin, size_t *size)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return 0;
    char magic[8], k[KEY_LEN];
    uint64_t n = 0, sum = 0;
    void *data = NULL;
    int ok = fread(magic, 1, 8, f) == 8 && !memcmp(magic, CACHE_MAGIC, 8) &&
             fread(k, 1, KEY_LEN, f) == KEY_LEN && !memcmp(k, key, KEY_LEN) &&
             fread(&n, sizeof n, 1, f) == 1 && fread(&sum, sizeof sum, 1, f) == 1 && n > 0 &&
             n < ((uint64_t)1 << 32);
    if (ok) {
        data = malloc((size_t)n);
        ok = data && fread(data, 1, (size_t)n, f) == n && fgetc(f) == EOF &&
             moec_fnv1a(MOEC_FNV_SEED, data, (size_t)n) == sum;
    }
    fclose(f);
    if (!ok) {
        free(data);
        return 0;
    }
    *cubin = data;
    *size = (size_t)n;
    return 1;
}

/* Writes the entry through a temporary file renamed into place, so that a
 * reader never sees half of it. Failing to cache is not an error. */
static void cache_write(const char *dir, const char *path, const char *key, const void *cubin,
                        size_t size)
{
    char tmp[4200];
    if (make_dirs(dir) != 0 || snprintf(tmp, sizeof tmp, "%s.XXXXXX", path) >= (int)sizeof tmp)
        return;
    int fd = mkstemp(tmp);
    if (fd < 0)
        return;
    FILE *f = fdopen(fd, "wb");
    if (!f) {
        close(fd);
        unlink(tmp);
        return;
    }
    uint64_t n = size, sum = moec_fnv1a(MOEC_FNV_SEED, cubin, size);
    int ok = fwrite(CACHE_MAGIC, 1, 8, f) == 8 && fwrite(key, 1, KEY_LEN, f) == KEY_LEN &&
             fwrite(&n, sizeof n, 1, f) == 1 && fwrite(&sum, sizeof sum, 1, f) == 1 &&
             fwrite(cubin, 1, size, f) == size;
    ok = fclose(f) == 0 && ok;
    if (!ok || rename(tmp, path) != 0)
        unlink(tmp);
}

/* ---- compile errors ------------------------------------------------------- */

/* Appends line `no` (1-based) of src to out as "  12| text". */
static void numbered_line(moec_buf *out, const char *src, int no, int max_chars)
{
    const char *p = src;
    for (int l = 1; l < no && p; l++) {
        p = strchr(p, '\n');
        if (p)
            p++;
    }
    if (!p || !*p)
        return;
    const char *e = strchr(p, '\n');
    int len = e ? (int)(e - p) : (int)strlen(p);
    moec_buf_printf(out, "%4d| %.*s%s\n", no, len < max_chars ? len : max_chars, p,
                  len > max_chars ? " ..." : "");
}

/* The log and the whole source, numbered, into <dir>/failed-<key>.cu.txt;
 * 0 and the path in path when written. */
static int write_failure(const char *dir, const char *key, const char *arch, const char *log,
                         const char *src, char *path, size_t cap)
{
    if (make_dirs(dir) != 0 || snprintf(path, cap, "%s/failed-%s.cu.txt", dir, key) >= (int)cap)
        return -1;
    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    int ok = fprintf(f, "NVRTC log (--gpu-architecture=%s):\n%s\nsource:\n", arch, log) >= 0;
    int no = 1;
    for (const char *p = src; ok && *p; no++) {
        const char *e = strchr(p, '\n');
        int len = e ? (int)(e - p) : (int)strlen(p);
        ok = fprintf(f, "%4d| %.*s\n", no, len, p) >= 0;
        p = e ? e + 1 : p + len;
    }
    return fclose(f) == 0 && ok ? 0 : -1;
}

/* The first source line an NVRTC log complains about ("prog.cu(12): error"); 0 if none. */
static int first_error_line(const char *log)
{
    for (const char *p = strstr(log, ".cu("); p; p = strstr(p + 1, ".cu(")) {
        char *end;
        long no = strtol(p + 4, &end, 10);
        if (end != p + 4 && *end == ')' && no > 0 && no < 1000000000)
            return (int)no;
    }
    return 0;
}

/* MOEC_ERR_CUDA with the file holding everything, the first lines of the
 * log and the source lines around the first error. */
static moec_status compile_error(const char *dir, const char *key, const char *arch,
                                 const char *log, const char *src, const char *hint)
{
    char path[4200] = "";
    int saved = write_failure(dir, key, arch, log, src, path, sizeof path) == 0;
    moec_buf msg = {0};
    moec_buf_printf(&msg, "NVRTC could not compile the program for %s (%s%s)%s:\n", arch,
                  saved ? "full log and numbered source in " : "could not save the log in ",
                  saved ? path : dir, hint);
    int len = (int)strlen(log), shown = 0;
    for (const char *p = log; *p && shown < 12 && p - log < 1400; shown++) {
        const char *e = strchr(p, '\n');
        int n = e ? (int)(e - p) : (int)strlen(p);
        moec_buf_printf(&msg, "%.*s\n", n < 300 ? n : 300, p);
        p = e ? e + 1 : p + n;
        if (p - log >= len)
            break;
    }
    int at = first_error_line(log);
    if (at > 0) {
        moec_buf_printf(&msg, "source around line %d:\n", at);
        for (int l = at > 3 ? at - 3 : 1; l <= at + 2; l++)
            numbered_line(&msg, src, l, 160);
    }
    moec_status st = MOEC_ERR(MOEC_ERR_CUDA, "%s", msg.data ? msg.data : "NVRTC compile failed");
    moec_buf_free(&msg);
    return st;
}

/* ---- NVRTC ---------------------------------------------------------------- */

/* ---- the NVRTC library ------------------------------------------------------
 * Opened with dlopen on first use rather than linked, so that programs built
 * with the compiler start (and run their CPU paths) without loading NVRTC,
 * and a machine without it gets an error naming what was tried. */

typedef struct nvrtc_api {
    nvrtcResult (*Version)(int *, int *);
    nvrtcResult (*CreateProgram)(nvrtcProgram *, const char *, const char *, int,
                                 const char *const *, const char *const *);
    nvrtcResult (*CompileProgram)(nvrtcProgram, int, const char *const *);
    nvrtcResult (*GetProgramLogSize)(nvrtcProgram, size_t *);
    nvrtcResult (*GetProgramLog)(nvrtcProgram, char *);
    nvrtcResult (*GetCUBINSize)(nvrtcProgram, size_t *);
    nvrtcResult (*GetCUBIN)(nvrtcProgram, char *);
    nvrtcResult (*DestroyProgram)(nvrtcProgram *);
    const char *(*GetErrorString)(nvrtcResult);
    void *handle;
    char error[1024];
} nvrtc_api;

static nvrtc_api nvrtc;
static pthread_once_t nvrtc_once = PTHREAD_ONCE_INIT;

static void nvrtc_open(void)
{
    static const char *const names[] = {"libnvrtc.so." MOEC_NVRTC_SOVERSION, "libnvrtc.so",
                                        "/usr/local/cuda/lib64/libnvrtc.so"};
    for (size_t i = 0; i < sizeof names / sizeof *names && !nvrtc.handle; i++)
        nvrtc.handle = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!nvrtc.handle) {
        snprintf(nvrtc.error, sizeof nvrtc.error,
                 "cannot load NVRTC (tried %s, libnvrtc.so, /usr/local/cuda/lib64/libnvrtc.so): %s",
                 names[0], dlerror());
        return;
    }
#define NVRTC_SYM(field, sym)                                                                      \
    do {                                                                                           \
        *(void **)&nvrtc.field = dlsym(nvrtc.handle, #sym);                                         \
        if (!nvrtc.field) {                                                                        \
            snprintf(nvrtc.error, sizeof nvrtc.error, "NVRTC lacks %s", #sym);                     \
            return;                                                                                \
        }                                                                                          \
    } while (0)
    NVRTC_SYM(Version, nvrtcVersion);
    NVRTC_SYM(CreateProgram, nvrtcCreateProgram);
    NVRTC_SYM(CompileProgram, nvrtcCompileProgram);
    NVRTC_SYM(GetProgramLogSize, nvrtcGetProgramLogSize);
    NVRTC_SYM(GetProgramLog, nvrtcGetProgramLog);
    NVRTC_SYM(GetCUBINSize, nvrtcGetCUBINSize);
    NVRTC_SYM(GetCUBIN, nvrtcGetCUBIN);
    NVRTC_SYM(DestroyProgram, nvrtcDestroyProgram);
    NVRTC_SYM(GetErrorString, nvrtcGetErrorString);
#undef NVRTC_SYM
}

static moec_status nvrtc_load(void)
{
    pthread_once(&nvrtc_once, nvrtc_open);
    if (nvrtc.error[0])
        return MOEC_ERR(MOEC_ERR_UNSUPPORTED, "%s", nvrtc.error);
    return MOEC_OK;
}

#define CHECK_NVRTC(call)                                                                          \
    do {                                                                                           \
        nvrtcResult r_ = (call);                                                                   \
        if (r_ != NVRTC_SUCCESS) {                                                                 \
            st = MOEC_ERR(MOEC_ERR_CUDA, "%s failed: %s", #call, nvrtc.GetErrorString(r_));         \
            goto out;                                                                              \
        }                                                                                          \
    } while (0)

static int has_bf16_header(const char *dir)
{
    char p[4200];
    if (snprintf(p, sizeof p, "%s/cuda_bf16.h", dir) >= (int)sizeof p)
        return 0;
    return access(p, R_OK) == 0;
}

/* The CUDA include directory generated code's #include <cuda_bf16.h> needs
 * (NVRTC has no built-in search path): the build's toolkit, $CUDA_HOME or
 * $CUDA_PATH, beside the NVRTC library in use, or /usr/local/cuda. */
static int cuda_include_dir(char *buf, size_t cap)
{
    const char *cands[4] = {NULL, NULL, NULL, "/usr/local/cuda/include"};
    char env1[4096], env2[4096], lib[4096];
#ifdef MOEC_CUDA_INCLUDE_DIR
    if (has_bf16_header(MOEC_CUDA_INCLUDE_DIR))
        return snprintf(buf, cap, "%s", MOEC_CUDA_INCLUDE_DIR) < (int)cap;
#endif
    const char *h = getenv("CUDA_HOME"), *p = getenv("CUDA_PATH");
    if (h && snprintf(env1, sizeof env1, "%s/include", h) < (int)sizeof env1)
        cands[0] = env1;
    if (p && snprintf(env2, sizeof env2, "%s/include", p) < (int)sizeof env2)
        cands[1] = env2;
    Dl_info info;
    if (nvrtc.Version && dladdr(*(void **)&nvrtc.Version, &info) && info.dli_fname) {
        const char *slash = strrchr(info.dli_fname, '/');
        if (slash && snprintf(lib, sizeof lib, "%.*s/../include", (int)(slash - info.dli_fname),
                              info.dli_fname) < (int)sizeof lib)
            cands[2] = lib;
    }
    for (int i = 0; i < 4; i++)
        if (cands[i] && has_bf16_header(cands[i]))
            return snprintf(buf, cap, "%s", cands[i]) < (int)cap;
    return 0;
}

static int valid_arch(const char *arch)
{
    if (strncmp(arch, "sm_", 3) != 0 || !arch[3])
        return 0;
    for (const char *p = arch + 3; *p; p++)
        if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'z')))
            return 0;
    return arch[3] >= '1' && arch[3] <= '9';
}

moec_status cg_compile(const char *src, const char *arch, const char *cache_dir, void **cubin,
                       size_t *size)
{
    if (!src || !arch || !cubin || !size)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "cg_compile: NULL argument");
    *cubin = NULL;
    *size = 0;
    if (strlen(arch) >= 16 || !valid_arch(arch))
        return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                        "cg_compile: target arch \"%s\" is not a real GPU arch like sm_90", arch);
    MOEC_TRY(nvrtc_load());
    int major = 0, minor = 0;
    nvrtcResult vr = nvrtc.Version(&major, &minor);
    if (vr != NVRTC_SUCCESS)
        return MOEC_ERR(MOEC_ERR_CUDA, "nvrtcVersion failed: %s", nvrtc.GetErrorString(vr));
    char version[64], opt_arch[64], opt_inc[4200], inc[4096];
    snprintf(version, sizeof version, "nvrtc %d.%d", major, minor);
    snprintf(opt_arch, sizeof opt_arch, "--gpu-architecture=%s", arch);
    /* -default-device: a lambda in a kernel (codegen/attention.c's body
       variants) is device code, as nvcc takes it */
    const char *opts[5] = {opt_arch, "--std=c++17", "-default-device", NULL, NULL};
    int n_opts = 3;
    int have_inc = cuda_include_dir(inc, sizeof inc);
    if (have_inc) {
        snprintf(opt_inc, sizeof opt_inc, "-I%s", inc);
        opts[n_opts++] = opt_inc;
    }
    /* MOEC_NVRTC_FAST=min|mid|max: NVRTC's --Ofast-compile (12.8 on; an
       older NVRTC compiles as without it), fewer optimizations for a
       faster compile (the CPU tests: kernels that must compile, not run
       fast); part of the cache key either way */
    char opt_fast[32] = "";
    const char *fast = getenv("MOEC_NVRTC_FAST");
    if (fast && *fast && strcmp(fast, "0") != 0) {
        if (strcmp(fast, "min") != 0 && strcmp(fast, "mid") != 0 && strcmp(fast, "max") != 0)
            return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                            "MOEC_NVRTC_FAST=\"%.32s\": not min, mid, max or 0", fast);
        snprintf(opt_fast, sizeof opt_fast, "--Ofast-compile=%s", fast);
        if (major * 100 + minor >= 1208)
            opts[n_opts++] = opt_fast;
    }

    key_hash h;
    hash_init(&h);
    hash_str(&h, version);
    for (int i = 0; i < n_opts; i++)
        hash_str(&h, opts[i]);
    if (*opt_fast && opts[n_opts - 1] != opt_fast)
        hash_str(&h, opt_fast);
    hash_str(&h, src);
    char key[KEY_LEN + 1];
    snprintf(key, sizeof key, "%016llx%016llx", (unsigned long long)h.a, (unsigned long long)h.b);

    /* MOEC_DUMP_CUDA=DIR: each module's source as DIR/<cache key>.cu, to read */
    const char *dump = getenv("MOEC_DUMP_CUDA");
    if (dump && *dump) {
        char dpath[4200];
        snprintf(dpath, sizeof dpath, "%s/%s.cu", dump, key);
        FILE *f = fopen(dpath, "w");
        int ok = f && fputs(src, f) >= 0;
        if (f && fclose(f) != 0)
            ok = 0;
        if (!ok)
            return MOEC_ERR(MOEC_ERR_IO, "MOEC_DUMP_CUDA: cannot write %s", dpath);
    }

    char dir[4096], path[4200];
    int have_dir = cache_dir_path(cache_dir, dir, sizeof dir) &&
                   snprintf(path, sizeof path, "%s/%s.cubin", dir, key) < (int)sizeof path;
    if (!have_dir)
        snprintf(dir, sizeof dir, "%s", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (have_dir && cache_read(path, key, cubin, size))
        return MOEC_OK;

    moec_status st = MOEC_OK;
    nvrtcProgram prog = NULL;
    char *log = NULL, *bin = NULL;
    char prog_name[64];
    snprintf(prog_name, sizeof prog_name, "moec_%.16s.cu", key);
    CHECK_NVRTC(nvrtc.CreateProgram(&prog, src, prog_name, 0, NULL, NULL));
    nvrtcResult cr = nvrtc.CompileProgram(prog, n_opts, opts);
    if (cr != NVRTC_SUCCESS) {
        size_t log_size = 0;
        CHECK_NVRTC(nvrtc.GetProgramLogSize(prog, &log_size));
        log = malloc(log_size + 1);
        if (!log) {
            st = MOEC_ERR(MOEC_ERR_OOM, "out of memory reading the NVRTC log");
            goto out;
        }
        CHECK_NVRTC(nvrtc.GetProgramLog(prog, log));
        log[log_size] = '\0';
        if (cr == NVRTC_ERROR_COMPILATION)
            st = compile_error(dir, key, arch, log, src,
                               have_inc ? ""
                                        : " (no CUDA include directory with cuda_bf16.h was "
                                          "found: set CUDA_HOME)");
        else
            st = MOEC_ERR(MOEC_ERR_CUDA, "nvrtcCompileProgram (%s) failed: %s: %.1000s", opt_arch,
                          nvrtc.GetErrorString(cr), log);
        goto out;
    }
    size_t n = 0;
    CHECK_NVRTC(nvrtc.GetCUBINSize(prog, &n));
    if (n == 0) {
        st = MOEC_ERR(MOEC_ERR_CUDA, "NVRTC produced an empty cubin for %s", arch);
        goto out;
    }
    bin = malloc(n);
    if (!bin) {
        st = MOEC_ERR(MOEC_ERR_OOM, "out of memory for a %zu-byte cubin", n);
        goto out;
    }
    CHECK_NVRTC(nvrtc.GetCUBIN(prog, bin));
    if (have_dir)
        cache_write(dir, path, key, bin, n);
    *cubin = bin;
    *size = n;
    bin = NULL;
out:
    if (prog) {
        nvrtcResult dr = nvrtc.DestroyProgram(&prog);
        if (dr != NVRTC_SUCCESS && st == MOEC_OK) {
            free(*cubin);
            *cubin = NULL;
            *size = 0;
            st = MOEC_ERR(MOEC_ERR_CUDA, "nvrtcDestroyProgram failed: %s", nvrtc.GetErrorString(dr));
        }
    }
    free(log);
    free(bin);
    return st;
}

#else

moec_status cg_compile(const char *src, const char *arch, const char *cache_dir, void **cubin,
                       size_t *size)
{
    (void)src;
    (void)arch;
    (void)cache_dir;
    if (cubin)
        *cubin = NULL;
    if (size)
        *size = 0;
    return MOEC_ERR(MOEC_ERR_UNSUPPORTED,
                    "cg_compile: moec was built without NVRTC (no CUDA toolkit found by CMake)");
}

#endif
