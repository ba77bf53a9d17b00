/* serve_http.c — moec-serve's OpenAI-compatible HTTP/1.1 API (--http):
 * POST /v1/completions and /v1/chat/completions (one JSON answer, or
 * Server-Sent Events with stream: true), GET /v1/models, /v1/models/ID,
 * /health and /metrics (Prometheus text).
 *
 * GNU libmicrohttpd parses HTTP and owns the sockets: a pool of threads,
 * each a poll loop over its connections, so a slow or stalled client only
 * ever occupies its own connection. A request is read, checked and
 * tokenized on its HTTP thread, then queued for the engine thread (serve.c's
 * loop, the only one that touches the engine) and its connection suspended.
 * The engine thread submits it, turns its tokens into text (the incremental
 * detokenizer, stop strings matched across token boundaries on that text and
 * held back while they may be starting), and appends the text to the
 * request's buffer, resuming the connection; the connection's thread takes
 * what has piled up and writes it as one answer or as SSE chunks. While a
 * connection is suspended libmicrohttpd does not see its client hang up, so
 * the engine thread polls those sockets for it and cancels the request of a
 * client that has gone; one that goes while its connection is active is
 * reported by libmicrohttpd and cancelled the same way.
 *
 * Bounds: the headers fit the connection's memory (HEADER_LIMIT; more gets
 * 431 from libmicrohttpd), a body max_body bytes (more gets 413), the
 * connections max_connections (one more is closed at once, on_accept), the requests
 * accepted that have no token yet max_waiting (one more gets 429), the text
 * a client leaves unread OUT_LIMIT (more cancels its request), and an idle
 * connection lives timeout_s. */
#include "samples/serve_http.h"

#include <errno.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <netdb.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <microhttpd.h>

#include "json.h"
#include "samples/serve_util.h"
#include "timer.h"

#define HEADER_LIMIT (64 << 10) /* a connection's memory: its headers must fit */
#define OUT_LIMIT (16 << 20)    /* unread text one request may hold */
#define DISCARD_LIMIT 16        /* a Content-Length this many times max_body: 413 at once */
#define STOP_MAX 16             /* stop strings a request may give */
#define SSE_BLOCK 16384         /* bytes asked of the SSE reader at once, at most */
#define JSON_VALUES_SLACK 4096  /* JSON values a body may hold past 4 a token of max_seq_len */

/* ---- types ------------------------------------------------------------------ */

typedef enum endpoint {
    EP_COMPLETIONS,
    EP_CHAT,
    EP_MODELS,
    EP_MODEL, /* /v1/models/ID */
    EP_HEALTH,
    EP_METRICS,
    EP_UNKNOWN,
} endpoint;

static const struct {
    const char *path; /* EP_MODEL: the prefix */
    const char *method;
} ROUTES[] = {
    [EP_COMPLETIONS] = {"/v1/completions", "POST"},
    [EP_CHAT] = {"/v1/chat/completions", "POST"},
    [EP_MODELS] = {"/v1/models", "GET"},
    [EP_MODEL] = {"/v1/models/", "GET"},
    [EP_HEALTH] = {"/health", "GET"},
    [EP_METRICS] = {"/metrics", "GET"},
    [EP_UNKNOWN] = {"other", NULL},
};

typedef enum phase {
    PH_BODY,      /* reading the body */
    PH_QUEUED,    /* handed to the engine thread, no answer started */
    PH_STREAMING, /* the SSE answer is going out */
    PH_ANSWERED,  /* an answer is queued */
} phase;

/* One generated token's log probabilities. */
typedef struct tok_lp {
    int32_t id;
    float logprob;
    long offset; /* completions' text_offset: characters of the returned text before it */
    int n_top;
    int32_t top_ids[MOEC_TOP_LOGPROBS_MAX];
    float top_lps[MOEC_TOP_LOGPROBS_MAX];
} tok_lp;

/* An error answer. */
typedef struct http_error {
    int status;
    const char *type;  /* "invalid_request_error", ... */
    const char *code;  /* or NULL */
    const char *param; /* the field at fault, or NULL */
    char *message;     /* owned */
} http_error;

/* One HTTP request, from its first header to the end of its connection's
 * answer. Held by its connection (from the first call until libmicrohttpd
 * says it is done) and by the engine thread (from the queue until the
 * engine has no more of it): freed when both let go (refs, under mu). */
typedef struct hreq {
    serve_req_head head; /* first: engine events find their front end by it */
    serve_http *h;
    struct MHD_Connection *conn;
    int fd; /* its socket, polled for a hang-up while suspended */
    int refs;
    struct hreq *prev_all, *next_all; /* h->all: connections not yet done (mu) */
    struct hreq *next_queued;         /* h->incoming (mu) */
    struct hreq *prev_active, *next_active; /* h->active (the engine thread) */

    /* The connection's thread alone. */
    endpoint ep;
    int method_ok;
    char *body;
    size_t body_len, body_cap;
    int too_large;
    phase phase;
    moec_buf stage; /* SSE bytes formatted and not yet handed to libmicrohttpd */
    size_t stage_off;
    int sent_role, sent_end;
    int counted;      /* its response went into the metrics */

    /* The request, fixed once queued. */
    int chat, stream, include_usage;
    int logprobs; /* 1: asked for log probabilities */
    char id[40];
    long long created;
    moec_request mr;
    int32_t *prompt, *stop_ids;
    char *stops[STOP_MAX];
    int n_stops;

    /* The engine thread alone. */
    uint64_t engine_id;
    int in_engine;
    moec_detokenizer_t *detok;
    moec_buf hold; /* text that may begin a stop string */
    long text_chars; /* characters the detokenizer gave so far (text_offset) */
    int stopped;   /* a stop string ended it */

    /* Shared, under h->mu. */
    int suspended;      /* its connection is suspended (only the engine thread resumes) */
    int queued;         /* it went to the engine thread: its answer comes from there */
    int waiting;        /* counted in h->n_waiting: queued, no token yet */
    int conn_done;      /* libmicrohttpd is done with the connection */
    int hup;            /* its client went away (or stopped reading): end the connection */
    int started;        /* an event came */
    int engine_done;    /* the engine has no more of it */
    moec_buf out;       /* text not yet taken by the connection */
    tok_lp *lps;        /* log probabilities not yet taken */
    int n_lps, cap_lps;
    int n_prompt, n_output;
    const char *finish; /* "stop" or "length" once engine_done without failure */
    http_error fail;    /* status 0: none */
} hreq;

struct serve_http {
    serve_http_config cfg;
    const moec_tokenizer_t *tok;
    serve_metrics *metrics;
    struct MHD_Daemon *daemon;
    int port;
    int wake_fd;
    long long started_at;

    pthread_mutex_t mu;
    pthread_cond_t completed; /* a request left `all` */
    hreq *all;
    hreq *incoming_head, *incoming_tail;
    int n_waiting, stopping;
    uint64_t seeds, ids;

    /* The engine thread alone. */
    hreq *active;
    hreq **polled; /* the requests serve_http_poll_fds listed, in order */
    int n_polled, cap_polled;

    /* connections libmicrohttpd holds (its threads', atomically) */
    int n_conns;
};

/* ---- small helpers ----------------------------------------------------------- */

/* Doubly linked lists threaded through a request's prev/next fields. */
#define LIST_PUSH(head, r, prev, next)                                                         \
    do {                                                                                       \
        (r)->prev = NULL;                                                                      \
        (r)->next = (head);                                                                    \
        if (head)                                                                              \
            (head)->prev = (r);                                                                \
        (head) = (r);                                                                          \
    } while (0)
#define LIST_UNLINK(head, r, prev, next)                                                       \
    do {                                                                                       \
        if ((r)->prev)                                                                         \
            (r)->prev->next = (r)->next;                                                       \
        else                                                                                   \
            (head) = (r)->next;                                                                \
        if ((r)->next)                                                                         \
            (r)->next->prev = (r)->prev;                                                       \
        (r)->prev = (r)->next = NULL;                                                          \
    } while (0)

static void err_set(http_error *e, int status, const char *type, const char *code,
                    const char *param, char *message)
{
    free(e->message);
    *e = (http_error){status, type, code, param, message};
}

__attribute__((format(printf, 3, 4))) static int bad_request(http_error *e, const char *param,
                                                             const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *msg = serve_vformat(fmt, ap);
    va_end(ap);
    err_set(e, MHD_HTTP_BAD_REQUEST, "invalid_request_error", NULL, param, msg);
    return -1;
}

/* cJSON builders that end the program when memory runs out. */
static cJSON *j_check(cJSON *it)
{
    if (!it)
        serve_die_oom();
    return it;
}

static void j_add(cJSON *o, const char *key, cJSON *it)
{
    j_check(it);
    if (!(key ? cJSON_AddItemToObject(o, key, it) : cJSON_AddItemToArray(o, it)))
        serve_die_oom();
}

static cJSON *j_obj(cJSON *o, const char *key)
{
    cJSON *it = j_check(cJSON_CreateObject());
    j_add(o, key, it);
    return it;
}

static cJSON *j_arr(cJSON *o, const char *key)
{
    cJSON *it = j_check(cJSON_CreateArray());
    j_add(o, key, it);
    return it;
}

static void j_str(cJSON *o, const char *key, const char *v)
{
    j_add(o, key, v ? cJSON_CreateString(v) : cJSON_CreateNull());
}

