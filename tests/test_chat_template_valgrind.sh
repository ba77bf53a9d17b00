#!/usr/bin/env bash
# test_chat_template_valgrind.sh — the chat template interpreter under
# valgrind: test_jinja (every error path, every bound, the API), and `moec
# chat-template` rendering a conversation with a system prompt, reasoning,
# tool calls and results and tools with every template of
# tests/data/chat_templates/, plus a template that fails midway; no leak
# and no invalid access. Skips (loudly) without valgrind.
set -u
B=${MOEC_BUILD_DIR:?}
S=${MOEC_SOURCE_DIR:?}
if ! command -v valgrind >/dev/null; then
  echo "SKIP: valgrind is not installed (run scripts/install_deps.sh)"; exit 0
fi
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
fail=0 runs=0
# run CODE IN CMD...: CMD with stdin from IN exits CODE under valgrind, clean.
run() {
  local code=$1 in=$2; shift 2
  runs=$((runs + 1))
  valgrind -q --leak-check=full --show-leak-kinds=all --errors-for-leak-kinds=all \
    --error-exitcode=99 "$@" <"$in" >"$T/out" 2>"$T/vg"
  local rc=$?
  if [ "$rc" = "$code" ]; then
    echo "clean: ${*: -1}"
  else
    echo "FAIL: exit $rc (want $code): $*"; tail -40 "$T/vg"; fail=$((fail + 1))
  fi
}
run 0 /dev/null "$B/tests/test_jinja"
cat >"$T/conv" <<'J'
{"messages": [
 {"role": "system", "content": "Be brief. 中文 😀"},
 {"role": "user", "content": "What's the weather in Paris?"},
 {"role": "assistant", "content": "<think>\nI should call the tool.\n</think>\n\n", "tool_calls": [
   {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
 {"role": "tool", "content": "{\"temp\": 20}", "name": "get_weather"},
 {"role": "assistant", "content": "<think>ok</think>It is 20 degrees."},
 {"role": "user", "content": "Thanks {{ x }} {% y %}"}],
 "tools": [{"type": "function", "function": {"name": "get_weather", "description": "The weather",
   "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "a city"}},
                  "required": ["city"]}}}]}
J
# Qwen's templates take tool call arguments as an object (Qwen3-Coder's only so), DeepSeek's as JSON text
sed 's/"arguments": "{\\"city\\": \\"Paris\\"}"/"arguments": {"city": "Paris", "days": 2}/' "$T/conv" >"$T/conv_qwen"
grep -q '"days": 2' "$T/conv_qwen" || { echo "FAIL: no object arguments in $T/conv_qwen"; exit 1; }
for f in "$S"/tests/data/chat_templates/*.jinja; do
  name=$(basename "$f" .jinja)
  fixture=qwen2 conv=$T/conv_qwen
  case $name in deepseek*) fixture=deepseek_v3 conv=$T/conv ;; esac
  mkdir -p "$T/$name"
  cp "$S/tests/data/tokenizers/$fixture/tokenizer.json" "$S/tests/data/tokenizers/$fixture/tokenizer_config.json" "$T/$name/"
  cp "$f" "$T/$name/chat_template.jinja"
  run 0 "$conv" "$B/moec" chat-template "$T/$name"
done
mkdir -p "$T/fails" && cp "$S/tests/data/tokenizers/qwen2/"* "$T/fails/"
printf '{%% for m in messages %%}{{ m.content }}{{ m.content.nope() }}{%% endfor %%}' >"$T/fails/chat_template.jinja"
run 1 "$T/conv" "$B/moec" chat-template "$T/fails"
echo "test_chat_template_valgrind: $((runs - fail)) passed, $fail failed"
[ "$fail" = 0 ]
