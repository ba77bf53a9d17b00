/* gpu_model.c — the CUDA backend against the CPU interpreter on every tiny
 * model in tests/data (the fp8 ones too: their kernels read e4m3 codes and
 * block scales, the interpreter dequantizes exactly). Through the public
 * API: the prompt (prompt.json) and 8 greedy
 * decode steps (each backend fed the interpreter's tokens), in fp32 (rows
 * within 1e-4 of max |ref|, greedy tokens identical) and bf16 (the worst row
 * within 2e-2, the mean within 5e-2; on the models a near-tie decides,
 * bf16_on_a_tie, the worst printed and the mean within 0.1;
 * differing tokens are reported, not failed); in bf16 teacher-forced on the
 * golden against transformers' own bf16 error (check_vs_transformers); and
 * a 150-token prompt
 * that runs in chunks of the largest bucket across KV pages. Through the
 * runtime: 3 sequences decoded together in one step (slots 0, 1, 2, plus a
 * padding row) equal each decoded alone and the interpreter, the sampled
 * ids are the rows' argmax, and bad steps fail before they run; a plan for
 * another arch and one that does not fit the device's memory are refused
 * at init. A plan file (moec_compile, fp32) run by moec_session_init_plan
 * gives the greedy tokens and rows of the in-process CUDA session. Sessions
 * replay CUDA Graphs (captured at init; gpu_graphs.c checks them against
 * the eager launches). Every row must be finite (the arena starts poisoned
 * with NaN). Without a
 * device: "SKIP: no CUDA device", exit 0. */
#include <cjson/cJSON.h>
#include <math.h>
#include <string.h>
#include <unistd.h>

#include "codegen/cg.h"
#include "compiler/api_internal.h"
#include "compiler/passes.h"
#include "runtime/cuda_rt.h"
#include "runtime/weights.h"
#include "testlib.h"

#ifdef MOEC_HAVE_CUDA
#include <cuda_runtime_api.h>

/* Free device memory, to see that rt_cuda_free gives back all it took. */
static size_t device_free_bytes(void)
{
    size_t free_b = 0, total_b = 0;
    if (cudaFree(NULL) != cudaSuccess || cudaMemGetInfo(&free_b, &total_b) != cudaSuccess)
        return 0;
    return free_b;
}
#else
static size_t device_free_bytes(void) { return 0; }
#endif

static const char *MODELS[] = {"deepseek_v2",        "deepseek_v2_qlora", "deepseek_v3",
                               "qwen2_moe",          "qwen3_moe",         "deepseek_v3_fp8",
                               "qwen3_moe_fp8",      "deepseek_v32",      "deepseek_v3_fp8_tp",
                               "qwen3_moe_fp8_tp"};

#define DECODE 8      /* greedy steps after the prompt */
#define LONG 150      /* the chunked prompt: 64 + 64 + 22 tokens, three KV pages */
#define N_SEQ 3       /* the batch test */
#define BATCH_STEPS 4

static int read_prompt(const char *dir, int32_t *prompt, int cap)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/prompt.json", dir);
    char *text = t_read_file(path, NULL);
    cJSON *g = cJSON_Parse(text);
    free(text);
    int n = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, cJSON_GetObjectItem(g, "prompt_ids"))
    {
        if (n < cap)
            prompt[n] = (int32_t)it->valuedouble;
        n++;
    }
    cJSON_Delete(g);
    return n <= cap ? n : -1;
}

/* Runs prompt (P tokens) then `steps` single tokens on a session, writing
 * P + steps logits rows. With feed NULL each decode token is the argmax of
 * the previous row, and feed_out (when given) receives them; otherwise the
 * tokens come from feed. */
static moec_status run_session(moec_session_t *s, const int32_t *prompt, int P, int steps, int V,
                               const int32_t *feed, int32_t *feed_out, float *rows)
{
    moec_status st = moec_session_forward(s, prompt, P, rows);
    for (int k = 0; k < steps && st == MOEC_OK; k++) {
        int32_t tok = feed ? feed[k] : t_argmax(rows + (size_t)(P + k - 1) * V, V);
        if (feed_out)
            feed_out[k] = tok;
        st = moec_session_forward(s, &tok, 1, rows + (size_t)(P + k) * V);
    }
    return st;
}