static void j_num(cJSON *o, const char *key, double v) { j_add(o, key, cJSON_CreateNumber(v)); }

/* A string of n bytes of UTF-8 that may hold NULs (generated text: a token
 * may be the byte 0), which cJSON's strings cannot: written as JSON here. */
static void j_strn(cJSON *o, const char *key, const char *s, size_t n)
{
    moec_buf b = {0};
    moec_buf_put(&b, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\')
            moec_buf_printf(&b, "\\%c", c);
        else if (c == '\n')
            moec_buf_str(&b, "\\n");
        else if (c < 0x20 || c == 0x7f)
            moec_buf_printf(&b, "\\u%04x", c);
        else
            moec_buf_put(&b, s + i, 1);
    }
    moec_buf_put(&b, "\"", 1);
    j_add(o, key, cJSON_CreateRaw(serve_buf_text(&b)));
    moec_buf_free(&b);
}

static char *j_print(cJSON *root)
{
    char *text = cJSON_PrintUnformatted(root);
    if (!text)
        serve_die_oom();
    cJSON_Delete(root);
    return text;
}

/* ---- answers ----------------------------------------------------------------- */

static void count_response(hreq *r, int status)
{
    if (!r->counted)
        serve_metrics_http(r->h->metrics, ROUTES[r->ep].path, status);
    r->counted = 1;
}

/* Queues a whole answer: body (malloc'd, NUL-terminated; taken). */
static enum MHD_Result answer(hreq *r, int status, char *body, const char *content_type,
                              const char *allow)
{
    struct MHD_Response *resp = MHD_create_response_from_buffer_with_free_callback(
        strlen(body), body, free);
    if (!resp) {
        free(body);
        return MHD_NO;
    }
    enum MHD_Result ok = MHD_add_response_header(resp, "Content-Type", content_type);
    if (ok == MHD_YES && allow)
        ok = MHD_add_response_header(resp, "Allow", allow);
    if (ok == MHD_YES && status == MHD_HTTP_TOO_MANY_REQUESTS)
        ok = MHD_add_response_header(resp, "Retry-After", "1");
    if (ok == MHD_YES)
        ok = MHD_queue_response(r->conn, (unsigned)status, resp);
    MHD_destroy_response(resp);
    r->phase = PH_ANSWERED;
    count_response(r, status);
    return ok;
}

static cJSON *error_json(const http_error *e)
{
    cJSON *root = j_check(cJSON_CreateObject());
    cJSON *o = j_obj(root, "error");
    j_str(o, "message", e->message);
    j_str(o, "type", e->type);
    j_str(o, "param", e->param);
    j_str(o, "code", e->code);
    return root;
}

/* The OpenAI error object as the answer; e's message is freed. */
static enum MHD_Result answer_error(hreq *r, http_error *e, const char *allow)
{
    char *body = j_print(error_json(e));
    int status = e->status;
    err_set(e, 0, NULL, NULL, NULL, NULL);
    return answer(r, status, body, "application/json", allow);
}

__attribute__((format(printf, 6, 7))) static enum MHD_Result
answer_errorf(hreq *r, int status, const char *type, const char *code, const char *allow,
              const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    http_error e = {status, type, code, NULL, serve_vformat(fmt, ap)};
    va_end(ap);
    return answer_error(r, &e, allow);
}

static enum MHD_Result answer_json(hreq *r, int status, cJSON *root)
{
    return answer(r, status, j_print(root), "application/json", NULL);
}

/* ---- requests: the body to an engine request ---------------------------------- */

/* A field, or NULL when absent or null (as OpenAI's clients send unset ones). */
static const cJSON *field(const cJSON *o, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    return cJSON_IsNull(v) ? NULL : v;
}

static int field_bool(const cJSON *o, const char *name, int *out, http_error *e)
{
    const cJSON *v = field(o, name);
    if (!v)
        return 0;
    if (!cJSON_IsBool(v))
        return bad_request(e, name, "'%s' must be true or false, not %s", name,
                           moec_json_kind(v));
    *out = cJSON_IsTrue(v);
    return 0;
}

static int field_number(const cJSON *o, const char *name, float *out, http_error *e)
{
    const cJSON *v = field(o, name);
    if (!v)
        return 0;
    if (!cJSON_IsNumber(v))
        return bad_request(e, name, "'%s' must be a number, not %s", name, moec_json_kind(v));
    if (!serve_json_float(v, out))
        return bad_request(e, name, "'%s' is past a float's range (%g), got %g", name, FLT_MAX,
                           v->valuedouble);
    return 0;
}

static int field_int(const cJSON *o, const char *name, long long lo, long long hi,
                     long long *out, http_error *e)
{
    const cJSON *v = field(o, name);
    if (!v)
        return 0;
    if (!serve_json_int(v, out)) {
        if (!cJSON_IsNumber(v))
            return bad_request(e, name, "'%s' must be an integer, not %s", name,
                               moec_json_kind(v));
        double d = v->valuedouble;
        if (isfinite(d) && d != floor(d))
            return bad_request(e, name, "'%s' must be an integer, not a fraction", name);
        /* a whole number past a double's exact integers: out of range */
        return bad_request(e, name, "'%s' must be from %lld to %lld, got %g", name, lo, hi, d);
    }
    if (*out < lo || *out > hi)
        return bad_request(e, name, "'%s' must be from %lld to %lld, got %lld", name, lo, hi,
                           *out);
    return 0;
}

/* A list of token ids into a new array (*n of them). */
static int token_list(const cJSON *v, const char *name, int32_t **ids, int *n, http_error *e)
{
    *ids = serve_xcalloc((size_t)cJSON_GetArraySize(v), sizeof **ids);
    *n = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, v)
    {
        long long t;
        if (!serve_json_int(it, &t) || t < INT32_MIN || t > INT32_MAX)
            return bad_request(e, name, "'%s'[%d] is not a token id (an integer)", name, *n);
        (*ids)[(*n)++] = (int32_t)t;
    }
    return 0;
}

/* The settings the engine checks, by their API names: the first out of
 * range is found by checking each alone, so that the answer names it. */
static int sampling_check(const moec_sampling *sp, http_error *e)
{
    if (moec_sampling_check(sp) == MOEC_OK)
        return 0;
    static const struct {
        const char *name;
        size_t off;
        int is_int;
    } SETTINGS[] = {
        {"temperature", offsetof(moec_sampling, temperature), 0},
        {"top_k", offsetof(moec_sampling, top_k), 1},
        {"top_p", offsetof(moec_sampling, top_p), 0},
        {"min_p", offsetof(moec_sampling, min_p), 0},
        {"repetition_penalty", offsetof(moec_sampling, repetition_penalty), 0},
        {"presence_penalty", offsetof(moec_sampling, presence_penalty), 0},
        {"frequency_penalty", offsetof(moec_sampling, frequency_penalty), 0},
        {"top_logprobs", offsetof(moec_sampling, top_logprobs), 1},
    };
    for (size_t i = 0; i < sizeof SETTINGS / sizeof *SETTINGS; i++) {
        moec_sampling one = {0};
        memcpy((char *)&one + SETTINGS[i].off, (const char *)sp + SETTINGS[i].off,
               SETTINGS[i].is_int ? sizeof(int) : sizeof(float));
        if (moec_sampling_check(&one) != MOEC_OK)
            return bad_request(e, SETTINGS[i].name, "%s", moec_last_error_message());
    }
    return bad_request(e, NULL, "%s", moec_last_error_message());
}

/* stop: a string or a list of them, each non-empty. */
static int parse_stop(hreq *r, const cJSON *j, http_error *e)
{
    const cJSON *v = field(j, "stop");
    if (!v)
        return 0;
    if (cJSON_IsString(v)) {
        if (!*v->valuestring)
            return bad_request(e, "stop", "'stop' is an empty string");
        r->stops[r->n_stops++] = strdup(v->valuestring);
    } else if (cJSON_IsArray(v)) {
        if (cJSON_GetArraySize(v) > STOP_MAX)
            return bad_request(e, "stop", "'stop' holds %d strings, more than the %d allowed",
                               cJSON_GetArraySize(v), STOP_MAX);
        const cJSON *it;
        cJSON_ArrayForEach(it, v)
        {
            if (!cJSON_IsString(it) || !*it->valuestring)
                return bad_request(e, "stop", "'stop'[%d] must be a non-empty string",
                                   r->n_stops);
            r->stops[r->n_stops++] = strdup(it->valuestring);
        }
    } else {
        return bad_request(e, "stop", "'stop' must be a string or a list of strings, not %s",
                           moec_json_kind(v));
    }
    for (int i = 0; i < r->n_stops; i++)
        if (!r->stops[i])
            serve_die_oom();
    return 0;
}

/* Encodes text (with the post-processor's tokens when special) into r's prompt. */
static int encode(hreq *r, const char *text, int special, const char *param, http_error *e)
{
    moec_status st = moec_tokenizer_encode(r->h->tok, text, strlen(text), special, &r->prompt,
                                           &r->mr.n_prompt);
    if (st != MOEC_OK)
        return bad_request(e, param, "cannot tokenize '%s': %s", param,
                           moec_last_error_message());
    return 0;
}

