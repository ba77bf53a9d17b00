#!/usr/bin/env bash
# gpu_serve_bench.sh — moec-serve under load on the GPU machine: starts
# moec-serve on a plan file (loopback only), then for each number of
# concurrent streams (default 1 8 32 64) a python3 client keeps that many
# requests in flight, one per connection (each stream sends its next
# request when the last is done), and measures the generated tokens per
# second over the level's wall time, the time to first token and the
# inter-token latency (the gaps between a request's consecutive tokens as
# the client receives them), p50 and p99; prints a table (and JSON lines
# into $OUT/serve_bench.jsonl when OUT is set).
#   usage: scripts/gpu_serve_bench.sh PLAN MODEL_DIR [STREAMS]
# PLAN: a plan file (moec compile) of the checkpoint in MODEL_DIR. STREAMS:
# "1 8 32 64". Environment: PROMPT_LEN (128), NEW_TOKENS (128), REQUESTS
# (per stream, 3), SERVE (the moec-serve binary; default build-gpu/, built
# when missing), SERVE_FLAGS (more moec-serve options, e.g.
# "--kv-memory-fraction 0.5"; --max-seqs is the largest STREAMS,
# --max-connections 16 more).
set -uo pipefail
cd "$(dirname "$0")/.."
PLAN=${1:?usage: scripts/gpu_serve_bench.sh PLAN MODEL_DIR [STREAMS]}
MODEL=${2:?usage: scripts/gpu_serve_bench.sh PLAN MODEL_DIR [STREAMS]}
STREAMS=${3:-1 8 32 64}
SERVE=${SERVE:-build-gpu/moec-serve}
if [ ! -x "$SERVE" ]; then
  source scripts/gpu_build.sh
  gpu_build >/tmp/moec-serve-bench-build.txt 2>&1 || { tail -30 /tmp/moec-serve-bench-build.txt; exit 1; }
fi
max=1
for s in $STREAMS; do [ "$s" -gt "$max" ] && max=$s; done
LOG=$(mktemp)
"$SERVE" "$PLAN" --weights "$MODEL" --port 0 --max-seqs "$max" --max-connections $((max + 16)) \
  ${SERVE_FLAGS:-} 2>"$LOG" &
PID=$!
trap 'kill "$PID" 2>/dev/null; rm -f "$LOG"' EXIT
PORT=
for _ in $(seq 3000); do # loading and capturing a real model takes a while
  PORT=$(sed -n 's/.*listening on 127\.0\.0\.1:\([0-9][0-9]*\)$/\1/p' "$LOG")
  [ -n "$PORT" ] && break
  kill -0 "$PID" 2>/dev/null || { cat "$LOG"; exit 1; }
  sleep 0.1
done
[ -n "$PORT" ] || { echo "moec-serve printed no port:"; cat "$LOG"; exit 1; }
head -1 "$LOG"

python3 - "$PORT" "$MODEL/config.json" "${PROMPT_LEN:-128}" "${NEW_TOKENS:-128}" \
  "${REQUESTS:-3}" "${OUT:-}" $STREAMS <<'PY'
import json, random, selectors, socket, sys, time

port, config, prompt_len, new_tokens, per_stream = (int(sys.argv[1]), sys.argv[2],
    int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
out_dir, levels = sys.argv[6], [int(x) for x in sys.argv[7:]]
vocab = json.load(open(config))["vocab_size"]
rng = random.Random(16)


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))] if xs else float("nan")


class Stream:
    def __init__(self, sel, sid):
        self.s = socket.create_connection(("127.0.0.1", port))
        self.s.setblocking(False)
        self.sid, self.buf, self.left, self.n = sid, b"", per_stream, 0
        sel.register(self.s, selectors.EVENT_READ, self)

    def send_next(self):
        self.n += 1
        prompt = [rng.randrange(vocab) for _ in range(prompt_len)]
        req = {"id": f"{self.sid}-{self.n}", "prompt_ids": prompt, "max_new_tokens": new_tokens,
               "ignore_eos": True}
        self.sent, self.times = time.perf_counter(), []
        self.s.sendall((json.dumps(req) + "\n").encode())


def level(c):
    """c streams, per_stream requests each; returns the row."""
    sel = selectors.DefaultSelector()
    streams = [Stream(sel, i) for i in range(c)]
    ttft, itl, tokens, running = [], [], 0, c
    t0 = time.perf_counter()
    for st in streams:
        st.send_next()
    while running:
        for key, _ in sel.select(timeout=600):
            st = key.data
            chunk = st.s.recv(1 << 20)
            if not chunk:
                sys.exit(f"stream {st.sid}: the service closed the connection")
            st.buf += chunk
            now = time.perf_counter()
            while b"\n" in st.buf:
                raw, st.buf = st.buf.split(b"\n", 1)
                r = json.loads(raw)
                if "error" in r:
                    sys.exit(f"stream {st.sid}: {r}")
                if "token" in r:
                    st.times.append(now)
                    tokens += 1
                elif "done" in r:
                    ttft.append(st.times[0] - st.sent)
                    itl.extend(b - a for a, b in zip(st.times, st.times[1:]))
                    st.left -= 1
                    if st.left:
                        st.send_next()
                    else:
                        running -= 1
    wall = time.perf_counter() - t0
    for st in streams:
        st.s.close()
    return {"streams": c, "requests": c * per_stream, "tokens": tokens, "wall_s": wall,
            "tokens_per_s": tokens / wall, "ttft_p50_ms": pct(ttft, 50) * 1e3,
            "ttft_p99_ms": pct(ttft, 99) * 1e3, "itl_p50_ms": pct(itl, 50) * 1e3,
            "itl_p99_ms": pct(itl, 99) * 1e3}


def stats():
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b'{"stats":true}\n')
    buf = b""
    while b"\n" not in buf:
        buf += s.recv(1 << 16)
    s.close()
    return json.loads(buf.split(b"\n")[0])["stats"]


per_stream_saved, per_stream = per_stream, 1
level(1)  # warm-up
per_stream = per_stream_saved
rows = []
print(f"prompt {prompt_len} tokens, {new_tokens} new tokens a request, {per_stream} requests "
      f"a stream")
print(f"{'streams':>7} {'requests':>8} {'tokens':>7} {'wall s':>7} {'tok/s':>8} "
      f"{'TTFT p50':>9} {'TTFT p99':>9} {'ITL p50':>8} {'ITL p99':>8} {'preempt':>7}")
for c in levels:
    before = stats()["preemptions"]
    row = level(c)
    row["preemptions"] = stats()["preemptions"] - before
    rows.append(row)
    print(f"{c:>7} {row['requests']:>8} {row['tokens']:>7} {row['wall_s']:>7.2f} "
          f"{row['tokens_per_s']:>8.1f} {row['ttft_p50_ms']:>7.1f}ms {row['ttft_p99_ms']:>7.1f}ms "
          f"{row['itl_p50_ms']:>6.2f}ms {row['itl_p99_ms']:>6.2f}ms {row['preemptions']:>7}",
          flush=True)
if out_dir:
    with open(f"{out_dir}/serve_bench.jsonl", "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
print("stats:", json.dumps(stats()))
PY
rc=$?
kill -TERM "$PID"
wait "$PID"
exit $rc
