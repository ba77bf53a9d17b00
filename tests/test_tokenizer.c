/* test_tokenizer.c — the tokenizer against Hugging Face tokenizers: every
 * fixture of tests/data/tokenizers/ (scripts/make_tokenizers.py) encodes
 * and decodes its goldens exactly, the streaming decoder's chunks are valid
 * UTF-8 and concatenate to the full decode, and every tokenizer.json moec
 * cannot honour is refused with its exact error. */
#include <cjson/cJSON.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "testlib.h"

/* ---- helpers ------------------------------------------------------------------ */

static unsigned char *unhex(const char *hex, size_t *len)
{
    size_t n = strlen(hex) / 2;
    unsigned char *b = malloc(n + 1);
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        sscanf(hex + 2 * i, "%2x", &v);
        b[i] = (unsigned char)v;
    }
    b[n] = 0;
    *len = n;
    return b;
}

/* Well-formed UTF-8 (Unicode's table 3-7), written apart from the library's. */
static int valid_utf8(const unsigned char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        unsigned b = s[i], need = b < 0x80 ? 1 : b >= 0xc2 && b <= 0xdf ? 2 : b >= 0xe0 && b <= 0xef ? 3
                                           : b >= 0xf0 && b <= 0xf4 ? 4 : 0;
        if (!need || i + need > n)
            return 0;
        unsigned lo = b == 0xe0 ? 0xa0 : b == 0xf0 ? 0x90 : 0x80;
        unsigned hi = b == 0xed ? 0x9f : b == 0xf4 ? 0x8f : 0xbf;
        for (unsigned k = 1; k < need; k++, lo = 0x80, hi = 0xbf)
            if (s[i + k] < lo || s[i + k] > hi)
                return 0;
        i += need;
    }
    return 1;
}

static int32_t *json_ids(const cJSON *a, int *n)
{
    *n = cJSON_GetArraySize(a);
    int32_t *ids = malloc(((size_t)*n + 1) * sizeof *ids);
    int i = 0;
    for (const cJSON *e = a->child; e; e = e->next)
        ids[i++] = (int32_t)e->valuedouble;
    return ids;
}

static void print_ids(const char *what, const int32_t *ids, int n)
{
    fprintf(stderr, "  %s (%d):", what, n);
    for (int i = 0; i < n && i < 40; i++)
        fprintf(stderr, " %d", (int)ids[i]);
    fprintf(stderr, n > 40 ? " ...\n" : "\n");
}

/* ---- the goldens ---------------------------------------------------------------- */

/* One encode golden: texts[c.text] encoded with c.add_special gives c.ids. */
static int check_encode(const moec_tokenizer_t *tok, const char *name, const cJSON *texts,
                        const cJSON *c)
{
    size_t len;
    const char *hex = cJSON_GetArrayItem(texts, cJSON_GetObjectItem(c, "text")->valueint)->valuestring;
    unsigned char *text = unhex(hex, &len);
    int add = cJSON_IsTrue(cJSON_GetObjectItem(c, "add_special"));
    int n_want, n_got = -1, ok = 0;
    int32_t *want = json_ids(cJSON_GetObjectItem(c, "ids"), &n_want), *got = NULL;
    T_OK(moec_tokenizer_encode(tok, (const char *)text, len, add, &got, &n_got));
    ok = got && n_got == n_want && memcmp(got, want, (size_t)n_want * sizeof *got) == 0;
    T_CHECK(ok);
    if (!ok) {
        fprintf(stderr, "%s: encode(add_special=%d) of \"%.*s\" (hex %s) differs\n", name, add,
                (int)(len > 80 ? 80 : len), text, hex);
        print_ids("want", want, n_want);
        if (got)
            print_ids("got ", got, n_got);
    }
    free(text);
    free(want);
    free(got);
    return ok;
}

/* The stream of ids, one push at a time: every chunk valid UTF-8, all of
 * them together the full decode. */
static int check_stream(const moec_tokenizer_t *tok, const int32_t *ids, int n, int skip,
                        const unsigned char *want, size_t want_len)
{
    moec_detokenizer_t *d = NULL;
    T_OK(moec_detokenizer_init(tok, skip, &d));
    char *all = malloc(want_len * 3 + 64);
    size_t at = 0;
    int ok = d != NULL;
    for (int i = 0; ok && i <= n; i++) {
        const char *chunk = NULL;
        size_t len = 0;
        moec_status st = i < n ? moec_detokenizer_push(d, ids[i], &chunk, &len)
                               : moec_detokenizer_finish(d, &chunk, &len);
        ok = st == MOEC_OK && valid_utf8((const unsigned char *)chunk, len) &&
             strlen(chunk) <= len && at + len <= want_len;
        if (ok) {
            memcpy(all + at, chunk, len);
            at += len;
        }
    }
    ok = ok && at == want_len && memcmp(all, want, want_len) == 0;
    free(all);
    moec_detokenizer_free(d);
    return ok;
}

static int check_decode(const moec_tokenizer_t *tok, const char *name, const cJSON *c)
{
    int n, skip = cJSON_IsTrue(cJSON_GetObjectItem(c, "skip_special"));
    int32_t *ids = json_ids(cJSON_GetObjectItem(c, "ids"), &n);
    size_t want_len, got_len = 0;
    unsigned char *want = unhex(cJSON_GetObjectItem(c, "text")->valuestring, &want_len);
    char *got = NULL;
    T_OK(moec_tokenizer_decode(tok, ids, n, skip, &got, &got_len));
    int ok = got && got_len == want_len && memcmp(got, want, want_len) == 0 && got[got_len] == 0;
    T_CHECK(ok);
    if (!ok) {
        fprintf(stderr, "%s: decode(skip_special=%d) differs: want \"%s\" got \"%s\"\n", name, skip,
                (char *)want, got ? got : "(null)");
        print_ids("ids", ids, n);
    }
    int streamed = check_stream(tok, ids, n, skip, want, want_len);
    T_CHECK(streamed);
    if (!streamed)
        fprintf(stderr, "%s: the streamed decode of the ids above differs\n", name);
    free(ids);
    free(want);
    free(got);
    return ok && streamed;
}

