/* test_fp8.c — fp8 block-scaled checkpoints end to end on the CPU, without
 * torch: each tiny fp8 model (tests/data/<family>_fp8) gives the logits, to 1e-6,
 * and the greedy tokens of its dequantized twin (the same weights written
 * as F32 by this test, quantization_config removed), unfused through the
 * public API and after the whole pass pipeline in its planned arena; the
 * twin scripts/make_goldens.py writes (what transformers loads for the
 * goldens) equals this test's bit for bit; and code generation reads each
 * fp8 weight's codes and scales through generated kernels (no bf16 copy,
 * no GEMM step). */
#include <cjson/cJSON.h>
#include <math.h>
#include <string.h>

#include "codegen/cg.h"
#include "compiler/frontend.h"
#include "compiler/passes.h"
#include "runtime/interp.h"
#include "runtime/weights.h"
#include "testlib.h"

static const char *const MODELS[] = {"deepseek_v3_fp8", "qwen3_moe_fp8"};
enum { MAX_TENSORS = 256, STEPS = 4 };

/* dir/config.json with quantization_config removed and torch_dtype float32. */
static void write_twin_config(const char *src, const char *dst)
{
    char path[8192];
    snprintf(path, sizeof path, "%s/config.json", src);
    char *text = t_read_file(path, NULL);
    cJSON *root = cJSON_Parse(text);
    free(text);
    T_CHECK(cJSON_GetObjectItemCaseSensitive(root, "quantization_config") != NULL);
    cJSON_DeleteItemFromObjectCaseSensitive(root, "quantization_config");
    cJSON_DeleteItemFromObjectCaseSensitive(root, "torch_dtype");
    cJSON_AddStringToObject(root, "torch_dtype", "float32");
    char *out = cJSON_Print(root);
    snprintf(path, sizeof path, "%s/config.json", dst);
    t_write_file(path, out, strlen(out));
    free(out);
    cJSON_Delete(root);
}

/* The dequantized twin of the fp8 checkpoint src in dst: every weight the
 * model binds, read through the loader (fp8 ones dequantized), written as
 * F32 under its published names. */
static void write_twin(const char *src, const char *dst)
{
    write_twin_config(src, dst);
    ir_module *m = NULL;
    rt_weights *w = NULL;
    T_OK(fe_model_load(src, &m));
    if (m)
        T_OK(rt_weights_open(m, src, &w));
    if (!w) {
        ir_module_free(m);
        return;
    }
    static rt_st_write_tensor t[MAX_TENSORS];
    static char names[MAX_TENSORS][160];
    float *bufs[MAX_TENSORS];
    int n = 0, n_bufs = 0;
    for (int i = 0; i < m->n_values; i++) {
        const ir_value *v = m->values[i];
        if (v->kind != IR_VALUE_WEIGHT)
            continue;
        float *buf = malloc((size_t)ir_type_numel(&v->type, 0) * sizeof *buf);
        T_OK(rt_weights_read_f32(w, v, buf));
        bufs[n_bufs++] = buf;
        int stack = v->bind.kind == IR_BIND_STACK;
        int count = stack ? v->bind.count : 1;
        int64_t per = ir_type_numel(&v->type, 0) / count;
        for (int e = 0; e < count && n < MAX_TENSORS; e++, n++) {
            const char *at = stack ? strstr(v->bind.name, "{e}") : NULL;
            if (at)
                snprintf(names[n], sizeof names[n], "%.*s%d%s", (int)(at - v->bind.name),
                         v->bind.name, e, at + 3);
            else
                snprintf(names[n], sizeof names[n], "%s", v->bind.name);
            t[n] = (rt_st_write_tensor){names[n], RT_ST_F32, v->type.rank - stack,
                                        v->type.dims + stack, buf + e * per};
        }
    }
    char path[8192];
    snprintf(path, sizeof path, "%s/model.safetensors", dst);
    T_OK(rt_safetensors_write(path, t, n));
    for (int i = 0; i < n_bufs; i++)
        free(bufs[i]);
    rt_weights_free(w);
    ir_module_free(m);
}

