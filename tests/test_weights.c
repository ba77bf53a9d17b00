/* test_weights.c — resolving a module's weight bindings against a
 * checkpoint: tensors, expert stacks and concatenations read back as fp32 in
 * the weight's layout, exact bf16/f16 widening, and the errors for a missing,
 * misshaped or wrongly typed tensor. */
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

static void add_raw(fixture *f, const char *name, rt_st_dtype dt, int64_t n, const void *src)
{
    int k = f->n++;
    size_t bytes = (size_t)n * rt_st_dtype_size(dt);
    void *p = malloc(bytes);
    memcpy(p, src, bytes);
    snprintf(f->names[k], sizeof f->names[k], "%s", name);
    f->shapes[k][0] = n;
    f->data[k] = p;
    f->t[k] = (rt_st_write_tensor){f->names[k], dt, 1, f->shapes[k], p};
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
    T_CHECK(embed && embed32 && norm && norm16 && f32w && ids && up && qkv_v && lr_v && gu_v &&
            st0_v && tok);
    if (!(embed && embed32 && norm && norm16 && f32w && ids && up && qkv_v && lr_v && gu_v &&
          st0_v && tok)) {
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
    EXPECT_TENSOR(ty(IR_DTYPE_BF16, 1, 4, 0, 0), "f32.weight", MOEC_ERR_MISMATCH,
                  "has dtype F32, expected BF16");
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

int main(void)
{
    make_good_checkpoint();
    test_reads();
    test_errors();
    return t_finish("test_weights");
}