static void test_goldens(void)
{
    char *text = t_read_file(t_src("tests/data/tokenizers/goldens.json"), NULL);
    cJSON *root = cJSON_Parse(text);
    T_CHECK(root != NULL);
    const cJSON *all = cJSON_GetObjectItem(root, "tokenizers"), *texts = cJSON_GetObjectItem(root, "texts");
    int fixtures = 0;
    for (const cJSON *f = all ? all->child : NULL; f; f = f->next, fixtures++) {
        char rel[256];
        snprintf(rel, sizeof rel, "tests/data/tokenizers/%s", f->string);
        moec_tokenizer_t *tok = NULL;
        T_OK(moec_tokenizer_open(t_src(rel), &tok));
        if (!tok)
            continue;
        int enc = 0, dec = 0, enc_ok = 0, dec_ok = 0;
        for (const cJSON *c = cJSON_GetObjectItem(f, "encode")->child; c; c = c->next, enc++)
            enc_ok += check_encode(tok, f->string, texts, c);
        for (const cJSON *c = cJSON_GetObjectItem(f, "decode")->child; c; c = c->next, dec++)
            dec_ok += check_decode(tok, f->string, c);
        printf("%-12s encode %d/%d, decode + stream %d/%d\n", f->string, enc_ok, enc, dec_ok, dec);
        moec_tokenizer_free(tok);
    }
    T_CHECK(fixtures >= 8);
    cJSON_Delete(root);
    free(text);
}

/* ---- behaviour beyond the goldens ------------------------------------------------- */

static moec_tokenizer_t *open_fixture(const char *name)
{
    char rel[256];
    snprintf(rel, sizeof rel, "tests/data/tokenizers/%s", name);
    moec_tokenizer_t *tok = NULL;
    T_OK(moec_tokenizer_open(t_src(rel), &tok));
    if (!tok) {
        fprintf(stderr, "cannot open fixture %s\n", name);
        exit(1);
    }
    return tok;
}

static void test_lookups(void)
{
    moec_tokenizer_t *q = open_fixture("qwen2"), *d = open_fixture("deepseek_v3");
    T_CHECK(moec_tokenizer_token_id(q, "<|im_start|>") == 701);
    T_CHECK(moec_tokenizer_token_id(q, "<think>") == 706);
    T_CHECK(moec_tokenizer_token_id(q, "a") >= 0);
    T_CHECK(moec_tokenizer_token_id(q, "no such token") == -1);
    T_CHECK(moec_tokenizer_bos_id(q) == -1);
    T_CHECK(moec_tokenizer_eos_id(q) == 702); /* <|im_end|> */
    T_CHECK(moec_tokenizer_id_count(q) == 708);
    T_CHECK(moec_tokenizer_bos_id(d) == 0);
    T_CHECK(moec_tokenizer_eos_id(d) == 1);
    /* the BOS of the post-processor's template comes only with add_special_tokens */
    int32_t *ids = NULL;
    int n = -1;
    T_OK(moec_tokenizer_encode(d, NULL, 0, 1, &ids, &n));
    T_CHECK(n == 1 && ids && ids[0] == 0);
    free(ids);
    T_OK(moec_tokenizer_encode(d, NULL, 0, 0, &ids, &n));
    T_CHECK(n == 0 && ids != NULL);
    free(ids);
    moec_tokenizer_free(q);
    moec_tokenizer_free(d);
}

/* decode(encode(text)) gives text back for any valid UTF-8 in NFC, long
 * runs included (the regexes never give up on them): n bytes of each. */
static void test_round_trip(size_t n)
{
    moec_tokenizer_t *tok = open_fixture("qwen2");
    char *text = malloc(n + 1);
    const char *fill[] = {" ", "a", "\n", "1", "\xe4\xb8\x80", "! ", "'s"};
    for (size_t f = 0; f < sizeof fill / sizeof *fill; f++) {
        size_t k = strlen(fill[f]), len = n - n % k;
        for (size_t i = 0; i < len; i += k)
            memcpy(text + i, fill[f], k);
        int32_t *ids = NULL;
        int m = 0;
        char *back = NULL;
        size_t back_len = 0;
        T_OK(moec_tokenizer_encode(tok, text, len, 0, &ids, &m));
        T_OK(moec_tokenizer_decode(tok, ids, m, 0, &back, &back_len));
        T_CHECK(back && back_len == len && memcmp(back, text, len) == 0);
        free(ids);
        free(back);
    }
    free(text);
    moec_tokenizer_free(tok);
}

/* A regex that backtracks quadratically (DeepSeek-V2's \s+$ on a long run
 * of spaces before an emoji) is stopped by the step budget, not left to
 * run for minutes; the published Qwen and DeepSeek-V3 patterns take the
 * same text in stride. */
static void test_step_budget(void)
{
    size_t n = 20000;
    char *text = malloc(n + 8);
    memset(text, ' ', n);
    memcpy(text + n, "\xf0\x9f\x98\x80", 4);
    moec_tokenizer_t *v2 = open_fixture("deepseek_v2"), *q = open_fixture("qwen2");
    moec_tokenizer_t *v3 = open_fixture("deepseek_v3");
    int32_t *ids = NULL;
    int m = 0;
    T_ERR(moec_tokenizer_encode(v2, text, n + 4, 1, &ids, &m), MOEC_ERR_CAPACITY,
          "deepseek_v2/tokenizer.json: the pre-tokenizer regexes took more than the 14000800 steps "
          "this text allows (one backtracks too much on a 20004-byte piece)");
    T_CHECK(ids == NULL);
    T_OK(moec_tokenizer_encode(q, text, n + 4, 1, &ids, &m));
    free(ids);
    T_OK(moec_tokenizer_encode(v3, text, n + 4, 1, &ids, &m));
    free(ids);
    moec_tokenizer_free(v2);
    moec_tokenizer_free(q);
    moec_tokenizer_free(v3);
    free(text);
}