/* Prompt then greedy steps of the model in dir: `rows` gets every row
 * (P + STEPS of vocab). Through the public API (unfused), or with `fused`
 * the whole pipeline in its planned arena. 0 on failure. */
static int run(const char *dir, int fused, const int32_t *prompt, int P, int vocab, float *rows)
{
    moec_model_t *model = NULL;
    moec_session_t *s = NULL;
    ir_module *m = NULL;
    rt_weights *w = NULL;
    rt_interp *in = NULL;
    int ok = 0;
    if (!fused) {
        T_OK(moec_model_open(dir, &model));
        if (model)
            T_OK(moec_session_init(model, dir, MOEC_BACKEND_CPU, P + STEPS, &s));
    } else {
        T_OK(fe_model_load(dir, &m));
        if (m)
            T_OK(pass_run_pipeline(m, NULL, NULL, NULL, NULL, NULL));
        if (m)
            T_OK(rt_weights_open(m, dir, &w));
        if (w)
            T_OK(rt_interp_init(m, w, P + STEPS, &in));
        if (in)
            T_OK(rt_interp_use_plan(in, 1));
    }
    if (s || in) {
        int32_t pos[64], next;
        for (int i = 0; i < P + STEPS; i++)
            pos[i] = i;
        ok = (s ? moec_session_forward(s, prompt, P, rows)
                : rt_interp_forward(in, prompt, pos, P, rows)) == MOEC_OK;
        for (int k = 0; ok && k < STEPS; k++) {
            next = t_argmax(rows + (size_t)(P + k - 1) * vocab, vocab);
            float *row = rows + (size_t)(P + k) * vocab;
            ok = (s ? moec_session_forward(s, &next, 1, row)
                    : rt_interp_forward(in, &next, pos + P + k, 1, row)) == MOEC_OK;
        }
        T_CHECK(ok);
    }
    if (!ok)
        fprintf(stderr, "%s: %s\n", dir, moec_last_error());
    moec_session_free(s);
    moec_model_free(model);
    rt_interp_free(in);
    rt_weights_free(w);
    ir_module_free(m);
    return ok;
}

/* The fp8 model and its twin agree to tol per row, greedy tokens too. */
static void compare(const char *name, const char *dir, int fused, const char *twin, double tol)
{
    const int32_t prompt[8] = {0, 64, 128, 7, 19, 222, 45, 8};
    const int P = 8, vocab = 256, R = P + STEPS;
    float *a = malloc((size_t)R * vocab * sizeof *a), *b = malloc((size_t)R * vocab * sizeof *b);
    if (run(dir, fused, prompt, P, vocab, a) && run(twin, 0, prompt, P, vocab, b)) {
        double worst = 0;
        int same = 1;
        for (int r = 0; r < R; r++) {
            worst = fmax(worst, t_row_error(a + (size_t)r * vocab, b + (size_t)r * vocab, vocab));
            same &= t_argmax(a + (size_t)r * vocab, vocab) == t_argmax(b + (size_t)r * vocab, vocab);
        }
        printf("%-16s %-8s vs its F32 twin: max row error %.3g (limit %g), tokens %s\n", name,
               fused ? "compiled" : "unfused", worst, tol, same ? "identical" : "DIFFER");
        T_CHECK(worst <= tol && same && t_all_finite(a, (size_t)R * vocab));
    }
    free(a);
    free(b);
}

