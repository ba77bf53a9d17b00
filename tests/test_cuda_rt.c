/* test_cuda_rt.c — the parts of the CUDA runtime and the CUDA session that
 * run without a GPU: the bf16 rounding weights are uploaded with, the plan
 * checks rt_cuda_init makes before it looks for a device, the clean "no
 * CUDA device" answer where there is none (CI), and AUTO sessions falling
 * back to the interpreter there. gpu_model.c runs the rest on a GPU. */
#include <math.h>
#include <string.h>

#include "runtime/cuda_rt.h"
#include "testlib.h"

static uint16_t bf16(float f)
{
    uint16_t h;
    rt_cuda_to_bf16(&f, &h, 1);
    return h;
}

static float from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static void test_bf16(void)
{
    T_CHECK(bf16(1.0f) == 0x3f80);
    T_CHECK(bf16(-2.0f) == 0xc000);
    T_CHECK(bf16(0.0f) == 0x0000);
    T_CHECK(bf16(-0.0f) == 0x8000);
    /* Halfway cases go to the even neighbour; anything above rounds up. */
    T_CHECK(bf16(from_bits(0x3f808000u)) == 0x3f80);
    T_CHECK(bf16(from_bits(0x3f818000u)) == 0x3f82);
    T_CHECK(bf16(from_bits(0x3f808001u)) == 0x3f81);
    T_CHECK(bf16(from_bits(0x3f807fffu)) == 0x3f80);
    T_CHECK(bf16(from_bits(0xbf818000u)) == 0xbf82);
    /* 1/3 = 0x3eaaaaab -> 0x3eab (the dropped half is above 0x8000). */
    T_CHECK(bf16(1.0f / 3.0f) == 0x3eab);
    /* The largest float rounds to infinity; infinities and NaNs stay so. */
    T_CHECK(bf16(from_bits(0x7f7fffffu)) == 0x7f80);
    T_CHECK(bf16(INFINITY) == 0x7f80);
    T_CHECK(bf16(-INFINITY) == 0xff80);
    uint16_t nan = bf16(NAN);
    T_CHECK((nan & 0x7f80) == 0x7f80 && (nan & 0x007f) != 0);
    /* A signalling NaN whose payload sits in the low bits must not become inf. */
    uint16_t snan = bf16(from_bits(0x7f800001u));
    T_CHECK((snan & 0x7f80) == 0x7f80 && (snan & 0x007f) != 0);
    /* Subnormals round like everything else. */
    T_CHECK(bf16(from_bits(0x00018000u)) == 0x0002);
    float many[5] = {1.0f, 2.0f, 3.0f, 0.5f, -1.5f};
    uint16_t out[5];
    rt_cuda_to_bf16(many, out, 5);
    T_CHECK(out[0] == 0x3f80 && out[1] == 0x4000 && out[2] == 0x4040 && out[3] == 0x3f00 &&
            out[4] == 0xbfc0);
}

/* A minimal module with an f32 logits output at an arena offset. */
static ir_module *tiny_module(void)
{
    static const char text[] =
        "module tiny {\n"
        "  input %tokens : i32[T]\n"
        "  input %positions : i32[T]\n"
        "  weight %embed : bf16[16, 8] = \"embed\"\n"
        "  %logits : f32[T, 8] = embedding(%tokens, %embed)\n"
        "  output %logits\n"
        "}\n";
    ir_module *m = NULL;
    T_OK(ir_module_parse(text, "tiny.mir", &m));
    if (m)
        m->values[3]->mem_offset = 0;
    return m;
}

