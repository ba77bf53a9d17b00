#!/usr/bin/env bash
# test_serve.sh — the generation service (`moec serve`, which also takes a
# model folder; moec-serve runs the same loop on plan files) on the CPU
# backend as a client meets it, over
# stdin and over TCP (bash's /dev/tcp, and python3 where many connections
# or raw sockets are needed): every tiny model's golden prompt streams
# transformers' greedy ids; requests sent together each get their own tokens
# (the same as `moec run`; deepseek_v32's prompt, its goldens pending, too),
# a long prompt prefilled in chunks included; eos
# ends a sequence unless ignore_eos; every bad request (unknown or repeated
# fields, ids that are not UTF-8 or already in flight included) gets its
# exact error reply, valid UTF-8 JSON, while the others complete, and so
# does a request whose logits go NaN (a broken checkpoint); a busy
# service queues requests (none refused for arriving while it is busy) and
# serves them all; sampling settings, seeds, log probabilities, stop ids,
# the prefix cache (cached_tokens), stats and cancel lines, and refusals of
# requests that can never fit;
# the TCP service answers each connection with its own requests' replies,
# turns away connections past --max-connections, refuses request lines past
# --max-buffer-mib, drops clients that leave too many replies unread, gives
# the memory of a burst of big request lines back, and stops cleanly on
# SIGTERM; bad command lines exit 2.
set -u
B=${MOEC_BUILD_DIR:?}
S=${MOEC_SOURCE_DIR:?}
D=$S/tests/data
T=$(mktemp -d)
# `moec serve` as one program path, so that "$SERVE" ... & gives its pid.
SERVE=$T/moec-serve-model
printf '#!/bin/sh\nexec "%s/moec" serve "$@"\n' "$B" >"$SERVE"
chmod +x "$SERVE"
SERVER_PID=
cleanup() {
  [ -n "$SERVER_PID" ] && kill "$SERVER_PID" 2>/dev/null
  rm -rf "$T"
}
trap cleanup EXIT
# shellcheck source=tests/lib.sh
source "$S/tests/lib.sh"
EXPECT_TIMEOUT=20


# serve OUT ARGS...: moec-serve --stdin --backend cpu ARGS, requests from
# stdin, replies into OUT, stderr into OUT.err; must exit 0.
serve() {
  local out=$1; shift
  "$SERVE" "$@" --stdin --backend cpu >"$out" 2>"$out.err"
  local rc=$?
  [ "$rc" = 0 ] && ok || bad "moec-serve $* exited $rc: $(cat "$out.err")"
}

# golden MODEL FIELD: the golden's prompt_ids or greedy_ids, comma-separated.
golden() {
  tr -d ' \n' <"$D/$1/golden.json" | sed -n "s/.*\"$2\":\[\([0-9,]*\)\].*/\1/p"
}

# reference MODEL IDS N: `moec run`'s N greedy ids (ignoring eos), comma-separated.
reference() {
  local out
  out=$("$B/moec" run "$D/$1" --prompt-ids "$2" --max-new-tokens "$3" --ignore-eos --backend cpu)
  echo "${out// /,}"
}

# streamed FILE ID: the ids streamed for request ID (JSON text), in order,
# comma-separated; "BAD-INDEX" when the indices are not 0, 1, 2, ...
streamed() {
  local i=0 list="" idx tok
  while IFS=: read -r idx tok; do
    [ "$idx" = "$i" ] || { echo BAD-INDEX; return; }
    list=$list${list:+,}$tok
    i=$((i + 1))
  done < <(grep -F "{\"id\":$2,\"token\":" "$1" | sed -E 's/.*"token":([0-9]+),"index":([0-9]+)\}$/\2:\1/')
  echo "$list"
}

# expect_tokens FILE ID TOKENS FINISH: request ID streamed TOKENS and ended
# with its done line (its metrics after the finish).
expect_tokens() {
  local file=$1 id=$2 want=$3 finish=$4
  local done_line="{\"id\":$id,\"done\":true,\"tokens\":[$want],\"finish\":\"$finish\",\"prompt_tokens\":"
  grep -qF "$done_line" "$file" && ok || bad "request $id: no line $done_line... in: $(cat "$file")"
  local got
  got=$(streamed "$file" "$id")
  [ "$got" = "$want" ] && ok || bad "request $id streamed '$got', want '$want'"
}

# expect_line FILE LINE: FILE has exactly that line.
expect_line() {
  grep -qxF "$2" "$1" && ok || bad "no line $2 in: $(cat "$1")"
}

# ---- command line -------------------------------------------------------------
for f in --weights --stdin --port --max-connections --max-buffer-mib --max-seqs --max-seq-len \
  --kv-blocks --kv-memory-fraction --kv-block-size --no-prefix-cache \
  --backend --single-stream --eager --help prompt_ids max_new_tokens ignore_eos '"finish"' \
  stop_token_ids temperature top_k top_p min_p repetition_penalty presence_penalty \
  frequency_penalty seed logprobs top_logprobs cached_tokens ttft_ms itl_ms '"cancel": true' \
  '{"stats": true}' 'other field is refused' 'not with --stdin' 'than 16 MiB of replies unread' \
  'a request waits while the pool'; do
  expect 0 "$f" -- "$SERVE" --help
done
expect 2 "missing MODEL_DIR or PLAN" -- "$SERVE"
expect 2 "unknown option --frob" -- "$SERVE" "$D/qwen3_moe" --frob
expect 2 "--backend: 'tpu' is not cpu, cuda or auto" -- "$SERVE" "$D/qwen3_moe" --backend tpu
expect 2 "--port: '70000' is not a port number" -- "$SERVE" "$D/qwen3_moe" --port 70000
expect 2 "--max-seqs: '0' is not an integer from 1 to 65536" -- "$SERVE" "$D/qwen3_moe" --max-seqs 0
expect 2 "--max-seqs: '1000000' is not an integer from 1 to 65536" -- \
  "$SERVE" "$D/qwen3_moe" --max-seqs 1000000
expect 2 "--max-seq-len: '1e9' is not an integer from 1 to 67108864" -- \
  "$SERVE" "$D/qwen3_moe" --max-seq-len 1e9
expect 2 "--max-connections: '0' is not an integer from 1 to 65536" -- \
  "$SERVE" "$D/qwen3_moe" --max-connections 0
