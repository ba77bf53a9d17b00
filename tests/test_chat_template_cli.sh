#!/usr/bin/env bash
# test_chat_template_cli.sh — `moec chat-template` and `moec run --chat` as a
# user meets them: the text printed exactly (no newline added), the request
# as a list or an object with variables, chat_template.jinja preferred,
# every bad invocation and request failing with its exit code and message,
# and run --chat feeding the rendered text, encoded without the
# post-processor's BOS (the template writes its own), to the model.
set -u
B=${MOEC_BUILD_DIR:?}/moec
S=${MOEC_SOURCE_DIR:?}
D=$S/tests/data/tokenizers
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
# shellcheck source=tests/lib.sh
source "$S/tests/lib.sh"

# folder DIR FIXTURE TEMPLATE_JSON: a model folder of a fixture tokenizer
# whose tokenizer_config.json has chat_template TEMPLATE_JSON ("" for none).
folder() {
  mkdir -p "$1" && cp "$D/$2/tokenizer.json" "$1/"
  python3 - "$D/$2/tokenizer_config.json" "$1/tokenizer_config.json" "$3" <<'PY'
import json, sys
cfg = json.load(open(sys.argv[1], encoding="utf-8"))
if sys.argv[3]:
    cfg["chat_template"] = json.loads(sys.argv[3])
json.dump(cfg, open(sys.argv[2], "w", encoding="utf-8"), ensure_ascii=False)
PY
}
# feed TEXT CODE NEEDLE -- CMD...: CMD with TEXT on stdin exits CODE, NEEDLE in its output.
feed() {
  local text=$1 code=$2 needle=$3; shift 4
  local out rc
  out=$(printf '%s' "$text" | "$@" 2>&1); rc=$?
  if [ "$rc" != "$code" ]; then bad "$* <<< $text -> exit $rc, want $code: $out"; return; fi
  case "$out" in *"$needle"*) ok ;; *) bad "$* <<< $text -> output lacks '$needle': $out" ;; esac
}

for f in --no-generation-prompt --enable-thinking --help; do expect 0 "$f" -- "$B" chat-template --help; done
expect 0 "chat-template MODEL_DIR" -- "$B" --help
expect 0 "--chat TEXT" -- "$B" run --help

Q=$T/qwen
folder "$Q" qwen2 "$(cat <<'J'
"{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
J
)"
printf '<|im_start|>user\nHi 😀<|im_end|>\n<|im_start|>assistant\n' >"$T/want"
printf '[{"role": "user", "content": "Hi 😀"}]' | "$B" chat-template "$Q" >"$T/got"
cmp -s "$T/want" "$T/got" && ok || bad "chat-template printed $(od -c "$T/got" | head -3)"
printf '<|im_start|>user\nHi<|im_end|>\n' >"$T/want"
printf '{"messages": [{"role": "user", "content": "Hi"}]}' | "$B" chat-template "$Q" --no-generation-prompt >"$T/got"
cmp -s "$T/want" "$T/got" && ok || bad "--no-generation-prompt printed $(od -c "$T/got" | head -3)"
printf '<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n' >"$T/want"
printf '[{"role": "user", "content": "Hi"}]' | "$B" chat-template "$Q" --enable-thinking 0 >"$T/got"
cmp -s "$T/want" "$T/got" && ok || bad "--enable-thinking 0 printed $(od -c "$T/got" | head -3)"
printf '{"messages": [], "x": 1}' | "$B" chat-template "$Q" >"$T/got"
[ "$(cat "$T/got")" = $'<|im_start|>assistant' ] && ok || bad "an empty conversation printed $(cat "$T/got")"

# chat_template.jinja wins over tokenizer_config.json's template
cp -r "$Q" "$T/file" && printf 'from the file: {{ messages[0].content }}\n' >"$T/file/chat_template.jinja"
feed '[{"role": "user", "content": "x"}]' 0 "from the file: x" -- "$B" chat-template "$T/file"

# bad invocations and requests
expect 2 "missing MODEL_DIR" -- "$B" chat-template
expect 2 "unknown option --bogus" -- "$B" chat-template "$Q" --bogus
expect 2 "unexpected argument extra" -- "$B" chat-template "$Q" extra
expect 2 "--enable-thinking: '2' is not 0 or 1" -- "$B" chat-template "$Q" --enable-thinking 2
expect 2 "--enable-thinking needs a value" -- "$B" chat-template "$Q" --enable-thinking
expect 1 "cannot open $T/none/tokenizer.json" -- "$B" chat-template "$T/none"
feed '[]' 1 "$D/qwen2 has no chat template (no chat_template in tokenizer_config.json, no chat_template.jinja)" -- \
  "$B" chat-template "$D/qwen2"
folder "$T/nodefault" qwen2 '[{"name": "tool_use", "template": "x"}]'
feed '[]' 1 "chat_template lists templates ('tool_use') but none named 'default'" -- "$B" chat-template "$T/nodefault"
feed '[{"role": "user"' 1 "the chat request is not valid JSON" -- "$B" chat-template "$Q"
# text after the value, or a NUL (which cJSON would end the string at), is
# refused rather than dropped
feed '[{"role": "user", "content": "x"}] [' 1 "the chat request is not valid JSON (more after its value, at byte 35)" -- \
  "$B" chat-template "$Q"
feed '[{"role": "user", "content": "x\u0000y"}]' 1 'the chat request holds a NUL character (\u0000) in a string (byte 31): moec takes no NUL in text' -- \
  "$B" chat-template "$Q"
