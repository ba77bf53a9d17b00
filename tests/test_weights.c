/* test_weights.c — resolving a module's weight bindings against a
 * checkpoint: tensors, expert stacks and concatenations read back as fp32 in
 * the weight's layout, exact bf16/f16 widening, the float8 e4m3 decoder on
 * all 256 codes and block-scaled dequantization (partial edge blocks, stacks,
 * concatenations) against values computed independently, and the errors for
 * a missing, misshaped or wrongly typed tensor or scale. */
#include <math.h>
#include <string.h>

#include "ir/ir.h"
#include "runtime/weights.h"
#include "testlib.h"

static const char *g_dir;  /* the good checkpoint */
static char g_file[4096];  /* its model.safetensors */

static ir_type ty(ir_dtype dt, int rank, int64_t d0, int64_t d1, int64_t d2)
{
    ir_type t = {.dtype = dt, .rank = rank, .dims = {d0, d1, d2, 0}};
    return t;
}

static uint16_t to_bf16(float f)
{
    uint32_t b;
    memcpy(&b, &f, 4);
    if (b & 0xffffu) {
        fprintf(stderr, "fixture value %g is not exact in bf16\n", (double)f);
        exit(2);
    }
    return (uint16_t)(b >> 16);
}

/* Holds every tensor's storage until the file is written. */
typedef struct fixture {
    rt_st_write_tensor t[64];
    int64_t shapes[64][3];
    void *data[64];
    char names[64][96];
    int n;
} fixture;

/* A bf16 tensor whose element i is base + i * 0.25 (exact in bf16 while
 * below 64 in magnitude). */
static void add_bf16(fixture *f, const char *name, int rank, int64_t d0, int64_t d1, float base)
{
    int k = f->n++;
    int64_t n = rank == 1 ? d0 : d0 * d1;
    uint16_t *p = malloc((size_t)n * 2);
    for (int64_t i = 0; i < n; i++)
        p[i] = to_bf16(base + (float)i * 0.25f);
    snprintf(f->names[k], sizeof f->names[k], "%s", name);
    f->shapes[k][0] = d0;
    f->shapes[k][1] = d1;
    f->data[k] = p;
    f->t[k] = (rt_st_write_tensor){f->names[k], RT_ST_BF16, rank, f->shapes[k], p};
}

/* A tensor [d0] (rank 1) or [d0, d1] of dtype dt holding a copy of src. */
static void add_shaped(fixture *f, const char *name, rt_st_dtype dt, int rank, int64_t d0,
                       int64_t d1, const void *src)
{
    int k = f->n++;
    size_t bytes = (size_t)(rank == 1 ? d0 : d0 * d1) * rt_st_dtype_size(dt);
    void *p = malloc(bytes);
    memcpy(p, src, bytes);
    snprintf(f->names[k], sizeof f->names[k], "%s", name);
    f->shapes[k][0] = d0;
    f->shapes[k][1] = d1;
    f->data[k] = p;
    f->t[k] = (rt_st_write_tensor){f->names[k], dt, rank, f->shapes[k], p};
}

static void add_raw(fixture *f, const char *name, rt_st_dtype dt, int64_t n, const void *src)
{
    add_shaped(f, name, dt, 1, n, 0, src);
}

static void fixture_write(fixture *f, const char *path)
{
    T_OK(rt_safetensors_write(path, f->t, f->n));
    for (int i = 0; i < f->n; i++)
        free(f->data[i]);
    f->n = 0;
}

/* f16 bit patterns and their exact fp32 values. */
static const uint16_t f16_bits[] = {0x3c00, 0xc000, 0x0001, 0x03ff, 0x0400, 0x7bff,
                                    0x3555, 0x8000, 0x7c00, 0xfc00, 0x7e00, 0x8001};
static float f16_want(int i)
{
    switch (i) {
    case 0: return 1.0f;
    case 1: return -2.0f;
    case 2: return 0x1p-24f;           /* smallest subnormal */
    case 3: return 1023.0f * 0x1p-24f; /* largest subnormal */
    case 4: return 0x1p-14f;           /* smallest normal */
    case 5: return 65504.0f;           /* largest finite */
    case 6: return 0.333251953125f;
    case 7: return -0.0f;
    case 8: return INFINITY;
    case 9: return -INFINITY;
    case 10: return NAN;
    default: return -0x1p-24f;
    }
}
#define N_F16 ((int)(sizeof f16_bits / sizeof f16_bits[0]))

static void make_good_checkpoint(void)
{
    g_dir = t_tmpdir("wt-good");
    snprintf(g_file, sizeof g_file, "%s/model.safetensors", g_dir);
    static fixture f;
    add_bf16(&f, "model.embed.weight", 2, 3, 4, -1.0f);
    for (int e = 0; e < 3; e++) {
        char name[96];
        snprintf(name, sizeof name, "model.layers.0.mlp.experts.%d.up_proj.weight", e);
        add_bf16(&f, name, 2, 2, 3, 10.0f * (float)e);
        snprintf(name, sizeof name, "model.layers.0.mlp.experts.%d.gate_proj.weight", e);
        add_bf16(&f, name, 2, 2, 3, -10.0f * (float)(e + 1));
    }
    add_bf16(&f, "q_a.weight", 2, 2, 3, 30.0f);
    add_bf16(&f, "kv_a.weight", 2, 1, 3, 40.0f);
    add_bf16(&f, "left.weight", 2, 2, 1, 1.0f);
    add_bf16(&f, "right.weight", 2, 2, 2, 5.0f);
    add_raw(&f, "model.norm.weight", RT_ST_F16, N_F16, f16_bits);
    const float f32s[4] = {0.1f, -3.5e-20f, 1e30f, -7.0f};
    add_raw(&f, "f32.weight", RT_ST_F32, 4, f32s);
    /* F32 holding bf16 values (a bf16 router as transformers 5 saves it) */
    const float f32bf[4] = {1.5f, -0x1p-100f, -INFINITY, 0x1.fep120f};
    add_raw(&f, "f32bf.weight", RT_ST_F32, 4, f32bf);
    const double f64s[2] = {1.0, 2.0};
    add_raw(&f, "f64.weight", RT_ST_F64, 2, f64s);
    const int8_t i8s[2] = {1, 2};
    add_raw(&f, "i8.weight", RT_ST_I8, 2, i8s);
    add_raw(&f, "fp8.weight", RT_ST_F8_E4M3, 2, i8s);
    const int32_t i32s[3] = {-5, 0, 16777216};
    add_raw(&f, "ids.weight", RT_ST_I32, 3, i32s);
    fixture_write(&f, g_file);
}

/* bf16 value i of a tensor made by add_bf16 with `base`. */
static float bf(float base, int64_t i) { return base + (float)i * 0.25f; }

static int same_float(float a, float b)
{
    if (isnan(a) || isnan(b))
        return isnan(a) && isnan(b);
    return memcmp(&a, &b, sizeof a) == 0; /* distinguishes -0 */
}