expect 2 "--max-buffer-mib: '70000' is not an integer from 1 to 65536" -- \
  "$SERVE" "$D/qwen3_moe" --max-buffer-mib 70000
expect 2 "--stdin and --port cannot be used together: requests come from stdin or from TCP, \
not both" -- \
  "$SERVE" "$D/qwen3_moe" --stdin --port 0
expect 2 "--stdin and --port cannot be used together" -- "$SERVE" "$D/qwen3_moe" --port 0 --stdin
expect 2 "--max-seq-len needs a value" -- "$SERVE" "$D/qwen3_moe" --max-seq-len
expect 2 "--kv-blocks: '0' is not an integer from 1 to 1073741824" -- \
  "$SERVE" "$D/qwen3_moe" --kv-blocks 0
expect 2 "--kv-memory-fraction: '1.5' is not a number above 0 and at most 1" -- \
  "$SERVE" "$D/qwen3_moe" --kv-memory-fraction 1.5
expect 2 "--kv-memory-fraction: 'half' is not a number above 0 and at most 1" -- \
  "$SERVE" "$D/qwen3_moe" --kv-memory-fraction half
expect 1 "kv_block_size must be from 1 to 4096 tokens (0: the default), got 5000" -- \
  "$SERVE" "$D/qwen3_moe" --stdin --backend cpu --kv-block-size 5000
echo "not a plan" >"$T/x.moec"
expect 2 "is a plan file: --weights MODEL_DIR" -- "$SERVE" "$T/x.moec"
expect 2 "--backend cpu: $T/x.moec is a plan" -- "$SERVE" "$T/x.moec" --weights "$D/qwen3_moe" --backend cpu
expect 1 "max_seq_len 100000 exceeds the model's max_position_embeddings 512" -- \
  "$SERVE" "$D/qwen3_moe" --stdin --backend cpu --max-seq-len 100000
expect 1 "nonexistent/config.json" -- "$SERVE" "$T/nonexistent" --stdin
# moec-serve links the runtime alone: plan files only, the rest said by name.
expect 2 "$D/qwen3_moe is not a plan file: moec-serve serves plan files (moec compile); \`moec serve MODEL_DIR\` compiles and serves a model folder" -- \
  "$B/moec-serve" "$D/qwen3_moe" --stdin
expect 2 "is a plan file: --weights MODEL_DIR" -- "$B/moec-serve" "$T/x.moec"
expect 1 "no CUDA" -- "$B/moec-serve" "$T/x.moec" --weights "$D/qwen3_moe" --stdin

# ---- the goldens, one model at a time -----------------------------------------
for m in deepseek_v2 deepseek_v2_qlora deepseek_v3 qwen2_moe qwen3_moe; do
  prompt=$(golden "$m" prompt_ids) greedy=$(golden "$m" greedy_ids)
  n=$(echo "$greedy" | tr ',' '\n' | wc -l)
  echo "{\"id\":\"$m\",\"prompt_ids\":[$prompt],\"max_new_tokens\":$n,\"ignore_eos\":true}" |
    serve "$T/$m.out" "$D/$m"
  expect_tokens "$T/$m.out" "\"$m\"" "$greedy" length
  grep -q "cpu backend, up to 8 sequences at once of up to 512 tokens, a KV pool of 256 blocks of 16 tokens, 64 tokens a step" "$T/$m.out.err" && ok ||
    bad "$m: startup line: $(cat "$T/$m.out.err")"
done
# deepseek_v32's goldens are pending (test_golden): its prompt.json prompt,
# a context past its index_topk, streams what `moec run` gives.
m=deepseek_v32
prompt=$(tr -d ' \n' <"$D/$m/prompt.json" | sed -n 's/.*"prompt_ids":\[\([0-9,]*\)\].*/\1/p')
want=$(reference $m "$prompt" 9)
echo "{\"id\":\"$m\",\"prompt_ids\":[$prompt],\"max_new_tokens\":9,\"ignore_eos\":true}" |
  serve "$T/$m.out" "$D/$m"
expect_tokens "$T/$m.out" "\"$m\"" "$want" length

# ---- requests together ----------------------------------------------------------
# Three at once (string and number ids), a 100-token prompt (two prefill
# chunks) beside them, then eos: [116] continues 64, 1 (eos_token_id 1).
m=deepseek_v2
long=$(seq 0 99 | awk '{printf "%s%d", (NR > 1 ? "," : ""), ($1 * 37 + 11) % 256}')
want_g=$(golden $m greedy_ids)
want_7=$(reference $m 3,250,7 5)
want_x=$(reference $m 200,1,2,3,4 6)
want_long=$(reference $m "$long" 4)
want_eos8=$(reference $m 116 8)
{
  echo "{\"id\":\"g\",\"prompt_ids\":[$(golden $m prompt_ids)],\"max_new_tokens\":9,\"ignore_eos\":true}"
  echo '{"id":7,"prompt_ids":[3,250,7],"max_new_tokens":5,"ignore_eos":true}'
  echo '{"max_new_tokens":6,"ignore_eos":true,"prompt_ids":[200,1,2,3,4],"id":"x"}'
  echo "{\"id\":\"long\",\"prompt_ids\":[$long],\"max_new_tokens\":4,\"ignore_eos\":true}"
  echo '{"id":"eos","prompt_ids":[116],"max_new_tokens":8}'
  echo '{"id":"noeos","prompt_ids":[116],"max_new_tokens":8,"ignore_eos":true}'
} | serve "$T/multi.out" "$D/$m"
expect_tokens "$T/multi.out" '"g"' "$want_g" length
expect_tokens "$T/multi.out" 7 "$want_7" length
expect_tokens "$T/multi.out" '"x"' "$want_x" length
expect_tokens "$T/multi.out" '"long"' "$want_long" length
[ "${want_eos8:0:5}" = "64,1," ] && ok || bad "prompt [116] no longer continues 64, 1: $want_eos8"
expect_tokens "$T/multi.out" '"eos"' "64,1" eos
expect_tokens "$T/multi.out" '"noeos"' "$want_eos8" length
[ "$(wc -l <"$T/multi.out")" = $((9 + 5 + 6 + 4 + 2 + 8 + 6)) ] && ok ||
  bad "multi: $(wc -l <"$T/multi.out") reply lines, want $((9 + 5 + 6 + 4 + 2 + 8 + 6))"

