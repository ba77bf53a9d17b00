#!/usr/bin/env bash
# test_serve_load.sh — `moec serve` under load on the CPU backend (a tiny
# model, loopback only, bounded in count and time): three rounds of 200
# requests over 20 connections, each connection sending all of its 10 at
# once, so that far more wait than the 6 sequences and 48 KV blocks of 4
# tokens hold (requests queue, decoding ones preempt the newest, prompts
# share prefixes); random prompt and output lengths and sampling settings
# (greedy, seeded temperature, top_k, top_p, min_p, penalties, log
# probabilities, stop ids); some requests cancelled mid-stream by a cancel
# line, and two connections of each round closed mid-stream (their
# requests cancelled by the service). Every request not cancelled completes,
# with the tokens (and log probabilities) it gives alone on a service of one
# sequence without prefix caching; the stats line counts the rounds and ends
# with no block in use; the service's resident memory does not grow from the
# first round to the third. Then a smaller run under valgrind (no error, no
# leak), skipped loudly without valgrind.
set -u
B=${MOEC_BUILD_DIR:?}
D=${MOEC_SOURCE_DIR:?}/tests/data
T=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  rm -rf "$T"
}
trap cleanup EXIT
fail=0

# start NAME ARGS...: `moec serve` ARGS --port 0 --backend cpu in the
# background (under $WRAP when set); stderr into $T/NAME.err; sets SPID and
# SPORT (fails when no port is printed within 60 s).
start() {
  local name=$1; shift
  ${WRAP:-} "$B/moec" serve "$@" --port 0 --backend cpu >"$T/$name.out" 2>"$T/$name.err" &
  SPID=$! SPORT=
  PIDS+=("$SPID")
  for _ in $(seq 1200); do
    SPORT=$(sed -n 's/.*listening on 127\.0\.0\.1:\([0-9][0-9]*\)$/\1/p' "$T/$name.err")
    [ -n "$SPORT" ] && return 0
    sleep 0.05
  done
  echo "FAIL: $name printed no port: $(cat "$T/$name.err")"
  return 1
}

cat >"$T/load.py" <<'PY'
"""The load: rounds of requests over many connections, each checked against
the same request run alone."""
import json, os, random, re, socket, sys, threading, time

PORT, ALONE_PORT, PID = (int(x) for x in sys.argv[1:4])
ROUNDS, N_CONN, PER_CONN, DROPS = (int(x) for x in sys.argv[4:8])
V = 256
DEADLINE = time.time() + float(sys.argv[8])


def fail(msg):
    print("FAIL:", msg)
    sys.stdout.flush()
    os._exit(1)


class Conn:
    def __init__(self, port):
        self.s = socket.create_connection(("127.0.0.1", port), timeout=60)
        self.buf = b""

    def send(self, obj):
        self.s.sendall((json.dumps(obj) + "\n").encode())

    def line(self):
        while b"\n" not in self.buf:
            if time.time() > DEADLINE:
                fail("out of time")
            chunk = self.s.recv(1 << 16)
            if not chunk:
                fail("the service closed a connection")
            self.buf += chunk
        raw, self.buf = self.buf.split(b"\n", 1)
        return json.loads(raw.decode("utf-8"))


