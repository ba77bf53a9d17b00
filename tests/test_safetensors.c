/* test_safetensors.c — the safetensors reader and writer: round trips, every
 * malformed-header case with its exact error, and directory layouts (index
 * with shards, a single model.safetensors, a set of *.safetensors). */
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/safetensors.h"
#include "testlib.h"

static char *path_in(const char *dir, const char *name)
{
    static char bufs[8][4096];
    static int next;
    char *b = bufs[next++ & 7];
    snprintf(b, 4096, "%s/%s", dir, name);
    return b;
}

/* A file of the 8-byte length of `header`, the header, then `data_len`
 * bytes counting up from 0. */
static void write_raw(const char *path, const char *header, size_t data_len)
{
    size_t hl = strlen(header);
    uint8_t *buf = malloc(8 + hl + data_len);
    if (!buf)
        exit(2);
    for (int i = 0; i < 8; i++)
        buf[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memcpy(buf + 8, header, hl);
    for (size_t i = 0; i < data_len; i++)
        buf[8 + hl + i] = (uint8_t)i;
    t_write_file(path, buf, 8 + hl + data_len);
    free(buf);
}

/* Opening the file fails with st and needle; so does checking its bytes. */
static void expect_bad_file(const char *path, moec_status st, const char *needle, int line)
{
    rt_safetensors *s = (rt_safetensors *)1;
    t_expect_err(rt_safetensors_open_file(path, &s), st, needle, "open_file", __FILE__, line);
    T_CHECK(s == NULL);
    size_t len;
    char *bytes = t_read_file(path, &len);
    uint8_t *exact = malloc(len ? len : 1); /* no slack after the image */
    memcpy(exact, bytes, len);
    t_expect_err(rt_safetensors_check_buffer(exact, len, path), st, needle, "check_buffer",
                 __FILE__, line);
    free(exact);
    free(bytes);
}

/* Writes `header` (with 8 data bytes) as NAME.safetensors in dir and expects
 * "NAME.safetensors: " + needle. */
static void bad_header(const char *dir, const char *name, const char *header, size_t data_len,
                       const char *needle, int line)
{
    char file[256], full[1024];
    snprintf(file, sizeof file, "%s.safetensors", name);
    snprintf(full, sizeof full, "%s: %s", file, needle);
    const char *path = path_in(dir, file);
    write_raw(path, header, data_len);
    expect_bad_file(path, MOEC_ERR_FORMAT, full, line);
}

#define BAD(name, header, data_len, needle) \
    bad_header(dir, name, header, data_len, needle, __LINE__)

static void test_round_trip(void)
{
    const char *dir = t_tmpdir("st-rt");
    const char *path = path_in(dir, "rt.safetensors");
    float a[6] = {1.5f, -2.0f, 3.25f, 0.0f, 1e-3f, -7.0f};
    uint16_t b[4] = {0x3f80, 0xc000, 0x0001, 0x7f80};
    uint16_t c[1] = {0x3c00};
    int64_t sa[2] = {2, 3}, sb[1] = {4}, sz[2] = {0, 5};
    rt_st_write_tensor w[4] = {
        {"model.a.weight", RT_ST_F32, 2, sa, a},
        {"model.b \"quoted\\\" \x01", RT_ST_BF16, 1, sb, b},
        {"scalar", RT_ST_F16, 0, NULL, c},
        {"empty", RT_ST_I8, 2, sz, NULL},
    };
    T_OK(rt_safetensors_write(path, w, 4));

    size_t len;
    char *bytes = t_read_file(path, &len);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--)
        hl = hl << 8 | (uint8_t)bytes[i];
    T_CHECK((8 + hl) % 8 == 0);
    T_CHECK(len == 8 + hl + sizeof a + sizeof b + sizeof c);
    T_OK(rt_safetensors_check_buffer((const uint8_t *)bytes, len, path));
    free(bytes);

    rt_safetensors *st = NULL;
    T_OK(rt_safetensors_open_file(path, &st));
    T_CHECK(rt_safetensors_count(st) == 4);
    for (int i = 0; i < 4 && st; i++) {
        const rt_st_tensor *t = rt_safetensors_at(st, i);
        T_CHECK(t && strcmp(t->name, w[i].name) == 0);
        T_CHECK(t && rt_safetensors_find(st, w[i].name) == t);
        T_CHECK(t && t->dtype == w[i].dtype && t->rank == w[i].rank);
        T_CHECK(t && strcmp(t->file, path) == 0);
        for (int d = 0; t && d < t->rank; d++)
            T_CHECK(t->shape[d] == w[i].shape[d]);
    }
    const rt_st_tensor *ta = rt_safetensors_find(st, "model.a.weight");
    T_CHECK(ta && ta->nbytes == sizeof a && memcmp(ta->data, a, sizeof a) == 0);
    const rt_st_tensor *tb = rt_safetensors_find(st, "model.b \"quoted\\\" \x01");
    T_CHECK(tb && tb->nbytes == sizeof b && memcmp(tb->data, b, sizeof b) == 0);
    const rt_st_tensor *tc = rt_safetensors_find(st, "scalar");
    T_CHECK(tc && tc->nbytes == 2 && memcmp(tc->data, c, 2) == 0);
    const rt_st_tensor *te = rt_safetensors_find(st, "empty");
    T_CHECK(te && te->nbytes == 0 && te->shape[0] == 0 && te->shape[1] == 5);
    T_CHECK(rt_safetensors_find(st, "model.a") == NULL);
    T_CHECK(rt_safetensors_find(st, "") == NULL);
    T_CHECK(rt_safetensors_at(st, 4) == NULL && rt_safetensors_at(st, -1) == NULL);
    rt_safetensors_free(st);

    T_CHECK(strcmp(rt_st_dtype_name(RT_ST_BF16), "BF16") == 0);
    T_CHECK(strcmp(rt_st_dtype_name(RT_ST_F8_E4M3), "F8_E4M3") == 0);
    T_CHECK(rt_st_dtype_size(RT_ST_F32) == 4 && rt_st_dtype_size(RT_ST_U64) == 8 &&
            rt_st_dtype_size(RT_ST_BF16) == 2 && rt_st_dtype_size(RT_ST_BOOL) == 1);
}

