#!/usr/bin/env bash
# test_http.sh — `moec serve --http` (the OpenAI-compatible API; moec-serve
# runs the same code on plan files) as curl meets it, on the CPU backend and
# loopback only: every endpoint (completions and chat, whole and streamed as
# Server-Sent Events, models, health, metrics) and every error status with
# its exact OpenAI error object (400 for malformed JSON and for each bad
# field, naming it; 404 for an unknown path and model; 405; 413 past the
# body limit, whether the body is read or not; 429 when --max-waiting
# requests wait; 431 for headers past the connection's memory; 503 for a
# request waiting when the service stops). The greedy text of a completion
# is the text `moec run --prompt` prints; streamed chunks concatenate to the
# whole answer; a stop string is matched across tokens and never sent; a
# client that goes away, queued or streaming, has its request cancelled;
# /metrics counts what happened; bad command lines exit with their message.
set -u
B=${MOEC_BUILD_DIR:?}
S=${MOEC_SOURCE_DIR:?}
# shellcheck source=tests/lib.sh
source "$S/tests/lib.sh"
# shellcheck source=tests/http_lib.sh
source "$S/tests/http_lib.sh"
EXPECT_TIMEOUT=20
M=$T/tiny-v2
http_model "$M"

# ---- command line -------------------------------------------------------------
for f in "--http PORT" "--host ADDR" "--served-model-name NAME" "--tokenizer DIR" \
  "--max-waiting N" "--max-body-kib N" "--http-timeout S" "--http-threads N" \
  /v1/completions /v1/chat/completions /v1/models /health /metrics 'data: [DONE]' \
  stream_options include_usage; do
  expect 0 "$f" -- "$B/moec" serve --help
done
expect 2 "--http: '70000' is not a port number (0 to 65535)" -- "$B/moec" serve "$M" --http 70000
expect 2 "--host is for the HTTP API: it needs --http PORT" -- "$B/moec" serve "$M" --host ::1
expect 2 "--served-model-name is for the HTTP API: it needs --http PORT" -- \
  "$B/moec" serve "$M" --served-model-name x
# every --http option, the counts too, wants --http (none is ignored unsaid)
for o in --max-waiting --max-body-kib --http-timeout --http-threads; do
  expect 2 "$o is for the HTTP API: it needs --http PORT" -- "$B/moec-serve" "$M" "$o" 8
done
expect 2 "--stdin and --http cannot be used together" -- "$B/moec" serve "$M" --stdin --http 0
expect 2 "--max-waiting: '0' is not an integer from 1 to 65536" -- \
  "$B/moec" serve "$M" --http 0 --max-waiting 0
expect 2 "--max-body-kib: '2000000' is not an integer from 1 to 1048576" -- \
  "$B/moec" serve "$M" --http 0 --max-body-kib 2000000
# refused before the model loads (a missing checkpoint is not reached)
expect 2 "--host: 'localhost' is not a numeric IPv4 or IPv6 address" -- \
  "$B/moec" serve "$T/none" --backend cpu --http 0 --host localhost
expect 1 "--http needs a tokenizer: " -- "$B/moec" serve "$S/tests/data/qwen3_moe" --http 0
expect 1 "qwen3_moe/tokenizer.json" -- "$B/moec" serve "$S/tests/data/qwen3_moe" --http 0

# ---- one server for the rest: one sequence at a time, one request waiting ------
if ! http_start "$T/serve.err" "$M" --backend cpu --http 0 --max-seqs 1 --max-waiting 1 \
  --kv-blocks 1100 --max-body-kib 64 --http-timeout 30 --max-connections 32; then
  bad "no server"
  finish test_http
  exit 1
fi
URL=http://127.0.0.1:$PORT
grep -qF "HTTP API of model 'tiny-v2' on 127.0.0.1:$PORT" "$T/serve.err" && ok ||
  bad "startup line: $(cat "$T/serve.err")"

# http METHOD PATH [CURL ARGS...]: the response's status in CODE, its body
# in $T/body (and BODY).
http() {
  local m=$1 p=$2; shift 2
  CODE=$(curl -s -o "$T/body" -w '%{http_code}' -X "$m" "$URL$p" "$@")
  BODY=$(cat "$T/body")
}
# post PATH JSON: http POST with that body.
post() { http POST "$1" -H 'Content-Type: application/json' --data-binary "$2"; }
# expect_http CODE BODY: the last response, exactly.
expect_http() {
  [ "$CODE" = "$1" ] && [ "$BODY" = "$2" ] && ok || bad "want $1 $2, got $CODE $BODY"
}
# expect_error CODE TYPE PARAM CODE_FIELD MESSAGE: the OpenAI error object
# (PARAM and CODE_FIELD as JSON: null or "name").
expect_error() {
  expect_http "$1" "{\"error\":{\"message\":\"$5\",\"type\":\"$2\",\"param\":$3,\"code\":$4}}"
}
# py CHECK: python3 asserts CHECK on j (the last body as JSON), text (the SSE
# events' texts joined), events (the SSE data lines); prints why not.
py() {
  python3 - "$T/body" "$1" <<'PY'
import json, sys
raw = open(sys.argv[1], "rb").read().decode()
events = [l[6:] for l in raw.split("\n\n") if l.startswith("data: ")]
j = json.loads(raw) if raw.startswith("{") else None
chunks = [json.loads(e) for e in events if e != "[DONE]"]
def delta(c):
    ch = c["choices"][0] if c["choices"] else {}
    return ch.get("text", ch.get("delta", {}).get("content", "")) or ""
text = "".join(delta(c) for c in chunks)
if not eval(sys.argv[2]):
    print("check failed: %s on %r" % (sys.argv[2], raw[:800]))
    sys.exit(1)
PY
}
N='"tiny-v2"'

