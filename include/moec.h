/* moec.h — the full public API of moec (libmoec): everything in moec_rt.h
 * (plan files, sessions, the engine) plus the compiler: a model read from
 * config.json and lowered to the IR, the pass pipeline and IR dumps, ahead
 * of time compilation to plan files, the decode benchmark, and sessions and
 * engines made from a model directly. Link libmoec for these; a service
 * that only runs plan files includes moec_rt.h and links libmoec_rt. */
#ifndef MOEC_H
#define MOEC_H

#include "moec_rt.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A model: config.json read and lowered to the unfused IR, verified.
 * Weights are not touched until a session is made. */
typedef struct moec_model moec_model_t;

/* Reads model_dir/config.json and, when the folder has one,
 * generation_config.json (for its eos_token_id). Only regular files are
 * read, and no key may appear twice in either. */
moec_status moec_model_open(const char *model_dir, moec_model_t **out);
/* The same from a config file of any name, with no generation config (for
 * tools that write a model from a config: moec-sample). */
moec_status moec_model_open_config(const char *config_path, moec_model_t **out);
void moec_model_free(moec_model_t *model);
/* Writes the module's IR text. */
moec_status moec_model_dump_ir(const moec_model_t *model, FILE *out);
/* The pass pipeline, in order: names and one-line descriptions. */
int moec_pass_count(void);
const char *moec_pass_name(int i);
const char *moec_pass_description(int i);
/* Writes the module after pass `pass` of the pipeline (see moec dump-ir
 * --help for the list), compiled for dtype "bf16" (NULL), "fp16" or "fp32".
 * A failing pass names itself and leaves its input IR in $TMPDIR. */
moec_status moec_model_dump_ir_after(const moec_model_t *model, const char *pass,
                                     const char *dtype, FILE *out);
/* tp, ep and rank in range and agreeing (ep divides tp; with tp 0, ep and
 * rank 0); MOEC_ERR_INVALID_ARG naming the one that is not. */
moec_status moec_parallel_check(const moec_parallel *par);
/* moec_model_dump_ir_after for one rank of par (pass NULL: "shard"). The
 * shapes that do not split evenly are refused naming the config field. */
moec_status moec_model_dump_ir_rank(const moec_model_t *model, const char *pass,
                                    const char *dtype, const moec_parallel *par, FILE *out);
/* moec_model_dump_passes for one rank of par. */
moec_status moec_model_dump_passes_rank(const moec_model_t *model, const char *dtype,
                                        const moec_parallel *par, const char *dir);

/* Writes dir/00_frontend.mir, then dir/NN_<pass>.mir after every pass, each
 * with a header line naming the pass; a failing pass leaves its input IR in
 * dir/moec-repro-<pass>.mir. */
moec_status moec_model_dump_passes(const moec_model_t *model, const char *dtype, const char *dir);
/* Writes a short summary: model type, layers, values, ops by kind, weights
 * and their bytes. */
moec_status moec_model_summary(const moec_model_t *model, FILE *out);
int moec_model_vocab_size(const moec_model_t *model);
int moec_model_max_positions(const moec_model_t *model);
/* The eos ids generation stops on, as transformers' generate() takes them:
 * generation_config.json's eos_token_id when that file sets one, else
 * config.json's (an id or a list), each in [0, vocab_size). *ids (when ids
 * is not NULL; owned by the model) gets them; returns how many (0: none). */
int moec_model_eos_tokens(const moec_model_t *model, const int32_t **ids);
/* The first of them, or -1 if there is none. */
int moec_model_eos_token(const moec_model_t *model);

/* The checkpoint tensors a model reads, as published (per-expert tensors
 * listed one by one), with the shape and dtype it expects. An fp8 tensor
 * (quantization_config) is followed by its F32 block scales,
 * "<name>_scale_inv". */
typedef enum moec_dtype {
    MOEC_DTYPE_F32 = 0,
    MOEC_DTYPE_F16,
    MOEC_DTYPE_BF16,
    MOEC_DTYPE_F8_E4M3,
} moec_dtype;
typedef struct moec_tensor_info {
    const char *name; /* owned by the model */
    moec_dtype dtype;
    int rank;
    int64_t shape[4];
} moec_tensor_info;
int moec_model_tensor_count(const moec_model_t *model);
moec_status moec_model_tensor_info(const moec_model_t *model, int i, moec_tensor_info *out);


/* A session from a model: every pass and (CUDA) the kernels compiled now;
 * see moec_rt.h for the rest of the session API. The session owns what it
 * runs on: the model may be freed once it is made (as with an engine). */
moec_status moec_session_init(const moec_model_t *model, const char *weights_dir,
                              moec_backend backend, int max_seq_len,
                              moec_session_t **out);

