/* serve.c — the generation service behind moec-serve (a plan file, the
 * runtime library alone) and `moec serve` (a model folder too, compiled
 * first): a service over the engine's scheduler (moec_engine_submit / _run
 * / _cancel). It loads the engine once, then answers requests, one JSON
 * object a line, on stdin or on TCP connections to 127.0.0.1, streaming
 * every generated token back as a JSON line as soon as its step ends.
 *
 * One thread, one poll() loop: it reads requests and hands each to the
 * engine, which queues it, and while any request is pending it runs engine
 * steps back to back. The engine decides what a step holds (one decode
 * token of every running sequence first, then chunks of new prompts), over
 * one pool of KV blocks shared by all sequences, with prefix caching and
 * preemption; this file parses requests, streams the engine's events back to
 * the connection each request came from, and cancels the requests of a
 * client that goes away.
 *
 * What clients can make it hold is bounded: connections (--max-connections),
 * each one's unfinished request line and unread replies, and those bytes
 * over all clients (--max-buffer-mib); buffers are freed once empty and the
 * memory returned after a burst, so an idle service shrinks back. The
 * requests waiting in the engine's queue are bounded by the same bytes:
 * each came in a line. */
#include <errno.h>
#include <float.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#ifdef __GLIBC__
#include <malloc.h> /* malloc_trim */
#endif

#include <arpa/inet.h>
#include <cjson/cJSON.h>

#include "samples/serve.h"
#include "samples/serve_http.h"
#include "samples/serve_metrics.h"
#include "samples/serve_util.h"
#include "json.h"
#include "timer.h"

static const char *USAGE =
    "usage: moec-serve PLAN --weights MODEL_DIR [options]\n"
    "       moec serve MODEL_DIR|PLAN [--weights MODEL_DIR] [options]\n"
    "\n"
    "moec-serve runs plan files (moec compile) and links the runtime alone;\n"
    "`moec serve` also takes a model folder, compiled (CUDA) or interpreted\n"
    "(CPU) at start. Loads the model once and serves generation requests: one\n"
    "JSON object a line (UTF-8, at most 1048576 bytes), on stdin (the default)\n"
    "or on TCP connections to 127.0.0.1:\n"
    "\n"
    "  {\"id\": \"a\", \"prompt_ids\": [1, 2, 3], \"max_new_tokens\": 16}\n"
    "\n"
    "id is a string or a number, echoed in every reply, and may not be the id of\n"
    "a request still running on the same connection. Optional fields:\n"
    "  ignore_eos          true: the model's eos ids do not end generation\n"
    "  stop_token_ids      ids that end generation (the id is output)\n"
    "  temperature         0 (the default): greedy; else sampled\n"
    "  top_k, top_p, min_p keep the top_k likeliest ids, the likeliest reaching\n"
    "                      top_p, those at least min_p times the likeliest\n"
    "  repetition_penalty, presence_penalty, frequency_penalty\n"
    "  seed                the request's random stream (the same seed gives the\n"
    "                      same tokens); without one, a fresh one\n"
    "  logprobs            true: each token's log probability\n"
    "  top_logprobs        N: the N likeliest ids' too (at most 20)\n"
    "any other field is refused. Each generated token is sent as soon as it is\n"
    "known, then a final line:\n"
    "\n"
    "  {\"id\":\"a\",\"token\":17,\"index\":0}   (,\"logprob\":-0.5,\"top_logprobs\":[[17,-0.5],...])\n"
    "  {\"id\":\"a\",\"done\":true,\"tokens\":[17,...],\"finish\":\"length\",\"prompt_tokens\":3,\n"
    "   \"cached_tokens\":0,\"ttft_ms\":1.2,\"itl_ms\":0.8}\n"
    "\n"
    "finish is \"length\", \"eos\", \"stop\" or \"cancelled\"; cached_tokens the prompt\n"
    "tokens whose prefill the prefix cache saved; ttft_ms the time to the first\n"
    "token, itl_ms the mean time between two tokens. Two more lines:\n"
    "\n"
    "  {\"id\": \"a\", \"cancel\": true}   ends request a of this connection now\n"
    "  {\"stats\": true}               {\"id\":null,\"stats\":{\"running\":..,\"waiting\":..,\n"
    "                                \"kv_blocks_used\":..,\"prefix_hit_rate\":..,\n"
    "                                \"tokens_per_s\":..,...}}\n"
    "\n"
    "A request that cannot be served gets {\"id\":...,\"error\":\"message\"} (id null\n"
    "when the request has no usable id) and the others go on; so does one whose\n"
    "logits turn out NaN or infinite (a broken checkpoint, an overflow):\n"
    "\"generation failed: the logits at position P hold a NaN or an infinity\".\n"
    "Requests queue and run together: every step decodes one token of each\n"
    "running sequence and fills the rest of the step with the prompts of new\n"
    "ones; all share one pool of KV blocks, so a request waits while the pool or\n"
    "--max-seqs is full and is refused only when it could never fit (longer than\n"
    "--max-seq-len or the whole pool). When the pool runs out mid-decode the\n"
    "newest sequence is preempted and recomputed later, its tokens unchanged.\n"
    "Prompts that share whole blocks with an earlier one reuse their KV (prefix\n"
    "caching).\n"
    "Replies go to the connection a request came from; a client that leaves more\n"
    "than 16 MiB of replies unread is disconnected, and a client that goes away\n"
    "cancels its requests. With --stdin, the service exits when stdin is closed\n"
    "and every request has finished.\n"
    "\n"
    "HTTP (--http PORT): the OpenAI API, beside --port's lines or alone, text in\n"
    "and out through the model's tokenizer.json (docs/HTTP.md):\n"
    "  POST /v1/completions       prompt (text or token ids), max_tokens (16),\n"
    "                             logprobs (0-20), ...\n"
    "  POST /v1/chat/completions  messages, rendered by tokenizer_config.json's\n"
    "                             chat_template; logprobs (bool), top_logprobs\n"
    "  GET /v1/models, /v1/models/ID, /health, /metrics (Prometheus text)\n"
    "Both POSTs take model (the served id, else 404 model_not_found), max_tokens,\n"
    "temperature (default 1), top_p, top_k, min_p, seed, presence_penalty,\n"
    "frequency_penalty, repetition_penalty, stop (strings matched on the text,\n"
    "never sent), ignore_eos, stop_token_ids, stream (Server-Sent Events:\n"
    "data: {chunk} lines, then data: [DONE]), stream_options.include_usage; n\n"
    "and best_of must be 1, echo and logit_bias are refused, other fields are\n"
    "ignored. Errors are OpenAI's {\"error\": {message, type, param, code}}: 400\n"
    "(a bad body or field, named), 404 (path or model), 405, 413 (a body past\n"
    "--max-body-kib), 429 (--max-waiting requests already wait), 431 (headers\n"
    "past 64 KiB), 500 (generation failed), 503 (shutting down). A client that\n"
    "goes away cancels its request.\n"
    "\n"
    "options:\n"
    "  --weights DIR        the checkpoint (config.json + *.safetensors): required\n"
    "                       with a PLAN; with MODEL_DIR, weights from DIR instead\n"
    "  --stdin              requests on stdin, replies on stdout (the default)\n"
    "  --port N             listen on 127.0.0.1:N instead (0: a free port; the\n"
    "                       startup line on stderr names it); not with --stdin\n"
    "  --max-connections N  --port: clients connected at once (default 64, at most\n"
    "                       65536); one more gets an error line and is closed\n"
    "  --max-buffer-mib N   MiB held for all clients together: unfinished request\n"
    "                       lines, requests in flight (queued or running) and\n"
    "                       replies not yet read (default 256); a line or request\n"
    "                       that would pass it is refused, and the client with the\n"
    "                       most unread replies is disconnected\n"
    "  --max-seqs N         sequences running at once (default 8, at most 65536;\n"
    "                       no more than the tokens of a step run: 64 on the cpu,\n"
    "                       the largest compiled bucket on cuda)\n"
    "  --max-seq-len N      tokens one sequence may hold, prompt + new tokens\n"
    "                       (default: the model's max_position_embeddings; at\n"
    "                       most 67108864)\n"
    "  --kv-blocks N        blocks in the KV pool (default: cuda, by\n"
    "                       --kv-memory-fraction; cpu, --max-seqs sequences of\n"
    "                       --max-seq-len tokens, or of 4096 if that is less)\n"
    "  --kv-memory-fraction F\n"
    "                       cuda: the share (above 0, at most 1; default 0.9) of\n"
    "                       the GPU memory left after the weights, activations\n"
    "                       and workspaces that the KV pool takes\n"
    "  --kv-block-size N    cpu: tokens per KV block (default 16; cuda: the plan's)\n"
    "  --no-prefix-cache    requests never share KV blocks\n"
    "  --backend B          cpu (the fp32 reference interpreter), cuda, or auto\n"
    "                       (default: cuda where a GPU is present, else cpu); cuda\n"
    "                       computes in bf16, or fp32 with MOEC_DTYPE=fp32 (a PLAN:\n"
    "                       in the dtype it was compiled for)\n"
    "  --single-stream      cuda: the shared experts (and DeepSeek-V3.2's indexer) on\n"
    "                       the main stream too (the cpu backend ignores it)\n"
    "  --eager              cuda: launch kernels one by one, no CUDA Graphs (the\n"
    "                       cpu backend ignores it)\n"
    "  --tp N               the model split over N ranks (docs/PARALLEL.md; at most\n"
    "                       64); a PLAN is split as it was compiled, and says so if\n"
    "                       N differs\n"
    "  --ep M               the routed experts in M groups of the ranks (M divides\n"
    "                       N; --ep alone: N = M)\n"
    "  --http PORT          serve the HTTP API on PORT (0: a free one; the startup\n"
    "                       line on stderr names it); with --port too, both run\n"
    "  --host ADDR          --http: the numeric address to bind (default 127.0.0.1;\n"
    "                       0.0.0.0 or :: for every interface)\n"
    "  --served-model-name NAME\n"
    "                       --http: the model id requests name (default: the name\n"
    "                       of the model folder, --weights' with a PLAN)\n"
    "  --tokenizer DIR      --http: the folder of tokenizer.json and\n"
    "                       tokenizer_config.json (default: the model folder)\n"
    "  --max-waiting N      --http: requests accepted and without a token yet\n"
    "                       (default 256); one more gets 429\n"
    "  --max-body-kib N     --http: the largest request body (default 4096 KiB, at\n"
    "                       most 1048576); a larger one gets 413\n"
    "  --http-timeout S     --http: seconds a connection may stay idle, a request\n"
    "                       half sent included (default 60); --max-connections\n"
    "                       bounds HTTP connections too (one more is closed at once)\n"
    "  --http-threads N     --http: threads serving connections (default 4)\n"
    "  -h, --help           this help\n";

