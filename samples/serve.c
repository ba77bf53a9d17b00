/* serve.c — moec-serve: a low-latency generation service over the engine
 * (moec_engine_*). It loads a model (or a plan file) once, then answers
 * requests, one JSON object a line, on stdin or on TCP connections to
 * 127.0.0.1, streaming every generated token back as a JSON line as soon as
 * its step ends.
 *
 * One thread, one poll() loop: it reads requests, admits each into a free
 * sequence slot (or answers why not), and while any sequence is running it
 * runs engine steps back to back. A step packs, up to the engine's
 * max_tokens, first one decode token of every running sequence (so a long
 * prompt arriving never stalls the others' next token), then prompt tokens
 * of new sequences, oldest first (chunked prefill: a long prompt spans as
 * many steps as it needs). Decoding is greedy, from the engine's next ids.
 * A sequence ends after max_new_tokens, or at the model's eos_token_id
 * unless the request says ignore_eos; its slot is then free for the next
 * request. A client that goes away takes its sequences with it. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <cjson/cJSON.h>

#include "moec.h"

static const char *USAGE =
    "usage: moec-serve MODEL_DIR [options]\n"
    "       moec-serve PLAN --weights MODEL_DIR [options]\n"
    "\n"
    "Loads the model once and serves greedy generation requests: one JSON object\n"
    "a line, on stdin (the default) or on TCP connections to 127.0.0.1:\n"
    "\n"
    "  {\"id\": \"a\", \"prompt_ids\": [1, 2, 3], \"max_new_tokens\": 16, \"ignore_eos\": false}\n"
    "\n"
    "id is a string or a number, echoed in every reply; ignore_eos is optional.\n"
    "Each generated token is sent as soon as it is known, then a final line:\n"
    "\n"
    "  {\"id\":\"a\",\"token\":17,\"index\":0}\n"
    "  {\"id\":\"a\",\"done\":true,\"tokens\":[17,...],\"finish\":\"length\"}   (or \"eos\")\n"
    "\n"
    "A request that cannot be served gets {\"id\":...,\"error\":\"message\"} (id null\n"
    "when the request has no usable id) and the others go on. Requests run together:\n"
    "every step decodes one token of each running sequence and fills the rest of\n"
    "the step with the prompts of new ones. Each request takes one sequence slot\n"
    "until it finishes; with every slot busy a request is refused (\"cache full\").\n"
    "Replies go to the connection a request came from. With --stdin, the service\n"
    "exits when stdin is closed and every request has finished.\n"
    "\n"
    "options:\n"
    "  --weights DIR        the checkpoint (config.json + *.safetensors): required\n"
    "                       with a PLAN; with MODEL_DIR, weights from DIR instead\n"
    "  --stdin              requests on stdin, replies on stdout (the default)\n"
    "  --port N             listen on 127.0.0.1:N instead (0: a free port; the\n"
    "                       startup line on stderr names it)\n"
    "  --max-seqs N         sequence slots: requests served at once (default 8)\n"
    "  --max-seq-len N      tokens per sequence, prompt + new tokens (default 4096,\n"
    "                       or the model's max_position_embeddings if less)\n"
    "  --backend B          cpu (the fp32 reference interpreter), cuda, or auto\n"
    "                       (default: cuda where a GPU is present, else cpu); cuda\n"
    "                       computes in bf16, or fp32 with MOEC_DTYPE=fp32\n"
    "  --single-stream      cuda: the shared experts on the main stream too\n"
    "  --eager              cuda: launch kernels one by one, no CUDA Graphs\n"
    "  -h, --help           this help\n";

#define LINE_LIMIT (1 << 20)     /* longest request line, in bytes */
#define READ_CHUNK (64 << 10)    /* bytes read at once */
#define OUT_LIMIT (64 << 20)     /* replies held for a client that does not read */

/* ---- small helpers -------------------------------------------------------- */

static void die_oom(void)
{
    fprintf(stderr, "moec-serve: out of memory\n");
    exit(1);
}

static void *xrealloc(void *p, size_t n)
{
    p = realloc(p, n ? n : 1);
    if (!p)
        die_oom();
    return p;
}

