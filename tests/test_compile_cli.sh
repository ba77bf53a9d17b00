#!/usr/bin/env bash
# test_compile_cli.sh — `moec compile` and `moec run PLAN` as a user meets
# them, with no GPU: the help names every flag; compile of a tiny model
# writes a plan (MOECPLAN magic) with a progress line per bucket; running a
# plan checks the plan, then the checkpoint, then asks for a device (here:
# "no CUDA device"); every bad invocation fails with its exit code and
# message. A fresh cubin cache, so NVRTC really compiles (valgrind runs are
# in test_compile_valgrind.sh).
set -u
B=${MOEC_BUILD_DIR:?}/moec
S=${MOEC_SOURCE_DIR:?}
D=$S/tests/data
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
export MOEC_CACHE_DIR=$T/cubin
unset MOEC_ARCH MOEC_DTYPE
# shellcheck source=tests/lib.sh
source "$S/tests/lib.sh"


expect 0 "compile MODEL_DIR" -- "$B" --help
for f in --output --arch --dtype --buckets --batch-sizes --tp --quantize --quantized-dir --fp8-layout --help '$MOEC_CACHE_DIR' 'moec run PLAN --weights'; do
  expect 0 "$f" -- "$B" compile --help
done
expect 0 "(SIGINT, SIGTERM, SIGHUP) leaves no partial PLAN or folder, and an existing" -- "$B" compile --help
expect 0 "--weights DIR" -- "$B" run --help
expect 0 "moec run PLAN --weights MODEL_DIR" -- "$B" run --help

# Compile: a plan, a progress line per bucket (kernels done / total), a summary line.
P=$T/v3.moec
"$B" compile "$D/deepseek_v3" -o "$P" --batch-sizes 1,8 2>"$T/err"; rc=$?
[ "$rc" = 0 ] && ok || bad "compile exited $rc: $(cat "$T/err")"
[ "$(head -c 8 "$P" 2>/dev/null)" = MOECPLAN ] && ok || bad "the plan lacks the MOECPLAN magic"
# one line per bucket: kernels done of all kernels, the last with all done
n=$(grep -c "^moec compile: compiled [0-9]*/[0-9]* kernels$" "$T/err")
[ "$n" = 2 ] && ok || bad "want 2 progress lines: $(cat "$T/err")"
last=$(grep "^moec compile: compiled" "$T/err" | tail -1 | sed 's/.* \([0-9]*\)\/\([0-9]*\) kernels/\1 \2/')
set -- $last
[ "${1:-x}" = "${2:-y}" ] && [ "${1:-0}" -gt 10 ] && ok || bad "last progress line not all kernels: $(cat "$T/err")"
first=$(grep "^moec compile: compiled" "$T/err" | head -1 | sed 's/.* \([0-9]*\)\/.*/\1/')
[ "${first:-0}" -gt 0 ] && [ "${first:-0}" -lt "${2:-0}" ] && ok || bad "first progress line: $(cat "$T/err")"
grep -q "moec compile: wrote $P ([0-9]* bytes) in [0-9.]* s" "$T/err" && ok || bad "no summary line: $(cat "$T/err")"
n=$(ls "$MOEC_CACHE_DIR" | wc -l); [ "$n" -ge 2 ] && ok || bad "the cubin cache holds $n entries, want 2"
expect 1 "MOEC_MOE_KERNEL='fast' is not auto, simt or mma" -- env MOEC_MOE_KERNEL=fast "$B" compile "$D/qwen3_moe" -o "$T/bad.moec"
expect 1 "MOEC_FP8_KERNEL='new' is not auto, old or tc" -- env MOEC_FP8_KERNEL=new "$B" compile "$D/qwen3_moe_fp8" -o "$T/bad.moec"
# the fp8 kernels a plan holds at 8 tokens: the staged ones by default, the
# first ones with MOEC_FP8_KERNEL=old (kernel names are in the plan's text)
expect 0 "kernels" -- "$B" compile "$D/qwen3_moe_fp8" -o "$T/f8.moec" --batch-sizes 8
expect 0 "kernels" -- env MOEC_FP8_KERNEL=old "$B" compile "$D/qwen3_moe_fp8" -o "$T/f8old.moec" --batch-sizes 8
grep -qa "linear_f8tc_" "$T/f8.moec" && grep -qa "moe_gate_up_.*_f8tc_" "$T/f8.moec" && ok ||
  bad "the default fp8 plan lacks the staged kernels"
