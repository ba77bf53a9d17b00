/* test_jinja.c — the chat template interpreter (runtime/jinja*.c) and
 * moec_chat_render: each error a template can meet has its exact message
 * and status (an unknown filter, test or tag, a Jinja built-in moec lacks,
 * an unclosed block, an undefined method or function, raise_exception,
 * every bound); renders whose text is known (whitespace control, scoping,
 * Python's str, repr and json.dumps); and the public API on model folders
 * (a string template, a list with a default, chat_template.jinja winning,
 * no template, bad arguments, the BOS encoded once). The byte-for-byte
 * agreement with jinja2 on the vendors' templates is test_chat_template.py. */
#include <string.h>
#include <unistd.h>

#include "runtime/jinja.h"
#include "testlib.h"

static jinja_limits g_lim = {JINJA_MAX_OUTPUT, JINJA_MAX_MEMORY, JINJA_MAX_STEPS};

static moec_status render(const char *tmpl, const char *vars, char **out)
{
    cJSON *v = vars ? cJSON_Parse(vars) : NULL;
    size_t len;
    moec_status st = jinja_render(tmpl, strlen(tmpl), v, &g_lim, out, &len);
    cJSON_Delete(v);
    if (st == MOEC_OK && strlen(*out) != len) {
        fprintf(stderr, "render of %s: length %zu, strlen %zu\n", tmpl, len, strlen(*out));
        t_failures++;
    }
    return st;
}

#define OK(tmpl, vars, want) check_ok(tmpl, vars, want, __LINE__)
static void check_ok(const char *tmpl, const char *vars, const char *want, int line)
{
    char *out = NULL;
    moec_status st = render(tmpl, vars, &out);
    t_checks++;
    if (st != MOEC_OK) {
        t_failures++;
        fprintf(stderr, "test_jinja.c:%d: %s -> %s: %s\n", line, tmpl, moec_status_name(st), moec_last_error());
    } else if (strcmp(out, want)) {
        t_failures++;
        fprintf(stderr, "test_jinja.c:%d: %s\n  got  [%s]\n  want [%s]\n", line, tmpl, out, want);
    }
    free(out);
}

/* Fails with status st and exactly the message msg (moec_last_error_message). */
#define ERR(tmpl, vars, st, msg) check_err(tmpl, vars, st, msg, __LINE__)
static void check_err(const char *tmpl, const char *vars, moec_status want, const char *msg, int line)
{
    char *out = NULL;
    moec_status st = render(tmpl, vars, &out);
    t_checks++;
    if (st != want || strcmp(moec_last_error_message(), msg) || out) {
        t_failures++;
        fprintf(stderr, "test_jinja.c:%d: %s -> %s [%s]\n  want %s [%s]\n", line, tmpl, moec_status_name(st),
                st ? moec_last_error_message() : out, moec_status_name(want), msg);
    }
    free(out);
}