/* Compares rows [from, to) of got against ref: returns the worst error and
 * counts argmax disagreements. */
static double compare_rows(const float *got, const float *ref, int from, int to, int V,
                           int *token_diffs)
{
    double worst = 0;
    *token_diffs = 0;
    for (int r = from; r < to; r++) {
        worst = fmax(worst, t_row_error(got + (size_t)r * V, ref + (size_t)r * V, V));
        *token_diffs += t_argmax(got + (size_t)r * V, V) != t_argmax(ref + (size_t)r * V, V);
    }
    return worst;
}

/* Tiny models whose bf16 rows a discrete choice decides: a near-tie that
 * bf16 noise flips, in moec and in transformers alike but not in the same
 * rows (BENCHMARKS.md, "bf16 numerics"). deepseek_v32: its indexer picks 8
 * of up to 28 positions with boundary gaps down to 2.4e-3 of the largest
 * score (test_dsa), under the ~1e-2 that bf16 moves a score: a bf16 run
 * selects differently somewhere and attends to another token (transformers'
 * own bf16 flips 3 argmaxes). deepseek_v3_fp8_tp: one token's expert choice
 * (4 experts, grouped sigmoid routing) sits on a tie: the CPU interpreter
 * rounding every result to bf16 but silu_mul's (bf16_probe --kinds) makes
 * the same 0.86 row the GPU makes, and 0.017 otherwise. For them the worst
 * row is printed, not held, and the mean is held to 0.1 (every other
 * model's: 5e-2), which a kernel that computes wrong would not meet; fp32
 * is exact for every model (1e-4). */
static int bf16_on_a_tie(const char *name)
{
    return !strcmp(name, "deepseek_v32") || !strcmp(name, "deepseek_v3_fp8_tp");
}
static double bf16_limit(const char *name) { return bf16_on_a_tie(name) ? INFINITY : 2e-2; }
static double bf16_mean_limit(const char *name) { return bf16_on_a_tie(name) ? 0.1 : 5e-2; }

/* The prompt and DECODE steps on CUDA in one dtype against the interpreter. */
static void check_session(const char *name, const moec_model_t *m, const char *dir,
                          const int32_t *prompt, int P, const int32_t *feed, const float *ref,
                          int fp32)
{
    int V = moec_model_vocab_size(m);
    int rows_n = P + DECODE;
    setenv("MOEC_DTYPE", fp32 ? "fp32" : "bf16", 1);
    moec_session_t *s = NULL;
    float *got = malloc((size_t)rows_n * V * sizeof *got);
    T_OK(moec_session_init(m, dir, MOEC_BACKEND_CUDA, rows_n, &s));
    if (!s || !got) {
        free(got);
        return;
    }
    T_CHECK(moec_session_backend(s) == MOEC_BACKEND_CUDA);
    T_OK(run_session(s, prompt, P, DECODE, V, feed, NULL, got));
    T_CHECK(moec_session_length(s) == rows_n);
    int finite = t_all_finite(got, (size_t)rows_n * V);
    int diffs;
    double worst = compare_rows(got, ref, 0, rows_n, V, &diffs);
    double mean = t_mean_row_error(got, ref, rows_n, V);
    int greedy_diffs;
    compare_rows(got, ref, P - 1, rows_n, V, &greedy_diffs);
    double limit = fp32 ? 1e-4 : bf16_limit(name);
    printf("%-18s %s: prompt %d + %d decode steps: max row error %.3g (limit %.0e), mean %.3g "
           "(limit %.0e), greedy tokens %s%s\n",
           name, fp32 ? "fp32" : "bf16", P, DECODE, worst, limit, mean,
           fp32 ? 1e-4 : bf16_mean_limit(name),
           greedy_diffs ? "DIFFER" : "identical", finite ? "" : ", NON-FINITE LOGITS");
    T_CHECK(mean <= (fp32 ? 1e-4 : bf16_mean_limit(name)));
    if (greedy_diffs && !fp32)
        printf("%-18s bf16: %d of %d greedy tokens differ from the interpreter (reported, not "
               "failed)\n",
               name, greedy_diffs, DECODE + 1);
    T_CHECK(finite);
    T_CHECK(worst <= limit);
    if (fp32)
        T_CHECK(greedy_diffs == 0);
    /* A sequence full to max_seq_len takes nothing more. */
    int32_t one = 1;
    T_ERR(moec_session_forward(s, &one, 1, NULL), MOEC_ERR_CAPACITY, "do not fit");
    free(got);
    moec_session_free(s);
}