/* prompt: a string, a list of token ids, or a list of one of either. */
static int parse_prompt(hreq *r, const cJSON *j, http_error *e)
{
    const cJSON *v = field(j, "prompt");
    if (!v)
        return bad_request(e, "prompt", "'prompt' is required");
    if (cJSON_IsArray(v) && cJSON_GetArraySize(v) == 1 &&
        (cJSON_IsString(v->child) || cJSON_IsArray(v->child)))
        v = v->child; /* a batch of one */
    else if (cJSON_IsArray(v) && (cJSON_IsString(v->child) || cJSON_IsArray(v->child)))
        return bad_request(e, "prompt",
                           "'prompt' holds %d prompts: one a request (n must be 1 too)",
                           cJSON_GetArraySize(v));
    if (cJSON_IsString(v)) {
        if (encode(r, v->valuestring, 1, "prompt", e))
            return -1;
    } else if (cJSON_IsArray(v)) {
        if (token_list(v, "prompt", &r->prompt, &r->mr.n_prompt, e))
            return -1;
    } else {
        return bad_request(e, "prompt",
                           "'prompt' must be a string or a list of token ids, not %s",
                           moec_json_kind(v));
    }
    if (!r->mr.n_prompt)
        return bad_request(e, "prompt", "'prompt' is empty: it gives no tokens");
    return 0;
}

/* A message's content as the template reads it: a string or null as given,
 * a list of {"type": "text", "text": ...} parts (OpenAI's) joined into one
 * string. In place, in m (a copy of the request's). */
static int message_content(cJSON *m, int i, http_error *e)
{
    cJSON *c = cJSON_GetObjectItemCaseSensitive(m, "content");
    if (!c || cJSON_IsNull(c) || cJSON_IsString(c))
        return 0;
    if (!cJSON_IsArray(c))
        return bad_request(e, "messages",
                           "'messages'[%d].content must be a string or a list of parts, not %s",
                           i, moec_json_kind(c));
    moec_buf b = {0};
    moec_buf_str(&b, "");
    const cJSON *part;
    int k = 0;
    cJSON_ArrayForEach(part, c)
    {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "text") || !cJSON_IsString(text)) {
            moec_buf_free(&b);
            return bad_request(e, "messages",
                               "'messages'[%d].content[%d] must be a {\"type\": \"text\", "
                               "\"text\": ...} part (moec takes text alone)",
                               i, k);
        }
        moec_buf_str(&b, text->valuestring);
        k++;
    }
    cJSON *joined = j_check(cJSON_CreateString(serve_buf_text(&b)));
    moec_buf_free(&b);
    if (!cJSON_ReplaceItemInObjectCaseSensitive(m, "content", joined))
        serve_die_oom();
    return 0;
}

/* messages (each with whatever else the template reads: tool_calls, name,
 * reasoning_content, ...), tools, and chat_template_kwargs' variables
 * (enable_thinking, ...), rendered with the model's chat template
 * (moec_chat_render_json) and tokenized without special tokens (the
 * template writes them). */
static int parse_messages(hreq *r, const cJSON *j, http_error *e)
{
    const cJSON *v = field(j, "messages");
    if (!v)
        return bad_request(e, "messages", "'messages' is required");
    if (!cJSON_IsArray(v) || !cJSON_GetArraySize(v))
        return bad_request(e, "messages", "'messages' must be a non-empty list of messages");
    const cJSON *kw = field(j, "chat_template_kwargs"), *tools = field(j, "tools");
    if (kw && !cJSON_IsObject(kw))
        return bad_request(e, "chat_template_kwargs", "'chat_template_kwargs' must be an object");
    moec_chat_options_t opts = {.add_generation_prompt = 1, .enable_thinking = -1};
    if (field_bool(j, "add_generation_prompt", &opts.add_generation_prompt, e))
        return -1;
    /* The kwargs join the template's variables: those the request sets by
       its own fields or the tokenizer gives would be written twice (and
       refused as "the chat request"'s, naming 'messages'); the option
       add_generation_prompt is taken from there, over the field (vLLM's) */
    for (const cJSON *k = kw ? kw->child : NULL; k; k = k->next) {
        if (!strcmp(k->string, "add_generation_prompt")) {
            if (cJSON_IsBool(k))
                opts.add_generation_prompt = cJSON_IsTrue(k);
            else if (!cJSON_IsNull(k))
                return bad_request(e, "chat_template_kwargs",
                                   "'chat_template_kwargs'.add_generation_prompt must be true "
                                   "or false, not %s",
                                   moec_json_kind(k));
        } else if (!strcmp(k->string, "messages") || (tools && !strcmp(k->string, "tools"))) {
            return bad_request(e, "chat_template_kwargs",
                               "'chat_template_kwargs' sets '%s', which the request's own '%s' "
                               "sets",
                               k->string, k->string);
        } else if (!strcmp(k->string, "bos_token") || !strcmp(k->string, "eos_token")) {
            return bad_request(e, "chat_template_kwargs",
                               "'chat_template_kwargs' sets '%s', which comes from the "
                               "tokenizer",
                               k->string);
        }
    }
    cJSON *conv = j_check(cJSON_CreateObject());
    cJSON *list = j_arr(conv, "messages");
    const cJSON *m;
    int i = 0, rc = 0;
    cJSON_ArrayForEach(m, v)
    {
        if (!cJSON_IsObject(m) || !cJSON_IsString(cJSON_GetObjectItemCaseSensitive(m, "role"))) {
            rc = bad_request(e, "messages",
                             "'messages'[%d] must be an object with a string 'role'", i);
            break;
        }
        cJSON *copy = j_check(cJSON_Duplicate(m, 1));
        j_add(list, NULL, copy);
        if ((rc = message_content(copy, i, e)))
            break;
        i++;
    }
    if (!rc && tools)
        j_add(conv, "tools", cJSON_Duplicate(tools, 1));
    for (const cJSON *k = kw ? kw->child : NULL; !rc && k; k = k->next)
        if (strcmp(k->string, "add_generation_prompt"))
            j_add(conv, k->string, cJSON_Duplicate(k, 1));
    char *json = rc ? NULL : j_print(conv), *text = NULL;
    if (rc)
        cJSON_Delete(conv);
    moec_status st =
        rc ? MOEC_OK : moec_chat_render_json(r->h->tok, json, strlen(json), &opts, &text);
    if (st == MOEC_ERR_NOT_FOUND) /* the message names the server's folder: not for clients */
        rc = bad_request(e, "messages", "the model has no chat template (tokenizer_config.json's "
                                        "chat_template): use /v1/completions");
    else if (st != MOEC_OK)
        rc = bad_request(e, "messages", "cannot apply the chat template: %s",
                         moec_last_error_message());
    if (!rc)
        rc = encode(r, text, 0, "messages", e);
    if (!rc && !r->mr.n_prompt)
        rc = bad_request(e, "messages", "the chat template gave no tokens");
    cJSON_free(json);
    free(text);
    return rc;
}