static void test_errors(void)
{
    /* what moec does not have, named */
    ERR("{{ x|foo }}", NULL, MOEC_ERR_UNSUPPORTED, "chat template line 1: unknown filter 'foo'");
    ERR("a\n{{ x|sort }}", NULL, MOEC_ERR_UNSUPPORTED, "chat template line 2: the filter 'sort' is not supported");
    ERR("{% if false %}{{ x|foo }}{% endif %}", NULL, MOEC_ERR_UNSUPPORTED,
        "chat template line 1: unknown filter 'foo'"); /* found when read, as jinja2 does */
    ERR("{{ x is foo }}", NULL, MOEC_ERR_UNSUPPORTED, "chat template line 1: unknown test 'foo'");
    ERR("\n\n{% foo %}", NULL, MOEC_ERR_UNSUPPORTED, "chat template line 3: unknown tag 'foo'");
    ERR("{% include 'x.jinja' %}", NULL, MOEC_ERR_UNSUPPORTED,
        "chat template line 1: the {% include %} tag is not supported");
    ERR("{% for x in y recursive %}{% endfor %}", NULL, MOEC_ERR_UNSUPPORTED,
        "chat template line 1: recursive for loops are not supported");
    ERR("{{ 'x'.foo() }}", NULL, MOEC_ERR_INVALID_ARG, "chat template line 1: 'str object' has no attribute 'foo'");
    ERR("{{ m.items2() }}", "{\"m\": {}}", MOEC_ERR_INVALID_ARG,
        "chat template line 1: 'dict object' has no attribute 'items2'");
    ERR("{{ 'x'.format(1) }}", NULL, MOEC_ERR_UNSUPPORTED, "chat template line 1: the method str.format is not supported");
    ERR("{{ [].append(1) }}", NULL, MOEC_ERR_UNSUPPORTED, "chat template line 1: the method list.append is not supported");
    ERR("{{ foo() }}", NULL, MOEC_ERR_INVALID_ARG, "chat template line 1: 'foo' is undefined");
    ERR("{{ cycler(1) }}", NULL, MOEC_ERR_UNSUPPORTED, "chat template line 1: the function 'cycler' is not supported");
    ERR("{{ x|tojson(separators=(',', ':')) }}", "{\"x\": 1}", MOEC_ERR_UNSUPPORTED,
        "chat template line 1: tojson's separators are not supported");
    ERR("{{ 100000000000 * 100000000000 }}", NULL, MOEC_ERR_UNSUPPORTED,
        "chat template line 1: an integer beyond 64 bits (Python's are unbounded, moec's are not)");
    /* syntax */
    ERR("a\n{% if true %}\nb", NULL, MOEC_ERR_FORMAT,
        "chat template line 2: unclosed 'if' block: the template ends before its 'endif'");
    ERR("{% for m in messages %}{% if x %}{% endif %}", NULL, MOEC_ERR_FORMAT,
        "chat template line 1: unclosed 'for' block: the template ends before its 'endfor'");
    ERR("{% macro f() %}", NULL, MOEC_ERR_FORMAT,
        "chat template line 1: unclosed 'macro' block: the template ends before its 'endmacro'");
    ERR("{% for x in y %}{% endif %}", NULL, MOEC_ERR_FORMAT,
        "chat template line 1: unexpected 'endif': the innermost open block is 'for' (line 1)");
    ERR("x\n{% endfor %}", NULL, MOEC_ERR_FORMAT, "chat template line 2: unexpected 'endfor': no block is open");
    ERR("{{ 1 + }}", NULL, MOEC_ERR_FORMAT, "chat template line 1: expected an expression, got '}}'");
    ERR("{{ x", NULL, MOEC_ERR_FORMAT, "chat template line 1: the template ends inside this {{ }} tag");
    ERR("{# x", NULL, MOEC_ERR_FORMAT, "chat template line 1: a comment {# is not closed by #}");
    ERR("{{ 'x }}", NULL, MOEC_ERR_FORMAT, "chat template line 1: a string literal is not closed");
    ERR("{{ (1 }}", NULL, MOEC_ERR_FORMAT, "chat template line 1: unexpected '}', expected ')'");
    ERR("{{ x ! y }}", NULL, MOEC_ERR_FORMAT, "chat template line 1: unexpected character '!' in a tag");
    ERR("{% break %}", NULL, MOEC_ERR_FORMAT, "chat template line 1: 'break' outside a for loop");
    ERR("{% set 1 = 2 %}", NULL, MOEC_ERR_FORMAT, "chat template line 1: expected a variable name to assign to, got an integer");
    /* rendering */
    ERR("x\n{{ raise_exception('Conversation roles must alternate') }}", NULL, MOEC_ERR_INVALID_ARG,
        "chat template line 2: the template raised an exception: Conversation roles must alternate");
    ERR("{{ messages[0].content }}", "{\"messages\": []}", MOEC_ERR_INVALID_ARG,
        "chat template line 1: list object has no element 0");
    ERR("{{ m.x.y }}", "{\"m\": {}}", MOEC_ERR_INVALID_ARG, "chat template line 1: 'dict object' has no attribute 'x'");
    ERR("{{ 'a' + m.content }}", "{\"m\": {\"content\": null}}", MOEC_ERR_INVALID_ARG,
        "chat template line 1: can only concatenate str (not \"NoneType\") to str");
    ERR("{{ 'a' < 1 }}", NULL, MOEC_ERR_INVALID_ARG,
        "chat template line 1: '<' not supported between instances of 'str' and 'int'");
    ERR("{{ 1 // 0 }}", NULL, MOEC_ERR_INVALID_ARG, "chat template line 1: integer division or modulo by zero");
    ERR("{{ x|tojson }}", NULL, MOEC_ERR_INVALID_ARG,
        "chat template line 1: tojson: Object of type Undefined is not JSON serializable");
    ERR("{% set x.y = 1 %}", "{\"x\": {}}", MOEC_ERR_INVALID_ARG,
        "chat template line 1: cannot assign attribute on non-namespace object");
    ERR("{% set a, b = [1] %}", NULL, MOEC_ERR_INVALID_ARG,
        "chat template line 1: not enough values to unpack (expected 2, got 1)");
    ERR("{{ range(100001)|length }}", NULL, MOEC_ERR_CAPACITY,
        "chat template line 1: range of 100001 items: the sandbox allows at most 100000");
    ERR("{% macro m() %}{{ m() }}{% endmacro %}{{ m() }}", NULL, MOEC_ERR_CAPACITY,
        "chat template line 1: macros call each other more than 64 deep");
    /* the bounds of one render */
    jinja_limits saved = g_lim;
    g_lim.max_output = 100;
    ERR("{% for i in range(1000) %}x{% endfor %}", NULL, MOEC_ERR_CAPACITY,
        "chat template line 1: the rendered text is longer than the 100 bytes a render may make");
    ERR("{{ 'ab' * 51 }}", NULL, MOEC_ERR_CAPACITY,
        "chat template line 1: a string repeated 51 times is longer than 100 bytes");
    OK("{{ 'ab' * 50 }}", NULL,
       "abababababababababababababababababababababababababababababababababababababababababababababababababab");
    g_lim = saved;
    g_lim.max_steps = 1000;
    ERR("{% for i in range(1000) %}{% endfor %}", NULL, MOEC_ERR_CAPACITY,
        "chat template line 1: rendering takes more than the 1000 steps a render may take");
    g_lim = saved;
    g_lim.max_memory = (size_t)1 << 20;
    ERR("{% set ns = namespace(s='x') %}{% for i in range(99999) %}{% set ns.s = ns.s ~ 'x' %}{% endfor %}", NULL,
        MOEC_ERR_CAPACITY, "chat template: rendering needs more than the 1 MiB of memory a render may take");
    g_lim = saved;
    char deep[JINJA_MAX_NESTING * 2 + 16];
    size_t k = 0;
    k += (size_t)sprintf(deep + k, "{{ ");
    for (int i = 0; i < JINJA_MAX_NESTING + 1; i++)
        deep[k++] = '(';
    deep[k] = 0;
    ERR(deep, NULL, MOEC_ERR_CAPACITY, "chat template line 1: brackets nested more than 200 deep");
    /* chains the parser reads in a loop, which evaluation would recurse into */
    char *chain = malloc(5 * 4000 + 16);
    k = (size_t)sprintf(chain, "{{ 1");
    for (int i = 0; i < 4000; i++)
        k += (size_t)sprintf(chain + k, "|trim");
    sprintf(chain + k, " }}");
    ERR(chain, NULL, MOEC_ERR_CAPACITY,
        "chat template line 1: rendering nests expressions, blocks and calls more than 3000 deep");
    free(chain);
    ERR("{% set ns = namespace(x=[]) %}{% for i in range(2000) %}{% set ns.x = [ns.x] %}{% endfor %}{{ ns.x }}",
        NULL, MOEC_ERR_CAPACITY, "chat template line 1: a value nested more than 1000 deep");
}