/* Many tensors: every one is found through the name table. */
static void test_many(void)
{
    enum { N = 20000 };
    const char *path = path_in(t_tmpdir("st-many"), "many.safetensors");
    rt_st_write_tensor *w = calloc(N, sizeof *w);
    char (*names)[32] = calloc(N, sizeof *names);
    int32_t *vals = calloc(N, sizeof *vals);
    static const int64_t one[1] = {1};
    for (int i = 0; i < N; i++) {
        snprintf(names[i], sizeof names[i], "model.layers.%d.w", i);
        vals[i] = i * 7;
        w[i] = (rt_st_write_tensor){names[i], RT_ST_I32, 1, one, &vals[i]};
    }
    T_OK(rt_safetensors_write(path, w, N));
    rt_safetensors *st = NULL;
    T_OK(rt_safetensors_open_file(path, &st));
    T_CHECK(rt_safetensors_count(st) == N);
    int bad = 0;
    for (int i = 0; i < N; i++) {
        const rt_st_tensor *t = rt_safetensors_find(st, names[i]);
        int32_t v;
        if (!t || t->nbytes != 4 || (memcpy(&v, t->data, 4), v != i * 7))
            bad++;
    }
    T_CHECK(bad == 0);
    T_CHECK(rt_safetensors_find(st, "model.layers.20000.w") == NULL);
    rt_safetensors_free(st);
    free(w);
    free(names);
    free(vals);
}