static void test_reads(void)
{
    ir_module *m = ir_module_init("t");
    ir_value *embed = ir_module_add_weight(m, "embed", ty(IR_DTYPE_BF16, 2, 3, 4, 0),
                                           "model.embed.weight");
    ir_value *embed32 = ir_module_add_weight(m, "embed32", ty(IR_DTYPE_F32, 2, 3, 4, 0),
                                             "model.embed.weight");
    ir_value *norm = ir_module_add_weight(m, "norm", ty(IR_DTYPE_F32, 1, N_F16, 0, 0),
                                          "model.norm.weight");
    ir_value *norm16 = ir_module_add_weight(m, "norm16", ty(IR_DTYPE_F16, 1, N_F16, 0, 0),
                                            "model.norm.weight");
    ir_value *f32w = ir_module_add_weight(m, "f32w", ty(IR_DTYPE_F32, 1, 4, 0, 0), "f32.weight");
    ir_value *f32bf = ir_module_add_weight(m, "f32bf", ty(IR_DTYPE_BF16, 1, 4, 0, 0),
                                           "f32bf.weight");
    ir_value *f32b = ir_module_add_weight(m, "f32b", ty(IR_DTYPE_BF16, 1, 4, 0, 0), "f32.weight");
    ir_binding f32_parts[2] = {{.kind = IR_BIND_TENSOR, .name = "f32bf.weight"},
                               {.kind = IR_BIND_TENSOR, .name = "f32.weight"}};
    ir_binding f32cat = {.kind = IR_BIND_CONCAT, .axis = 0, .n_parts = 2, .parts = f32_parts};
    ir_value *f32c = ir_module_add_weight_bound(m, "f32c", ty(IR_DTYPE_BF16, 1, 8, 0, 0), &f32cat);
    ir_value *ids = ir_module_add_weight(m, "ids", ty(IR_DTYPE_I32, 1, 3, 0, 0), "ids.weight");
    ir_value *up = ir_module_add_weight_stack(m, "l0.up", ty(IR_DTYPE_BF16, 3, 3, 2, 3),
                                              "model.layers.0.mlp.experts.{e}.up_proj.weight", 3);
    ir_binding qkv_parts[2] = {{.kind = IR_BIND_TENSOR, .name = "q_a.weight"},
                               {.kind = IR_BIND_TENSOR, .name = "kv_a.weight"}};
    ir_binding qkv = {.kind = IR_BIND_CONCAT, .axis = 0, .n_parts = 2, .parts = qkv_parts};
    ir_value *qkv_v = ir_module_add_weight_bound(m, "qkv", ty(IR_DTYPE_BF16, 2, 3, 3, 0), &qkv);
    ir_binding lr_parts[2] = {{.kind = IR_BIND_TENSOR, .name = "left.weight"},
                              {.kind = IR_BIND_TENSOR, .name = "right.weight"}};
    ir_binding lr = {.kind = IR_BIND_CONCAT, .axis = 1, .n_parts = 2, .parts = lr_parts};
    ir_value *lr_v = ir_module_add_weight_bound(m, "lr", ty(IR_DTYPE_BF16, 2, 2, 3, 0), &lr);
    ir_binding gu_parts[2] = {
        {.kind = IR_BIND_STACK, .name = "model.layers.0.mlp.experts.{e}.gate_proj.weight",
         .count = 2},
        {.kind = IR_BIND_STACK, .name = "model.layers.0.mlp.experts.{e}.up_proj.weight",
         .count = 2}};
    ir_binding gu = {.kind = IR_BIND_CONCAT, .axis = 1, .n_parts = 2, .parts = gu_parts};
    ir_value *gu_v = ir_module_add_weight_bound(m, "gate_up", ty(IR_DTYPE_BF16, 3, 2, 4, 3), &gu);
    ir_binding st0_parts[2] = {
        {.kind = IR_BIND_STACK, .name = "model.layers.0.mlp.experts.{e}.up_proj.weight",
         .count = 2},
        {.kind = IR_BIND_STACK, .name = "model.layers.0.mlp.experts.{e}.gate_proj.weight",
         .count = 1}};
    ir_binding st0 = {.kind = IR_BIND_CONCAT, .axis = 0, .n_parts = 2, .parts = st0_parts};
    ir_value *st0_v = ir_module_add_weight_bound(m, "st0", ty(IR_DTYPE_BF16, 3, 3, 2, 3), &st0);
    ir_value *tok = ir_module_add_input(m, "tokens", ty(IR_DTYPE_I32, 1, IR_DIM_T, 0, 0));
    T_CHECK(embed && embed32 && norm && norm16 && f32w && f32bf && f32b && f32c && ids && up &&
            qkv_v && lr_v && gu_v && st0_v && tok);
    if (!(embed && embed32 && norm && norm16 && f32w && f32bf && f32b && f32c && ids && up &&
          qkv_v && lr_v && gu_v && st0_v && tok)) {
        fprintf(stderr, "module build failed: %s\n", moec_last_error());
        ir_module_free(m);
        return;
    }

    rt_weights *w = NULL;
    T_OK(rt_weights_open(m, g_dir, &w));
    if (!w) {
        ir_module_free(m);
        return;
    }
    float buf[64];
    int bad;

    /* bf16 -> f32 is exact: bits << 16. */
    memset(buf, 0xff, sizeof buf);
    T_OK(rt_weights_read_f32(w, embed, buf));
    bad = 0;
    for (int i = 0; i < 12; i++)
        bad += buf[i] != bf(-1.0f, i);
    T_CHECK(bad == 0 && buf[0] == -1.0f && buf[11] == 1.75f);
    T_CHECK(isnan(buf[12])); /* nothing written past the weight */
    T_OK(rt_weights_read_f32(w, embed32, buf));
    T_CHECK(buf[5] == 0.25f);

    /* f16 -> f32, including subnormals, infinities, NaN and -0. */
    T_OK(rt_weights_read_f32(w, norm, buf));
    bad = 0;
    for (int i = 0; i < N_F16; i++) {
        if (!same_float(buf[i], f16_want(i))) {
            bad++;
            fprintf(stderr, "f16 %04x -> %a, want %a\n", f16_bits[i], (double)buf[i],
                    (double)f16_want(i));
        }
    }
    T_CHECK(bad == 0);
    T_OK(rt_weights_read_f32(w, norm16, buf));
    T_CHECK(buf[2] == 0x1p-24f && buf[5] == 65504.0f);

    T_OK(rt_weights_read_f32(w, f32w, buf));
    T_CHECK(buf[0] == 0.1f && buf[1] == -3.5e-20f && buf[2] == 1e30f && buf[3] == -7.0f);
    /* a bf16 weight over F32 tensors: read as they are where every value is
       a bf16 one, else an error naming the tensor and the first such value */
    T_OK(rt_weights_read_f32(w, f32bf, buf));
    T_CHECK(buf[0] == 1.5f && buf[1] == -0x1p-100f && buf[2] == -INFINITY &&
            buf[3] == 0x1.fep120f);
    char want[8192];
    snprintf(want, sizeof want,
             "weight %%f32b: tensor 'f32.weight' in %s (F32) holds values bf16 does not "
             "represent (element 0 of the weight: 0.100000001); moec keeps this weight in bf16",
             g_file);
    t_expect_err(rt_weights_read_f32(w, f32b, buf), MOEC_ERR_MISMATCH, want,
                 "rt_weights_read_f32(f32b)", __FILE__, __LINE__);
    /* joined from two F32 tensors, the second not bf16: the first is named,
       the element counted over the weight */
    snprintf(want, sizeof want,
             "weight %%f32c: its F32 tensors ('f32bf.weight' in %s the first of 2) hold "
             "values bf16 does not represent (element 4 of the weight: 0.100000001)",
             g_file);
    t_expect_err(rt_weights_read_f32(w, f32c, buf), MOEC_ERR_MISMATCH, want,
                 "rt_weights_read_f32(f32c)", __FILE__, __LINE__);
    T_OK(rt_weights_read_f32(w, ids, buf));
    T_CHECK(buf[0] == -5.0f && buf[1] == 0.0f && buf[2] == 16777216.0f);

    /* stack: [E, 2, 3], expert e's tensor at e * 6. */
    T_OK(rt_weights_read_f32(w, up, buf));
    bad = 0;
    for (int e = 0; e < 3; e++)
        for (int i = 0; i < 6; i++)
            bad += buf[e * 6 + i] != bf(10.0f * (float)e, i);
    T_CHECK(bad == 0 && buf[6] == 10.0f && buf[17] == 21.25f);

    /* concat on axis 0: q_a's 2 rows, then kv_a's row. */
    T_OK(rt_weights_read_f32(w, qkv_v, buf));
    bad = 0;
    for (int i = 0; i < 6; i++)
        bad += buf[i] != bf(30.0f, i);
    for (int i = 0; i < 3; i++)
        bad += buf[6 + i] != bf(40.0f, i);
    T_CHECK(bad == 0 && buf[6] == 40.0f);

    /* concat on axis 1 of [2,1] and [2,2]: row r = left[r], right[r, 0..1]. */
    T_OK(rt_weights_read_f32(w, lr_v, buf));
    const float lr_want[6] = {1.0f, 5.0f, 5.25f, 1.25f, 5.5f, 5.75f};
    T_CHECK(memcmp(buf, lr_want, sizeof lr_want) == 0);

    /* gate_up [E=2, 4, 3]: per expert, gate's 2 rows then up's 2 rows. */
    T_OK(rt_weights_read_f32(w, gu_v, buf));
    bad = 0;
    for (int e = 0; e < 2; e++) {
        for (int i = 0; i < 6; i++) {
            bad += buf[e * 12 + i] != bf(-10.0f * (float)(e + 1), i);
            bad += buf[e * 12 + 6 + i] != bf(10.0f * (float)e, i);
        }
    }
    T_CHECK(bad == 0 && buf[12] == -20.0f && buf[18] == 10.0f);

    /* concat on axis 0 of stacks: up experts 0, 1, then gate expert 0. */
    T_OK(rt_weights_read_f32(w, st0_v, buf));
    bad = 0;
    for (int i = 0; i < 6; i++) {
        bad += buf[i] != bf(0.0f, i);
        bad += buf[6 + i] != bf(10.0f, i);
        bad += buf[12 + i] != bf(-10.0f, i);
    }
    T_CHECK(bad == 0);

    /* Only weights of this module. */
    T_ERR(rt_weights_read_f32(w, tok, buf), MOEC_ERR_INVALID_ARG,
          "%tokens is not a weight of the module");
    ir_module *other = ir_module_init("o");
    ir_value *ov = ir_module_add_weight(other, "embed", ty(IR_DTYPE_BF16, 2, 3, 4, 0),
                                        "model.embed.weight");
    T_ERR(rt_weights_read_f32(w, ov, buf), MOEC_ERR_INVALID_ARG,
          "%embed is not a weight of the module");
    ir_module_free(other);

    rt_weights_free(w);
    ir_module_free(m);
}

