/* json.c — see json.h. */
#include "json.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"

/* Up to this many keys an object is checked pair by pair; above, sorted. */
#define JSON_PAIRWISE_MAX 16

static int json_cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static const char *json_key(const cJSON *c) { return c->string ? c->string : ""; }

/* The key obj holds twice (the first such in sorted order), or NULL;
 * *oom when the sort could not get its memory. */
static const char *json_duplicate(const cJSON *obj, int *oom)
{
    int n = 0;
    for (const cJSON *c = obj->child; c; c = c->next)
        n++;
    if (n <= JSON_PAIRWISE_MAX) {
        for (const cJSON *a = obj->child; a; a = a->next)
            for (const cJSON *b = a->next; b; b = b->next)
                if (!strcmp(json_key(a), json_key(b)))
                    return json_key(a);
        return NULL;
    }
    const char **keys = malloc((size_t)n * sizeof *keys);
    if (!keys) {
        *oom = 1;
        return NULL;
    }
    n = 0;
    for (const cJSON *c = obj->child; c; c = c->next)
        keys[n++] = json_key(c);
    qsort(keys, (size_t)n, sizeof *keys, json_cmp_str);
    const char *dup = NULL;
    for (int i = 1; i < n && !dup; i++)
        if (!strcmp(keys[i - 1], keys[i]))
            dup = keys[i];
    free(keys);
    return dup;
}

/* Checks node and everything under it; path[0, len) names node. cJSON
 * limits nesting (CJSON_NESTING_LIMIT), which bounds the recursion. */
static moec_status json_unique_in(const cJSON *node, const char *file, char *path, size_t len,
                                  size_t cap)
{
    if (cJSON_IsObject(node)) {
        int oom = 0;
        const char *dup = json_duplicate(node, &oom);
        if (oom)
            return MOEC_ERR(MOEC_ERR_OOM, "out of memory reading %s", file);
        if (dup)
            return MOEC_ERR(MOEC_ERR_FORMAT, "%s: key \"%.*s%s%s\" appears twice", file,
                            (int)len, path, len ? "." : "", dup);
    }
    int i = 0;
    for (const cJSON *c = node->child; c; c = c->next, i++) {
        if (!cJSON_IsObject(c) && !cJSON_IsArray(c))
            continue;
        size_t n;
        if (cJSON_IsObject(node))
            n = (size_t)snprintf(path + len, cap - len, "%s%s", len ? "." : "", json_key(c));
        else
            n = (size_t)snprintf(path + len, cap - len, "[%d]", i);
        size_t sub = len + n < cap ? len + n : cap - 1; /* a long path is cut */
        MOEC_TRY(json_unique_in(c, file, path, sub, cap));
        path[len] = '\0';
    }
    return MOEC_OK;
}

moec_status moec_json_check_unique(const cJSON *root, const char *file)
{
    char path[512] = "";
    return root ? json_unique_in(root, file, path, 0, sizeof path) : MOEC_OK;
}

moec_json_int_result moec_json_int(const cJSON *it, double lo, double hi, int64_t *out)
{
    if (!cJSON_IsNumber(it))
        return MOEC_JSON_INT_NOT_INT;
    double d = it->valuedouble;
    if (!isfinite(d) || d != floor(d))
        return MOEC_JSON_INT_NOT_INT;
    if (lo < -MOEC_JSON_INT_MAX)
        lo = -MOEC_JSON_INT_MAX;
    if (hi > MOEC_JSON_INT_MAX)
        hi = MOEC_JSON_INT_MAX;
    if (!(d >= lo && d <= hi))
        return MOEC_JSON_INT_RANGE;
    *out = (int64_t)d;
    return MOEC_JSON_INT_OK;
}

/* An integer as such ("300", not "3e+02") up to 10^16, else the fewest %g
 * digits that read back to v. */
static void json_number(double v, char *buf, size_t cap)
{
    if (v == floor(v) && fabs(v) < 1e16) {
        snprintf(buf, cap, "%.0f", v);
        return;
    }
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, cap, "%.*g", prec, v);
        if (strtod(buf, NULL) == v)
            return;
    }
}

void moec_json_repr(const cJSON *it, char *buf, size_t cap)
{
    if (!it)
        snprintf(buf, cap, "nothing");
    else if (cJSON_IsNumber(it))
        json_number(it->valuedouble, buf, cap);
    else if (cJSON_IsString(it))
        snprintf(buf, cap, "\"%.120s\"", it->valuestring);
    else if (cJSON_IsBool(it))
        snprintf(buf, cap, "%s", cJSON_IsTrue(it) ? "true" : "false");
    else if (cJSON_IsNull(it))
        snprintf(buf, cap, "null");
    else if (cJSON_IsArray(it))
        snprintf(buf, cap, "[...]");
    else
        snprintf(buf, cap, "{...}");
}

const char *moec_json_kind(const cJSON *it)
{
    if (!it)
        return "nothing";
    if (cJSON_IsNull(it))
        return "null";
    if (cJSON_IsBool(it))
        return "a boolean";
    if (cJSON_IsNumber(it))
        return "a number";
    if (cJSON_IsString(it))
        return "a string";
    if (cJSON_IsArray(it))
        return "an array";
    return "an object";
}

size_t moec_json_string_bad_at(const char *b, size_t n, int *nul, long long *values)
{
    int in = 0;
    long long count = 0;
    size_t i;
    *nul = 0;
    for (i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)b[i];
        if (!in) {
            in = ch == '"';
            count += ch == ',' || ch == '[' || ch == '{';
        } else if (ch < 0x20) {
            break;
        } else if (ch == '"') {
            in = 0;
        } else if (ch == '\\' && i + 1 < n) {
            if (b[i + 1] == 'u' && i + 5 < n && !memcmp(b + i + 2, "0000", 4)) {
                *nul = 1;
                break;
            }
            i++; /* the escaped character */
        }
    }
    if (values)
        *values = count;
    return i;
}

moec_status moec_json_object_append(const char *text, size_t len, const char *member,
                                    const char *what, char **out)
{
    *out = NULL;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    int is_obj = root && cJSON_IsObject(root), empty = is_obj && !root->child;
    cJSON_Delete(root);
    if (!is_obj || !end || end <= text || end[-1] != '}')
        return MOEC_ERR(MOEC_ERR_FORMAT, "%s is not a JSON object", what);
    size_t keep = (size_t)(end - text) - 1; /* up to its closing brace */
    while (keep && strchr(" \t\r\n", text[keep - 1]))
        keep--;
    size_t n = strlen(member);
    char *s = malloc(keep + n + 8);
    if (!s)
        return MOEC_ERR(MOEC_ERR_OOM, "out of memory writing %s", what);
    memcpy(s, text, keep);
    snprintf(s + keep, n + 8, "%s\n  %s\n}\n", empty ? "" : ",", member);
    *out = s;
    return MOEC_OK;
}