#define LINE_LIMIT (1 << 20)    /* longest request line, in bytes */
#define READ_CHUNK (64 << 10)   /* bytes read at once */
#define OUT_LIMIT (16 << 20)    /* replies held for one client that does not read */
#define OUT_KEEP (64 << 10)     /* a reply buffer larger than this is freed once sent */
#define TRIM_AFTER (1 << 20)    /* bytes freed or parsed before memory goes back to the OS */
#define DEFAULT_CONNS 64
#define DEFAULT_BUFFER_MIB 256
#define DEFAULT_WAITING 256      /* --max-waiting */
#define DEFAULT_BODY_KIB 4096    /* --max-body-kib */
#define BODY_KIB_LIMIT (1 << 20)
#define DEFAULT_HTTP_TIMEOUT 60  /* --http-timeout, seconds */
#define DEFAULT_HTTP_THREADS 4   /* --http-threads */
/* serve's own bounds on --max-seqs, --max-connections, --max-buffer-mib,
 * --kv-block-size (which the engine bounds lower), --max-seq-len and
 * --kv-blocks: the engine sets none above (a count it cannot hold fails
 * when it allocates), and past these a typo is likelier than a plan. */
#define COUNT_LIMIT (1 << 16)
#define SEQ_LEN_LIMIT (1 << 26)
#define KV_BLOCKS_LIMIT (1 << 30)

/* ---- small helpers -------------------------------------------------------- */

/* Parses a decimal int in [lo, hi]; 0 on success. */
static int parse_int(const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

static int usage_error(const char *fmt, const char *arg)
{
    fprintf(stderr, "moec-serve: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n\n%s", USAGE);
    return 2;
}

/* A count option out of range: its bounds named. */
static int count_error(const char *opt, const char *value, long max)
{
    fprintf(stderr, "moec-serve: %s: '%s' is not an integer from 1 to %ld\n\n%s", opt, value,
            max, USAGE);
    return 2;
}

static const char *backend_name(moec_backend b)
{
    return b == MOEC_BACKEND_CUDA ? "cuda" : b == MOEC_BACKEND_CPU ? "cpu" : "auto";
}

/* ---- connections ---------------------------------------------------------- */

/* What every client's buffers hold together, against --max-buffer-mib:
 * the bytes of unfinished request lines, of replies not yet written, and of
 * the requests in flight (queued or running in the engine). */
typedef struct budget {
    size_t held, limit;
    size_t churn; /* bytes freed or parsed since memory last went back to the OS */
} budget;

/* A client: a TCP connection, or stdin and stdout. Only an unfinished
 * request line waits in `in`; replies wait in `out` until the client takes
 * them. Both are freed when empty, so an idle client holds a few bytes. */
typedef struct conn {
    int fd;          /* read from (a socket, or 0) */
    int out_fd;      /* written to (the socket, or 1) */
    int is_stdio;    /* stdout is written with blocking writes */
    int eof;         /* the client sent all it will send */
    int dead;        /* closed: free it once the loop is done with it */
    int failed;      /* closed because reading or writing failed */
    int discarding;  /* inside a refused line: dropping bytes to its newline */
    int n_running;   /* its requests in flight */
    struct inflight *reqs; /* them */
    budget *budget;
    char *in;
    size_t in_len, in_cap;
    char *out;
    size_t out_len, out_off, out_cap;
} conn;

static size_t conn_pending(const conn *c) { return c->out_len - c->out_off; }

static void conn_in_clear(conn *c)
{
    c->budget->held -= c->in_len;
    c->budget->churn += c->in_cap;
    free(c->in);
    c->in = NULL;
    c->in_len = c->in_cap = 0;
}

static void conn_out_clear(conn *c)
{
    c->budget->held -= conn_pending(c);
    c->budget->churn += c->out_cap;
    free(c->out);
    c->out = NULL;
    c->out_len = c->out_off = c->out_cap = 0;
}

/* Closes c at once (its buffers freed; the loop frees the rest), saying why
 * on stderr. */
__attribute__((format(printf, 2, 3))) static void conn_drop(conn *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "moec-serve: dropping a client: ");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    conn_in_clear(c);
    conn_out_clear(c);
    c->dead = 1;
}

/* Appends text to c's replies. */
static void conn_write(conn *c, const char *text, size_t n)
{
    if (c->dead)
        return;
    if (c->out_len + n > c->out_cap && c->out_off) {
        memmove(c->out, c->out + c->out_off, conn_pending(c));
        c->out_len -= c->out_off;
        c->out_off = 0;
    }
    if (c->out_len + n > c->out_cap) {
        c->out_cap = (c->out_len + n) * 2;
        c->out = serve_xrealloc(c->out, c->out_cap);
    }
    memcpy(c->out + c->out_len, text, n);
    c->out_len += n;
    c->budget->held += n;
}

__attribute__((format(printf, 2, 3))) static void conn_printf(conn *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *text = serve_vformat(fmt, ap);
    va_end(ap);
    conn_write(c, text, strlen(text));
    free(text);
}

/* An error reply: {"id": <id or null>, "error": msg}. id_json is the id as
 * JSON text, or NULL. The message is never cut short, so it stays the
 * valid UTF-8 that the names it quotes are. */
