#!/usr/bin/env bash
# test_serve.sh — moec-serve on the CPU backend as a client meets it, over
# stdin and over TCP (bash's /dev/tcp; no python): every tiny model's golden
# prompt streams transformers' greedy ids; requests sent together each get
# their own tokens (the same as `moec run`), a long prompt prefilled in
# chunks included; eos ends a sequence unless ignore_eos; every bad request
# gets its exact error reply while the others complete, and so does a
# request whose logits go NaN (a broken checkpoint); a busy service
# refuses with "cache full" and serves again once a slot is free; the TCP
# service answers each connection with its own requests' replies and stops
# cleanly on SIGTERM; bad command lines exit 2.
set -u
B=${MOEC_BUILD_DIR:?}
SERVE=$B/moec-serve
S=${MOEC_SOURCE_DIR:?}
D=$S/tests/data
T=$(mktemp -d)
SERVER_PID=
cleanup() {
  [ -n "$SERVER_PID" ] && kill "$SERVER_PID" 2>/dev/null
  rm -rf "$T"
}
trap cleanup EXIT
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*" >&2; }

# expect CODE NEEDLE -- CMD...: exit code CODE and NEEDLE in stdout+stderr.
expect() {
  local code=$1 needle=$2; shift 3
  local out rc
  out=$("$@" 2>&1 </dev/null); rc=$?
  if [ "$rc" != "$code" ]; then bad "$* -> exit $rc, want $code: $out"; return; fi
  case "$out" in *"$needle"*) ok ;; *) bad "$* -> output lacks '$needle': $out" ;; esac
}

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
# with its done line.
expect_tokens() {
  local file=$1 id=$2 want=$3 finish=$4
  local done_line="{\"id\":$id,\"done\":true,\"tokens\":[$want],\"finish\":\"$finish\"}"
  grep -qxF "$done_line" "$file" && ok || bad "request $id: no line $done_line in: $(cat "$file")"
  local got
  got=$(streamed "$file" "$id")
  [ "$got" = "$want" ] && ok || bad "request $id streamed '$got', want '$want'"
}

# expect_line FILE LINE: FILE has exactly that line.
expect_line() {
  grep -qxF "$2" "$1" && ok || bad "no line $2 in: $(cat "$1")"
}

# ---- command line -------------------------------------------------------------
for f in --weights --stdin --port --max-seqs --max-seq-len --backend --single-stream --eager \
  --help prompt_ids max_new_tokens ignore_eos '"finish"' 'cache full'; do
  expect 0 "$f" -- "$SERVE" --help
done
expect 2 "missing MODEL_DIR or PLAN" -- "$SERVE"
expect 2 "unknown option --frob" -- "$SERVE" "$D/qwen3_moe" --frob
expect 2 "--backend: 'tpu' is not cpu, cuda or auto" -- "$SERVE" "$D/qwen3_moe" --backend tpu
expect 2 "--port: '70000' is not a port number" -- "$SERVE" "$D/qwen3_moe" --port 70000
expect 2 "--max-seqs: '0' is not an integer >= 1" -- "$SERVE" "$D/qwen3_moe" --max-seqs 0
expect 2 "--max-seq-len needs a value" -- "$SERVE" "$D/qwen3_moe" --max-seq-len
echo "not a plan" >"$T/x.moec"
expect 2 "is a plan file: --weights MODEL_DIR" -- "$SERVE" "$T/x.moec"
expect 2 "--backend cpu: $T/x.moec is a plan" -- "$SERVE" "$T/x.moec" --weights "$D/qwen3_moe" --backend cpu
expect 1 "max_seq_len 100000 exceeds the model's max_position_embeddings 512" -- \
  "$SERVE" "$D/qwen3_moe" --stdin --backend cpu --max-seq-len 100000
expect 1 "nonexistent/config.json" -- "$SERVE" "$T/nonexistent" --stdin

# ---- the goldens, one model at a time -----------------------------------------
for m in deepseek_v2 deepseek_v2_qlora deepseek_v3 qwen2_moe qwen3_moe; do
  prompt=$(golden "$m" prompt_ids) greedy=$(golden "$m" greedy_ids)
  n=$(echo "$greedy" | tr ',' '\n' | wc -l)
  echo "{\"id\":\"$m\",\"prompt_ids\":[$prompt],\"max_new_tokens\":$n,\"ignore_eos\":true}" |
    serve "$T/$m.out" "$D/$m"
  expect_tokens "$T/$m.out" "\"$m\"" "$greedy" length
  grep -q "cpu backend, 8 sequence slots of 512 tokens, 64 tokens a step" "$T/$m.out.err" && ok ||
    bad "$m: startup line: $(cat "$T/$m.out.err")"
