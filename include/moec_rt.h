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
    MOEC_ERR_NOT_FOUND,    /* something optional the call needs is absent (a chat template) */
} moec_status;

/* The message of the last error on this thread: "file:line: message",
 * naming the file, tensor or field at fault. Never NULL. */
const char *moec_last_error(void);
/* The same without its "file:line: " (what a service tells its clients). */
const char *moec_last_error_message(void);
const char *moec_status_name(moec_status st);

typedef enum moec_backend {
    MOEC_BACKEND_AUTO = 0, /* CUDA where a device is present, else CPU */
    MOEC_BACKEND_CPU,      /* the fp32 reference interpreter */
    MOEC_BACKEND_CUDA,
} moec_backend;


/* Tensor and expert parallelism on one host (docs/PARALLEL.md): the model
 * split over tp ranks (attention heads, MLP and shared-expert intermediates,
 * the vocabulary), the routed experts spread over ep groups of tp / ep
 * ranks, each expert split over the ranks of its group; collectives where
 * the ranks' parts meet. A zeroed struct is the unsharded model. */
typedef struct moec_parallel {
    int tp;   /* ranks: 0 unsharded (no collectives); 1 one rank through the
               * sharded path (collectives of one); up to 64 */
    int ep;   /* expert groups, dividing tp; 0: 1 (every expert split over all
               * tp ranks); ep = tp: each rank holds whole experts, E / tp */
    int rank; /* dumps only: the rank whose module to print, 0 .. tp-1 */
    int ep_combine; /* MOEC_EP_COMBINE_*: how the MoE block's partial sums (the
                     * expert groups' and the shared expert's) meet */
} moec_parallel;

/* moec_parallel.ep_combine (moec --ep-combine; docs/PARALLEL.md). */
enum {
    MOEC_EP_COMBINE_ALL_REDUCE = 0,     /* one all_reduce (the default) */
    MOEC_EP_COMBINE_REDUCE_SCATTER = 1  /* reduce_scatter over the hidden axis, then
                                         * all_gather: the same sum; tp divides hidden_size */
};

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
/* The same, checking that the plan was compiled for par's split (tp and
 * ep; par NULL: whatever it was compiled for): MOEC_ERR_INVALID_ARG naming
 * both when not. A plan split over ranks runs on as many GPUs of this
 * machine, one thread each (MOEC_ERR_NO_DEVICE when there are fewer); a
 * rank that fails ends every rank with its error. */
moec_status moec_session_init_plan_parallel(const char *plan_path, const char *weights_dir,
                                            int max_seq_len, const moec_parallel *par,
                                            moec_session_t **out);

/* An engine: many sequences decoded together, for services. All of them
 * share one pool of KV blocks (kv_block_size tokens each); a sequence holds
 * the blocks its tokens need, listed in its row of a block table (one row
 * per sequence running, max_seqs rows), so a sequence is limited by the free
 * blocks and max_seq_len, not by a slot of fixed size. On CUDA a step of n
 * tokens runs the smallest compiled batch bucket >= n (its CUDA Graph,
 * captured at open, unless `eager` or MOEC_DISABLE_GRAPHS=1; the block
 * table is a fixed device buffer whose rows are updated before each replay);
 * on the CPU it runs the reference interpreter over the same paged pool.
 *
 * Two ways to drive it: the scheduler (moec_engine_submit / _run, below),
 * which owns the block table, queues requests, decodes, samples, caches
 * prefixes and preempts; or, below it, moec_engine_step, where the caller
 * says which row and position every token has. */