! grep -qa "_f8tc_" "$T/f8old.moec" && grep -qa "linear_mma_" "$T/f8old.moec" && ok ||
  bad "MOEC_FP8_KERNEL=old still has staged kernels, or no first tensor-core linear"
[ ! -e "$T/bad.moec" ] && ok || bad "a refused compile left $T/bad.moec"
# --fp8-layout: the plan's header records it (fp8_tiles: the experts' 3
# gate_up, 1 tiles, 2 down, 0 rows; +linear adds 4; the default is
# gate_up+linear, 7), over $MOEC_FP8_TILES; the kernels of tiled weights
# carry _tl in their names (the linears' at 1 token the few-token kernel's
# tile form, at 8 the staged kernel)
grep -qa '"fp8_tiles":7' "$T/f8.moec" && grep -qa "moe_gate_up_[a-z0-9_]*_tl" "$T/f8.moec" &&
  ! grep -qa "moe_down_[a-z0-9_]*_tl" "$T/f8.moec" && grep -qa "linear_f8tc_[a-z0-9_]*_tl" "$T/f8.moec" &&
  ok || bad "the default fp8 plan does not lay gate_up's and the linears' weights alone in tiles"
for l in rows:0:0:0:0 tiles:1:1:1:0 down:2:0:1:0 gate_up:3:1:0:0 rows+linear:4:0:0:1 \
  tiles+linear:5:1:1:1 gate_up+linear:7:1:0:1; do
  IFS=: read -r name n gu dn ln <<<"$l"
  # one token too where the linears lie in tiles (their few-token kernel's tile form)
  bs=8
  [ "$ln" = 0 ] || bs=1,8
  expect 0 "kernels" -- env MOEC_FP8_TILES=1 "$B" compile "$D/qwen3_moe_fp8" -o "$T/f8l.moec" --batch-sizes $bs --fp8-layout "$name"
  grep -qa "\"fp8_tiles\":$n" "$T/f8l.moec" && ok || bad "--fp8-layout $name: the plan's fp8_tiles is not $n"
  [ "$(grep -ca "moe_gate_up_[a-z0-9_]*_tl" "$T/f8l.moec")" -gt 0 ] && g=1 || g=0
  [ "$(grep -ca "moe_down_[a-z0-9_]*_tl" "$T/f8l.moec")" -gt 0 ] && d=1 || d=0
  [ "$(grep -ca "linear_f8tc_[a-z0-9_]*_tl" "$T/f8l.moec")" -gt 0 ] && l1=1 || l1=0
  [ "$ln" = 0 ] || [ "$(grep -ca "linear_gemv_[a-z0-9_]*_tl" "$T/f8l.moec")" -gt 0 ] || l1=0
  [ "$g$d$l1" = "$gu$dn$ln" ] && ok ||
    bad "--fp8-layout $name: gate_up / down / linears tiled $g / $d / $l1, want $gu / $dn / $ln"
