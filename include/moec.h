/* moec.h — the public API of moec: an ahead-of-time compiler and runtime for
 * Mixture-of-Experts decode. Opaque handles, status codes, one error string
 * per thread; the library never exits or aborts on bad input. */
#ifndef MOEC_H
#define MOEC_H

#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum moec_status {
    MOEC_OK = 0,
    MOEC_ERR_INVALID_ARG,  /* a caller passed something impossible */
    MOEC_ERR_IO,           /* a file could not be opened, read or written */
    MOEC_ERR_FORMAT,       /* a file is malformed (JSON, safetensors, IR text) */
    MOEC_ERR_UNSUPPORTED,  /* a model_type, config field or value moec does not support */
    MOEC_ERR_MISMATCH,     /* a weight is missing or has the wrong shape or dtype */
    MOEC_ERR_OOM,          /* an allocation failed */
    MOEC_ERR_CAPACITY,     /* a prompt too long or a KV cache full */
    MOEC_ERR_NO_DEVICE,    /* no CUDA device on this machine */
    MOEC_ERR_CUDA,         /* a CUDA, NVRTC, cuBLAS or NCCL call failed */
    MOEC_ERR_INTERNAL,     /* a broken invariant: a bug in moec */
} moec_status;

/* The message of the last error on this thread: "file:line: message",
 * naming the file, tensor or field at fault. Never NULL. */
const char *moec_last_error(void);
const char *moec_status_name(moec_status st);

/* A model: config.json read and lowered to the unfused IR, verified.
 * Weights are not touched until a session is made. */
typedef struct moec_model moec_model_t;

moec_status moec_model_open(const char *model_dir, moec_model_t **out);
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
/* Writes dir/00_frontend.mir, then dir/NN_<pass>.mir after every pass, each
 * with a header line naming the pass; a failing pass leaves its input IR in
 * dir/moec-repro-<pass>.mir. */
moec_status moec_model_dump_passes(const moec_model_t *model, const char *dtype, const char *dir);
/* Writes a short summary: model type, layers, values, ops by kind, weights
 * and their bytes. */
moec_status moec_model_summary(const moec_model_t *model, FILE *out);
int moec_model_vocab_size(const moec_model_t *model);
int moec_model_max_positions(const moec_model_t *model);
/* The config's eos_token_id (the first, if a list), or -1 if it has none. */
int moec_model_eos_token(const moec_model_t *model);

/* The checkpoint tensors a model reads, as published (per-expert tensors
 * listed one by one), with the shape and dtype it expects. */
typedef enum moec_dtype { MOEC_DTYPE_F32 = 0, MOEC_DTYPE_F16, MOEC_DTYPE_BF16 } moec_dtype;
typedef struct moec_tensor_info {
    const char *name; /* owned by the model */
    moec_dtype dtype;
    int rank;
    int64_t shape[4];
} moec_tensor_info;
int moec_model_tensor_count(const moec_model_t *model);
moec_status moec_model_tensor_info(const moec_model_t *model, int i, moec_tensor_info *out);

typedef enum moec_backend {
    MOEC_BACKEND_AUTO = 0, /* CUDA where a device is present, else CPU */
    MOEC_BACKEND_CPU,      /* the fp32 reference interpreter */
    MOEC_BACKEND_CUDA,
} moec_backend;

/* A generation session of one sequence: weights loaded and checked (every
 * bound tensor present, of the right shape and dtype), KV cache for
 * max_seq_len tokens. */
typedef struct moec_session moec_session_t;

moec_status moec_session_init(const moec_model_t *model, const char *weights_dir,
                              moec_backend backend, int max_seq_len,
                              moec_session_t **out);
void moec_session_free(moec_session_t *session);
/* The backend the session runs on (never AUTO). */
moec_backend moec_session_backend(const moec_session_t *session);
/* Appends n tokens to the sequence and writes the logits of every one of
 * them (n rows of vocab_size floats) to logits_out when it is not NULL.
 * MOEC_ERR_CAPACITY when the sequence would outgrow max_seq_len. */
moec_status moec_session_forward(moec_session_t *session, const int32_t *ids, int n,
                                 float *logits_out);
/* Tokens in the sequence so far. */
int moec_session_length(const moec_session_t *session);
/* The model's vocab_size (floats per logits row) and eos_token_id (-1 if
 * none), for sessions made from a model or from a plan alike. */
int moec_session_vocab_size(const moec_session_t *session);
int moec_session_eos_token(const moec_session_t *session);

/* Ahead-of-time compile (moec compile): every pass, then per batch bucket
 * the CUDA kernels generated and compiled with NVRTC for one GPU arch (no
 * GPU needed; cubins are cached by content), written with the launch
 * tables and the memory plan to a plan file at out_path, with hashes of
 * weights_dir's config.json and of the name, dtype and shape of every
 * checkpoint tensor the plan binds there: a plan runs only against that
 * checkpoint. The checkpoint's tensors are checked (not read) first. A
 * zeroed struct (or NULL) gives the defaults. */