typedef struct moec_engine moec_engine_t;
typedef struct moec_engine_options {
    moec_backend backend; /* moec_engine_open: AUTO (CUDA where present), CPU or CUDA */
    int max_seqs;         /* block-table rows: sequences running at once (the scheduler
                           * runs at most moec_engine_max_tokens, as each decodes a token
                           * every step); 0: 8 */
    int max_seq_len;      /* tokens one sequence may hold, prompt + output; 0: the model's
                           * max_position_embeddings (4096 if it names none) */
    int single_stream;    /* CUDA: the shared experts on the main stream too */
    int eager;            /* CUDA: launch kernels one by one, no CUDA Graphs */
    int kv_blocks;        /* blocks in the KV pool; 0: on CUDA sized by kv_memory_fraction,
                           * on the CPU max_seqs sequences of min(max_seq_len, 4096) tokens */
    double kv_memory_fraction; /* CUDA with kv_blocks 0: the share of the device memory
                           * free once weights, activations, inputs and workspaces are
                           * allocated (graphs are captured in the rest) that the pool
                           * takes; 0: 0.9. Never more blocks than max_seqs sequences of
                           * max_seq_len tokens fill. */
    int kv_block_size;    /* tokens per block: on CUDA the plan's (0 or that number); on
                           * the CPU 0 gives 16 */
    int no_prefix_cache;  /* 1: requests never share blocks (no prefix caching) */
    moec_parallel par;    /* moec_engine_open: the ranks the model is split over
                           * (par.rank unused; zeroed: unsharded); a plan's are
                           * its own. Split, every rank holds its shard of each KV
                           * block (its heads) and one block table maps them all;
                           * sized by memory, the pool has the blocks of the rank
                           * with the fewest */
} moec_engine_options;

/* From a plan file (moec compile), CUDA only, no compiler call; the plan is
 * checked against the checkpoint in weights_dir as moec_session_init_plan
 * does, and, when opt->par.tp is set, against that split as
 * moec_session_init_plan_parallel does. opt->backend must be AUTO or CUDA.
 * MOEC_ERR_CAPACITY (naming the bytes) when not even one KV block fits. */
moec_status moec_engine_open_plan(const char *plan_path, const char *weights_dir,
                                  const moec_engine_options *opt, moec_engine_t **out);
void moec_engine_free(moec_engine_t *engine);

int moec_engine_max_tokens(const moec_engine_t *engine); /* most tokens one step takes */
int moec_engine_max_seqs(const moec_engine_t *engine);
int moec_engine_max_seq_len(const moec_engine_t *engine);
/* The most tokens (prompt + max_tokens) a request may have: max_seq_len, or
 * fewer when the whole KV pool holds fewer (its blocks' tokens and 1: the
 * last token generated is never fed), as moec_engine_submit checks. */
int moec_engine_max_len(const moec_engine_t *engine);
int moec_engine_kv_blocks(const moec_engine_t *engine);     /* blocks in the pool */
int moec_engine_kv_block_size(const moec_engine_t *engine); /* tokens per block */
int moec_engine_vocab_size(const moec_engine_t *engine);
int moec_engine_eos_token(const moec_engine_t *engine); /* the first eos id, -1 if none */
/* The eos ids (as moec_model_eos_tokens; *ids owned by the engine). */
int moec_engine_eos_tokens(const moec_engine_t *engine, const int32_t **ids);
moec_backend moec_engine_backend(const moec_engine_t *engine);

/* ---- the scheduler: requests in, tokens out ------------------------------
 *
 * Requests wait in a queue (first come, first served) and are admitted to
 * the running set while a block-table row is free, the pool has the blocks
 * their tokens need (beyond a small reserve for the running ones' growth),
 * and the step has room. Each step takes the next token of every running
 * sequence that is decoding first, then chunks of the prompts being
 * prefilled, oldest first, up to moec_engine_max_tokens. When a decoding
 * sequence needs a new block and none is free, the newest running sequence
 * is preempted: its blocks freed, it goes back to the front of the queue and
 * is recomputed (prompt and output so far) when admitted again; what it
 * already generated stands, and since sampling draws from the request's own
 * random stream, preemption does not change its tokens.
 *
 * Prefix caching: every full block a sequence has computed is hashed by a
 * chain over the token ids of it and every block before it; a request whose
 * first full blocks hash (and compare) equal to cached ones holds those
 * blocks (reference counted) and skips their prefill. Blocks no sequence
 * holds stay cached until a new block is needed, the least recently freed
 * first. The last prompt token is always computed (its logits give the
 * first output token). */

