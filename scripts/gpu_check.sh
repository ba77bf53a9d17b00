#!/usr/bin/env bash
# gpu_check.sh — the one script the GPU machine runs: builds moec in
# build-gpu, runs the GPU tests (ctest -L gpu), runs `moec run` on the CUDA
# backend against the goldens, serves plan files with moec-serve over TCP
# and over its HTTP API,
# runs compute-sanitizer's four tools (scripts/gpu_sanitize.sh), and
# leaves every log in $OUT/gpu_check.tar.gz (with summary.txt beside it).
# Where cJSON is not installed it uses the copy carried in .dev/cjson/ (an
# extracted libcjson1 + libcjson-dev). Exit status: 0 when every stage passed.
# CTEST_R=REGEX runs only the GPU tests it matches; QUICK=1 leaves out the
# CLI, serve and sanitizer stages (a short call for one question);
# SKIP_SANITIZE=1 the sanitizer stage alone. CTEST_J=N runs N GPU tests at
# once on the one GPU (each fits beside the others).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${OUT:-/tmp/moec-gpu-check}
LOGS=$(mktemp -d)/gpu_check
mkdir -p "$OUT" "$LOGS"
SUMMARY=$LOGS/summary.txt
: >"$SUMMARY"
failed=0

# stage NAME CMD...: runs CMD with its output in $LOGS/NAME.txt; records the result.
stage() {
  local name=$1; shift
  local t0=$SECONDS
  # in the background so that a TERM reaches the trap below at once
  "$@" >"$LOGS/$name.txt" 2>&1 &
  STAGE_PID=$!
  wait "$STAGE_PID"
  local rc=$?
  local line="$name: $([ $rc = 0 ] && echo ok || echo "FAILED (exit $rc)") in $((SECONDS - t0)) s"
  echo "$line" | tee -a "$SUMMARY"
  [ $rc = 0 ] || failed=1
  return $rc
}

finish() {
  trap - TERM INT
  cp "$SUMMARY" "$OUT/summary.txt"
  tar czf "$OUT/gpu_check.tar.gz" -C "$(dirname "$LOGS")" gpu_check
  echo "logs: $OUT/gpu_check.tar.gz"
  exit $failed
}

{ nvidia-smi; nvcc --version; cmake --version; } >"$LOGS/env.txt" 2>&1
# killed by a caller's time limit (gpu_session.sh's CHECK_S): the logs so far
# still come back, the stage running named as cut off
STAGE_PID=
trap 'echo "stopped by a signal (time limit?) in the stage after the last line" >>"$SUMMARY"
  [ -n "$STAGE_PID" ] && { pkill -TERM -P "$STAGE_PID"; kill "$STAGE_PID"; } 2>/dev/null
  failed=1; finish' TERM INT

source scripts/gpu_build.sh
stage build gpu_build || finish

stage ctest_gpu bash -c "cd build-gpu && ctest -L gpu -j ${CTEST_J:-1} ${CTEST_R:+-R '$CTEST_R'} --output-on-failure --timeout 600"
cp build-gpu/Testing/Temporary/LastTest.log "$LOGS/ctest_gpu_full.txt" 2>/dev/null

[ "${QUICK:-0}" = 1 ] && finish

# The CLI on the CUDA backend (fp32) prints the transformers greedy ids;
# qwen2_moe with MOEC_CUDA_SYNC=1 (a synchronization after every step).
cli_golden() {
  local m rc=0
  for m in deepseek_v3 qwen2_moe; do
    local sync=0
    [ "$m" = qwen2_moe ] && sync=1
    local d=tests/data/$m
    local prompt greedy n
    prompt=$(python3 -c "import json;print(','.join(map(str,json.load(open('$d/golden.json'))['prompt_ids'])))")
    greedy=$(python3 -c "import json;print(' '.join(map(str,json.load(open('$d/golden.json'))['greedy_ids'])))")
    n=$(python3 -c "import json;print(len(json.load(open('$d/golden.json'))['greedy_ids']))")
    local got
    got=$(MOEC_DTYPE=fp32 MOEC_CUDA_SYNC=$sync build-gpu/moec run "$d" --backend cuda --prompt-ids "$prompt" \
          --max-new-tokens "$n" --ignore-eos)
    echo "$m (MOEC_CUDA_SYNC=$sync): got '$got', want '$greedy'"
    [ "$got" = "$greedy" ] || rc=1
  done
  return $rc
}
stage cli_golden cli_golden