static void test_api_errors(void)
{
    moec_tokenizer_t *tok = open_fixture("qwen2");
    int32_t *ids = NULL, bad[] = {5, -3};
    int n;
    char *text = NULL;
    size_t len;
    moec_detokenizer_t *d = NULL;
    const char *chunk;
    T_ERR(moec_tokenizer_open(NULL, &tok), MOEC_ERR_INVALID_ARG, "NULL argument");
    T_ERR(moec_tokenizer_encode(tok, NULL, 3, 1, &ids, &n), MOEC_ERR_INVALID_ARG, "NULL argument");
    T_ERR(moec_tokenizer_encode(tok, "abc", 3, 1, NULL, &n), MOEC_ERR_INVALID_ARG, "NULL argument");
    T_ERR(moec_tokenizer_encode(tok, "abc", (size_t)1 << 31, 1, &ids, &n), MOEC_ERR_CAPACITY,
          "a text of 2147483648 bytes is more than the 16777216 one encode call takes");
    T_ERR(moec_tokenizer_decode(tok, bad, 2, 0, &text, &len), MOEC_ERR_INVALID_ARG,
          "cannot decode the negative id -3");
    T_CHECK(text == NULL);
    T_ERR(moec_tokenizer_decode(tok, bad, -1, 0, &text, &len), MOEC_ERR_INVALID_ARG,
          "negative count");
    T_OK(moec_detokenizer_init(tok, 0, &d));
    T_ERR(moec_detokenizer_push(d, -1, &chunk, &len), MOEC_ERR_INVALID_ARG,
          "cannot decode the negative id -1");
    T_CHECK(len == 0 && strcmp(chunk, "") == 0);
    moec_detokenizer_free(d);
    moec_tokenizer_free(tok);
}

/* ---- refused tokenizer.json files ---------------------------------------------------- */

static const char *g_dir;

static void write_dir(const char *json, const char *config)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/tokenizer.json", g_dir);
    t_write_file(path, json, strlen(json));
    snprintf(path, sizeof path, "%s/tokenizer_config.json", g_dir);
    if (config)
        t_write_file(path, config, strlen(config));
    else
        unlink(path);
}

/* tokenizer.json (and tokenizer_config.json) that must fail with st and an
 * error containing needle. */
static void refused(int line, const char *json, const char *config, moec_status st, const char *needle)
{
    write_dir(json, config);
    moec_tokenizer_t *tok = NULL;
    t_expect_err(moec_tokenizer_open(g_dir, &tok), st, needle, json, __FILE__, line);
    T_CHECK(tok == NULL);
    moec_tokenizer_free(tok);
}
#define REFUSED(json, config, st, needle) refused(__LINE__, (json), (config), (st), (needle))

/* A small valid tokenizer.json with one part replaced: model, normalizer,
 * pre_tokenizer, post_processor, decoder, added_tokens. */
static char *variant(const char *part, const char *value)
{
    static const char *keys[] = {"model", "normalizer", "pre_tokenizer", "post_processor", "decoder",
                                 "added_tokens"};
    static const char *vals[] = {
        "{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2,\"\xc4\xa0\":3},\"merges\":[\"a b\"]}",
        "null",
        "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":true,\"use_regex\":true}",
        "null",
        "{\"type\":\"ByteLevel\"}",
        "[{\"id\":4,\"content\":\"<s>\",\"special\":true}]",
    };
    char *s = malloc(1 << 16);
    size_t at = (size_t)snprintf(s, 1 << 16, "{\"version\":\"1.0\"");
    for (int i = 0; i < 6; i++)
        at += (size_t)snprintf(s + at, (1 << 16) - at, ",\"%s\":%s", keys[i],
                               part && strcmp(part, keys[i]) == 0 ? value : vals[i]);
    snprintf(s + at, (1 << 16) - at, "}");
    return s;
}

static void refused_part(int line, const char *part, const char *value, moec_status st,
                         const char *needle)
{
    char *json = variant(part, value);
    refused(line, json, NULL, st, needle);
    free(json);
}
#define REFUSED_PART(part, value, st, needle) refused_part(__LINE__, (part), (value), (st), (needle))