# ---- bad requests: each its exact reply, the good ones still served -----------
m=qwen3_moe
good='{"id":"ok","prompt_ids":[5,101,33,240,18,77],"max_new_tokens":9,"ignore_eos":true}'
{
  echo '{"id":"m","prompt_ids":[1,2}'
  echo 'not json at all'
  echo '{"id":"t"} trailing'
  echo "$good"
  echo '[1,2,3]'
  echo '{"prompt_ids":[1],"max_new_tokens":1}'
  echo '{"id":[1],"prompt_ids":[1],"max_new_tokens":1}'
  echo '{"id":"p1","max_new_tokens":1}'
  echo '{"id":"p2","prompt_ids":"1,2","max_new_tokens":1}'
  echo '{"id":"p3","prompt_ids":[1,"2"],"max_new_tokens":1}'
  echo '{"id":"p4","prompt_ids":[1,2.5],"max_new_tokens":1}'
  echo '{"id":"p5","prompt_ids":[],"max_new_tokens":1}'
  echo '{"id":"p6","prompt_ids":[1,256],"max_new_tokens":1}'
  echo '{"id":"p7","prompt_ids":[-1],"max_new_tokens":1}'
  echo '{"id":"n1","prompt_ids":[1]}'
  echo '{"id":"n2","prompt_ids":[1],"max_new_tokens":"3"}'
  echo '{"id":"n3","prompt_ids":[1],"max_new_tokens":0}'
  echo '{"id":"n4","prompt_ids":[1],"max_new_tokens":1.5}'
  echo '{"id":"e1","prompt_ids":[1],"max_new_tokens":1,"ignore_eos":"yes"}'
  echo '{"id":"t1","prompt_ids":[1],"max_new_tokens":1,"temperature":"hot"}'
  echo '{"id":"t2","prompt_ids":[1],"max_new_tokens":1,"temperature":-1}'
  echo '{"id":"t3","prompt_ids":[1],"max_new_tokens":1,"top_k":1.5}'
  echo '{"id":"t4","prompt_ids":[1],"max_new_tokens":1,"seed":-3}'
  echo '{"id":"t5","prompt_ids":[1],"max_new_tokens":1,"logprobs":1}'
  echo '{"id":"t6","prompt_ids":[1],"max_new_tokens":1,"stop_token_ids":[1,"a"]}'
  echo '{"id":"t7","prompt_ids":[1],"max_new_tokens":1,"stop_token_ids":[999]}'
  echo '{"id":"t8","prompt_ids":[1],"max_new_tokens":1,"top_logprobs":21}'
  echo '{"id":"t9","prompt_ids":[1],"max_new_tokens":1,"top_p":2}'
  echo '{"id":"t10","prompt_ids":[1],"max_new_tokens":1,"temperature":1e39}'
  echo '{"id":"tp","prompt_ids":[5],"max_new_tokens":4,"ignore_eos":true,"temperature":1,"top_p":1e-50,"seed":5}'
  echo '{"stats":false}'
  echo '{"stats":true,"prompt_ids":[1]}'
  echo '{"cancel":true}'
  echo '{"stats":true,"ID":1}'
  echo '{"id":"c1","cancel":1}'
  echo '{"id":"c2","cancel":true}'
  echo '{"id":-1e400,"prompt_ids":[1],"max_new_tokens":1}'
  echo '{"id":"f1","prompt_ids":[1],"max_new_tokens":1,"foo":2}'
  echo '{"id":"f2","prompt_ids":[1],"max_new_tokens":1,"ignore_eso":true}'
  echo '{"id":"f3","prompt_ids":[1],"max_new_tokens":1,"max_new_tokens":2}'
  printf '{"id":"\xff\xfe","prompt_ids":[1],"max_new_tokens":1}\n'
  printf '{"id":"\xc0\xaf","prompt_ids":[1],"max_new_tokens":1}\n'
  printf '{"id":"\xed\xa0\x80","prompt_ids":[1],"max_new_tokens":1}\n'
  printf '{"id":"u1","prompt_ids":[1],"max_new_tokens":1,"\xe2\x82":1}\n'
  printf '{"id":"u2","prompt_ids":[1,"\xf4\x90\x80\x80"],"max_new_tokens":1}\n'
  printf '{"id":"caf\xc3\xa9 \xe2\x9c\x93 \xf0\x9f\x98\x80","prompt_ids":[5],"max_new_tokens":2,"ignore_eos":true}\n'
  echo '{"id":"\u00e9\ud83d\ude00","prompt_ids":[5],"max_new_tokens":1,"ignore_eos":true}'
  echo '{"id":"a\u0000b","prompt_ids":[5],"max_new_tokens":1}'
  printf '{"id":"c\001d","prompt_ids":[5],"max_new_tokens":1}\n'
  echo '{"id":"dup","prompt_ids":[5],"max_new_tokens":9,"ignore_eos":true}'
  echo '{"id":"dup","prompt_ids":[6],"max_new_tokens":1}'
  echo '{"id":8,"prompt_ids":[5],"max_new_tokens":9,"ignore_eos":true}'
  echo '{"id":8.0,"prompt_ids":[6],"max_new_tokens":1}'
  echo '{"id":"8","prompt_ids":[5],"max_new_tokens":2,"ignore_eos":true}'
  echo '{"id":"long","prompt_ids":[1,2,3,4,5,6,7,8,9,10],"max_new_tokens":7}'
  echo '{"id":"fits","prompt_ids":[1,2,3,4,5,6,7,8,9,10],"max_new_tokens":6,"ignore_eos":true}'
  echo ''
  printf '%s\r\n' '{"id":"crlf","prompt_ids":[5],"max_new_tokens":1}'
  head -c 1100000 /dev/zero | tr '\0' 'x'; echo
  printf '%s' '{"id":"last","prompt_ids":[5,101,33,240,18,77],"max_new_tokens":2,"ignore_eos":true}'
} | serve "$T/bad.out" "$D/$m" --max-seq-len 16 --max-seqs 16
expect_line "$T/bad.out" '{"id":null,"error":"malformed JSON at byte 27"}'
expect_line "$T/bad.out" '{"id":null,"error":"malformed JSON at byte 0"}'
expect_line "$T/bad.out" '{"id":null,"error":"malformed JSON at byte 11"}'
expect_line "$T/bad.out" '{"id":null,"error":"a request must be a JSON object"}'
# a NUL in a string would cut the id (its replies then under another one);
# a raw control character in a string is not JSON
expect_line "$T/bad.out" \
  '{"id":null,"error":"the request holds a NUL character (\\u0000) in a string (byte 8): moec takes no NUL in text"}'