/* moec_session_init split over the ranks of par (NULL or tp 0: exactly
 * moec_session_init). On the CPU every rank has its reference interpreter
 * over its sharded module (the pipeline compiled for f32), all in this
 * process and in step, the collectives done in memory between them; each
 * rank reads only its slices of the checkpoint. */
moec_status moec_session_init_parallel(const moec_model_t *model, const char *weights_dir,
                                       moec_backend backend, int max_seq_len,
                                       const moec_parallel *par, moec_session_t **out);

#define MOEC_BUCKETS_MAX 16

/* Ahead-of-time compile (moec compile): every pass, then per batch bucket
 * the CUDA kernels generated and compiled with NVRTC for one GPU arch (no
 * GPU needed; cubins are cached by content), written with the launch
 * tables and the memory plan to a plan file at out_path, with hashes of
 * weights_dir's config.json and of the name, dtype and shape of every
 * checkpoint tensor the plan binds there: a plan runs only against that
 * checkpoint. First out_path is checked (MOEC_ERR_IO when it is a
 * directory, or its directory is missing or not writable), then the
 * checkpoint's tensors (not read). A zeroed struct (or NULL) gives the
 * defaults. */
typedef struct moec_compile_options {
    const char *arch;      /* "sm_90"; NULL: $MOEC_ARCH, else sm_90 */
    const char *dtype;     /* compute dtype: "bf16" (NULL) or "fp32" */
    int n_buckets;         /* batch buckets (tokens per step), ascending; 0: the
                            * default, 1, 2, 4, 8, 16, 32, 64 (moec_buckets_check) */
    int buckets[MOEC_BUCKETS_MAX];
    moec_parallel par;     /* tensor/expert parallelism (par.rank unused); zeroed:
                            * unsharded */
    const char *cache_dir; /* cubin cache; NULL: $MOEC_CACHE_DIR, else ~/.cache/moec/cubin */
    /* When not NULL, called as each bucket finishes compiling: the kernels
     * compiled so far (done) of all buckets' kernels (total). */
    void (*progress)(int done, int total, void *user);
    void *progress_user;
    /* "fp8": the checkpoint is first quantized (moec_quantize_fp8) into the
     * new folder quantized_dir (required then), and the plan is compiled
     * for that folder, which it then runs against (--weights). NULL: none. */
    const char *quantize;
    const char *quantized_dir;
    /* How the fp8 weights lie on the GPU (recorded in the plan; no effect
     * on bf16 weights; moec_fp8_layout_check): the routed experts' by one
     * of "gate_up" (gate_up's in fragment tiles), "tiles" (down's too),
     * "down" (down's alone) or "rows" (none), and with "+linear" the dense
     * linears' in tiles too. NULL: the default, "gate_up+linear" (or
     * $MOEC_FP8_TILES): faster than "gate_up" from 2 tokens a step (7-13%
     * at 2 to 4), 2.6% slower at one for DeepSeek-V2-Lite; "tiles" is
     * faster from 8 tokens and slower at 1 to 4 (docs/CUDA.md). */
    const char *fp8_layout;
} moec_compile_options;

/* The one check of an fp8 layout name (moec_compile_options.fp8_layout):
 * MOEC_ERR_INVALID_ARG unless it is gate_up, tiles, down or rows, alone or
 * followed by +linear. */
moec_status moec_fp8_layout_check(const char *layout);

/* The one check of a bucket list: 1 to MOEC_BUCKETS_MAX buckets, ascending,
 * each 1 to 4096 tokens; MOEC_ERR_INVALID_ARG naming the first that is not. */
moec_status moec_buckets_check(const int *buckets, int n);
/* The default buckets into out; returns how many. */
int moec_buckets_default(int out[MOEC_BUCKETS_MAX]);

moec_status moec_compile(const moec_model_t *model, const char *weights_dir,
                         const moec_compile_options *opt, const char *out_path);

/* Block-scaled fp8 from a bf16, f16 or f32 checkpoint (moec compile
 * --quantize fp8): writes the new folder out_dir (refused when it exists),
 * a model of its own: weights_dir's config.json with the quantization_config
 * DeepSeek-V3 publishes (quant_method fp8, fmt e4m3, activation_scheme
 * dynamic, weight_block_size [128, 128]), its generation_config.json, and
 * safetensors shards (model-NNNNN.safetensors) holding every tensor the
 * model binds: each linear the frontend quantizes (attention projections,
 * dense and shared MLPs, routed experts; docs/IR.md) as F8_E4M3 codes with
 * F32 "<name>_scale_inv" scales, one per block of 128 x 128 (edge blocks
 * partial): scale = amax / 448 (1 for a block of zeros), code = the e4m3
 * nearest to w / scale (moec_f32_to_f8e4m3); every other tensor as it is.
 * The folder is written under a temporary name and renamed into place. A
 * model quantized already, or a weight holding a NaN or an infinity, is
 * refused by name. stats (when not NULL) gets what was written. */