static void test_bad_files(void)
{
    const char *dir = t_tmpdir("st-bad");

    const char *p = path_in(dir, "short.safetensors");
    t_write_file(p, "\x05\0\0\0\0", 5);
    expect_bad_file(p, MOEC_ERR_FORMAT, "short.safetensors: truncated: no header length (5 bytes)",
                    __LINE__);
    p = path_in(dir, "empty.safetensors");
    t_write_file(p, "", 0);
    expect_bad_file(p, MOEC_ERR_FORMAT, "empty.safetensors: truncated: no header length",
                    __LINE__);

    p = path_in(dir, "past.safetensors");
    t_write_file(p, "\xe8\x03\0\0\0\0\0\0{}{}{}{}{}{}", 20);
    expect_bad_file(p, MOEC_ERR_FORMAT,
                    "past.safetensors: header length 1000 runs past the end of the file (20 bytes)",
                    __LINE__);
    p = path_in(dir, "huge.safetensors");
    t_write_file(p, "\xff\xff\xff\xff\xff\xff\xff\xff{}", 10);
    expect_bad_file(p, MOEC_ERR_FORMAT,
                    "huge.safetensors: header length 18446744073709551615 runs past the end",
                    __LINE__);

    /* A header length over the limit inside a file long enough to hold it:
     * a sparse file, so nothing is written. */
    p = path_in(dir, "absurd.safetensors");
    {
        FILE *f = fopen(p, "wb");
        uint64_t hl = 150000000;
        uint8_t l8[8];
        for (int i = 0; i < 8; i++)
            l8[i] = (uint8_t)(hl >> (8 * i));
        T_CHECK(f && fwrite(l8, 1, 8, f) == 8 && fclose(f) == 0);
        T_CHECK(truncate(p, 200000000) == 0);
        rt_safetensors *st = NULL;
        T_ERR(rt_safetensors_open_file(p, &st), MOEC_ERR_FORMAT,
              "absurd.safetensors: header length 150000000 is absurd");
        unlink(p);
    }

    BAD("json", "{\"a\": ", 0, "header is not valid JSON");
    BAD("json2", "{\"a\": {\"dtype\": \"F32\",, }}", 0, "header is not valid JSON");
    BAD("array", "[1, 2]", 0, "header is not a JSON object");
    BAD("string", "\"x\"", 0, "header is not a JSON object");
    BAD("trailing", "{} x", 0, "trailing bytes after the JSON header (at header byte 3)");

    BAD("notobj", "{\"w\": 5}", 0, "tensor 'w': entry is not an object");
    BAD("nodtype", "{\"w\": {\"shape\": [2], \"data_offsets\": [0, 8]}}", 8,
        "tensor 'w': missing \"dtype\"");
    BAD("noshape", "{\"w\": {\"dtype\": \"F32\", \"data_offsets\": [0, 8]}}", 8,
        "tensor 'w': missing \"shape\"");
    BAD("nooffsets", "{\"w\": {\"dtype\": \"F32\", \"shape\": [2]}}", 8,
        "tensor 'w': missing \"data_offsets\"");
    BAD("dtypetype", "{\"w\": {\"dtype\": 4, \"shape\": [2], \"data_offsets\": [0, 8]}}", 8,
        "tensor 'w': \"dtype\" is not a string");
    BAD("shapetype", "{\"w\": {\"dtype\": \"F32\", \"shape\": {}, \"data_offsets\": [0, 8]}}", 8,
        "tensor 'w': \"shape\" is not an array");
    BAD("offtype", "{\"w\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": \"0-8\"}}", 8,
        "tensor 'w': \"data_offsets\" is not an array of two integers");
    BAD("offcount", "{\"w\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8, 9]}}",
        8, "tensor 'w': \"data_offsets\" is not an array of two integers");
    BAD("offneg", "{\"w\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [-8, 0]}}", 8,
        "tensor 'w': \"data_offsets\" are not non-negative integers");
    BAD("offstr", "{\"w\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [\"0\", 8]}}",
        8, "tensor 'w': \"data_offsets\" are not non-negative integers");
    BAD("dtype", "{\"w\": {\"dtype\": \"Q8\", \"shape\": [2], \"data_offsets\": [0, 8]}}", 8,
        "tensor 'w': unknown dtype 'Q8'");
    BAD("dtypecase", "{\"w\": {\"dtype\": \"bf16\", \"shape\": [4], \"data_offsets\": [0, 8]}}",
        8, "tensor 'w': unknown dtype 'bf16'");
    BAD("negdim", "{\"w\": {\"dtype\": \"F32\", \"shape\": [2, -1], \"data_offsets\": [0, 8]}}",
        8, "tensor 'w': shape[1] is not a non-negative integer");
    BAD("fracdim", "{\"w\": {\"dtype\": \"F32\", \"shape\": [2.5], \"data_offsets\": [0, 8]}}", 8,
        "tensor 'w': shape[0] is not a non-negative integer");
    BAD("strdim", "{\"w\": {\"dtype\": \"F32\", \"shape\": [\"2\"], \"data_offsets\": [0, 8]}}",
        8, "tensor 'w': shape[0] is not a non-negative integer");
    BAD("bigdim", "{\"w\": {\"dtype\": \"F32\", \"shape\": [1e300], \"data_offsets\": [0, 8]}}",
        8, "tensor 'w': shape[0] is not a non-negative integer");
    BAD("rank9",
        "{\"w\": {\"dtype\": \"U8\", \"shape\": [1,1,1,1,1,1,1,1,1], \"data_offsets\": [0, 1]}}",
        8, "tensor 'w': rank 9 exceeds the maximum of 8");
    BAD("size", "{\"w\": {\"dtype\": \"BF16\", \"shape\": [2, 3], \"data_offsets\": [0, 10]}}", 16,
        "tensor 'w': shape [2, 3] of BF16 is 12 bytes, but offsets [0, 10) hold 10");
    BAD("overflow",
        "{\"w\": {\"dtype\": \"F32\", \"shape\": [4294967296, 4294967296, 4], \"data_offsets\": "
        "[0, 0]}}",
        0, "tensor 'w': shape [4294967296, 4294967296, 4] of F32 overflows 64 bits");
    BAD("overflow2",
        "{\"w\": {\"dtype\": \"F64\", \"shape\": [4294967296, 4294967296, 0], "
        "\"data_offsets\": [0, 8]}}",
        8, "tensor 'w': shape [4294967296, 4294967296, 0] of F64 is 0 bytes, but offsets "
           "[0, 8) hold 8");
    BAD("backwards", "{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [8, 4]}}", 8,
        "tensor 'w': offsets [8, 4) have begin > end");
    BAD("range", "{\"w\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [0, 16]}}", 8,
        "tensor 'w': offsets [0, 16) out of range: data section is 8 bytes");
    BAD("range2", "{\"w\": {\"dtype\": \"F32\", \"shape\": [0], \"data_offsets\": [9, 9]}}", 8,
        "tensor 'w': offsets [9, 9) out of range: data section is 8 bytes");
    BAD("overlap",
        "{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]},"
        " \"b\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [4, 12]}}",
        16, "tensor 'b': offsets [4, 12) overlaps tensor 'a' at [0, 8)");
    BAD("overlap2",
        "{\"c\": {\"dtype\": \"U8\", \"shape\": [2], \"data_offsets\": [10, 12]},"
        " \"big\": {\"dtype\": \"U8\", \"shape\": [16], \"data_offsets\": [0, 16]},"
        " \"b\": {\"dtype\": \"U8\", \"shape\": [2], \"data_offsets\": [16, 18]}}",
        18, "tensor 'c': offsets [10, 12) overlaps tensor 'big' at [0, 16)");
    BAD("overlap3",
        "{\"big\": {\"dtype\": \"U8\", \"shape\": [16], \"data_offsets\": [0, 16]},"
        " \"small\": {\"dtype\": \"U8\", \"shape\": [2], \"data_offsets\": [2, 4]},"
        " \"c\": {\"dtype\": \"U8\", \"shape\": [2], \"data_offsets\": [8, 10]}}",
        18, "tensor 'small': offsets [2, 4) overlaps tensor 'big' at [0, 16)");
    BAD("dup",
        "{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]},"
        " \"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 8]}}",
        8, "duplicate tensor name 'w'");
    /* A key twice inside an entry: the first and the last would differ. */
    BAD("dupfield",
        "{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4],"
        " \"dtype\": \"F16\"}}",
        8, "key \"w.dtype\" appears twice");
    BAD("dupmeta", "{\"__metadata__\": {\"format\": \"pt\", \"format\": \"np\"}}", 0,
        "key \"__metadata__.format\" appears twice");
    BAD("meta", "{\"__metadata__\": {\"format\": 1}}", 0,
        "\"__metadata__\" entry 'format' is not a string");
    BAD("meta2", "{\"__metadata__\": [\"pt\"]}", 0, "\"__metadata__\" is not an object");

    /* Legal corner cases: metadata is skipped, an empty tensor sits anywhere
     * inside the data section, holes are allowed, trailing spaces too. */
    p = path_in(dir, "fine.safetensors");
    write_raw(p,
              "{\"__metadata__\": {\"format\": \"pt\"},"
              " \"a\": {\"dtype\": \"U8\", \"shape\": [8], \"data_offsets\": [0, 8]},"
              " \"e\": {\"dtype\": \"F32\", \"shape\": [3, 0], \"data_offsets\": [4, 4]},"
              " \"s\": {\"dtype\": \"I16\", \"shape\": [], \"data_offsets\": [10, 12], \"x\": 1},"
              " \"z\": {\"dtype\": \"F64\", \"shape\": [4294967296, 4294967296, 0],"
              " \"data_offsets\": [16, 16]}}"
              "   \n ",
              16);
    rt_safetensors *st = NULL;
    T_OK(rt_safetensors_open_file(p, &st));
    T_CHECK(rt_safetensors_count(st) == 4);
    T_CHECK(rt_safetensors_find(st, "__metadata__") == NULL);
    const rt_st_tensor *s = rt_safetensors_find(st, "s");
    T_CHECK(s && s->rank == 0 && s->nbytes == 2 && ((const uint8_t *)s->data)[0] == 10);
    const rt_st_tensor *a = rt_safetensors_find(st, "a");
    T_CHECK(a && ((const uint8_t *)a->data)[7] == 7);
    rt_safetensors_free(st);

    /* Not a file at all. */
    st = NULL;
    T_ERR(rt_safetensors_open_file(path_in(dir, "absent.safetensors"), &st), MOEC_ERR_IO,
          "absent.safetensors: No such file");
    T_ERR(rt_safetensors_open_file(dir, &st), MOEC_ERR_IO,
          "is not a regular file (it is a directory)");
    T_CHECK(st == NULL);
    T_ERR(rt_safetensors_check_buffer(NULL, 0, "nothing.safetensors"), MOEC_ERR_FORMAT,
          "nothing.safetensors: truncated");
}