/* Opening a module of just weight `name` bound by b fails with st and a
 * message containing needle. */
static void expect_open_err(ir_type t, const ir_binding *b, const char *dir, moec_status st,
                            const char *needle, int line)
{
    ir_module *m = ir_module_init("bad");
    ir_value *v = ir_module_add_weight_bound(m, "w", t, b);
    if (!v) {
        t_failures++;
        fprintf(stderr, "%s:%d: building the module failed: %s\n", __FILE__, line,
                moec_last_error());
        ir_module_free(m);
        return;
    }
    rt_weights *w = (rt_weights *)1;
    t_expect_err(rt_weights_open(m, dir, &w), st, needle, "rt_weights_open", __FILE__, line);
    T_CHECK(w == NULL);
    ir_module_free(m);
}

#define EXPECT_TENSOR(t, tensor, st, needle)                                      \
    do {                                                                          \
        ir_binding b_ = {.kind = IR_BIND_TENSOR, .name = (tensor)};               \
        expect_open_err((t), &b_, g_dir, (st), (needle), __LINE__);              \
    } while (0)

static void test_errors(void)
{
    char want[8192];
    const ir_type bf16_34 = ty(IR_DTYPE_BF16, 2, 3, 4, 0);

    snprintf(want, sizeof want, "weight %%w: tensor 'model.x.weight' not found in %s", g_dir);
    EXPECT_TENSOR(bf16_34, "model.x.weight", MOEC_ERR_MISMATCH, want);

    snprintf(want, sizeof want,
             "weight %%w: tensor 'model.embed.weight' in %s has shape [3, 4], expected [4, 3]",
             g_file);
    EXPECT_TENSOR(ty(IR_DTYPE_BF16, 2, 4, 3, 0), "model.embed.weight", MOEC_ERR_MISMATCH, want);
    EXPECT_TENSOR(ty(IR_DTYPE_BF16, 1, 12, 0, 0), "model.embed.weight", MOEC_ERR_MISMATCH,
                  "has shape [3, 4], expected [12]");
    EXPECT_TENSOR(ty(IR_DTYPE_BF16, 3, 1, 3, 4), "model.embed.weight", MOEC_ERR_MISMATCH,
                  "has shape [3, 4], expected [1, 3, 4]");

    snprintf(want, sizeof want,
             "weight %%w: tensor 'model.norm.weight' in %s has dtype F16, expected BF16", g_file);
    EXPECT_TENSOR(ty(IR_DTYPE_BF16, 1, N_F16, 0, 0), "model.norm.weight", MOEC_ERR_MISMATCH,
                  want);
    EXPECT_TENSOR(ty(IR_DTYPE_F16, 2, 3, 4, 0), "model.embed.weight", MOEC_ERR_MISMATCH,
                  "tensor 'model.embed.weight' in " /* file */);
    EXPECT_TENSOR(ty(IR_DTYPE_F16, 2, 3, 4, 0), "model.embed.weight", MOEC_ERR_MISMATCH,
                  "has dtype BF16, expected F16");
    EXPECT_TENSOR(ty(IR_DTYPE_F16, 1, 4, 0, 0), "f32.weight", MOEC_ERR_MISMATCH,
                  "tensor 'f32.weight' in");
    EXPECT_TENSOR(ty(IR_DTYPE_BF16, 1, 2, 0, 0), "f64.weight", MOEC_ERR_MISMATCH,
                  "has dtype F64, expected BF16 (or F32 holding bf16 values)");
    EXPECT_TENSOR(ty(IR_DTYPE_F32, 1, 2, 0, 0), "f64.weight", MOEC_ERR_MISMATCH,
                  "tensor 'f64.weight' in");
    EXPECT_TENSOR(ty(IR_DTYPE_F32, 1, 2, 0, 0), "f64.weight", MOEC_ERR_MISMATCH,
                  "has dtype F64, expected F32, F16 or BF16");
    EXPECT_TENSOR(ty(IR_DTYPE_F32, 1, 2, 0, 0), "i8.weight", MOEC_ERR_MISMATCH,
                  "has dtype I8, expected F32, F16 or BF16");
    EXPECT_TENSOR(ty(IR_DTYPE_BF16, 1, 2, 0, 0), "fp8.weight", MOEC_ERR_MISMATCH,
                  "has dtype F8_E4M3, expected BF16");
    EXPECT_TENSOR(ty(IR_DTYPE_F32, 1, 3, 0, 0), "ids.weight", MOEC_ERR_MISMATCH,
                  "has dtype I32, expected F32, F16 or BF16");
    EXPECT_TENSOR(ty(IR_DTYPE_I32, 2, 3, 4, 0), "model.embed.weight", MOEC_ERR_MISMATCH,
                  "has dtype BF16, expected I32");

    /* A stack one expert too long: the missing member is named. */
    ir_binding stk = {.kind = IR_BIND_STACK,
                      .name = "model.layers.0.mlp.experts.{e}.up_proj.weight",
                      .count = 4};
    snprintf(want, sizeof want,
             "weight %%w: tensor 'model.layers.0.mlp.experts.3.up_proj.weight' not found in %s",
             g_dir);
    expect_open_err(ty(IR_DTYPE_BF16, 3, 4, 2, 3), &stk, g_dir, MOEC_ERR_MISMATCH, want,
                    __LINE__);
    stk.count = 3;
    expect_open_err(ty(IR_DTYPE_BF16, 3, 3, 3, 2), &stk, g_dir, MOEC_ERR_MISMATCH,
                    "tensor 'model.layers.0.mlp.experts.0.up_proj.weight' in", __LINE__);
    expect_open_err(ty(IR_DTYPE_BF16, 3, 3, 3, 2), &stk, g_dir, MOEC_ERR_MISMATCH,
                    "has shape [2, 3], expected [3, 2]", __LINE__);
    expect_open_err(ty(IR_DTYPE_F16, 3, 3, 2, 3), &stk, g_dir, MOEC_ERR_MISMATCH,
                    "has dtype BF16, expected F16", __LINE__);

    /* Concatenations: parts must agree off the axis and sum to it. */
    ir_binding parts[2] = {{.kind = IR_BIND_TENSOR, .name = "q_a.weight"},
                           {.kind = IR_BIND_TENSOR, .name = "kv_a.weight"}};
    ir_binding cat = {.kind = IR_BIND_CONCAT, .axis = 0, .n_parts = 2, .parts = parts};
    expect_open_err(ty(IR_DTYPE_BF16, 2, 4, 3, 0), &cat, g_dir, MOEC_ERR_MISMATCH,
                    "weight %w: concat parts sum to 3 along axis 0, expected 4", __LINE__);
    snprintf(want, sizeof want,
             "weight %%w: tensor 'q_a.weight' in %s has shape [2, 3], expected [*, 4]", g_file);
    expect_open_err(ty(IR_DTYPE_BF16, 2, 3, 4, 0), &cat, g_dir, MOEC_ERR_MISMATCH, want,
                    __LINE__);
    parts[1].name = "kv_b.weight";
    snprintf(want, sizeof want, "weight %%w: tensor 'kv_b.weight' not found in %s", g_dir);
    expect_open_err(ty(IR_DTYPE_BF16, 2, 3, 3, 0), &cat, g_dir, MOEC_ERR_MISMATCH, want,
                    __LINE__);
    ir_binding sparts[2] = {
        {.kind = IR_BIND_STACK, .name = "model.layers.0.mlp.experts.{e}.gate_proj.weight",
         .count = 3},
        {.kind = IR_BIND_STACK, .name = "model.layers.0.mlp.experts.{e}.up_proj.weight",
         .count = 3}};
    ir_binding scat = {.kind = IR_BIND_CONCAT, .axis = 1, .n_parts = 2, .parts = sparts};
    expect_open_err(ty(IR_DTYPE_BF16, 3, 3, 5, 3), &scat, g_dir, MOEC_ERR_MISMATCH,
                    "weight %w: concat parts sum to 4 along axis 1, expected 5", __LINE__);
    expect_open_err(ty(IR_DTYPE_BF16, 3, 3, 4, 2), &scat, g_dir, MOEC_ERR_MISMATCH,
                    "tensor 'model.layers.0.mlp.experts.0.gate_proj.weight' in", __LINE__);
    expect_open_err(ty(IR_DTYPE_BF16, 3, 3, 4, 2), &scat, g_dir, MOEC_ERR_MISMATCH,
                    "has shape [2, 3], expected [*, 2]", __LINE__);

    /* A checkpoint whose experts disagree in shape. */
    const char *dir = t_tmpdir("wt-bad");
    char path[4200];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    static fixture f;
    add_bf16(&f, "e.0.w", 2, 2, 3, 0.0f);
    add_bf16(&f, "e.1.w", 2, 2, 4, 0.0f);
    fixture_write(&f, path);
    ir_binding st2 = {.kind = IR_BIND_STACK, .name = "e.{e}.w", .count = 2};
    snprintf(want, sizeof want,
             "weight %%w: tensor 'e.1.w' in %s has shape [2, 4], expected [2, 3]", path);
    expect_open_err(ty(IR_DTYPE_BF16, 3, 2, 2, 3), &st2, dir, MOEC_ERR_MISMATCH, want, __LINE__);
    /* ... also inside a concat on a non-leading axis, where the first expert
     * sets the extent the others must share. */
    ir_binding cparts[2] = {{.kind = IR_BIND_STACK, .name = "e.{e}.w", .count = 2},
                            {.kind = IR_BIND_STACK, .name = "e.{e}.w", .count = 2}};
    ir_binding ccat = {.kind = IR_BIND_CONCAT, .axis = 2, .n_parts = 2, .parts = cparts};
    expect_open_err(ty(IR_DTYPE_BF16, 3, 2, 2, 6), &ccat, dir, MOEC_ERR_MISMATCH,
                    "tensor 'e.1.w' in", __LINE__);
    expect_open_err(ty(IR_DTYPE_BF16, 3, 2, 2, 6), &ccat, dir, MOEC_ERR_MISMATCH,
                    "has shape [2, 4], expected [2, 3]", __LINE__);

    /* The first failing weight is the one reported. */
    ir_module *m = ir_module_init("first");
    T_CHECK(ir_module_add_weight(m, "ok", ty(IR_DTYPE_BF16, 2, 3, 4, 0), "model.embed.weight"));
    T_CHECK(ir_module_add_weight(m, "bad1", ty(IR_DTYPE_BF16, 1, 4, 0, 0), "nope1"));
    T_CHECK(ir_module_add_weight(m, "bad2", ty(IR_DTYPE_BF16, 1, 4, 0, 0), "nope2"));
    rt_weights *w = NULL;
    T_ERR(rt_weights_open(m, g_dir, &w), MOEC_ERR_MISMATCH, "weight %bad1: tensor 'nope1'");
    /* No checkpoint at all. */
    const char *empty = t_tmpdir("wt-empty");
    snprintf(want, sizeof want, "no *.safetensors in %s", empty);
    T_ERR(rt_weights_open(m, empty, &w), MOEC_ERR_IO, want);
    T_CHECK(w == NULL);
    ir_module_free(m);
}