static void test_refused_components(void)
{
    /* the variant itself is fine */
    char *good = variant(NULL, NULL);
    write_dir(good, NULL);
    moec_tokenizer_t *tok = NULL;
    T_OK(moec_tokenizer_open(g_dir, &tok));
    int32_t *ids = NULL;
    int n = 0;
    if (tok)
        T_OK(moec_tokenizer_encode(tok, "ab <s>a", 7, 1, &ids, &n));
    T_CHECK(n == 4 && ids && ids[0] == 2 && ids[1] == 3 && ids[2] == 4 && ids[3] == 0);
    free(ids);
    moec_tokenizer_free(tok);
    free(good);

    REFUSED_PART("model", "{\"type\":\"Unigram\",\"vocab\":[[\"a\",0.0]]}", MOEC_ERR_UNSUPPORTED,
                 "tokenizer.json: model.type: 'Unigram' is not supported (moec supports BPE)");
    REFUSED_PART("model", "{\"type\":\"WordPiece\",\"vocab\":{\"a\":0}}", MOEC_ERR_UNSUPPORTED,
                 "model.type: 'WordPiece' is not supported (moec supports BPE)");
    REFUSED_PART("model", "{\"type\":\"WordLevel\",\"vocab\":{\"a\":0}}", MOEC_ERR_UNSUPPORTED,
                 "model.type: 'WordLevel' is not supported");
    REFUSED_PART("model", "{\"vocab\":{\"a\":0}}", MOEC_ERR_UNSUPPORTED,
                 "model.type: '(none, and no merges)' is not supported");
    REFUSED_PART("normalizer", "{\"type\":\"NFKC\"}", MOEC_ERR_UNSUPPORTED,
                 "normalizer: type 'NFKC' is not supported (moec supports NFC and Sequence)");
    REFUSED_PART("normalizer", "{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"NFC\"},{\"type\":"
                 "\"Lowercase\"}]}",
                 MOEC_ERR_UNSUPPORTED, "normalizer.normalizers[1]: type 'Lowercase' is not supported");
    REFUSED_PART("pre_tokenizer", "{\"type\":\"Metaspace\",\"replacement\":\"_\"}", MOEC_ERR_UNSUPPORTED,
                 "pre_tokenizer: type 'Metaspace' is not supported (moec supports Split, Digits, "
                 "ByteLevel and Sequence)");
    REFUSED_PART("pre_tokenizer", "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"ByteLevel\"},"
                 "{\"type\":\"Whitespace\"}]}",
                 MOEC_ERR_UNSUPPORTED, "pre_tokenizer.pretokenizers[1]: type 'Whitespace' is not supported");
    REFUSED_PART("pre_tokenizer", "{\"type\":\"ByteLevel\",\"add_prefix_space\":\"yes\"}",
                 MOEC_ERR_FORMAT, "pre_tokenizer: add_prefix_space must be true or false");
    REFUSED_PART("pre_tokenizer", "{\"type\":\"ByteLevel\",\"trim_offsets\":1}", MOEC_ERR_FORMAT,
                 "pre_tokenizer: trim_offsets must be true or false");
    REFUSED_PART("pre_tokenizer", "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(a\"},\"behavior\":"
                 "\"Isolated\"}",
                 MOEC_ERR_UNSUPPORTED,
                 "pre_tokenizer: the pattern \"(a\" does not compile: missing closing parenthesis");
    REFUSED_PART("pre_tokenizer", "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"\\\\bx\"},\"behavior\":"
                 "\"Isolated\"}",
                 MOEC_ERR_UNSUPPORTED, "\\b (a word boundary: Oniguruma's words differ) is not supported");
    REFUSED_PART("pre_tokenizer", "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(?m:a.b)\"},\"behavior\":"
                 "\"Isolated\"}",
                 MOEC_ERR_UNSUPPORTED, "the inline option (?m) is not supported");
    REFUSED_PART("pre_tokenizer", "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"[a-z&&[^aeiou]]\"},"
                 "\"behavior\":\"Isolated\"}",
                 MOEC_ERR_UNSUPPORTED, "nested classes and class intersection (&&) are not supported");
    REFUSED_PART("pre_tokenizer", "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"[\\\\W]\"},\"behavior\":"
                 "\"Isolated\"}",
                 MOEC_ERR_UNSUPPORTED, "\\W inside a character class is not supported");
    REFUSED_PART("pre_tokenizer", "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"a\"},\"behavior\":"
                 "\"Bogus\"}",
                 MOEC_ERR_UNSUPPORTED, "behavior 'Bogus' is not one of Removed, Isolated");
    REFUSED_PART("pre_tokenizer", "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"a\",\"String\":\"b\"},"
                 "\"behavior\":\"Isolated\"}",
                 MOEC_ERR_FORMAT, "a Split pattern is either Regex or String");
    REFUSED_PART("post_processor", "{\"type\":\"RobertaProcessing\",\"sep\":[\"</s>\",2]}",
                 MOEC_ERR_UNSUPPORTED, "post_processor: type 'RobertaProcessing' is not supported");
    REFUSED_PART("post_processor", "{\"type\":\"TemplateProcessing\",\"single\":[{\"Sequence\":{\"id\":"
                 "\"A\"}},{\"Sequence\":{\"id\":\"B\"}}],\"special_tokens\":{}}",
                 MOEC_ERR_UNSUPPORTED, "the single template must hold sequence A once (and not B)");
    REFUSED_PART("post_processor", "{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":"
                 "{\"id\":\"<x>\"}},{\"Sequence\":{\"id\":\"A\"}}],\"special_tokens\":{}}",
                 MOEC_ERR_FORMAT, "special token '<x>' has no ids in special_tokens");
    REFUSED_PART("decoder", "{\"type\":\"WordPiece\",\"prefix\":\"##\"}", MOEC_ERR_UNSUPPORTED,
                 "decoder: type 'WordPiece' is not supported (moec supports ByteLevel)");
    REFUSED_PART("decoder", "null", MOEC_ERR_UNSUPPORTED,
                 "decoder: none: moec decodes byte-level BPE and needs the ByteLevel decoder");
}

static void test_refused_model(void)
{
    REFUSED_PART("model", "{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1},\"merges\":[\"a c\"]}",
                 MOEC_ERR_FORMAT, "model.merges[0]: 'c' is not in the vocab");
    REFUSED_PART("model", "{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1},\"merges\":[[\"a\",\"b\"]]}",
                 MOEC_ERR_FORMAT, "model.merges[0]: 'ab' is not in the vocab");
    REFUSED_PART("model", "{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2},\"merges\":[\"a b\","
                 "\"a  b\"]}",
                 MOEC_ERR_FORMAT, "model.merges[1]: 'a  b' is not two tokens joined by one space");
    REFUSED_PART("model", "{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[[\"a\"]]}", MOEC_ERR_FORMAT,
                 "model.merges[0]: a merge is \"a b\" or [\"a\", \"b\"]");
    REFUSED_PART("model", "{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":0},\"merges\":[]}", MOEC_ERR_FORMAT,
                 "model.vocab: id 0 is given to two tokens (one is 'b')");
    REFUSED_PART("model", "{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"a\":1},\"merges\":[]}", MOEC_ERR_FORMAT,
                 "model.vocab: 'a' appears twice");
    REFUSED_PART("model", "{\"type\":\"BPE\",\"vocab\":{\"a\":-1},\"merges\":[]}", MOEC_ERR_FORMAT,
                 "model.vocab: an id must be an integer from 0 to 4194303");
    REFUSED_PART("model", "{\"type\":\"BPE\",\"vocab\":{\"a\":4194304},\"merges\":[]}", MOEC_ERR_FORMAT,
                 "model.vocab: an id must be an integer from 0 to 4194303");
    REFUSED_PART("model", "{\"type\":\"BPE\",\"vocab\":{\"a\":1.5},\"merges\":[]}", MOEC_ERR_FORMAT,
                 "an id must be an integer");
    REFUSED_PART("model", "{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[],\"byte_fallback\":true}",
                 MOEC_ERR_UNSUPPORTED, "model.byte_fallback: true is not supported");
    REFUSED_PART("model", "{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[],\"dropout\":0.1}",
                 MOEC_ERR_UNSUPPORTED, "model.dropout: only null or 0 is supported");
    REFUSED_PART("model", "{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[],"
                 "\"continuing_subword_prefix\":\"##\"}",
                 MOEC_ERR_UNSUPPORTED, "model: continuing_subword_prefix '##' is not supported");
    REFUSED_PART("model", "{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[],\"end_of_word_suffix\":"
                 "\"</w>\"}",
                 MOEC_ERR_UNSUPPORTED, "model: end_of_word_suffix '</w>' is not supported");
    REFUSED_PART("model", "{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[],\"unk_token\":\"<unk>\"}",
                 MOEC_ERR_FORMAT, "model.unk_token: '<unk>' is not in the vocab");
    REFUSED_PART("model", "{\"type\":\"BPE\",\"vocab\":[],\"merges\":[]}", MOEC_ERR_FORMAT,
                 "model.vocab: must be a JSON object of token -> id");
    REFUSED_PART("model", "{\"type\":\"BPE\",\"vocab\":{\"a\":0}}", MOEC_ERR_FORMAT,
                 "model.merges: must be a JSON array");
    REFUSED_PART("added_tokens", "[{\"id\":7,\"content\":\"<s>\",\"special\":true}]", MOEC_ERR_FORMAT,
                 "added_tokens[0]: '<s>' has id 7, but tokenizers gives it id 4 (the next id after "
                 "the vocab)");
    REFUSED_PART("added_tokens", "[{\"id\":4,\"content\":\"ab\",\"special\":true}]", MOEC_ERR_FORMAT,
                 "added_tokens[0]: 'ab' has id 4, but tokenizers gives it id 2 (its id in the vocab)");
    REFUSED_PART("added_tokens", "[{\"id\":4,\"content\":\"<s>\"},{\"id\":5,\"content\":\"<s>\"}]",
                 MOEC_ERR_FORMAT, "added_tokens[1]: '<s>' is already an added token");
    REFUSED_PART("added_tokens", "[{\"content\":\"<s>\"}]", MOEC_ERR_FORMAT,
                 "added_tokens[0]: needs an id and a content");
    REFUSED_PART("added_tokens", "[{\"id\":4,\"content\":\"<s>\",\"lstrip\":\"no\"}]", MOEC_ERR_FORMAT,
                 "added_tokens[0]: lstrip must be true or false");
}