__attribute__((format(printf, 3, 4))) static void reply_error(conn *c, const char *id_json,
                                                              const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *msg = serve_vformat(fmt, ap);
    va_end(ap);
    cJSON *o = cJSON_CreateObject();
    cJSON *id = id_json ? cJSON_Parse(id_json) : cJSON_CreateNull();
    if (!o || !id || !cJSON_AddItemToObject(o, "id", id) ||
        !cJSON_AddStringToObject(o, "error", msg))
        serve_die_oom();
    char *text = cJSON_PrintUnformatted(o);
    if (!text)
        serve_die_oom();
    conn_write(c, text, strlen(text));
    conn_write(c, "\n", 1);
    cJSON_free(text);
    cJSON_Delete(o);
    free(msg);
}

/* Writes what c's client will take now: all of it for stdout (blocking),
 * as much as the socket accepts otherwise. A failed write closes c, and so
 * does more than OUT_LIMIT bytes of replies left unread. */
static void conn_flush(conn *c)
{
    while (!c->dead && c->out_off < c->out_len) {
        ssize_t n = write(c->out_fd, c->out + c->out_off, conn_pending(c));
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            break;
        if (n <= 0) {
            if (c->is_stdio)
                fprintf(stderr, "moec-serve: cannot write to stdout: %s\n",
                        n < 0 ? strerror(errno) : "nothing written");
            c->dead = c->failed = 1;
            break;
        }
        c->out_off += (size_t)n;
        c->budget->held -= (size_t)n;
    }
    if (c->dead)
        return;
    if (c->out_off == c->out_len) {
        c->out_off = c->out_len = 0;
        if (c->out_cap > OUT_KEEP)
            conn_out_clear(c); /* a burst's buffer goes back */
    } else if (conn_pending(c) > OUT_LIMIT) {
        conn_drop(c, "it has not read %zu bytes of replies (more than %d MiB)", conn_pending(c),
                  OUT_LIMIT >> 20);
    }
}

static void conn_free(conn *c)
{
    if (!c)
        return;
    if (!c->is_stdio)
        close(c->fd);
    conn_in_clear(c);
    conn_out_clear(c);
    free(c);
}

/* ---- requests in flight ----------------------------------------------------- */

/* A request the engine has: its connection, its id as JSON text, what it
 * generated so far (for its done line). Linked into its connection's list. */
typedef struct inflight {
    serve_req_head head; /* first: events find their front end by it */
    conn *client;
    char *id_json;
    uint64_t engine_id;
    int32_t *out;       /* max_new tokens */
    int n_out;
    size_t cost;        /* its bytes, the engine's and these, in the budget */
    int logprob;        /* it asked for its tokens' log probabilities */
    struct inflight *prev, *next;
} inflight;

typedef struct server {
    moec_engine_t *engine;
    int max_seqs, max_seq_len, max_tokens, vocab;
    const int32_t *eos; /* the model's n_eos eos ids (the engine owns them) */
    int n_eos;
    uint64_t seeds;     /* the stream requests without a seed draw theirs from */
    conn **conns;
    int n_conns, cap_conns;
    int max_conns;      /* --max-connections */
    budget budget;      /* every connection's buffers together */
    char *scratch;      /* READ_CHUNK bytes: what one read brings */
    int listen_fd;      /* -1 with --stdin */
    int accept_paused;  /* out of file descriptors: no accept until a client leaves */
    serve_metrics *metrics; /* what /metrics reports */
    serve_http *http;   /* --http: the HTTP API's threads, or NULL */
} server;

/* Forgets r (the engine is done with it, or is told to be by the caller). */
static void req_free(inflight *r)
{
    conn *c = r->client;
    if (r->prev)
        r->prev->next = r->next;
    else
        c->reqs = r->next;
    if (r->next)
        r->next->prev = r->prev;
    c->n_running--;
    c->budget->held -= r->cost;
    c->budget->churn += r->cost;
    cJSON_free(r->id_json);
    free(r->out);
    free(r);
}

/* The eos ids as "1, 2" (cut with "..." when long), or "none". */
static const char *eos_text(const server *sv, char *buf, size_t cap)
{
    size_t n = (size_t)snprintf(buf, cap, "%s", sv->n_eos ? "" : "none");
    int i = 0;
    for (; i < sv->n_eos && n + 16 < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%d", i ? ", " : "", (int)sv->eos[i]);
    if (i < sv->n_eos)
        snprintf(buf + n, cap - n, ", ...");
    return buf;
}

/* r's done line: its tokens, why it ended and its metrics. */
static void reply_done(inflight *r, const char *finish, const moec_event *ev)
{
    conn *c = r->client;
    conn_printf(c, "{\"id\":%s,\"done\":true,\"tokens\":[", r->id_json);
    for (int i = 0; i < r->n_out; i++)
        conn_printf(c, i ? ",%d" : "%d", (int)r->out[i]);
    conn_printf(c, "],\"finish\":\"%s\"", finish);
    if (ev)
        conn_printf(c,
                    ",\"prompt_tokens\":%d,\"cached_tokens\":%d,\"ttft_ms\":%.3f,"
                    "\"itl_ms\":%.3f",
                    ev->n_prompt, ev->cached_tokens, ev->ttft_s * 1e3, ev->itl_s * 1e3);
    conn_printf(c, "}\n");
}

/* One event of the engine: a token line (with its log probabilities when
 * asked), and at the end the done line, or the error. */
static void reply_event(const moec_event *ev)
{
    inflight *r = ev->user;
    conn *c = r->client;
    if (ev->finish == MOEC_FINISH_ERROR) {
        reply_error(c, r->id_json, "generation failed: %s", ev->error);
        req_free(r);
        return;
    }
    r->out[r->n_out++] = ev->token;
    conn_printf(c, "{\"id\":%s,\"token\":%d,\"index\":%d", r->id_json, (int)ev->token,
                ev->index);
    if (r->logprob)
        conn_printf(c, ",\"logprob\":%.9g", ev->logprob);
    if (ev->n_top) {
        conn_printf(c, ",\"top_logprobs\":[");
        for (int i = 0; i < ev->n_top; i++)
            conn_printf(c, "%s[%d,%.9g]", i ? "," : "", (int)ev->top_ids[i],
                        ev->top_logprobs[i]);
        conn_printf(c, "]");
    }
    conn_printf(c, "}\n");
    if (ev->finish == MOEC_FINISH_NONE)
        return;
    reply_done(r, moec_finish_name(ev->finish), ev);
    req_free(r);
}

/* ---- requests ------------------------------------------------------------- */

/* Why a request is refused, as a new string. */
__attribute__((format(printf, 1, 2))) static char *refuse(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *msg = serve_vformat(fmt, ap);
    va_end(ap);
    return msg;
}

/* Every field of a request must be one of these, once: a misspelt
 * optional field would otherwise be ignored without a word. */
static const char *const REQUEST_FIELDS[] = {
    "id",          "prompt_ids",         "max_new_tokens",   "ignore_eos",
    "temperature", "top_k",              "top_p",            "min_p",
    "repetition_penalty", "presence_penalty", "frequency_penalty", "seed",
    "stop_token_ids", "logprobs",        "top_logprobs",     "stats",
    "cancel"};
#define N_REQUEST_FIELDS (sizeof REQUEST_FIELDS / sizeof *REQUEST_FIELDS)

/* NULL when req's fields are all known and none is given twice. */
static char *request_fields_check(const cJSON *req)
{
    const cJSON *f;
    cJSON_ArrayForEach(f, req)
    {
        size_t k = 0;
        while (k < N_REQUEST_FIELDS && strcmp(f->string, REQUEST_FIELDS[k]))
            k++;
        if (k == N_REQUEST_FIELDS) {
            char list[512] = "";
            for (size_t i = 0; i < N_REQUEST_FIELDS; i++)
                snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "",
                         REQUEST_FIELDS[i]);
            return refuse("unknown field \"%s\" (the fields: %s)", f->string, list);
        }
        for (const cJSON *g = req->child; g != f; g = g->next)
            if (!strcmp(g->string, f->string))
                return refuse("field \"%s\" is given twice", f->string);
    }
    return NULL;
}