# moec-serve on the GPU from a plan file (fp32): three requests in one write
# over TCP (batched into one bucket) each stream the transformers greedy ids
# of their tiny model; a fourth, too long for the KV cache, gets its error.
serve_plan() {
  local rc=0 m port
  for m in deepseek_v3 qwen2_moe; do
    local d=tests/data/$m plan=/tmp/serve-$m.moec
    MOEC_DTYPE=fp32 build-gpu/moec compile "$d" -o "$plan" --dtype fp32 || return 1
    local prompt greedy n
    prompt=$(python3 -c "import json;print(','.join(map(str,json.load(open('$d/golden.json'))['prompt_ids'])))")
    greedy=$(python3 -c "import json;print(json.load(open('$d/golden.json'))['greedy_ids'])")
    n=$(python3 -c "import json;print(len(json.load(open('$d/golden.json'))['greedy_ids']))")
    build-gpu/moec-serve "$plan" --weights "$d" --port 0 --max-seqs 4 --max-seq-len 64 \
      2>/tmp/serve-$m.err &
    local pid=$!
    for _ in $(seq 100); do
      port=$(sed -n 's/.*127[.]0[.]0[.]1:\([0-9][0-9]*\).*/\1/p' /tmp/serve-$m.err | head -1)
      [ -n "$port" ] && break
      sleep 0.2
    done
    cat /tmp/serve-$m.err
    python3 - "$port" "$prompt" "$n" "$greedy" <<'PY' || rc=1
import json, socket, sys
port, prompt, n, greedy = int(sys.argv[1]), [int(x) for x in sys.argv[2].split(",")], int(sys.argv[3]), json.loads(sys.argv[4])
s = socket.create_connection(("127.0.0.1", port))
reqs = [{"id": i, "prompt_ids": prompt, "max_new_tokens": n, "ignore_eos": True} for i in range(3)]
reqs.append({"id": "long", "prompt_ids": prompt * 20, "max_new_tokens": 8})
s.sendall("".join(json.dumps(r) + "\n" for r in reqs).encode())
f = s.makefile()
done, err = {}, None
while len(done) < 3 or err is None:
    r = json.loads(f.readline())
    if "error" in r:
        err = r
    elif r.get("done"):
        done[r["id"]] = r["tokens"]
ok = all(done[i] == greedy for i in range(3)) and "too long" in err["error"]
print("served", done, "error reply", err, "want", greedy, "->", "ok" if ok else "WRONG")
sys.exit(0 if ok else 1)
PY
    kill "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
  done
  return $rc
}
stage serve_plan serve_plan

# moec-serve's HTTP API (--http) on the GPU from a plan file (fp32) with the
# one-token-per-byte tokenizer: a greedy completion of the golden prompt's
# ids, whole and streamed, is the text of transformers' greedy ids.
serve_http_plan() {
  local d=/tmp/http-v3 plan=/tmp/http-v3.moec port rc=0
  mkdir -p "$d" && cp tests/data/deepseek_v3/* tests/data/tokenizers/bytes256/tokenizer.json "$d/"
  MOEC_DTYPE=fp32 build-gpu/moec compile "$d" -o "$plan" --dtype fp32 || return 1
  build-gpu/moec-serve "$plan" --weights "$d" --http 0 --max-seqs 4 --max-seq-len 64 \
    2>/tmp/http-v3.err &
  local pid=$!
  for _ in $(seq 100); do
    port=$(sed -n 's/.*HTTP API of model .* on 127[.]0[.]0[.]1:\([0-9][0-9]*\).*/\1/p' /tmp/http-v3.err)
    [ -n "$port" ] && break
    sleep 0.2
  done
  cat /tmp/http-v3.err
  python3 - "$port" "$d/golden.json" <<'PY' || rc=1
import http.client, json, sys
port, g = int(sys.argv[1]), json.load(open(sys.argv[2]))
want = bytes(g["greedy_ids"]).decode("utf-8", "replace")
body = {"model": "http-v3", "prompt": g["prompt_ids"], "max_tokens": len(g["greedy_ids"]),
        "temperature": 0, "ignore_eos": True}
texts = []
for stream in (False, True):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    c.request("POST", "/v1/completions", body=json.dumps(dict(body, stream=stream)))
    raw = c.getresponse().read().decode()
    if stream:
        texts.append("".join(json.loads(l[6:])["choices"][0]["text"] for l in raw.split("\n\n")
                             if l.startswith("data: {")))
    else:
        texts.append(json.loads(raw)["choices"][0]["text"])
ok = texts == [want, want]
print("whole, streamed:", texts, "want", repr(want), "->", "ok" if ok else "WRONG")
sys.exit(0 if ok else 1)
PY
  kill "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  return $rc
}
stage serve_http_plan serve_http_plan

# compute-sanitizer: racecheck, synccheck, initcheck, memcheck (leak check)
# on every tiny model, bf16 and fp32, graphs on and off, and on the
# real-shape kernel sample (scripts/gpu_sanitize.sh); any hazard fails.
[ "${SKIP_SANITIZE:-0}" = 1 ] || stage sanitizers scripts/gpu_sanitize.sh "$LOGS/sanitizers"

finish