done
expect 2 "--fp8-layout: 'fast' is not gate_up, tiles, down or rows, alone or with +linear" -- "$B" compile "$D/qwen3_moe_fp8" -o "$T/bad.moec" --fp8-layout fast
expect 2 "--fp8-layout: 'down+' is not gate_up" -- "$B" compile "$D/qwen3_moe_fp8" -o "$T/bad.moec" --fp8-layout down+
expect 1 "MOEC_DSA_KERNEL='fastest' is not fast or legacy" -- env MOEC_DSA_KERNEL=fastest "$B" compile "$D/deepseek_v32" -o "$T/bad.moec" --batch-sizes 1
[ ! -e "$T/bad.moec" ] && ok || bad "a refused compile left $T/bad.moec"
expect 0 "kernels" -- "$B" compile "$D/qwen3_moe" -o "$T/q3.moec" --batch-sizes 4 --dtype fp32 --arch sm_80 --tp 1
# MOEC_DUMP_CUDA: each module's source as DIR/<cache key>.cu (from the cache too); a
# folder it cannot write into fails the compile by name, leaving no plan
mkdir -p "$T/cuda"
expect 0 "kernels" -- env MOEC_DUMP_CUDA="$T/cuda" "$B" compile "$D/qwen3_moe" -o "$T/q3d.moec" --batch-sizes 4 --dtype fp32 --arch sm_80
n=$(find "$T/cuda" -name '*.cu' | wc -l)
[ "$n" = 1 ] && grep -q 'extern "C" __global__ void' "$T"/cuda/*.cu && ok || bad "MOEC_DUMP_CUDA wrote $n sources, want 1 with kernels"
expect 1 "MOEC_DUMP_CUDA: cannot write $T/nodir/" -- env MOEC_DUMP_CUDA="$T/nodir" "$B" compile "$D/qwen3_moe" -o "$T/bad.moec" --batch-sizes 4 --dtype fp32 --arch sm_80
[ ! -e "$T/bad.moec" ] && ok || bad "a compile refused for MOEC_DUMP_CUDA left $T/bad.moec"
# a plan per rank; one asked to run with another split is refused by name
expect 0 "kernels" -- "$B" compile "$D/qwen3_moe" -o "$T/q3tp2.moec" --batch-sizes 4 --dtype fp32 --arch sm_80 --tp 2 --ep 2
expect 1 "plan $T/q3tp2.moec was compiled for tp 2, ep 2 (2 ranks); asked to run it with tp 1, ep 1" -- "$B" run "$T/q3tp2.moec" --weights "$D/qwen3_moe" --prompt-ids 1,2 --max-new-tokens 1 --tp 1
expect 1 "plan $T/q3.moec was compiled for tp 1, ep 1 (1 rank); asked to run it with tp 2, ep 1" -- "$B" run "$T/q3.moec" --weights "$D/qwen3_moe" --prompt-ids 1,2 --max-new-tokens 1 --tp 2

# Running a plan: the plan, then the checkpoint, then the device.
expect 1 "plan $P was compiled for another config" -- "$B" run "$P" --weights "$D/qwen3_moe" --prompt-ids 1,2 --max-new-tokens 1
if ! command -v nvidia-smi >/dev/null 2>&1; then
  expect 1 "no CUDA device: no NVIDIA driver or GPU was found (" -- "$B" run "$P" --weights "$D/deepseek_v3" --prompt-ids 1,2 --max-new-tokens 1
  # bench of a plan: its default context fits the model, so on to the device
  expect 1 "no CUDA device: no NVIDIA driver or GPU was found (" -- "$B" bench "$P" --weights "$D/deepseek_v3"
fi
# ...and a context too long for it is refused before any device is looked for
expect 2 "moec: --context 1024 is more than the model allows: at most 511 (its max_position_embeddings 512, less the token each step decodes)" -- \
  "$B" bench "$P" --weights "$D/deepseek_v3" --context 1024
# --logits-out onto the plan the run reads is refused, before anything loads
expect 2 "moec: --logits-out $P is the plan $P, which the run reads" -- \
  "$B" run "$P" --weights "$D/deepseek_v3" --prompt-ids 1 --max-new-tokens 1 --logits-out "$P"
size=$(stat -c %s "$P")
head -c 100 "$P" >"$T/short.moec"
expect 1 "plan $T/short.moec is truncated" -- "$B" run "$T/short.moec" --weights "$D/deepseek_v3" --prompt-ids 1 --max-new-tokens 1
head -c $((size - 4096)) "$P" >"$T/cut.moec"
expect 1 "plan $T/cut.moec is corrupt or truncated (checksum mismatch)" -- "$B" run "$T/cut.moec" --weights "$D/deepseek_v3" --prompt-ids 1 --max-new-tokens 1
expect 1 "config.json is not a moec plan" -- "$B" run "$D/deepseek_v3/config.json" --weights "$D/deepseek_v3" --prompt-ids 1 --max-new-tokens 1
expect 2 "moec: --max-seq-len 1000 exceeds the model's max_position_embeddings 512" -- "$B" run "$P" --weights "$D/deepseek_v3" --prompt-ids 1 --max-new-tokens 1 --max-seq-len 1000
# prompt + new tokens past the model's limit name the flag to change, for a plan too
expect 2 "moec: 1 prompt tokens and --max-new-tokens 1000 need 1000 positions, more than the model's max_position_embeddings 512: --max-new-tokens can be at most 512" -- \
  "$B" run "$P" --weights "$D/deepseek_v3" --prompt-ids 1 --max-new-tokens 1000

# A bad output path fails at once, before any pass or NVRTC compile, naming
# the path given (not the temporary file the plan is written through).
# compile_fast CODE NEEDLE -- CMD...: as expect, and no kernel was compiled.
compile_fast() {
  expect "$@"
  shift 3
  "$@" 2>&1 | grep -q "compiled [0-9]*/[0-9]* kernels" && bad "$* compiled kernels first" || ok
}
compile_fast 1 "cannot write the plan $T: it is a directory (name a file, such as $T/model.moec)" -- \
  "$B" compile "$D/deepseek_v3" -o "$T"
