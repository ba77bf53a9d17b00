/* tokenizer.h — internals shared by runtime/tokenizer*.c: a model folder's
 * tokenizer.json (Hugging Face `tokenizers` format, byte-level BPE) loaded
 * into flat tables, and the steps that encode text with them in the order
 * `tokenizers` runs them: added tokens, normalizer, pre-tokenizers, BPE,
 * post-processor. The public API is moec_tokenizer_* and moec_detokenizer_*
 * in include/moec.h; docs/TOKENIZER.md says what is supported. */
#ifndef MOEC_RT_TOKENIZER_H
#define MOEC_RT_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "moec.h"

/* Bounds that keep hostile files and inputs from taking unbounded memory
 * or time (docs/TOKENIZER.md). */
#define TOK_MAX_FILE_BYTES ((size_t)128 << 20) /* tokenizer.json */
#define TOK_MAX_JSON_VALUES ((size_t)8 << 20)  /* cJSON nodes: ~80 bytes each */
#define TOK_MAX_JSON_DEPTH 64                  /* tokenizer.json nests ~6 deep */
#define TOK_MAX_ID ((1 << 22) - 1)             /* ids index a dense table */
#define TOK_MAX_TOKEN_BYTES 4096               /* one vocab entry or added token */
#define TOK_MAX_ADDED_BYTES ((size_t)4 << 20)  /* all added tokens (a trie node per byte) */
#define TOK_MAX_STEPS 64                       /* pre-tokenizers, Sequences flattened */
#define TOK_MAX_NESTING 8                      /* Sequence in Sequence */
#define TOK_MAX_TEXT_BYTES ((size_t)16 << 20)  /* one encode call: its pieces take ~16x */
#define TOK_REGEX_MATCH_LIMIT 10000000u        /* PCRE2 backtracking per match attempt */
#define TOK_REGEX_HEAP_KIB (64u * 1024)        /* PCRE2 backtracking memory */
/* Regex steps (pattern items visited, counted by PCRE2 callouts) one encode
 * call may take: base + per byte of text. The published patterns take a
 * few per byte; a pattern such as DeepSeek-V2's \s+$ is quadratic on a long
 * run of spaces (in Oniguruma too), and is stopped by this budget. */
#define TOK_REGEX_STEPS_BASE 10000000ll
#define TOK_REGEX_STEPS_PER_BYTE 200ll

/* Room for element n of an array at p of *cap elements of elem bytes
 * (doubling): the array, moved maybe, or NULL out of memory (p kept). */
void *tok_grow(void *p, size_t n, size_t *cap, size_t elem);

/* A growing byte buffer. */
typedef struct tok_buf {
    char *p;
    size_t len, cap;
} tok_buf;
int tok_buf_reserve(tok_buf *b, size_t extra); /* 0, or -1 out of memory */
int tok_buf_put(tok_buf *b, const void *s, size_t n);
void tok_buf_free(tok_buf *b);

/* A string -> int32 hash map that owns copies of its keys. */
typedef struct tok_map {
    tok_buf keys;
    struct tok_map_entry {
        size_t off;
        uint32_t len;
        int32_t val;
    } *e;
    size_t n, cap;
    uint32_t *slots; /* entry index + 1; 0 is empty */
    size_t mask;     /* slot count - 1, a power of two */
} tok_map;
/* 0 when added, 1 when the key was present (its value kept), -1 out of memory. */
int tok_map_put(tok_map *m, const char *s, size_t n, int32_t val);
int32_t tok_map_get(const tok_map *m, const char *s, size_t n); /* -1 when absent */
void tok_map_free(tok_map *m);

/* BPE merges: (left id, right id) -> (rank, merged id). */
typedef struct tok_merges {
    uint64_t *key; /* (left << 32 | right) + 1; 0 is empty */
    uint32_t *rank;
    int32_t *id;
    size_t mask;
} tok_merges;
int tok_merges_init(tok_merges *m, size_t count); /* 0, or -1 out of memory */
/* A later rule for the same pair replaces the earlier one, as in tokenizers. */
void tok_merges_put(tok_merges *m, int32_t a, int32_t b, uint32_t rank, int32_t id);
int tok_merges_get(const tok_merges *m, int32_t a, int32_t b, uint32_t *rank, int32_t *id);
void tok_merges_free(tok_merges *m);