/* A prompt longer than the largest bucket, fp32: chunks, padding, pages. */
static void check_long_prompt(const char *name, const moec_model_t *m, const char *dir)
{
    int V = moec_model_vocab_size(m);
    int32_t prompt[LONG];
    for (int i = 0; i < LONG; i++)
        prompt[i] = (int32_t)((i * 37 + 11) % V);
    int rows_n = LONG + 2;
    float *ref = malloc((size_t)rows_n * V * sizeof *ref);
    float *got = malloc((size_t)rows_n * V * sizeof *got);
    int32_t feed[2];
    moec_session_t *cpu = NULL, *gpu = NULL;
    T_OK(moec_session_init(m, dir, MOEC_BACKEND_CPU, rows_n, &cpu));
    setenv("MOEC_DTYPE", "fp32", 1);
    T_OK(moec_session_init(m, dir, MOEC_BACKEND_CUDA, rows_n, &gpu));
    if (cpu && gpu && ref && got) {
        T_OK(run_session(cpu, prompt, LONG, 2, V, NULL, feed, ref));
        T_OK(run_session(gpu, prompt, LONG, 2, V, feed, NULL, got));
        int diffs;
        double worst = compare_rows(got, ref, 0, rows_n, V, &diffs);
        int finite = t_all_finite(got, (size_t)rows_n * V);
        printf("%-18s fp32: %d-token prompt in chunks + 2 steps: max row error %.3g, %d argmax "
               "differences%s\n",
               name, LONG, worst, diffs, finite ? "" : ", NON-FINITE LOGITS");
        T_CHECK(finite);
        T_CHECK(worst <= 1e-4);
        T_CHECK(diffs == 0);
    }
    moec_session_free(cpu);
    moec_session_free(gpu);
    free(ref);
    free(got);
}

/* The batch test's sequences: different lengths, so different buckets. */
static const int SEQ_LEN[N_SEQ] = {8, 5, 11};

static int32_t seq_token(int s, int i, int V) { return (int32_t)((s * 53 + i * 29 + 3) % V); }

/* Prefills every sequence alone in its slot (last slot first); checks each
 * prompt's rows against ref. */
static void prefill_all(rt_cuda *c, int V, float *const ref[N_SEQ], const char *name)
{
    for (int s = N_SEQ - 1; s >= 0; s--) {
        int32_t tok[16], pos[16], slot[16];
        for (int i = 0; i < SEQ_LEN[s]; i++) {
            tok[i] = seq_token(s, i, V);
            pos[i] = i;
            slot[i] = s;
        }
        float *rows = malloc((size_t)SEQ_LEN[s] * V * sizeof *rows);
        int32_t sampled[16];
        T_OK(rt_cuda_step(c, SEQ_LEN[s], tok, pos, slot, rows, sampled));
        int diffs;
        double e = compare_rows(rows, ref[s], 0, SEQ_LEN[s], V, &diffs);
        if (e > 1e-4 || diffs)
            printf("%-18s prefill of slot %d: row error %.3g, %d argmax differences\n", name, s, e,
                   diffs);
        T_CHECK(e <= 1e-4);
        for (int i = 0; i < SEQ_LEN[s]; i++)
            T_CHECK(sampled[i] == t_argmax(rows + (size_t)i * V, V));
        free(rows);
    }
}

/* Broken plans, and a bad MOEC_GEMM_TUNE, fail at init with the step and
 * call (or the variable) named, and leave nothing behind (the caller
 * checks device memory). */
