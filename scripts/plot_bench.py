#!/usr/bin/env python3
"""plot_bench.py — a PNG of decode step time against batch size from JSON
lines: `moec bench --json` (impl "moec": each mode's ms and the step's
memory floor_ms) and bench/torch_ref.py (impl "torch": one line per mode and
batch), e.g. the moec.jsonl, moec_fp8.jsonl and torch.jsonl that
scripts/gpu_bench.sh leaves in its logs.

usage: plot_bench.py OUT.png FILE.jsonl [FILE.jsonl ...] [--title TEXT]
                     [--moec-modes graph] [--label FILE=NAME ...]

One line per (file, mode) for moec (named after the file unless --label
names it), the floor of each moec file as a dashed line, one line per
PyTorch mode. Needs matplotlib (Debian: python3-matplotlib).
"""
import argparse
import json
import os
import sys


def read_lines(path):
    rows = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line.startswith("{"):
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                sys.exit(f"plot_bench: {path}:{n}: not JSON: {e}")
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("files", nargs="+")
    ap.add_argument("--title", default=None)
    ap.add_argument("--moec-modes", default="graph", help="moec modes to draw, comma-separated (default graph)")
    ap.add_argument("--label", action="append", default=[], metavar="FILE=NAME")
    a = ap.parse_args(argv)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("plot_bench: needs matplotlib (apt-get install python3-matplotlib)")
    labels = {}
    for item in a.label:
        if "=" not in item:
            sys.exit(f"plot_bench: --label {item!r} is not FILE=NAME")
        k, v = item.split("=", 1)
        labels[os.path.basename(k)] = v
    moec_modes = {m for m in a.moec_modes.split(",") if m}
    series, floors, meta = {}, {}, {}
    for path in a.files:
        base = os.path.basename(path)
        name = labels.get(base, os.path.splitext(base)[0])
        for r in read_lines(path):
            if r.get("ms") is None or "batch" not in r:
                continue
            if r.get("impl") == "moec":
                if r.get("mode") not in moec_modes:
                    continue
                key = name if len(moec_modes) == 1 else f"{name} ({r['mode']})"
                floors.setdefault(f"{name} floor", {})[r["batch"]] = r["floor_ms"]
            else:
                key = f"PyTorch {r.get('mode')}"
            series.setdefault(key, {})[r["batch"]] = r["ms"]
            meta.setdefault("device", r.get("device"))
            meta.setdefault("context", r.get("context"))
    if not series:
        sys.exit("plot_bench: no timed rows in " + ", ".join(a.files))
    fig, ax = plt.subplots(figsize=(8, 5), dpi=120)
    for key, pts in sorted(series.items(), key=lambda kv: (not kv[0].startswith("moec"), kv[0])):
        xs = sorted(pts)
        ax.plot(xs, [pts[x] for x in xs], marker="o", label=key)
    for key, pts in sorted(floors.items()):
        xs = sorted(pts)
        ax.plot(xs, [pts[x] for x in xs], linestyle="--", color="gray", label=key)
    ax.set_xscale("log", base=2)
    batches = sorted({b for pts in series.values() for b in pts})
    ax.set_xticks(batches)
    ax.set_xticklabels([str(b) for b in batches])
    ax.set_xlabel("batch (sequences decoded per step)")
    ax.set_ylabel("ms per decode step")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.set_title(a.title or f"decode step time, context {meta.get('context')}, {meta.get('device')}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(a.out)
    print(f"plot_bench: wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