/* An int field (absent: *out unchanged) as an integer from lo to hi. */
static char *field_int(const cJSON *req, const char *name, long long lo, long long hi,
                       long long *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(req, name);
    if (!v)
        return NULL;
    if (!serve_json_int(v, out) || *out < lo || *out > hi)
        return refuse("\"%s\" must be an integer from %lld to %lld", name, lo, hi);
    return NULL;
}

/* A number field (absent: *out unchanged); its range is the engine's to
 * check. */
static char *field_number(const cJSON *req, const char *name, float *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(req, name);
    if (!v)
        return NULL;
    if (!cJSON_IsNumber(v))
        return refuse("\"%s\" must be a number", name);
    if (!serve_json_float(v, out))
        return refuse("\"%s\" is past a float's range (%g), got %g", name, FLT_MAX,
                      v->valuedouble);
    return NULL;
}

/* A true/false field (absent: *out unchanged). */
static char *field_bool(const cJSON *req, const char *name, int *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(req, name);
    if (!v)
        return NULL;
    if (!cJSON_IsBool(v))
        return refuse("\"%s\" must be true or false", name);
    *out = cJSON_IsTrue(v);
    return NULL;
}

/* A list of token ids (absent: none) into a new array *ids of *n. */
static char *field_ids(const cJSON *req, const char *name, int32_t **ids, int *n)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(req, name);
    *ids = NULL;
    *n = 0;
    if (!v)
        return NULL;
    if (!cJSON_IsArray(v))
        return refuse("\"%s\" must be an array of token ids", name);
    *ids = serve_xcalloc((size_t)cJSON_GetArraySize(v), sizeof **ids);
    const cJSON *it;
    cJSON_ArrayForEach(it, v)
    {
        long long t;
        if (!serve_json_int(it, &t) || t < INT32_MIN || t > INT32_MAX)
            return refuse("\"%s\"[%d] is not an integer", name, *n);
        (*ids)[(*n)++] = (int32_t)t;
    }
    return NULL;
}

/* The request's fields into an engine request (prompt and stop ids in new
 * arrays the caller frees); NULL, or why it cannot be served. The ranges
 * of ids and settings, and whether it fits, are the engine's to say. */
static char *request_parse(server *sv, const cJSON *j, moec_request *r, int32_t **prompt,
                           int32_t **stop)
{
    long long max_new = 0, top_k = 0, top_logprobs = 0, seed = -1;
    moec_sampling *sp = &r->sampling;
    char *err = NULL;
    *stop = NULL;
    if (!cJSON_GetObjectItemCaseSensitive(j, "prompt_ids"))
        return refuse("missing \"prompt_ids\"");
    if ((err = field_ids(j, "prompt_ids", prompt, &r->n_prompt)))
        return err;
    if (!r->n_prompt)
        return refuse("\"prompt_ids\" is empty");
    const cJSON *mn = cJSON_GetObjectItemCaseSensitive(j, "max_new_tokens");
    if (!mn)
        return refuse("missing \"max_new_tokens\"");
    if (!serve_json_int(mn, &max_new))
        return refuse("\"max_new_tokens\" must be an integer");
    if (max_new < 1)
        return refuse("\"max_new_tokens\" must be at least 1, got %lld", max_new);
    if (max_new > INT32_MAX)
        return refuse("\"max_new_tokens\" must be at most %d, got %lld", INT32_MAX, max_new);
    r->max_tokens = (int)max_new;
    if ((err = field_bool(j, "ignore_eos", &r->ignore_eos)) ||
        (err = field_number(j, "temperature", &sp->temperature)) ||
        (err = field_int(j, "top_k", 0, INT32_MAX, &top_k)) ||
        (err = field_number(j, "top_p", &sp->top_p)) ||
        (err = field_number(j, "min_p", &sp->min_p)) ||
        (err = field_number(j, "repetition_penalty", &sp->repetition_penalty)) ||
        (err = field_number(j, "presence_penalty", &sp->presence_penalty)) ||
        (err = field_number(j, "frequency_penalty", &sp->frequency_penalty)) ||
        (err = field_int(j, "seed", 0, 9007199254740991LL, &seed)) ||
        (err = field_bool(j, "logprobs", &sp->logprob)) ||
        (err = field_int(j, "top_logprobs", 0, INT32_MAX, &top_logprobs)) ||
        (err = field_ids(j, "stop_token_ids", stop, &r->n_stop)))
        return err;
    r->prompt = *prompt;
    r->stop_ids = *stop;
    sp->top_k = (int)top_k;
    sp->top_logprobs = (int)top_logprobs;
    /* no seed: one of the service's own stream, so that each differs */
    if (seed < 0)
        seed = (long long)serve_seed_next(&sv->seeds);
    sp->seed = (uint64_t)seed;
    return NULL;
}

/* c's request in flight with this id, or NULL. */
static inflight *conn_find(const conn *c, const char *id_json)
{
    for (inflight *r = c->reqs; r; r = r->next)
        if (!strcmp(r->id_json, id_json))
            return r;
    return NULL;
}

/* {"id": ..., "stats": {...}}: the engine's counters. */
static void reply_stats(server *sv, conn *c, const char *id_json)
{
    moec_engine_stats st;
    moec_engine_get_stats(sv->engine, &st);
    conn_printf(c,
                "{\"id\":%s,\"stats\":{\"running\":%d,\"waiting\":%d,\"kv_blocks\":%d,"
                "\"kv_blocks_used\":%d,\"kv_blocks_cached\":%d,\"kv_block_size\":%d,"
                "\"prefix_hit_rate\":%.4f,\"tokens_per_s\":%.1f,\"busy_s\":%.3f,\"steps\":%llu,"
                "\"requests_done\":%llu,\"requests_cancelled\":%llu,\"preemptions\":%llu,"
                "\"prompt_tokens\":%llu,\"cached_tokens\":%llu,\"generated_tokens\":%llu,"
                "\"connections\":%d}}\n",
                id_json ? id_json : "null", st.running, st.waiting, st.kv_blocks,
                st.kv_blocks_used, st.kv_blocks_cached, st.kv_block_size, st.prefix_hit_rate,
                st.tokens_per_s, st.busy_s, (unsigned long long)st.steps,
                (unsigned long long)st.requests_done, (unsigned long long)st.requests_cancelled,
                (unsigned long long)st.preemptions, (unsigned long long)st.prompt_tokens,
                (unsigned long long)st.cached_tokens, (unsigned long long)st.generated_tokens,
                sv->n_conns);
}

/* A control line, {"stats": true} or {"id": X, "cancel": true} (X a
 * request in flight on this connection, which ends with a done line of
 * finish "cancelled"): NULL when answered, else why not. */
static char *handle_control(server *sv, conn *c, const cJSON *j, const char *id_json)
{
    const char *what = cJSON_HasObjectItem(j, "stats") ? "stats" : "cancel";
    const cJSON *f;
    cJSON_ArrayForEach(f, j)
    {
        if (strcmp(f->string, "id") && strcmp(f->string, what))
            return refuse("field \"%s\" in a %s line (it takes \"id\" and \"%s\" alone)",
                          f->string, what, what);
    }
    if (!cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, what)))
        return refuse("\"%s\" must be true", what);
    if (!strcmp(what, "stats")) {
        reply_stats(sv, c, id_json);
        return NULL;
    }
    if (!id_json)
        return refuse("missing \"id\" (the request to cancel)");
    inflight *r = conn_find(c, id_json);
    if (!r)
        return refuse("id %s is not in flight on this connection", id_json);
    if (moec_engine_cancel(sv->engine, r->engine_id) != MOEC_OK)
        return refuse("%s", moec_last_error_message());
    reply_done(r, "cancelled", NULL);
    req_free(r);
    return NULL;
}