typedef struct moec_quantize_stats {
    int quantized; /* tensors quantized (each with its scales) */
    int copied;    /* tensors copied as they were */
    int shards;    /* safetensors files written */
} moec_quantize_stats;
moec_status moec_quantize_fp8(const moec_model_t *model, const char *weights_dir,
                              const char *out_dir, moec_quantize_stats *stats);
/* The float8_e4m3fn code nearest to f, ties to even, saturating at +-448
 * (the format has no infinities); NaN gives 0x7f. */
uint8_t moec_f32_to_f8e4m3(float f);

/* From a model: every pass and (CUDA) the kernels compiled now. */
moec_status moec_engine_open(const moec_model_t *model, const char *weights_dir,
                             const moec_engine_options *opt, moec_engine_t **out);

/* The context moec bench runs at by default, where the model allows it. */
#define MOEC_BENCH_DEFAULT_CONTEXT 1024

/* The decode benchmark (moec bench): per batch size B, B sequences at a
 * context of `context` tokens each decode one token per step; the median
 * step time over `steps` timed steps (CUDA events, after `warmup`) of each
 * way of running it (CUDA Graph replay or eager launches, the shared
 * experts on a second stream or not), the bytes that step must read (every
 * weight but the routed experts, the routed experts the step actually
 * selected, the embedding rows, the KV cache in use), and the floor: those
 * bytes over the device's measured copy bandwidth (read + write). Compute
 * dtype from MOEC_DTYPE (bf16), or the plan's. Before any device is looked
 * for, the plan is read and the context checked: MOEC_ERR_CAPACITY when
 * context + 1 (the token each step decodes) exceeds the model's
 * max_position_embeddings, with out->context and out->max_context set. */
typedef struct moec_bench_options {
    int n_batch;
    int batch[16];
    int context;           /* negative: MOEC_BENCH_DEFAULT_CONTEXT, or the model's
                            * max_position_embeddings - 1 where that is less */
    int steps;
    int warmup;
    const char *plan_path; /* bench a plan file (model may be NULL) instead of compiling */
    FILE *profile;         /* when not NULL: per batch size, time per kernel (eager, one
                            * stream, an event between every two launches) written here */
    moec_parallel par;     /* tp 0: the model unsharded, a plan as compiled. Else a model
                            * is compiled split so (docs/PARALLEL.md) and a plan must have
                            * been; every rank steps at once on its GPU, a thread each */
} moec_bench_options;

/* The most ranks a split bench reports on. */
#define MOEC_BENCH_MAX_RANKS 64

enum { MOEC_BENCH_GRAPH_DUAL, MOEC_BENCH_GRAPH_SINGLE, MOEC_BENCH_EAGER_DUAL,
       MOEC_BENCH_EAGER_SINGLE, MOEC_BENCH_MODES };

typedef struct moec_bench_row {
    int batch;
    double step_ms;      /* the default way: graph replay, two streams */
    double mode_ms[MOEC_BENCH_MODES]; /* every way, by MOEC_BENCH_* */
    double bytes;        /* read by one step */
    double floor_ms;     /* bytes / copy bandwidth */
    int experts_hit;     /* routed experts selected, summed over MoE layers */
    int experts_total;   /* routed experts, summed over MoE layers */
    /* A split (result tp > 0): each mode's time is the slowest rank's (each
     * rank timing its own steps with CUDA events), bytes, floor_ms and the
     * experts those of the rank reading the most; per rank below. */
    double rank_ms[MOEC_BENCH_MAX_RANKS];    /* graph replay, two streams (else eager) */
    double rank_bytes[MOEC_BENCH_MAX_RANKS]; /* what that rank reads */
    double coll_ms;      /* with a profile: the collectives' time per step, the most any
                          * rank spends in them (eager, one stream); -1 without */
} moec_bench_row;

typedef struct moec_bench_result {
    int context;             /* the context benched (the options', or the default) */
    int max_context;         /* max_position_embeddings - 1 (0: not known) */
    char device[128];
    double copy_bytes_per_s; /* read + write */
    double setup_s;          /* compile (passes, codegen, NVRTC or cache) or plan read, upload */
    double capture_s;        /* capturing every bucket's graph, two-stream mode */
    double capture_single_s; /* the same, one stream */
    int launches_per_step[16]; /* per row: kernels + GEMMs of the bucket's step (rank 0's) */
    int tp, ep;              /* the split benched (tp 0: unsharded; ep 1 without --ep) */
    int n_rows;
    moec_bench_row rows[16];
} moec_bench_result;

/* The name of a MOEC_BENCH_* mode: "graph", "graph_single", "eager", "eager_single". */
const char *moec_bench_mode_name(int mode);

moec_status moec_bench(const moec_model_t *model, const char *weights_dir,
                       const moec_bench_options *opt, moec_bench_result *out);


#ifdef __cplusplus
}
#endif
#endif