# ---- GET endpoints ------------------------------------------------------------
http GET /health
expect_http 200 '{"status":"ok"}'
http GET /v1/models
[ "$CODE" = 200 ] && py 'j["object"] == "list" and [m["id"] for m in j["data"]] == ["tiny-v2"] and j["data"][0]["object"] == "model" and j["data"][0]["owned_by"] == "moec" and j["data"][0]["max_model_len"] == 16384' && ok || bad "models: $CODE $BODY"
http GET /v1/models/tiny-v2
[ "$CODE" = 200 ] && py 'j["id"] == "tiny-v2" and j["object"] == "model"' && ok || bad "model: $CODE $BODY"
http GET /v1/models/gpt-4
expect_error 404 invalid_request_error null '"model_not_found"' \
  "The model 'gpt-4' does not exist: this server serves 'tiny-v2'"

# ---- completions ----------------------------------------------------------------
PROMPT="The quick brown fox"
post /v1/completions "{\"model\":$N,\"prompt\":\"$PROMPT\",\"max_tokens\":40,\"temperature\":0}"
cp "$T/body" "$T/whole.json"
want=$("$B/moec" run "$M" --prompt "$PROMPT" --max-new-tokens 40 --backend cpu | python3 -c \
  'import sys, json; print(json.dumps(sys.stdin.buffer.read().decode()[:-1]))')
[ "$CODE" = 200 ] && py "j['object'] == 'text_completion' and j['model'] == 'tiny-v2' and j['id'].startswith('cmpl-') and isinstance(j['created'], int) and len(j['choices']) == 1 and j['choices'][0]['index'] == 0 and j['choices'][0]['logprobs'] is None and j['choices'][0]['text'] == $want and j['choices'][0]['finish_reason'] in ('length', 'stop') and j['usage'] == {'prompt_tokens': 19, 'completion_tokens': j['usage']['completion_tokens'], 'total_tokens': 19 + j['usage']['completion_tokens']}" &&
  ok || bad "completion: not moec run's text $want: $BODY"
whole=$(python3 -c 'import json,sys; print(json.dumps(json.load(open(sys.argv[1]))["choices"][0]["text"]))' "$T/whole.json")
[ "$(python3 -c 'import json,sys; print(len(json.loads(sys.argv[1])) > 20)' "$whole")" = True ] && ok ||
  bad "the greedy text is too short to test with: $whole"

# token ids as the prompt: the same answer
post /v1/completions "{\"model\":$N,\"prompt\":[84,104,101,32,113,117,105,99,107,32,98,114,111,119,110,32,102,111,120],\"max_tokens\":40,\"temperature\":0}"
py "j['choices'][0]['text'] == $whole" && ok || bad "prompt as ids: $BODY"

# streamed: chunks of the same text, one id, finish on the last, usage, [DONE]
post /v1/completions "{\"model\":$N,\"prompt\":\"$PROMPT\",\"max_tokens\":40,\"temperature\":0,\"stream\":true,\"stream_options\":{\"include_usage\":true}}"
[ "$CODE" = 200 ] && py "events[-1] == '[DONE]' and text == $whole and len({c['id'] for c in chunks}) == 1 and all(c['object'] == 'text_completion' and c['model'] == 'tiny-v2' for c in chunks) and [c['choices'][0]['finish_reason'] for c in chunks[:-1]][-1] in ('length', 'stop') and all(c['choices'][0]['finish_reason'] is None for c in chunks[:-2]) and chunks[-1]['choices'] == [] and chunks[-1]['usage']['prompt_tokens'] == 19 and all(c['usage'] is None for c in chunks[:-1])" &&
  ok || bad "stream: $BODY"
head -c 300 "$T/body" | grep -q '^data: {' && ok || bad "not SSE: $BODY"
ct=$(curl -s -o /dev/null -w '%{content_type}' "$URL/v1/completions" -d "{\"model\":$N,\"prompt\":\"a\",\"max_tokens\":2,\"stream\":true}")
[ "$ct" = text/event-stream ] && ok || bad "stream content type $ct"

