/* fuzz_tokenizer.c — libFuzzer target: every input is a model folder's
 * tokenizer files and a text, cut at lines "--8<--": tokenizer.json, then
 * tokenizer_config.json, special_tokens_map.json and added_tokens.json
 * (each absent where the input has fewer parts or the part is empty), then
 * the text. tok_load reads them as moec_tokenizer_open does; a tokenizer it
 * accepts encodes the text with and without the special tokens, and the
 * ids decode (skipping the special ones or not) at once and streamed, and
 * the two must agree. The only acceptable outcomes are MOEC_OK or an error
 * of a bad file (format, unsupported, capacity, out of memory); a crash, a
 * sanitizer report, a leak or another error is a bug. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char CUT[] = "\n--8<--\n";
enum { N_PARTS = 5 };

static int bad_file(moec_status st)
{
    return st == MOEC_ERR_FORMAT || st == MOEC_ERR_UNSUPPORTED || st == MOEC_ERR_CAPACITY ||
           st == MOEC_ERR_OOM;
}

/* The ids' text decoded at once and streamed one id at a time: the same. */
static void decode_both(const moec_tokenizer_t *t, const int32_t *ids, int n, int skip)
{
    char *text = NULL;
    size_t len = 0;
    moec_status st = moec_tokenizer_decode(t, ids, n, skip, &text, &len);
    if (st != MOEC_OK) {
        if (st != MOEC_ERR_OOM)
            __builtin_trap();
        return;
    }
    moec_detokenizer_t *d = NULL;
    char *streamed = malloc(len + 1);
    size_t got = 0;
    st = streamed ? moec_detokenizer_init(t, skip, &d) : MOEC_ERR_OOM;
    for (int i = 0; st == MOEC_OK && i <= n; i++) {
        const char *piece = NULL;
        size_t k = 0;
        st = i < n ? moec_detokenizer_push(d, ids[i], &piece, &k)
                   : moec_detokenizer_finish(d, &piece, &k);
        if (st == MOEC_OK && got + k > len)
            __builtin_trap(); /* more streamed than decoded */
        if (st == MOEC_OK && k)
            memcpy(streamed + got, piece, k);
        got += st == MOEC_OK ? k : 0;
    }
    if (st == MOEC_OK && (got != len || memcmp(streamed, text, len) != 0))
        __builtin_trap(); /* the stream and the decode disagree */
    if (st != MOEC_OK && st != MOEC_ERR_OOM)
        __builtin_trap();
    moec_detokenizer_free(d);
    free(streamed);
    free(text);
}

/* The files' texts loaded and, when they make a tokenizer, the text
 * encoded and its ids decoded. */
static void run(char *const *text, const size_t *len)
{
    tok_file cfg = {text[1], "fuzz/tokenizer_config.json", len[1]};
    tok_file map = {text[2], "fuzz/special_tokens_map.json", len[2]};
    tok_file added = {text[3], "fuzz/added_tokens.json", len[3]};
    moec_tokenizer_t *t = NULL;
    moec_status st = tok_new("fuzz/tokenizer.json", &t);
    if (st == MOEC_OK)
        st = tok_load(t, text[0], len[0], &cfg, &map, &added);
    if (st != MOEC_OK) {
        moec_tokenizer_free(t);
        if (!bad_file(st))
            __builtin_trap(); /* a bad file is one of those errors, nothing else */
        return;
    }
    for (int special = 0; special < 2; special++) {
        int32_t *ids = NULL;
        int n = 0;
        st = moec_tokenizer_encode(t, text[4] ? text[4] : "", len[4], special, &ids, &n);
        if (st == MOEC_OK) {
            decode_both(t, ids, n, 0);
            decode_both(t, ids, n, 1);
        } else if (st != MOEC_ERR_CAPACITY && st != MOEC_ERR_OOM) {
            __builtin_trap(); /* any text encodes, within the step budget */
        }
        free(ids);
    }
    moec_tokenizer_free(t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *part[N_PARTS] = {0};
    size_t len[N_PARTS] = {0};
    const char *at = (const char *)data, *end = at + size;
    for (int i = 0; i < N_PARTS && at; i++) {
        const char *cut = i + 1 < N_PARTS ? memmem(at, (size_t)(end - at), CUT, sizeof CUT - 1)
                                          : NULL;
        part[i] = at;
        len[i] = (size_t)((cut ? cut : end) - at);
        at = cut ? cut + sizeof CUT - 1 : NULL;
    }
    /* the files' texts as moec_tokenizer_open reads them: NUL-terminated */
    char *text[N_PARTS] = {0};
    int ok = 1;
    for (int i = 0; i < N_PARTS && ok; i++)
        if (part[i] && (len[i] || i == 0) && (ok = (text[i] = malloc(len[i] + 1)) != NULL)) {
            memcpy(text[i], part[i], len[i]);
            text[i][len[i]] = '\0';
        }
    if (ok)
        run(text, len);
    for (int i = 0; i < N_PARTS; i++)
        free(text[i]);
    return 0;
}