/* Every tensor of the twin make_goldens.py wrote equals this test's. */
static void compare_script_twin(const char *src, const char *twin)
{
    const char *py = t_tmpdir("fp8-pytwin");
    char cmd[16384], path[8192];
    snprintf(cmd, sizeof cmd, "python3 '%s' --dequantize '%s' '%s'",
             t_src("scripts/make_goldens.py"), src, py);
    if (system("python3 -c pass >/dev/null 2>&1") != 0) {
        printf("SKIP: no python3: make_goldens.py's dequantization NOT checked\n");
        return;
    }
    T_CHECK(system(cmd) == 0);
    rt_safetensors *a = NULL, *b = NULL;
    snprintf(path, sizeof path, "%s/model.safetensors", twin);
    T_OK(rt_safetensors_open_file(path, &a));
    snprintf(path, sizeof path, "%s/model.safetensors", py);
    T_OK(rt_safetensors_open_file(path, &b));
    if (a && b) {
        int bad = 0, n = rt_safetensors_count(a);
        T_CHECK(n == rt_safetensors_count(b) && n > 0);
        for (int i = 0; i < n; i++) {
            const rt_st_tensor *x = rt_safetensors_at(a, i);
            const rt_st_tensor *y = rt_safetensors_find(b, x->name);
            int same = y && y->dtype == RT_ST_F32 && y->rank == x->rank && y->nbytes == x->nbytes &&
                       !memcmp(y->shape, x->shape, sizeof x->shape[0] * (size_t)x->rank) &&
                       !memcmp(y->data, x->data, x->nbytes);
            if (!same)
                fprintf(stderr, "make_goldens.py's twin differs at '%s'\n", x->name);
            bad += !same;
        }
        T_CHECK(bad == 0);
        printf("make_goldens.py --dequantize %s: %d tensors, %d differ\n", src, n, bad);
    }
    rt_safetensors_free(a);
    rt_safetensors_free(b);
    ir_module *m = NULL;
    T_OK(fe_model_load(py, &m)); /* its config reads as unquantized f32 */
    for (int i = 0; m && i < m->n_values; i++)
        if (m->values[i]->kind == IR_VALUE_WEIGHT)
            T_CHECK(m->values[i]->scale.block[0] == 0);
    ir_module_free(m);
}

/* Whether weight w of c's module is read by some kernel step of c through
 * a pointer at byte offset `at` into its buffer; GEMM steps must not read
 * it at all (cuBLASLt has no bf16 x e4m3 product). */
static int kernel_reads(const cg_ctx *c, const ir_value *w, int64_t at, int *gemm)
{
    int found = 0;
    for (int i = 0; i < c->n_steps; i++) {
        const ir_step *s = &c->steps[i];
        if (s->kind == IR_STEP_GEMM) {
            const ir_arg *g[3] = {&s->gemm.a, &s->gemm.b, &s->gemm.c};
            for (int a = 0; a < 3; a++)
                *gemm += g[a]->kind == IR_ARG_WEIGHT && g[a]->index == w->id;
            continue;
        }
        for (int a = 0; a < s->n_args; a++)
            found |= s->args[a].kind == IR_ARG_WEIGHT && s->args[a].index == w->id &&
                     s->args[a].i == at;
    }
    return found;
}

/* Fragment tiles (ir/ir_plan.h): ir_tile_codes puts lane (g, q)'s 16
 * codes of rows g and g + 8 at columns 16 q of each 64-wide chunk of each
 * 16-row tile in lane order, as ir_tile_offset says; ir_weight_tiled
 * takes the experts' fp8 weights of m, whose shapes allow it, and nothing
 * else; under IR_FP8_TILES_DOWN only their down projections, under
 * IR_FP8_TILES_GATE_UP only their gate_up; under IR_FP8_TILES_NONE none;
 * IR_FP8_TILES_LINEAR adds the dense linears' weights whose shapes allow
 * it. */