/* The fields both endpoints share (OpenAI's and vLLM's), into r->mr. */
static int parse_sampling(hreq *r, const cJSON *j, http_error *e)
{
    serve_http *h = r->h;
    moec_sampling *sp = &r->mr.sampling;
    long long top_k = 0, seed = -1, max_tokens = -1, top_logprobs = 0, lp = -1;
    int echo = 0, stream = 0;
    sp->temperature = 1; /* OpenAI's default */
    static const char *const ONE[] = {"n", "best_of"};
    for (int i = 0; i < 2; i++) {
        const cJSON *v = field(j, ONE[i]);
        if (v && !cJSON_IsNumber(v))
            return bad_request(e, ONE[i], "'%s' must be an integer, not %s", ONE[i],
                               moec_json_kind(v));
        if (v && v->valuedouble != 1)
            return bad_request(e, ONE[i],
                               "'%s' must be 1: moec gives one choice a request, got %g",
                               ONE[i], v->valuedouble);
    }
    if (field_bool(j, "echo", &echo, e))
        return -1;
    if (echo)
        return bad_request(e, "echo", "'echo' is not supported");
    const cJSON *bias = field(j, "logit_bias");
    if (bias && (!cJSON_IsObject(bias) || bias->child))
        return bad_request(e, "logit_bias", "'logit_bias' is not supported");
    if (field_bool(j, "stream", &stream, e))
        return -1;
    r->stream = stream;
    const cJSON *so = field(j, "stream_options");
    if (so && !cJSON_IsObject(so))
        return bad_request(e, "stream_options", "'stream_options' must be an object");
    if (so && field_bool(so, "include_usage", &r->include_usage, e))
        return -1;
    if (so && !stream) /* OpenAI and vLLM refuse it rather than drop it */
        return bad_request(e, "stream_options",
                           "'stream_options' is only for a streamed request ('stream': true)");
    if (field_int(j, "max_tokens", 1, INT32_MAX, &max_tokens, e) ||
        (r->chat && field_int(j, "max_completion_tokens", 1, INT32_MAX, &max_tokens, e)) ||
        field_number(j, "temperature", &sp->temperature, e) ||
        field_number(j, "top_p", &sp->top_p, e) ||
        field_int(j, "top_k", -1, INT32_MAX, &top_k, e) ||
        field_number(j, "min_p", &sp->min_p, e) ||
        field_number(j, "presence_penalty", &sp->presence_penalty, e) ||
        field_number(j, "frequency_penalty", &sp->frequency_penalty, e) ||
        field_number(j, "repetition_penalty", &sp->repetition_penalty, e) ||
        field_int(j, "seed", 0, 9007199254740991LL, &seed, e) ||
        field_bool(j, "ignore_eos", &r->mr.ignore_eos, e) || parse_stop(r, j, e))
        return -1;
    /* OpenAI's top_p 0 keeps the likeliest token alone; the engine's 0 means no
       filter at all, so it becomes the least positive top_p (the same one id) */
    if (sp->top_p == 0 && field(j, "top_p"))
        sp->top_p = FLT_MIN;
    /* the engine's 0 is no penalty; vLLM refuses 0 (a factor that would make
       every seen token's logit 0 or infinite), and so does the API */
    if (sp->repetition_penalty == 0 && field(j, "repetition_penalty"))
        return bad_request(e, "repetition_penalty",
                           "'repetition_penalty' must be greater than 0, got 0");
    const cJSON *sti = field(j, "stop_token_ids");
    if (sti && !cJSON_IsArray(sti))
        return bad_request(e, "stop_token_ids", "'stop_token_ids' must be a list of token ids");
    if (sti && token_list(sti, "stop_token_ids", &r->stop_ids, &r->mr.n_stop, e))
        return -1;
    for (int i = 0; i < r->mr.n_stop; i++)
        if (r->stop_ids[i] < 0 || r->stop_ids[i] >= h->cfg.vocab)
            return bad_request(e, "stop_token_ids",
                               "'stop_token_ids'[%d] = %d is outside the vocabulary (%d ids)", i,
                               (int)r->stop_ids[i], h->cfg.vocab);
    if (r->chat) {
        int want = 0;
        if (field_bool(j, "logprobs", &want, e) ||
            field_int(j, "top_logprobs", 0, INT32_MAX, &top_logprobs, e))
            return -1;
        if (field(j, "top_logprobs") && !want)
            return bad_request(e, "top_logprobs", "'top_logprobs' needs 'logprobs': true");
        r->logprobs = want;
    } else {
        if (field_int(j, "logprobs", 0, MOEC_TOP_LOGPROBS_MAX, &lp, e))
            return -1;
        r->logprobs = lp >= 0;
        top_logprobs = lp > 0 ? lp : 0;
    }
    sp->logprob = r->logprobs;
    sp->top_logprobs = (int)top_logprobs;
    sp->top_k = top_k < 0 ? 0 : (int)top_k; /* vLLM's -1: all */
    if (sampling_check(sp, e))
        return -1;
    pthread_mutex_lock(&h->mu);
    sp->seed = seed >= 0 ? (uint64_t)seed : serve_seed_next(&h->seeds);
    uint64_t id = serve_seed_next(&h->ids);
    pthread_mutex_unlock(&h->mu);
    snprintf(r->id, sizeof r->id, "%s-%016llx", r->chat ? "chatcmpl" : "cmpl",
             (unsigned long long)id);
    r->mr.max_tokens = max_tokens < 0 ? 0 : (int)max_tokens; /* 0: the default, once the
                                                              * prompt is known */
    return 0;
}

/* The body into r's engine request; -1 with e set when it cannot be. */
static int parse_request(hreq *r, http_error *e)
{
    serve_http *h = r->h;
    if (!r->body_len)
        return bad_request(e, NULL, "the request body is empty: it must be a JSON object");
    size_t bad = serve_utf8_invalid_at(r->body, r->body_len);
    if (bad < r->body_len)
        return bad_request(e, NULL, "the request body is not valid UTF-8 (byte %zu)", bad);
    int nul;
    long long values;
    bad = moec_json_string_bad_at(r->body, r->body_len, &nul, &values);
    if (bad < r->body_len && nul)
        return bad_request(e, NULL,
                           "the request body holds a NUL character (\\u0000) in a string (byte "
                           "%zu): moec takes no NUL in text",
                           bad);
    if (bad < r->body_len)
        return bad_request(e, NULL,
                           "the request body is not valid JSON (at byte %zu: a control character "
                           "in a string must be escaped)",
                           bad);
    /* Its tree takes about 80 bytes a value: no request needs more values
       than a prompt of max_seq_len ids or messages, four each, and some */
    long long vmax = 4LL * h->cfg.max_seq_len + JSON_VALUES_SLACK;
    if (values > vmax)
        return bad_request(e, NULL,
                           "the request body holds more than %lld JSON values (4 times the "
                           "sequence length %d, and %d): no request needs more",
                           vmax, h->cfg.max_seq_len, JSON_VALUES_SLACK);
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(r->body, r->body_len, &end, 0);
    if (j && end) { /* only white space may follow the value */
        size_t at = (size_t)(end - r->body);
        while (at < r->body_len && strchr(" \t\r\n", r->body[at]) && r->body[at])
            at++;
        if (at < r->body_len) {
            cJSON_Delete(j);
            return bad_request(e, NULL, "the request body is not valid JSON (at byte %zu)", at);
        }
    }
    if (!j) { /* end points at the error (cJSON_GetErrorPtr is one for all threads) */
        bad = end && end >= r->body && end <= r->body + r->body_len ? (size_t)(end - r->body)
                                                                    : r->body_len;
        return bad_request(e, NULL, "the request body is not valid JSON (at byte %zu)", bad);
    }
    int rc = 0;
    if (!cJSON_IsObject(j)) {
        rc = bad_request(e, NULL, "the request body must be a JSON object, not %s",
                         moec_json_kind(j));
    } else if (moec_json_check_unique(j, "the request body") != MOEC_OK) {
        rc = bad_request(e, NULL, "%s", moec_last_error_message());
    } else {
        const cJSON *model = field(j, "model");
        if (!model)
            rc = bad_request(e, "model", "'model' is required");
        else if (!cJSON_IsString(model))
            rc = bad_request(e, "model", "'model' must be a string, not %s",
                             moec_json_kind(model));
        else if (strcmp(model->valuestring, h->cfg.model_name))
            err_set(e, MHD_HTTP_NOT_FOUND, "invalid_request_error", "model_not_found", "model",
                    serve_format("The model '%s' does not exist: this server serves '%s'",
                                 model->valuestring, h->cfg.model_name)),
                rc = -1;
    }
    if (!rc)
        rc = parse_sampling(r, j, e);
    if (!rc)
        rc = r->chat ? parse_messages(r, j, e) : parse_prompt(r, j, e);
    /* completions: 16 (OpenAI's default); chat: up to the end of the longest
       sequence the engine takes (a pool smaller than max_seq_len shortens it:
       running to max_seq_len, every chat that left max_tokens out was refused) */
    if (!rc && !r->mr.max_tokens && !r->chat)
        r->mr.max_tokens = 16;
    else if (!rc && !r->mr.max_tokens)
        r->mr.max_tokens = h->cfg.max_len > r->mr.n_prompt ? h->cfg.max_len - r->mr.n_prompt : 1;
    cJSON_Delete(j);
    r->mr.prompt = r->prompt;
    r->mr.stop_ids = r->stop_ids;
    free(r->body);
    r->body = NULL;
    r->body_len = r->body_cap = 0;
    return rc;
}

/* ---- requests: their life ------------------------------------------------------ */

static hreq *hreq_new(serve_http *h, struct MHD_Connection *conn, const char *url,
                      const char *method)
{
    hreq *r = serve_xcalloc(1, sizeof *r);
    r->head.http = 1;
    r->h = h;
    r->conn = conn;
    r->refs = 1;
    r->created = (long long)time(NULL);
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    r->fd = ci ? ci->connect_fd : -1;
    r->ep = EP_UNKNOWN;
    for (int k = 0; k < EP_UNKNOWN; k++) {
        size_t n = strlen(ROUTES[k].path);
        if (k == EP_MODEL ? !strncmp(url, ROUTES[k].path, n) && url[n]
                          : !strcmp(url, ROUTES[k].path)) {
            r->ep = (endpoint)k;
            break;
        }
    }
    /* HEAD where GET is taken (a load balancer's health check): the same
       answer, whose body libmicrohttpd leaves out */
    r->method_ok = r->ep != EP_UNKNOWN && (!strcmp(method, ROUTES[r->ep].method) ||
                                           (!strcmp(ROUTES[r->ep].method, "GET") &&
                                            !strcmp(method, "HEAD")));
    pthread_mutex_lock(&h->mu);
    LIST_PUSH(h->all, r, prev_all, next_all);
    pthread_mutex_unlock(&h->mu);
    return r;
}

static void hreq_free(hreq *r)
{
    free(r->body);
    moec_buf_free(&r->stage);
    free(r->prompt);
    free(r->stop_ids);
    for (int i = 0; i < r->n_stops; i++)
        free(r->stops[i]);
    moec_detokenizer_free(r->detok);
    moec_buf_free(&r->hold);
    moec_buf_free(&r->out);
    free(r->lps);
    free(r->fail.message);
    free(r);
}

/* Drops one hold on r (mu held). */
static void hreq_release(hreq *r)
{
    if (--r->refs == 0)
        hreq_free(r);
}

/* r's connection sleeps until the engine thread has something for it (mu
 * held; in one of its libmicrohttpd callbacks). */
static void suspend(hreq *r)
{
    r->suspended = 1;
    MHD_suspend_connection(r->conn);
}

/* Wakes r's connection if it sleeps (mu held). */
static void resume(hreq *r)
{
    if (!r->suspended)
        return;
    r->suspended = 0;
    MHD_resume_connection(r->conn);
}