static void test_renders(void)
{
    /* trim_blocks, lstrip_blocks, whitespace control, comments, raw */
    OK("a\n  {% if true %}\n    x\n  {% endif %}\nb\n", NULL, "a\n    x\nb");
    OK("a\n  {%- if true -%}\n    x\n  {%- endif %}  \nb", NULL, "ax  \nb");
    OK("  {{ 'x' }}  \n  {# c #}\n  y {#- c -#}  z\n", NULL, "  x  \n  yz");
    OK("   {%+ if true %}x{% endif %}", NULL, "   x");
    OK("{% raw %}{{ x }}{% endraw %}", NULL, "{{ x }}");
    OK("a\r\nb\rc\n\n", NULL, "a\nb\nc\n");
    /* literals, operators, str() and repr() as Python writes them */
    OK("{{ [1,'a',None,True,1.5,{'k':\"it's\"}] }}|{{ none }}|{{ 3/2 }}|{{ -7//2 }}|{{ -7 % 3 }}|{{ 2**10 }}", NULL,
       "[1, 'a', None, True, 1.5, {'k': \"it's\"}]|None|1.5|-4|2|1024");
    OK("{{ 0.1 + 0.2 }} {{ 1e16 }} {{ 1e15 }} {{ 1.5e-7 }} {{ 0.0001 }} {{ 1e3 }}", NULL,
       "0.30000000000000004 1e+16 1000000000000000.0 1.5e-07 0.0001 1000.0");
    OK("{{ 'it''s' 'x' }}{{ '\\x41\\u00e9\\n' }}{{ \"a\\\"b\" }}{{ '\\q' }}", NULL, "itsxAé\na\"b\\q");
    OK("{{ ['\\xa0', '\\x7f', 'é', '\\u200b', \"'\\\"\"] }}", NULL, "['\\xa0', '\\x7f', 'é', '\\u200b', '\\'\"']");
    OK("{{ 'a' ~ none ~ 1 ~ [1] ~ u }}{{ 1 if 2 > 1 else 3 }}{{ 0 or 'y' }}{{ 2 ** 3 ** 2 }}", NULL, "aNone1[1]1y64");
    OK("{{ 'a<' + ('<b>'|safe) }}|{{ 'a<' ~ ('<b>'|safe) }}", NULL, "a&lt;<b>|a<<b>");
    /* scoping: a loop's body starts from the enclosing scope on every iteration */
    OK("{% set x = 1 %}{% for i in [1,2] %}{{ x }}{% set x = i*10 %}{{ x }}|{% endfor %}{{ x }}", NULL, "110|120|1");
    OK("{% set ns = namespace(x=0) %}{% for i in [1,2,3] %}{% set ns.x = ns.x + i %}{% endfor %}{{ ns.x }}", NULL, "6");
    OK("{% for m in [1,2,3] %}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}"
       "{{ loop.previtem }}{{ loop.nextitem }};{% endfor %}",
       NULL, "0TrueFalse32;1FalseFalse313;2FalseTrue32;");
    OK("{% for i in range(5) %}{% if i == 1 %}{% continue %}{% elif i == 3 %}{% break %}{% endif %}{{ i }}{% endfor %}",
       NULL, "02");
    OK("{% for x in [1,2,3,4] if x is even %}{{ x }}{{ loop.length }}{% else %}none{% endfor %}", NULL, "2242");
    OK("{% macro f(a, b='B') %}{{ a }}-{{ b }}{% endmacro %}{{ f(1) }}|{{ f(1, b=3) }}", NULL, "1-B|1-3");
    OK("{% set x %} a {% endset %}[{{ x }}]{% filter upper %}abc{% endfilter %}", NULL, "[ a ]ABC");
    /* strings, filters, tests */
    OK("{{ m.content.split('</think>')[-1].lstrip('\\n') }}|{{ 'héllo'[1:3] }}{{ 'héllo'|length }}{{ 'abc'[::-1] }}",
       "{\"m\": {\"content\": \"<think>r</think>\\n\\nans\"}}", "ans|él5cba");
    OK("{{ ' a  b '.split() }}{{ 'a,b,c'.rsplit(',', 1) }}{{ ' a b  c '.split(None, 1) }}", NULL,
       "['a', 'b']['a,b', 'c']['a', 'b  c ']");
    OK("{{ {'b':1,'a':[1,2.5,'é\\n']}|tojson }}|{{ {'b':1}|tojson(indent=2) }}|{{ 'é'|tojson(ensure_ascii=true) }}", NULL,
       "{\"b\": 1, \"a\": [1, 2.5, \"é\\n\"]}|{\n  \"b\": 1\n}|\"\\u00e9\"");
    OK("{{ x|default('d') }}|{{ ''|default('d', true) }}|{{ [1,'a',none]|join(',') }}|{{ d|items|list }}",
       "{\"d\": {\"k\": 1}}", "d|d|1,a,None|[('k', 1)]");
    OK("{{ [{'a':1},{'a':2}]|map(attribute='a')|list }}{{ [1,2,3]|reject('in', [2])|list }}{{ '  x '|trim }}",
       NULL, "[1, 2][1, 3]x");
    OK("{{ x is defined }}{{ x is not defined }}{{ none is none }}{{ 'a' is string }}{{ true is integer }}"
       "{{ {} is mapping }}",
       NULL, "FalseTrueTrueTrueFalseTrue");
    OK("{{ d.get('k') }}{{ d.get('z', 5) }}{{ d['z'] }}{{ d.z }}{{ d.keys()|list }}", "{\"d\": {\"k\": 1}}", "15['k']");
}