done

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
  echo '{"id":"long","prompt_ids":[1,2,3,4,5,6,7,8,9,10],"max_new_tokens":7}'
  echo '{"id":"fits","prompt_ids":[1,2,3,4,5,6,7,8,9,10],"max_new_tokens":6,"ignore_eos":true}'
  echo ''
  printf '%s\r\n' '{"id":"crlf","prompt_ids":[5],"max_new_tokens":1}'
  head -c 1100000 /dev/zero | tr '\0' 'x'; echo
  printf '%s' '{"id":"last","prompt_ids":[5,101,33,240,18,77],"max_new_tokens":2,"ignore_eos":true}'
} | serve "$T/bad.out" "$D/$m" --max-seq-len 16
expect_line "$T/bad.out" '{"id":null,"error":"malformed JSON at byte 27"}'
expect_line "$T/bad.out" '{"id":null,"error":"malformed JSON at byte 0"}'
expect_line "$T/bad.out" '{"id":null,"error":"malformed JSON at byte 11"}'
expect_line "$T/bad.out" '{"id":null,"error":"a request must be a JSON object"}'
expect_line "$T/bad.out" '{"id":null,"error":"missing \"id\" (a string or a number)"}'
expect_line "$T/bad.out" '{"id":null,"error":"\"id\" must be a string or a number"}'
expect_line "$T/bad.out" '{"id":"p1","error":"missing \"prompt_ids\""}'
expect_line "$T/bad.out" '{"id":"p2","error":"\"prompt_ids\" must be an array of token ids"}'
expect_line "$T/bad.out" '{"id":"p3","error":"\"prompt_ids\"[1] is not an integer"}'
expect_line "$T/bad.out" '{"id":"p4","error":"\"prompt_ids\"[1] is not an integer"}'
expect_line "$T/bad.out" '{"id":"p5","error":"\"prompt_ids\" is empty"}'
expect_line "$T/bad.out" '{"id":"p6","error":"\"prompt_ids\"[1]: token id 256 is outside the vocabulary (vocab_size 256)"}'
expect_line "$T/bad.out" '{"id":"p7","error":"\"prompt_ids\"[0]: token id -1 is outside the vocabulary (vocab_size 256)"}'
expect_line "$T/bad.out" '{"id":"n1","error":"missing \"max_new_tokens\""}'
expect_line "$T/bad.out" '{"id":"n2","error":"\"max_new_tokens\" must be an integer"}'
expect_line "$T/bad.out" '{"id":"n3","error":"\"max_new_tokens\" must be at least 1, got 0"}'
expect_line "$T/bad.out" '{"id":"n4","error":"\"max_new_tokens\" must be an integer"}'
expect_line "$T/bad.out" '{"id":"e1","error":"\"ignore_eos\" must be true or false"}'
expect_line "$T/bad.out" '{"id":"long","error":"too long for the KV cache: 10 prompt + 7 new = 17 tokens of at most 16"}'
expect_line "$T/bad.out" '{"id":null,"error":"request line longer than 1048576 bytes"}'
expect_tokens "$T/bad.out" '"ok"' "$(golden $m greedy_ids)" length
expect_tokens "$T/bad.out" '"fits"' "$(reference $m 1,2,3,4,5,6,7,8,9,10 6)" length
expect_tokens "$T/bad.out" '"crlf"' "$(reference $m 5 1)" length
expect_tokens "$T/bad.out" '"last"' "77,77" length
[ "$(grep -c '"error"' "$T/bad.out")" = 20 ] && ok || bad "bad requests: $(grep -c '"error"' "$T/bad.out") errors, want 20"

# ---- non-finite logits: only the requests they hit fail ------------------------
# deepseek_v3 (untied embeddings) with token 59's embedding row NaN: every
# row of a sequence from its first 59 on is NaN. [1,2] generates 59 first
# (checked), so "later" streams it, then fails feeding it back; "now" fails
# in its prompt; "ok" (never 59) runs in the same steps to the end.
"$B/tests/nan_model" "$D/deepseek_v3" "$T/nan59" model.embed_tokens.weight 59
want_ok=$(reference deepseek_v3 3,250,7 5)
[ "$(reference deepseek_v3 1,2 1)" = 59 ] && ok || bad "prompt [1,2] of deepseek_v3 no longer continues 59"
{
  echo '{"id":"later","prompt_ids":[1,2],"max_new_tokens":4,"ignore_eos":true}'
  echo '{"id":"ok","prompt_ids":[3,250,7],"max_new_tokens":5,"ignore_eos":true}'
  echo '{"id":"now","prompt_ids":[1,59,2],"max_new_tokens":3,"ignore_eos":true}'
} | serve "$T/nan.out" "$T/nan59"
expect_line "$T/nan.out" '{"id":"later","token":59,"index":0}'
expect_line "$T/nan.out" '{"id":"later","error":"generation failed: the logits at position 2 hold a NaN or an infinity"}'
expect_line "$T/nan.out" '{"id":"now","error":"generation failed: the logits at position 1 hold a NaN or an infinity"}'
expect_tokens "$T/nan.out" '"ok"' "$want_ok" length
[ "$(wc -l <"$T/nan.out")" = $((2 + 1 + 5 + 1)) ] && ok ||
  bad "non-finite: $(wc -l <"$T/nan.out") reply lines, want 9: $(cat "$T/nan.out")"