/* No longer queued with no token (mu held). */
static void unwait(hreq *r)
{
    if (!r->waiting)
        return;
    r->waiting = 0;
    r->h->n_waiting--;
    serve_metrics_http_waiting(r->h->metrics, r->h->n_waiting);
}

/* ---- the SSE stream ------------------------------------------------------------ */

/* A token's text for log probabilities (special tokens kept): new, *len
 * bytes (it may hold NULs). */
static char *token_text(const serve_http *h, int32_t id, size_t *len)
{
    char *text = NULL;
    if (moec_tokenizer_decode(h->tok, &id, 1, 0, &text, len) != MOEC_OK || !text) {
        free(text);
        text = serve_format("%s", "");
        *len = 0;
    }
    return text;
}

static cJSON *bytes_json(const char *s, size_t n)
{
    cJSON *a = j_check(cJSON_CreateArray());
    for (size_t i = 0; i < n; i++)
        j_add(a, NULL, cJSON_CreateNumber((unsigned char)s[i]));
    return a;
}

static long utf8_chars(const char *s, size_t n)
{
    long chars = 0;
    for (size_t i = 0; i < n; i++)
        chars += ((unsigned char)s[i] & 0xC0) != 0x80;
    return chars;
}

/* The log probabilities of n tokens as OpenAI writes them: completions'
 * {tokens, token_logprobs, top_logprobs, text_offset}, chat's {content:
 * [{token, logprob, bytes, top_logprobs}]}. */
static cJSON *logprobs_json(hreq *r, const tok_lp *lps, int n)
{
    const serve_http *h = r->h;
    cJSON *o = j_check(cJSON_CreateObject());
    if (r->chat) {
        cJSON *content = j_arr(o, "content");
        size_t len;
        for (int i = 0; i < n; i++) {
            cJSON *t = j_obj(content, NULL);
            char *s = token_text(h, lps[i].id, &len);
            j_strn(t, "token", s, len);
            j_num(t, "logprob", lps[i].logprob);
            j_add(t, "bytes", bytes_json(s, len));
            free(s);
            cJSON *tops = j_arr(t, "top_logprobs");
            for (int k = 0; k < lps[i].n_top; k++) {
                cJSON *tt = j_obj(tops, NULL);
                s = token_text(h, lps[i].top_ids[k], &len);
                j_strn(tt, "token", s, len);
                j_num(tt, "logprob", lps[i].top_lps[k]);
                j_add(tt, "bytes", bytes_json(s, len));
                free(s);
            }
        }
        j_add(o, "refusal", cJSON_CreateNull());
        return o;
    }
    cJSON *tokens = j_arr(o, "tokens"), *lp = j_arr(o, "token_logprobs");
    cJSON *tops = r->mr.sampling.top_logprobs ? j_arr(o, "top_logprobs") : NULL;
    if (!tops)
        j_add(o, "top_logprobs", cJSON_CreateNull());
    cJSON *offs = j_arr(o, "text_offset");
    size_t len;
    for (int i = 0; i < n; i++) {
        char *s = token_text(h, lps[i].id, &len);
        j_strn(tokens, NULL, s, len);
        j_add(lp, NULL, cJSON_CreateNumber(lps[i].logprob));
        j_add(offs, NULL, cJSON_CreateNumber((double)lps[i].offset));
        free(s);
        if (tops) { /* {token text: logprob}; a key with a NUL is cut there (cJSON's keys) */
            cJSON *d = j_obj(tops, NULL);
            for (int k = 0; k < lps[i].n_top; k++) {
                s = token_text(h, lps[i].top_ids[k], &len);
                j_add(d, s, cJSON_CreateNumber(lps[i].top_lps[k]));
                free(s);
            }
        }
    }
    return o;
}

static cJSON *usage_json(const hreq *r)
{
    cJSON *u = j_check(cJSON_CreateObject());
    j_num(u, "prompt_tokens", r->n_prompt);
    j_num(u, "completion_tokens", r->n_output);
    j_num(u, "total_tokens", r->n_prompt + r->n_output);
    return u;
}

/* The fields every answer and chunk starts with. */
static cJSON *envelope(const hreq *r, const char *object)
{
    cJSON *root = j_check(cJSON_CreateObject());
    j_str(root, "id", r->id);
    j_str(root, "object", object);
    j_num(root, "created", (double)r->created);
    j_str(root, "model", r->h->cfg.model_name);
    return root;
}

/* One SSE event into the stage: "data: JSON\n\n". */
static void stage_event(hreq *r, cJSON *root)
{
    char *text = j_print(root);
    moec_buf_printf(&r->stage, "data: %s\n\n", text);
    cJSON_free(text);
}

/* A chunk: text (or a chat delta of it), its tokens' log probabilities,
 * the finish reason once done. role: chat's first chunk. */
static void stage_chunk(hreq *r, const char *text, size_t text_len, const tok_lp *lps,
                        int n_lps, const char *finish, int role)
{
    cJSON *root = envelope(r, r->chat ? "chat.completion.chunk" : "text_completion");
    cJSON *c = j_obj(j_arr(root, "choices"), NULL);
    j_num(c, "index", 0);
    if (r->chat) {
        cJSON *d = j_obj(c, "delta");
        if (role)
            j_str(d, "role", "assistant");
        if (text)
            j_strn(d, "content", text, text_len);
    } else {
        j_strn(c, "text", text ? text : "", text_len);
    }
    j_add(c, "logprobs", n_lps ? logprobs_json(r, lps, n_lps) : cJSON_CreateNull());
    j_str(c, "finish_reason", finish);
    if (r->include_usage)
        j_add(root, "usage", cJSON_CreateNull());
    stage_event(r, root);
}

/* What the engine thread left for r (taken under mu), staged as SSE
 * events; the end (finish chunk, usage, [DONE]) once the engine is done.
 * -1 when the connection must end at once (its client went away). */
static int stage_more(hreq *r)
{
    serve_http *h = r->h;
    pthread_mutex_lock(&h->mu);
    if (r->hup) {
        pthread_mutex_unlock(&h->mu);
        return -1;
    }
    if (!r->out.len && !r->n_lps && !r->engine_done && (r->sent_role || !r->chat)) {
        suspend(r); /* nothing new */
        pthread_mutex_unlock(&h->mu);
        return 0;
    }
    moec_buf out = r->out;
    tok_lp *lps = r->lps;
    int n_lps = r->n_lps, done = r->engine_done;
    r->out = (moec_buf){0};
    r->lps = NULL;
    r->n_lps = r->cap_lps = 0;
    http_error fail = r->fail;
    r->fail = (http_error){0};
    pthread_mutex_unlock(&h->mu);
    if (r->chat && !r->sent_role) {
        stage_chunk(r, "", 0, NULL, 0, NULL, 1);
        r->sent_role = 1;
    }
    if (out.len || n_lps)
        stage_chunk(r, serve_buf_text(&out), out.len, lps, n_lps, NULL, 0);
    if (done && fail.status) {
        stage_event(r, error_json(&fail));
        moec_buf_str(&r->stage, "data: [DONE]\n\n");
        r->sent_end = 1;
    } else if (done) {
        stage_chunk(r, NULL, 0, NULL, 0, r->finish, 0);
        if (r->include_usage) {
            cJSON *root = envelope(r, r->chat ? "chat.completion.chunk" : "text_completion");
            j_arr(root, "choices");
            j_add(root, "usage", usage_json(r));
            stage_event(r, root);
        }
        moec_buf_str(&r->stage, "data: [DONE]\n\n");
        r->sent_end = 1;
    }
    free(fail.message);
    moec_buf_free(&out);
    free(lps);
    serve_buf_text(&r->stage);
    return 0;
}

/* libmicrohttpd asks for the next bytes of r's SSE answer. */
static ssize_t on_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    hreq *r = cls;
    (void)pos;
    for (;;) {
        size_t avail = r->stage.len - r->stage_off;
        if (avail) {
            size_t n = avail < max ? avail : max;
            memcpy(buf, r->stage.data + r->stage_off, n);
            r->stage_off += n;
            if (r->stage_off == r->stage.len)
                r->stage.len = r->stage_off = 0;
            return (ssize_t)n;
        }
        if (r->sent_end)
            return MHD_CONTENT_READER_END_OF_STREAM;
        if (stage_more(r))
            return MHD_CONTENT_READER_END_WITH_ERROR;
        if (r->stage.len == 0)
            return 0; /* suspended until there is more */
    }
}

/* The whole answer of a request that did not ask to stream. */
static enum MHD_Result answer_whole(hreq *r, moec_buf *out, const tok_lp *lps, int n_lps)
{
    cJSON *root = envelope(r, r->chat ? "chat.completion" : "text_completion");
    cJSON *c = j_obj(j_arr(root, "choices"), NULL);
    j_num(c, "index", 0);
    if (r->chat) {
        cJSON *m = j_obj(c, "message");
        j_str(m, "role", "assistant");
        j_strn(m, "content", serve_buf_text(out), out->len);
    } else {
        j_strn(c, "text", serve_buf_text(out), out->len);
    }
    j_add(c, "logprobs", r->logprobs ? logprobs_json(r, lps, n_lps) : cJSON_CreateNull());
    j_str(c, "finish_reason", r->finish);
    j_add(root, "usage", usage_json(r));
    return answer_json(r, MHD_HTTP_OK, root);
}

/* The connection of a queued request runs again: its answer can start, or
 * it sleeps again. */