/* ---- float8 e4m3 and block scales ------------------------------------------ */

/* The OCP FP8 E4M3 value of code c, from the format's definition in double
 * arithmetic (not the loader's bit manipulation): sign, 4 exponent bits of
 * bias 7, 3 mantissa bits; exponent 0 subnormal; S.1111.111 the only NaN. */
static double e4m3_ref(int c)
{
    int sign = c >> 7, e = (c >> 3) & 15, m = c & 7;
    if (e == 15 && m == 7)
        return NAN;
    double v = e == 0 ? ldexp(m, -9) : ldexp(8 + m, e - 10);
    return sign ? -v : v;
}

static void test_e4m3_codes(void)
{
    int bad = 0;
    for (int c = 0; c < 256; c++) {
        float got = rt_f8e4m3_to_f32((uint8_t)c);
        double want = e4m3_ref(c);
        if (!same_float(got, (float)want)) {
            bad++;
            fprintf(stderr, "e4m3 0x%02x -> %a, want %a\n", c, (double)got, want);
        }
    }
    T_CHECK(bad == 0);
    /* Landmarks of the format, written out. */
    T_CHECK(rt_f8e4m3_to_f32(0x7e) == 448.0f && rt_f8e4m3_to_f32(0xfe) == -448.0f);
    T_CHECK(rt_f8e4m3_to_f32(0x38) == 1.0f && rt_f8e4m3_to_f32(0xb8) == -1.0f);
    T_CHECK(rt_f8e4m3_to_f32(0x01) == 0x1p-9f && rt_f8e4m3_to_f32(0x07) == 0x1.cp-7f);
    T_CHECK(rt_f8e4m3_to_f32(0x08) == 0x1p-6f && rt_f8e4m3_to_f32(0x77) == 240.0f);
    T_CHECK(isnan(rt_f8e4m3_to_f32(0x7f)) && isnan(rt_f8e4m3_to_f32(0xff)));
    T_CHECK(!isnan(rt_f8e4m3_to_f32(0x7e)) && !isinf(rt_f8e4m3_to_f32(0x78)));
    T_CHECK(rt_f8e4m3_to_f32(0x80) == 0.0f && signbit(rt_f8e4m3_to_f32(0x80)));
}

