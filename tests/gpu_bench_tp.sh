#!/usr/bin/env bash
# gpu_bench_tp.sh — `moec bench` of a split on one GPU (issue 13): --tp 1
# (every rank's thread, NCCL communicator of one, graphs captured with the
# collectives inside) of a tiny model and of a plan compiled --tp 1, its
# JSON rows checked: tp and ep, one rank's time, bytes and floor agreeing
# with the row's, and with --profile the collectives' time per step (> 0,
# below the step's eager time) and the profile's collective lines. A split
# over more ranks than GPUs is refused naming the GPUs it needs. Without a
# device: "SKIP: no CUDA device", exit 0.
set -u
B=${MOEC_BUILD_DIR:?}/moec
S=${MOEC_SOURCE_DIR:?}
D=$S/tests/data
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
# shellcheck source=tests/lib.sh
source "$S/tests/lib.sh"

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "SKIP: no CUDA device"
  exit 0
fi
n_gpu=$(nvidia-smi -L | grep -c '^GPU')

# check JSONL TP EP PROFILED: every row's split fields
check() {
  python3 - "$@" <<'PY'
import json, sys
path, tp, ep, profiled = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
rows = [json.loads(l) for l in open(path) if l.strip()]
assert len(rows) == 8, f"{len(rows)} rows, want 8 (2 batch sizes x 4 modes)"
for r in rows:
    where = f"{r['mode']} batch {r['batch']}"
    assert r["tp"] == tp and r["ep"] == ep, f"{where}: tp {r['tp']} ep {r['ep']}"
    for k in ("rank_ms", "rank_bytes", "rank_floor_ms"):
        assert len(r[k]) == tp, f"{where}: {k} has {len(r[k])} entries, want {tp}"
    assert r["bytes"] == max(r["rank_bytes"]) > 0, f"{where}: bytes {r['bytes']} vs {r['rank_bytes']}"
    assert abs(r["floor_ms"] - max(r["rank_floor_ms"])) <= 1e-4 * r["floor_ms"] + 1e-4, where
    assert all(x > 0 for x in r["rank_ms"]), f"{where}: rank_ms {r['rank_ms']}"
    if r["mode"] == "graph":
        assert abs(r["ms"] - max(r["rank_ms"])) <= 1e-3, f"{where}: ms {r['ms']} vs {r['rank_ms']}"
    assert r["experts_hit"] > 0 and r["experts_hit"] <= r["experts_total"], where
    if profiled:
        eager = [x["ms"] for x in rows if x["batch"] == r["batch"] and x["mode"] == "eager_single"][0]
        assert 0 < r["coll_ms"] < eager, f"{where}: coll_ms {r['coll_ms']}, eager step {eager}"
    else:
        assert "coll_ms" not in r, where
PY
}

run() { "$B" bench "$@" --json --batch-sizes 1,4 --steps 5 --warmup 2; }

run "$D/qwen3_moe" --tp 1 >"$T/q.jsonl" 2>"$T/q.err" && ok || bad "bench qwen3_moe --tp 1: $(cat "$T/q.err")"
check "$T/q.jsonl" 1 1 0 && ok || bad "bench qwen3_moe --tp 1: bad rows"

run "$D/deepseek_v2" --tp 1 --ep 1 --profile >"$T/d.jsonl" 2>"$T/d.err" && ok ||
  bad "bench deepseek_v2 --tp 1 --profile: $(cat "$T/d.err")"
check "$T/d.jsonl" 1 1 1 && ok || bad "bench deepseek_v2 --tp 1 --profile: bad rows"
grep -q "collective all_reduce" "$T/d.err" && ok || bad "the profile names no all_reduce: $(cat "$T/d.err")"
grep -q "ms in collectives" "$T/d.err" && ok || bad "the profile gives no collectives' time"

# a plan compiled --tp 1 benches as compiled, with or without --tp 1
"$B" compile "$D/deepseek_v3" -o "$T/v3.moec" --tp 1 --batch-sizes 1,4 >/dev/null 2>&1 && ok ||
  bad "compile deepseek_v3 --tp 1"
run "$T/v3.moec" --weights "$D/deepseek_v3" >"$T/p.jsonl" 2>"$T/p.err" && ok || bad "bench PLAN (tp 1): $(cat "$T/p.err")"
check "$T/p.jsonl" 1 1 0 && ok || bad "bench PLAN (tp 1): bad rows"
expect 1 "was compiled for tp 1, ep 1 (1 rank); asked to run it with tp 2, ep 1" -- \
  "$B" bench "$T/v3.moec" --weights "$D/deepseek_v3" --tp 2

# unsharded: tp 0 and no per-rank fields
run "$D/qwen3_moe" --batch-sizes 1 >"$T/u.jsonl" 2>"$T/u.err" && ok || bad "bench qwen3_moe: $(cat "$T/u.err")"
python3 -c "
import json,sys
r=[json.loads(l) for l in open('$T/u.jsonl')]
assert r and all(x['tp']==0 and x['ep']==1 and 'rank_ms' not in x for x in r), r" && ok ||
  bad "unsharded bench rows: $(cat "$T/u.jsonl")"

# more ranks than GPUs: refused before anything compiles
n=$((n_gpu + 1))
expect 1 "the model split over $n ranks (tp $n, ep 1) needs $n GPUs, this machine has $n_gpu" -- \
  "$B" bench "$D/qwen3_moe" --tp "$n" --batch-sizes 1

finish gpu_bench_tp