static enum MHD_Result on_resumed(hreq *r)
{
    serve_http *h = r->h;
    pthread_mutex_lock(&h->mu);
    if (r->hup) {
        pthread_mutex_unlock(&h->mu);
        return MHD_NO;
    }
    if (r->engine_done && r->fail.status) {
        http_error e = r->fail;
        r->fail = (http_error){0};
        pthread_mutex_unlock(&h->mu);
        return answer_error(r, &e, NULL);
    }
    if (!r->stream && r->engine_done) {
        moec_buf out = r->out;
        tok_lp *lps = r->lps;
        int n_lps = r->n_lps;
        r->out = (moec_buf){0};
        r->lps = NULL;
        r->n_lps = r->cap_lps = 0;
        pthread_mutex_unlock(&h->mu);
        enum MHD_Result ok = answer_whole(r, &out, lps, n_lps);
        moec_buf_free(&out);
        free(lps);
        return ok;
    }
    if (r->stream && (r->started || r->engine_done)) {
        pthread_mutex_unlock(&h->mu);
        struct MHD_Response *resp =
            MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, SSE_BLOCK, on_read, r, NULL);
        if (!resp)
            return MHD_NO;
        enum MHD_Result ok = MHD_add_response_header(resp, "Content-Type", "text/event-stream");
        if (ok == MHD_YES)
            ok = MHD_add_response_header(resp, "Cache-Control", "no-cache");
        if (ok == MHD_YES)
            ok = MHD_queue_response(r->conn, MHD_HTTP_OK, resp);
        MHD_destroy_response(resp);
        r->phase = PH_STREAMING;
        count_response(r, MHD_HTTP_OK);
        return ok;
    }
    suspend(r); /* woken for nothing new: sleep on */
    pthread_mutex_unlock(&h->mu);
    return MHD_YES;
}

/* Hands r to the engine thread (its connection suspended meanwhile), or
 * answers 429 / 503 when it cannot take it. */
static enum MHD_Result enqueue(hreq *r)
{
    serve_http *h = r->h;
    pthread_mutex_lock(&h->mu);
    if (h->stopping) {
        pthread_mutex_unlock(&h->mu);
        return answer_errorf(r, MHD_HTTP_SERVICE_UNAVAILABLE, "server_error", "shutting_down",
                             NULL, "the service is shutting down");
    }
    if (h->n_waiting >= h->cfg.max_waiting) {
        int n = h->n_waiting;
        pthread_mutex_unlock(&h->mu);
        return answer_errorf(r, MHD_HTTP_TOO_MANY_REQUESTS, "rate_limit_error", "queue_full",
                             NULL,
                             "too many requests waiting: %d are queued with no token yet "
                             "(--max-waiting); retry later",
                             n);
    }
    r->queued = r->waiting = 1;
    h->n_waiting++;
    serve_metrics_http_waiting(h->metrics, h->n_waiting);
    r->refs++; /* the engine thread's */
    r->n_prompt = r->mr.n_prompt;
    if (h->incoming_tail)
        h->incoming_tail->next_queued = r;
    else
        h->incoming_head = r;
    h->incoming_tail = r;
    r->phase = PH_QUEUED;
    suspend(r);
    pthread_mutex_unlock(&h->mu);
    uint64_t one = 1;
    if (write(h->wake_fd, &one, sizeof one) < 0 && errno != EAGAIN)
        fprintf(stderr, "moec-serve: http: cannot wake the engine thread: %s\n",
                strerror(errno));
    return MHD_YES;
}

static enum MHD_Result answer_models(hreq *r, const char *url)
{
    serve_http *h = r->h;
    const char *name = h->cfg.model_name;
    if (r->ep == EP_MODEL && strcmp(url + strlen(ROUTES[EP_MODEL].path), name)) {
        const char *asked = url + strlen(ROUTES[EP_MODEL].path);
        size_t n = strlen(asked);
        if (serve_utf8_invalid_at(asked, n) < n)
            asked = "(not UTF-8)";
        return answer_errorf(r, MHD_HTTP_NOT_FOUND, "invalid_request_error", "model_not_found",
                             NULL, "The model '%s' does not exist: this server serves '%s'",
                             asked, name);
    }
    cJSON *m = j_check(cJSON_CreateObject());
    j_str(m, "id", name);
    j_str(m, "object", "model");
    j_num(m, "created", (double)h->started_at);
    j_str(m, "owned_by", "moec");
    j_num(m, "max_model_len", h->cfg.max_len); /* what a request can be given */
    if (r->ep == EP_MODEL)
        return answer_json(r, MHD_HTTP_OK, m);
    cJSON *root = j_check(cJSON_CreateObject());
    j_str(root, "object", "list");
    j_add(j_arr(root, "data"), NULL, m);
    return answer_json(r, MHD_HTTP_OK, root);
}

/* The request is all here: answer it, or queue it for the engine. */
static enum MHD_Result on_complete_request(hreq *r, const char *url, const char *method)
{
    serve_http *h = r->h;
    if (r->ep == EP_UNKNOWN) {
        size_t n = strlen(url);
        return answer_errorf(r, MHD_HTTP_NOT_FOUND, "invalid_request_error", "not_found", NULL,
                             "Invalid URL (%s %s): the endpoints are POST /v1/completions, "
                             "POST /v1/chat/completions, GET /v1/models, GET /health, GET "
                             "/metrics",
                             method, serve_utf8_invalid_at(url, n) < n ? "(not UTF-8)" : url);
    }
    if (!r->method_ok)
        return answer_errorf(r, MHD_HTTP_METHOD_NOT_ALLOWED, "invalid_request_error",
                             "method_not_allowed", ROUTES[r->ep].method,
                             "Method %s is not allowed on %s: it takes %s", method, url,
                             ROUTES[r->ep].method);
    if (r->too_large)
        return answer_errorf(r, MHD_HTTP_CONTENT_TOO_LARGE, "invalid_request_error",
                             "request_too_large", NULL,
                             "the request body is larger than %zu bytes (--max-body-kib)",
                             h->cfg.max_body);
    switch (r->ep) {
    case EP_MODELS:
    case EP_MODEL:
        return answer_models(r, url);
    case EP_HEALTH:
        return answer(r, MHD_HTTP_OK, serve_format("{\"status\":\"ok\"}"), "application/json",
                      NULL);
    case EP_METRICS: {
        moec_buf b = {0};
        serve_metrics_render(h->metrics, &b);
        char *text = strdup(serve_buf_text(&b));
        moec_buf_free(&b);
        if (!text)
            serve_die_oom();
        return answer(r, MHD_HTTP_OK, text, "text/plain; version=0.0.4; charset=utf-8", NULL);
    }
    default:
        break;
    }
    r->chat = r->ep == EP_CHAT;
    http_error e = {0};
    if (parse_request(r, &e))
        return answer_error(r, &e, NULL);
    return enqueue(r);
}

/* Adds n bytes to r's body; past max_body the rest is read and dropped
 * (the answer, 413, can only go once the request is all in). */
static void body_add(hreq *r, const char *p, size_t n)
{
    if (r->too_large)
        return;
    if (r->body_len + n > r->h->cfg.max_body) {
        r->too_large = 1;
        free(r->body);
        r->body = NULL;
        r->body_len = r->body_cap = 0;
        return;
    }
    if (r->body_len + n + 1 > r->body_cap) {
        r->body_cap = 2 * (r->body_len + n) + 1;
        r->body = serve_xrealloc(r->body, r->body_cap);
    }
    memcpy(r->body + r->body_len, p, n);
    r->body_len += n;
    r->body[r->body_len] = '\0';
}

/* MHD_get_connection_values' callback: whether the Content-Length headers
 * disagree (cls: the first one's value, then "" once two differ). */
static enum MHD_Result length_differs(void *cls, enum MHD_ValueKind kind, const char *key,
                                      const char *value)
{
    const char **first = cls;
    (void)kind;
    if (!key || !value || strcasecmp(key, "Content-Length"))
        return MHD_YES;
    if (!*first) {
        *first = value;
        return MHD_YES;
    }
    if (strcmp(*first, value)) {
        *first = "";
        return MHD_NO;
    }
    return MHD_YES;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version,
                                  const char *upload, size_t *upload_size, void **con_cls)
{
    serve_http *h = cls;
    hreq *r = *con_cls;
    (void)version;
    if (!r) { /* the headers are in */
        r = *con_cls = hreq_new(h, conn, url, method);
        /* libmicrohttpd reads the body by one of two Content-Lengths that
           differ and ignores the other: a proxy in front that took the other
           would see another request in the same bytes (request smuggling), so
           the request is refused (RFC 9112 6.3) before its body is read, and
           its connection closed */
        const char *first = NULL;
        MHD_get_connection_values(conn, MHD_HEADER_KIND, length_differs, &first);
        if (first && !*first)
            return answer_errorf(r, MHD_HTTP_BAD_REQUEST, "invalid_request_error", NULL, NULL,
                                 "the request has Content-Length headers that differ: it "
                                 "must have one");
        const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Content-Length");
        if (cl) {
            char *end;
            errno = 0;
            unsigned long long len = strtoull(cl, &end, 10);
            if (!errno && !*end && len > h->cfg.max_body) {
                r->too_large = 1;
                if (len / DISCARD_LIMIT > h->cfg.max_body) /* not worth reading */
                    return on_complete_request(r, url, method);
            }
        }
        return MHD_YES;
    }
    if (*upload_size) {
        body_add(r, upload, *upload_size);
        *upload_size = 0;
        return MHD_YES;
    }
    switch (r->phase) {
    case PH_BODY:
        return on_complete_request(r, url, method);
    case PH_QUEUED:
        return on_resumed(r);
    default:
        return MHD_NO;
    }
}