static const char *g_fp8_dir; /* the fp8 checkpoint */
static char g_fp8_file[4096];

/* q [3, 5] in blocks of [2, 2]: scales [2, 3]; experts e.0, e.1 [2, 3] in
 * blocks of [1, 2]: scales [2, 2]; a.w [2, 5], b.w [3, 5] for concatenation. */
static const uint8_t Q35[15] = {0x38, 0xb8, 0x01, 0x7e, 0x00, 0x07, 0x08, 0x77,
                                0x80, 0x3c, 0x44, 0xc4, 0x2a, 0x7e, 0x5d};
static const float S23[6] = {0.5f, 2.0f, 0.125f, 3.0f, 1e-3f, -1.0f};
static const uint8_t E23[2][6] = {{0x38, 0x40, 0x48, 0x50, 0x01, 0x81},
                                  {0x30, 0x31, 0x32, 0xb3, 0x34, 0x35}};
static const float E22[2][4] = {{1.0f, 0.25f, 4.0f, 0.0625f}, {-2.0f, 8.0f, 0.75f, 1.5f}};

static void make_fp8_checkpoint(void)
{
    g_fp8_dir = t_tmpdir("wt-fp8");
    snprintf(g_fp8_file, sizeof g_fp8_file, "%s/model.safetensors", g_fp8_dir);
    static fixture f;
    add_shaped(&f, "q.weight", RT_ST_F8_E4M3, 2, 3, 5, Q35);
    add_shaped(&f, "q.weight_scale_inv", RT_ST_F32, 2, 2, 3, S23);
    for (int e = 0; e < 2; e++) {
        char name[64];
        snprintf(name, sizeof name, "e.%d.weight", e);
        add_shaped(&f, name, RT_ST_F8_E4M3, 2, 2, 3, E23[e]);
        snprintf(name, sizeof name, "e.%d.weight_scale_inv", e);
        add_shaped(&f, name, RT_ST_F32, 2, 2, 2, E22[e]);
    }
    add_shaped(&f, "a.weight", RT_ST_F8_E4M3, 2, 2, 5, Q35);
    add_shaped(&f, "a.weight_scale_inv", RT_ST_F32, 2, 1, 3, S23);
    add_shaped(&f, "b.weight", RT_ST_F8_E4M3, 2, 3, 5, Q35);
    add_shaped(&f, "b.weight_scale_inv", RT_ST_F32, 2, 2, 3, S23);
    /* misfits */
    const uint16_t bf[6] = {0x3f80, 0x3f80, 0x3f80, 0x3f80, 0x3f80, 0x3f80};
    add_shaped(&f, "bf.weight", RT_ST_BF16, 2, 2, 3, bf);
    add_shaped(&f, "bf.weight_scale_inv", RT_ST_F32, 2, 1, 1, S23);
    add_shaped(&f, "s16.weight", RT_ST_F8_E4M3, 2, 2, 3, E23[0]);
    add_shaped(&f, "s16.weight_scale_inv", RT_ST_BF16, 2, 1, 1, bf);
    add_shaped(&f, "nos.weight", RT_ST_F8_E4M3, 2, 2, 3, E23[0]);
    add_shaped(&f, "v0.weight", RT_ST_F8_E4M3, 1, 6, 0, E23[0]);
    add_shaped(&f, "v0.weight_scale_inv", RT_ST_F32, 1, 1, 0, S23);
    const float nan_s[4] = {1.0f, 2.0f, NAN, 1.0f}, inf_s[4] = {1.0f, -INFINITY, 1.0f, 1.0f};
    add_shaped(&f, "n.weight", RT_ST_F8_E4M3, 2, 2, 3, E23[0]);
    add_shaped(&f, "n.weight_scale_inv", RT_ST_F32, 2, 2, 2, nan_s);
    add_shaped(&f, "i.weight", RT_ST_F8_E4M3, 2, 2, 3, E23[0]);
    add_shaped(&f, "i.weight_scale_inv", RT_ST_F32, 2, 2, 2, inf_s);
    fixture_write(&f, g_fp8_file);
}