expect_line "$T/bad.out" \
  '{"id":null,"error":"malformed JSON at byte 8 (a control character in a string must be escaped)"}'
expect_line "$T/bad.out" '{"id":null,"error":"missing \"id\" (a string or a number)"}'
expect_line "$T/bad.out" '{"id":null,"error":"\"id\" must be a string or a number"}'
expect_line "$T/bad.out" '{"id":"p1","error":"missing \"prompt_ids\""}'
expect_line "$T/bad.out" '{"id":"p2","error":"\"prompt_ids\" must be an array of token ids"}'
expect_line "$T/bad.out" '{"id":"p3","error":"\"prompt_ids\"[1] is not an integer"}'
expect_line "$T/bad.out" '{"id":"p4","error":"\"prompt_ids\"[1] is not an integer"}'
expect_line "$T/bad.out" '{"id":"p5","error":"\"prompt_ids\" is empty"}'
expect_line "$T/bad.out" '{"id":"p6","error":"prompt token 1: id 256 is outside the vocabulary (256 ids)"}'
expect_line "$T/bad.out" '{"id":"p7","error":"prompt token 0: id -1 is outside the vocabulary (256 ids)"}'
expect_line "$T/bad.out" '{"id":"n1","error":"missing \"max_new_tokens\""}'
expect_line "$T/bad.out" '{"id":"n2","error":"\"max_new_tokens\" must be an integer"}'
expect_line "$T/bad.out" '{"id":"n3","error":"\"max_new_tokens\" must be at least 1, got 0"}'
expect_line "$T/bad.out" '{"id":"n4","error":"\"max_new_tokens\" must be an integer"}'
expect_line "$T/bad.out" '{"id":"e1","error":"\"ignore_eos\" must be true or false"}'
expect_line "$T/bad.out" '{"id":"t1","error":"\"temperature\" must be a number"}'
expect_line "$T/bad.out" '{"id":"t2","error":"temperature must be a finite number >= 0, got -1"}'
expect_line "$T/bad.out" '{"id":"t3","error":"\"top_k\" must be an integer from 0 to 2147483647"}'
expect_line "$T/bad.out" '{"id":"t4","error":"\"seed\" must be an integer from 0 to 9007199254740991"}'
expect_line "$T/bad.out" '{"id":"t5","error":"\"logprobs\" must be true or false"}'
expect_line "$T/bad.out" '{"id":"t6","error":"\"stop_token_ids\"[1] is not an integer"}'
expect_line "$T/bad.out" '{"id":"t7","error":"stop id 999 is outside the vocabulary (256 ids)"}'
expect_line "$T/bad.out" '{"id":"t8","error":"top_logprobs must be from 0 to 20, got 21"}'
expect_line "$T/bad.out" '{"id":"t9","error":"top_p must be a number from 0 to 1, got 2"}'
# a number past a float is named as sent (it was "got inf"); one below a
# float's least stays above 0: top_p 1e-50 keeps the likeliest id alone
# (as 0 it kept all, and seed 5 then samples 10, not greedy's 5)
expect_line "$T/bad.out" '{"id":"t10","error":"\"temperature\" is past a float'"'"'s range (3.40282e+38), got 1e+39"}'
expect_tokens "$T/bad.out" '"tp"' "$(reference $m 5 4)" length
expect_line "$T/bad.out" '{"id":null,"error":"\"stats\" must be true"}'
expect_line "$T/bad.out" '{"id":null,"error":"field \"prompt_ids\" in a stats line (it takes \"id\" and \"stats\" alone)"}'
expect_line "$T/bad.out" '{"id":null,"error":"missing \"id\" (the request to cancel)"}'
# an id spelt in another case is an unknown field (it was answered with nothing)
expect_line "$T/bad.out" '{"id":null,"error":"unknown field \"ID\" (the fields: id, prompt_ids, max_new_tokens, ignore_eos, temperature, top_k, top_p, min_p, repetition_penalty, presence_penalty, frequency_penalty, seed, stop_token_ids, logprobs, top_logprobs, stats, cancel)"}'
expect_line "$T/bad.out" '{"id":"c1","error":"\"cancel\" must be true"}'
expect_line "$T/bad.out" '{"id":"c2","error":"id \"c2\" is not in flight on this connection"}'
expect_line "$T/bad.out" '{"id":null,"error":"\"id\" is a number too large to echo"}'
expect_line "$T/bad.out" '{"id":"f1","error":"unknown field \"foo\" (the fields: id, prompt_ids, max_new_tokens, ignore_eos, temperature, top_k, top_p, min_p, repetition_penalty, presence_penalty, frequency_penalty, seed, stop_token_ids, logprobs, top_logprobs, stats, cancel)"}'
expect_line "$T/bad.out" '{"id":"f2","error":"unknown field \"ignore_eso\" (the fields: id, prompt_ids, max_new_tokens, ignore_eos, temperature, top_k, top_p, min_p, repetition_penalty, presence_penalty, frequency_penalty, seed, stop_token_ids, logprobs, top_logprobs, stats, cancel)"}'
expect_line "$T/bad.out" '{"id":"f3","error":"field \"max_new_tokens\" is given twice"}'
[ "$(grep -cxF '{"id":null,"error":"\"id\" is not valid UTF-8"}' "$T/bad.out")" = 3 ] && ok ||
  bad "want 3 ids refused as not UTF-8 (a stray byte, an overlong /, a surrogate): $(cat "$T/bad.out")"