static void test_refused_files(void)
{
    char *good = variant(NULL, NULL), path[4200];
    REFUSED("{\"model\":", NULL, MOEC_ERR_FORMAT, "tokenizer.json: not valid JSON (at byte 8)");
    REFUSED("[1,2]", NULL, MOEC_ERR_FORMAT, "tokenizer.json: not a JSON object");
    /* hostile: deep nesting, many values, a huge token, a huge file */
    size_t deep = 2000;
    char *s = malloc(2 * deep + 64);
    memset(s, '[', deep);
    memset(s + deep, ']', deep);
    s[2 * deep] = 0;
    REFUSED(s, NULL, MOEC_ERR_CAPACITY, "tokenizer.json: JSON nested 2000 deep, more than the 64 "
                                        "moec reads");
    free(s);
    size_t values = (8u << 20) + 10;
    s = malloc(2 * values + 16);
    s[0] = '[';
    for (size_t i = 0; i < values; i++)
        memcpy(s + 1 + 2 * i, "0,", 2);
    memcpy(s + 2 * values, "0]", 3);
    REFUSED(s, NULL, MOEC_ERR_CAPACITY, "JSON values, more than the 8388608 moec reads");
    free(s);
    s = malloc(6000);
    memset(s, 'x', 5000);
    s[5000] = 0;
    char *json = malloc(7000);
    snprintf(json, 7000, "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"%s\":0},\"merges\":[]}}", s);
    REFUSED(json, NULL, MOEC_ERR_FORMAT, "model.vocab: a token of 5000 bytes (1 to 4096 allowed)");
    free(json);
    free(s);
    /* 1100 added tokens of 4000 bytes: more than the 4 MiB moec reads in all */
    json = malloc(6u << 20);
    size_t at = (size_t)sprintf(json, "{\"model\":{\"type\":\"BPE\",\"vocab\":{},\"merges\":[]},"
                                      "\"added_tokens\":[");
    for (int i = 0; i < 1100; i++) {
        at += (size_t)sprintf(json + at, "%s{\"id\":%d,\"content\":\"%04d", i ? "," : "", i, i);
        memset(json + at, 'y', 3996);
        at += 3996;
        at += (size_t)sprintf(json + at, "\"}");
    }
    sprintf(json + at, "],\"decoder\":{\"type\":\"ByteLevel\"}}");
    REFUSED(json, NULL, MOEC_ERR_CAPACITY, "added_tokens[1048]: added tokens of more than 4194304 "
                                           "bytes in all");
    free(json);
    write_dir(good, NULL);
    snprintf(path, sizeof path, "%s/tokenizer.json", g_dir);
    int fd = open(path, O_WRONLY);
    T_CHECK(fd >= 0 && ftruncate(fd, (off_t)200 << 20) == 0); /* sparse: nothing written */
    close(fd);
    moec_tokenizer_t *tok = NULL;
    T_ERR(moec_tokenizer_open(g_dir, &tok), MOEC_ERR_CAPACITY,
          "tokenizer.json: 209715200 bytes, more than the 134217728 moec reads");
    REFUSED("{\"model\":null,\"truncation\":{\"max_length\":5}}", NULL, MOEC_ERR_UNSUPPORTED,
            "tokenizer.json: truncation: is not supported (it must be null)");
    /* tokenizer_config.json */
    REFUSED(good, "{oops", MOEC_ERR_FORMAT, "tokenizer_config.json: not valid JSON (at byte 2)");
    /* a class's own special tokens where the config leaves the keys out
     * (LlamaTokenizer's <s> </s> <unk>: transformers would add the two that
     * tokenizer.json lacks) */
    REFUSED(good, "{\"tokenizer_class\":\"LlamaTokenizerFast\"}", MOEC_ERR_FORMAT,
            "tokenizer_config.json: eos_token (LlamaTokenizerFast's default): '</s>' is not a "
            "token of tokenizer.json");
    REFUSED(good, "{\"tokenizer_class\":\"LlamaTokenizer\",\"eos_token\":\"<s>\"}",
            MOEC_ERR_FORMAT, "tokenizer_config.json: unk_token (LlamaTokenizer's default): '<unk>' "
                             "is not a token of tokenizer.json");
    REFUSED(good, "{\"bos_token\":{\"content\":\"<nope>\"}}", MOEC_ERR_FORMAT,
            "tokenizer_config.json: bos_token: '<nope>' is not a token of tokenizer.json");
    REFUSED(good, "{\"eos_token\":7}", MOEC_ERR_FORMAT,
            "tokenizer_config.json: eos_token: must be a string, {\"content\": ...} or null");
    /* the LlamaTokenizerFast template replaces tokenizer.json's post-processor */
    REFUSED(good, "{\"clean_up_tokenization_spaces\":true}", MOEC_ERR_UNSUPPORTED,
            "tokenizer_config.json: clean_up_tokenization_spaces: true is not supported (moec "
            "decodes as tokenizers does, without the clean-up)");
    REFUSED(good, "{\"clean_up_tokenization_spaces\":\"no\"}", MOEC_ERR_FORMAT,
            "tokenizer_config.json: clean_up_tokenization_spaces must be true or false");
    write_dir(good, "{\"clean_up_tokenization_spaces\":false}");
    T_OK(moec_tokenizer_open(g_dir, &tok));
    moec_tokenizer_free(tok);
    /* a special token of the config that tokenizer.json has only in its
     * vocab: transformers would make it a special added token */
    REFUSED(good, "{\"eos_token\":\"a\"}", MOEC_ERR_UNSUPPORTED,
            "tokenizer_config.json: eos_token: 'a' is in the vocab but not an added token of "
            "tokenizer.json (transformers would make it a special added token; moec does not)");
    REFUSED(good, "{\"pad_token\":{\"content\":\"ab\"}}", MOEC_ERR_UNSUPPORTED,
            "tokenizer_config.json: pad_token: 'ab' is in the vocab but not an added token");
    REFUSED(good, "{\"unk_token\":\"<unk>\"}", MOEC_ERR_FORMAT,
            "tokenizer_config.json: unk_token: '<unk>' is not a token of tokenizer.json");
    REFUSED(good, "{\"additional_special_tokens\":[\"<s>\",{\"content\":\"b\"}]}",
            MOEC_ERR_UNSUPPORTED, "tokenizer_config.json: additional_special_tokens[1]: 'b' is in "
                                  "the vocab but not an added token");
    REFUSED(good, "{\"additional_special_tokens\":\"<s>\"}", MOEC_ERR_FORMAT,
            "tokenizer_config.json: additional_special_tokens: must be a list");
    REFUSED(good, "{\"additional_special_tokens\":[7]}", MOEC_ERR_FORMAT,
            "tokenizer_config.json: additional_special_tokens[0]: must be a string or "
            "{\"content\": ...}");
    write_dir(good, "{\"unk_token\":null,\"pad_token\":{\"content\":\"<s>\"},\"mask_token\":\"\","
                    "\"additional_special_tokens\":[\"<s>\",{\"content\":\"<s>\"}]}");
    T_OK(moec_tokenizer_open(g_dir, &tok));
    moec_tokenizer_free(tok);
    /* add_bos_token / add_eos_token change nothing: transformers 5.17 keeps
     * tokenizer.json's post-processor (none here), and its LlamaTokenizer
     * has no default pad_token */
    write_dir(good, "{\"tokenizer_class\":\"LlamaTokenizerFast\",\"bos_token\":\"<s>\","
                    "\"eos_token\":\"<s>\",\"unk_token\":null,\"add_bos_token\":true,"
                    "\"add_eos_token\":true}");
    T_OK(moec_tokenizer_open(g_dir, &tok));
    int32_t *ids = NULL;
    int n = 0;
    if (tok)
        T_OK(moec_tokenizer_encode(tok, "b", 1, 1, &ids, &n));
    T_CHECK(n == 1 && ids && ids[0] == 1);
    free(ids);
    moec_tokenizer_free(tok);
    /* Qwen2Tokenizer's defaults: <|endoftext|> as eos where the config names none */
    char *qwen = variant("added_tokens", "[{\"id\":4,\"content\":\"<|endoftext|>\","
                                         "\"special\":true}]");
    write_dir(qwen, "{\"tokenizer_class\":\"Qwen2Tokenizer\"}");
    T_OK(moec_tokenizer_open(g_dir, &tok));
    T_CHECK(moec_tokenizer_eos_id(tok) == 4 && moec_tokenizer_bos_id(tok) == -1);
    moec_tokenizer_free(tok);
    write_dir(qwen, "{\"tokenizer_class\":\"Qwen2TokenizerFast\",\"eos_token\":null}");
    T_OK(moec_tokenizer_open(g_dir, &tok));
    T_CHECK(moec_tokenizer_eos_id(tok) == -1);
    moec_tokenizer_free(tok);
    free(qwen);
    /* a folder with no tokenizer.json */
    snprintf(path, sizeof path, "%s/tokenizer.json", g_dir);
    unlink(path);
    T_ERR(moec_tokenizer_open(g_dir, &tok), MOEC_ERR_IO, "tokenizer.json: No such file or directory");
    snprintf(path, sizeof path, "%s/tokenizer_config.json", g_dir);
    unlink(path);
    /* a FIFO in place of either file is refused at once (opening it for
     * reading used to wait for a writer forever) */
    write_dir(good, NULL);
    T_CHECK(mkfifo(path, 0600) == 0);
    T_ERR(moec_tokenizer_open(g_dir, &tok), MOEC_ERR_IO,
          "tokenizer_config.json: not a regular file");
    unlink(path);
    snprintf(path, sizeof path, "%s/tokenizer.json", g_dir);
    unlink(path);
    T_CHECK(mkfifo(path, 0600) == 0);
    T_ERR(moec_tokenizer_open(g_dir, &tok), MOEC_ERR_IO, "tokenizer.json: not a regular file");
    T_CHECK(tok == NULL);
    unlink(path);
    free(good);
}

