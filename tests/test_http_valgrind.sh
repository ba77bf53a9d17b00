#!/usr/bin/env bash
# test_http_valgrind.sh — `moec serve --http` under valgrind (its HTTP
# threads, the engine thread and what passes between them): whole and
# streamed completions, a stop string, a chat, errors, /metrics, a client
# that leaves mid-stream and one that leaves while queued, a request
# waiting at SIGTERM; no error, no leak. Skips (loudly) without valgrind.
set -u
B=${MOEC_BUILD_DIR:?}
S=${MOEC_SOURCE_DIR:?}
if ! command -v valgrind >/dev/null; then
  echo "SKIP: valgrind is not installed (run scripts/install_deps.sh)"; exit 0
fi
# shellcheck source=tests/lib.sh
source "$S/tests/lib.sh"
# shellcheck source=tests/http_lib.sh
source "$S/tests/http_lib.sh"
M=$T/tiny-v2
http_model "$M"

# valgrind in front of `moec serve`: http_start runs "$MOEC_BUILD_DIR/moec"
mkdir -p "$T/bin"
printf '#!/bin/sh\nexec valgrind -q --leak-check=full --show-leak-kinds=all --errors-for-leak-kinds=all --error-exitcode=99 --log-file=%s "%s/moec" "$@"\n' \
  "$T/vg.log" "$B" >"$T/bin/moec"
chmod +x "$T/bin/moec"
if ! MOEC_BUILD_DIR=$T/bin http_start "$T/serve.err" "$M" --backend cpu --http 0 --max-seqs 1 --kv-blocks 400 \
  --max-waiting 2; then
  bad "no server under valgrind"
  finish test_http_valgrind
  exit 1
fi
URL=http://127.0.0.1:$PORT
N='"tiny-v2"'
code() { curl -s -o "$T/out" -w '%{http_code}' "$@"; }
metric() { curl -s "$URL/metrics" | sed -n "s/^$1 //p"; }

[ "$(code "$URL/v1/completions" -d "{\"model\":$N,\"prompt\":\"The fox\",\"max_tokens\":6,\"temperature\":0,\"logprobs\":2}")" = 200 ] &&
  ok || bad "completion: $(cat "$T/out")"
[ "$(code -N "$URL/v1/completions" -d "{\"model\":$N,\"prompt\":\"The fox\",\"max_tokens\":6,\"stop\":\"ab\",\"stream\":true,\"stream_options\":{\"include_usage\":true}}")" = 200 ] &&
  tail -c 20 "$T/out" | grep -qF 'data: [DONE]' && ok || bad "stream: $(cat "$T/out")"
code "$URL/v1/chat/completions" -d "{\"model\":$N,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":3,\"stream\":true}" >/dev/null
[ "$(code "$URL/v1/completions" -d '{"model":"tiny-v2","prompt":"a","top_p":2}')" = 400 ] && ok || bad "400: $(cat "$T/out")"
[ "$(code "$URL/v1/nothing")" = 404 ] && ok || bad "404: $(cat "$T/out")"
[ "$(code "$URL/metrics")" = 200 ] && ok || bad "metrics"

# one running long, one queued that leaves, then the running one leaves
curl -s -N "$URL/v1/completions" -d "{\"model\":$N,\"prompt\":\"long\",\"max_tokens\":5000,\"ignore_eos\":true,\"stream\":true}" >"$T/a.out" &
A=$!
BG+=("$A")
for _ in $(seq 600); do [ -s "$T/a.out" ] && break; sleep 0.1; done
curl -s "$URL/v1/completions" -d "{\"model\":$N,\"prompt\":\"b\",\"max_tokens\":2}" >/dev/null &
Q=$!
BG+=("$Q")
for _ in $(seq 600); do [ "$(metric moec_http_requests_waiting)" = 1 ] && break; sleep 0.1; done
c0=$(metric moec_requests_cancelled_total)
kill "$Q"
for _ in $(seq 600); do [ "$(metric moec_requests_cancelled_total)" = $((c0 + 1)) ] && break; sleep 0.1; done
kill "$A"
for _ in $(seq 600); do [ "$(metric moec_requests_cancelled_total)" = $((c0 + 2)) ] && break; sleep 0.1; done
[ "$(metric moec_requests_cancelled_total)" = $((c0 + 2)) ] && ok || bad "the leaving clients were not cancelled"

# a stream and a queued request when SIGTERM comes
curl -s -N "$URL/v1/completions" -d "{\"model\":$N,\"prompt\":\"long\",\"max_tokens\":5000,\"ignore_eos\":true,\"stream\":true}" >"$T/a2.out" &
BG+=("$!")
for _ in $(seq 600); do [ -s "$T/a2.out" ] && break; sleep 0.1; done
curl -s "$URL/v1/completions" -d "{\"model\":$N,\"prompt\":\"b\",\"max_tokens\":2}" >"$T/b2.out" &
BG+=("$!")
for _ in $(seq 600); do [ "$(metric moec_http_requests_waiting)" = 1 ] && break; sleep 0.1; done
http_stop
[ "$STOP_RC" = 0 ] && ok || bad "valgrind exit $STOP_RC: $(cat "$T/vg.log")"
[ -s "$T/vg.log" ] && bad "valgrind: $(cat "$T/vg.log")" || ok
finish test_http_valgrind