static void *xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size);
    if (!p)
        die_oom();
    return p;
}

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

static const char *backend_name(moec_backend b)
{
    return b == MOEC_BACKEND_CUDA ? "cuda" : b == MOEC_BACKEND_CPU ? "cpu" : "auto";
}

/* ---- connections ---------------------------------------------------------- */

/* A client: a TCP connection, or stdin and stdout. Requests are read into
 * `in` until a newline; replies wait in `out` until the client takes them. */
typedef struct conn {
    int fd;          /* read from (a socket, or 0) */
    int out_fd;      /* written to (the socket, or 1) */
    int is_stdio;    /* stdout is written with blocking writes */
    int eof;         /* the client sent all it will send */
    int dead;        /* closed: free it once the loop is done with it */
    int failed;      /* closed because reading or writing failed */
    int discarding;  /* inside an over-long line: dropping bytes to its newline */
    int n_running;   /* its sequences still generating */
    char *in;
    size_t in_len;
    char *out;
    size_t out_len, out_off, out_cap;
} conn;

/* Appends text to c's replies. */
static void conn_write(conn *c, const char *text, size_t n)
{
    if (c->dead)
        return;
    if (c->out_len + n > c->out_cap) {
        c->out_cap = (c->out_len + n) * 2;
        c->out = xrealloc(c->out, c->out_cap);
    }
    memcpy(c->out + c->out_len, text, n);
    c->out_len += n;
}

__attribute__((format(printf, 2, 3))) static void conn_printf(conn *c, const char *fmt, ...)
{
    char small[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n < sizeof small) {
        conn_write(c, small, (size_t)n);
        return;
    }
    char *big = xrealloc(NULL, (size_t)n + 1);
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    conn_write(c, big, (size_t)n);
    free(big);
}

/* An error reply: {"id": <id or null>, "error": msg}. id_json is the id as
 * JSON text, or NULL. */
__attribute__((format(printf, 3, 4))) static void reply_error(conn *c, const char *id_json,
                                                              const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    cJSON *o = cJSON_CreateObject();
    cJSON *id = id_json ? cJSON_Parse(id_json) : cJSON_CreateNull();
    if (!o || !id || !cJSON_AddItemToObject(o, "id", id) ||
        !cJSON_AddStringToObject(o, "error", msg))
        die_oom();
    char *text = cJSON_PrintUnformatted(o);
    if (!text)
        die_oom();
    conn_printf(c, "%s\n", text);
    cJSON_free(text);
    cJSON_Delete(o);
}

/* Writes what c's client will take now: all of it for stdout (blocking),
 * as much as the socket accepts otherwise. A failed write closes c. */
static void conn_flush(conn *c)
{
    while (!c->dead && c->out_off < c->out_len) {
        ssize_t n = write(c->out_fd, c->out + c->out_off, c->out_len - c->out_off);
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
    }
    if (c->out_off == c->out_len)
        c->out_off = c->out_len = 0;
    else if (c->out_len - c->out_off > OUT_LIMIT) {
        fprintf(stderr, "moec-serve: dropping a client that has not read %zu bytes of replies\n",
                c->out_len - c->out_off);
        c->dead = 1;
    }
}

static void conn_free(conn *c)
{
    if (!c)
        return;
    if (!c->is_stdio)
        close(c->fd);
    free(c->in);
    free(c->out);
    free(c);
}

/* ---- sequences ------------------------------------------------------------ */

/* A request being served, in the slot of its index. Its tokens are the
 * prompt then the generated ids; `fed` of them have been through a step
 * (their K/V are in the slot's cache), `known` are known. While the prompt
 * is being fed, known - fed prompt tokens wait; afterwards exactly one: the
 * last generated token, whose next id the next step gives. */
typedef struct seq {
    int busy;
    conn *client;
    char *id_json;      /* the request's id as JSON text */
    int32_t *tokens;    /* n_prompt + max_new */
    int n_prompt, max_new;
    int known, fed;
    int ignore_eos;
    uint64_t arrival;   /* admission order: older prompts are fed first */
} seq;