/* The ids of text in the tokenizer of g_dir: each of want (n of them). */
static void check_ids(int line, const char *text, int add_special, const int32_t *want, int n)
{
    moec_tokenizer_t *tok = NULL;
    int32_t *ids = NULL;
    int got = -1;
    T_OK(moec_tokenizer_open(g_dir, &tok));
    if (tok)
        T_OK(moec_tokenizer_encode(tok, text, strlen(text), add_special, &ids, &got));
    int same = got == n && ids;
    for (int i = 0; same && i < n; i++)
        same = ids[i] == want[i];
    if (!same) {
        fprintf(stderr, "line %d: '%s'\n", line, text);
        print_ids("want", want, n);
        print_ids("got", ids, got < 0 ? 0 : got);
    }
    T_CHECK(same);
    free(ids);
    moec_tokenizer_free(tok);
}
#define CHECK_IDS(text, add, ...)                                                    \
    do {                                                                           \
        static const int32_t want_[] = {__VA_ARGS__};                              \
        check_ids(__LINE__, (text), (add), want_, (int)(sizeof want_ / sizeof *want_)); \
    } while (0)

/* tokenizer_config.json settings that change the ids. */
static void test_config_encoding(void)
{
    /* "<s>" is special, "<x>" and "s>" are not; "<s>" and "s>" are matched
     * in the raw text, "<x>" in the normalized; '<' 's' '>' are in the vocab */
    static const char json[] =
        "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2,\"<\":3,\"s\":4,"
        "\">\":5},\"merges\":[\"a b\"]},\"pre_tokenizer\":{\"type\":\"ByteLevel\","
        "\"add_prefix_space\":false},\"decoder\":{\"type\":\"ByteLevel\"},\"added_tokens\":["
        "{\"id\":6,\"content\":\"<s>\",\"special\":true},{\"id\":7,\"content\":\"<x>\"},"
        "{\"id\":8,\"content\":\"s>\",\"normalized\":false}]}";
    write_dir(json, NULL);
    CHECK_IDS("ab<s><x>", 1, 2, 6, 7);
    CHECK_IDS("<s>", 1, 6);
    /* split_special_tokens: "<s>" is text (the GPT-2 regex cuts it into
     * '<', 's', '>'), "<x>" still an added token, and "s>" not found inside
     * the "<s>" passed over (tokenizers' matches do not overlap) */
    write_dir(json, "{\"split_special_tokens\":true}");
    CHECK_IDS("ab<s><x>", 1, 2, 3, 4, 5, 7);
    CHECK_IDS("<s>", 1, 3, 4, 5);
    CHECK_IDS("as>", 1, 0, 8);
    write_dir(json, "{\"split_special_tokens\":false}");
    CHECK_IDS("<s>", 1, 6);
    REFUSED(json, "{\"split_special_tokens\":1}", MOEC_ERR_FORMAT,
            "tokenizer_config.json: split_special_tokens must be true or false");
    write_dir(json, NULL); /* removes tokenizer_config.json */
    char path[4200];
    snprintf(path, sizeof path, "%s/tokenizer.json", g_dir);
    unlink(path);
}

