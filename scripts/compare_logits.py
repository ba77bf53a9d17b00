#!/usr/bin/env python3
"""compare_logits.py — two `moec run --logits-out` runs of one prompt, row by row.

  python3 scripts/compare_logits.py REF_DIR RUN_DIR [VOCAB]

For every REF_DIR/NAME-cpu.bin (scripts/gpu_shapes.sh with MODES=cpu) and
each RUN_DIR/NAME-MODE.bin beside it (MODE bf16 or fp32), prints each row's
error relative to the row's largest |logit| of the reference, over the rows
whose inputs agree (row 0 is the prompt's last position; row k follows the
k-th generated token, so it is compared only while the generated ids before
it agree), and whether the greedy ids agree. Fails (exit 1) where a worst
row is past its tolerance: 2e-2 in bf16, 1e-4 in fp32 (gpu_model's), or a
run is missing or not finite.
"""
import glob
import math
import os
import struct
import sys

TOL = {"bf16": 2e-2, "fp32": 1e-4}


def rows(path, vocab):
    data = open(path, "rb").read()
    n = len(data) // 4
    vals = struct.unpack("<%df" % n, data[: n * 4])
    return [vals[i: i + vocab] for i in range(0, n, vocab)]


def ids(path):
    try:
        return open(path).read().split()
    except OSError:
        return None


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    ref_dir, run_dir = sys.argv[1], sys.argv[2]
    vocab = int(sys.argv[3]) if len(sys.argv) > 3 else 4096
    bad = 0
    refs = sorted(glob.glob(os.path.join(ref_dir, "*-cpu.bin")))
    if not refs:
        sys.exit(f"no *-cpu.bin in {ref_dir}")
    # the modes the run has at all (MODES=fp32 runs no bf16)
    modes = {m: t for m, t in TOL.items() if glob.glob(os.path.join(run_dir, f"*-{m}.bin"))}
    if not modes:
        sys.exit(f"no *-bf16.bin or *-fp32.bin in {run_dir}")
    for ref in refs:
        base = os.path.basename(ref)[: -len("-cpu.bin")]
        r = rows(ref, vocab)
        rid = ids(ref[:-4] + ".txt")
        for mode, tol in modes.items():
            run = os.path.join(run_dir, f"{base}-{mode}.bin")
            if not os.path.exists(run):
                print(f"{base} {mode}: missing")
                bad += 1
                continue
            g = rows(run, vocab)
            gid = ids(run[:-4] + ".txt")
            same = 0
            while rid and gid and same < min(len(rid), len(gid)) and rid[same] == gid[same]:
                same += 1
            n = min(len(r), len(g), same + 1)
            errs = []
            finite = True
            for k in range(n):
                top = max(abs(v) for v in r[k]) or 1.0
                if not all(math.isfinite(v) for v in g[k]):
                    finite = False
                errs.append(max(abs(a - b) for a, b in zip(r[k], g[k])) / top)
            worst = max(errs) if errs else float("inf")
            ok = finite and n > 0 and worst <= tol
            bad += not ok
            print(f"{base} {mode}: rows {n}, worst {worst:.3g} (tol {tol:g}), "
                  f"ids {'same' if rid == gid else f'differ after {same}'}"
                  f"{'' if finite else ', NOT FINITE'}{'' if ok else '  <-- FAIL'}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