typedef struct server {
    moec_engine_t *engine;
    int max_seqs, max_seq_len, max_tokens, vocab, eos;
    seq *seqs;          /* max_seqs, by slot */
    int n_busy;
    uint64_t arrivals;
    int rotate;         /* the first slot to get a decode token this step */
    conn **conns;
    int n_conns, cap_conns;
    int listen_fd;      /* -1 with --stdin */
    int accept_paused;  /* out of file descriptors: no accept until a client leaves */
    /* one step's inputs and outputs */
    int32_t *tok, *pos, *slot, *next;
} server;

static void seq_release(server *sv, seq *q)
{
    if (!q->busy)
        return;
    q->client->n_running--;
    cJSON_free(q->id_json);
    free(q->tokens);
    memset(q, 0, sizeof *q);
    sv->n_busy--;
}

/* Appends generated token t to q and streams it; ends q at its length or
 * at eos. */
static void seq_emit(server *sv, seq *q, int32_t t)
{
    q->tokens[q->known++] = t;
    int index = q->known - q->n_prompt - 1;
    conn *c = q->client;
    conn_printf(c, "{\"id\":%s,\"token\":%d,\"index\":%d}\n", q->id_json, (int)t, index);
    const char *finish = !q->ignore_eos && sv->eos >= 0 && t == sv->eos ? "eos"
                         : index + 1 == q->max_new                        ? "length"
                                                                          : NULL;
    if (!finish)
        return;
    conn_printf(c, "{\"id\":%s,\"done\":true,\"tokens\":[", q->id_json);
    for (int i = q->n_prompt; i < q->known; i++)
        conn_printf(c, i > q->n_prompt ? ",%d" : "%d", (int)q->tokens[i]);
    conn_printf(c, "],\"finish\":\"%s\"}\n", finish);
    seq_release(sv, q);
}

/* ---- requests ------------------------------------------------------------- */

/* v as an int when it is a JSON number with an integral value that fits. */
static int json_int(const cJSON *v, long long *out)
{
    if (!cJSON_IsNumber(v))
        return 0;
    double d = v->valuedouble;
    if (!isfinite(d) || d != floor(d) || fabs(d) > 9007199254740992.0)
        return 0;
    *out = (long long)d;
    return 1;
}

/* Writes why a request is refused into err; returns -1. */
__attribute__((format(printf, 3, 4))) static int refuse(char *err, size_t cap, const char *fmt,
                                                        ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, cap, fmt, ap);
    va_end(ap);
    return -1;
}

/* Checks a request's fields; 0 when it can be served, else -1 with the
 * reason in err. */
static int request_check(const server *sv, const cJSON *req, char *err, size_t cap)
{
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(req, "prompt_ids");
    const cJSON *max_new = cJSON_GetObjectItemCaseSensitive(req, "max_new_tokens");
    const cJSON *ignore = cJSON_GetObjectItemCaseSensitive(req, "ignore_eos");
    if (!ids)
        return refuse(err, cap, "missing \"prompt_ids\"");
    if (!cJSON_IsArray(ids))
        return refuse(err, cap, "\"prompt_ids\" must be an array of token ids");
    int n_prompt = cJSON_GetArraySize(ids);
    if (n_prompt == 0)
        return refuse(err, cap, "\"prompt_ids\" is empty");
    int i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, ids)
    {
        long long t;
        if (!json_int(it, &t))
            return refuse(err, cap, "\"prompt_ids\"[%d] is not an integer", i);
        if (t < 0 || t >= sv->vocab)
            return refuse(err, cap,
                          "\"prompt_ids\"[%d]: token id %lld is outside the vocabulary "
                          "(vocab_size %d)",
                          i, t, sv->vocab);
        i++;
    }
    long long n_new;
    if (!max_new)
        return refuse(err, cap, "missing \"max_new_tokens\"");
    if (!json_int(max_new, &n_new))
        return refuse(err, cap, "\"max_new_tokens\" must be an integer");
    if (n_new < 1)
        return refuse(err, cap, "\"max_new_tokens\" must be at least 1, got %lld", n_new);
    if (ignore && !cJSON_IsBool(ignore))
        return refuse(err, cap, "\"ignore_eos\" must be true or false");
    if (n_prompt + n_new > sv->max_seq_len)
        return refuse(err, cap,
                      "too long for the KV cache: %d prompt + %lld new = %lld tokens of at "
                      "most %d",
                      n_prompt, n_new, n_prompt + n_new, sv->max_seq_len);
    return 0;
}