static void write_two(const char *path, const char *n1, const char *n2)
{
    static const float v[4] = {1, 2, 3, 4};
    static const int64_t sh[1] = {2};
    rt_st_write_tensor w[2] = {{n1, RT_ST_F32, 1, sh, v}, {n2, RT_ST_F32, 1, sh, v + 2}};
    T_OK(rt_safetensors_write(path, w, n2 ? 2 : 1));
}

static void write_index(const char *dir, const char *map_json)
{
    char text[2048];
    snprintf(text, sizeof text, "{\"metadata\": {\"total_size\": 24}, \"weight_map\": %s}",
             map_json);
    t_write_file(path_in(dir, "model.safetensors.index.json"), text, strlen(text));
}

#define S1 "model-00001-of-00002.safetensors"
#define S2 "model-00002-of-00002.safetensors"

static void test_sharded(void)
{
    const char *dir = t_tmpdir("st-shard");
    write_two(path_in(dir, S1), "a", "b");
    write_two(path_in(dir, S2), "c", NULL);
    write_index(dir, "{\"a\": \"" S1 "\", \"b\": \"" S1 "\", \"c\": \"" S2 "\"}");
    rt_safetensors *st = NULL;
    T_OK(rt_safetensors_open_dir(dir, &st));
    T_CHECK(rt_safetensors_count(st) == 3);
    const rt_st_tensor *c = rt_safetensors_find(st, "c");
    T_CHECK(c && strcmp(c->file, path_in(dir, S2)) == 0);
    T_CHECK(c && ((const float *)c->data)[1] == 2.0f);
    const rt_st_tensor *b = rt_safetensors_find(st, "b");
    T_CHECK(b && strcmp(b->file, path_in(dir, S1)) == 0 && ((const float *)b->data)[0] == 3.0f);
    rt_safetensors_free(st);

    /* The index may leave a tensor out; it is still loaded. */
    write_index(dir, "{\"a\": \"" S1 "\", \"c\": \"" S2 "\"}");
    st = NULL;
    T_OK(rt_safetensors_open_dir(dir, &st));
    T_CHECK(rt_safetensors_count(st) == 3 && rt_safetensors_find(st, "b") != NULL);
    rt_safetensors_free(st);

    st = (rt_safetensors *)1;
    write_index(dir, "{\"a\": \"" S1 "\", \"d\": \"model-00003-of-00003.safetensors\"}");
    T_ERR(rt_safetensors_open_dir(dir, &st), MOEC_ERR_IO,
          "model.safetensors.index.json names shard 'model-00003-of-00003.safetensors'");
    T_CHECK(st == NULL);
    T_CHECK(strstr(moec_last_error(), "cannot be opened: No such file") != NULL);

    write_index(dir, "{\"a\": \"" S1 "\", \"e\": \"" S1 "\", \"c\": \"" S2 "\"}");
    T_ERR(rt_safetensors_open_dir(dir, &st), MOEC_ERR_FORMAT,
          "model.safetensors.index.json maps tensor 'e' to shard '" S1
          "', but that shard lacks it");

    write_index(dir, "{\"a\": \"" S2 "\", \"b\": \"" S1 "\", \"c\": \"" S2 "\"}");
    T_ERR(rt_safetensors_open_dir(dir, &st), MOEC_ERR_FORMAT,
          "maps tensor 'a' to shard '" S2 "', but it is in ");
    T_CHECK(strstr(moec_last_error(), S1) != NULL);

    write_index(dir, "{\"a\": \"../" S1 "\"}");
    T_ERR(rt_safetensors_open_dir(dir, &st), MOEC_ERR_FORMAT,
          "model.safetensors.index.json: shard name '../" S1
          "' for tensor 'a' is not a plain file name");
    write_index(dir, "{\"a\": \"..\"}");
    T_ERR(rt_safetensors_open_dir(dir, &st), MOEC_ERR_FORMAT,
          "shard name '..' for tensor 'a' is not a plain file name");
    write_index(dir, "{\"a\": \"/etc/passwd\"}");
    T_ERR(rt_safetensors_open_dir(dir, &st), MOEC_ERR_FORMAT,
          "shard name '/etc/passwd' for tensor 'a' is not a plain file name");
    write_index(dir, "{\"a\": 3}");
    T_ERR(rt_safetensors_open_dir(dir, &st), MOEC_ERR_FORMAT,
          "weight_map entry for tensor 'a' is not a string");
    write_index(dir, "{}");
    T_ERR(rt_safetensors_open_dir(dir, &st), MOEC_ERR_FORMAT, "\"weight_map\" is empty");
    t_write_file(path_in(dir, "model.safetensors.index.json"), "{\"weight_map\": ", 15);
    T_ERR(rt_safetensors_open_dir(dir, &st), MOEC_ERR_FORMAT,
          "model.safetensors.index.json: not valid JSON");
    t_write_file(path_in(dir, "model.safetensors.index.json"), "{\"metadata\": {}}", 16);
    T_ERR(rt_safetensors_open_dir(dir, &st), MOEC_ERR_FORMAT,
          "model.safetensors.index.json: no \"weight_map\" object");
    write_index(dir, "{\"a\": \"" S1 "\", \"c\": \"" S2 "\", \"a\": \"" S2 "\"}");
    T_ERR(rt_safetensors_open_dir(dir, &st), MOEC_ERR_FORMAT,
          "model.safetensors.index.json: key \"weight_map.a\" appears twice");
    /* An index that is a FIFO is refused, not waited on. */
    remove(path_in(dir, "model.safetensors.index.json"));
    T_CHECK(mkfifo(path_in(dir, "model.safetensors.index.json"), 0600) == 0);
    T_ERR(rt_safetensors_open_dir(dir, &st), MOEC_ERR_IO,
          "model.safetensors.index.json is not a regular file (it is a FIFO)");
    remove(path_in(dir, "model.safetensors.index.json"));

    /* A bad shard reports its own error. */
    write_index(dir, "{\"a\": \"" S1 "\", \"c\": \"" S2 "\"}");
    t_write_file(path_in(dir, S2), "\x02\0\0\0\0\0\0\0[]", 10);
    T_ERR(rt_safetensors_open_dir(dir, &st), MOEC_ERR_FORMAT,
          S2 ": header is not a JSON object");

    /* The same tensor in two shards. */
    write_two(path_in(dir, S2), "c", "a");
    T_ERR(rt_safetensors_open_dir(dir, &st), MOEC_ERR_FORMAT, "tensor 'a' is in both ");
    T_CHECK(st == NULL);
}