typedef struct moec_sampling {
    float temperature;        /* 0: greedy, the largest logit (the lowest id on ties) */
    int top_k;                /* keep the top_k likeliest ids; 0: all */
    float top_p;              /* keep the fewest likeliest ids whose probability reaches
                               * top_p; 0 or 1: all */
    float min_p;              /* drop ids less likely than min_p times the likeliest; 0: none */
    float repetition_penalty; /* ids in the prompt or output: a positive logit divided by it,
                               * a negative one multiplied; 0 or 1: none */
    float presence_penalty;   /* subtracted from the logit of every id in the output */
    float frequency_penalty;  /* times an id's count in the output, subtracted from its logit */
    uint64_t seed;            /* the request's random stream: the same seed, prompt and
                               * settings give the same tokens */
    int logprob;              /* 1: report the chosen id's log probability */
    int top_logprobs;         /* report the n likeliest ids' (0 to MOEC_TOP_LOGPROBS_MAX) */
} moec_sampling;
/* Penalties apply first, then temperature, top_k, top_p and min_p, in that
 * order. Log probabilities are those of the model's own distribution (the
 * log-softmax of the logits, before penalties and temperature). On CUDA,
 * greedy requests that ask for no log probability take the argmax computed
 * on the GPU, the others are sampled on the GPU too, and only those asking
 * for top_logprobs copy their rows of logits back and sample on the host;
 * the CPU backend samples on the host. Host and GPU draw the same token
 * from the same logits, seed and place in the output (docs/SAMPLING.md). */
#define MOEC_TOP_LOGPROBS_MAX 20
/* The ranges moec_engine_submit checks the settings against, for a caller
 * that wants to say which one a client got wrong before it queues anything:
 * MOEC_ERR_INVALID_ARG naming the first setting out of range. */
moec_status moec_sampling_check(const moec_sampling *sp);

typedef struct moec_request {
    const int32_t *prompt;    /* n_prompt >= 1 ids in [0, vocab_size); copied */
    int n_prompt;
    int max_tokens;           /* the most tokens to generate, >= 1 */
    const int32_t *stop_ids;  /* n_stop ids that end generation (as output); copied */
    int n_stop;
    int ignore_eos;           /* 0: the model's eos ids end generation too */
    moec_sampling sampling;
    void *user;               /* handed back in the request's events */
} moec_request;

typedef enum moec_finish {
    MOEC_FINISH_NONE = 0, /* more tokens follow */
    MOEC_FINISH_LENGTH,   /* max_tokens generated */
    MOEC_FINISH_EOS,      /* an eos id */
    MOEC_FINISH_STOP,     /* one of the request's stop ids */
    MOEC_FINISH_ERROR,    /* the step failed, or the request's logits hold a NaN or an
                           * infinity: no token; see error */
} moec_finish;
/* "length", "eos", "stop", "error" (NONE: "none"). */
const char *moec_finish_name(moec_finish finish);

/* One generated token, or the end of a request. */
typedef struct moec_event {
    uint64_t request;     /* the id moec_engine_submit gave */
    void *user;
    int32_t token;        /* the token (-1 with MOEC_FINISH_ERROR) */
    int index;            /* its place in the output, from 0 */
    float logprob;        /* sampling.logprob: its log probability */
    int n_top;            /* sampling.top_logprobs: the likeliest ids, likeliest first */
    int32_t top_ids[MOEC_TOP_LOGPROBS_MAX];
    float top_logprobs[MOEC_TOP_LOGPROBS_MAX];
    moec_finish finish;   /* not NONE: the request's last event; then: */
    int n_prompt;         /* prompt tokens */
    int n_output;         /* tokens generated */
    int cached_tokens;    /* prompt tokens whose prefill the prefix cache saved */
    double ttft_s;        /* submit to first token, seconds */
    double itl_s;         /* mean time between two of its tokens (0 for one token) */
    const char *error;    /* MOEC_FINISH_ERROR: why (valid until the next moec_engine_run) */
} moec_event;

/* Queues a request (*id gets its id, never 0). Refused (MOEC_ERR_INVALID_ARG)
 * for a bad field, and (MOEC_ERR_CAPACITY) only when it could never run:
 * prompt + max_tokens longer than max_seq_len, or needing more blocks than
 * the whole pool holds; never for the engine being busy. */