/* Checks one request and admits it into a free slot, or answers why not. */
static void handle_request(server *sv, conn *c, const cJSON *req)
{
    if (!cJSON_IsObject(req)) {
        reply_error(c, NULL, "a request must be a JSON object");
        return;
    }
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(req, "id");
    if (!id) {
        reply_error(c, NULL, "missing \"id\" (a string or a number)");
        return;
    }
    if (!cJSON_IsString(id) && !cJSON_IsNumber(id)) {
        reply_error(c, NULL, "\"id\" must be a string or a number");
        return;
    }
    char *id_json = cJSON_PrintUnformatted(id);
    if (!id_json)
        die_oom();
    char err[256];
    seq *q = NULL;
    for (int s = 0; s < sv->max_seqs && !q; s++)
        if (!sv->seqs[s].busy)
            q = &sv->seqs[s];
    if (request_check(sv, req, err, sizeof err) < 0 || !q) {
        if (!q)
            snprintf(err, sizeof err, "cache full: all %d sequence slots are in use",
                     sv->max_seqs);
        reply_error(c, id_json, "%s", err);
        cJSON_free(id_json);
        return;
    }
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(req, "prompt_ids");
    q->busy = 1;
    q->client = c;
    q->id_json = id_json;
    q->n_prompt = cJSON_GetArraySize(ids);
    q->max_new = (int)cJSON_GetObjectItemCaseSensitive(req, "max_new_tokens")->valuedouble;
    q->tokens = xcalloc((size_t)q->n_prompt + (size_t)q->max_new, sizeof *q->tokens);
    int i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, ids) q->tokens[i++] = (int32_t)it->valuedouble;
    q->known = q->n_prompt;
    q->fed = 0;
    q->ignore_eos = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(req, "ignore_eos"));
    q->arrival = sv->arrivals++;
    c->n_running++;
    sv->n_busy++;
}

/* One request line (without its newline; NUL-terminated in place). */
static void handle_line(server *sv, conn *c, char *line, size_t len)
{
    if (len && line[len - 1] == '\r')
        len--;
    line[len] = '\0';
    size_t blank = strspn(line, " \t\r\f\v");
    if (blank == len)
        return; /* an empty line asks nothing */
    const char *end = NULL;
    cJSON *req = memchr(line, '\0', len) ? NULL : cJSON_ParseWithOpts(line, &end, 1);
    if (!req) {
        const char *at = end ? end : cJSON_GetErrorPtr();
        long off = at && at >= line && at <= line + len ? (long)(at - line) : (long)len;
        reply_error(c, NULL, "malformed JSON at byte %ld", off);
        return;
    }
    handle_request(sv, c, req);
    cJSON_Delete(req);
}

/* Reads what c sent and handles every complete line; at end of input the
 * last line, newline or not. */
static void conn_read(server *sv, conn *c)
{
    if (!c->in)
        c->in = xrealloc(NULL, LINE_LIMIT + READ_CHUNK + 1);
    ssize_t n = read(c->fd, c->in + c->in_len, READ_CHUNK);
    if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK))
        return;
    if (n < 0) {
        if (c->is_stdio)
            fprintf(stderr, "moec-serve: cannot read stdin: %s\n", strerror(errno));
        c->dead = c->failed = 1;
        return;
    }
    size_t old = c->in_len;
    c->in_len += (size_t)n;
    size_t start = 0;
    for (size_t i = old; i < c->in_len; i++) {
        if (c->in[i] != '\n')
            continue;
        if (c->discarding)
            c->discarding = 0;
        else if (i - start > LINE_LIMIT)
            reply_error(c, NULL, "request line longer than %d bytes", LINE_LIMIT);
        else
            handle_line(sv, c, c->in + start, i - start);
        start = i + 1;
    }
    memmove(c->in, c->in + start, c->in_len - start);
    c->in_len -= start;
    if (c->discarding) {
        c->in_len = 0;
    } else if (c->in_len > LINE_LIMIT) {
        reply_error(c, NULL, "request line longer than %d bytes", LINE_LIMIT);
        c->discarding = 1;
        c->in_len = 0;
    }
    if (n == 0) {
        c->eof = 1;
        if (c->in_len && !c->discarding)
            handle_line(sv, c, c->in, c->in_len);
        c->in_len = 0;
    }
}