compile_fast 1 "cannot write the plan $T/nonexistent/x.moec: directory $T/nonexistent: No such file or directory" -- \
  "$B" compile "$D/deepseek_v3" -o "$T/nonexistent/x.moec"
compile_fast 1 "cannot write the plan: its file name is empty" -- "$B" compile "$D/deepseek_v3" -o ""
compile_fast 1 "cannot write the plan $P/x.moec: $P is not a directory" -- "$B" compile "$D/deepseek_v3" -o "$P/x.moec"
# a plan named as one of the checkpoint's files would replace it
mkdir -p "$T/w" && cp "$D/qwen3_moe/"* "$T/w/"
compile_fast 1 "cannot write the plan $T/w/../w/model.safetensors: it is $T/w/model.safetensors, a file of the checkpoint it is compiled from" -- \
  "$B" compile "$T/w" -o "$T/w/../w/model.safetensors"
compile_fast 1 "cannot write the plan $T/w/config.json: it is $T/w/config.json, a file of the checkpoint" -- \
  "$B" compile "$T/w" -o "$T/w/config.json" --quantize fp8 --quantized-dir "$T/wq"
cmp -s "$T/w/model.safetensors" "$D/qwen3_moe/model.safetensors" && cmp -s "$T/w/config.json" "$D/qwen3_moe/config.json" &&
  [ ! -e "$T/wq" ] && ok || bad "a compile refused for its output path changed the checkpoint or wrote $T/wq"
if [ "$(id -u)" != 0 ]; then # root writes anywhere
  mkdir "$T/ro" && chmod 555 "$T/ro"
  compile_fast 1 "cannot write the plan $T/ro/x.moec: directory $T/ro is not writable: Permission denied" -- \
    "$B" compile "$D/deepseek_v3" -o "$T/ro/x.moec"
fi