moec_status moec_engine_submit(moec_engine_t *engine, const moec_request *req, uint64_t *id);
/* Ends a request now, waiting or running; its blocks are freed and it has
 * no more events. MOEC_ERR_INVALID_ARG for an id that is not waiting or
 * running. */
moec_status moec_engine_cancel(moec_engine_t *engine, uint64_t id);
/* One step: admits, preempts, runs the tokens and samples; *events (owned
 * by the engine, valid until the next call) get what it generated and
 * which requests ended. Nothing to do: *n_events 0. When the step fails,
 * each of its requests ends with a MOEC_FINISH_ERROR event and the step's
 * status is returned. When a row of logits of a request's tokens in the
 * step holds a NaN or an infinity, only that request ends, with a
 * MOEC_FINISH_ERROR event whose error is "the logits at position P hold a
 * NaN or an infinity" (its first such position; "... once the penalties
 * apply" when only the row it samples from is, penalties having
 * overflowed); the others go on, their events as usual, and
 * MOEC_ERR_NUMERIC is returned naming the step (moec_engine_get_stats'
 * steps before it), the first such request and its error, and how many. */
moec_status moec_engine_run(moec_engine_t *engine, const moec_event **events, int *n_events);
/* Requests waiting or running. */
int moec_engine_pending(const moec_engine_t *engine);

typedef struct moec_engine_stats {
    int running;            /* requests in the running set (holding blocks) */
    int waiting;            /* queued: new, or preempted to be recomputed */
    int kv_blocks;          /* blocks in the pool */
    int kv_blocks_used;     /* held by running requests */
    int kv_blocks_cached;   /* held by none, keeping a prefix for later requests */
    int kv_block_size;
    double prefix_hit_rate; /* cached_tokens / prompt_tokens (0 before any) */
    double tokens_per_s;    /* generated_tokens / busy_s (0 before any) */
    double busy_s;          /* seconds spent in steps */
    uint64_t steps, requests_done, requests_cancelled, preemptions;
    uint64_t prompt_tokens, cached_tokens, generated_tokens;
} moec_engine_stats;
void moec_engine_get_stats(const moec_engine_t *engine, moec_engine_stats *out);

/* ---- below the scheduler: steps of given tokens ----------------------------
 *
 * One step of n tokens (1 <= n <= moec_engine_max_tokens): token i is
 * tokens[i] of the sequence in block-table row slots[i] at position
 * positions[i]; its K/V entries are written to the block its row lists for
 * that position and it attends to positions 0..positions[i] of its row,
 * those written by earlier steps and by earlier tokens of this step.
 * next_out[i] (when not NULL) gets the greedy next id after token i (the
 * argmax of its logits, the lowest id on ties); logits_out (when not NULL)
 * n rows of vocab_size floats. MOEC_ERR_INVALID_ARG for a slot or token id
 * out of range, or a position whose block is not set, MOEC_ERR_CAPACITY for
 * a position >= max_seq_len; all before anything runs. MOEC_ERR_NUMERIC
 * when the logits of one or more tokens hold a NaN or an infinity: the step
 * ran (every token's K/V is written, logits_out filled), next_out[i] is -1
 * for each such token and the greedy id for the others, so a caller fails
 * only the sequences of the tokens at -1; the error names the step (the
 * engine's steps below the scheduler counted from 0), the first such token,
 * its slot and position. Refused while the scheduler has requests (it owns
 * the table then); once they are done, a step (or moec_engine_set_blocks)
 * here empties the prefix cache, since it may write any block.
 *
 * An engine whose pool holds max_seqs sequences of max_seq_len starts with
 * row s listing blocks s * P .. s * P + P - 1 (P = blocks per row): each row
 * owns its blocks, and a new sequence in a row simply starts again at
 * position 0. Otherwise rows start empty: moec_engine_set_blocks fills them.
 * The scheduler lays the table out its own way: once it has run requests,
 * the rows it used are empty (-1), and a caller stepping here afterwards
 * sets the blocks it wants first. */
moec_status moec_engine_step(moec_engine_t *engine, int n, const int32_t *tokens,
                             const int32_t *positions, const int32_t *slots, int32_t *next_out,
                             float *logits_out);