/* The request's id as JSON text (new), or NULL with an error reply sent. */
static char *request_id(conn *c, const cJSON *j, int required)
{
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(j, "id");
    if (!id) {
        if (required)
            reply_error(c, NULL, "missing \"id\" (a string or a number)");
        return NULL;
    }
    if (!cJSON_IsString(id) && !cJSON_IsNumber(id)) {
        reply_error(c, NULL, "\"id\" must be a string or a number");
        return NULL;
    }
    if (cJSON_IsNumber(id) && !isfinite(id->valuedouble)) {
        reply_error(c, NULL, "\"id\" is a number too large to echo"); /* it would print null */
        return NULL;
    }
    size_t id_len = cJSON_IsString(id) ? strlen(id->valuestring) : 0;
    if (id_len && serve_utf8_invalid_at(id->valuestring, id_len) < id_len) {
        reply_error(c, NULL, "\"id\" is not valid UTF-8"); /* so it cannot be echoed */
        return NULL;
    }
    char *id_json = cJSON_PrintUnformatted(id);
    if (!id_json)
        serve_die_oom();
    return id_json;
}

/* Submits a checked request to the engine and tracks it; NULL, or why the
 * engine refused it. */
static char *request_submit(server *sv, conn *c, const moec_request *mr, char *id_json)
{
    /* its tokens twice (the engine's copy of prompt and output, and the
     * output here) and its ids: what it holds until it ends */
    size_t cost = ((size_t)mr->n_prompt + (size_t)mr->max_tokens) * 2 * sizeof(int32_t) +
                  (size_t)mr->n_stop * sizeof(int32_t) + sizeof(inflight) + strlen(id_json);
    if (sv->budget.held + cost > sv->budget.limit)
        return refuse("request refused: the requests in flight and the clients' buffers would "
                      "hold more than %zu MiB (--max-buffer-mib)",
                      sv->budget.limit >> 20);
    inflight *r = serve_xcalloc(1, sizeof *r);
    r->client = c;
    r->id_json = id_json;
    r->logprob = mr->sampling.logprob;
    moec_request q = *mr;
    q.user = r;
    if (moec_engine_submit(sv->engine, &q, &r->engine_id) != MOEC_OK) {
        free(r);
        return refuse("%s", moec_last_error_message());
    }
    r->head.t_submit = moec_now_s();
    r->out = serve_xcalloc((size_t)mr->max_tokens, sizeof *r->out);
    r->cost = cost;
    sv->budget.held += cost;
    r->next = c->reqs;
    if (c->reqs)
        c->reqs->prev = r;
    c->reqs = r;
    c->n_running++;
    return NULL;
}

/* Checks one line's object (its line: len bytes, the first that is not
 * UTF-8 at bad_utf8, len when none) and queues its request with the engine
 * or answers it (stats, cancel), or says why not. */
static void handle_request(server *sv, conn *c, const cJSON *j, size_t bad_utf8, size_t len)
{
    if (!cJSON_IsObject(j)) {
        reply_error(c, NULL, "a request must be a JSON object");
        return;
    }
    int control = cJSON_HasObjectItem(j, "stats") || cJSON_HasObjectItem(j, "cancel");
    char *id_json = request_id(c, j, !control);
    /* case-sensitive, as request_id looks: an "ID" is not an id (request_id
     * sent no reply for it), it is an unknown field, refused below */
    if (!id_json && (!control || cJSON_GetObjectItemCaseSensitive(j, "id")))
        return;
    char *err = bad_utf8 < len ? refuse("the request is not valid UTF-8 (byte %zu)", bad_utf8)
                               : request_fields_check(j);
    if (!err && control) {
        err = handle_control(sv, c, j, id_json);
    } else if (!err) {
        moec_request mr = {0};
        int32_t *prompt = NULL, *stop = NULL;
        err = request_parse(sv, j, &mr, &prompt, &stop);
        if (!err && conn_find(c, id_json))
            err = refuse("id %s is already in flight", id_json);
        if (!err && !(err = request_submit(sv, c, &mr, id_json)))
            id_json = NULL; /* the request holds it */
        free(prompt);
        free(stop);
    }
    if (err)
        reply_error(c, id_json, "%s", err);
    free(err);
    cJSON_free(id_json);
}

/* One request line (without its newline; NUL-terminated in place, so
 * line[len] must be writable). */
static void handle_line(server *sv, conn *c, char *line, size_t len)
{
    sv->budget.churn += len; /* the parse allocates in proportion */
    if (len && line[len - 1] == '\r')
        len--;
    line[len] = '\0';
    size_t blank = strspn(line, " \t\r\f\v");
    if (blank == len)
        return; /* an empty line asks nothing */
    int nul;
    long long values;
    size_t bad = moec_json_string_bad_at(line, len, &nul, &values);
    if (bad < len) {
        if (nul)
            reply_error(c, NULL,
                        "the request holds a NUL character (\\u0000) in a string (byte %zu): "
                        "moec takes no NUL in text",
                        bad);
        else
            reply_error(c, NULL, "malformed JSON at byte %zu (a control character in a string "
                                 "must be escaped)",
                        bad);
        return;
    }
    const char *end = NULL;
    cJSON *req = memchr(line, '\0', len) ? NULL : cJSON_ParseWithOpts(line, &end, 1);
    if (!req) {
        const char *at = end ? end : cJSON_GetErrorPtr();
        long off = at && at >= line && at <= line + len ? (long)(at - line) : (long)len;
        reply_error(c, NULL, "malformed JSON at byte %ld", off);
        return;
    }
    handle_request(sv, c, req, serve_utf8_invalid_at(line, len), len);
    cJSON_Delete(req);
}

/* Adds n bytes to c's unfinished line; -1 when that refuses the line (an
 * error reply sent, its bytes dropped): it grows past LINE_LIMIT, or all
 * clients together would hold more than --max-buffer-mib. */
static int conn_in_add(conn *c, const char *p, size_t n)
{
    budget *b = c->budget;
    if (c->in_len + n > LINE_LIMIT || b->held + n > b->limit) {
        if (c->in_len + n > LINE_LIMIT)
            reply_error(c, NULL, "request line longer than %d bytes", LINE_LIMIT);
        else
            reply_error(c, NULL,
                        "request line refused: the clients together would hold more than "
                        "%zu MiB (--max-buffer-mib)",
                        b->limit >> 20);
        conn_in_clear(c);
        return -1;
    }
    if (c->in_len + n + 1 > c->in_cap) {
        size_t cap = c->in_cap ? 2 * c->in_cap : 4096;
        if (cap < c->in_len + n + 1)
            cap = c->in_len + n + 1;
        if (cap > LINE_LIMIT + 1)
            cap = LINE_LIMIT + 1;
        c->in = serve_xrealloc(c->in, cap);
        c->in_cap = cap;
    }
    memcpy(c->in + c->in_len, p, n);
    c->in_len += n;
    b->held += n;
    return 0;
}

/* Reads what c sent and handles every complete line; at end of input the
 * last line, newline or not. Lines are handled where the read put them;
 * only an unfinished one is copied into c->in, freed once it ends. */
static void conn_read(server *sv, conn *c)
{
    ssize_t n = read(c->fd, sv->scratch, READ_CHUNK);
    if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK))
        return;
    if (n < 0) {
        if (c->is_stdio)
            fprintf(stderr, "moec-serve: cannot read stdin: %s\n", strerror(errno));
        c->dead = c->failed = 1;
        return;
    }
    if (n == 0) {
        c->eof = 1;
        if (c->in_len && !c->discarding)
            handle_line(sv, c, c->in, c->in_len);
        conn_in_clear(c);
        return;
    }
    char *p = sv->scratch, *end = p + n;
    for (char *nl; (nl = memchr(p, '\n', (size_t)(end - p))); p = nl + 1) {
        size_t len = (size_t)(nl - p);
        if (c->discarding)
            c->discarding = 0; /* the refused line ends here */
        else if (!c->in_len)
            handle_line(sv, c, p, len);
        else if (conn_in_add(c, p, len) == 0)
            handle_line(sv, c, c->in, c->in_len);
        conn_in_clear(c);
    }
    if (p < end && !c->discarding && conn_in_add(c, p, (size_t)(end - p)) < 0)
        c->discarding = 1;
}

/* ---- stepping ------------------------------------------------------------- */

/* One engine step (it admits, decodes, prefills and samples); what it
 * generated streamed to the clients. */