/* ---- stepping ------------------------------------------------------------- */

/* After a step that gave non-finite logits: the sequences of the tokens
 * whose next id is -1 end with an error; the others go on. */
static void fail_nonfinite(server *sv, int n)
{
    for (int i = 0; i < n; i++) {
        seq *q = &sv->seqs[sv->slot[i]];
        if (sv->next[i] >= 0 || !q->busy)
            continue;
        reply_error(q->client, q->id_json,
                    "generation failed: the logits at position %d hold a NaN or an infinity",
                    (int)sv->pos[i]);
        seq_release(sv, q);
    }
}

/* Packs one step (decode tokens first, then prompt chunks, oldest first),
 * runs it and streams what it generated. */
static void serve_step(server *sv)
{
    int n = 0;
    for (int r = 0; r < sv->max_seqs && n < sv->max_tokens; r++) {
        int s = (sv->rotate + r) % sv->max_seqs;
        seq *q = &sv->seqs[s];
        if (!q->busy || q->fed < q->n_prompt)
            continue;
        sv->tok[n] = q->tokens[q->fed];
        sv->pos[n] = q->fed++;
        sv->slot[n++] = s;
    }
    sv->rotate = (sv->rotate + 1) % sv->max_seqs;
    while (n < sv->max_tokens) {
        seq *oldest = NULL;
        for (int s = 0; s < sv->max_seqs; s++) {
            seq *q = &sv->seqs[s];
            if (q->busy && q->fed < q->n_prompt && (!oldest || q->arrival < oldest->arrival))
                oldest = q;
        }
        if (!oldest)
            break;
        int take = oldest->n_prompt - oldest->fed;
        if (take > sv->max_tokens - n)
            take = sv->max_tokens - n;
        for (int i = 0; i < take; i++) {
            sv->tok[n] = oldest->tokens[oldest->fed];
            sv->pos[n] = oldest->fed++;
            sv->slot[n++] = (int32_t)(oldest - sv->seqs);
        }
    }
    if (n == 0)
        return;
    moec_status st = moec_engine_step(sv->engine, n, sv->tok, sv->pos, sv->slot, sv->next, NULL);
    if (st == MOEC_ERR_NUMERIC) {
        fprintf(stderr, "moec-serve: %s\n", moec_last_error());
        fail_nonfinite(sv, n);
    } else if (st != MOEC_OK) {
        /* Nothing of this step can be trusted: its sequences end here. */
        fprintf(stderr, "moec-serve: step of %d tokens failed (%s): %s\n", n,
                moec_status_name(st), moec_last_error());
        for (int i = 0; i < n; i++) {
            seq *q = &sv->seqs[sv->slot[i]];
            if (!q->busy)
                continue;
            reply_error(q->client, q->id_json, "generation failed: %s", moec_last_error());
            seq_release(sv, q);
        }
        return;
    }
    /* The row of a sequence's last known token gives its next token. */
    for (int i = 0; i < n; i++) {
        seq *q = &sv->seqs[sv->slot[i]];
        if (q->busy && sv->pos[i] == q->known - 1)
            seq_emit(sv, q, sv->next[i]);
    }
}

/* ---- the loop ------------------------------------------------------------- */