static void test_tiles(ir_module *m)
{
    enum { R = 48, K = 192 };
    static uint8_t a[R * K], b[R * K];
    for (int i = 0; i < R * K; i++)
        a[i] = b[i] = (uint8_t)(i * 7 + i / K);
    T_CHECK(ir_tile_codes(b, R, K) == 0);
    int bad = 0;
    for (int t = 0; t < R / 16; t++)
        for (int c = 0; c < K / 64; c++)
            for (int h = 0; h < 2; h++)
                for (int g = 0; g < 8; g++)
                    for (int q = 0; q < 4; q++)
                        for (int j = 0; j < 16; j++)
                            bad += b[t * 16 * K + c * 1024 + h * 512 + (g * 4 + q) * 16 + j] !=
                                   a[(t * 16 + h * 8 + g) * K + c * 64 + q * 16 + j];
    for (int n = 0; n < R; n++)
        for (int k = 0; k < K; k++)
            bad += b[ir_tile_offset(n, k, K)] != a[n * K + k];
    T_CHECK(bad == 0);
    int tiled = 0, other = 0;
    ir_value *gate_up = NULL, *down = NULL; /* gate_up: the fused one, or gate */
    ir_op *lin = NULL;
    int fused = 0;
    for (int k = 0; k < m->n_ops; k++) {
        ir_op *op = m->ops[k];
        if (op->kind == IR_OP_MOE_ROUTED) {
            gate_up = op->in[3];
            down = op->in[op->n_in - 1];
            fused = op->n_in == 5;
        }
        if (op->kind == IR_OP_LINEAR && !lin)
            lin = op;
    }
    for (int i = 0; i < m->n_values; i++) {
        const ir_value *v = m->values[i];
        int want = v->kind == IR_VALUE_WEIGHT && v->type.dtype == IR_DTYPE_F8E4M3 &&
                   v->type.rank == 3;
        tiled += want;
        other += !want && v->kind == IR_VALUE_WEIGHT;
        T_CHECK(ir_weight_tiled(m, v, IR_FP8_TILES_ALL) == want);
        T_CHECK(!ir_weight_tiled(m, v, IR_FP8_TILES_NONE));
    }
    T_CHECK(tiled > 0 && other > 0 && gate_up && down && lin);
    if (!gate_up || !down || !lin)
        return;
    /* shapes it refuses: K not a multiple of 64, N not of 16 (of 32 for a
       fused gate_up, whose up starts at row N / 2; a gate alone takes 48) */
    int64_t n = gate_up->type.dims[1], kd = gate_up->type.dims[2], nd = down->type.dims[1];
    gate_up->type.dims[2] = kd + 16;
    T_CHECK(!ir_weight_tiled(m, gate_up, IR_FP8_TILES_ALL));
    gate_up->type.dims[2] = kd;
    gate_up->type.dims[1] = 48;
    down->type.dims[1] = 48;
    T_CHECK(ir_weight_tiled(m, gate_up, IR_FP8_TILES_ALL) == !fused &&
            ir_weight_tiled(m, down, IR_FP8_TILES_ALL));
    down->type.dims[1] = 40;
    T_CHECK(!ir_weight_tiled(m, down, IR_FP8_TILES_ALL));
    gate_up->type.dims[1] = n;
    down->type.dims[1] = nd;
    /* nor a weight that any other op reads */
    ir_value *w = lin->in[1];
    lin->in[1] = down;
    T_CHECK(!ir_weight_tiled(m, down, IR_FP8_TILES_ALL) &&
            ir_weight_tiled(m, gate_up, IR_FP8_TILES_ALL));
    lin->in[1] = w;
    T_CHECK(ir_weight_tiled(m, down, IR_FP8_TILES_ALL));
    /* the down weights alone: down, never gate_up (fused or gate) or up */
    T_CHECK(ir_weight_tiled(m, down, IR_FP8_TILES_DOWN));
    T_CHECK(!ir_weight_tiled(m, gate_up, IR_FP8_TILES_DOWN));
    for (int k = 0; k < m->n_ops; k++)
        if (m->ops[k]->kind == IR_OP_MOE_ROUTED && !fused)
            T_CHECK(!ir_weight_tiled(m, m->ops[k]->in[4], IR_FP8_TILES_DOWN));
    down->type.dims[1] = 40;
    T_CHECK(!ir_weight_tiled(m, down, IR_FP8_TILES_DOWN));
    down->type.dims[1] = nd;
    /* gate_up's alone: gate_up (or gate and up), never down */
    T_CHECK(ir_weight_tiled(m, gate_up, IR_FP8_TILES_GATE_UP));
    T_CHECK(!ir_weight_tiled(m, down, IR_FP8_TILES_GATE_UP));
    for (int k = 0; k < m->n_ops; k++)
        if (m->ops[k]->kind == IR_OP_MOE_ROUTED && !fused)
            T_CHECK(ir_weight_tiled(m, m->ops[k]->in[4], IR_FP8_TILES_GATE_UP));
    /* IR_FP8_TILES_LINEAR, beside any experts' mode (which it leaves as it
       was): the dense linears' fp8 weights [N, K] read only as a linear's
       weight, N a multiple of 16, K of 64, scale blocks of whole tiles and
       chunks */
    int dense = 0;
    ir_value *lw = NULL;
    for (int i = 0; i < m->n_values; i++) {
        ir_value *v = m->values[i];
        if (v->kind != IR_VALUE_WEIGHT || v->type.dtype != IR_DTYPE_F8E4M3 || v->type.rank != 2)
            continue;
        int used = 0, only = 1;
        for (int k = 0; k < m->n_ops; k++)
            for (int j = 0; j < m->ops[k]->n_in; j++)
                if (m->ops[k]->in[j] == v) {
                    used = 1;
                    only &= m->ops[k]->kind == IR_OP_LINEAR && j == 1;
                }
        int want = used && only && v->type.dims[0] % 16 == 0 && v->type.dims[1] % 64 == 0 &&
                   v->scale.block[0] % 16 == 0 && v->scale.block[1] % 64 == 0;
        dense += want;
        if (want && !lw)
            lw = v;
        T_CHECK(ir_weight_tiled(m, v, IR_FP8_TILES_LINEAR) == want);
        T_CHECK(ir_weight_tiled(m, v, IR_FP8_TILES_GATE_UP | IR_FP8_TILES_LINEAR) == want);
        T_CHECK(!ir_weight_tiled(m, v, IR_FP8_TILES_ALL));
    }
    T_CHECK(dense > 0 && lw);
    T_CHECK(!ir_weight_tiled(m, gate_up, IR_FP8_TILES_LINEAR) &&
            ir_weight_tiled(m, gate_up, IR_FP8_TILES_GATE_UP | IR_FP8_TILES_LINEAR) &&
            !ir_weight_tiled(m, down, IR_FP8_TILES_GATE_UP | IR_FP8_TILES_LINEAR) &&
            ir_weight_tiled(m, down, IR_FP8_TILES_ALL | IR_FP8_TILES_LINEAR));
    if (!lw)
        return;
    /* what it refuses: N not a multiple of 16, K not of 64, a scale block
       of 8 rows, a weight another op reads (here as a linear's input) */
    int64_t ln = lw->type.dims[0], lk = lw->type.dims[1], lb = lw->scale.block[0];
    lw->type.dims[0] = ln + 8;
    T_CHECK(!ir_weight_tiled(m, lw, IR_FP8_TILES_LINEAR));
    lw->type.dims[0] = ln;
    lw->type.dims[1] = lk + 32;
    T_CHECK(!ir_weight_tiled(m, lw, IR_FP8_TILES_LINEAR));
    lw->type.dims[1] = lk;
    lw->scale.block[0] = 8;
    T_CHECK(!ir_weight_tiled(m, lw, IR_FP8_TILES_LINEAR));
    lw->scale.block[0] = lb;
    ir_value *x = lin->in[0];
    lin->in[0] = lw;
    T_CHECK(!ir_weight_tiled(m, lw, IR_FP8_TILES_LINEAR));
    lin->in[0] = x;
    T_CHECK(ir_weight_tiled(m, lw, IR_FP8_TILES_LINEAR));
}