/* W[i][j] = q[i][j] * s[i / b0][j / b1] of a [rows, cols] tensor, computed in
 * double from e4m3_ref and rounded once (what one fp32 multiply gives). */
static float deq(const uint8_t *q, const float *s, int cols, int b0, int b1, int i, int j)
{
    int scols = (cols + b1 - 1) / b1;
    return (float)(e4m3_ref(q[i * cols + j]) * (double)s[(i / b0) * scols + j / b1]);
}

/* Opens a module of one weight bound by b, block-scaled [b0, b1] by sb. */
static ir_module *fp8_module(ir_type t, const ir_binding *b, const ir_binding *sb, int64_t b0,
                             int64_t b1)
{
    ir_module *m = ir_module_init("fp8");
    ir_value *v = ir_module_add_weight_bound(m, "w", t, b);
    if (!v || ir_weight_set_block_scale(m, v, b0, b1, sb) != MOEC_OK) {
        fprintf(stderr, "building the fp8 module failed: %s\n", moec_last_error());
        exit(2);
    }
    return m;
}

/* %w [5, 5]: tensors "<first>.weight" and "<second>.weight" ([2, 5] and
 * [3, 5], a and b) joined along the rows, their scales likewise, in blocks
 * of 2 x 2. */
static ir_module *fp8_rows_module(const char *first, const char *second)
{
    char names[4][32];
    snprintf(names[0], sizeof names[0], "%s.weight", first);
    snprintf(names[1], sizeof names[1], "%s.weight", second);
    snprintf(names[2], sizeof names[2], "%s.weight_scale_inv", first);
    snprintf(names[3], sizeof names[3], "%s.weight_scale_inv", second);
    ir_binding parts[2] = {{.kind = IR_BIND_TENSOR, .name = names[0]},
                           {.kind = IR_BIND_TENSOR, .name = names[1]}};
    ir_binding sparts[2] = {{.kind = IR_BIND_TENSOR, .name = names[2]},
                            {.kind = IR_BIND_TENSOR, .name = names[3]}};
    ir_binding cat = {.kind = IR_BIND_CONCAT, .axis = 0, .n_parts = 2, .parts = parts};
    ir_binding scat = {.kind = IR_BIND_CONCAT, .axis = 0, .n_parts = 2, .parts = sparts};
    return fp8_module(ty(IR_DTYPE_F8E4M3, 2, 5, 5, 0), &cat, &scat, 2, 2);
}

/* Reads weight %w of m from the fp8 checkpoint into buf (NaN past it). */
static int read_fp8(ir_module *m, float *buf, int n)
{
    rt_weights *w = NULL;
    T_OK(rt_weights_open(m, g_fp8_dir, &w));
    for (int i = 0; i < n; i++)
        buf[i] = NAN;
    int ok = w && rt_weights_read_f32(w, ir_module_find_value(m, "w"), buf) == MOEC_OK;
    T_CHECK(ok);
    rt_weights_free(w);
    return ok;
}

static void test_fp8_reads(void)
{
    float buf[64];
    int bad = 0;
    /* One tensor: a partial block in each direction (rows 2 of 3, cols 4 of 5). */
    ir_binding q = {.kind = IR_BIND_TENSOR, .name = "q.weight"};
    ir_binding qs = {.kind = IR_BIND_TENSOR, .name = "q.weight_scale_inv"};
    ir_module *m = fp8_module(ty(IR_DTYPE_F8E4M3, 2, 3, 5, 0), &q, &qs, 2, 2);
    if (read_fp8(m, buf, 64)) {
        for (int i = 0; i < 3; i++)
            for (int j = 0; j < 5; j++)
                bad += !same_float(buf[i * 5 + j], deq(Q35, S23, 5, 2, 2, i, j));
        T_CHECK(bad == 0 && isnan(buf[15]));
        T_CHECK(buf[3] == 896.0f && buf[14] == -26.0f && buf[1] == -0.5f);
    }
    ir_module_free(m);
    /* Dequantized at load into a float weight: the same values. */
    m = fp8_module(ty(IR_DTYPE_BF16, 2, 3, 5, 0), &q, &qs, 2, 2);
    if (read_fp8(m, buf, 64))
        T_CHECK(same_float(buf[7], deq(Q35, S23, 5, 2, 2, 1, 2)));
    ir_module_free(m);

    /* A stack: each expert by its own scales. */
    ir_binding e = {.kind = IR_BIND_STACK, .name = "e.{e}.weight", .count = 2};
    ir_binding es = {.kind = IR_BIND_STACK, .name = "e.{e}.weight_scale_inv", .count = 2};
    m = fp8_module(ty(IR_DTYPE_F8E4M3, 3, 2, 2, 3), &e, &es, 1, 2);
    if (read_fp8(m, buf, 64)) {
        bad = 0;
        for (int x = 0; x < 2; x++)
            for (int i = 0; i < 2; i++)
                for (int j = 0; j < 3; j++)
                    bad += !same_float(buf[x * 6 + i * 3 + j], deq(E23[x], E22[x], 3, 1, 2, i, j));
        T_CHECK(bad == 0 && buf[6 + 3] == -0x1.6p-1f * 0.75f);
    }
    ir_module_free(m);

    /* A concatenation along the rows, the first part two whole blocks. */
    m = fp8_rows_module("a", "b");
    if (read_fp8(m, buf, 64)) {
        bad = 0;
        for (int j = 0; j < 5; j++) {
            for (int i = 0; i < 2; i++)
                bad += !same_float(buf[i * 5 + j], deq(Q35, S23, 5, 2, 2, i, j));
            for (int i = 0; i < 3; i++)
                bad += !same_float(buf[(2 + i) * 5 + j], deq(Q35, S23, 5, 2, 2, i, j));
        }
        T_CHECK(bad == 0);
    }
    ir_module_free(m);
}

/* Weight %w of m read as stored (rt_weights_read_f8) gives the codes
 * `codes` (n of them) and the scales `scales` (ns), and dequantizing them
 * by the grid rt_weights_read_f8 documents, code i times scale
 * [.., row / b0, col / b1], is bit for bit what rt_weights_read_f32 gives:
 * the layout the GPU kernels index. */