static conn *server_add_conn(server *sv, int fd, int out_fd, int is_stdio)
{
    if (sv->n_conns == sv->cap_conns) {
        sv->cap_conns = sv->cap_conns ? 2 * sv->cap_conns : 8;
        sv->conns = xrealloc(sv->conns, (size_t)sv->cap_conns * sizeof *sv->conns);
    }
    conn *c = xcalloc(1, sizeof *c);
    c->fd = fd;
    c->out_fd = out_fd;
    c->is_stdio = is_stdio;
    sv->conns[sv->n_conns++] = c;
    return c;
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
        int fl = fcntl(fd, F_GETFL);
        if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0) {
            fprintf(stderr, "moec-serve: fcntl: %s\n", strerror(errno));
            close(fd);
            continue;
        }
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
        for (int s = 0; s < sv->max_seqs; s++)
            if (sv->seqs[s].busy && sv->seqs[s].client == c)
                seq_release(sv, &sv->seqs[s]);
        stdio_failed |= c->is_stdio && c->failed;
        conn_free(c);
        sv->accept_paused = 0;
    }
    sv->n_conns = kept;
    return stdio_failed;
}

static volatile sig_atomic_t g_stop;

static void on_signal(int sig)
{
    (void)sig;
    g_stop = 1;
}

/* Serves until SIGINT or SIGTERM, or with --stdin until stdin is done.
 * Returns the exit code. */