typedef struct moec_compile_options {
    const char *arch;      /* "sm_90"; NULL: $MOEC_ARCH, else sm_90 */
    const char *dtype;     /* compute dtype: "bf16" (NULL) or "fp32" */
    int n_batch;           /* batch buckets, ascending; 0: 1, 2, 4, 8, 16, 32, 64 */
    int batch[16];
    int tp;                /* tensor-parallel degree: only 1 so far (0 means 1) */
    const char *cache_dir; /* cubin cache; NULL: $MOEC_CACHE_DIR, else ~/.cache/moec/cubin */
    /* When not NULL, called as each bucket finishes compiling: the kernels
     * compiled so far (done) of all buckets' kernels (total). */
    void (*progress)(int done, int total, void *user);
    void *progress_user;
} moec_compile_options;

moec_status moec_compile(const moec_model_t *model, const char *weights_dir,
                         const moec_compile_options *opt, const char *out_path);

/* A CUDA session of one sequence from a plan file, with no compiler call:
 * the plan read and checked against the checkpoint in weights_dir (the
 * hashes it was compiled with; MOEC_ERR_MISMATCH otherwise), then, on the
 * device, its arch (MOEC_ERR_UNSUPPORTED naming both) and the memory its
 * weights, KV cache of max_seq_len tokens and activations need
 * (MOEC_ERR_CAPACITY naming the bytes needed and free), then bound. */
moec_status moec_session_init_plan(const char *plan_path, const char *weights_dir,
                                   int max_seq_len, moec_session_t **out);

/* An engine: up to max_seqs sequences decoded together, for services. Each
 * sequence lives in a slot (0 .. max_seqs-1) with its own KV cache of
 * max_seq_len tokens; the caller says which slot and position every token
 * of a step belongs to and owns the slot bookkeeping. On CUDA a step of n
 * tokens runs the smallest compiled batch bucket >= n (its CUDA Graph,
 * captured at open, unless `eager` or MOEC_DISABLE_GRAPHS=1); on the CPU it
 * runs the reference interpreter, one KV cache per slot. */
typedef struct moec_engine moec_engine_t;
typedef struct moec_engine_options {
    moec_backend backend; /* moec_engine_open: AUTO (CUDA where present), CPU or CUDA */
    int max_seqs;         /* sequence slots; 0: 8 */
    int max_seq_len;      /* tokens per sequence; 0: 4096, or max_position_embeddings if less */
    int single_stream;    /* CUDA: the shared experts on the main stream too */
    int eager;            /* CUDA: launch kernels one by one, no CUDA Graphs */
} moec_engine_options;

/* From a model: every pass and (CUDA) the kernels compiled now. */
moec_status moec_engine_open(const moec_model_t *model, const char *weights_dir,
                             const moec_engine_options *opt, moec_engine_t **out);
/* From a plan file (moec compile), CUDA only, no compiler call; the plan is
 * checked against the checkpoint in weights_dir as moec_session_init_plan
 * does. opt->backend must be AUTO or CUDA. */
moec_status moec_engine_open_plan(const char *plan_path, const char *weights_dir,
                                  const moec_engine_options *opt, moec_engine_t **out);
void moec_engine_free(moec_engine_t *engine);
/* One step of n tokens (1 <= n <= moec_engine_max_tokens): token i is
 * tokens[i] of the sequence in slots[i] at position positions[i]; its K/V
 * entries are written there and it attends to positions 0..positions[i] of
 * its slot, those written by earlier steps and by earlier tokens of this
 * step. A new sequence in a slot simply starts again at position 0.
 * next_out[i] (when not NULL) gets the greedy next id after token i (the
 * argmax of its logits, the lowest id on ties); logits_out (when not NULL)
 * n rows of vocab_size floats. MOEC_ERR_INVALID_ARG for a slot or token id
 * out of range, MOEC_ERR_CAPACITY for a position >= max_seq_len; both
 * before anything runs. */
moec_status moec_engine_step(moec_engine_t *engine, int n, const int32_t *tokens,
                             const int32_t *positions, const int32_t *slots, int32_t *next_out,
                             float *logits_out);
int moec_engine_max_tokens(const moec_engine_t *engine); /* most tokens one step takes */
int moec_engine_max_seqs(const moec_engine_t *engine);
int moec_engine_max_seq_len(const moec_engine_t *engine);
int moec_engine_vocab_size(const moec_engine_t *engine);
int moec_engine_eos_token(const moec_engine_t *engine); /* -1 if none */
moec_backend moec_engine_backend(const moec_engine_t *engine);

/* The decode benchmark (moec bench): per batch size B, B sequences at a
 * context of `context` tokens each decode one token per step; the median
 * step time over `steps` timed steps (CUDA events, after `warmup`) of each
 * way of running it (CUDA Graph replay or eager launches, the shared
 * experts on a second stream or not), the bytes that step must read (every
 * weight but the routed experts, the routed experts the step actually
 * selected, the embedding rows, the KV cache in use), and the floor: those
 * bytes over the device's measured copy bandwidth (read + write). Compute
 * dtype from MOEC_DTYPE (bf16), or the plan's. */