/* Added tokens, found by byte trie (leftmost-longest, as tokenizers' Aho-Corasick). */
typedef struct tok_added {
    int32_t id;
    uint8_t single_word, lstrip, rstrip, normalized, special;
} tok_added;
typedef struct tok_trie {
    struct tok_trie_node {
        int32_t child, next; /* first child, next sibling; -1 none */
        int32_t added;       /* index into tok->added ending here; -1 none */
        unsigned char byte;
    } *v;
    size_t n, cap;
    int32_t root[256]; /* the root's children by byte (faster first step) */
} tok_trie;
void tok_trie_init(tok_trie *t);
/* 0 when added, 1 when s is already in the trie, -1 out of memory. */
int tok_trie_add(tok_trie *t, const char *s, size_t n, int32_t added);
/* The longest token that s[0..n) starts with: its index, length in *len; -1 none. */
int32_t tok_trie_longest(const tok_trie *t, const char *s, size_t n, size_t *len);
void tok_trie_free(tok_trie *t);

typedef enum tok_behavior {
    TOK_REMOVED, TOK_ISOLATED, TOK_MERGED_PREV, TOK_MERGED_NEXT, TOK_CONTIGUOUS,
} tok_behavior;

typedef enum tok_step_kind { TOK_STEP_SPLIT, TOK_STEP_BYTE_LEVEL } tok_step_kind;

/* One pre-tokenizer. Split and Digits are both SPLIT (Digits: \p{N},
 * Isolated or Contiguous); ByteLevel optionally prefixes a space and splits
 * with GPT-2's regex, then maps every byte to its character. */
typedef struct tok_step {
    tok_step_kind kind;
    pcre2_code *re; /* SPLIT */
    tok_behavior behavior;
    int invert;
    int add_prefix_space, use_regex; /* BYTE_LEVEL */
} tok_step;

/* What the decoder gives each id, and whether the id is special. */
typedef struct tok_idinfo {
    uint32_t off, len; /* into moec_tokenizer.dec */
    uint8_t present, special;
} tok_idinfo;

struct moec_tokenizer {
    char *path; /* tokenizer.json, for messages */

    /* the BPE model */
    tok_map vocab;
    tok_merges merges;
    int ignore_merges, fuse_unk;
    int32_t unk_id; /* -1: characters missing from the vocab are dropped */

    int nfc; /* the normalizer: NFC, or none */
    tok_step steps[TOK_MAX_STEPS];
    int n_steps;
    pcre2_code *gpt2_re; /* ByteLevel's use_regex pattern */
    pcre2_code *word_re; /* one \w character as Rust's regex reads it (single_word) */

    tok_added *added;
    int n_added;
    tok_trie raw_trie, norm_trie; /* matched before / after normalization */
    tok_map added_ids;           /* content -> id */
    /* tokenizer_config.json's split_special_tokens: special added tokens
     * are not cut out of the text but encoded as text (transformers sets
     * tokenizers' encode_special_tokens from it) */
    int split_special;

    int32_t *prefix, *suffix; /* the post-processor's ids around the text */
    int n_prefix, n_suffix;

    tok_idinfo *ids;
    int32_t n_ids; /* largest id + 1 */
    tok_buf dec;

    int32_t bos_id, eos_id; /* tokenizer_config.json's, -1 when none */
    char *bos_token, *eos_token; /* their text, NULL when none */

    /* The chat template: chat_template.jinja's when the folder has one (it
     * wins, as in transformers), else tokenizer_config.json's chat_template
     * (a string, or the entry named "default" of a list); NULL when none,
     * with chat_template_missing saying why when the list has no default. */
    char *chat_template;
    char *chat_template_missing;
};

/* ---- text (tokenizer_text.c) ------------------------------------------------ */

/* The UTF-8 sequence at s[0..n), n >= 1: its length (1-4) with its code
 * point in *cp; or, where s does not start a valid sequence, minus the
 * length of its maximal subpart (the bytes one U+FFFD replaces, as Python's
 * "replace", Rust's from_utf8_lossy and WHATWG do), with *cut set when that
 * subpart is a valid beginning that the end of s cut off. */
int tok_utf8_next(const unsigned char *s, size_t n, uint32_t *cp, int *cut);
/* Appends s[0..n) to out with each maximal invalid subpart replaced by
 * U+FFFD. Unless `final`, a valid beginning cut off by the end of s is left
 * out (the next bytes may complete it); *used gets the bytes consumed. */
int tok_utf8_lossy(const unsigned char *s, size_t n, int final, tok_buf *out, size_t *used);
int tok_utf8_put(uint32_t cp, char out[4]); /* the length */