# Bad invocations.
expect 1 "tp 3 does not divide num_attention_heads 4" -- "$B" compile "$D/deepseek_v3" -o "$T/x.moec" --tp 3
expect 1 "ep 4 must divide tp 2" -- "$B" compile "$D/deepseek_v3" -o "$T/x.moec" --tp 2 --ep 4
expect 2 "--tp: 'x' is not an integer in [1, 64]" -- "$B" compile "$D/deepseek_v3" -o "$T/x.moec" --tp x
expect 2 "--ep: '0' is not an integer in [1, 64]" -- "$B" compile "$D/deepseek_v3" -o "$T/x.moec" --ep 0
expect 2 "unknown option --rank" -- "$B" compile "$D/deepseek_v3" -o "$T/x.moec" --rank 1
expect 2 "missing -o PLAN" -- "$B" compile "$D/deepseek_v3"
expect 2 "missing MODEL_DIR" -- "$B" compile -o "$T/x.moec"
expect 2 "--dtype: 'fp16' is not bf16 or fp32" -- "$B" compile "$D/deepseek_v3" -o "$T/x.moec" --dtype fp16
expect 2 "--batch-sizes: '8,1' is not 1 to 16 ascending buckets" -- "$B" compile "$D/deepseek_v3" -o "$T/x.moec" --batch-sizes 8,1
expect 2 "--arch: '90' is not a GPU arch like sm_90" -- "$B" compile "$D/deepseek_v3" -o "$T/x.moec" --arch 90
expect 2 "--arch: 'sm_' is not a GPU arch like sm_90" -- "$B" compile "$D/deepseek_v3" -o "$T/x.moec" --arch sm_
expect 2 "--arch: 'sm_x90' is not a GPU arch like sm_90" -- "$B" run "$D/deepseek_v3" --prompt-ids 1 --max-new-tokens 1 --arch sm_x90
expect 2 "unknown option --frob" -- "$B" compile "$D/deepseek_v3" -o "$T/x.moec" --frob
expect 2 "is a plan file: --weights MODEL_DIR (the checkpoint it was compiled for) is required" -- "$B" run "$P" --prompt-ids 1 --max-new-tokens 1
expect 2 "--backend cpu: $P is a plan, which runs on the GPU" -- "$B" run "$P" --weights "$D/deepseek_v3" --prompt-ids 1 --max-new-tokens 1 --backend cpu
expect 2 "--arch: $P is a plan, compiled for one arch" -- "$B" run "$P" --weights "$D/deepseek_v3" --prompt-ids 1 --max-new-tokens 1 --arch sm_90
mkdir -p "$T/noweights" && cp "$D/deepseek_v3/config.json" "$T/noweights/"
expect 1 "no *.safetensors" -- "$B" compile "$T/noweights" -o "$T/x.moec"
[ ! -e "$T/x.moec" ] && ok || bad "a failed compile left $T/x.moec"
"$B" compile "$D/deepseek_v3" -o "$T/again.moec" --batch-sizes 1,8 2>/dev/null
cmp -s "$T/again.moec" "$P" && ok || bad "a recompile (warm cache) wrote a different plan"

# --quantize fp8: the fp8 checkpoint written beside the plan (PLAN without
# .moec, plus .fp8), the plan compiled for it; the CPU runs the same folder.
Q=$T/q.moec
"$B" compile "$D/deepseek_v3" -o "$Q" --quantize fp8 --batch-sizes 1 2>"$T/qerr"; rc=$?
[ "$rc" = 0 ] && ok || bad "compile --quantize fp8 exited $rc: $(cat "$T/qerr")"
grep -q "moec compile: the fp8 checkpoint is $T/q.fp8: run the plan with --weights $T/q.fp8" "$T/qerr" && ok ||
  bad "compile --quantize fp8 does not say where the checkpoint is: $(cat "$T/qerr")"
grep -q '"quant_method":[[:space:]]*"fp8"' "$T/q.fp8/config.json" && [ -f "$T/q.fp8/model-00001.safetensors" ] && ok ||
  bad "$T/q.fp8 is not an fp8 checkpoint"