static void test_init_checks(void)
{
    ir_module *m = tiny_module();
    if (!m)
        return;
    ir_bucket buckets[2];
    memset(buckets, 0, sizeof buckets);
    buckets[0].T = 1;
    buckets[1].T = 4;
    ir_plan plan = {.module = m, .compute_dtype = IR_DTYPE_BF16, .kv_block_size = 64,
                    .n_buckets = 2, .buckets = buckets};
    rt_weights *fake = (rt_weights *)&plan; /* never read: every check fails first */
    rt_cuda *c = (rt_cuda *)&plan;

    T_ERR(rt_cuda_init(&plan, fake, 1, 16, NULL), MOEC_ERR_INVALID_ARG, "out is NULL");
    T_ERR(rt_cuda_init(NULL, fake, 1, 16, &c), MOEC_ERR_INVALID_ARG, "NULL plan");
    T_CHECK(c == NULL);
    T_ERR(rt_cuda_init(&plan, fake, 0, 16, &c), MOEC_ERR_INVALID_ARG, "max_seqs (0)");
    T_ERR(rt_cuda_init(&plan, fake, 1, 0, &c), MOEC_ERR_INVALID_ARG, "max_seq_len (0)");
    plan.compute_dtype = IR_DTYPE_F16;
    T_ERR(rt_cuda_init(&plan, fake, 1, 16, &c), MOEC_ERR_UNSUPPORTED, "bf16 or f32, not f16");
    plan.compute_dtype = IR_DTYPE_F32;
    buckets[1].T = 1;
    T_ERR(rt_cuda_init(&plan, fake, 1, 16, &c), MOEC_ERR_INVALID_ARG,
          "positive and ascending (bucket 1 is T=1)");
    buckets[1].T = 4;
    plan.kv_block_size = 0;
    T_ERR(rt_cuda_init(&plan, fake, 1, 16, &c), MOEC_ERR_INVALID_ARG, "kv_block_size is 0");
    plan.kv_block_size = 64;
    m->values[3]->mem_offset = -1;
    T_ERR(rt_cuda_init(&plan, fake, 1, 16, &c), MOEC_ERR_INVALID_ARG,
          "output %logits must be an f32 activation with an arena offset");
    m->values[3]->mem_offset = 0;

    /* A well-formed plan gets as far as looking for the device. */
    int n = 0;
    if (moec_cuda_device_count(&n) != MOEC_OK) {
        T_ERR(rt_cuda_init(&plan, fake, 1, 16, &c), MOEC_ERR_NO_DEVICE, "no CUDA device");
        T_CHECK(c == NULL);
    }
    rt_cuda_free(NULL);
    T_CHECK(rt_cuda_max_tokens(NULL) == 0);
    T_CHECK(rt_cuda_logits_cols(NULL) == 0);
    T_CHECK(rt_cuda_device_bytes(NULL) == 0);
    T_ERR(rt_cuda_step(NULL, 1, NULL, NULL, NULL, NULL, NULL), MOEC_ERR_INVALID_ARG,
          "rt_cuda_step");
    ir_module_free(m);
}

/* Where there is no device: AUTO is the interpreter, CUDA a clear error. */
static void test_sessions_without_device(void)
{
    int n = 0;
    if (moec_cuda_device_count(&n) == MOEC_OK) {
        printf("a CUDA device is present: gpu_model covers the CUDA sessions\n");
        return;
    }
    const char *dir = t_src("tests/data/qwen3_moe");
    moec_model_t *m = NULL;
    T_OK(moec_model_open(dir, &m));
    if (!m)
        return;
    moec_session_t *s = NULL;
    T_OK(moec_session_init(m, dir, MOEC_BACKEND_AUTO, 8, &s));
    T_CHECK(s && moec_session_backend(s) == MOEC_BACKEND_CPU);
    int32_t ids[2] = {3, 5};
    float logits[2 * 256];
    if (s)
        T_OK(moec_session_forward(s, ids, 2, logits));
    T_CHECK(moec_session_length(s) == 2);
    moec_session_free(s);
    s = NULL;
    T_ERR(moec_session_init(m, dir, MOEC_BACKEND_CUDA, 8, &s), MOEC_ERR_NO_DEVICE,
          "no CUDA device");
    T_CHECK(s == NULL);
    moec_model_free(m);
}

int main(void)
{
    test_bf16();
    test_init_checks();
    test_sessions_without_device();
    return t_finish("test_cuda_rt");
}