/* A model folder: the qwen2 or deepseek_v3 fixture tokenizer with a
 * tokenizer_config.json whose chat_template member is the JSON text ct
 * (NULL: none), and chat_template.jinja when jinja is not NULL. */
static const char *folder(const char *fixture, const char *ct, const char *jinja)
{
    char path[4200], src[4200];
    const char *dir = t_tmpdir("chat");
    size_t len;
    snprintf(src, sizeof src, "tests/data/tokenizers/%s/tokenizer.json", fixture);
    char *tj = t_read_file(t_src(src), &len);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    t_write_file(path, tj, len);
    free(tj);
    snprintf(src, sizeof src, "tests/data/tokenizers/%s/tokenizer_config.json", fixture);
    char *cfg = t_read_file(t_src(src), &len);
    cJSON *root = cJSON_Parse(cfg);
    free(cfg);
    if (ct)
        cJSON_AddItemToObject(root, "chat_template", cJSON_Parse(ct));
    cfg = cJSON_Print(root);
    cJSON_Delete(root);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    t_write_file(path, cfg, strlen(cfg));
    free(cfg);
    if (jinja) {
        snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
        t_write_file(path, jinja, strlen(jinja));
    }
    return dir;
}

static void remove_folder(const char *dir)
{
    char path[4200];
    const char *files[] = {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja"};
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        unlink(path);
    }
    rmdir(dir);
}

