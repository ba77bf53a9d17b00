#!/usr/bin/env bash
# test_fuzz_jinja.sh — runs the libFuzzer target fuzz_jinja (the chat
# template interpreter, runtime/jinja*.c, under ASan and UBSan) for a
# bounded time (tests/fuzz/run.sh) on a seed corpus: every template of
# tests/data/chat_templates, with a dictionary of the tags, operators,
# filters, tests, methods and names templates use. Fails if the fuzzer
# reports a crash, a sanitizer error, a leak or a timeout; the input that did
# it is kept in $MOEC_BUILD_DIR/fuzz-artifacts/. Without clang the target is
# not built and the test says SKIP.
set -u
. "$(dirname "$0")/fuzz/run.sh"
fuzz_begin fuzz_jinja
n=0
for f in "$src"/tests/data/chat_templates/*.jinja; do
    cp "$f" "$work/corpus/seed$n.jinja" || exit 1
    n=$((n + 1))
done
[ "$n" -ge 10 ] || { echo "FAIL: only $n seed templates in $src/tests/data/chat_templates"; exit 1; }
{
    printf '"%s"\n' '{{' '}}' '{%' '%}' '{#' '#}' '{%-' '-%}' '{{-' '-}}' '{%+' \
        if elif else endif for in endfor set endset macro endmacro filter endfilter with endwith \
        raw endraw break continue generation endgeneration recursive not and or is defined none \
        loop.index0 loop.first loop.last loop.previtem loop.nextitem namespace range dict \
        raise_exception strftime_now '|tojson' '|trim' '|length' '|items' '|default(' '|join(' \
        '|map(' '|select(' '|reject(' '|safe' '|string' '.split(' '.strip(' '.startswith(' \
        '.replace(' '.get(' '.items()' '[::-1]' '[1:]' '[-1]' ' ~ ' ' ** ' ' // ' '==' '!=' \
        messages tools message.content message.role bos_token eos_token
} >"$work/dict"
fuzz_run -max_len=8192 -dict="$work/dict"
