/* testlib.c — shared test helpers (see testlib.h). */
#include "testlib.h"

#include <errno.h>
#include <math.h>
#include <string.h>
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

const char *t_tmpdir(const char *tag)
{
    const char *tmp = getenv("TMPDIR");
    char *b = t_ring();
    snprintf(b, 4096, "%s/moec-%s-XXXXXX", tmp ? tmp : "/tmp", tag);
    if (!mkdtemp(b)) {
        fprintf(stderr, "mkdtemp %s: %s\n", b, strerror(errno));
        exit(2);
    }
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
