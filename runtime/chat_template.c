/* chat_template.c — a model's chat template rendered for a conversation,
 * as transformers' apply_chat_template renders it: the template gets
 * messages, tools and documents (None unless given), add_generation_prompt,
 * bos_token and eos_token (tokenizer_config.json's text, when it names
 * them) and, when set, enable_thinking; the interpreter is runtime/jinja*.c. */
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "json.h"
#include "runtime/jinja.h"
#include "runtime/tokenizer.h"

/* The JSON text of a request moec_chat_render_json reads, at most. */
#define CHAT_MAX_REQUEST_BYTES JINJA_MAX_OUTPUT

static moec_status no_template(const moec_tokenizer_t *tok)
{
    if (tok->chat_template_missing)
        return MOEC_ERR(MOEC_ERR_NOT_FOUND, "%s", tok->chat_template_missing);
    /* tok->path is DIR/tokenizer.json */
    size_t n = strlen(tok->path) >= sizeof "/tokenizer.json" ? strlen(tok->path) - (sizeof "/tokenizer.json" - 1) : 0;
    return MOEC_ERR(MOEC_ERR_NOT_FOUND,
                    "%.*s has no chat template (no chat_template in tokenizer_config.json, no chat_template.jinja)",
                    n ? (int)n : 1, n ? tok->path : ".");
}

/* Adds what the tokenizer and the options give the template to vars, then
 * renders. vars is consumed. */
static moec_status render(const moec_tokenizer_t *tok, cJSON *vars, const moec_chat_options_t *opts, char **out)
{
    int thinking = opts ? opts->enable_thinking : -1, ok = 1;
    moec_status st = MOEC_OK;
    if (!cJSON_GetObjectItemCaseSensitive(vars, "tools"))
        ok &= cJSON_AddNullToObject(vars, "tools") != NULL;
    if (!cJSON_GetObjectItemCaseSensitive(vars, "documents"))
        ok &= cJSON_AddNullToObject(vars, "documents") != NULL;
    ok &= cJSON_AddBoolToObject(vars, "add_generation_prompt", opts && opts->add_generation_prompt) != NULL;
    if (tok->bos_token)
        ok &= cJSON_AddStringToObject(vars, "bos_token", tok->bos_token) != NULL;
    if (tok->eos_token)
        ok &= cJSON_AddStringToObject(vars, "eos_token", tok->eos_token) != NULL;
    if (thinking > 1 || thinking < -1)
        st = MOEC_ERR(MOEC_ERR_INVALID_ARG, "enable_thinking %d is not -1 (unset), 0 or 1", thinking);
    else if (thinking >= 0 && cJSON_GetObjectItemCaseSensitive(vars, "enable_thinking"))
        st = MOEC_ERR(MOEC_ERR_INVALID_ARG, "enable_thinking is given both by the request and by the options");
    else if (thinking >= 0)
        ok &= cJSON_AddBoolToObject(vars, "enable_thinking", thinking) != NULL;
    if (st == MOEC_OK && !ok)
        st = MOEC_ERR(MOEC_ERR_OOM, "out of memory");
    if (st == MOEC_OK) {
        size_t len;
        st = jinja_render(tok->chat_template, strlen(tok->chat_template), vars, NULL, out, &len);
    }
    cJSON_Delete(vars);
    return st;
}

moec_status moec_chat_render(const moec_tokenizer_t *tok, const moec_chat_message_t *msgs, int n_msgs,
                             const moec_chat_options_t *opts, char **out)
{
    if (out)
        *out = NULL;
    if (!tok || !out || n_msgs < 0 || (n_msgs && !msgs))
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "moec_chat_render: NULL argument or a negative message count");
    if (!tok->chat_template)
        return no_template(tok);
    cJSON *vars = cJSON_CreateObject(), *list = vars ? cJSON_AddArrayToObject(vars, "messages") : NULL;
    if (!list) {
        cJSON_Delete(vars);
        return MOEC_ERR(MOEC_ERR_OOM, "out of memory");
    }
    for (int i = 0; i < n_msgs; i++) {
        if (!msgs[i].role) {
            cJSON_Delete(vars);
            return MOEC_ERR(MOEC_ERR_INVALID_ARG, "moec_chat_render: message %d has no role", i);
        }
        cJSON *m = cJSON_CreateObject();
        if (!m || !cJSON_AddItemToArray(list, m) || !cJSON_AddStringToObject(m, "role", msgs[i].role) ||
            !(msgs[i].content ? cJSON_AddStringToObject(m, "content", msgs[i].content)
                              : cJSON_AddNullToObject(m, "content"))) {
            cJSON_Delete(vars);
            return MOEC_ERR(MOEC_ERR_OOM, "out of memory");
        }
    }
    return render(tok, vars, opts, out);
}