static void test_dir_layouts(void)
{
    /* model.safetensors wins over other files. */
    const char *dir = t_tmpdir("st-single");
    write_two(path_in(dir, "model.safetensors"), "x", "y");
    write_two(path_in(dir, "other.safetensors"), "z", NULL);
    rt_safetensors *st = NULL;
    T_OK(rt_safetensors_open_dir(dir, &st));
    T_CHECK(rt_safetensors_count(st) == 2 && rt_safetensors_find(st, "z") == NULL);
    rt_safetensors_free(st);

    /* Every *.safetensors, in name order. */
    dir = t_tmpdir("st-glob");
    write_two(path_in(dir, "b.safetensors"), "b1", "b2");
    write_two(path_in(dir, "a.safetensors"), "a1", NULL);
    t_write_file(path_in(dir, "notes.txt"), "hi", 2);
    t_write_file(path_in(dir, "x.safetensors.bak"), "junk", 4);
    st = NULL;
    T_OK(rt_safetensors_open_dir(dir, &st));
    T_CHECK(rt_safetensors_count(st) == 3);
    T_CHECK(st && strcmp(rt_safetensors_at(st, 0)->name, "a1") == 0);
    T_CHECK(st && strcmp(rt_safetensors_at(st, 2)->name, "b2") == 0);
    rt_safetensors_free(st);

    write_two(path_in(dir, "c.safetensors"), "b2", NULL);
    T_ERR(rt_safetensors_open_dir(dir, &st), MOEC_ERR_FORMAT, "tensor 'b2' is in both ");
    T_CHECK(strstr(moec_last_error(), "b.safetensors and ") &&
            strstr(moec_last_error(), "c.safetensors"));

    /* A FIFO is refused, not waited on. */
    dir = t_tmpdir("st-fifo");
    T_CHECK(mkfifo(path_in(dir, "p.safetensors"), 0600) == 0);
    T_ERR(rt_safetensors_open_dir(dir, &st), MOEC_ERR_IO,
          "p.safetensors is not a regular file (it is a FIFO)");

    dir = t_tmpdir("st-empty");
    t_write_file(path_in(dir, "config.json"), "{}", 2);
    char want[4200];
    snprintf(want, sizeof want, "no *.safetensors in %s", dir);
    T_ERR(rt_safetensors_open_dir(dir, &st), MOEC_ERR_IO, want);
    T_ERR(rt_safetensors_open_dir(path_in(dir, "nope"), &st), MOEC_ERR_IO,
          "cannot open directory");
    T_CHECK(st == NULL);
}