# stop strings: matched across tokens (one token a byte here), never sent
IFS=$'\t' read -r stop before < <(python3 -c '
import json, sys
t = json.loads(sys.argv[1]); s = t[7:10]
print(json.dumps(s) + "\t" + json.dumps(t[:t.find(s)]))' "$whole")
for stream in false true; do
  post /v1/completions "{\"model\":$N,\"prompt\":\"$PROMPT\",\"max_tokens\":40,\"temperature\":0,\"stop\":[\"zzz\",$stop],\"stream\":$stream}"
  if [ $stream = false ]; then
    py "j['choices'][0]['text'] == $before and j['choices'][0]['finish_reason'] == 'stop'" && ok ||
      bad "stop $stop: $BODY"
  else
    py "text == $before and chunks[-1]['choices'][0]['finish_reason'] == 'stop'" && ok ||
      bad "stop $stop streamed: $BODY"
  fi
done

# a stop id ends the text without its own (vLLM's way), though it counts as
# a token and has its log probability: 'k' is the greedy text's third token
[ "$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])[2])' "$whole")" = k ] && ok ||
  bad "the greedy text's third character is not k: $whole"
for stream in false true; do
  so=; [ $stream = true ] && so=',"stream_options":{"include_usage":true}'
  post /v1/completions "{\"model\":$N,\"prompt\":\"$PROMPT\",\"max_tokens\":40,\"temperature\":0,\"stop_token_ids\":[107],\"logprobs\":0,\"stream\":$stream$so}"
  if [ $stream = false ]; then
    py "j['choices'][0]['text'] == $whole[:2] and j['choices'][0]['finish_reason'] == 'stop' and j['usage']['completion_tokens'] == 3 and j['choices'][0]['logprobs']['tokens'][2] == 'k'" &&
      ok || bad "stop_token_ids: $BODY"
  else
    py "text == $whole[:2] and chunks[-2]['choices'][0]['finish_reason'] == 'stop' and chunks[-1]['usage']['completion_tokens'] == 3" &&
      ok || bad "stop_token_ids streamed: $BODY"
  fi
done

# log probabilities: one entry a token, the top ones likeliest first
post /v1/completions "{\"model\":$N,\"prompt\":\"$PROMPT\",\"max_tokens\":6,\"temperature\":0,\"logprobs\":3}"
py "len(j['choices'][0]['logprobs']['tokens']) == 6 and len(j['choices'][0]['logprobs']['token_logprobs']) == 6 and all(1 <= len(t) <= 3 and max(t.values()) <= 0 for t in j['choices'][0]['logprobs']['top_logprobs']) and j['choices'][0]['logprobs']['text_offset'][0] == 0 and all(lp >= max(t.values()) for lp, t in zip(j['choices'][0]['logprobs']['token_logprobs'], j['choices'][0]['logprobs']['top_logprobs']))" &&
  ok || bad "logprobs: $BODY"
# text_offset: the character of the returned text holding each token's first
# byte. This tokenizer has a token per byte, so a character of 2 to 4 bytes
# spans tokens (and a byte cut-off or invalid is one U+FFFD): the offsets
# are those of the bytes of the output ids (streamed by the line protocol),
# worked out by Python's own decoder, not each token's text decoded alone.
ids=$(echo "{\"id\":1,\"prompt_ids\":[$(printf '%s' "$PROMPT" | od -An -tu1 | xargs | tr ' ' ,)],\"max_new_tokens\":40,\"ignore_eos\":true}" |
  "$B/moec" serve "$M" --backend cpu --stdin 2>/dev/null | sed -n 's/.*"done":true,"tokens":\[\([0-9,]*\)\].*/\1/p')
for stream in false true; do
  post /v1/completions "{\"model\":$N,\"prompt\":\"$PROMPT\",\"max_tokens\":40,\"temperature\":0,\"ignore_eos\":true,\"logprobs\":0,\"stream\":$stream}"
  python3 - "$T/body" "$ids" <<'PY' && ok || bad "text_offset (stream $stream): $BODY"
import codecs, json, sys
raw = open(sys.argv[1], "rb").read().decode()
if raw.startswith("{"):
    chunks = [json.loads(raw)]
else:
    chunks = [json.loads(l[6:]) for l in raw.split("\n\n") if l.startswith("data: {")]
text, offs = "", []
for c in chunks:
    ch = c["choices"][0]
    text += ch["text"]
    offs += (ch["logprobs"] or {}).get("text_offset", [])
b = bytes(int(x) for x in sys.argv[2].split(","))
spans = []  # the replaced subparts [start, end), as CPython's decoder finds them
def note(e):
    spans.append((e.start, e.end))
    return ("\ufffd", e.end)
codecs.register_error("note", note)
assert b.decode("utf-8", "note") == text, (b, text)
char_of, at, k = [], 0, 0
while at < len(b):
    end = next((e for s, e in spans if s == at), None)
    if end is None:
        lead = b[at]
        end = at + (1 if lead < 0x80 else 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4)
    char_of += [k] * (end - at)
    at, k = end, k + 1
# the output must split a character over tokens, or the test proves nothing
assert any(char_of[i] == char_of[i + 1] for i in range(len(b) - 1)), b
assert offs == char_of, (offs, char_of)
PY
done

# sampling is seeded: the same seed gives the same text
post /v1/completions "{\"model\":$N,\"prompt\":\"$PROMPT\",\"max_tokens\":12,\"temperature\":1.5,\"top_p\":0.9,\"top_k\":50,\"min_p\":0.01,\"presence_penalty\":0.5,\"frequency_penalty\":0.2,\"repetition_penalty\":1.1,\"seed\":7}"
first=$BODY
post /v1/completions "{\"model\":$N,\"prompt\":\"$PROMPT\",\"max_tokens\":12,\"temperature\":1.5,\"top_p\":0.9,\"top_k\":50,\"min_p\":0.01,\"presence_penalty\":0.5,\"frequency_penalty\":0.2,\"repetition_penalty\":1.1,\"seed\":7}"
[ "$CODE" = 200 ] && [ "$(echo "$first" | sed 's/"id":"[^"]*","object":"text_completion","created":[0-9]*//')" = \
  "$(echo "$BODY" | sed 's/"id":"[^"]*","object":"text_completion","created":[0-9]*//')" ] && ok ||
  bad "the same seed gave $first and $BODY"
# top_p 0 keeps the likeliest token alone (OpenAI's), not every token (the
# engine's 0): at any temperature and seed the text is the greedy one
for seed in 1 2 3; do
  post /v1/completions "{\"model\":$N,\"prompt\":\"$PROMPT\",\"max_tokens\":40,\"temperature\":1.5,\"top_p\":0,\"seed\":$seed}"
  py "j['choices'][0]['text'] == $whole" && ok || bad "top_p 0, seed $seed: not the greedy text: $BODY"
done

# ---- chat ------------------------------------------------------------------------
# The template renders ChatML; the byte tokenizer makes it the prompt, so the
# answer is the completion of that text.
CHAT_TEXT='<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nName a fox.<|im_end|>\n<|im_start|>assistant\n'
post /v1/completions "{\"model\":$N,\"prompt\":\"$CHAT_TEXT\",\"max_tokens\":24,\"temperature\":0}"
chat_want=$(python3 -c 'import json,sys; print(json.dumps(json.load(open(sys.argv[1]))["choices"][0]["text"]))' "$T/body")
MSGS='[{"role":"system","content":"Be brief."},{"role":"user","content":[{"type":"text","text":"Name a "},{"type":"text","text":"fox."}]}]'
post /v1/chat/completions "{\"model\":$N,\"messages\":$MSGS,\"max_tokens\":24,\"temperature\":0}"
[ "$CODE" = 200 ] && py "j['object'] == 'chat.completion' and j['id'].startswith('chatcmpl-') and j['choices'][0]['message'] == {'role': 'assistant', 'content': $chat_want} and j['usage']['prompt_tokens'] == 100" &&
  ok || bad "chat: want $chat_want: $CODE $BODY"
post /v1/chat/completions "{\"model\":$N,\"messages\":$MSGS,\"max_tokens\":24,\"temperature\":0,\"stream\":true}"
[ "$CODE" = 200 ] && py "chunks[0]['choices'][0]['delta'] == {'role': 'assistant', 'content': ''} and all(c['object'] == 'chat.completion.chunk' for c in chunks) and text == $chat_want and chunks[-1]['choices'][0]['delta'] == {} and chunks[-1]['choices'][0]['finish_reason'] in ('stop', 'length') and events[-1] == '[DONE]'" &&
  ok || bad "chat stream: $CODE $BODY"
post /v1/chat/completions "{\"model\":$N,\"messages\":$MSGS,\"max_tokens\":3,\"temperature\":0,\"logprobs\":true,\"top_logprobs\":2}"
py "len(j['choices'][0]['logprobs']['content']) == 3 and all(len(t['top_logprobs']) == 2 and bytes(t['bytes']).decode() == t['token'] for t in j['choices'][0]['logprobs']['content'])" &&
  ok || bad "chat logprobs: $CODE $BODY"

# ---- errors: 400 -----------------------------------------------------------------
E=invalid_request_error
post /v1/completions ''
expect_error 400 $E null null "the request body is empty: it must be a JSON object"
post /v1/completions '{"model": "tiny-v2", "prompt": "a"'
expect_error 400 $E null null "the request body is not valid JSON (at byte 33)"
post /v1/completions '{"model":"tiny-v2","prompt":"a"} x'
expect_error 400 $E null null "the request body is not valid JSON (at byte 33)"
post /v1/completions '[1, 2]'
expect_error 400 $E null null "the request body must be a JSON object, not an array"
post /v1/completions "$(printf '{"model":"tiny-v2","prompt":"\xff"}')"
expect_error 400 $E null null "the request body is not valid UTF-8 (byte 29)"
post /v1/completions '{"model":"tiny-v2","prompt":"a","prompt":"b"}'
expect_error 400 $E null null 'the request body: key \"prompt\" appears twice'
# a NUL in a string (cJSON would cut the text there) and a raw control
# character (not JSON) are refused; an escaped backslash before "u0000" is
# text like any other
post /v1/completions '{"model":"tiny-v2","prompt":"a\u0000b","max_tokens":1}'
expect_error 400 $E null null \
  'the request body holds a NUL character (\\u0000) in a string (byte 30): moec takes no NUL in text'
post /v1/completions '{"model":"tiny-v2\u0000x","prompt":"a","max_tokens":1}'
expect_error 400 $E null null \
  'the request body holds a NUL character (\\u0000) in a string (byte 17): moec takes no NUL in text'
post /v1/completions "$(printf '{"model":"tiny-v2","prompt":"a\001b","max_tokens":1}')"
expect_error 400 $E null null \
  'the request body is not valid JSON (at byte 30: a control character in a string must be escaped)'
post /v1/completions '{"model":"tiny-v2","prompt":"a\\u0000b","max_tokens":1}'
[ "$CODE" = 200 ] && py 'j["usage"]["prompt_tokens"] == 8' && ok || bad "escaped backslash: $CODE $BODY"
post /v1/completions '{"model":"tiny-v2","prompt":"ab","max_tokens":1,"stop_token_ids":[5,256]}'
expect_error 400 $E '"stop_token_ids"' null \
  "'stop_token_ids'[1] = 256 is outside the vocabulary (256 ids)"
post /v1/completions '{"prompt":"a"}'
expect_error 400 $E '"model"' null "'model' is required"
post /v1/completions '{"model":7,"prompt":"a"}'
expect_error 400 $E '"model"' null "'model' must be a string, not a number"
post /v1/completions '{"model":"tiny-v2"}'
expect_error 400 $E '"prompt"' null "'prompt' is required"
post /v1/completions '{"model":"tiny-v2","prompt":""}'
expect_error 400 $E '"prompt"' null "'prompt' is empty: it gives no tokens"
post /v1/completions '{"model":"tiny-v2","prompt":{"a":1}}'
expect_error 400 $E '"prompt"' null "'prompt' must be a string or a list of token ids, not an object"
post /v1/completions '{"model":"tiny-v2","prompt":["a","b"]}'
expect_error 400 $E '"prompt"' null "'prompt' holds 2 prompts: one a request (n must be 1 too)"
post /v1/completions '{"model":"tiny-v2","prompt":[5,"x"]}'
expect_error 400 $E '"prompt"' null "'prompt'[1] is not a token id (an integer)"
post /v1/completions '{"model":"tiny-v2","prompt":[5,256]}'
expect_error 400 $E '"prompt"' null "prompt token 1: id 256 is outside the vocabulary (256 ids)"
post /v1/completions '{"model":"tiny-v2","prompt":"a","max_tokens":0}'
expect_error 400 $E '"max_tokens"' null "'max_tokens' must be from 1 to 2147483647, got 0"
post /v1/completions '{"model":"tiny-v2","prompt":"a","max_tokens":2.5}'
expect_error 400 $E '"max_tokens"' null "'max_tokens' must be an integer, not a fraction"
post /v1/completions '{"model":"tiny-v2","prompt":"abc","max_tokens":16382}'
expect_error 400 $E null '"context_length_exceeded"' \
  "too long: 3 prompt + 16382 new = 16385 tokens, more than the 16384 a sequence may hold (max_seq_len)"
post /v1/completions '{"model":"tiny-v2","prompt":"a","temperature":"hot"}'
expect_error 400 $E '"temperature"' null "'temperature' must be a number, not a string"
post /v1/completions '{"model":"tiny-v2","prompt":"a","temperature":-1}'
expect_error 400 $E '"temperature"' null "temperature must be a finite number >= 0, got -1"
post /v1/completions '{"model":"tiny-v2","prompt":"a","top_p":1.5}'
expect_error 400 $E '"top_p"' null "top_p must be a number from 0 to 1, got 1.5"
post /v1/completions '{"model":"tiny-v2","prompt":"a","presence_penalty":3}'
expect_error 400 $E '"presence_penalty"' null "presence_penalty must be a number from -2 to 2, got 3"
post /v1/completions '{"model":"tiny-v2","prompt":"a","top_k":-2}'
expect_error 400 $E '"top_k"' null "'top_k' must be from -1 to 2147483647, got -2"
post /v1/completions '{"model":"tiny-v2","prompt":"a","seed":-1}'
expect_error 400 $E '"seed"' null "'seed' must be from 0 to 9007199254740991, got -1"
# 2^53 + 1 reads as the double 2^53: refused, not run as another seed
post /v1/completions '{"model":"tiny-v2","prompt":"a","seed":9007199254740993}'
expect_error 400 $E '"seed"' null "'seed' must be from 0 to 9007199254740991, got 9.0072e+15"
post /v1/completions '{"model":"tiny-v2","prompt":"a","stream":1}'
expect_error 400 $E '"stream"' null "'stream' must be true or false, not a number"
# refused as OpenAI and vLLM refuse them, not dropped or read as "none"
post /v1/completions '{"model":"tiny-v2","prompt":"a","stream_options":{"include_usage":true}}'
expect_error 400 $E '"stream_options"' null \
  "'stream_options' is only for a streamed request ('stream': true)"
post /v1/chat/completions \
  '{"model":"tiny-v2","messages":[],"stream":false,"stream_options":{}}'
expect_error 400 $E '"stream_options"' null \
  "'stream_options' is only for a streamed request ('stream': true)"
post /v1/completions '{"model":"tiny-v2","prompt":"a","repetition_penalty":0}'
expect_error 400 $E '"repetition_penalty"' null "'repetition_penalty' must be greater than 0, got 0"
post /v1/completions '{"model":"tiny-v2","prompt":"a","max_tokens":1,"repetition_penalty":null,"stream_options":null}'
[ "$CODE" = 200 ] && ok || bad "null repetition_penalty and stream_options: $CODE $BODY"
post /v1/completions '{"model":"tiny-v2","prompt":"a","stop":5}'
expect_error 400 $E '"stop"' null "'stop' must be a string or a list of strings, not a number"
post /v1/completions '{"model":"tiny-v2","prompt":"a","stop":["x",""]}'
expect_error 400 $E '"stop"' null "'stop'[1] must be a non-empty string"
post /v1/completions '{"model":"tiny-v2","prompt":"a","n":2}'
expect_error 400 $E '"n"' null "'n' must be 1: moec gives one choice a request, got 2"
post /v1/completions '{"model":"tiny-v2","prompt":"a","best_of":3}'
expect_error 400 $E '"best_of"' null "'best_of' must be 1: moec gives one choice a request, got 3"
# whole numbers past a double's exact integers are out of range, not fractions
post /v1/completions '{"model":"tiny-v2","prompt":"a","n":1e300}'
expect_error 400 $E '"n"' null "'n' must be 1: moec gives one choice a request, got 1e+300"
post /v1/completions '{"model":"tiny-v2","prompt":"a","max_tokens":1e20}'
expect_error 400 $E '"max_tokens"' null "'max_tokens' must be from 1 to 2147483647, got 1e+20"
post /v1/completions '{"model":"tiny-v2","prompt":"a","max_tokens":2.5}'
expect_error 400 $E '"max_tokens"' null "'max_tokens' must be an integer, not a fraction"
post /v1/completions '{"model":"tiny-v2","prompt":"a","echo":true}'
expect_error 400 $E '"echo"' null "'echo' is not supported"
post /v1/completions '{"model":"tiny-v2","prompt":"a","logit_bias":{"5":10}}'
expect_error 400 $E '"logit_bias"' null "'logit_bias' is not supported"
post /v1/completions '{"model":"tiny-v2","prompt":"a","temperature":1e39}'
expect_error 400 $E '"temperature"' null "'temperature' is past a float's range (3.40282e+38), got 1e+39"
post /v1/completions '{"model":"tiny-v2","prompt":"a","logprobs":21}'
expect_error 400 $E '"logprobs"' null "'logprobs' must be from 0 to 20, got 21"
post /v1/chat/completions '{"model":"tiny-v2","messages":[]}'
expect_error 400 $E '"messages"' null "'messages' must be a non-empty list of messages"
post /v1/chat/completions '{"model":"tiny-v2","messages":[{"content":"hi"}]}'
expect_error 400 $E '"messages"' null "'messages'[0] must be an object with a string 'role'"
post /v1/chat/completions '{"model":"tiny-v2","messages":[{"role":"user","content":[{"type":"image_url"}]}]}'
expect_error 400 $E '"messages"' null \
  "'messages'[0].content[0] must be a {\\\"type\\\": \\\"text\\\", \\\"text\\\": ...} part (moec takes text alone)"
post /v1/chat/completions '{"model":"tiny-v2","messages":[{"role":"user","content":"hi"}],"top_logprobs":2}'
expect_error 400 $E '"top_logprobs"' null "'top_logprobs' needs 'logprobs': true"
post /v1/chat/completions '{"model":"tiny-v2","messages":[{"role":"user","content":"hi"}],"logprobs":true,"top_logprobs":30}'
expect_error 400 $E '"top_logprobs"' null "top_logprobs must be from 0 to 20, got 30"
# chat_template_kwargs: add_generation_prompt sets the option (vLLM's), the
# same prompt as the field gives; a variable the request or the tokenizer
# sets is refused naming chat_template_kwargs (not 'messages', as a key
# written twice in a request the client never wrote)
HI='"messages":[{"role":"user","content":"hi"}],"max_tokens":1'
post /v1/chat/completions "{\"model\":$N,$HI,\"chat_template_kwargs\":{\"add_generation_prompt\":false}}"
[ "$CODE" = 200 ] && py "j['usage']['prompt_tokens'] == 30" && ok || bad "kwargs' add_generation_prompt: $BODY"
post /v1/chat/completions "{\"model\":$N,$HI,\"add_generation_prompt\":false}"
[ "$CODE" = 200 ] && py "j['usage']['prompt_tokens'] == 30" && ok || bad "add_generation_prompt: $BODY"
post /v1/chat/completions "{\"model\":$N,$HI,\"chat_template_kwargs\":{\"add_generation_prompt\":1}}"
expect_error 400 $E '"chat_template_kwargs"' null \
  "'chat_template_kwargs'.add_generation_prompt must be true or false, not a number"
post /v1/chat/completions "{\"model\":$N,$HI,\"chat_template_kwargs\":{\"messages\":[]}}"
expect_error 400 $E '"chat_template_kwargs"' null \
  "'chat_template_kwargs' sets 'messages', which the request's own 'messages' sets"
post /v1/chat/completions "{\"model\":$N,$HI,\"tools\":[],\"chat_template_kwargs\":{\"tools\":[]}}"
expect_error 400 $E '"chat_template_kwargs"' null \
  "'chat_template_kwargs' sets 'tools', which the request's own 'tools' sets"
post /v1/chat/completions "{\"model\":$N,$HI,\"chat_template_kwargs\":{\"eos_token\":\"x\"}}"
expect_error 400 $E '"chat_template_kwargs"' null \
  "'chat_template_kwargs' sets 'eos_token', which comes from the tokenizer"
# unknown fields are ignored, as OpenAI's API does
post /v1/completions '{"model":"tiny-v2","prompt":"a","max_tokens":1,"user":"u","frobnicate":{"x":[1]}}'
[ "$CODE" = 200 ] && ok || bad "unknown fields: $CODE $BODY"

# ---- errors: 404, 405, 413, 431 ---------------------------------------------------
post /v1/completions '{"model":"gpt-4","prompt":"a"}'
expect_error 404 $E '"model"' '"model_not_found"' "The model 'gpt-4' does not exist: this server serves 'tiny-v2'"
http GET /v1/engines
expect_error 404 $E null '"not_found"' \
  "Invalid URL (GET /v1/engines): the endpoints are POST /v1/completions, POST /v1/chat/completions, GET /v1/models, GET /health, GET /metrics"
http GET /v1/completions
expect_error 405 $E null '"method_not_allowed"' "Method GET is not allowed on /v1/completions: it takes POST"
allow=$(curl -s -o /dev/null -D - -X POST "$URL/health" | tr -d '\r' | sed -n 's/^Allow: //p')
[ "$allow" = GET ] && ok || bad "405 Allow header: $allow"
# HEAD where GET is taken (load balancers' health checks): 200, no body
head=$(curl -s -I "$URL/health" | tr -d '\r' | head -1)
[ "$head" = "HTTP/1.1 200 OK" ] && ok || bad "HEAD /health: $head"
[ -z "$(curl -s -I "$URL/v1/models" -o - | tr -d '\r' | sed '1,/^$/d')" ] && ok ||
  bad "HEAD /v1/models sent a body"
code=$(curl -s -I -o /dev/null -w '%{http_code}' "$URL/v1/completions")
[ "$code" = 405 ] && ok || bad "HEAD on a POST endpoint: $code"
python3 -c 'import sys; sys.stdout.write("{\"model\":\"tiny-v2\",\"prompt\":\"" + "a" * 70000 + "\"}")' >"$T/big.json"
post /v1/completions "@$T/big.json"
expect_error 413 $E null '"request_too_large"' "the request body is larger than 65536 bytes (--max-body-kib)"
http POST /v1/completions -H 'Expect:' --data-binary "@$T/big.json"
expect_error 413 $E null '"request_too_large"' "the request body is larger than 65536 bytes (--max-body-kib)"
# past 16 times the limit: answered before it is read. The client waits for
# the answer to its Expect: 100-continue before it sends the body; one that
# streams 2 MB at once may find the connection reset before it reads the
# 413 (the server closes without reading the rest), so the check would race
# (it read 000 once, the thirtieth round's CI)
head -c 2000000 /dev/zero >"$T/huge"
http POST /v1/completions -H 'Expect: 100-continue' --data-binary "@$T/huge"
expect_error 413 $E null '"request_too_large"' "the request body is larger than 65536 bytes (--max-body-kib)"
http GET /health -H "X-Big: $(head -c 70000 /dev/zero | tr '\0' b)"
[ "$CODE" = 431 ] && ok || bad "a 70 KB header: $CODE"

# two Content-Lengths that differ: refused before the body is read and the
# connection closed (libmicrohttpd took one, and what followed it in the body
# was the next request: request smuggling past a proxy that took the other)
got=$(python3 - "$PORT" <<'PY'
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=10)
body = b'{"model":"tiny-v2","prompt":"a","max_tokens":1}'
s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n"
          b"Content-Length: 5\r\n\r\n%sGET /health HTTP/1.1\r\nHost: x\r\n\r\n" % (len(body), body))
out = b""
while True:
    c = s.recv(65536)
    if not c:
        break
    out += c
head, _, rest = out.partition(b"\r\n\r\n")
print(head.split(b"\r\n")[0].decode(), rest.decode())
PY
)
[ "$got" = 'HTTP/1.1 400 Bad Request {"error":{"message":"the request has Content-Length headers that differ: it must have one","type":"invalid_request_error","param":null,"code":null}}' ] &&
  ok || bad "two Content-Lengths: $got"

# ---- connections: clients that hang up half-way, one past --max-connections -------
# 100 clients that send part of a request and close: the next client is
# served at once, not after --http-timeout (30 s here; libmicrohttpd's epoll
# loop, used before, held such sockets that long). Then 32 idle connections
# (--max-connections 32): a 33rd is closed at once, unanswered, and once
# they go the server answers again.
python3 - "$PORT" <<'PY' && ok || bad "connections"
import socket, sys, time
port = int(sys.argv[1])
def health(timeout):
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    out = b""
    while True:
        c = s.recv(4096)
        if not c:
            return out
        out += c
half = b'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 60\r\n\r\n{"model"'
for _ in range(100):
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(half)
    s.close()
t = time.time()
out = health(20)
if not out.startswith(b"HTTP/1.1 200") or time.time() - t > 5:
    sys.exit("after 100 half-sent requests: %.1f s, %r" % (time.time() - t, out[:40]))
time.sleep(0.5)
held = [socket.create_connection(("127.0.0.1", port)) for _ in range(32)]
time.sleep(0.5)
s = socket.create_connection(("127.0.0.1", port), timeout=5)
try:
    s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    got = s.recv(100)
except (ConnectionResetError, BrokenPipeError):
    got = b""
except socket.timeout:
    sys.exit("a 33rd connection was left waiting")
if got:
    sys.exit("a 33rd connection was answered: %r" % got[:40])
for h in held:
    h.close()
time.sleep(0.5)
if not health(10).startswith(b"HTTP/1.1 200"):
    sys.exit("no answer once the 32 went")
PY

# ---- the queue: 429, and clients that go away ------------------------------------
# A runs (the one sequence) far longer than this takes; B waits (the one
# place); C is refused. B's client leaves while queued, then A's mid-stream:
# both are cancelled, and the next request is served.
metric() { curl -s "$URL/metrics" | sed -n "s/^$1 //p"; }
c0=$(metric moec_requests_cancelled_total) # the stop strings' requests
curl -s -N "$URL/v1/completions" -d "{\"model\":$N,\"prompt\":\"long\",\"max_tokens\":16000,\"ignore_eos\":true,\"stream\":true}" >"$T/a.out" &
A=$!
BG+=("$A")
for _ in $(seq 200); do [ -s "$T/a.out" ] && break; sleep 0.05; done
[ -s "$T/a.out" ] && ok || bad "A never streamed"
curl -s "$URL/v1/completions" -d "{\"model\":$N,\"prompt\":\"b\",\"max_tokens\":4}" >"$T/b.out" &
B_PID=$!
BG+=("$B_PID")
for _ in $(seq 200); do [ "$(metric moec_http_requests_waiting)" = 1 ] && break; sleep 0.05; done
[ "$(metric moec_http_requests_waiting)" = 1 ] && ok || bad "B is not waiting: $(curl -s "$URL/metrics")"
post /v1/completions "{\"model\":$N,\"prompt\":\"c\",\"max_tokens\":4}"
expect_error 429 rate_limit_error null '"queue_full"' \
  "too many requests waiting: 1 are queued with no token yet (--max-waiting); retry later"
kill "$B_PID"
for _ in $(seq 200); do [ "$(metric moec_requests_cancelled_total)" = $((c0 + 1)) ] && break; sleep 0.05; done
[ "$(metric moec_requests_cancelled_total)" = $((c0 + 1)) ] && [ "$(metric moec_http_requests_waiting)" = 0 ] &&
  ok || bad "B's going did not cancel it: $(curl -s "$URL/metrics")"
kill "$A"
for _ in $(seq 200); do [ "$(metric moec_requests_cancelled_total)" = $((c0 + 2)) ] && break; sleep 0.05; done
[ "$(metric moec_requests_cancelled_total)" = $((c0 + 2)) ] && [ "$(metric moec_requests_running)" = 0 ] &&
  ok || bad "A's going did not cancel it: $(curl -s "$URL/metrics")"
post /v1/completions "{\"model\":$N,\"prompt\":\"$PROMPT\",\"max_tokens\":40,\"temperature\":0}"
py "j['choices'][0]['text'] == $whole" && ok || bad "after the cancels: $BODY"

# ---- metrics -------------------------------------------------------------------------
http GET /metrics
[ "$CODE" = 200 ] && ok || bad "metrics: $CODE"
for line in 'moec_http_requests_total{endpoint="/v1/completions",status="429"} 1' \
  'moec_http_requests_total{endpoint="/v1/completions",status="413"} 3' \
  'moec_http_requests_total{endpoint="/v1/models/",status="404"} 1' \
  'moec_http_requests_total{endpoint="other",status="404"} 1' \
  'moec_requests_waiting 0' '# TYPE moec_time_to_first_token_seconds histogram' \
  '# TYPE moec_inter_token_latency_seconds histogram' 'moec_kv_blocks 1100'; do
  grep -qxF "$line" "$T/body" && ok || bad "metrics lack '$line': $BODY"
done
py "all(float(l.split()[-1]) >= 0 for l in raw.splitlines() if l and not l.startswith('#'))" && ok ||
  bad "metrics: a value that is not a number"
done=$(sed -n 's/^moec_time_to_first_token_seconds_count //p' "$T/body")
gen=$(sed -n 's/^moec_generation_tokens_total //p' "$T/body")
itl=$(sed -n 's/^moec_inter_token_latency_seconds_count //p' "$T/body")
[ "$((done + itl))" = "$gen" ] && ok || bad "first tokens $done + later ones $itl != $gen generated"

# ---- a request waiting when the service stops: 503 ------------------------------
curl -s -N "$URL/v1/completions" -d "{\"model\":$N,\"prompt\":\"long\",\"max_tokens\":16000,\"ignore_eos\":true,\"stream\":true}" >"$T/a2.out" &
A=$!
BG+=("$A")
for _ in $(seq 200); do [ -s "$T/a2.out" ] && break; sleep 0.05; done
curl -s -o "$T/b2.out" -w '%{http_code}' "$URL/v1/completions" -d "{\"model\":$N,\"prompt\":\"b\",\"max_tokens\":4}" >"$T/b2.code" &
B_PID=$!
for _ in $(seq 200); do [ "$(metric moec_http_requests_waiting)" = 1 ] && break; sleep 0.05; done
http_stop
wait "$B_PID"
[ "$STOP_RC" = 0 ] && ok || bad "the server exited $STOP_RC on SIGTERM: $(cat "$T/serve.err")"
[ "$(cat "$T/b2.code")" = 503 ] &&
  [ "$(cat "$T/b2.out")" = '{"error":{"message":"the service is shutting down","type":"server_error","param":null,"code":"shutting_down"}}' ] &&
  ok || bad "a waiting request at SIGTERM: $(cat "$T/b2.code") $(cat "$T/b2.out")"
wait "$A"
tail -c 200 "$T/a2.out" | grep -qF 'data: {"error":{"message":"the service is shutting down"' && ok ||
  bad "a stream at SIGTERM ended with: $(tail -c 300 "$T/a2.out")"

# ---- both protocols on one engine; a stalled client timed out ----------------------
# --port's line protocol and --http together, an explicit --host and
# --served-model-name; --http-timeout 1 closes a client that sent half a
# request (within the 20 s this waits).
if http_start "$T/serve2.err" "$M" --backend cpu --port 0 --http 0 --host 127.0.0.1 \
  --served-model-name fox/v1 --http-timeout 1 --tokenizer "$S/tests/data/tokenizers/bytes256"; then
  line_port=$(sed -n 's/.*listening on 127\.0\.0\.1:\([0-9]*\);.*/\1/p' "$T/serve2.err")
  URL=http://127.0.0.1:$PORT
  post /v1/completions '{"model":"fox/v1","prompt":[84,104,101],"max_tokens":4,"temperature":0}'
  line=$(python3 - "$line_port" <<'PY'
import json, socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
s.sendall(b'{"id":1,"prompt_ids":[84,104,101],"max_new_tokens":4}\n')
buf = b""
while b'"done":true' not in buf:
    chunk = s.recv(65536)
    if not chunk:
        break
    buf += chunk
print(",".join(map(str, json.loads(buf.splitlines()[-1])["tokens"])))
PY
)
  # the same greedy tokens, as text through the tokenizer
  echo "$line" | "$B/moec" tokenize "$M" --decode --skip-special-tokens >"$T/line.txt"
  [ "$CODE" = 200 ] && [ -n "$line" ] && python3 -c '
import json, sys
sys.exit(json.load(open(sys.argv[1]))["choices"][0]["text"].encode() != open(sys.argv[2], "rb").read())' \
    "$T/body" "$T/line.txt" && ok || bad "line protocol $line, HTTP $CODE $BODY"
  post /v1/completions '{"model":"tiny-v2","prompt":"a"}'
  expect_error 404 $E '"model"' '"model_not_found"' "The model 'tiny-v2' does not exist: this server serves 'fox/v1'"
  # a body's JSON values are bounded by the sequence length (4 a token and
  # 4096 more: 69632 here), before its tree is built: 70000 prompt ids are
  # refused as such, 60000 fit that bound and are too long for a sequence
  for n in 70000 60000; do
    python3 -c 'import sys; n = int(sys.argv[1]); sys.stdout.write(
        "{\"model\":\"fox/v1\",\"prompt\":[" + ",".join(["5"] * n) + "],\"max_tokens\":1}")' \
      "$n" >"$T/many.json"
    post /v1/completions "@$T/many.json"
    if [ "$n" = 70000 ]; then
      expect_error 400 $E null null "the request body holds more than 69632 JSON values (4 times \
the sequence length 16384, and 4096): no request needs more"
    else
      expect_error 400 $E null '"context_length_exceeded"' \
        "too long: 60000 prompt + 1 new = 60001 tokens, more than the 16384 a sequence may hold (max_seq_len)"
    fi
  done
  # --tokenizer: a folder with no chat template
  post /v1/chat/completions '{"model":"fox/v1","messages":[{"role":"user","content":"hi"}]}'
  expect_error 400 $E '"messages"' null \
    "the model has no chat template (tokenizer_config.json's chat_template): use /v1/completions"
  closed=$(python3 - "$PORT" <<'PY'
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
s.sendall(b"POST /v1/completions HTTP/1.1\r\nContent-Length: 50\r\n\r\n{")
s.settimeout(20)
try:
    print("closed" if s.recv(100) == b"" else "answered")
except OSError as e:
    print("still open: %s" % e)
PY
)
  [ "$closed" = closed ] && ok || bad "a half-sent request with --http-timeout 1: $closed"
  http_stop
  [ "$STOP_RC" = 0 ] && ok || bad "the second server exited $STOP_RC"
else
  bad "no second server"
fi

# ---- a KV pool shorter than --max-seq-len ---------------------------------------------
# 8 blocks of 16 tokens hold a sequence of 129 (the last token needs no KV):
# that is max_model_len, and a chat that leaves max_tokens out runs to it
# (to max_seq_len it was refused as too long, whatever its prompt)
if http_start "$T/serve3.err" "$M" --backend cpu --http 0 --kv-blocks 8; then
  URL=http://127.0.0.1:$PORT
  http GET /v1/models
  py 'j["data"][0]["max_model_len"] == 129' && ok || bad "a small pool's max_model_len: $BODY"
  post /v1/chat/completions "{\"model\":$N,\"messages\":$MSGS,\"temperature\":0,\"ignore_eos\":true}"
  [ "$CODE" = 200 ] && py "j['usage'] == {'prompt_tokens': 100, 'completion_tokens': 29, 'total_tokens': 129} and j['choices'][0]['finish_reason'] == 'length'" &&
    ok || bad "a chat with no max_tokens on a small pool: $CODE $BODY"
  http_stop
  [ "$STOP_RC" = 0 ] && ok || bad "the third server exited $STOP_RC"
else
  bad "no third server"
fi

finish test_http