/* Row slot's entries first .. first + n - 1 (its blocks for positions
 * first * kv_block_size on) become blocks[0 .. n-1], each in [0, kv_blocks)
 * or -1 (none). Refused while the scheduler has requests. */
moec_status moec_engine_set_blocks(moec_engine_t *engine, int slot, int first, int n,
                                   const int32_t *blocks);

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
 * (its special tokens, or its tokenizer_class's defaults where it leaves one
 * out; tokenizer.json's post-processor decides the BOS / EOS, as in
 * transformers 5.17, whatever add_bos_token says), special_tokens_map.json (whose
 * special tokens replace tokenizer_config.json's) and added_tokens.json
 * (checked against tokenizer.json's added tokens). */
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
/* The bos_token / eos_token ids of tokenizer_config.json (or
 * special_tokens_map.json, which wins), -1 when they name none. */
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
/* The same, and *before (when not NULL) gets how many characters at the start
 * of *text are made of earlier ids' bytes alone: 1 when bytes held back (a
 * character cut off) become a U+FFFD because this id's first byte does not
 * continue them, else 0. The characters of the earlier pieces plus *before
 * are those before the character holding this id's first byte: its offset
 * in the text (a character split over ids is every such id's). */
moec_status moec_detokenizer_push_offset(moec_detokenizer_t *d, int32_t id, const char **text,
                                         size_t *len, int *before);
moec_status moec_detokenizer_finish(moec_detokenizer_t *d, const char **text, size_t *len);
void moec_detokenizer_free(moec_detokenizer_t *d);

/* Chat templates (docs/TOKENIZER.md, "Chat templates"): tokenizer_config.json's
 * Jinja chat_template rendered by a small interpreter of the Jinja subset
 * the DeepSeek and Qwen templates use, as transformers' apply_chat_template
 * renders it (jinja2, trim_blocks and lstrip_blocks). */
typedef struct moec_chat_message {
    const char *role;    /* "system", "user", "assistant", "tool" */
    const char *content; /* UTF-8, may be NULL for none */
} moec_chat_message_t;
typedef struct moec_chat_options {
    int add_generation_prompt; /* 1: end with the assistant prompt */
    int enable_thinking;       /* -1 unset (template default), 0, 1 */
} moec_chat_options_t;
/* Renders tokenizer_config.json's chat_template (a string, or the entry named
 * "default" of a list of {name, template}) with bos_token, eos_token (strings
 * from tokenizer_config.json), messages, add_generation_prompt and, when set,
 * enable_thinking. *out is malloc'd NUL-terminated text the caller frees.
 * MOEC_ERR_UNSUPPORTED naming the construct when the template uses one the
 * interpreter does not have; MOEC_ERR_NOT_FOUND when the folder has no chat
 * template. */
moec_status moec_chat_render(const moec_tokenizer_t *tok, const moec_chat_message_t *msgs, int n_msgs,
                             const moec_chat_options_t *opts, char **out);
/* The same for a conversation in JSON (len bytes of UTF-8): a list of
 * messages, each an object with a string "role" and any other fields the
 * template reads ("content" a string, a list or null; "tool_calls",
 * "reasoning_content", "name", ...), or an object with such a list as
 * "messages" and other members (OpenAI's "tools", or any variable a
 * template reads, such as DeepSeek-V3.1's "thinking") passed to the
 * template as variables. add_generation_prompt, bos_token and eos_token
 * come from opts and the tokenizer (a request setting them is refused);
 * enable_thinking from opts when set there, else from the request. A key
 * written twice is refused, and so is anything but whitespace after the
 * value, a NUL byte or a raw control character in a string (MOEC_ERR_FORMAT
 * naming its byte); a \u0000 escape (a string holding a NUL) is
 * MOEC_ERR_UNSUPPORTED. JSON numbers without a fraction become integers. */
moec_status moec_chat_render_json(const moec_tokenizer_t *tok, const char *json, size_t len,
                                  const moec_chat_options_t *opts, char **out);

#ifdef __cplusplus
}
#endif
#endif