expect_line "$T/bad.out" '{"id":"u1","error":"the request is not valid UTF-8 (byte 48)"}'
expect_line "$T/bad.out" '{"id":"u2","error":"the request is not valid UTF-8 (byte 28)"}'
expect_tokens "$T/bad.out" "\"café ✓ 😀\"" "$(reference $m 5 2)" length
expect_tokens "$T/bad.out" "\"é😀\"" "$(reference $m 5 1)" length
expect_line "$T/bad.out" '{"id":"dup","error":"id \"dup\" is already in flight"}'
expect_tokens "$T/bad.out" '"dup"' "$(reference $m 5 9)" length
expect_line "$T/bad.out" '{"id":8,"error":"id 8 is already in flight"}'
expect_tokens "$T/bad.out" 8 "$(reference $m 5 9)" length
expect_tokens "$T/bad.out" '"8"' "$(reference $m 5 2)" length
expect_line "$T/bad.out" '{"id":"long","error":"too long: 10 prompt + 7 new = 17 tokens, more than the 16 a sequence may hold (max_seq_len)"}'
expect_line "$T/bad.out" '{"id":null,"error":"request line longer than 1048576 bytes"}'
expect_tokens "$T/bad.out" '"ok"' "$(golden $m greedy_ids)" length
expect_tokens "$T/bad.out" '"fits"' "$(reference $m 1,2,3,4,5,6,7,8,9,10 6)" length
expect_tokens "$T/bad.out" '"crlf"' "$(reference $m 5 1)" length
expect_tokens "$T/bad.out" '"last"' "77,77" length
[ "$(grep -c '"error"' "$T/bad.out")" = 49 ] && ok || bad "bad requests: $(grep -c '"error"' "$T/bad.out") errors, want 49"
# Every reply, the refusals of bytes that are not UTF-8 included, is strict
# UTF-8 JSON.
python3 - "$T/bad.out" <<'PY' && ok || bad "bad.out is not one UTF-8 JSON object a line"
import json, sys
with open(sys.argv[1], "rb") as f:
    for n, raw in enumerate(f, 1):
        line = raw.decode("utf-8")  # strict: raises on any byte that is not UTF-8
        assert isinstance(json.loads(line), dict), f"line {n}: {line!r}"
PY

# ---- non-finite logits: only the requests they hit fail ------------------------
# deepseek_v3 (untied embeddings) with token 59's embedding row NaN: every
# row of a sequence from its first 59 on is NaN. [1,2] generates 59 first
# (checked), so "later" streams it, then fails feeding it back; "now" fails
# in its prompt, and so does "sampled" (sampled on the host); "pen" fails
# once its repetition penalty (1e-45) overflows a positive logit; "ok"
# (never 59) runs in the same steps to the end.
"$B/tests/nan_model" "$D/deepseek_v3" "$T/nan59" model.embed_tokens.weight 59
want_ok=$(reference deepseek_v3 3,250,7 5)
[ "$(reference deepseek_v3 1,2 1)" = 59 ] && ok || bad "prompt [1,2] of deepseek_v3 no longer continues 59"
{
  echo '{"id":"later","prompt_ids":[1,2],"max_new_tokens":4,"ignore_eos":true}'
  echo '{"id":"ok","prompt_ids":[3,250,7],"max_new_tokens":5,"ignore_eos":true}'
  echo '{"id":"now","prompt_ids":[1,59,2],"max_new_tokens":3,"ignore_eos":true}'
  echo '{"id":"sampled","prompt_ids":[1,59,2],"max_new_tokens":3,"temperature":0.8,"seed":3}'
  echo '{"id":"pen","prompt_ids":[3,250,7,11,40,90,120,200],"max_new_tokens":2,"repetition_penalty":1e-45}'
} | serve "$T/nan.out" "$T/nan59"
expect_line "$T/nan.out" '{"id":"later","token":59,"index":0}'
expect_line "$T/nan.out" '{"id":"later","error":"generation failed: the logits at position 2 hold a NaN or an infinity"}'
expect_line "$T/nan.out" '{"id":"now","error":"generation failed: the logits at position 1 hold a NaN or an infinity"}'
expect_line "$T/nan.out" '{"id":"sampled","error":"generation failed: the logits at position 1 hold a NaN or an infinity"}'
expect_line "$T/nan.out" '{"id":"pen","error":"generation failed: the logits at position 7 hold a NaN or an infinity once the penalties apply"}'
expect_tokens "$T/nan.out" '"ok"' "$want_ok" length
[ "$(wc -l <"$T/nan.out")" = $((2 + 1 + 1 + 1 + 5 + 1)) ] && ok ||
  bad "non-finite: $(wc -l <"$T/nan.out") reply lines, want 11: $(cat "$T/nan.out")"
grep -q "moec-serve: .*step 0, request 3: the logits at position 1 hold a NaN or an infinity (3 of the step's 5 requests end with such an error)" "$T/nan.out.err" &&
  grep -q "moec-serve: .*step 1, request 1: the logits at position 2 hold a NaN or an infinity (1 of the step's 2 requests end with such an error)" "$T/nan.out.err" && ok ||
  bad "non-finite: stderr lacks the engine's error: $(cat "$T/nan.out.err")"

# ---- a busy service queues -------------------------------------------------------
# One sequence at a time over a pool of 4 blocks of 4 tokens: requests sent
# together wait their turn and are all served (the first fills the pool);
# one that needs more blocks than the whole pool has is refused at once;
# once all are done, the stats line counts them.
mkfifo "$T/in"
"$SERVE" "$D/$m" --stdin --backend cpu --max-seqs 1 --kv-blocks 4 --kv-block-size 4 <"$T/in" \
  >"$T/queue.out" 2>"$T/queue.err" &
SERVER_PID=$!
exec 5>"$T/in"
printf '%s\n%s\n%s\n%s\n' "$good" '{"id":"second","prompt_ids":[1],"max_new_tokens":1}' \
  '{"id":"third","prompt_ids":[5,101,33,240,18,77],"max_new_tokens":3,"ignore_eos":true}' \
  '{"id":"huge","prompt_ids":[1,2,3,4,5,6,7,8,9,10],"max_new_tokens":8}' >&5