out=$(printf '[{"role": "user", "content": "x\0y"}]' | "$B" chat-template "$Q" 2>&1); rc=$?
[ $rc = 1 ] && [[ "$out" == *"the chat request is not valid JSON (a NUL byte at byte 31)"* ]] && ok || bad "a raw NUL: exit $rc: $out"
feed '[{"role": "user", "content": "x\\u0000y"}]
' 0 'x\u0000y' -- "$B" chat-template "$Q"
if [ -w /dev/full ]; then # the text never reaching stdout: exit 1, said
  out=$(printf '[{"role": "user", "content": "x"}]' | "$B" chat-template "$Q" 2>&1 >/dev/full); rc=$?
  [ $rc = 1 ] && [ "$out" = "moec: cannot write stdout: No space left on device" ] && ok ||
    bad "chat-template >/dev/full: exit $rc: $out"
fi
feed '"hi"' 1 'the chat request must be a list of messages or an object with a "messages" list' -- \
  "$B" chat-template "$Q"
feed '[{"content": "no role"}]' 1 'message 0 of the chat request is not an object with a string "role"' -- \
  "$B" chat-template "$Q"
feed '{"messages": [], "messages": []}' 1 "messages" -- "$B" chat-template "$Q"
feed '{"messages": [], "bos_token": "x"}' 1 "the chat request sets 'bos_token', which moec sets (from tokenizer_config.json)" -- \
  "$B" chat-template "$Q"
feed '{"messages": [], "enable_thinking": true}' 1 "enable_thinking is given both by the request and by the options" -- \
  "$B" chat-template "$Q" --enable-thinking 1
folder "$T/raises" qwen2 '"{% if messages[0].role != \"user\" %}{{ raise_exception(\"Conversation roles must alternate\") }}{% endif %}"'
feed '[{"role": "assistant", "content": "x"}]' 1 "chat template line 1: the template raised an exception: Conversation roles must alternate" -- \
  "$B" chat-template "$T/raises"
folder "$T/unknown" qwen2 '"{{ messages|shuffle }}"'
feed '[]' 1 "error (unsupported): " -- "$B" chat-template "$T/unknown"
feed '[]' 1 "chat template line 1: unknown filter 'shuffle'" -- "$B" chat-template "$T/unknown"

# run --chat on a tiny model with a one-token-per-byte tokenizer whose
# post-processor adds '!' (id 33) as BOS and whose template writes the BOS
# itself: the prompt is the template's text with one '!', 20 tokens (the
# --max-seq-len that fits 20 prompt tokens and 3 new ones, and not 21).
M=$T/model
mkdir -p "$M" && cp "$S/tests/data/qwen3_moe/"* "$M/"
python3 - "$D/bytes256/tokenizer.json" "$M" <<'PY'
import json, sys
tok = json.load(open(sys.argv[1]))
tok["post_processor"] = {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "!", "type_id": 0}},
                         {"Sequence": {"id": "A", "type_id": 0}}], "pair": [], "special_tokens":
                         {"!": {"id": "!", "ids": [33], "tokens": ["!"]}}}
# the config's bos_token must be an added token (transformers would add it)
tok["added_tokens"] = [{"id": 33, "content": "!", "special": True}]
json.dump(tok, open(sys.argv[2] + "/tokenizer.json", "w"))
json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "!", "eos_token": None,
           "chat_template": "{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
                            "{% if add_generation_prompt %}<assistant>{% endif %}"},
          open(sys.argv[2] + "/tokenizer_config.json", "w"))
PY
text=$(printf '[{"role": "user", "content": "hi"}]' | "$B" chat-template "$M")
[ "$text" = "!<user>hi<assistant>" ] && ok || bad "the template rendered '$text'"
ids=$(printf '%s' "$text" | "$B" tokenize "$M" --no-special-tokens)
want=$("$B" run "$M" --prompt-ids "$ids" --max-new-tokens 3 --ignore-eos --backend cpu | tr ' ' ',' |
  "$B" tokenize "$M" --decode --skip-special-tokens)
got=$("$B" run "$M" --chat hi --max-new-tokens 3 --max-seq-len 22 --ignore-eos --backend cpu); rc=$?
[ $rc = 0 ] && [ "$got" = "$want" ] && [ -n "$got" ] && ok || bad "run --chat printed '$got' (exit $rc), want '$want'"
expect 2 "is too short for 20 prompt tokens" -- \
  "$B" run "$M" --chat hi --max-new-tokens 3 --max-seq-len 21 --ignore-eos --backend cpu
expect 2 "--prompt-ids, --prompt and --chat are exclusive" -- "$B" run "$M" --chat hi --prompt hi --max-new-tokens 1
expect 2 "--enable-thinking goes with --chat" -- "$B" run "$M" --prompt hi --enable-thinking 1 --max-new-tokens 1
expect 2 "--enable-thinking: 'yes' is not 0 or 1" -- "$B" run "$M" --chat hi --enable-thinking yes --max-new-tokens 1
cp "$D/bytes256/tokenizer.json" "$T/plain.json" && mkdir -p "$T/notmpl" && cp "$S/tests/data/qwen3_moe/"* "$T/notmpl/" &&
  cp "$T/plain.json" "$T/notmpl/tokenizer.json"
expect 1 "has no chat template" -- "$B" run "$T/notmpl" --chat hi --max-new-tokens 1 --backend cpu

finish test_chat_template_cli