static void serve_step(server *sv)
{
    const moec_event *ev;
    int n;
    moec_status st = moec_engine_run(sv->engine, &ev, &n);
    if (st == MOEC_ERR_NUMERIC) /* only the requests it names end, with an error event each */
        fprintf(stderr, "moec-serve: %s\n", moec_last_error());
    else if (st != MOEC_OK) /* its requests end with an error event each */
        fprintf(stderr, "moec-serve: a step failed (%s): %s\n", moec_status_name(st),
                moec_last_error());
    double now = moec_now_s();
    for (int i = 0; i < n; i++) {
        serve_req_head *head = ev[i].user;
        if (ev[i].finish != MOEC_FINISH_ERROR) {
            if (ev[i].index == 0)
                serve_metrics_ttft(sv->metrics, now - head->t_submit);
            else
                serve_metrics_itl(sv->metrics, now - head->t_last);
            head->t_last = now;
        }
        if (head->http)
            serve_http_event(sv->http, sv->engine, &ev[i]);
        else
            reply_event(&ev[i]);
    }
}

/* ---- the loop ------------------------------------------------------------- */

static conn *server_add_conn(server *sv, int fd, int out_fd, int is_stdio)
{
    if (sv->n_conns == sv->cap_conns) {
        sv->cap_conns = sv->cap_conns ? 2 * sv->cap_conns : 8;
        sv->conns = serve_xrealloc(sv->conns, (size_t)sv->cap_conns * sizeof *sv->conns);
    }
    conn *c = serve_xcalloc(1, sizeof *c);
    c->budget = &sv->budget;
    c->fd = fd;
    c->out_fd = out_fd;
    c->is_stdio = is_stdio;
    sv->conns[sv->n_conns++] = c;
    return c;
}

/* Connections not yet closed. */
static int server_n_open(const server *sv)
{
    int n = 0;
    for (int i = 0; i < sv->n_conns; i++)
        n += !sv->conns[i]->dead;
    return n;
}

/* Turns away a client past --max-connections: one error line, then the
 * connection closes. What the client already sent is read first, so that
 * it sees the line and then the end rather than a reset. */
static void server_refuse(server *sv, int fd)
{
    for (int k = 0; k < 16; k++)
        if (read(fd, sv->scratch, READ_CHUNK) <= 0)
            break;
    char line[160];
    int n = snprintf(line, sizeof line,
                     "{\"id\":null,\"error\":\"too many connections: all %d that "
                     "--max-connections allows are open\"}\n",
                     sv->max_conns);
    if (write(fd, line, (size_t)n) < 0) {
        /* it has gone already: there is no one to tell */
    }
    close(fd);
}

/* Accepts every pending connection, non-blocking. */
static void server_accept(server *sv)
{
    for (;;) {
        int fd = accept(sv->listen_fd, NULL, NULL);
        if (fd < 0) {
            if (errno == EMFILE || errno == ENFILE)
                sv->accept_paused = 1; /* else poll would report the same connection forever */
            if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR &&
                errno != ECONNABORTED)
                fprintf(stderr, "moec-serve: accept: %s\n", strerror(errno));
            return;
        }
        int fl = fcntl(fd, F_GETFL), one = 1;
        if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0) {
            fprintf(stderr, "moec-serve: fcntl: %s\n", strerror(errno));
            close(fd);
            continue;
        }
        /* a token line goes out at once, not held back (Nagle) until the
         * client acknowledges the last one */
        if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) < 0)
            fprintf(stderr, "moec-serve: TCP_NODELAY: %s\n", strerror(errno));
        if (server_n_open(sv) >= sv->max_conns)
            server_refuse(sv, fd);
        else
            server_add_conn(sv, fd, fd, 0);
    }
}

/* Frees the connections that are closed, or done: at end of input with
 * nothing running and nothing left to write. Their sequences end. Returns
 * 1 when stdin or stdout failed. */
static int server_reap(server *sv)
{
    int kept = 0, stdio_failed = 0;
    for (int i = 0; i < sv->n_conns; i++) {
        conn *c = sv->conns[i];
        if (c->eof && !c->n_running && c->out_len == c->out_off)
            c->dead = 1;
        if (!c->dead) {
            sv->conns[kept++] = c;
            continue;
        }
        while (c->reqs) { /* no one to answer: they end, their blocks freed */
            if (moec_engine_cancel(sv->engine, c->reqs->engine_id) != MOEC_OK)
                fprintf(stderr, "moec-serve: %s\n", moec_last_error());
            req_free(c->reqs);
        }
        stdio_failed |= c->is_stdio && c->failed;
        conn_free(c);
        sv->accept_paused = 0;
    }
    sv->n_conns = kept;
    return stdio_failed;
}

/* While the clients together hold more than --max-buffer-mib, drops the
 * one with the most replies unread (request lines are refused as they
 * arrive, so only replies push the total over). */
static void server_budget_check(server *sv)
{
    while (sv->budget.held > sv->budget.limit) {
        conn *worst = NULL;
        for (int i = 0; i < sv->n_conns; i++) {
            conn *c = sv->conns[i];
            if (!c->dead && (!worst || conn_pending(c) > conn_pending(worst)))
                worst = c;
        }
        if (!worst || !conn_pending(worst))
            return;
        conn_drop(worst,
                  "it has not read %zu bytes of replies, and the clients together hold more "
                  "than %zu MiB (--max-buffer-mib)",
                  conn_pending(worst), sv->budget.limit >> 20);
    }
}

/* Gives memory freed since the last time back to the OS, once there is
 * enough of it: glibc keeps freed heap pages for reuse, so after a burst of
 * big request lines the process would otherwise stay at the burst's size.
 * Done when the loop is about to wait (cheap then), or while sequences run
 * once much more has piled up. */
static void server_trim(server *sv)
{
#ifdef __GLIBC__
    if (sv->budget.churn < (moec_engine_pending(sv->engine) ? 64 : 1) * (size_t)TRIM_AFTER)
        return;
    malloc_trim(0);
    sv->budget.churn = 0;
#else
    (void)sv;
#endif
}

static volatile sig_atomic_t g_stop;

static void on_signal(int sig)
{
    (void)sig;
    g_stop = 1;
}

/* Serves until SIGINT or SIGTERM, or with --stdin until stdin is done.
 * SIGINT and SIGTERM are blocked but inside ppoll (orig: the mask there),
 * so none is missed between the check of g_stop and the wait, and the HTTP
 * threads never take them. Returns the exit code. */
static int server_run(server *sv, int stdio, const sigset_t *orig)
{
    struct pollfd *pfd = NULL;
    int cap_pfd = 0, rc = 0;
    while (!g_stop) {
        if (server_reap(sv))
            rc = 1;
        if (stdio && sv->n_conns == 0)
            break; /* stdin done (or stdout gone) and every request answered */
        if (cap_pfd < sv->n_conns + 1) {
            cap_pfd = sv->n_conns + 8;
            pfd = serve_xrealloc(pfd, (size_t)cap_pfd * sizeof *pfd);
        }
        int np = 0, n_conn_fds = sv->n_conns, http_at = 0;
        if (sv->listen_fd >= 0)
            pfd[np++] = (struct pollfd){.fd = sv->accept_paused ? -1 : sv->listen_fd,
                                        .events = POLLIN};
        for (int i = 0; i < sv->n_conns; i++) {
            conn *c = sv->conns[i];
            short ev = (short)((c->eof ? 0 : POLLIN) |
                               (c->out_off < c->out_len && !c->is_stdio ? POLLOUT : 0));
            pfd[np++] = (struct pollfd){.fd = ev ? c->fd : -1, .events = ev};
        }
        if (sv->http) {
            http_at = np;
            np = serve_http_poll_fds(sv->http, &pfd, &cap_pfd, np);
        }
        server_trim(sv);
        /* Running sequences: only look; otherwise wait for a client. */
        struct timespec zero = {0, 0};
        int r = ppoll(pfd, (nfds_t)np, moec_engine_pending(sv->engine) ? &zero : NULL, orig);
        if (r < 0 && errno != EINTR) {
            fprintf(stderr, "moec-serve: poll: %s\n", strerror(errno));
            rc = 1;
            break;
        }
        if (r > 0) {
            int k = 0;
            if (sv->listen_fd >= 0 && pfd[k++].revents & POLLIN)
                server_accept(sv);
            for (int i = 0; i < n_conn_fds; i++, k++) {
                conn *c = sv->conns[i];
                short re = pfd[k].revents;
                if (re & POLLNVAL)
                    c->dead = 1;
                if (!c->eof && re & (POLLIN | POLLHUP | POLLERR))
                    conn_read(sv, c);
                if (re & (POLLOUT | POLLERR))
                    conn_flush(c);
            }
        }
        if (sv->http)
            serve_http_pump(sv->http, sv->engine, r > 0 ? pfd + http_at : NULL);
        if (moec_engine_pending(sv->engine))
            serve_step(sv);
        for (int i = 0; i < sv->n_conns; i++)
            conn_flush(sv->conns[i]);
        server_budget_check(sv);
        moec_engine_stats stats; /* for /metrics: steps, cancels and admissions change it */
        moec_engine_get_stats(sv->engine, &stats);
        serve_metrics_engine(sv->metrics, &stats);
    }
    free(pfd);
    return rc;
}