/* g_dir/name with text, or removed when text is NULL. */
static void write_side(const char *name, const char *text)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    if (text)
        t_write_file(path, text, strlen(text));
    else
        unlink(path);
}

/* What the tokenizer of g_dir decodes ids to, special tokens skipped or
 * not, and its eos id, checked against want_text and want_eos. */
static void check_decoded(int line, const int32_t *ids, int n, int skip, const char *want_text,
                          int32_t want_eos)
{
    moec_tokenizer_t *tok = NULL;
    char *text = NULL;
    size_t len = 0;
    T_OK(moec_tokenizer_open(g_dir, &tok));
    if (tok)
        T_OK(moec_tokenizer_decode(tok, ids, n, skip, &text, &len));
    int ok = text && len == strlen(want_text) && !memcmp(text, want_text, len) &&
             moec_tokenizer_eos_id(tok) == want_eos;
    if (!ok)
        fprintf(stderr, "line %d: decoded '%.*s' (eos %d), want '%s' (eos %d)\n", line,
                text ? (int)len : 0, text ? text : "", (int)moec_tokenizer_eos_id(tok), want_text,
                (int)want_eos);
    T_CHECK(ok);
    free(text);
    moec_tokenizer_free(tok);
}
#define CHECK_DECODED(skip, text, eos, ...)                                                  \
    do {                                                                                   \
        static const int32_t ids_[] = {__VA_ARGS__};                                       \
        check_decoded(__LINE__, ids_, (int)(sizeof ids_ / sizeof *ids_), (skip), (text), (eos)); \
    } while (0)

/* The files transformers reads beside tokenizer.json, as transformers
 * 5.17 reads them (scripts/hf_tokenizer_probe.py): tokenizer.json's version,
 * the config's special tokens made special, added_tokens_decoder,
 * special_tokens_map.json and added_tokens.json. */
