/* json.h — what every reader of JSON (config.json, generation_config.json,
 * safetensors headers and index, plan headers) shares on top of cJSON:
 * duplicate keys refused (cJSON's lookups find the first, Python's json and
 * so transformers keep the last: the same file would mean two models), and
 * integers range-checked as doubles before any conversion, so that an error
 * shows the value the file holds. */
#ifndef MOEC_COMMON_JSON_H
#define MOEC_COMMON_JSON_H

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

#include "moec.h"

/* MOEC_ERR_FORMAT naming file and the key's path ("rope_scaling.factor")
 * when any object of the tree holds a key twice. */
moec_status moec_json_check_unique(const cJSON *root, const char *file);

/* Integers a double holds exactly: a JSON integer beyond them is not one. */
#define MOEC_JSON_INT_MAX 9007199254740992.0 /* 2^53 */

typedef enum moec_json_int_result {
    MOEC_JSON_INT_OK = 0,
    MOEC_JSON_INT_NOT_INT, /* absent, not a number, or a fraction */
    MOEC_JSON_INT_RANGE,   /* an integer outside [lo, hi] */
} moec_json_int_result;

/* *out gets it as an integer when it is a number with no fraction in
 * [lo, hi] (within +-2^53). */
moec_json_int_result moec_json_int(const cJSON *it, double lo, double hi, int64_t *out);

/* The value as the file writes it, shortened: a number in the fewest digits
 * that read back to it ("1e+30", "64"), a string quoted, "[...]", "{...}",
 * or "nothing" for NULL. */
void moec_json_repr(const cJSON *it, char *buf, size_t cap);
/* "a number", "a string", "an array", ... ("nothing" for NULL). */
const char *moec_json_kind(const cJSON *it);

/* The first byte of b[0..n) inside a JSON string that is a raw control
 * character (< 0x20, which JSON requires escaped) or the backslash of a
 * \u0000 escape (*nul = 1): cJSON keeps strings NUL-terminated, so a NUL
 * would silently cut a prompt, a message, a stop string or an id. n when
 * there is none. *values (unless NULL) counts the containers and the commas
 * outside strings (the scan's share: up to the bad byte), about the values
 * cJSON would make. */
size_t moec_json_string_bad_at(const char *b, size_t n, int *nul, long long *values);

/* The JSON object text[0..len) with member (`"key": value`) added last,
 * into *out (malloc'd, NUL-terminated): every byte before the object's
 * closing brace kept as it is, not parsed and printed again (cJSON writes
 * 0.0 as 0, and transformers refuses an integer for a float field such as
 * attention_dropout). MOEC_ERR_FORMAT naming what when it is not an
 * object. */
moec_status moec_json_object_append(const char *text, size_t len, const char *member,
                                    const char *what, char **out);

#endif
