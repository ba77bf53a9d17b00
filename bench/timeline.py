#!/usr/bin/env python3
"""timeline.py — one decode step as it ran inside its CUDA graph, from an
Nsight Systems kernel trace (scripts/gpu_timeline.sh).

  usage: bench/timeline.py BENCH.jsonl TRACE.csv [WARMUP STEPS]

TRACE.csv is `nsys stats --report cuda_gpu_trace --format csv` of
`moec bench --json` run under `nsys profile --cuda-graph-trace=node`, or
the same columns from bench/cupti_trace.c where there is no nsys. A step
starts at its embedding kernel; the first WARMUP + STEPS steps (the bench's
--warmup and --steps, default 5 and 20) are the graph replays with two
streams (the bench's first way). The steady replays (all but the first
WARMUP) are set side by side kernel by kernel (the n-th kernel of each
stream), and the medians printed: the step's span; per stream its kernels'
busy time, the gaps between them and the time they add to its end; per
kernel name its count, the time it adds, its time and the gap before it;
then every kernel of the step in start order (offset from the step's start,
time, gap and time added on its stream).
"""
import csv
import json
import statistics
import sys


def col(row, *names):
    for n in names:
        for k in row:
            if k == n or k.startswith(n + " ("):
                return row[k]
    raise KeyError(names)


def short(name):
    """The kernel name without the bucket and dtype tail (_t1_bf16...)."""
    i = name.find("_t", 1)
    while i >= 0:
        j = i + 2
        while j < len(name) and name[j].isdigit():
            j += 1
        if j > i + 2 and (j == len(name) or name[j] == "_"):
            return name[:i]
        i = name.find("_t", i + 1)
    return name[:60]


def main():
    bench = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
    for r in bench:
        print(f"bench batch {r['batch']} {r['mode']}: {r['ms']:.3f} ms, floor {r.get('floor_ms', 0):.3f}")
    rows = []
    with open(sys.argv[2]) as f:
        for r in csv.DictReader(f):
            try:
                rows.append((int(float(col(r, "Start"))), int(float(col(r, "Duration"))),
                             col(r, "Strm"), col(r, "Name")))
            except (KeyError, ValueError):
                continue
    rows.sort()
    starts = [i for i, r in enumerate(rows) if r[3].startswith("embedding")]
    segs = [rows[a:b] for a, b in zip(starts, starts[1:] + [len(rows)])]
    warmup, steps = (int(sys.argv[3]), int(sys.argv[4])) if len(sys.argv) > 4 else (5, 20)
    graph = [s for s in segs[:warmup + steps] if len({r[2] for r in s}) > 1]
    if not graph:
        # buckets above MOEC_DUAL_STREAM_MAX_T replay on one stream: the
        # first mode moec bench runs (graph) is then the first replays
        graph = segs[:warmup + steps]
        print("one stream: the first replays taken as the graph's")
    steady = graph[warmup:] if len(graph) > warmup + 1 else graph
    if not steady:
        print("no two-stream graph replay found in the trace")
        return 1
    n = statistics.median(len(s) for s in steady)
    steady = [s for s in steady if len(s) == n]
    # kernel k of stream x in every steady replay: (offset, time, gap)
    table = {}
    spans = []
    for s in steady:
        t0 = s[0][0]
        end = max(r[0] + r[1] for r in s)
        spans.append((end - t0) / 1000.0)
        last = {}
        count = {}
        for st, du, strm, name in s:
            k = count.get(strm, 0)
            count[strm] = k + 1
            gap = st - last[strm] if strm in last else 0
            adds = st + du - last[strm] if strm in last else du
            last[strm] = max(st + du, last.get(strm, 0))
            table.setdefault((strm, k), []).append((st - t0, du, gap, adds, name))
    med = []
    for (strm, k), v in table.items():
        med.append(tuple(statistics.median(x[i] for x in v) / 1000.0 for i in range(4)) +
                   (strm, v[0][4]))
    med.sort()
    print(f"\n{len(steady)} steady replays of {int(n)} kernels; span median {statistics.median(spans):.1f} us "
          f"(min {min(spans):.1f}, max {max(spans):.1f})")
    for strm in sorted({m[4] for m in med}):
        ks = [m for m in med if m[4] == strm]
        print(f"stream {strm}: {len(ks)} kernels, busy {sum(m[1] for m in ks):.1f} us, "
              f"gaps {sum(max(m[2], 0) for m in ks):.1f} us, added {sum(m[3] for m in ks):.1f} us")
    by = {}
    for off, du, gap, adds, strm, name in med:
        b = by.setdefault((strm, short(name)), [0, 0.0, 0.0, 0.0])
        b[0] += 1
        b[1] += du
        b[2] += gap
        b[3] += adds
    print("\nby kernel, most added first (stream, count, us added to its stream summed, each; "
          "us each from start to end; gap before each: negative where it started before the "
          "kernel before it ended, programmatic launch):")
    for (strm, name), (c, du, gap, adds) in sorted(by.items(), key=lambda x: -x[1][3]):
        print(f"  s{strm:>3} {c:4d} {adds:9.1f} {adds / c:8.2f} {du / c:8.2f} {gap / c:7.2f}  {name}")
    print("\nthe step in start order (offset us, time us, gap us, us added to its stream):")
    for off, du, gap, adds, strm, name in med:
        print(f"  {off:9.1f} {du:8.2f} {gap:6.2f} {adds:7.2f} s{strm:>3}  {name[:110]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