[ "$(head -c 8 "$Q" 2>/dev/null)" = MOECPLAN ] && ok || bad "compile --quantize fp8 wrote no plan"
got=$("$B" run "$T/q.fp8" --prompt-ids 3,4,5 --max-new-tokens 3 --ignore-eos --backend cpu)
[ -n "$got" ] && ok || bad "the fp8 checkpoint does not run on the CPU"
expect 1 "plan $Q was compiled for another config" -- "$B" run "$Q" --weights "$D/deepseek_v3" --prompt-ids 1,2 --max-new-tokens 1
compile_fast 1 "cannot write the fp8 checkpoint $T/q.fp8: it exists (remove it, or name another folder)" -- \
  "$B" compile "$D/deepseek_v3" -o "$Q" --quantize fp8
compile_fast 1 "is quantized already (its config.json has a quantization_config): nothing to quantize" -- \
  "$B" compile "$D/deepseek_v3_fp8" -o "$T/q2.moec" --quantize fp8 --quantized-dir "$T/q2"
[ ! -e "$T/q2" ] && ok || bad "a refused quantization left $T/q2"
# a compile --quantize stopped by a signal while it writes the fp8 folder
# leaves neither its temporary folder (DIR.tmpPID) nor a plan, and an
# existing plan stays as it was: a model large enough that quantizing takes
# a while, the signal sent once the temporary folder is there
python3 -c "import json,sys;c=json.load(open(sys.argv[1]));c.update(hidden_size=512,intermediate_size=1024,moe_intermediate_size=256,n_routed_experts=64,vocab_size=4096);json.dump(c,open(sys.argv[2],'w'))" \
  "$S/samples/configs/deepseek_v3_tiny.json" "$T/big.json"
"$MOEC_BUILD_DIR/moec-sample" --fast "$T/big.json" "$T/big" >/dev/null 2>&1 && ok || bad "moec-sample of $T/big.json failed"
cp "$P" "$T/keep.moec"
for sig in TERM HUP; do # (a job started with & ignores SIGINT, and so does the compile)
  "$B" compile "$T/big" -o "$T/keep.moec" --quantize fp8 --quantized-dir "$T/bigq" --batch-sizes 1 2>/dev/null &
  pid=$!
  for _ in $(seq 200); do compgen -G "$T/bigq.tmp*/config.json" >/dev/null && break; sleep 0.05; done
  kill -s $sig $pid; wait $pid; rc=$?
  left=$(ls -d "$T"/bigq* "$T"/keep.moec.tmp* 2>/dev/null)
  [ $rc -gt 128 ] && [ -z "$left" ] && cmp -s "$T/keep.moec" "$P" && ok ||
    bad "compile --quantize stopped by SIG$sig: exit $rc, left '$left', or changed the plan there"
done
# the plan where the fp8 folder goes: refused before anything is quantized
compile_fast 1 "cannot write the plan $T/same: it is where the fp8 checkpoint $T/./same/ goes (name another file or folder)" -- \
  "$B" compile "$D/deepseek_v3" -o "$T/same" --quantize fp8 --quantized-dir "$T/./same/"
[ ! -e "$T/same" ] && ok || bad "a refused compile wrote $T/same"
expect 2 "--quantize: 'int4' is not fp8" -- "$B" compile "$D/deepseek_v3" -o "$T/x.moec" --quantize int4
expect 2 "--quantized-dir goes with --quantize fp8" -- "$B" compile "$D/deepseek_v3" -o "$T/x.moec" --quantized-dir "$T/qq"

# run MODEL_DIR --weights DIR reads the weights from DIR.
mkdir -p "$T/cfg" && cp "$D/qwen3_moe/config.json" "$T/cfg/"
want=$("$B" run "$D/qwen3_moe" --prompt-ids 3,4,5 --max-new-tokens 3 --ignore-eos --backend cpu)
got=$("$B" run "$T/cfg" --weights "$D/qwen3_moe" --prompt-ids 3,4,5 --max-new-tokens 3 --ignore-eos --backend cpu)
[ -n "$want" ] && [ "$got" = "$want" ] && ok || bad "run --weights printed '$got', want '$want'"

finish test_compile_cli