/* libmicrohttpd is done with r's connection (answered, failed or closed). */
static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    serve_http *h = cls;
    hreq *r = *con_cls;
    (void)conn;
    (void)toe;
    if (!r)
        return;
    *con_cls = NULL;
    pthread_mutex_lock(&h->mu);
    r->conn_done = 1;
    LIST_UNLINK(h->all, r, prev_all, next_all);
    hreq_release(r);
    pthread_cond_broadcast(&h->completed);
    pthread_mutex_unlock(&h->mu);
}

static void on_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    /* what libmicrohttpd says when this file ends a connection on purpose
     * (its client went away, or stopped reading) */
    if (strstr(fmt, "Application reported internal error") ||
        strstr(fmt, "application error generating response"))
        return;
    fprintf(stderr, "moec-serve: http: ");
    vfprintf(stderr, fmt, ap);
    size_t n = strlen(fmt);
    if (!n || fmt[n - 1] != '\n')
        fputc('\n', stderr);
}

/* ---- the engine thread ---------------------------------------------------------- */

/* The engine has no more of r: finish (or fail: status set) recorded, its
 * connection woken, the engine thread's hold dropped. cancel: r is still in
 * the engine and must be taken out. */
static void engine_end(serve_http *h, moec_engine_t *engine, hreq *r, int cancel,
                       const char *finish, http_error *fail, int hup)
{
    if (cancel && r->in_engine && moec_engine_cancel(engine, r->engine_id) != MOEC_OK)
        fprintf(stderr, "moec-serve: http: %s\n", moec_last_error());
    if (r->in_engine)
        LIST_UNLINK(h->active, r, prev_active, next_active);
    r->in_engine = 0;
    moec_detokenizer_free(r->detok);
    r->detok = NULL;
    moec_buf_free(&r->hold);
    pthread_mutex_lock(&h->mu);
    unwait(r);
    r->engine_done = 1;
    r->finish = finish;
    if (fail && fail->status) {
        free(r->fail.message);
        r->fail = *fail;
        *fail = (http_error){0};
    }
    r->hup |= hup;
    resume(r);
    hreq_release(r);
    pthread_mutex_unlock(&h->mu);
}

int serve_http_poll_fds(serve_http *h, struct pollfd **pfd, int *cap, int np)
{
    pthread_mutex_lock(&h->mu);
    int n = 1;
    for (hreq *r = h->active; r; r = r->next_active)
        n++;
    if (*cap < np + n) {
        *cap = np + n + 16;
        *pfd = serve_xrealloc(*pfd, (size_t)*cap * sizeof **pfd);
    }
    if (h->cap_polled < n) {
        h->cap_polled = n + 16;
        h->polled = serve_xrealloc(h->polled, (size_t)h->cap_polled * sizeof *h->polled);
    }
    (*pfd)[np++] = (struct pollfd){.fd = h->wake_fd, .events = POLLIN};
    h->n_polled = 0;
    for (hreq *r = h->active; r; r = r->next_active) {
        if (!r->suspended || r->fd < 0)
            continue;
        (*pfd)[np++] = (struct pollfd){.fd = r->fd, .events = POLLRDHUP};
        h->polled[h->n_polled++] = r;
    }
    pthread_mutex_unlock(&h->mu);
    return np;
}

/* Submits r; a refusal (what only the engine knows: ids outside the
 * vocabulary, a request that can never fit) becomes its 400. */
static void submit(serve_http *h, moec_engine_t *engine, hreq *r)
{
    moec_request q = r->mr;
    q.user = r;
    moec_status st = moec_detokenizer_init(h->tok, 1, &r->detok);
    if (st == MOEC_OK)
        st = moec_engine_submit(engine, &q, &r->engine_id);
    if (st != MOEC_OK) {
        http_error e = {MHD_HTTP_BAD_REQUEST, "invalid_request_error",
                        st == MOEC_ERR_CAPACITY ? "context_length_exceeded" : NULL,
                        st == MOEC_ERR_CAPACITY ? NULL : r->chat ? "messages" : "prompt",
                        serve_format("%s", moec_last_error_message())};
        if (st == MOEC_ERR_OOM)
            e.status = MHD_HTTP_INTERNAL_SERVER_ERROR, e.type = "server_error", e.param = NULL;
        engine_end(h, engine, r, 0, NULL, &e, 0);
        return;
    }
    r->in_engine = 1;
    r->head.t_submit = moec_now_s();
    LIST_PUSH(h->active, r, prev_active, next_active);
}

void serve_http_pump(serve_http *h, moec_engine_t *engine, const struct pollfd *pfd)
{
    if (pfd && pfd[0].revents & POLLIN) {
        uint64_t v;
        if (read(h->wake_fd, &v, sizeof v) < 0 && errno != EAGAIN)
            fprintf(stderr, "moec-serve: http: wake-up read: %s\n", strerror(errno));
    }
    /* clients that hung up while their requests waited on the engine */
    for (int i = 0; pfd && i < h->n_polled; i++)
        if (pfd[1 + i].revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL))
            engine_end(h, engine, h->polled[i], 1, NULL, NULL, 1);
    h->n_polled = 0;
    pthread_mutex_lock(&h->mu);
    hreq *in = h->incoming_head;
    h->incoming_head = h->incoming_tail = NULL;
    /* and those libmicrohttpd saw go */
    hreq *gone = NULL;
    for (hreq *r = h->active; r; r = r->next_active)
        if (r->conn_done) {
            r->next_queued = gone;
            gone = r;
        }
    pthread_mutex_unlock(&h->mu);
    while (gone) {
        hreq *r = gone;
        gone = r->next_queued;
        engine_end(h, engine, r, 1, NULL, NULL, 1);
    }
    while (in) {
        hreq *r = in;
        in = r->next_queued;
        r->next_queued = NULL;
        int conn_done;
        pthread_mutex_lock(&h->mu);
        conn_done = r->conn_done;
        pthread_mutex_unlock(&h->mu);
        if (conn_done)
            engine_end(h, engine, r, 0, NULL, NULL, 1);
        else
            submit(h, engine, r);
    }
}

/* The offset of the first stop string in s[0..n), n when none. */
static size_t stop_find(const hreq *r, const char *s, size_t n)
{
    size_t at = n;
    for (int i = 0; i < r->n_stops; i++) {
        const char *p = memmem(s, n, r->stops[i], strlen(r->stops[i]));
        if (p && (size_t)(p - s) < at)
            at = (size_t)(p - s);
    }
    return at;
}

/* The longest end of s[0..n) that begins a stop string (and so may become
 * one): held back until the next tokens say. */
static size_t stop_tail(const hreq *r, const char *s, size_t n)
{
    size_t best = 0;
    for (int i = 0; i < r->n_stops; i++) {
        size_t len = strlen(r->stops[i]);
        for (size_t k = len - 1 < n ? len - 1 : n; k > best; k--)
            if (!memcmp(s + n - k, r->stops[i], k)) {
                best = k;
                break;
            }
    }
    return best;
}

/* Adds text to r's hold and returns how much of the hold may go out now (a
 * stop string found: what comes before it, r->stopped set; at the end: all
 * of it). */
static size_t hold_add(hreq *r, const char *text, size_t len, int last)
{
    moec_buf_put(&r->hold, text, len);
    serve_buf_text(&r->hold);
    size_t at = stop_find(r, r->hold.data, r->hold.len);
    if (at < r->hold.len) {
        r->stopped = 1;
        return at;
    }
    return last ? r->hold.len : r->hold.len - stop_tail(r, r->hold.data, r->hold.len);
}

