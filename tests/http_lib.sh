# http_lib.sh — sourced by the HTTP API's shell tests (after lib.sh): T, a
# folder removed at exit along with the server (SERVER_PID) and the
# background clients (BG) still running; a model folder that serves text
# (the tiny deepseek_v2, whose greedy text is varied: multi-byte characters,
# control bytes, U+FFFD); a server started on it. test_http_*.py use
# http_model through bash too.
T=$(mktemp -d)
SERVER_PID=
BG=()
http_cleanup() {
  for p in "${BG[@]}"; do kill "$p" 2>/dev/null; done
  [ -n "$SERVER_PID" ] && kill "$SERVER_PID" 2>/dev/null
  rm -rf "$T"
}
trap http_cleanup EXIT

# http_model DIR: the tiny deepseek_v2 with the one-token-per-byte
# tokenizer (its 256 ids are the model's vocabulary), a ChatML chat
# template, and max_position_embeddings raised to 16384 so that one request
# can run long (the weights do not depend on it).
http_model() {
  local dir=$1
  mkdir -p "$dir"
  cp "$MOEC_SOURCE_DIR/tests/data/deepseek_v2/config.json" \
    "$MOEC_SOURCE_DIR/tests/data/deepseek_v2/model.safetensors" \
    "$MOEC_SOURCE_DIR/tests/data/tokenizers/bytes256/tokenizer.json" "$dir/"
  python3 - "$dir" <<'PY'
import json, sys
d = sys.argv[1]
c = json.load(open(d + "/config.json"))
c["max_position_embeddings"] = 16384
json.dump(c, open(d + "/config.json", "w"), indent=1)
template = ("{%- for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + "
            "message['content'] + '<|im_end|>' + '\n' }}{%- endfor %}"
            "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{%- endif %}")
json.dump({"chat_template": template}, open(d + "/tokenizer_config.json", "w"), indent=1)
PY
}

# http_start LOG ARGS...: `moec serve ARGS` in the background (SERVER_PID),
# stderr into LOG; waits (20 s at most) for its startup line and sets PORT
# from it. Returns non-zero when it never came.
http_start() {
  local log=$1; shift
  "$MOEC_BUILD_DIR/moec" serve "$@" 2>"$log" &
  SERVER_PID=$!
  PORT=
  for _ in $(seq 200); do
    PORT=$(sed -n 's/.*HTTP API of model .* on 127\.0\.0\.1:\([0-9]*\).*/\1/p' "$log")
    [ -n "$PORT" ] && return 0
    kill -0 "$SERVER_PID" 2>/dev/null || break
    sleep 0.1
  done
  echo "the server did not start: $(cat "$log")" >&2
  return 1
}

# http_stop: SIGTERM to the server; its exit code in STOP_RC.
http_stop() {
  kill -TERM "$SERVER_PID" 2>/dev/null
  wait "$SERVER_PID"
  STOP_RC=$?
  SERVER_PID=
}