static void test_writer_errors(void)
{
    const char *dir = t_tmpdir("st-w");
    static const float v[2] = {1, 2};
    static const int64_t sh[1] = {2}, neg[1] = {-2};
    rt_st_write_tensor dup[2] = {{"w", RT_ST_F32, 1, sh, v}, {"w", RT_ST_F32, 1, sh, v}};
    T_ERR(rt_safetensors_write(path_in(dir, "dup.safetensors"), dup, 2), MOEC_ERR_INVALID_ARG,
          "duplicate tensor name 'w'");
    rt_st_write_tensor bad[1] = {{"w", RT_ST_F32, 1, neg, v}};
    T_ERR(rt_safetensors_write(path_in(dir, "neg.safetensors"), bad, 1), MOEC_ERR_INVALID_ARG,
          "tensor 'w': bad dim -2");
    rt_st_write_tensor nodata[1] = {{"w", RT_ST_F32, 1, sh, NULL}};
    T_ERR(rt_safetensors_write(path_in(dir, "nodata.safetensors"), nodata, 1),
          MOEC_ERR_INVALID_ARG, "tensor 'w': no data");
    T_ERR(rt_safetensors_write(path_in(dir, "no/such/dir.safetensors"), dup, 1), MOEC_ERR_IO,
          "cannot create");
    struct stat sb;
    T_CHECK(stat(path_in(dir, "dup.safetensors"), &sb) != 0);

    /* An empty file set is a valid file. */
    const char *p = path_in(dir, "none.safetensors");
    T_OK(rt_safetensors_write(p, NULL, 0));
    rt_safetensors *st = NULL;
    T_OK(rt_safetensors_open_file(p, &st));
    T_CHECK(rt_safetensors_count(st) == 0 && rt_safetensors_find(st, "w") == NULL);
    rt_safetensors_free(st);
}

int main(void)
{
    test_round_trip();
    test_many();
    test_bad_files();
    test_sharded();
    test_dir_layouts();
    test_writer_errors();
    return t_finish("test_safetensors");
}
