#!/usr/bin/env bash
# kernel_diff.sh — which generated kernels a change touches, on a machine
# without a GPU: builds test_codegen at two commits (git worktrees under
# $TMPDIR), has it generate the kernels of the config parts named (every
# bucket of the model's config, as the GPU would run them; MOEC_DUMP_CUDA
# keeps their source) and compares them kernel by kernel. A kernel whose
# text changed is one to time on the GPU before the change lands, in each
# dtype and bucket that runs it (the twenty-sixth round changed the bf16
# tensor-core experts' text while timing only fp8, and bf16 lost 28%).
#   usage: scripts/kernel_diff.sh BASE [HEAD]     (commits; HEAD by default)
#   PARTS: test_codegen parts (default "config_deepseek_v2_lite
#   config_deepseek_v2_lite_fp8 config_qwen3_30b_a3b
#   config_qwen3_30b_a3b_fp8"). Prints the changed, new and gone kernels
#   (the common prologue of helpers as "<prologue>"), a line each.
#   PTX=1 (needs nvcc): each changed kernel's program is compiled to PTX on
#   both sides (nvcc -ptx -arch=sm_90) and the kernel's PTX compared: a
#   kernel whose text changed but whose PTX did not ("same PTX") runs the
#   same machine code, with nothing to time. Where the PTX differs, both
#   are assembled (ptxas, beside nvcc) and the kernel's machine code (its
#   cubin's .text section) compared: "PTX differs, same machine code"
#   (registers renumbered, say) needs no timing either. Where the common
#   prologue changed, every kernel whose own text kept is compared as well
#   (each program compiled), and those whose code moved are named.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 1 ] || [ $# -gt 2 ]; then sed -n 2,23p "$0"; exit 2; fi
PARTS=${PARTS:-config_deepseek_v2_lite config_deepseek_v2_lite_fp8 config_qwen3_30b_a3b config_qwen3_30b_a3b_fp8}
work=$(mktemp -d "${TMPDIR:-/tmp}/moec-kdiff.XXXXXX")
trees=()
cleanup() {
  for t in "${trees[@]}"; do git worktree remove --force "$t" >/dev/null 2>&1 || true; done
  rm -rf "$work"
}
trap cleanup EXIT
export MOEC_CACHE_DIR=$work/cache
mkdir -p "$MOEC_CACHE_DIR"
side() { # NAME COMMIT: build test_codegen at COMMIT, its kernels' source in $work/NAME
  local t=$work/tree-$1
  git worktree add --detach "$t" "$2" >/dev/null 2>&1
  trees+=("$t")
  cmake -S "$t" -B "$t/build" -DMOEC_FUZZ=OFF >"$work/$1-cmake.txt" 2>&1 ||
    { tail "$work/$1-cmake.txt"; return 1; }
  cmake --build "$t/build" -j"$(nproc)" --target test_codegen >"$work/$1-build.txt" 2>&1 ||
    { tail "$work/$1-build.txt"; return 1; }
  mkdir -p "$work/$1"
  for p in $PARTS; do
    MOEC_DUMP_CUDA=$work/$1 "$t/build/tests/test_codegen" "$p" >"$work/$1-$p.txt" 2>&1 ||
      { tail "$work/$1-$p.txt"; return 1; }
  done
}
echo "kernel_diff: $(git log -1 --format='%h %s' "$1" | cut -c1-72)"
side base "$1"
echo "  against:   $(git log -1 --format='%h %s' "${2:-HEAD}" | cut -c1-72)"
side head "${2:-HEAD}"
NVCC=""
if [ "${PTX:-0}" = 1 ]; then
  NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
  [ -x "$NVCC" ] || { echo "PTX=1: no nvcc"; exit 1; }
fi
python3 - "$work/base" "$work/head" "$NVCC" <<'PY'
import os, re, struct, subprocess, sys

# the name may follow its __launch_bounds__ on the next line
HEAD = re.compile(r'^extern "C" __global__ void (?:__\w+__\([^)]*\)\s+)*(\w+)\(', re.M)

FILES = {}  # (directory, kernel name) -> the programs' files that hold it


def body_end(src, at):
    """the index past the brace closing the body that opens after at"""
    i, depth = src.index("{", at), 0
    while True:
        c = src[i]
        depth += c == "{"
        depth -= c == "}"
        i += 1
        if depth == 0:
            return i