static void expect_raw(ir_module *m, const uint8_t *codes, int n, const float *scales, int ns)
{
    const ir_value *v = ir_module_find_value(m, "w");
    rt_weights *w = NULL;
    T_OK(rt_weights_open(m, g_fp8_dir, &w));
    uint8_t q[64];
    float s[64], f[64];
    memset(q, 0xee, sizeof q);
    for (int i = 0; i < 64; i++)
        s[i] = NAN;
    if (!w || rt_weights_read_f8(w, v, q, s) != MOEC_OK ||
        rt_weights_read_f32(w, v, f) != MOEC_OK) {
        T_CHECK(!"reading the fp8 weight");
        rt_weights_free(w);
        ir_module_free(m);
        return;
    }
    T_CHECK(!memcmp(q, codes, (size_t)n) && q[n] == 0xee);
    T_CHECK(!memcmp(s, scales, (size_t)ns * sizeof *s) && isnan(s[ns]));
    int r = v->type.rank;
    int64_t rows = v->type.dims[r - 2], cols = v->type.dims[r - 1];
    ir_type st = ir_block_scale_type(v);
    int64_t srows = st.dims[r - 2], scols = st.dims[r - 1];
    int bad = 0;
    for (int i = 0; i < n; i++) {
        int64_t col = i % cols, row = (i / cols) % rows, lead = i / (cols * rows);
        int64_t si = (lead * srows + row / v->scale.block[0]) * scols + col / v->scale.block[1];
        bad += !same_float(rt_f8e4m3_to_f32(q[i]) * s[si], f[i]);
    }
    T_CHECK(bad == 0);
    rt_weights_free(w);
    ir_module_free(m);
}

static void test_fp8_raw(void)
{
    ir_binding q = {.kind = IR_BIND_TENSOR, .name = "q.weight"};
    ir_binding qs = {.kind = IR_BIND_TENSOR, .name = "q.weight_scale_inv"};
    expect_raw(fp8_module(ty(IR_DTYPE_F8E4M3, 2, 3, 5, 0), &q, &qs, 2, 2), Q35, 15, S23, 6);
    /* a stack: expert after expert, codes and scales alike */
    ir_binding e = {.kind = IR_BIND_STACK, .name = "e.{e}.weight", .count = 2};
    ir_binding es = {.kind = IR_BIND_STACK, .name = "e.{e}.weight_scale_inv", .count = 2};
    uint8_t codes[64];
    float scales[64];
    memcpy(codes, E23[0], 6);
    memcpy(codes + 6, E23[1], 6);
    memcpy(scales, E22[0], sizeof E22[0]);
    memcpy(scales + 4, E22[1], sizeof E22[1]);
    expect_raw(fp8_module(ty(IR_DTYPE_F8E4M3, 3, 2, 2, 3), &e, &es, 1, 2), codes, 12, scales, 8);
    /* rows of a then rows of b; the scale rows likewise */
    memcpy(codes, Q35, 10);
    memcpy(codes + 10, Q35, 15);
    memcpy(scales, S23, 3 * sizeof *scales);
    memcpy(scales + 3, S23, 6 * sizeof *scales);
    expect_raw(fp8_rows_module("a", "b"), codes, 25, scales, 9);
    /* gate_up as the passes fuse it: concat(1, stack, stack), per expert
       the first stack's rows then the second's, and their scale rows */
    ir_binding parts[2] = {e, e}, sparts[2] = {es, es};
    ir_binding cat = {.kind = IR_BIND_CONCAT, .axis = 1, .n_parts = 2, .parts = parts};
    ir_binding scat = {.kind = IR_BIND_CONCAT, .axis = 1, .n_parts = 2, .parts = sparts};
    for (int x = 0; x < 2; x++) {
        memcpy(codes + 12 * x, E23[x], 6);
        memcpy(codes + 12 * x + 6, E23[x], 6);
        memcpy(scales + 8 * x, E22[x], sizeof E22[x]);
        memcpy(scales + 8 * x + 4, E22[x], sizeof E22[x]);
    }
    expect_raw(fp8_module(ty(IR_DTYPE_F8E4M3, 3, 2, 4, 3), &cat, &scat, 1, 2), codes, 24, scales,
               16);
    /* refined (fusion's finer blocks, ir_weight_refine_block_scale): each
       stored scale repeated over the finer blocks it holds; q and b (3
       rows each, 1.5 blocks of 2) joined, in blocks of 1 x 1 */
    ir_binding qb[2] = {q, {.kind = IR_BIND_TENSOR, .name = "b.weight"}};
    ir_binding qbs[2] = {qs, {.kind = IR_BIND_TENSOR, .name = "b.weight_scale_inv"}};
    ir_binding qcat = {.kind = IR_BIND_CONCAT, .axis = 0, .n_parts = 2, .parts = qb};
    ir_binding qscat = {.kind = IR_BIND_CONCAT, .axis = 0, .n_parts = 2, .parts = qbs};
    memcpy(codes, Q35, 15);
    memcpy(codes + 15, Q35, 15);
    for (int i = 0; i < 6; i++)
        for (int j = 0; j < 5; j++)
            scales[i * 5 + j] = S23[(i % 3) / 2 * 3 + j / 2];
    ir_module *m = fp8_module(ty(IR_DTYPE_F8E4M3, 2, 6, 5, 0), &qcat, &qscat, 2, 2);
    T_OK(ir_weight_refine_block_scale(m, ir_module_find_value(m, "w"), 1, 1));
    expect_raw(m, codes, 30, scales, 30);
    /* a box of q (rows 2..3, the second block of rows) in blocks of 1 x 2 */
    ir_binding qbox = q, qsbox = qs;
    qbox.box_rank = qsbox.box_rank = 2;
    qbox.box_start[0] = 2;
    qbox.box_size[0] = 1;
    qsbox.box_start[0] = 1;
    qsbox.box_size[0] = 1;
    m = fp8_module(ty(IR_DTYPE_F8E4M3, 2, 1, 5, 0), &qbox, &qsbox, 2, 2);
    T_OK(ir_weight_refine_block_scale(m, ir_module_find_value(m, "w"), 1, 2));
    expect_raw(m, Q35 + 10, 5, S23 + 3, 3);
    /* the experts' gate_up above, in blocks of 1 x 1 */
    for (int x = 0; x < 2; x++) {
        memcpy(codes + 12 * x, E23[x], 6);
        memcpy(codes + 12 * x + 6, E23[x], 6);
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 3; j++)
                scales[x * 12 + i * 3 + j] = E22[x][(i % 2) * 2 + j / 2];
    }
    m = fp8_module(ty(IR_DTYPE_F8E4M3, 3, 2, 4, 3), &cat, &scat, 1, 2);
    T_OK(ir_weight_refine_block_scale(m, ir_module_find_value(m, "w"), 1, 1));
    expect_raw(m, codes, 24, scales, 24);
    /* a weight dequantized at load has no fp8 form to read */
    m = fp8_module(ty(IR_DTYPE_BF16, 2, 3, 5, 0), &q, &qs, 2, 2);
    rt_weights *w = NULL;
    T_OK(rt_weights_open(m, g_fp8_dir, &w));
    uint8_t b[16];
    float f[8];
    if (w)
        T_ERR(rt_weights_read_f8(w, ir_module_find_value(m, "w"), b, f), MOEC_ERR_INVALID_ARG,
              "rt_weights_read_f8: weight %w is not kept in fp8 (dtype bf16)");
    rt_weights_free(w);
    ir_module_free(m);
}