def make_requests(seed):
    """N_CONN * PER_CONN requests: prompts of 1 to 32 ids, a third starting
    with one of three shared 16-id prefixes; 1 to 24 new tokens; sampling
    by kind; one in 8 cancelled after some tokens."""
    rng = random.Random(seed)
    shared = [[rng.randrange(V) for _ in range(16)] for _ in range(3)]
    reqs = []
    for k in range(N_CONN * PER_CONN):
        n = rng.randint(1, 32)
        prompt = [rng.randrange(V) for _ in range(n)]
        if k % 3 == 0:
            prompt = (shared[rng.randrange(3)] + prompt)[:max(n, 17)]
        r = {"prompt_ids": prompt, "max_new_tokens": rng.randint(1, 24), "ignore_eos": k % 7 != 0,
             "seed": rng.randrange(1 << 40)}
        kind = k % 6
        if kind == 1:
            r.update(temperature=0.9)
        elif kind == 2:
            r.update(temperature=1.4, top_k=8, logprobs=True)
        elif kind == 3:
            r.update(temperature=1.0, top_p=0.8, min_p=0.02, top_logprobs=2)
        elif kind == 4:
            r.update(temperature=0.7, repetition_penalty=1.2, presence_penalty=0.4,
                     frequency_penalty=0.2)
        elif kind == 5:
            r.update(stop_token_ids=[rng.randrange(V) for _ in range(3)], logprobs=True)
        cancel = rng.randint(1, r["max_new_tokens"] - 1) if k % 8 == 5 and r["max_new_tokens"] > 2 else 0
        reqs.append((r, cancel))
    return reqs


def outcome(lines):
    """What a request gave: its finish, tokens and log probabilities."""
    done = lines[-1]
    return (done["finish"], tuple(done["tokens"]),
            tuple((t.get("logprob"), tuple(map(tuple, t.get("top_logprobs", []))))
                  for t in lines[:-1]))


def conn_worker(rnd, ci, reqs, results, drop_after):
    c = Conn(PORT)
    mine = {}
    for j in range(PER_CONN):
        k = ci * PER_CONN + j
        rid = f"r{rnd}-{k}"
        mine[rid] = (k, reqs[k][1], [])
        c.send(dict(reqs[k][0], id=rid))
    got = 0
    while mine:
        r = c.line()
        if "error" in r and r["id"] not in mine and r["error"].endswith(
                "is not in flight on this connection"):
            continue  # a cancel line that came after the request had finished
        if "error" in r:
            fail(f"error reply: {r}")
        k, cancel, lines = mine[r["id"]]
        lines.append(r)
        if "token" in r:
            got += 1
            if cancel and len(lines) == cancel:
                c.send({"id": r["id"], "cancel": True})
            if drop_after and got == drop_after:
                c.s.close()  # the rest of this connection's requests are cancelled
                for rid, (kk, _, ls) in mine.items():
                    results[kk] = ("dropped", ls)
                return
        else:
            results[k] = ("cancelled" if r["finish"] == "cancelled" else "done", lines)
            del mine[r["id"]]
    c.s.close()


def alone(reqs, done_ks):
    """Each request of done_ks run alone, one after the other."""
    c = Conn(ALONE_PORT)
    out = {}
    for k in done_ks:
        c.send(dict(reqs[k][0], id=k))
        lines = []
        while True:
            r = c.line()
            if "error" in r:
                fail(f"alone: {r}")
            lines.append(r)
            if "done" in r:
                break
        out[k] = outcome(lines)
    c.s.close()
    return out


def rss_kib():
    with open(f"/proc/{PID}/status") as f:
        return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1))


def stats():
    c = Conn(PORT)
    c.send({"stats": True})
    st = c.line()["stats"]
    c.s.close()
    return st