static void check_bad_plans(ir_plan *plan, const rt_weights *w)
{
    rt_cuda *c = NULL;
    char arch[sizeof plan->arch];
    memcpy(arch, plan->arch, sizeof arch);
    snprintf(plan->arch, sizeof plan->arch, "sm_10");
    T_ERR(rt_cuda_init(plan, w, 2, 64, &c), MOEC_ERR_UNSUPPORTED,
          "the plan was compiled for sm_10, but device 0");
    memcpy(plan->arch, arch, sizeof arch);
    /* 4096 sequences of 2^20 tokens: terabytes of KV cache. */
    T_ERR(rt_cuda_init(plan, w, 4096, 1 << 20, &c), MOEC_ERR_CAPACITY, "MiB) free");
    T_CHECK(c == NULL);
    ir_bucket *b0 = &plan->buckets[0], *bl = &plan->buckets[plan->n_buckets - 1];
    char *kept = b0->kernel_names[0];
    b0->kernel_names[0] = "no_such_kernel";
    T_ERR(rt_cuda_init(plan, w, 2, 64, &c), MOEC_ERR_CUDA,
          "bucket T=1: kernel no_such_kernel: cudaLibraryGetKernel: cudaError");
    b0->kernel_names[0] = kept;
    T_CHECK(c == NULL);
    for (int i = 0; i < bl->n_steps; i++) {
        ir_step *s = &bl->steps[i];
        if (s->kind == IR_STEP_KERNEL && s->n_args > 0) {
            ir_arg keep = s->args[0];
            s->args[0].kind = IR_ARG_ACT;
            s->args[0].index = plan->module->n_values + 5;
            T_ERR(rt_cuda_init(plan, w, 2, 64, &c), MOEC_ERR_INTERNAL, "argument 0: value id");
            s->args[0] = keep;
            break;
        }
    }
    for (int i = 0; i < bl->n_steps; i++) {
        ir_step *s = &bl->steps[i];
        if (s->kind == IR_STEP_GEMM) {
            ir_dtype keep = s->gemm.type_c;
            s->gemm.type_c = keep == IR_DTYPE_F32 ? IR_DTYPE_BF16 : IR_DTYPE_F32;
            T_ERR(rt_cuda_init(plan, w, 2, 64, &c), MOEC_ERR_INTERNAL, "but the gemm reads it as");
            s->gemm.type_c = keep;
            break;
        }
    }
    T_CHECK(c == NULL);
    /* MOEC_GEMM_TUNE past its bound or not a number (kept as the test's
       environment set it: gpu_model_gemm_tune runs with 8) */
    const char *tune = getenv("MOEC_GEMM_TUNE");
    char kept_tune[32];
    snprintf(kept_tune, sizeof kept_tune, "%s", tune ? tune : "");
    static const char *const bad_tune[] = {"17", "8x", "-1"};
    for (int i = 0; i < 3; i++) {
        char want[128];
        snprintf(want, sizeof want,
                 "MOEC_GEMM_TUNE=\"%s\": not a count of cuBLASLt algorithms from 0 to 16",
                 bad_tune[i]);
        setenv("MOEC_GEMM_TUNE", bad_tune[i], 1);
        T_ERR(rt_cuda_init(plan, w, 2, 64, &c), MOEC_ERR_INVALID_ARG, want);
        T_CHECK(c == NULL);
    }
    if (tune)
        setenv("MOEC_GEMM_TUNE", kept_tune, 1);
    else
        unsetenv("MOEC_GEMM_TUNE");
}