/* GPT-2's byte-level alphabet: the character standing for byte b, and the
 * byte a character stands for (-1 when it is not one of the 256). */
uint32_t tok_byte_char(unsigned b);
int tok_char_byte(uint32_t cp);

/* Compiles a tokenizer.json pattern to match as tokenizers' Oniguruma does
 * (a Regex pattern; `literal` for a String pattern); NULL with the reason
 * in msg when it is refused or does not compile. */
pcre2_code *tok_regex_compile(const char *pat, size_t len, int literal, char *msg, size_t cap);

/* Ranges [start, end) with a flag, for regex matches and split pieces. */
typedef struct tok_range {
    size_t start, end;
    int flag;
} tok_range;
typedef struct tok_ranges {
    tok_range *v;
    size_t n, cap;
} tok_ranges;
int tok_ranges_push(tok_ranges *r, size_t start, size_t end, int flag);

/* What one encode call matches regexes with: its match data, and a match
 * context holding the limits and the step budget its callout counts down. */
typedef struct tok_regex_run {
    pcre2_match_data *md;
    pcre2_match_context *mc;
    long long budget, left;
} tok_regex_run;
int tok_regex_run_init(tok_regex_run *run, size_t text_len); /* 0, or -1 out of memory */
void tok_regex_run_free(tok_regex_run *run);
/* pcre2_match from `from` (s is valid UTF-8; from at a character). */
int tok_regex_match(tok_regex_run *run, const pcre2_code *re, const char *s, size_t n, size_t from,
                    uint32_t options);

/* The pieces a Split pre-tokenizer cuts s[0..n) into (n >= 1), as tokenizers'
 * NormalizedString::split: matches found as Oniguruma's find_iter finds them
 * (an empty match right after the previous match is skipped), the gaps
 * between them, `invert` and the behavior applied. out gets the kept pieces,
 * empty ones included (the caller drops them). */
moec_status tok_split(const moec_tokenizer_t *t, const tok_step *st, const char *s, size_t n,
                      tok_regex_run *run, tok_ranges *scratch, tok_ranges *out);

/* s[0..n) in Unicode Normalization Form C (utf8proc): *same when it is
 * already, else the normalized text appended to out (s may point into out). */
moec_status tok_nfc(const char *s, size_t n, tok_buf *out, int *same);

/* Rust's char::is_whitespace (the White_Space property). */
int tok_is_white_space(uint32_t cp);

/* ---- the BPE model (tokenizer_bpe.c) ---------------------------------------- */

typedef struct tok_ids {
    int32_t *v;
    size_t n, cap;
} tok_ids;
int tok_ids_push(tok_ids *ids, int32_t id);

typedef struct tok_bpe_scratch {
    struct tok_symbol {
        int32_t id, prev, next;
        uint32_t len; /* bytes; 0 once merged into its left neighbour */
    } *sym;
    size_t sym_cap;
    struct tok_heap_entry {
        uint32_t rank, pos;
        int32_t id;
    } *heap;
    size_t heap_n, heap_cap;
} tok_bpe_scratch;
void tok_bpe_scratch_free(tok_bpe_scratch *sc);

/* Appends the ids of one pre-tokenized piece s[0..n) (valid UTF-8) to out. */
moec_status tok_bpe(const moec_tokenizer_t *t, const char *s, size_t n, tok_bpe_scratch *sc,
                    tok_ids *out);

/* ---- loading (tokenizer_load.c) --------------------------------------------- */

/* The id of a token's text: an added token's, else the vocab's; -1 when neither. */
int32_t tok_token_id(const moec_tokenizer_t *t, const char *s, size_t n);

/* A file beside tokenizer.json: its text (NULL when the folder has none),
 * length and path. */
typedef struct tok_file {
    char *text, *path;
    size_t len;
} tok_file;

/* A tokenizer with nothing loaded yet (tok_load fills it): path names
 * tokenizer.json in messages. */
moec_status tok_new(const char *path, moec_tokenizer_t **out);

/* Fills t from the text of tokenizer.json (t->path names it) and the files
 * beside it: tokenizer_config.json (its special tokens, bos_token /
 * eos_token, added_tokens_decoder and chat_template), special_tokens_map.json
 * (its special tokens replace tokenizer_config.json's) and added_tokens.json
 * (checked against tokenizer.json's added tokens). */
moec_status tok_load(moec_tokenizer_t *t, const char *json, size_t len, const tok_file *config,
                     const tok_file *map, const tok_file *added);

#endif