static void test_api(void)
{
    moec_tokenizer_t *tok = NULL;
    char *out = NULL;
    moec_chat_options_t gen = {1, -1}, no_gen = {0, -1};
    /* DeepSeek's way: the BOS written by the template, encoded once */
    const char *dir = folder("deepseek_v3",
                             "\"{{ bos_token }}{% for m in messages %}{{ m.role }}:{{ m.content }}{{ eos_token }}"
                             "{% endfor %}{% if add_generation_prompt %}A:{% endif %}\"",
                             NULL);
    T_OK(moec_tokenizer_open(dir, &tok));
    moec_chat_message_t msgs[] = {{"system", "S"}, {"user", "Hi"}, {"assistant", NULL}};
    T_OK(moec_chat_render(tok, msgs, 2, &gen, &out));
    T_CHECK(out && !strcmp(out, "<\xef\xbd\x9c" "begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>system:S<\xef\xbd\x9c"
                                "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>user:Hi<\xef\xbd\x9c"
                                "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>A:"));
    int32_t *ids = NULL;
    int n = 0, bos = 0;
    T_OK(moec_tokenizer_encode(tok, out, strlen(out), 0, &ids, &n));
    for (int i = 0; i < n; i++)
        bos += ids[i] == moec_tokenizer_bos_id(tok);
    T_CHECK(n > 0 && ids[0] == moec_tokenizer_bos_id(tok) && bos == 1);
    free(ids);
    free(out);
    T_OK(moec_chat_render(tok, msgs, 3, &no_gen, &out)); /* content NULL is None */
    T_CHECK(out && strstr(out, "assistant:None<") && !strstr(out, "A:"));
    free(out);
    msgs[2].role = NULL;
    T_ERR(moec_chat_render(tok, msgs, 3, &gen, &out), MOEC_ERR_INVALID_ARG, "message 2 has no role");
    T_ERR(moec_chat_render(tok, NULL, 1, &gen, &out), MOEC_ERR_INVALID_ARG, "NULL argument");
    moec_chat_options_t bad = {1, 5};
    T_ERR(moec_chat_render(tok, msgs, 1, &bad, &out), MOEC_ERR_INVALID_ARG, "enable_thinking 5 is not -1 (unset), 0 or 1");
    const char *req = "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"add_generation_prompt\": true}";
    T_ERR(moec_chat_render_json(tok, req, strlen(req), &gen, &out), MOEC_ERR_INVALID_ARG,
          "the chat request sets 'add_generation_prompt', which moec sets (from the options)");
    req = "[{\"role\": \"user\", \"role\": \"user\"}]";
    T_ERR(moec_chat_render_json(tok, req, strlen(req), &gen, &out), MOEC_ERR_FORMAT, "role");
    req = "[{\"content\": \"x\"}]";
    T_ERR(moec_chat_render_json(tok, req, strlen(req), &gen, &out), MOEC_ERR_INVALID_ARG,
          "message 0 of the chat request is not an object with a string \"role\"");
    T_ERR(moec_chat_render_json(tok, "[", 1, &gen, &out), MOEC_ERR_FORMAT, "the chat request is not valid JSON");
    /* one value and nothing after it but whitespace; no NUL anywhere (it
     * would cut a string short) */
    req = "[{\"role\": \"user\", \"content\": \"x\"}] \n";
    T_OK(moec_chat_render_json(tok, req, strlen(req), &gen, &out));
    free(out);
    req = "[{\"role\": \"user\", \"content\": \"x\"}]]";
    T_ERR(moec_chat_render_json(tok, req, strlen(req), &gen, &out), MOEC_ERR_FORMAT,
          "the chat request is not valid JSON (more after its value, at byte 34)");
    T_CHECK(out == NULL);
    req = "[{\"role\": \"user\", \"content\": \"x\"}] {\"messages\": []}";
    T_ERR(moec_chat_render_json(tok, req, strlen(req), &gen, &out), MOEC_ERR_FORMAT,
          "the chat request is not valid JSON (more after its value, at byte 35)");
    /* a \u0000 escape would cut its string short: refused, an escaped
     * backslash before u0000 is text like any other */
    req = "[{\"role\": \"user\", \"content\": \"x\\u0000y\"}]";
    T_ERR(moec_chat_render_json(tok, req, strlen(req), &gen, &out), MOEC_ERR_UNSUPPORTED,
          "the chat request holds a NUL character (\\u0000) in a string (byte 31): moec takes no "
          "NUL in text");
    req = "[{\"role\": \"user\", \"content\": \"x\ny\"}]";
    T_ERR(moec_chat_render_json(tok, req, strlen(req), &gen, &out), MOEC_ERR_FORMAT,
          "the chat request is not valid JSON (at byte 31: a control character in a string "
          "must be escaped)");
    T_CHECK(out == NULL);
    req = "[{\"role\": \"user\", \"content\": \"x\\\\u0000y\"}]";
    T_OK(moec_chat_render_json(tok, req, strlen(req), &gen, &out));
    T_CHECK(out && strstr(out, "x\\u0000y"));
    free(out);
    static const char nul_req[] = "[{\"role\": \"user\", \"content\": \"x\0y\"}]";
    T_ERR(moec_chat_render_json(tok, nul_req, sizeof nul_req - 1, &gen, &out), MOEC_ERR_FORMAT,
          "the chat request is not valid JSON (a NUL byte at byte 31)");
    req = "{\"messages\": [{\"role\": \"user\", \"content\": \"Q\"}], \"enable_thinking\": true}";
    moec_chat_options_t think = {1, 0};
    T_ERR(moec_chat_render_json(tok, req, strlen(req), &think, &out), MOEC_ERR_INVALID_ARG,
          "enable_thinking is given both by the request and by the options");
    moec_tokenizer_free(tok);
    remove_folder(dir);

    /* a list of templates: the default one; enable_thinking reaching the template */
    dir = folder("qwen2",
                 "[{\"name\": \"tool_use\", \"template\": \"T\"}, {\"name\": \"default\", \"template\": "
                 "\"{{ messages|length }}{{ enable_thinking is defined }}{{ tools }}{{ bos_token is defined }}\"}]",
                 NULL);
    T_OK(moec_tokenizer_open(dir, &tok));
    T_OK(moec_chat_render(tok, msgs, 0, &think, &out));
    T_CHECK(out && !strcmp(out, "0TrueNoneFalse"));
    free(out);
    req = "{\"messages\": [{\"role\": \"user\"}], \"tools\": [1]}";
    T_OK(moec_chat_render_json(tok, req, strlen(req), &gen, &out));
    T_CHECK(out && !strcmp(out, "1False[1]False"));
    free(out);
    req = "[{\"role\": \"user\", \"content\": [{\"type\": \"text\"}]}, {\"role\": \"assistant\"}]";
    T_OK(moec_chat_render_json(tok, req, strlen(req), &think, &out));
    T_CHECK(out && !strcmp(out, "2TrueNoneFalse"));
    free(out);
    moec_tokenizer_free(tok);
    remove_folder(dir);

    /* chat_template.jinja wins over tokenizer_config.json's */
    dir = folder("qwen2", "\"config\"", "file{{ messages[0].content }}\n");
    T_OK(moec_tokenizer_open(dir, &tok));
    T_OK(moec_chat_render(tok, (moec_chat_message_t[]){{"user", "é"}}, 1, &gen, &out));
    T_CHECK(out && !strcmp(out, "fileé"));
    free(out);
    moec_tokenizer_free(tok);
    remove_folder(dir);

    /* no template: not an error at open, MOEC_ERR_NOT_FOUND at render */
    dir = folder("qwen2", NULL, NULL);
    T_OK(moec_tokenizer_open(dir, &tok));
    T_ERR(moec_chat_render(tok, msgs, 1, &gen, &out), MOEC_ERR_NOT_FOUND,
          "has no chat template (no chat_template in tokenizer_config.json, no chat_template.jinja)");
    moec_tokenizer_free(tok);
    remove_folder(dir);
    dir = folder("qwen2", "[{\"name\": \"rag\", \"template\": \"R\"}]", NULL);
    T_OK(moec_tokenizer_open(dir, &tok));
    T_ERR(moec_chat_render(tok, msgs, 1, &gen, &out), MOEC_ERR_NOT_FOUND,
          "chat_template lists templates ('rag') but none named 'default'");
    moec_tokenizer_free(tok);
    remove_folder(dir);
    dir = folder("qwen2", "3", NULL);
    T_ERR(moec_tokenizer_open(dir, &tok), MOEC_ERR_FORMAT,
          "tokenizer_config.json: chat_template: must be a string or a list of {\"name\", \"template\"}");
    remove_folder(dir);
}

int main(void)
{
    test_errors();
    test_renders();
    test_api();
    return t_finish("test_jinja");
}
