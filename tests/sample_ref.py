#!/usr/bin/env python3
"""sample_ref.py: an independent reference of moec's sampling algorithm, as
docs/SAMPLING.md defines it (ir/ir_sample.h), for test_sample. Written from
the definition, not from engine/sample.c: ranks by a full sort, top_p by a
walk down the ranks, float32 arithmetic emulated exactly (each +, -, * or /
of two float32 values computed in double and rounded to float32, which is
the correctly rounded float32 result), integer weights as Python integers.

Input (a file named by argv[1]), one case a line, whitespace separated:
  V temperature inv_temp top_k top_p32 min_w repetition presence frequency
  seed counter n_pen, then n_pen pairs id count, then V logits
where the float fields are the hex of their float32 bits and the rest are
decimal integers. Output (argv[2]): the token of each case, a line each
(-1: the penalized row is not finite)."""

import math
import struct
import sys

M64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
WEIGHT_BITS = 40
X_MIN = -28.0
LOG2E = float.fromhex("0x1.715476p+0")
LN2_HI = float.fromhex("0x1.62e4p-1")
LN2_LO = float.fromhex("0x1.7f7d1cp-20")
# e^r's Taylor polynomial, degree 6, coefficients as float32
C = [1.0, 1.0, 0.5, float.fromhex("0x1.555556p-3"), float.fromhex("0x1.555556p-5"),
     float.fromhex("0x1.111112p-7"), float.fromhex("0x1.6c16c2p-10")]


def f32(x):
    """x rounded to float32 (inf past its range)."""
    try:
        return struct.unpack("<f", struct.pack("<f", x))[0]
    except OverflowError:
        return math.copysign(math.inf, x)


def from_bits(h):
    return struct.unpack("<f", struct.pack("<I", int(h, 16)))[0]


def mix64(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def weight(x):
    """floor(e^x * 2^40) for x <= 0, as the float32 steps compute it."""
    if not x >= X_MIN:
        return 0
    k = float(round(f32(x * LOG2E)))  # rint: halves to even
    r = f32(f32(x - f32(k * LN2_HI)) - f32(k * LN2_LO))
    p = C[6]
    for c in reversed(C[:6]):
        p = f32(f32(p * r) + c)
    return int(p * 2.0 ** (WEIGHT_BITS + int(k)))  # exact scaling, truncated


def sample(V, t, inv, top_k, top_p, min_w, rep, pres, freq, seed, counter, pens, logits):
    v = list(logits)
    for i, cnt in pens:
        x = v[i]
        if rep != 1.0:
            x = f32(x / rep) if x > 0 else f32(x * rep)
        if (pres != 0 or freq != 0) and cnt > 0:
            x = f32(x - f32(pres + f32(freq * float(cnt))))
        v[i] = x
    if not all(math.isfinite(x) for x in v):
        return -1
    best = max(range(V), key=lambda i: (v[i], -i))
    if t == 0:
        return best
    vmax = v[best]
    w = [weight(f32(f32(x - vmax) * inv)) for x in v]
    ranked = sorted(range(V), key=lambda i: (-v[i], i))
    if 0 < top_k < V:
        ranked = ranked[:top_k]
    if top_p:
        z = sum(w[i] for i in ranked)
        need = max(1, (z * (top_p << 32)) >> 64)
        kept, cum = [], 0
        for i in ranked:
            kept.append(i)
            cum += w[i]
            if cum >= need:
                break
        ranked = kept
    support = {i for i in ranked if w[i] >= min_w}
    total = sum(w[i] for i in support)
    r = mix64((mix64((seed + GOLDEN) & M64) + (counter + 1) * GOLDEN) & M64)
    u = (r * total) >> 64
    acc = 0
    for i in range(V):
        if i in support:
            acc += w[i]
            if u < acc:
                return i
    raise AssertionError("the draw passed the total")


def main():
    out = []
    with open(sys.argv[1]) as f:
        for line in f:
            a = line.split()
            if not a:
                continue
            V = int(a[0])
            t, inv = from_bits(a[1]), from_bits(a[2])
            top_k, top_p, min_w = int(a[3]), int(a[4]), int(a[5])
            rep, pres, freq = from_bits(a[6]), from_bits(a[7]), from_bits(a[8])
            seed, counter, n_pen = int(a[9]), int(a[10]), int(a[11])
            pens = [(int(a[12 + 2 * j]), int(a[13 + 2 * j])) for j in range(n_pen)]
            logits = [from_bits(h) for h in a[12 + 2 * n_pen:]]
            assert len(logits) == V
            out.append(sample(V, t, inv, top_k, top_p, min_w, rep, pres, freq, seed, counter,
                              pens, logits))
    with open(sys.argv[2], "w") as f:
        f.write("".join("%d\n" % x for x in out))


if __name__ == "__main__":
    main()