typedef struct moec_bench_options {
    int n_batch;
    int batch[16];
    int context;
    int steps;
    int warmup;
    const char *plan_path; /* bench a plan file (model may be NULL) instead of compiling */
    FILE *profile;         /* when not NULL: per batch size, time per kernel (eager, one
                            * stream, an event between every two launches) written here */
} moec_bench_options;

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
} moec_bench_row;

typedef struct moec_bench_result {
    char device[128];
    double copy_bytes_per_s; /* read + write */
    double setup_s;          /* compile (passes, codegen, NVRTC or cache) or plan read, upload */
    double capture_s;        /* capturing every bucket's graph, two-stream mode */
    double capture_single_s; /* the same, one stream */
    int launches_per_step[16]; /* per row: kernels + GEMMs of the bucket's step */
    int n_rows;
    moec_bench_row rows[16];
} moec_bench_result;

/* The name of a MOEC_BENCH_* mode: "graph", "graph_single", "eager", "eager_single". */
const char *moec_bench_mode_name(int mode);

moec_status moec_bench(const moec_model_t *model, const char *weights_dir,
                       const moec_bench_options *opt, moec_bench_result *out);

/* Number of CUDA devices; MOEC_ERR_NO_DEVICE (with a message) when there is
 * none or no driver. */
moec_status moec_cuda_device_count(int *count);

/* ---- tokenizer ---------------------------------------------------------------
 * A model folder's tokenizer.json (Hugging Face `tokenizers` format:
 * byte-level BPE, as DeepSeek-V2/V3 and Qwen2/Qwen3 publish it) and
 * tokenizer_config.json, encoding and decoding exactly as `tokenizers` does
 * (docs/TOKENIZER.md lists what is supported; anything else is refused at
 * open with an error naming it). Part of libmoec_rt. Once open a tokenizer
 * is read-only: threads may share it. */
typedef struct moec_tokenizer moec_tokenizer_t;

/* Reads model_dir/tokenizer.json and, when present, tokenizer_config.json
 * (its bos_token / eos_token; for tokenizer_class LlamaTokenizerFast its
 * add_bos_token / add_eos_token, which replace tokenizer.json's
 * post-processor as transformers does). */
moec_status moec_tokenizer_open(const char *model_dir, moec_tokenizer_t **out);
void moec_tokenizer_free(moec_tokenizer_t *tok);
/* Encodes len bytes of UTF-8 text. Invalid UTF-8 is not an error: each
 * maximal invalid subpart becomes U+FFFD first (as Python's
 * bytes.decode("utf-8", "replace") does). add_special_tokens adds what the
 * post-processor adds (a BOS, ...). *ids is malloc'd (release with free(),
 * never NULL on success), *n_ids its length. */
moec_status moec_tokenizer_encode(const moec_tokenizer_t *tok, const char *text, size_t len,
                                  int add_special_tokens, int32_t **ids, int *n_ids);
/* Decodes ids through the byte-level decoder into malloc'd UTF-8 text
 * (NUL-terminated; *len excludes the NUL; release with free()). Bytes that
 * do not form valid UTF-8 become U+FFFD per maximal subpart; ids with no
 * token decode to nothing, and so do special tokens when
 * skip_special_tokens, as in tokenizers; a negative id is an error. */
moec_status moec_tokenizer_decode(const moec_tokenizer_t *tok, const int32_t *ids, int n_ids,
                                  int skip_special_tokens, char **text, size_t *len);
/* The id of a token's text (an added token's, else the vocab's), -1 if none. */
int32_t moec_tokenizer_token_id(const moec_tokenizer_t *tok, const char *token);
/* tokenizer_config.json's bos_token / eos_token ids, -1 when it names none. */
int32_t moec_tokenizer_bos_id(const moec_tokenizer_t *tok);
int32_t moec_tokenizer_eos_id(const moec_tokenizer_t *tok);
/* The largest id with a token, plus one. */
int32_t moec_tokenizer_id_count(const moec_tokenizer_t *tok);

/* Streaming decode, one id at a time as a model generates them: each push
 * returns the text that became complete (possibly ""), never a partial
 * UTF-8 sequence; finish returns what is left (a cut-off sequence as
 * U+FFFD). The pieces of a stream concatenate to moec_tokenizer_decode of
 * its ids. *text stays valid until the next call on d. */
typedef struct moec_detokenizer moec_detokenizer_t;
moec_status moec_detokenizer_init(const moec_tokenizer_t *tok, int skip_special_tokens,
                                  moec_detokenizer_t **out);
moec_status moec_detokenizer_push(moec_detokenizer_t *d, int32_t id, const char **text,
                                  size_t *len);
moec_status moec_detokenizer_finish(moec_detokenizer_t *d, const char **text, size_t *len);
void moec_detokenizer_free(moec_detokenizer_t *d);

#ifdef __cplusplus
}
#endif
#endif