/* A listening socket on 127.0.0.1:port (0: any free port, written back). */
static int listen_loopback(int *port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) {
        fprintf(stderr, "moec-serve: socket: %s\n", strerror(errno));
        return -1;
    }
    int one = 1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)*port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t alen = sizeof a;
    int fl;
    if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) < 0 ||
        bind(fd, (struct sockaddr *)&a, sizeof a) < 0 || listen(fd, 64) < 0 ||
        getsockname(fd, (struct sockaddr *)&a, &alen) < 0 || (fl = fcntl(fd, F_GETFL)) < 0 ||
        fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0) {
        fprintf(stderr, "moec-serve: cannot listen on 127.0.0.1:%d: %s\n", *port,
                strerror(errno));
        close(fd);
        return -1;
    }
    *port = ntohs(a.sin_port);
    return fd;
}

/* ---- main ----------------------------------------------------------------- */

typedef struct serve_opts {
    const char *path;    /* MODEL_DIR or PLAN */
    const char *weights;
    long port;           /* -1: --stdin */
    int stdin_set;       /* --stdin given */
    long max_seqs, max_seq_len;
    long max_conns, buffer_mib;
    long kv_blocks, kv_block_size;
    double kv_fraction;
    moec_backend backend;
    int backend_set;
    int single_stream, eager, no_prefix_cache;
    long tp, ep;         /* --tp, --ep (0: not given) */
    long http_port;      /* --http: -1 none */
    const char *host;    /* --host */
    const char *model_name, *tokenizer;
    long max_waiting, body_kib, http_timeout, http_threads;
} serve_opts;

/* An option that takes a count from 1 to max, and where it goes. */
typedef struct count_opt {
    const char *name;
    long max;
    long *dst;
} count_opt;

/* Parses the command line; returns -1 to go on, else the exit code. */
static int parse_args(int argc, char **argv, serve_opts *o)
{
    o->port = o->http_port = -1;
    o->max_conns = DEFAULT_CONNS;
    o->buffer_mib = DEFAULT_BUFFER_MIB;
    o->max_waiting = DEFAULT_WAITING;
    o->body_kib = DEFAULT_BODY_KIB;
    o->http_timeout = DEFAULT_HTTP_TIMEOUT;
    o->http_threads = DEFAULT_HTTP_THREADS;
    const count_opt counts[] = {{"--max-seqs", COUNT_LIMIT, &o->max_seqs},
                                {"--max-seq-len", SEQ_LEN_LIMIT, &o->max_seq_len},
                                {"--max-connections", COUNT_LIMIT, &o->max_conns},
                                {"--max-buffer-mib", COUNT_LIMIT, &o->buffer_mib},
                                {"--kv-blocks", KV_BLOCKS_LIMIT, &o->kv_blocks},
                                {"--kv-block-size", COUNT_LIMIT, &o->kv_block_size},
                                {"--tp", 64, &o->tp},
                                {"--ep", 64, &o->ep},
                                {"--max-waiting", COUNT_LIMIT, &o->max_waiting},
                                {"--max-body-kib", BODY_KIB_LIMIT, &o->body_kib},
                                {"--http-timeout", 86400, &o->http_timeout},
                                {"--http-threads", 64, &o->http_threads}};
    const char *http_count = NULL; /* the last --http count option given */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const count_opt *cnt = NULL;
        for (size_t k = 0; k < sizeof counts / sizeof *counts; k++)
            if (!strcmp(a, counts[k].name))
                cnt = &counts[k];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(USAGE, stdout);
            return 0;
        } else if (!strcmp(a, "--stdin")) {
            o->stdin_set = 1;
        } else if (!strcmp(a, "--single-stream")) {
            o->single_stream = 1;
        } else if (!strcmp(a, "--eager")) {
            o->eager = 1;
        } else if (!strcmp(a, "--no-prefix-cache")) {
            o->no_prefix_cache = 1;
        } else if (cnt || !strcmp(a, "--weights") || !strcmp(a, "--port") ||
                   !strcmp(a, "--backend") || !strcmp(a, "--kv-memory-fraction") ||
                   !strcmp(a, "--http") || !strcmp(a, "--host") ||
                   !strcmp(a, "--served-model-name") || !strcmp(a, "--tokenizer")) {
            if (i + 1 == argc)
                return usage_error("%s needs a value", a);
            const char *v = argv[++i];
            if (cnt) {
                if (parse_int(v, 1, cnt->max, cnt->dst))
                    return count_error(a, v, cnt->max);
                if (cnt->dst == &o->max_waiting || cnt->dst == &o->body_kib ||
                    cnt->dst == &o->http_timeout || cnt->dst == &o->http_threads)
                    http_count = a;
            } else if (!strcmp(a, "--weights")) {
                o->weights = v;
            } else if (!strcmp(a, "--port") || !strcmp(a, "--http")) {
                if (parse_int(v, 0, 65535, a[2] == 'p' ? &o->port : &o->http_port)) {
                    fprintf(stderr, "moec-serve: %s: '%s' is not a port number (0 to 65535)\n\n%s",
                            a, v, USAGE);
                    return 2;
                }
            } else if (!strcmp(a, "--host")) {
                if (serve_http_host_check(v))
                    return 2;
                o->host = v;
            } else if (!strcmp(a, "--served-model-name")) {
                if (!*v || serve_utf8_invalid_at(v, strlen(v)) < strlen(v))
                    return usage_error("--served-model-name: '%s' is empty or not UTF-8", v);
                o->model_name = v;
            } else if (!strcmp(a, "--tokenizer")) {
                o->tokenizer = v;
            } else if (!strcmp(a, "--kv-memory-fraction")) {
                char *end;
                errno = 0;
                o->kv_fraction = strtod(v, &end);
                if (errno || end == v || *end || !(o->kv_fraction > 0 && o->kv_fraction <= 1))
                    return usage_error("--kv-memory-fraction: '%s' is not a number above 0 and "
                                       "at most 1",
                                       v);
            } else {
                o->backend_set = 1;
                if (!strcmp(v, "cpu"))
                    o->backend = MOEC_BACKEND_CPU;
                else if (!strcmp(v, "cuda"))
                    o->backend = MOEC_BACKEND_CUDA;
                else if (!strcmp(v, "auto"))
                    o->backend = MOEC_BACKEND_AUTO;
                else
                    return usage_error("--backend: '%s' is not cpu, cuda or auto", v);
            }
        } else if (a[0] == '-') {
            return usage_error("unknown option %s", a);
        } else if (!o->path) {
            o->path = a;
        } else {
            return usage_error("unexpected argument %s", a);
        }
    }
    if (!o->path)
        return usage_error("%s", "missing MODEL_DIR or PLAN");
    if (o->stdin_set && o->port >= 0)
        return usage_error("%s", "--stdin and --port cannot be used together: requests come "
                                 "from stdin or from TCP, not both");
    if (o->stdin_set && o->http_port >= 0)
        return usage_error("%s", "--stdin and --http cannot be used together: the service "
                                 "ends with stdin, the HTTP API runs until stopped");
    if (o->http_port < 0) {
        const char *http_only[] = {o->host ? "--host" : NULL,
                                   o->model_name ? "--served-model-name" : NULL,
                                   o->tokenizer ? "--tokenizer" : NULL, http_count};
        for (int k = 0; k < 4; k++)
            if (http_only[k])
                return usage_error("%s is for the HTTP API: it needs --http PORT", http_only[k]);
    }
    return -1;
}