static int server_run(server *sv, int stdio)
{
    sigset_t block, orig;
    sigemptyset(&block);
    sigaddset(&block, SIGINT);
    sigaddset(&block, SIGTERM);
    /* The signals arrive only inside ppoll, so none is missed between the
     * check of g_stop and the wait. */
    sigprocmask(SIG_BLOCK, &block, &orig);
    struct pollfd *pfd = NULL;
    int cap_pfd = 0, rc = 0;
    while (!g_stop) {
        if (server_reap(sv))
            rc = 1;
        if (stdio && sv->n_conns == 0)
            break; /* stdin done (or stdout gone) and every request answered */
        if (cap_pfd < sv->n_conns + 1) {
            cap_pfd = sv->n_conns + 8;
            pfd = xrealloc(pfd, (size_t)cap_pfd * sizeof *pfd);
        }
        int np = 0;
        if (sv->listen_fd >= 0)
            pfd[np++] = (struct pollfd){.fd = sv->accept_paused ? -1 : sv->listen_fd,
                                        .events = POLLIN};
        for (int i = 0; i < sv->n_conns; i++) {
            conn *c = sv->conns[i];
            short ev = (short)((c->eof ? 0 : POLLIN) |
                               (c->out_off < c->out_len && !c->is_stdio ? POLLOUT : 0));
            pfd[np++] = (struct pollfd){.fd = ev ? c->fd : -1, .events = ev};
        }
        /* Running sequences: only look; otherwise wait for a client. */
        struct timespec zero = {0, 0};
        int r = ppoll(pfd, (nfds_t)np, sv->n_busy ? &zero : NULL, &orig);
        if (r < 0 && errno != EINTR) {
            fprintf(stderr, "moec-serve: poll: %s\n", strerror(errno));
            rc = 1;
            break;
        }
        if (r > 0) {
            int k = 0;
            if (sv->listen_fd >= 0 && pfd[k++].revents & POLLIN)
                server_accept(sv);
            int n_polled = np - k;
            for (int i = 0; i < n_polled; i++, k++) {
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
        if (sv->n_busy)
            serve_step(sv);
        for (int i = 0; i < sv->n_conns; i++)
            conn_flush(sv->conns[i]);
    }
    sigprocmask(SIG_SETMASK, &orig, NULL);
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
    long max_seqs, max_seq_len;
    moec_backend backend;
    int backend_set;
    int single_stream, eager;
} serve_opts;

/* Parses the command line; returns -1 to go on, else the exit code. */
static int parse_args(int argc, char **argv, serve_opts *o)
{
    o->port = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(USAGE, stdout);
            return 0;
        } else if (!strcmp(a, "--stdin")) {
            o->port = -1;
        } else if (!strcmp(a, "--single-stream")) {
            o->single_stream = 1;
        } else if (!strcmp(a, "--eager")) {
            o->eager = 1;
        } else if (!strcmp(a, "--weights") || !strcmp(a, "--port") ||
                   !strcmp(a, "--max-seqs") || !strcmp(a, "--max-seq-len") ||
                   !strcmp(a, "--backend")) {
            if (i + 1 == argc)
                return usage_error("%s needs a value", a);
            const char *v = argv[++i];
            if (!strcmp(a, "--weights")) {
                o->weights = v;
            } else if (!strcmp(a, "--port")) {
                if (parse_int(v, 0, 65535, &o->port))
                    return usage_error("--port: '%s' is not a port number (0 to 65535)", v);
            } else if (!strcmp(a, "--max-seqs")) {
                if (parse_int(v, 1, 1 << 16, &o->max_seqs))
                    return usage_error("--max-seqs: '%s' is not an integer >= 1", v);
            } else if (!strcmp(a, "--max-seq-len")) {
                if (parse_int(v, 1, 1 << 26, &o->max_seq_len))
                    return usage_error("--max-seq-len: '%s' is not an integer >= 1", v);
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
static int open_engine(const serve_opts *o, moec_engine_t **out)
{
    moec_engine_options eo = {.backend = o->backend,
                              .max_seqs = (int)o->max_seqs,
                              .max_seq_len = (int)o->max_seq_len,
                              .single_stream = o->single_stream,
                              .eager = o->eager};
    moec_status st;
    if (is_plan_path(o->path)) {
        if (!o->weights)
            return usage_error("%s is a plan file: --weights MODEL_DIR (the checkpoint it was "
                               "compiled for) is required",
                               o->path);
        if (o->backend_set && o->backend == MOEC_BACKEND_CPU)
            return usage_error("--backend cpu: %s is a plan, which runs on the GPU", o->path);
        st = moec_engine_open_plan(o->path, o->weights, &eo, out);
    } else {
        moec_model_t *m = NULL;
        st = moec_model_open(o->path, &m);
        if (st == MOEC_OK)
            st = moec_engine_open(m, o->weights ? o->weights : o->path, &eo, out);
        moec_model_free(m); /* the engine keeps what it needs */
    }
    if (st != MOEC_OK) {
        fprintf(stderr, "moec-serve: error (%s): %s\n", moec_status_name(st), moec_last_error());
        return 1;
    }
    return -1;
}

int main(int argc, char **argv)
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

    server sv = {.listen_fd = -1};
    if ((rc = open_engine(&o, &sv.engine)) >= 0)
        return rc;
    sv.max_seqs = moec_engine_max_seqs(sv.engine);
    sv.max_seq_len = moec_engine_max_seq_len(sv.engine);
    sv.max_tokens = moec_engine_max_tokens(sv.engine);
    sv.vocab = moec_engine_vocab_size(sv.engine);
    sv.eos = moec_engine_eos_token(sv.engine);
    sv.seqs = xcalloc((size_t)sv.max_seqs, sizeof *sv.seqs);
    sv.tok = xcalloc((size_t)sv.max_tokens, sizeof *sv.tok);
    sv.pos = xcalloc((size_t)sv.max_tokens, sizeof *sv.pos);
    sv.slot = xcalloc((size_t)sv.max_tokens, sizeof *sv.slot);
    sv.next = xcalloc((size_t)sv.max_tokens, sizeof *sv.next);

    char where[64] = "reading requests from stdin";
    int port = (int)o.port;
    if (o.port >= 0) {
        sv.listen_fd = listen_loopback(&port);
        if (sv.listen_fd < 0)
            rc = 1;
        snprintf(where, sizeof where, "listening on 127.0.0.1:%d", port);
    } else {
        server_add_conn(&sv, 0, 1, 1);
    }
    if (rc < 0) {
        fprintf(stderr,
                "moec-serve: %s backend, %d sequence slots of %d tokens, %d tokens a step, "
                "vocab_size %d, eos %d; %s\n",
                backend_name(moec_engine_backend(sv.engine)), sv.max_seqs, sv.max_seq_len,
                sv.max_tokens, sv.vocab, sv.eos, where);
        rc = server_run(&sv, o.port < 0);
    }

    for (int s = 0; s < sv.max_seqs; s++)
        seq_release(&sv, &sv.seqs[s]);
    for (int i = 0; i < sv.n_conns; i++)
        conn_free(sv.conns[i]);
    free(sv.conns);
    if (sv.listen_fd >= 0)
        close(sv.listen_fd);
    free(sv.seqs);
    free(sv.tok);
    free(sv.pos);
    free(sv.slot);
    free(sv.next);
    moec_engine_free(sv.engine);
    return rc;
}