reqs = make_requests(20260)
rss, reference, first = [], None, None
n_cancelled = n_done = n_dropped = 0
for rnd in range(ROUNDS):
    results = {}
    drops = {ci: 3 + 5 * ci for ci in range(DROPS)}  # these connections leave after some tokens
    threads = [threading.Thread(target=conn_worker,
                                args=(rnd, ci, reqs, results, drops.get(ci, 0)))
               for ci in range(N_CONN)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if len(results) != len(reqs):
        fail(f"round {rnd}: {len(results)} of {len(reqs)} requests answered")
    done = {k: outcome(ls) for k, (how, ls) in results.items() if how == "done"}
    n_done += len(done)
    n_cancelled += sum(how == "cancelled" for how, _ in results.values())
    n_dropped += sum(how == "dropped" for how, _ in results.values())
    if reference is None:
        reference = alone(reqs, sorted(done))
    differ = [k for k in done if k in reference and done[k] != reference[k]]
    if differ:
        k = differ[0]
        fail(f"round {rnd}: {len(differ)} requests differ from alone; request {k} "
             f"{reqs[k][0]}: together {done[k]}, alone {reference[k]}")
    missing = [k for k in done if k not in reference]
    # a request cancelled in round 0 but done now: run it alone too
    reference.update(alone(reqs, missing))
    differ = [k for k in missing if done[k] != reference[k]]
    if differ:
        fail(f"round {rnd}: request {differ[0]} differs from alone")
    for _ in range(100):  # the service is idle once the dropped requests are gone
        st = stats()
        if st["running"] == 0 and st["waiting"] == 0:
            break
        time.sleep(0.05)
    if st["kv_blocks_used"] != 0 or st["running"] or st["waiting"]:
        fail(f"round {rnd}: not idle after the round: {st}")
    time.sleep(0.2)
    rss.append(rss_kib())
    print(f"round {rnd}: {len(done)} done (identical to alone), "
          f"{sum(h == 'cancelled' for h, _ in results.values())} cancelled, "
          f"{sum(h == 'dropped' for h, _ in results.values())} dropped with their connection; "
          f"{st['preemptions']} preemptions, prefix hit rate {st['prefix_hit_rate']:.3f} so far; "
          f"VmRSS {rss[-1]} KiB")
st = stats()
# a request of a connection that left may have finished before the service saw it go
if (st["requests_done"] + st["requests_cancelled"] != ROUNDS * len(reqs)
        or st["requests_done"] < n_done or st["requests_done"] > n_done + n_dropped):
    fail(f"stats {st} vs {n_done} done, {n_cancelled} cancelled, {n_dropped} dropped")
if ROUNDS >= 3 and st["preemptions"] == 0:
    fail(f"no preemption under load: {st}")
if ROUNDS >= 3 and rss[-1] > rss[0] + 1024:
    fail(f"VmRSS grew from {rss[0]} KiB after round 0 to {rss[-1]} KiB after round {ROUNDS - 1}")
print(f"ok: {n_done} done, {n_cancelled} cancelled, {n_dropped} dropped; VmRSS {rss} KiB")
PY

# run NAME ROUNDS CONNS PER_CONN DROPS SECONDS: the load against a service of
# 6 sequences and 48 blocks of 4 tokens, checked against one of 1 sequence
# without prefix caching; both must then stop cleanly (exit 0; under
# valgrind: no error, no leak).
run() {
  local name=$1 main_pid main_port alone_pid rc
  start "$name" "$D/deepseek_v2" --max-seqs 6 --kv-blocks 48 --kv-block-size 4 \
    --max-seq-len 96 || { fail=$((fail + 1)); return; }
  main_pid=$SPID main_port=$SPORT
  WRAP= start "$name-alone" "$D/deepseek_v2" --max-seqs 1 --no-prefix-cache --max-seq-len 96 ||
    { fail=$((fail + 1)); return; }
  alone_pid=$SPID
  timeout $(($6 + 30)) python3 "$T/load.py" "$main_port" "$SPORT" "$main_pid" "$2" "$3" "$4" \
    "$5" "$6" || fail=$((fail + 1))
  for pid in "$main_pid" "$alone_pid"; do
    kill -TERM "$pid"
    wait "$pid"; rc=$?
    [ "$rc" = 0 ] || { echo "FAIL: $name: a service exited $rc: $(cat "$T/$name.err")"; fail=$((fail + 1)); }
  done
}

run load 3 20 10 2 90
if command -v valgrind >/dev/null; then
  WRAP="valgrind -q --leak-check=full --show-leak-kinds=all --errors-for-leak-kinds=all \
--error-exitcode=99" run valgrind 1 4 5 1 240
else
  echo "SKIP: valgrind is not installed (run scripts/install_deps.sh)"
fi
echo "test_serve_load: $fail failed"
[ "$fail" = 0 ]