/* Opening weight %w (type t, bound by b, scales by sb in blocks b0 x b1) in
 * the fp8 checkpoint fails with st and needle. */
static void expect_module_err(ir_module *m, moec_status st, const char *needle, int line)
{
    rt_weights *w = (rt_weights *)1;
    t_expect_err(rt_weights_open(m, g_fp8_dir, &w), st, needle, "rt_weights_open", __FILE__, line);
    T_CHECK(w == NULL);
    ir_module_free(m);
}

static void expect_fp8_err(ir_type t, const ir_binding *b, const ir_binding *sb, int64_t b0,
                           int64_t b1, moec_status st, const char *needle, int line)
{
    expect_module_err(fp8_module(t, b, sb, b0, b1), st, needle, line);
}

#define FP8_ERR(t, tensor, scale, b0, b1, needle)                                                \
    do {                                                                                         \
        ir_binding b_ = {.kind = IR_BIND_TENSOR, .name = (tensor)};                              \
        ir_binding s_ = {.kind = IR_BIND_TENSOR, .name = (scale)};                               \
        expect_fp8_err((t), &b_, &s_, (b0), (b1), MOEC_ERR_MISMATCH, (needle), __LINE__);        \
    } while (0)

static void test_fp8_errors(void)
{
    char want[8192];
    const ir_type f8_23 = ty(IR_DTYPE_F8E4M3, 2, 2, 3, 0);
    snprintf(want, sizeof want,
             "weight %%w: scale tensor 'nos.weight_scale_inv' (of 'nos.weight') not found in %s",
             g_fp8_dir);
    FP8_ERR(f8_23, "nos.weight", "nos.weight_scale_inv", 128, 128, want);
    snprintf(want, sizeof want,
             "weight %%w: scale tensor 's16.weight_scale_inv' in %s has dtype BF16, expected F32",
             g_fp8_file);
    FP8_ERR(f8_23, "s16.weight", "s16.weight_scale_inv", 128, 128, want);
    snprintf(want, sizeof want,
             "weight %%w: tensor 'bf.weight' in %s has dtype BF16, expected F8_E4M3 (the config "
             "quantizes it: quantization_config)",
             g_fp8_file);
    FP8_ERR(f8_23, "bf.weight", "bf.weight_scale_inv", 128, 128, want);
    /* A block size the shapes contradict: [2, 3] in blocks of 1 x 2 needs [2, 2] scales. */
    snprintf(want, sizeof want,
             "weight %%w: scale tensor 'q.weight_scale_inv' in %s has shape [2, 3], expected "
             "[3, 3] ('q.weight' is [3, 5] in blocks of [1, 2])",
             g_fp8_file);
    FP8_ERR(ty(IR_DTYPE_F8E4M3, 2, 3, 5, 0), "q.weight", "q.weight_scale_inv", 1, 2, want);
    FP8_ERR(ty(IR_DTYPE_F8E4M3, 2, 3, 5, 0), "q.weight", "e.0.weight_scale_inv", 2, 2,
            "scale tensor 'e.0.weight_scale_inv' in");
    FP8_ERR(ty(IR_DTYPE_F8E4M3, 2, 3, 5, 0), "q.weight", "e.0.weight_scale_inv", 2, 2,
            "has shape [2, 2], expected [2, 3] ('q.weight' is [3, 5] in blocks of [2, 2])");
    snprintf(want, sizeof want,
             "weight %%w: scale tensor 'n.weight_scale_inv' in %s holds nan at element 2; scales "
             "must be finite",
             g_fp8_file);
    FP8_ERR(f8_23, "n.weight", "n.weight_scale_inv", 1, 2, want);
    FP8_ERR(f8_23, "i.weight", "i.weight_scale_inv", 1, 2,
            "scale tensor 'i.weight_scale_inv' in");
    FP8_ERR(f8_23, "i.weight", "i.weight_scale_inv", 1, 2, "holds inf at element 1");
    /* A stack whose rank-1 tensors have no rows to block. */
    ir_binding v = {.kind = IR_BIND_STACK, .name = "v{e}.weight", .count = 1};
    ir_binding vs = {.kind = IR_BIND_STACK, .name = "v{e}.weight_scale_inv", .count = 1};
    expect_fp8_err(ty(IR_DTYPE_F8E4M3, 2, 1, 6, 0), &v, &vs, 1, 2, MOEC_ERR_MISMATCH,
                   "weight %w: tensor 'v0.weight' has rank 1; a block-scaled tensor needs rows and "
                   "columns",
                   __LINE__);
    /* An fp8 tensor the config does not quantize. */
    ir_module *m = ir_module_init("plain");
    T_CHECK(ir_module_add_weight(m, "w", ty(IR_DTYPE_BF16, 2, 3, 5, 0), "q.weight") != NULL);
    rt_weights *w = NULL;
    snprintf(want, sizeof want,
             "weight %%w: tensor 'q.weight' in %s has dtype F8_E4M3, expected BF16 (an fp8 tensor, "
             "but the config does not quantize this weight: quantization_config)",
             g_fp8_file);
    T_ERR(rt_weights_open(m, g_fp8_dir, &w), MOEC_ERR_MISMATCH, want);
    ir_module_free(m);
    /* A stack: the missing member's scale is named. */
    ir_binding e = {.kind = IR_BIND_STACK, .name = "e.{e}.weight", .count = 2};
    ir_binding es = {.kind = IR_BIND_STACK, .name = "e.{e}.weight_scale_nope", .count = 2};
    expect_fp8_err(ty(IR_DTYPE_F8E4M3, 3, 2, 2, 3), &e, &es, 1, 2, MOEC_ERR_MISMATCH,
                   "weight %w: scale tensor 'e.0.weight_scale_nope' (of 'e.0.weight') not found",
                   __LINE__);
    /* A concatenation whose first part ends inside a block: [3, 5] then [2, 5]. */
    expect_module_err(fp8_rows_module("b", "a"), MOEC_ERR_MISMATCH,
                   "weight %w: concat part 0 ('b.weight') spans 3 along axis 0, not a multiple "
                   "of the 2 of a scale block: the parts' blocks would not line up",
                   __LINE__);
}

int main(void)
{
    make_good_checkpoint();
    test_reads();
    test_errors();
    test_e4m3_codes();
    make_fp8_checkpoint();
    test_fp8_reads();
    test_fp8_raw();
    test_fp8_errors();
    return t_finish("test_weights");
}