static void check_batch(const char *name, const moec_model_t *m, const char *dir)
{
    int V = moec_model_vocab_size(m);
    /* The interpreter's rows of each sequence: prompt, then BATCH_STEPS greedy steps. */
    float *ref[N_SEQ] = {0};
    int32_t feed[N_SEQ][BATCH_STEPS];
    for (int s = 0; s < N_SEQ; s++) {
        int32_t prompt[16];
        for (int i = 0; i < SEQ_LEN[s]; i++)
            prompt[i] = seq_token(s, i, V);
        ref[s] = malloc((size_t)(SEQ_LEN[s] + BATCH_STEPS) * V * sizeof(float));
        moec_session_t *cpu = NULL;
        T_OK(moec_session_init(m, dir, MOEC_BACKEND_CPU, SEQ_LEN[s] + BATCH_STEPS, &cpu));
        if (cpu)
            T_OK(run_session(cpu, prompt, SEQ_LEN[s], BATCH_STEPS, V, NULL, feed[s], ref[s]));
        moec_session_free(cpu);
    }

    ir_module *fm = NULL;
    rt_weights *w = NULL;
    ir_plan *plan = NULL;
    rt_cuda *together = NULL, *alone = NULL;
    pass_options po;
    pass_options_default(&po);
    po.compute_dtype = IR_DTYPE_F32;
    cg_options co;
    cg_options_default(&co);
    co.compute_dtype = IR_DTYPE_F32;
    size_t free_before = device_free_bytes();
    T_OK(ir_module_clone(moec_model_module(m), &fm));
    if (fm)
        T_OK(pass_run_pipeline(fm, &po, NULL, NULL, NULL, NULL));
    if (fm)
        T_OK(rt_weights_open(fm, dir, &w));
    if (w)
        T_OK(cg_plan_build(fm, &co, &plan));
    if (plan) {
        check_bad_plans(plan, w);
        T_OK(rt_cuda_init(plan, w, 4, 64, &together));
        T_OK(rt_cuda_init(plan, w, 4, 64, &alone));
    }
    if (together && alone) {
        T_CHECK(rt_cuda_logits_cols(together) == V);
        prefill_all(together, V, ref, name);
        prefill_all(alone, V, ref, name);
        double worst_ref = 0, worst_alone = 0;
        int sampled_ok = 1, finite = 1;
        float *rows = malloc((size_t)N_SEQ * V * sizeof *rows);
        float *one = malloc((size_t)V * sizeof *one);
        for (int k = 0; k < BATCH_STEPS; k++) {
            int32_t tok[N_SEQ], pos[N_SEQ], slot[N_SEQ], sampled[N_SEQ];
            for (int s = 0; s < N_SEQ; s++) {
                tok[s] = feed[s][k];
                pos[s] = SEQ_LEN[s] + k;
                slot[s] = s;
            }
            T_OK(rt_cuda_step(together, N_SEQ, tok, pos, slot, rows, sampled));
            finite &= t_all_finite(rows, (size_t)N_SEQ * V);
            for (int s = 0; s < N_SEQ; s++) {
                const float *row = rows + (size_t)s * V;
                sampled_ok &= sampled[s] == t_argmax(row, V);
                worst_ref = fmax(worst_ref,
                                 t_row_error(row, ref[s] + (size_t)(SEQ_LEN[s] + k) * V, V));
                T_OK(rt_cuda_step(alone, 1, &tok[s], &pos[s], &slot[s], one, NULL));
                worst_alone = fmax(worst_alone, t_row_error(row, one, V));
            }
        }
        printf("%-18s fp32: %d sequences in one step x %d: max row error %.3g vs the interpreter, "
               "%.3g vs each alone; sampled ids %s\n",
               name, N_SEQ, BATCH_STEPS, worst_ref, worst_alone,
               sampled_ok ? "are the argmax" : "WRONG");
        T_CHECK(finite);
        T_CHECK(sampled_ok);
        T_CHECK(worst_ref <= 1e-4);
        T_CHECK(worst_alone <= 1e-4);

        /* Bad steps fail before anything runs, and the context still works. */
        int32_t tok = 1, pos = 64, slot = 0, bad_slot = 4, bad_tok = V, zero = 0;
        T_ERR(rt_cuda_step(together, 1, &tok, &pos, &slot, NULL, NULL), MOEC_ERR_CAPACITY,
              "does not fit the KV cache of 64 tokens");
        T_ERR(rt_cuda_step(together, 1, &tok, &zero, &bad_slot, NULL, NULL), MOEC_ERR_INVALID_ARG,
              "slot 4 is not in [0, 4)");
        T_ERR(rt_cuda_step(together, 1, &bad_tok, &zero, &slot, NULL, NULL), MOEC_ERR_INVALID_ARG,
              "outside the vocabulary");
        T_ERR(rt_cuda_step(together, 0, &tok, &zero, &slot, NULL, NULL), MOEC_ERR_INVALID_ARG,
              "a step runs 1 to");
        T_ERR(rt_cuda_step(together, rt_cuda_max_tokens(together) + 1, &tok, &zero, &slot, NULL,
                           NULL),
              MOEC_ERR_INVALID_ARG, "a step runs 1 to");
        int32_t again;
        T_OK(rt_cuda_step(together, 1, &tok, &zero, &slot, NULL, &again));
        free(rows);
        free(one);
    }
    size_t held = rt_cuda_device_bytes(together) + rt_cuda_device_bytes(alone);
    rt_cuda_free(together);
    rt_cuda_free(alone);
    size_t free_after = device_free_bytes();
    if (free_after != free_before)
        printf("%-18s device memory free: %zu bytes before two contexts (%zu bytes), %zu after\n",
               name, free_before, held, free_after);
    T_CHECK(free_after == free_before);
    ir_plan_free(plan);
    rt_weights_free(w);
    ir_module_free(fm);
    for (int s = 0; s < N_SEQ; s++)
        free(ref[s]);
}