grep -q "moec-serve: .*step 0: the logits of token 6 (slot 2, position 1) hold a NaN or an infinity, and those of 2 of the step's 8 tokens in all" "$T/nan.out.err" &&
  grep -q "moec-serve: .*step 1: the logits of token 1 (slot 0, position 2) hold a NaN or an infinity, and those of 1 of the step's 2 tokens in all" "$T/nan.out.err" && ok ||
  bad "non-finite: stderr lacks the engine's error: $(cat "$T/nan.out.err")"

# ---- cache full, then a free slot again --------------------------------------
# One slot: the second of two requests written together is refused; a third,
# sent once the first is done, is served.
mkfifo "$T/in"
"$SERVE" "$D/$m" --stdin --backend cpu --max-seqs 1 <"$T/in" >"$T/full.out" 2>"$T/full.err" &
SERVER_PID=$!
exec 5>"$T/in"
printf '%s\n%s\n' "$good" '{"id":"second","prompt_ids":[1],"max_new_tokens":1}' >&5
for _ in $(seq 100); do grep -q '"id":"ok","done"' "$T/full.out" && break; sleep 0.05; done
echo '{"id":"third","prompt_ids":[5,101,33,240,18,77],"max_new_tokens":3,"ignore_eos":true}' >&5
exec 5>&-
wait "$SERVER_PID"; rc=$?; SERVER_PID=
[ "$rc" = 0 ] && ok || bad "cache-full service exited $rc: $(cat "$T/full.err")"
expect_line "$T/full.out" '{"id":"second","error":"cache full: all 1 sequence slots are in use"}'
expect_tokens "$T/full.out" '"ok"' "$(golden $m greedy_ids)" length
expect_tokens "$T/full.out" '"third"' "77,77,77" length

# ---- TCP ------------------------------------------------------------------------
m=deepseek_v3
"$SERVE" "$D/$m" --port 0 --backend cpu --max-seqs 4 >"$T/tcp.out" 2>"$T/tcp.err" &
SERVER_PID=$!
port=
for _ in $(seq 200); do
  port=$(sed -n 's/.*listening on 127\.0\.0\.1:\([0-9][0-9]*\)$/\1/p' "$T/tcp.err")
  [ -n "$port" ] && break
  sleep 0.05
done
if [ -z "$port" ]; then
  bad "moec-serve --port 0 printed no port: $(cat "$T/tcp.err")"
else
  ok
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
  expect_line "$T/c7" '{"id":"bad","error":"\"prompt_ids\"[0]: token id 1000 is outside the vocabulary (vocab_size 256)"}'
  ! grep -q '"id":"[ab]"' "$T/c7" && ! grep -q '"id":"c"' "$T/c6" && ok ||
    bad "replies went to the wrong connection: $(cat "$T/c6" "$T/c7")"
  # A client that leaves mid-generation: the others are not disturbed.
  echo '{"id":"gone","prompt_ids":[1,2,3],"max_new_tokens":300,"ignore_eos":true}' >&6
  exec 6>&- 6<&-
  echo '{"id":"after","prompt_ids":[100,3],"max_new_tokens":5,"ignore_eos":true}' >&7
  read_replies 7 "$T/c7b" 1
  expect_tokens "$T/c7b" '"after"' "$(reference $m 100,3 5)" length
  exec 7>&- 7<&-
  kill -TERM "$SERVER_PID"
  wait "$SERVER_PID"; rc=$?; SERVER_PID=
  [ "$rc" = 0 ] && ok || bad "moec-serve --port exited $rc on SIGTERM: $(cat "$T/tcp.err")"
fi
[ ! -s "$T/tcp.out" ] && ok || bad "moec-serve --port wrote to stdout: $(cat "$T/tcp.out")"

echo "test_serve: $pass passed, $fail failed"
[ "$fail" = 0 ]