def kernels(d):
    """kernel name -> its texts, one a program that holds it: each from the
    end of the kernel before it (so with any helpers between the two, which
    its body may use) to the end of its own body"""
    out, pros = {}, set()
    for f in sorted(os.listdir(d)):
        if not f.endswith(".cu"):
            continue
        src = open(os.path.join(d, f)).read()
        heads = list(HEAD.finditer(src))
        if not heads:
            continue
        # the first kernel starts at the comment line(s) right above its head
        begin = heads[0].start()
        while True:
            p = src.rfind("\n", 0, begin - 1) + 1
            if begin > 0 and src.startswith("//", p):
                begin = p
            else:
                break
        pros.add(src[:begin])
        for m in heads:
            end = body_end(src, m.end())
            out.setdefault(m.group(1), set()).add(src[begin:end])
            FILES.setdefault((d, m.group(1)), []).append(os.path.join(d, f))
            begin = end
    out = {k: frozenset(v) for k, v in out.items()}
    out["<prologue>"] = frozenset(pros)
    return out


PTX_OF = {}  # program file -> {entry name: its PTX}


def ptx(d, k):
    """kernel k's PTX in each of side d's programs that hold it"""
    return frozenset(ptx_in(f, k) for f in FILES[(d, k)])


def ptx_in(f, k):
    """kernel k's PTX in program f (each program compiled once)"""
    if f not in PTX_OF:
        out = f[:-3] + ".ptx"
        r = subprocess.run([sys.argv[3], "-ptx", "-arch=sm_90", "-std=c++17", "-w", f, "-o", out],
                           capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"PTX=1: nvcc could not compile {f}:\n{r.stderr[-2000:]}")
        text = open(out).read()
        PTX_OF[f] = {m.group(1): m.group(0) for m in
                     re.finditer(r"(?ms)^\.visible \.entry (\w+)\(.*?^}", text)}
    return PTX_OF[f].get(k)

TEXT_OF = {}  # program file -> {section name: bytes} of its cubin


def sass(d, k):
    """kernel k's machine code (its cubin's .text section, ptxas for sm_90)
    in each of side d's programs that hold it"""
    return frozenset(text_in(f, k) for f in FILES[(d, k)])


def text_in(f, k):
    if f not in TEXT_OF:
        ptx_in(f, k)
        out = f[:-3] + ".cubin"
        ptxas = os.path.join(os.path.dirname(sys.argv[3]), "ptxas")
        r = subprocess.run([ptxas, "-arch=sm_90", f[:-3] + ".ptx", "-o", out],
                           capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"PTX=1: ptxas could not assemble {f[:-3]}.ptx:\n{r.stderr[-2000:]}")
        d = open(out, "rb").read()  # ELF64: the section headers and their names
        shoff = struct.unpack_from("<Q", d, 0x28)[0]
        size, num, names = struct.unpack_from("<HHH", d, 0x3A)
        hdr = [struct.unpack_from("<IIQQQQ", d, shoff + i * size) for i in range(num)]
        base = hdr[names][4]
        TEXT_OF[f] = {d[base + h[0]:d.index(b"\0", base + h[0])].decode(): d[h[4]:h[4] + h[5]]
                      for h in hdr}
    return TEXT_OF[f].get(".text." + k)


a, b = kernels(sys.argv[1]), kernels(sys.argv[2])
changed = sorted(k for k in a if k in b and a[k] != b[k])
new = sorted(k for k in b if k not in a)
gone = sorted(k for k in a if k not in b)
print(f"{len(a)} kernels before, {len(b)} after: {len(changed)} changed, {len(new)} new, "
      f"{len(gone)} gone")


def verdict(k):
    """how kernel k's code compares between the sides (PTX=1)"""
    pa, pb = ptx(sys.argv[1], k), ptx(sys.argv[2], k)
    if None not in pa and pa == pb:
        return " (same PTX)"
    sa, sb = sass(sys.argv[1], k), sass(sys.argv[2], k)
    return (" (PTX differs, same machine code)" if None not in sa and sa == sb
            else " (machine code differs)")


for tag, names in (("changed", changed), ("new", new), ("gone", gone)):
    for k in names:
        note = verdict(k) if tag == "changed" and sys.argv[3] and k != "<prologue>" else ""
        print(f"  {tag:8s}{k}{note}")
# the prologue's helpers are every kernel's: with PTX=1, the kernels whose
# own text kept are compared too, those whose code moved named
if sys.argv[3] and "<prologue>" in changed:
    kept = [k for k in a if k in b and a[k] == b[k]]
    moved = [(k, verdict(k)) for k in sorted(kept)]
    moved = [(k, v) for k, v in moved if v != " (same PTX)"]
    print(f"  the prologue changed: {len(kept) - len(moved)} of the {len(kept)} kernels whose "
          "text kept have the same PTX")
    for k, v in moved:
        print(f"  prologue {k}{v}")
PY