/* The model compiled to a plan file (fp32, default buckets: the cubins the
 * in-process session compiled, from the cache) and run from it: the same
 * greedy tokens and rows as the in-process CUDA session. */
static void check_plan_file(const char *name, const moec_model_t *m, const char *dir,
                            const int32_t *prompt, int P)
{
    int V = moec_model_vocab_size(m);
    int rows_n = P + DECODE;
    char tmp[4096], path[4200];
    snprintf(tmp, sizeof tmp, "%s", t_tmpdir("gpu-plan"));
    snprintf(path, sizeof path, "%s/%s.moec", tmp, name);
    moec_compile_options o = {0};
    o.dtype = "fp32";
    T_OK(moec_compile(m, dir, &o, path));
    setenv("MOEC_DTYPE", "fp32", 1);
    moec_session_t *inproc = NULL, *fromfile = NULL;
    T_OK(moec_session_init(m, dir, MOEC_BACKEND_CUDA, rows_n, &inproc));
    T_OK(moec_session_init_plan(path, dir, rows_n, &fromfile));
    float *a = malloc((size_t)rows_n * V * sizeof *a), *b = malloc((size_t)rows_n * V * sizeof *b);
    int32_t ta[DECODE], tb[DECODE];
    if (inproc && fromfile && a && b) {
        T_CHECK(moec_session_vocab_size(fromfile) == V &&
                moec_session_eos_token(fromfile) == moec_model_eos_token(m));
        T_OK(run_session(inproc, prompt, P, DECODE, V, NULL, ta, a));
        T_OK(run_session(fromfile, prompt, P, DECODE, V, NULL, tb, b));
        int diffs;
        double worst = compare_rows(b, a, 0, rows_n, V, &diffs);
        int same = !memcmp(ta, tb, sizeof ta);
        printf("%-18s fp32: plan file vs in-process plan: max row error %.3g, greedy tokens %s\n",
               name, worst, same ? "identical" : "DIFFER");
        T_CHECK(same && diffs == 0);
        T_CHECK(worst <= 1e-5);
    }
    free(a);
    free(b);
    moec_session_free(inproc);
    moec_session_free(fromfile);
    remove(path);
    rmdir(tmp);
}

/* moec's bf16 rows against transformers' own: the prompt and the golden's
 * greedy tokens fed back (teacher-forced) on CUDA in bf16, each row's error
 * against the fp32 golden (logits.bin), held to twice what transformers
 * itself makes in bf16 on the same rows (golden.json's transformers_bf16,
 * scripts/make_goldens.py): the worst row and the mean row. On the models
 * a tie decides (bf16_on_a_tie) the worst is printed and the mean held to
 * 0.1. */