for _ in $(seq 100); do grep -q '"id":"third","done"' "$T/queue.out" && break; sleep 0.05; done
echo '{"id":"s","stats":true}' >&5
exec 5>&-
wait "$SERVER_PID"; rc=$?; SERVER_PID=
[ "$rc" = 0 ] && ok || bad "queueing service exited $rc: $(cat "$T/queue.err")"
grep -q "a KV pool of 4 blocks of 4 tokens" "$T/queue.err" && ok || bad "queue: $(cat "$T/queue.err")"
expect_tokens "$T/queue.out" '"ok"' "$(golden $m greedy_ids)" length
expect_tokens "$T/queue.out" '"second"' 1 eos
expect_tokens "$T/queue.out" '"third"' "77,77,77" length
expect_line "$T/queue.out" '{"id":"huge","error":"too long: 10 prompt + 8 new tokens need 5 KV blocks of 4 tokens, and the whole pool has 4"}'
grep -qF '{"id":"s","stats":{"running":0,"waiting":0,"kv_blocks":4,"kv_blocks_used":0,' \
  "$T/queue.out" && grep -qF '"requests_done":3,"requests_cancelled":0,' "$T/queue.out" && ok ||
  bad "queue: no stats line of 3 requests done: $(cat "$T/queue.out")"

# ---- TCP ------------------------------------------------------------------------
# start_tcp NAME ARGS...: moec-serve ARGS --port 0 --backend cpu in the
# background, stdout into $T/NAME.out, stderr into $T/NAME.err; sets
# SERVER_PID, SERVER_ERR and port (fails when no port is printed within 10 s).
start_tcp() {
  local name=$1; shift
  "$SERVE" "$@" --port 0 --backend cpu >"$T/$name.out" 2>"$T/$name.err" &
  SERVER_PID=$! SERVER_ERR=$T/$name.err port=
  for _ in $(seq 200); do
    port=$(sed -n 's/.*listening on 127\.0\.0\.1:\([0-9][0-9]*\)$/\1/p' "$T/$name.err")
    [ -n "$port" ] && { ok; return 0; }
    sleep 0.05
  done
  bad "moec-serve --port 0 printed no port: $(cat "$T/$name.err")"
  return 1
}

# stop_tcp NAME: SIGTERM; the service must exit 0, having written nothing
# to stdout.
stop_tcp() {
  kill -TERM "$SERVER_PID"
  wait "$SERVER_PID"; local rc=$?; SERVER_PID=
  [ "$rc" = 0 ] && ok || bad "moec-serve --port exited $rc on SIGTERM: $(cat "$T/$1.err")"
  [ ! -s "$T/$1.out" ] && ok || bad "moec-serve --port wrote to stdout: $(cat "$T/$1.out")"
}

# client WHAT: runs the python on stdin against the service on $port
# ($SERVER_PID, $SERVER_ERR), with serve_client.py's helpers; an exception
# or exit with a message fails WHAT.
cat >"$T/serve_client.py" <<'PY'
"""Helpers for test_serve.sh's TCP checks: a client reading strict UTF-8
JSON reply lines, the service's resident memory, waiting with a deadline."""
import json, os, re, socket, sys, time

PORT, PID = int(os.environ["PORT"]), int(os.environ["SERVER_PID"])
SERVER_ERR = os.environ["SERVER_ERR"]  # the service's stderr


class Client:
    def __init__(self, rcvbuf=0):
        self.s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf:
            self.s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.s.settimeout(10)
        self.s.connect(("127.0.0.1", PORT))
        self.buf = b""

    def send(self, data):
        self.s.sendall(data.encode() if isinstance(data, str) else data)

    def line(self):
        """The next reply, parsed; None when the service closed the connection."""
        while b"\n" not in self.buf:
            try:
                chunk = self.s.recv(1 << 16)
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                return None
            self.buf += chunk
        raw, self.buf = self.buf.split(b"\n", 1)
        return json.loads(raw.decode("utf-8"))

    def reply(self):
        """Reads up to a done or error line and returns it (None at the end)."""
        while True:
            r = self.line()
            if r is None or "done" in r or "error" in r:
                return r

    def close(self):
        self.s.close()


def request(rid, new=1, prompt=(5,)):
    return json.dumps({"id": rid, "prompt_ids": list(prompt), "max_new_tokens": new,
                       "ignore_eos": True}) + "\n"


def rss_kib():
    with open(f"/proc/{PID}/status") as f:
        return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1))


def unread_by_service():
    """Bytes waiting in the service's connections that it has not read yet
    (the receive queues of /proc/net/tcp's sockets on PORT)."""
    n = 0
    with open("/proc/net/tcp") as f:
        for row in f.readlines()[1:]:
            local, state, queues = row.split()[1], row.split()[3], row.split()[4]
            if int(local.split(":")[1], 16) == PORT and state == "01":
                n += int(queues.split(":")[1], 16)
    return n


def wait_for(cond, seconds):
    end = time.time() + seconds
    while not cond():
        if time.time() > end:
            return False
        time.sleep(0.02)
    return True


def check(cond, msg):
    if not cond:
        sys.exit(msg)
PY
client() {
  local what=$1 out
  out=$(cd "$T" && PORT=$port SERVER_PID=$SERVER_PID SERVER_ERR=$SERVER_ERR timeout 60 python3 - 2>&1) &&
    ok || bad "$what: $out"
}