void serve_http_event(serve_http *h, moec_engine_t *engine, const moec_event *ev)
{
    hreq *r = ev->user;
    if (ev->finish == MOEC_FINISH_ERROR) {
        http_error e = {MHD_HTTP_INTERNAL_SERVER_ERROR, "server_error", NULL, NULL,
                        serve_format("generation failed: %s", ev->error)};
        engine_end(h, engine, r, 0, NULL, &e, 0);
        return;
    }
    int last = ev->finish != MOEC_FINISH_NONE;
    const char *piece = "", *rest = "";
    size_t piece_len = 0, rest_len = 0;
    /* the eos or stop id that ended the request is counted and has its log
       probability, but its text is left out (as vLLM and SGLang leave it) */
    int stop_id = ev->finish == MOEC_FINISH_EOS || ev->finish == MOEC_FINISH_STOP;
    /* text_offset: the character of the returned text that holds the
       token's first byte, counted on the detokenizer's output (not on the
       token decoded alone, which makes each part of a character split over
       tokens a U+FFFD of its own): every token of a split character gets
       that character's offset */
    int before = 0;
    moec_status st = stop_id ? MOEC_OK
                             : moec_detokenizer_push_offset(r->detok, ev->token, &piece,
                                                            &piece_len, &before);
    long offset = r->text_chars + before;
    r->text_chars += utf8_chars(piece, piece_len);
    size_t go = st == MOEC_OK ? hold_add(r, piece, piece_len, 0) : 0;
    if (st == MOEC_OK && last && !r->stopped &&
        (st = moec_detokenizer_finish(r->detok, &rest, &rest_len)) == MOEC_OK)
        go = hold_add(r, rest, rest_len, 1);
    if (stop_id) /* left out of the text: it starts after all of it (a cut-off end's U+FFFD) */
        offset += utf8_chars(rest, rest_len);
    if (st != MOEC_OK) {
        http_error e = {MHD_HTTP_INTERNAL_SERVER_ERROR, "server_error", NULL, NULL,
                        serve_format("cannot decode the output: %s", moec_last_error_message())};
        engine_end(h, engine, r, !last, NULL, &e, 0);
        return;
    }
    int end = last || r->stopped;
    pthread_mutex_lock(&h->mu);
    unwait(r);
    r->started = 1;
    r->n_output++;
    if (go)
        moec_buf_put(&r->out, r->hold.data, go);
    serve_buf_text(&r->out);
    if (r->logprobs) {
        if (r->n_lps == r->cap_lps) {
            r->cap_lps = r->cap_lps ? 2 * r->cap_lps : 16;
            r->lps = serve_xrealloc(r->lps, (size_t)r->cap_lps * sizeof *r->lps);
        }
        tok_lp *t = &r->lps[r->n_lps++];
        t->id = ev->token;
        t->logprob = ev->logprob;
        t->offset = offset;
        t->n_top = ev->n_top;
        memcpy(t->top_ids, ev->top_ids, sizeof t->top_ids);
        memcpy(t->top_lps, ev->top_logprobs, sizeof t->top_lps);
    }
    size_t unread = r->out.len + (size_t)r->n_lps * sizeof(tok_lp);
    if (r->stream || end)
        resume(r);
    pthread_mutex_unlock(&h->mu);
    if (go) {
        memmove(r->hold.data, r->hold.data + go, r->hold.len - go);
        r->hold.len -= go;
        r->hold.data[r->hold.len] = '\0';
    }
    if (unread > OUT_LIMIT) {
        fprintf(stderr, "moec-serve: http: dropping a client: it has not read %zu bytes of %s "
                        "(more than %d MiB)\n",
                unread, r->id, OUT_LIMIT >> 20);
        engine_end(h, engine, r, !last, NULL, NULL, 1);
    } else if (end) {
        engine_end(h, engine, r, !last, ev->finish == MOEC_FINISH_LENGTH && !r->stopped
                                            ? "length"
                                            : "stop",
                   NULL, 0);
    }
}

/* --max-connections: a connection past the limit is closed as it is
 * accepted (libmicrohttpd's threads count them as they start and end; a
 * burst on several threads at once may let in one more a thread). */
static enum MHD_Result on_accept(void *cls, const struct sockaddr *addr, socklen_t len)
{
    (void)addr;
    (void)len;
    serve_http *h = cls;
    return __atomic_load_n(&h->n_conns, __ATOMIC_ACQUIRE) < h->cfg.max_connections ? MHD_YES
                                                                                    : MHD_NO;
}

static void on_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                          enum MHD_ConnectionNotificationCode toe)
{
    (void)conn;
    (void)socket_context;
    serve_http *h = cls;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED)
        __atomic_add_fetch(&h->n_conns, 1, __ATOMIC_ACQ_REL);
    else if (toe == MHD_CONNECTION_NOTIFY_CLOSED)
        __atomic_sub_fetch(&h->n_conns, 1, __ATOMIC_ACQ_REL);
}

/* ---- start and stop ---------------------------------------------------------- */

/* host and port as an address to bind, or -1 said on stderr. */
static int http_resolve(const char *host, int port, struct addrinfo **ai)
{
    struct addrinfo hints = {.ai_flags = AI_NUMERICHOST | AI_PASSIVE,
                             .ai_socktype = SOCK_STREAM};
    char p[16];
    snprintf(p, sizeof p, "%d", port);
    *ai = NULL;
    int gai = getaddrinfo(host, p, &hints, ai);
    if (gai) {
        fprintf(stderr, "moec-serve: --host: '%s' is not a numeric IPv4 or IPv6 address: %s\n",
                host, gai_strerror(gai));
        return -1;
    }
    return 0;
}

int serve_http_host_check(const char *host)
{
    struct addrinfo *ai;
    if (http_resolve(host, 0, &ai))
        return -1;
    freeaddrinfo(ai);
    return 0;
}

int serve_http_start(const serve_http_config *cfg, const moec_tokenizer_t *tok,
                     serve_metrics *metrics, serve_http **out)
{
    *out = NULL;
    struct addrinfo *ai;
    if (http_resolve(cfg->host, cfg->port, &ai))
        return -1;
    serve_http *h = serve_xcalloc(1, sizeof *h);
    h->cfg = *cfg;
    h->tok = tok;
    h->metrics = metrics;
    h->started_at = (long long)time(NULL);
    h->seeds = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32) ^ 0x5e11;
    h->ids = h->seeds ^ 0x1d5;
    if (pthread_mutex_init(&h->mu, NULL) || pthread_cond_init(&h->completed, NULL))
        serve_die_oom();
    h->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (h->wake_fd < 0) {
        fprintf(stderr, "moec-serve: http: eventfd: %s\n", strerror(errno));
        freeaddrinfo(ai);
        serve_http_stop(h);
        return -1;
    }
    /* poll, not epoll: libmicrohttpd 0.9.75's epoll loop misses a client
       that sends part of a request and closes before the first read, and
       holds its socket in CLOSE-WAIT until the timeout (200 such clients
       kept every other one out for the whole of it; poll sees each at once).
       Its own connection limit would stop accepting, leaving one more
       client hanging in the listen queue: each thread may hold the whole
       limit, and on_accept closes one more at once. */
    unsigned flags = MHD_USE_POLL_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME |
                     MHD_USE_ERROR_LOG | (ai->ai_family == AF_INET6 ? MHD_USE_IPv6 : 0);
    unsigned mhd_limit = (unsigned)cfg->max_connections * (unsigned)cfg->threads + 1;
    h->daemon = MHD_start_daemon(
        flags, (uint16_t)cfg->port, on_accept, h, on_request, h, MHD_OPTION_EXTERNAL_LOGGER,
        on_log, h, MHD_OPTION_SOCK_ADDR, ai->ai_addr, MHD_OPTION_CONNECTION_LIMIT, mhd_limit,
        MHD_OPTION_CONNECTION_TIMEOUT, cfg->timeout_s, MHD_OPTION_CONNECTION_MEMORY_LIMIT,
        (size_t)HEADER_LIMIT, MHD_OPTION_THREAD_POOL_SIZE, (unsigned)cfg->threads,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, h, MHD_OPTION_NOTIFY_CONNECTION, on_connection,
        h, MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!h->daemon) {
        fprintf(stderr, "moec-serve: http: cannot listen on %s:%d (the port taken, or the "
                        "address not this machine's)\n",
                cfg->host, cfg->port);
        serve_http_stop(h);
        return -1;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(h->daemon, MHD_DAEMON_INFO_BIND_PORT);
    h->port = di ? di->port : cfg->port;
    *out = h;
    return 0;
}

int serve_http_port(const serve_http *h) { return h->port; }

void serve_http_stop(serve_http *h)
{
    if (!h)
        return;
    MHD_socket listen_fd = h->daemon ? MHD_quiesce_daemon(h->daemon) : MHD_INVALID_SOCKET;
    pthread_mutex_lock(&h->mu);
    h->stopping = 1;
    /* the engine goes: whatever it held ends (503 for those not answered
     * yet), and every sleeping connection wakes to answer or to close */
    hreq *held = h->incoming_head;
    for (hreq *r = h->active; r; r = r->next_active)
        r->next_queued = r->next_active ? r->next_active : held;
    if (h->active)
        held = h->active;
    h->active = NULL;
    while (held) {
        hreq *r = held;
        held = r->next_queued;
        r->in_engine = 0;
        moec_detokenizer_free(r->detok);
        r->detok = NULL;
        moec_buf_free(&r->hold);
        unwait(r);
        if (!r->engine_done && !r->fail.status)
            r->fail = (http_error){MHD_HTTP_SERVICE_UNAVAILABLE, "server_error",
                                   "shutting_down", NULL,
                                   serve_format("the service is shutting down")};
        r->engine_done = 1;
        resume(r);
        hreq_release(r);
    }
    for (hreq *r = h->all; r; r = r->next_all)
        resume(r);
    h->incoming_head = h->incoming_tail = NULL;
    /* their answers go out before the connections close (5 s at most: a
     * client that does not read is not waited for) */
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 5;
    int left;
    for (;;) {
        left = 0;
        for (hreq *r = h->all; r; r = r->next_all)
            left += r->queued;
        if (!left || pthread_cond_timedwait(&h->completed, &h->mu, &until) == ETIMEDOUT)
            break;
    }
    pthread_mutex_unlock(&h->mu);
    if (left)
        fprintf(stderr, "moec-serve: http: %d answers not sent within 5 s of the stop\n", left);
    if (h->daemon)
        MHD_stop_daemon(h->daemon);
    if (listen_fd != MHD_INVALID_SOCKET)
        close(listen_fd);
    if (h->wake_fd >= 0)
        close(h->wake_fd);
    free(h->polled);
    pthread_cond_destroy(&h->completed);
    pthread_mutex_destroy(&h->mu);
    free(h);
}