static void check_vs_transformers(const char *name, const moec_model_t *m, const char *dir)
{
    t_golden gd;
    int V = moec_model_vocab_size(m);
    int ok = t_golden_read(dir, &gd);
    if (ok)
        T_CHECK(gd.vocab == V);
    if (!ok || gd.vocab != V) {
        t_golden_free(&gd);
        return;
    }
    double want_worst = gd.tf_bf16_worst, want_mean = gd.tf_bf16_mean;
    if (want_worst < 0 || want_mean < 0) {
        printf("FAIL %s: golden.json has no transformers_bf16 errors (run scripts/gpu_goldens.sh "
               "with BF16_ONLY=1)\n",
               name);
        T_CHECK(!"no transformers bf16 error");
        t_golden_free(&gd);
        return;
    }
    int rows_n = gd.rows;
    const float *ref = gd.logits;
    float *got = malloc((size_t)rows_n * V * sizeof *got);
    setenv("MOEC_DTYPE", "bf16", 1);
    moec_session_t *s = NULL;
    T_OK(moec_session_init(m, dir, MOEC_BACKEND_CUDA, rows_n, &s));
    if (s && got) {
        T_OK(run_session(s, gd.prompt, gd.P, gd.G - 1, V, gd.greedy, NULL, got));
        int flips;
        double worst = compare_rows(got, ref, 0, rows_n, V, &flips);
        double mean = t_mean_row_error(got, ref, rows_n, V);
        int hold_worst = !bf16_on_a_tie(name);
        printf("%-18s bf16 teacher-forced vs the fp32 golden: worst row %.4g (transformers bf16 "
               "%.4g, ratio %.2f%s), mean row %.4g (transformers %.4g, ratio %.2f, %s), "
               "argmax flips %d/%d\n",
               name, worst, want_worst, worst / want_worst, hold_worst ? ", limit 2" : ", printed",
               mean, want_mean, mean / want_mean, hold_worst ? "limit 2" : "limit 0.1, on a tie",
               flips, rows_n);
        T_CHECK(!hold_worst || worst <= 2 * want_worst);
        /* on a tie the mean too is the flipped choice's (H100, 2026-11-24:
           deepseek_v32 0.064, 2.8x transformers' 0.023; deepseek_v3_fp8_tp
           0.062, one row of 0.86) */
        T_CHECK(hold_worst ? mean <= 2 * want_mean : mean <= bf16_mean_limit(name));
    }
    moec_session_free(s);
    free(got);
    t_golden_free(&gd);
}

static void check_model(const char *name)
{
    char rel[256];
    snprintf(rel, sizeof rel, "tests/data/%s", name);
    const char *dir = t_src(rel);
    int32_t prompt[64];
    int P = read_prompt(dir, prompt, 64);
    T_CHECK(P > 0);
    moec_model_t *m = NULL;
    T_OK(moec_model_open(dir, &m));
    if (!m || P <= 0)
        return;
    int V = moec_model_vocab_size(m);
    int rows_n = P + DECODE;
    float *ref = malloc((size_t)rows_n * V * sizeof *ref);
    int32_t feed[DECODE];
    moec_session_t *cpu = NULL;
    T_OK(moec_session_init(m, dir, MOEC_BACKEND_CPU, rows_n, &cpu));
    if (cpu && ref && run_session(cpu, prompt, P, DECODE, V, NULL, feed, ref) == MOEC_OK) {
        check_session(name, m, dir, prompt, P, feed, ref, 1);
        check_session(name, m, dir, prompt, P, feed, ref, 0);
        check_vs_transformers(name, m, dir);
        check_long_prompt(name, m, dir);
        check_batch(name, m, dir);
        check_plan_file(name, m, dir, prompt, P);
    } else {
        T_CHECK(!"the interpreter failed");
        fprintf(stderr, "%s: %s\n", name, moec_last_error());
    }
    moec_session_free(cpu);
    free(ref);
    moec_model_free(m);
}

int main(void)
{
    /* a line at a time: a run a time limit cuts keeps what it printed */
    setvbuf(stdout, NULL, _IOLBF, 0);
    int n = 0;
    if (moec_cuda_device_count(&n) != MOEC_OK || n < 1) {
        printf("SKIP: no CUDA device (%s)\n", moec_last_error());
        return 0;
    }
    for (size_t i = 0; i < sizeof MODELS / sizeof *MODELS; i++)
        check_model(MODELS[i]);
    return t_finish("gpu_model");
}