/* A plan file is anything that exists and is not a directory (the engine
 * says when it is not a plan); anything else is taken for a model. */
static int is_plan_path(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && !S_ISDIR(sb.st_mode);
}

/* Opens the engine; returns -1 on success, else the exit code. */
static int open_engine(const serve_opts *o, serve_model_opener open_model, moec_engine_t **out)
{
    moec_engine_options eo = {.backend = o->backend,
                              .max_seqs = (int)o->max_seqs,
                              .max_seq_len = (int)o->max_seq_len,
                              .single_stream = o->single_stream,
                              .eager = o->eager,
                              .kv_blocks = (int)o->kv_blocks,
                              .kv_memory_fraction = o->kv_fraction,
                              .kv_block_size = (int)o->kv_block_size,
                              .no_prefix_cache = o->no_prefix_cache,
                              .par = {.tp = (int)(o->tp ? o->tp : o->ep), .ep = (int)o->ep}};
    moec_status st;
    if (is_plan_path(o->path)) {
        if (!o->weights)
            return usage_error("%s is a plan file: --weights MODEL_DIR (the checkpoint it was "
                               "compiled for) is required",
                               o->path);
        if (o->backend_set && o->backend == MOEC_BACKEND_CPU)
            return usage_error("--backend cpu: %s is a plan, which runs on the GPU", o->path);
        st = moec_engine_open_plan(o->path, o->weights, &eo, out);
    } else if (open_model) {
        st = open_model(o->path, o->weights ? o->weights : o->path, &eo, out);
    } else {
        return usage_error("%s is not a plan file: moec-serve serves plan files (moec compile); "
                           "`moec serve MODEL_DIR` compiles and serves a model folder",
                           o->path);
    }
    if (st != MOEC_OK) {
        fprintf(stderr, "moec-serve: error (%s): %s\n", moec_status_name(st), moec_last_error());
        return 1;
    }
    return -1;
}

/* --http: the tokenizer (--tokenizer, else the checkpoint's folder) and the
 * model's id (--served-model-name, else that folder's name); -1 on success,
 * else the exit code. */
static int open_tokenizer(const serve_opts *o, moec_tokenizer_t **tok, char **model_name)
{
    const char *dir = o->weights ? o->weights : o->path;
    if (moec_tokenizer_open(o->tokenizer ? o->tokenizer : dir, tok) != MOEC_OK) {
        fprintf(stderr, "moec-serve: --http needs a tokenizer: %s\n", moec_last_error());
        return 1;
    }
    if (o->model_name) {
        *model_name = serve_format("%s", o->model_name);
        return -1;
    }
    size_t end = strlen(dir);
    while (end > 1 && dir[end - 1] == '/')
        end--;
    size_t start = end;
    while (start > 0 && dir[start - 1] != '/')
        start--;
    *model_name = serve_format("%.*s", (int)(end - start), dir + start);
    if (serve_utf8_invalid_at(*model_name, strlen(*model_name)) < strlen(*model_name)) {
        fprintf(stderr, "moec-serve: the folder name of %s is not UTF-8: name the model with "
                        "--served-model-name\n", dir);
        moec_tokenizer_free(*tok);
        free(*model_name);
        return 2;
    }
    return -1;
}

int moec_serve_main(int argc, char **argv, serve_model_opener open_model)
{
    serve_opts o = {0};
    int rc = parse_args(argc, argv, &o);
    if (rc >= 0)
        return rc;
    signal(SIGPIPE, SIG_IGN);
    struct sigaction sa = {.sa_handler = on_signal};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigset_t block, orig;
    sigemptyset(&block);
    sigaddset(&block, SIGINT);
    sigaddset(&block, SIGTERM);
    sigprocmask(SIG_BLOCK, &block, &orig); /* before any thread starts: see server_run */

    server sv = {.listen_fd = -1};
    moec_tokenizer_t *tok = NULL;
    char *model_name = NULL;
    if (o.http_port >= 0 && (rc = open_tokenizer(&o, &tok, &model_name)) >= 0)
        return rc;
    if ((rc = open_engine(&o, open_model, &sv.engine)) >= 0) {
        moec_tokenizer_free(tok);
        free(model_name);
        return rc;
    }
    sv.max_seqs = moec_engine_max_seqs(sv.engine);
    sv.max_seq_len = moec_engine_max_seq_len(sv.engine);
    sv.max_tokens = moec_engine_max_tokens(sv.engine);
    sv.vocab = moec_engine_vocab_size(sv.engine);
    sv.n_eos = moec_engine_eos_tokens(sv.engine, &sv.eos);
    sv.max_conns = (int)o.max_conns;
    sv.budget.limit = (size_t)o.buffer_mib << 20;
    sv.scratch = serve_xcalloc(READ_CHUNK, 1);
    sv.seeds = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);

    sv.metrics = serve_metrics_new();

    char where[256] = "reading requests from stdin";
    int port = (int)o.port, stdio = o.port < 0 && o.http_port < 0;
    if (o.port >= 0) {
        sv.listen_fd = listen_loopback(&port);
        if (sv.listen_fd < 0)
            rc = 1;
        snprintf(where, sizeof where, "listening on 127.0.0.1:%d", port);
    } else if (stdio) {
        server_add_conn(&sv, 0, 1, 1);
    } else {
        where[0] = '\0';
    }
    if (rc < 0 && o.http_port >= 0) {
        serve_http_config hc = {.host = o.host ? o.host : "127.0.0.1",
                                .port = (int)o.http_port,
                                .model_name = model_name,
                                .max_connections = (int)o.max_conns,
                                .max_waiting = (int)o.max_waiting,
                                .max_body = (size_t)o.body_kib << 10,
                                .timeout_s = (unsigned)o.http_timeout,
                                .threads = (int)o.http_threads,
                                .max_seq_len = sv.max_seq_len,
                                .max_len = moec_engine_max_len(sv.engine),
                                .vocab = sv.vocab};
        int v6 = strchr(hc.host, ':') != NULL;
        if (serve_http_start(&hc, tok, sv.metrics, &sv.http))
            rc = 1;
        else
            snprintf(where + strlen(where), sizeof where - strlen(where),
                     "%sHTTP API of model '%s' on %s%s%s:%d", where[0] ? "; " : "", model_name,
                     v6 ? "[" : "", hc.host, v6 ? "]" : "", serve_http_port(sv.http));
    }
    if (rc < 0) {
        char eos[96];
        fprintf(stderr,
                "moec-serve: %s backend, up to %d sequences at once of up to %d tokens, a KV "
                "pool of %d blocks of %d tokens%s, %d tokens a step, vocab_size %d, eos %s; "
                "%s\n",
                backend_name(moec_engine_backend(sv.engine)), sv.max_seqs, sv.max_seq_len,
                moec_engine_kv_blocks(sv.engine), moec_engine_kv_block_size(sv.engine),
                o.no_prefix_cache ? " (no prefix caching)" : "", sv.max_tokens, sv.vocab,
                eos_text(&sv, eos, sizeof eos), where);
        rc = server_run(&sv, stdio, &orig);
    }
    serve_http_stop(sv.http); /* its requests end before the engine goes */
    sigprocmask(SIG_SETMASK, &orig, NULL);

    for (int i = 0; i < sv.n_conns; i++) {
        while (sv.conns[i]->reqs) /* the engine, freed below, frees its side */
            req_free(sv.conns[i]->reqs);
        conn_free(sv.conns[i]);
    }
    free(sv.conns);
    if (sv.listen_fd >= 0)
        close(sv.listen_fd);
    free(sv.scratch);
    moec_engine_free(sv.engine);
    serve_metrics_free(sv.metrics);
    moec_tokenizer_free(tok);
    free(model_name);
    return rc;
}