static void test_side_files(void)
{
    /* as test_config_encoding's ("<s>" (6) special, "<x>" (7) and "s>" (8)
     * not), with a space (Ġ, 5) in the vocab for lstrip */
    static const char body[] =
        "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2,\"<\":3,\"s\":4,"
        "\"\xc4\xa0\":5},\"merges\":[\"a b\"]},\"pre_tokenizer\":{\"type\":\"ByteLevel\","
        "\"add_prefix_space\":false},\"decoder\":{\"type\":\"ByteLevel\"},\"added_tokens\":["
        "{\"id\":6,\"content\":\"<s>\",\"special\":true},{\"id\":7,\"content\":\"<x>\"},"
        "{\"id\":8,\"content\":\"s>\",\"normalized\":false}]}";
    char json[1024], v2[1024], v1[1024], vnum[1024];
    snprintf(json, sizeof json, "{%s", body);
    snprintf(v1, sizeof v1, "{\"version\":\"1.0\",%s", body);
    snprintf(v2, sizeof v2, "{\"version\":\"2.0\",%s", body);
    snprintf(vnum, sizeof vnum, "{\"version\":1,%s", body);
    /* tokenizers refuses a version but "1.0" */
    REFUSED(v2, NULL, MOEC_ERR_UNSUPPORTED,
            "tokenizer.json: version: '2.0' is not supported (tokenizers reads \"1.0\")");
    REFUSED(vnum, NULL, MOEC_ERR_FORMAT, "tokenizer.json: version: must be a string");
    write_dir(v1, NULL);
    CHECK_DECODED(1, "ab<x>", -1, 2, 6, 7);
    /* a config's special tokens are special: skip_special_tokens drops "<x>" */
    write_dir(json, "{\"additional_special_tokens\":[\"<x>\"]}");
    CHECK_DECODED(1, "ab", -1, 2, 6, 7);
    CHECK_DECODED(0, "ab<s><x>", -1, 2, 6, 7);
    write_dir(json, "{\"pad_token\":\"<x>\",\"eos_token\":\"<s>\"}");
    CHECK_DECODED(1, "ab", 6, 2, 6, 7);
    /* ... and split_special_tokens encodes it as text ('x' and '>' are not
     * in the vocab, and there is no unk_token) */
    write_dir(json, "{\"additional_special_tokens\":[\"<x>\"],\"split_special_tokens\":true}");
    CHECK_IDS("<x>", 1, 3);
    write_dir(json, "{\"split_special_tokens\":true}");
    CHECK_IDS("<x>", 1, 7);
    /* added_tokens_decoder */
    write_dir(json, "{\"added_tokens_decoder\":{\"6\":{\"content\":\"<s>\",\"special\":true,"
                    "\"lstrip\":false},\"7\":{\"content\":\"<x>\",\"special\":false}}}");
    CHECK_DECODED(1, "ab<x>", -1, 2, 6, 7);
    write_dir(json, "{\"added_tokens_decoder\":{\"7\":{\"content\":\"<x>\",\"special\":true}}}");
    CHECK_DECODED(1, "ab", -1, 2, 6, 7);
    REFUSED(json, "{\"added_tokens_decoder\":{\"9\":{\"content\":\"<new>\"}}}",
            MOEC_ERR_UNSUPPORTED,
            "tokenizer_config.json: added_tokens_decoder[\"9\"]: '<new>' is not an added token of "
            "tokenizer.json (transformers would add it; moec does not)");
    REFUSED(json, "{\"added_tokens_decoder\":{\"9\":{\"content\":\"<s>\"}}}",
            MOEC_ERR_UNSUPPORTED,
            "tokenizer_config.json: added_tokens_decoder[\"9\"]: '<s>' is id 6 in tokenizer.json "
            "(transformers would renumber the added tokens; moec does not)");
    /* its lstrip (single_word, rstrip) replaces tokenizer.json's */
    write_dir(json, "{\"added_tokens_decoder\":{\"7\":{\"content\":\"<x>\",\"lstrip\":true}}}");
    CHECK_IDS("a <x>", 1, 0, 7);
    write_dir(json, "{\"added_tokens_decoder\":{\"7\":{\"content\":\"<x>\"}}}");
    CHECK_IDS("a <x>", 1, 0, 5, 7);
    REFUSED(json, "{\"added_tokens_decoder\":{\"8\":{\"content\":\"s>\",\"normalized\":true}}}",
            MOEC_ERR_UNSUPPORTED,
            "tokenizer_config.json: added_tokens_decoder[\"8\"]: normalized true, but false in "
            "tokenizer.json");
    REFUSED(json, "{\"added_tokens_decoder\":{\"6\":{\"content\":\"<s>\",\"special\":false}}}",
            MOEC_ERR_UNSUPPORTED,
            "tokenizer_config.json: added_tokens_decoder[\"6\"]: special false, but true in "
            "tokenizer.json");
    REFUSED(json, "{\"added_tokens_decoder\":{\"x7\":{\"content\":\"<x>\"}}}", MOEC_ERR_FORMAT,
            "tokenizer_config.json: added_tokens_decoder[\"x7\"]: the key must be an id from 0 to");
    REFUSED(json, "{\"added_tokens_decoder\":{\"7\":\"<x>\"}}", MOEC_ERR_FORMAT,
            "tokenizer_config.json: added_tokens_decoder[\"7\"]: must be a JSON object");
    REFUSED(json, "{\"added_tokens_decoder\":[]}", MOEC_ERR_FORMAT,
            "tokenizer_config.json: added_tokens_decoder: must be a JSON object");
    /* special_tokens_map.json's special tokens replace the config's */
    write_dir(json, "{\"eos_token\":\"<s>\"}");
    write_side("special_tokens_map.json", "{\"eos_token\":{\"content\":\"<x>\"}}");
    CHECK_DECODED(1, "ab", 7, 2, 6, 7);
    write_dir(json, NULL);
    CHECK_DECODED(1, "ab", 7, 2, 6, 7);
    write_side("special_tokens_map.json", "{\"additional_special_tokens\":[\"<x>\"]}");
    CHECK_DECODED(1, "ab", -1, 2, 6, 7);
    write_side("special_tokens_map.json", "{\"eos_token\":\"<nope>\"}");
    write_dir(json, "{\"eos_token\":\"<s>\"}");
    moec_tokenizer_t *tok = NULL;
    T_ERR(moec_tokenizer_open(g_dir, &tok), MOEC_ERR_FORMAT,
          "special_tokens_map.json: eos_token: '<nope>' is not a token of tokenizer.json");
    write_side("special_tokens_map.json", "[]");
    T_ERR(moec_tokenizer_open(g_dir, &tok), MOEC_ERR_FORMAT,
          "special_tokens_map.json: not a JSON object");
    write_side("special_tokens_map.json", NULL);
    /* added_tokens.json: tokenizer.json's added tokens, by the same ids */
    write_side("added_tokens.json", "{\"<x>\":7,\"<s>\":6}");
    CHECK_DECODED(1, "ab<x>", 6, 2, 6, 7);
    write_side("added_tokens.json", "{\"<new>\":9}");
    T_ERR(moec_tokenizer_open(g_dir, &tok), MOEC_ERR_UNSUPPORTED,
          "added_tokens.json: \"<new>\": not an added token of tokenizer.json (transformers would "
          "add it; moec does not)");
    write_side("added_tokens.json", "{\"<x>\":9}");
    T_ERR(moec_tokenizer_open(g_dir, &tok), MOEC_ERR_UNSUPPORTED,
          "added_tokens.json: \"<x>\": id 9 here, 7 in tokenizer.json");
    write_side("added_tokens.json", "{\"<x>\":\"7\"}");
    T_ERR(moec_tokenizer_open(g_dir, &tok), MOEC_ERR_FORMAT,
          "added_tokens.json: \"<x>\": an id must be an integer");
    T_CHECK(tok == NULL);
    write_side("added_tokens.json", NULL);
    write_dir(json, NULL);
    write_side("tokenizer.json", NULL);
}

/* --quick (under valgrind): shorter long inputs. */
int main(int argc, char **argv)
{
    int quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
    test_goldens();
    test_lookups();
    test_round_trip(quick ? (size_t)1 << 14 : (size_t)1 << 20);
    test_step_budget();
    test_api_errors();
    g_dir = t_tmpdir("tokenizer");
    test_refused_components();
    test_refused_model();
    test_refused_files();
    test_config_encoding();
    test_side_files();
    rmdir(g_dir);
    return t_finish("test_tokenizer");
}