m=deepseek_v3
if start_tcp tcp "$D/$m" --max-seqs 4; then
  # read_replies FD FILE N: N done or error lines from FD (5 s at most each line).
  read_replies() {
    local fd=$1 file=$2 n=$3 line
    : >"$file"
    while [ "$n" -gt 0 ] && IFS= read -r -t 5 line <&"$fd"; do
      echo "$line" >>"$file"
      case $line in *'"done":true'* | *'"error":'*) n=$((n - 1)) ;; esac
    done
  }
  exec 6<>"/dev/tcp/127.0.0.1/$port" 7<>"/dev/tcp/127.0.0.1/$port"
  # Two requests on one connection, one on the other, all running together.
  printf '%s\n%s\n' \
    "{\"id\":\"a\",\"prompt_ids\":[$(golden $m prompt_ids)],\"max_new_tokens\":9,\"ignore_eos\":true}" \
    '{"id":"b","prompt_ids":[9,8,7],"max_new_tokens":4,"ignore_eos":true}' >&6
  printf '%s\n%s\n' '{"id":"c","prompt_ids":[100,3],"max_new_tokens":5,"ignore_eos":true}' \
    '{"id":"bad","prompt_ids":[1000],"max_new_tokens":1}' >&7
  read_replies 6 "$T/c6" 2
  read_replies 7 "$T/c7" 2
  expect_tokens "$T/c6" '"a"' "$(golden $m greedy_ids)" length
  expect_tokens "$T/c6" '"b"' "$(reference $m 9,8,7 4)" length
  expect_tokens "$T/c7" '"c"' "$(reference $m 100,3 5)" length
  expect_line "$T/c7" '{"id":"bad","error":"prompt token 0: id 1000 is outside the vocabulary (256 ids)"}'
  ! grep -q '"id":"[ab]"' "$T/c7" && ! grep -q '"id":"c"' "$T/c6" && ok ||
    bad "replies went to the wrong connection: $(cat "$T/c6" "$T/c7")"
  # A client that leaves mid-generation: the others are not disturbed.
  echo '{"id":"gone","prompt_ids":[1,2,3],"max_new_tokens":300,"ignore_eos":true}' >&6
  exec 6>&- 6<&-
  echo '{"id":"after","prompt_ids":[100,3],"max_new_tokens":5,"ignore_eos":true}' >&7
  read_replies 7 "$T/c7b" 1
  expect_tokens "$T/c7b" '"after"' "$(reference $m 100,3 5)" length
  exec 7>&- 7<&-
  # An id is only refused while in flight on its own connection: another
  # connection may use it at the same time.
  client "ids per connection" <<'PY'
from serve_client import *
a, b = Client(), Client()
a.send(request("same", 400))
check(a.line().get("index") == 0, "no first token")
b.send(request("same", 2))
r = b.reply()
check(r.get("done") and len(r["tokens"]) == 2, f"the other connection's \"same\": {r}")
a.send(request("same", 1))
r = a.reply()
check(r == {"id": "same", "error": "id \"same\" is already in flight"}, f"the duplicate: {r}")
r = a.reply()
check(r.get("done") and len(r["tokens"]) == 400, f"the first \"same\": {r}")
PY
  # Sampling: the same seed twice gives the same tokens and log probabilities
  # (the second request reusing the first's block of 16 prompt tokens),
  # other seeds other tokens; a stop id ends the output where it first
  # appears; a cancel line ends a request with what it generated; the stats
  # line counts it all.
  client "sampling, prefix cache, stop ids, cancel, stats" <<'PY'
from serve_client import *
c = Client()
P = [5, 101, 33, 240, 18, 77, 9, 9, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]
def run(rid, **kw):
    req = {"id": rid, "prompt_ids": P, "max_new_tokens": 8, "ignore_eos": True}
    req.update(kw)
    c.send(json.dumps(req) + "\n")
    toks = []
    while True:
        r = c.line()
        check(r is not None, f"{rid}: the connection closed")
        check("error" not in r, f"{rid}: {r}")
        if "done" in r:
            check(r["tokens"] == [t["token"] for t in toks], f"{rid}: done line {r} vs {toks}")
            return toks, r
        check(r["index"] == len(toks), f"{rid}: index {r}")
        toks.append(r)
kw = dict(temperature=1.3, top_p=0.9, min_p=0.01, top_k=50, seed=7, logprobs=True,
          top_logprobs=2, repetition_penalty=1.1, presence_penalty=0.2, frequency_penalty=0.1)
t1, d1 = run("s1", **kw)
t2, d2 = run("s2", **kw)
check(t1 == [dict(t, id="s1") for t in t2], f"same seed: {t1} vs {t2}")
check(all(t["logprob"] <= 0 and len(t["top_logprobs"]) == 2 for t in t1), f"logprobs: {t1}")
check(d1["cached_tokens"] == 0 and d2["cached_tokens"] == 16 and d2["prompt_tokens"] == 20,
      f"prefix cache: {d1} {d2}")
check(d1["ttft_ms"] >= 0 and d1["itl_ms"] >= 0 and d1["finish"] == "length", f"{d1}")
outs = {tuple(t["token"] for t in run(f"o{k}", temperature=1.3, seed=k)[0]) for k in range(4)}
check(len(outs) >= 3, f"4 seeds gave {len(outs)} different outputs: {outs}")
g = [t["token"] for t in run("g")[0]]
check(all("logprob" not in t for t in run("g2")[0]), "log probabilities nobody asked for")
stop = g[2]
ts, ds = run("st", stop_token_ids=[stop])
check(ds["finish"] == "stop" and ds["tokens"] == g[:g.index(stop) + 1], f"stop {stop}: {ds} vs {g}")
c.send(json.dumps({"id": "long", "prompt_ids": [1, 2, 3], "max_new_tokens": 400,
                   "ignore_eos": True}) + "\n")
check(c.line().get("index") == 0, "no first token")
c.send('{"id":"long","cancel":true}\n')
n = 1
while True:
    r = c.line()
    if "done" in r:
        break
    n += 1
check(r["finish"] == "cancelled" and len(r["tokens"]) == n and n < 400, f"cancelled: {r}")
c.send('{"id":"long","cancel":true}\n')
check(c.line() == {"id": "long", "error": "id \"long\" is not in flight on this connection"},
      "cancelling it again")
c.send('{"id":5,"stats":true}\n')
r = c.line()
st = r["stats"]
check(r["id"] == 5 and st["running"] == 0 and st["waiting"] == 0 and st["kv_blocks_used"] == 0
      and st["requests_cancelled"] >= 1 and st["cached_tokens"] >= 16
      and 0 < st["prefix_hit_rate"] < 1 and st["tokens_per_s"] > 0 and st["connections"] >= 1,
      f"stats: {r}")
PY
  stop_tcp tcp
fi

# ---- at most --max-connections clients ----------------------------------------
# Past the cap a client gets one error line and the end of the connection;
# the clients within it are served, and once one leaves a new one is.
m=qwen3_moe
if start_tcp conns "$D/$m" --max-connections 3; then
  client "--max-connections" <<'PY'
from serve_client import *
refusal = {"id": None,
           "error": "too many connections: all 3 that --max-connections allows are open"}
kept = [Client() for _ in range(3)]
for i, c in enumerate(kept):
    c.send(request(i))
    r = c.reply()
    check(r and r.get("done"), f"client {i} within the cap: {r}")
