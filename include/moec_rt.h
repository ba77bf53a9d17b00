/* moec_rt.h — the runtime API of moec (libmoec_rt): load a compiled plan
 * file (moec compile) and run it — one-sequence sessions and the
 * multi-sequence engine, CUDA Graphs replayed — with no compiler, codegen
 * or NVRTC linked. Opaque handles, status codes, one error string per
 * thread; the library never exits or aborts on bad input. The full library
 * (libmoec, moec.h) adds the compiler: models read from config.json,
 * passes, IR dumps, compile, bench, and sessions/engines made from a model
 * directly (the CPU reference interpreter included). */
#ifndef MOEC_RT_H
#define MOEC_RT_H

#include <stddef.h>
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
    MOEC_ERR_NUMERIC,      /* logits hold a NaN or an infinity: a broken checkpoint or an overflow */
} moec_status;

/* The message of the last error on this thread: "file:line: message",
 * naming the file, tensor or field at fault. Never NULL. */
const char *moec_last_error(void);
const char *moec_status_name(moec_status st);

typedef enum moec_backend {
    MOEC_BACKEND_AUTO = 0, /* CUDA where a device is present, else CPU */
    MOEC_BACKEND_CPU,      /* the fp32 reference interpreter */
    MOEC_BACKEND_CUDA,
} moec_backend;


/* A generation session of one sequence: weights loaded and checked (every
 * bound tensor present, of the right shape and dtype), KV cache for
 * max_seq_len tokens. */
typedef struct moec_session moec_session_t;

void moec_session_free(moec_session_t *session);
/* The backend the session runs on (never AUTO). */
moec_backend moec_session_backend(const moec_session_t *session);
/* Appends n tokens to the sequence and writes the logits of every one of
 * them (n rows of vocab_size floats) to logits_out when it is not NULL.
 * MOEC_ERR_CAPACITY when the sequence would outgrow max_seq_len (nothing
 * runs). MOEC_ERR_NUMERIC when a row of logits holds a NaN or an infinity:
 * the tokens were appended and logits_out written all the same, and the
 * error names the call (step 0 is the session's first forward) and the
 * position of the first such row. */
moec_status moec_session_forward(moec_session_t *session, const int32_t *ids, int n,
                                 float *logits_out);
/* Tokens in the sequence so far. */
int moec_session_length(const moec_session_t *session);
/* The eos ids (as moec_model_eos_tokens: generation_config.json's, else
 * config.json's; a plan carries them; *ids owned by the session). */
int moec_session_eos_tokens(const moec_session_t *session, const int32_t **ids);
/* The model's vocab_size (floats per logits row) and its first eos id (-1 if
 * none), for sessions made from a model or from a plan alike. */
int moec_session_vocab_size(const moec_session_t *session);
int moec_session_eos_token(const moec_session_t *session);

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
 * before anything runs. MOEC_ERR_NUMERIC when the logits of one or more
 * tokens hold a NaN or an infinity: the step ran (every token's K/V is
 * written, logits_out filled), next_out[i] is -1 for each such token and
 * the greedy id for the others, so a caller fails only the sequences of
 * the tokens at -1; the error names the step (the engine's steps counted
 * from 0), the first such token, its slot and position. */
moec_status moec_engine_step(moec_engine_t *engine, int n, const int32_t *tokens,
                             const int32_t *positions, const int32_t *slots, int32_t *next_out,
                             float *logits_out);
int moec_engine_max_tokens(const moec_engine_t *engine); /* most tokens one step takes */
int moec_engine_max_seqs(const moec_engine_t *engine);
int moec_engine_max_seq_len(const moec_engine_t *engine);
int moec_engine_vocab_size(const moec_engine_t *engine);
int moec_engine_eos_token(const moec_engine_t *engine); /* the first eos id, -1 if none */
/* The eos ids (as moec_model_eos_tokens; *ids owned by the engine). */
int moec_engine_eos_tokens(const moec_engine_t *engine, const int32_t **ids);
moec_backend moec_engine_backend(const moec_engine_t *engine);

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