/* Code generation of the compiled fp8 models (no NVRTC: test_codegen
 * compiles them): each fp8 weight is stored as f8e4m3 with its scales
 * past its codes, and every bucket reads both through generated kernels
 * named for fp8, never through a GEMM step. */
static void test_codegen_fp8(const char *model, ir_dtype cdt)
{
    char rel[64];
    snprintf(rel, sizeof rel, "tests/data/%s", model);
    ir_module *m = NULL;
    pass_options po;
    pass_options_default(&po);
    po.compute_dtype = cdt;
    T_OK(fe_model_load(t_src(rel), &m));
    if (m)
        T_OK(pass_run_pipeline(m, &po, NULL, NULL, NULL, NULL));
    if (!m)
        return;
    if (cdt == IR_DTYPE_BF16)
        test_tiles(m);
    cg_options o;
    cg_options_default(&o);
    o.compute_dtype = cdt;
    int n_fp8 = 0, bad = 0, buckets[] = {1, 4, 5, 8, 64};
    for (int bi = 0; bi < 5; bi++) {
        cg_ctx c;
        memset(&c, 0, sizeof c);
        c.m = m;
        c.opt = &o;
        c.T = buckets[bi];
        for (int k = 0; k < m->n_ops; k++)
            T_OK(cg_emit_op(&c, m->ops[k]));
        n_fp8 = 0;
        for (int i = 0; i < m->n_values; i++) {
            const ir_value *v = m->values[i];
            if (v->kind != IR_VALUE_WEIGHT || v->type.dtype != IR_DTYPE_F8E4M3)
                continue;
            n_fp8++;
            ir_type st = ir_block_scale_type(v);
            size_t codes = (size_t)ir_type_numel(&v->type, 0), off = ir_weight_scale_offset(v);
            int gemm = 0;
            int ok = ir_value_storage_dtype(m, v, cdt) == IR_DTYPE_F8E4M3 && off >= codes &&
                     off < codes + 16 && off % 16 == 0 &&
                     ir_weight_storage_bytes(m, v, cdt) ==
                         off + 4 * (size_t)ir_type_numel(&st, 0) &&
                     kernel_reads(&c, v, 0, &gemm) && kernel_reads(&c, v, (int64_t)off, &gemm) &&
                     gemm == 0;
            if (!ok && bad++ < 5)
                fprintf(stderr, "%s %s T=%d: fp8 weight %%%s is not read as codes and scales by "
                                "kernels (%d GEMM reads)\n",
                        model, ir_dtype_name(cdt), c.T, v->name, gemm);
        }
        int named = 0;
        for (int k = 0; k < c.n_kernels; k++)
            named += strstr(c.kernel_names[k], "f8e4m3") != NULL;
        T_CHECK(named > 0);
        moec_buf_free(&c.src);
        for (int k = 0; k < c.n_kernels; k++)
            free(c.kernel_names[k]);
        free(c.kernel_names);
        free(c.steps);
    }
    printf("%-16s %s: %d fp8 weights, each read by kernels as codes and scales in every bucket "
           "(%d not)\n",
           model, ir_dtype_name(cdt), n_fp8, bad);
    T_CHECK(n_fp8 > 5 && bad == 0);
    ir_module_free(m);
}

int main(void)
{
    for (int i = 0; i < 2; i++) {
        char rel[64];
        snprintf(rel, sizeof rel, "tests/data/%s", MODELS[i]);
        char src[4096];
        snprintf(src, sizeof src, "%s", t_src(rel));
        const char *twin = t_tmpdir("fp8-twin");
        write_twin(src, twin);
        compare(MODELS[i], src, 0, twin, 1e-6);
        compare(MODELS[i], src, 1, twin, 1e-5);
        compare_script_twin(src, twin);
    }
    for (int i = 0; i < 2; i++) {
        test_codegen_fp8(MODELS[i], IR_DTYPE_BF16);
        test_codegen_fp8(MODELS[i], IR_DTYPE_F32);
    }
    return t_finish("test_fp8");
}