for i in range(2):
    extra = Client()
    r = extra.line()
    check(r == refusal, f"client {3 + i} past the cap: {r}")
    check(extra.line() is None, f"client {3 + i}: the connection stays open after the refusal")
kept[0].send(request("again"))
r = kept[0].reply()
check(r and r.get("done"), f"a client within the cap after the refusals: {r}")
kept[2].close()
def served():
    c = Client()
    c.send(request("new"))
    r = c.reply()
    check(r is not None and (r.get("done") or r == refusal), f"a new client: {r}")
    return r.get("done")
check(wait_for(served, 5), "no new client served once one of the 3 left")
PY
  stop_tcp conns
fi

# ---- --max-buffer-mib: request lines --------------------------------------------
# With 2 MiB for all, two clients' unfinished lines of 900,000 bytes (blanks
# inside the JSON) fit and a third's is refused as soon as it would pass
# the total; all three are served once their lines end, the third with
# its next line.
if start_tcp buf "$D/$m" --max-buffer-mib 2; then
  client "--max-buffer-mib lines" <<'PY'
from serve_client import *
cs = [Client() for _ in range(3)]
for i, c in enumerate(cs):
    c.send(request(i)[:-2] + " " * 900000)
    if i < 2:
        check(wait_for(lambda: unread_by_service() == 0, 5), "the service does not read")
r = cs[2].line()
check(r == {"id": None, "error": "request line refused: the clients together would hold more "
                                 "than 2 MiB (--max-buffer-mib)"}, f"the third line: {r}")
for c in cs:
    c.send("}\n")
for i in range(2):
    r = cs[i].reply()
    check(r.get("done") and r["id"] == i, f"client {i}: {r}")
cs[2].send(request("next"))
r = cs[2].reply()
check(r.get("done") and r["id"] == "next", f"the refused client's next line: {r}")
PY
  stop_tcp buf
fi

# ---- --max-buffer-mib: requests in flight ---------------------------------------
# Queued requests count too: with 1 MiB for all and one sequence at a time,
# a client queueing hundreds of 400-token prompts is refused once they would
# pass it; the requests in flight before still run, and its leaving cancels
# them.
if start_tcp queued "$D/$m" --max-buffer-mib 1 --max-seqs 1; then
  client "--max-buffer-mib requests in flight" <<'PY'
from serve_client import *
c = Client()
line = "".join(request(i, 20, prompt=[k % 256 for k in range(400)]) for i in range(400))
c.send(line)
while True:
    r = c.line()
    check(r is not None, "the connection closed")
    if "error" in r:
        break
check(r["error"] == "request refused: the requests in flight and the clients' buffers would "
      "hold more than 1 MiB (--max-buffer-mib)" and 100 < r["id"] < 399, f"the refusal: {r}")
c.close()
d = Client()
def idle():
    d.send('{"stats":true}\n')
    st = d.line()["stats"]
    return st["running"] == 0 and st["waiting"] == 0 and st["kv_blocks_used"] == 0
check(wait_for(idle, 10), "the requests of the client that left still run")
d.send(request("after", 2))
check(d.reply().get("done"), "a request after")
PY
  stop_tcp queued
fi

# ---- unread replies ------------------------------------------------------------
# A client that asks for much (a 300 kB id echoed in every token line) and
# reads nothing is dropped, past 16 MiB of its own replies or past the
# total; its memory goes back, and the others are served on.
# unread NAME WHY ARGS...: that client against moec-serve ARGS; the drop
# message on stderr must end in WHY (an extended regex).
unread() {
  local name=$1 why=$2; shift 2
  start_tcp "$name" "$D/$m" "$@" || return
  client "$name: a client that does not read" <<'PY'
from serve_client import *
base = rss_kib()
hog = Client(rcvbuf=4096)
hog.send(request("x" * 300000, 400, prompt=(1,)))
check(wait_for(lambda: "dropping a client" in open(SERVER_ERR).read(), 20),
      "the client that does not read was never dropped")
check(wait_for(lambda: rss_kib() < base + 8192, 5),
      f"VmRSS {rss_kib()} KiB after the drop, {base} KiB before")
c = Client()
c.send(request("other", 3))
r = c.reply()
check(r.get("done") and len(r["tokens"]) == 3, f"another client after the drop: {r}")
hog.s.settimeout(5)
try:
    while hog.s.recv(1 << 20):
        pass
except ConnectionResetError:
    pass
PY
  grep -qE "^moec-serve: dropping a client: it has not read [0-9]+ bytes of replies$why\$" \
    "$T/$name.err" && ok || bad "$name: no drop message ending in '$why': $(cat "$T/$name.err")"
  stop_tcp "$name"
}
unread own " \(more than 16 MiB\)" --max-buffer-mib 64
unread all ", and the clients together hold more than 4 MiB \(--max-buffer-mib\)" \
  --max-buffer-mib 4

# ---- memory after a burst -------------------------------------------------------
# 48 clients each send 1,000,000 bytes of a request line: the service grows
# by them; once the lines end (and are answered) and again once a second
# burst's clients leave with their lines unfinished, its resident memory is
# back within 8 MiB of where it started.
if start_tcp burst "$D/$m"; then
  client "memory after a burst" <<'PY'
from serve_client import *
c = Client()
c.send(request("warm", 4))
check(c.reply().get("done"), "the warm-up request")
base = rss_kib()
cs = [Client() for _ in range(48)]
def burst():
    for i, c in enumerate(cs):
        c.send(request(i)[:-2] + " " * 1000000)
    check(wait_for(lambda: rss_kib() > base + 40960, 10),
          f"the burst never reached the service: VmRSS {rss_kib()} KiB, {base} KiB before")
    return rss_kib()
peak = burst()
for c in cs:
    c.send("}\n")
for i, c in enumerate(cs):
    r = c.reply()
    check(r and r.get("done"), f"client {i}: {r}")
check(wait_for(lambda: rss_kib() < base + 8192, 5),
      f"VmRSS {rss_kib()} KiB once the lines ended: {base} KiB before, {peak} KiB at the peak")
peak = burst()
for c in cs:
    c.close()
check(wait_for(lambda: rss_kib() < base + 8192, 5),
      f"VmRSS {rss_kib()} KiB once the clients left: {base} KiB before, {peak} KiB at the peak")
PY
  stop_tcp burst
fi

finish test_serve