moec_status moec_chat_render_json(const moec_tokenizer_t *tok, const char *json, size_t len,
                                  const moec_chat_options_t *opts, char **out)
{
    static const char *const reserved[] = {"add_generation_prompt", "bos_token", "eos_token", NULL};
    if (out)
        *out = NULL;
    if (!tok || !out || (!json && len))
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "moec_chat_render_json: NULL argument");
    if (len > CHAT_MAX_REQUEST_BYTES)
        return MOEC_ERR(MOEC_ERR_CAPACITY, "the chat request has %zu bytes, more than the %zu moec reads", len,
                        CHAT_MAX_REQUEST_BYTES);
    if (!tok->chat_template)
        return no_template(tok);
    /* cJSON reads one value and stops: what follows it (a second value,
     * garbage, a NUL and more) would be dropped unseen, and a NUL inside a
     * string would cut it short, so both are refused as Python's json does */
    const char *text = json ? json : "", *nul = memchr(text, '\0', len), *end = NULL;
    if (nul)
        return MOEC_ERR(MOEC_ERR_FORMAT,
                        "the chat request is not valid JSON (a NUL byte at byte %zu)",
                        (size_t)(nul - text));
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (!root)
        return MOEC_ERR(MOEC_ERR_FORMAT, "the chat request is not valid JSON");
    int nul_esc;
    size_t bad = moec_json_string_bad_at(text, (size_t)(end - text), &nul_esc, NULL);
    if (bad < (size_t)(end - text)) {
        cJSON_Delete(root);
        if (nul_esc)
            return MOEC_ERR(MOEC_ERR_UNSUPPORTED,
                            "the chat request holds a NUL character (\\u0000) in a string "
                            "(byte %zu): moec takes no NUL in text",
                            bad);
        return MOEC_ERR(MOEC_ERR_FORMAT,
                        "the chat request is not valid JSON (at byte %zu: a control character "
                        "in a string must be escaped)",
                        bad);
    }
    for (const char *p = end; p < text + len; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            cJSON_Delete(root);
            return MOEC_ERR(MOEC_ERR_FORMAT,
                            "the chat request is not valid JSON (more after its value, at byte "
                            "%zu)",
                            (size_t)(p - text));
        }
    moec_status st = moec_json_check_unique(root, "the chat request");
    cJSON *vars = NULL, *msgs = root;
    if (st == MOEC_OK && cJSON_IsObject(root)) {
        vars = root;
        msgs = cJSON_GetObjectItemCaseSensitive(root, "messages");
        for (int k = 0; reserved[k] && st == MOEC_OK; k++)
            if (cJSON_GetObjectItemCaseSensitive(root, reserved[k]))
                st = MOEC_ERR(MOEC_ERR_INVALID_ARG, "the chat request sets '%s', which moec sets (%s)", reserved[k],
                              k ? "from tokenizer_config.json" : "from the options");
    } else if (st == MOEC_OK) {
        if (!(vars = cJSON_CreateObject()) || !cJSON_AddItemReferenceToObject(vars, "messages", root))
            st = MOEC_ERR(MOEC_ERR_OOM, "out of memory");
    }
    if (st == MOEC_OK && !cJSON_IsArray(msgs))
        st = MOEC_ERR(MOEC_ERR_INVALID_ARG, "the chat request must be a list of messages or an object with a "
                                            "\"messages\" list");
    int i = 0;
    for (const cJSON *m = st == MOEC_OK ? msgs->child : NULL; m && st == MOEC_OK; m = m->next, i++)
        if (!cJSON_IsObject(m) || !cJSON_IsString(cJSON_GetObjectItemCaseSensitive(m, "role")))
            st = MOEC_ERR(MOEC_ERR_INVALID_ARG, "message %d of the chat request is not an object with a string \"role\"",
                          i);
    if (st != MOEC_OK) {
        if (vars != root)
            cJSON_Delete(vars);
        cJSON_Delete(root);
        return st;
    }
    if (vars == root)
        return render(tok, vars, opts, out);
    st = render(tok, vars, opts, out); /* vars refers to root, which it does not own */
    cJSON_Delete(root);
    return st;
}
