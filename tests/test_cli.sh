#!/usr/bin/env bash
# test_cli.sh — the moec command line as a user meets it: help texts name
# every flag, dump-ir and run work on the tiny models, run's ids and
# --logits-out rows match the transformers goldens, and every bad invocation
# fails with its exit code and message.
set -u
B=${MOEC_BUILD_DIR:?}/moec
S=${MOEC_SOURCE_DIR:?}
D=$S/tests/data
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
# shellcheck source=tests/lib.sh
source "$S/tests/lib.sh"


expect 0 "dump-ir MODEL_DIR" -- "$B" --help
expect 2 "usage: moec" -- "$B"
expect 2 "unknown command 'frobnicate'" -- "$B" frobnicate
for f in --output --summary --after --dtype --help fuse_qkv_a plan_memory; do expect 0 "$f" -- "$B" dump-ir --help; done
for f in --prompt-ids --max-new-tokens --backend --logits-out --max-seq-len --ignore-eos --arch --help; do
  expect 0 "$f" -- "$B" run --help
done

# dump-ir on every family; the summary names the model type.
for m in deepseek_v2 deepseek_v2_qlora deepseek_v3 qwen2_moe qwen3_moe; do
  expect 0 "module " -- "$B" dump-ir "$D/$m"
  expect 0 "model $(python3 -c "import json;print(json.load(open('$D/$m/config.json'))['model_type'])")" -- "$B" dump-ir "$D/$m" --summary
done
"$B" dump-ir "$D/qwen3_moe" -o "$T/q.mir" && [ -s "$T/q.mir" ] && ok || bad "dump-ir -o wrote nothing"
# -o naming one of the model's files is refused, the file left as it was
mkdir -p "$T/dm" && cp "$D/qwen3_moe/config.json" "$T/dm/"
expect 2 "moec: -o $T/dm/./config.json is $T/dm/config.json, a file of the model" -- \
  "$B" dump-ir "$T/dm" -o "$T/dm/./config.json"
cmp -s "$T/dm/config.json" "$D/qwen3_moe/config.json" && ok || bad "dump-ir -o changed the model's config.json"

# dump-ir after passes: one pass, and every pass into a folder.
expect 0 "# after pass absorb_mla" -- "$B" dump-ir "$D/deepseek_v2" --after absorb_mla
expect 0 "mla_attention(" -- "$B" dump-ir "$D/deepseek_v2" --after absorb_mla
expect 0 "stream 1" -- "$B" dump-ir "$D/qwen2_moe" --after assign_streams
expect 0 "meta arena_bytes_per_token" -- "$B" dump-ir "$D/qwen3_moe" --after plan_memory
expect 0 "wrote 17 files" -- "$B" dump-ir "$D/deepseek_v3" --after all -o "$T/passes"
n=$(ls "$T/passes"/*.mir | wc -l); [ "$n" = 17 ] && ok || bad "--after all wrote $n files, want 17"
head -1 "$T/passes/07_absorb_mla.mir" | grep -q "^# after pass absorb_mla" && ok || bad "07_absorb_mla.mir lacks its header"
head -1 "$T/passes/09_fuse_mla_prologue.mir" | grep -q "^# after pass fuse_mla_prologue" && ok ||
  bad "09_fuse_mla_prologue.mir lacks its header"
grep -q "= mla_prologue_kv(%l1.attn.qkv_a, %positions" "$T/passes/09_fuse_mla_prologue.mir" && ok ||
  bad "deepseek_v3: no mla_prologue_kv after fuse_mla_prologue"
grep -q "add_rms_norm(%l1.attn_residual, %l1.moe.routed, %l2.input_layernorm, %l1.moe.join)" \
  "$T/passes/13_fuse_add3_rms_norm.mir" && ok || bad "deepseek_v3: the expert sum is not in the residual add_rms_norm"
expect 0 "= mla_prologue(%l1.attn.qkv_a, %positions, %l1.attn.kv_a_layernorm)" -- \
  "$B" dump-ir "$D/deepseek_v2" --after fuse_mla_prologue
expect 0 "%l1.attn.q_rot : f32[T, 4, 24], %l1.attn.k_rot : f32[T, 2, 24], %l1.attn.v : f32[T, 2, 24] = attn_prologue(%l1.attn.qkv, %positions, %l1.attn.q_norm, %l1.attn.k_norm) {heads = 4, kv_heads = 2, head_dim = 24, eps = 1e-06, style = \"neox\"" -- \
  "$B" dump-ir "$D/qwen3_moe" --after fuse_attn_prologue
expect 0 "= attn_prologue(%l0.attn.qkv, %positions) {heads = 4, kv_heads = 2, head_dim = 16, style = \"neox\"" -- \
  "$B" dump-ir "$D/qwen2_moe" --after plan_memory
expect 2 "unknown pass 'fuse_everything'" -- "$B" dump-ir "$D/qwen3_moe" --after fuse_everything
expect 2 "--after all needs -o DIR" -- "$B" dump-ir "$D/qwen3_moe" --after all
expect 2 "--dtype: 'int4' is not bf16, fp16 or fp32" -- "$B" dump-ir "$D/qwen3_moe" --after plan_memory --dtype int4

# DeepSeek-V3.2: every pass dumps; its bad fields and a missing indexer
# tensor are named, with exit status 1.
v32=$D/deepseek_v32
expect 0 "wrote 17 files" -- "$B" dump-ir "$v32" --after all -o "$T/v32passes"
grep -q "= dsa_topk(" "$T/v32passes/16_plan_memory.mir" && ok || bad "deepseek_v32: no dsa_topk after the passes"
head -1 "$T/v32passes/11_fuse_dsa_indexer.mir" | grep -q "^# after pass fuse_dsa_indexer" && ok ||
  bad "11_fuse_dsa_indexer.mir lacks its header"
grep -q "%l2.attn.indexer.k : f32\[T, 16\] = dsa_prologue_k(%l2.attn.qkv_a, %positions, %l2.attn.indexer.k_norm, %l2.attn.indexer.k_norm.bias) {col = 64, eps = 1e-06, style = \"neox\"" \
  "$T/v32passes/11_fuse_dsa_indexer.mir" && ok || bad "deepseek_v32: no dsa_prologue_k after fuse_dsa_indexer"
grep -q "= dsa_topk(%l2.attn.indexer.q_flat, %l2.attn.indexer.k, %l2.attn.qkv_a, %positions) {.*heads = 8, q_col = 0, w_col = 80, style = \"neox\"" \
  "$T/v32passes/11_fuse_dsa_indexer.mir" && ok || bad "deepseek_v32: dsa_topk does not read q and the weights in place after fuse_dsa_indexer"
grep -q "= rope(\|= layer_norm(" "$T/v32passes/11_fuse_dsa_indexer.mir" && bad "deepseek_v32: a rope or layer_norm is left after fuse_dsa_indexer" || ok
grep -q "= mla_prologue_q(%l2.attn.q_flat, %positions)" "$T/v32passes/16_plan_memory.mir" && ok ||
  bad "deepseek_v32: mla_prologue_q does not read q_b's output"
# assign_streams: the indexer (wq_b's linear of the fork of the q LoRA
# latent, dsa_prologue_k, dsa_topk) on stream 1, joined before the attention
grep -q "%l2.attn.indexer.fork : f32\[T, 24\] = fork(%l2.attn.q_a_norm) stream 1" \
  "$T/v32passes/12_assign_streams.mir" && ok || bad "deepseek_v32: no fork of the q LoRA latent for the indexer"
grep -q "%l2.attn.indexer.q_flat : f32\[T, 128\] = linear(%l2.attn.indexer.fork, %l2.attn.indexer.wq_b) stream 1" \
  "$T/v32passes/12_assign_streams.mir" && ok || bad "deepseek_v32: wq_b's linear is not on stream 1"
grep -q "= dsa_topk(.*} stream 1$" "$T/v32passes/12_assign_streams.mir" && ok ||
  bad "deepseek_v32: dsa_topk is not on stream 1"
grep -A1 "= join(%l2.attn.indexer.topk)$" "$T/v32passes/12_assign_streams.mir" | grep -q "= mla_attention(.*%l2.attn.indexer.join)" &&
  ok || bad "deepseek_v32: the attention does not read the indexer's join right after it"
grep -q "= mla_attention(.*%l2.attn.indexer.topk)" "$T/v32passes/07_absorb_mla.mir" && ok ||
  bad "deepseek_v32: the absorbed attention does not read the indexer's selection"
v32bad() { # v32bad DIR KEY JSON: the tiny V3.2 model with config key set to JSON
  mkdir -p "$1" && cp "$v32/model.safetensors" "$1/" &&
    python3 -c "import json,sys;c=json.load(open('$v32/config.json'));c[sys.argv[1]]=json.loads(sys.argv[2]);json.dump(c,open('$1/config.json','w'))" "$2" "$3"
}
v32bad "$T/v32k0" index_topk 0
expect 1 'field "index_topk" = 0 is out of range (must be at least 1)' -- "$B" dump-ir "$T/v32k0"
v32bad "$T/v32d4" index_head_dim 4
expect 1 'field "index_head_dim" = 4 is smaller than qk_rope_head_dim (8)' -- "$B" run "$T/v32d4" --backend cpu --prompt-ids 1,2 --max-new-tokens 1
v32bad "$T/v32wk" index_topk 8
python3 - "$T/v32wk/model.safetensors" <<'PY'
import struct, sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read())
n = struct.unpack("<Q", b[:8])[0]
name = b"model.layers.1.self_attn.indexer.wk.weight"
i = b.index(name, 8, 8 + n)
b[i + len(name) - len("k.weight")] = ord("z")
open(p, "wb").write(b)
PY
expect 1 "tensor 'model.layers.1.self_attn.indexer.wk.weight' not found" -- "$B" run "$T/v32wk" --backend cpu --prompt-ids 1,2 --max-new-tokens 1

# run: ids and logits rows against the goldens.
for m in deepseek_v3 qwen2_moe; do
  read -r prompt greedy n <<<"$(python3 - "$D/$m/golden.json" <<'PY'
import json, sys
g = json.load(open(sys.argv[1]))
print(",".join(map(str, g["prompt_ids"])), " ".join(map(str, g["greedy_ids"])).replace(" ", ","), len(g["greedy_ids"]))
PY
)"
  out=$("$B" run "$D/$m" --prompt-ids "$prompt" --max-new-tokens "$n" --ignore-eos --backend cpu --logits-out "$T/l.bin" 2>"$T/err")
  if [ "$out" = "${greedy//,/ }" ]; then ok; else bad "$m: run printed '$out', want '${greedy//,/ }' ($(cat "$T/err"))"; fi
  python3 - "$D/$m" "$T/l.bin" <<'PY' && ok || bad "$m: --logits-out rows differ from the goldens"
import array, json, sys
d, path = sys.argv[1], sys.argv[2]
g = json.load(open(d + "/golden.json"))
V, P, G = g["vocab_size"], len(g["prompt_ids"]), len(g["greedy_ids"])
ref = array.array("f"); ref.frombytes(open(d + "/logits.bin", "rb").read())
got = array.array("f"); got.frombytes(open(path, "rb").read())
assert len(got) == G * V, (len(got), G * V)
for k in range(G):
    want = ref[(P - 1 + k) * V:(P + k) * V]
    row = got[k * V:(k + 1) * V]
    m = max(abs(x) for x in want)
    assert max(abs(a - b) for a, b in zip(row, want)) <= 1e-4 * m, k
PY
done

# Tensor and expert parallelism on the CPU: one rank's module; run split over
# ranks prints the unsplit run's ids; the flags' bad values and refusals.
for f in --tp --ep --rank; do expect 0 "$f" -- "$B" dump-ir --help; done
for f in --tp --ep; do expect 0 "$f" -- "$B" run --help; expect 0 "$f" -- "$B" compile --help; expect 0 "$f" -- "$B" serve --help; done
expect 0 "meta rank = 1" -- "$B" dump-ir "$D/qwen2_moe" --tp 2 --rank 1
expect 0 "# after pass shard" -- "$B" dump-ir "$D/qwen2_moe" --tp 2 --rank 1
expect 0 '%logits : f32[T, 256] = all_gather(%logits.shard) {axis = 1, ranks = 2}' -- "$B" dump-ir "$D/qwen2_moe" --tp 2 --rank 1
expect 0 '"model.layers.0.self_attn.o_proj.weight"[:, 32:64]' -- "$B" dump-ir "$D/qwen2_moe" --tp 2 --rank 1
expect 0 'stack("model.layers.1.mlp.experts.{e}.down_proj.weight", 16)[8:16, :, :]' -- "$B" dump-ir "$D/deepseek_v3" --ep 2 --rank 1
expect 0 "meta arena_bytes_per_token" -- "$B" dump-ir "$D/deepseek_v3" --tp 4 --ep 2 --rank 3 --after plan_memory
expect 0 "wrote 17 files" -- "$B" dump-ir "$D/qwen3_moe" --tp 2 --after all -o "$T/tp2"
grep -q "all_reduce" "$T/tp2/08_shard.mir" && ok || bad "08_shard.mir of --tp 2 has no all_reduce"
grep -q "%l0.attn.q_rot : f32\[T, 2, 24\], %l0.attn.k_rot : f32\[T, 1, 24\], %l0.attn.v : f32\[T, 1, 24\] = attn_prologue(" \
  "$T/tp2/10_fuse_attn_prologue.mir" && ok || bad "--tp 2: a rank's heads are not one attn_prologue"
expect 1 "tp 3 does not divide num_attention_heads 4" -- "$B" dump-ir "$D/qwen3_moe" --tp 3
expect 1 "ep 3 must divide tp 4" -- "$B" dump-ir "$D/qwen3_moe" --tp 4 --ep 3
expect 1 "rank 2 out of range [0, 2) (tp 2)" -- "$B" dump-ir "$D/qwen3_moe" --tp 2 --rank 2
expect 2 "--rank needs --tp" -- "$B" dump-ir "$D/qwen3_moe" --rank 1
expect 2 "--tp: '0' is not an integer in [1, 64]" -- "$B" dump-ir "$D/qwen3_moe" --tp 0
expect 2 "--rank: '-1' is not an integer in [0, 64]" -- "$B" dump-ir "$D/qwen3_moe" --tp 2 --rank -1
expect 2 "--summary and --tp do not go together" -- "$B" dump-ir "$D/qwen3_moe" --tp 2 --summary
expect 2 "unknown option --rank" -- "$B" run "$D/qwen3_moe" --prompt-ids 1 --max-new-tokens 1 --rank 0
# --ep-combine: the MoE combine as reduce_scatter + all_gather
for c in dump-ir run compile bench; do expect 0 "--ep-combine" -- "$B" "$c" --help; done
expect 0 '%l0.moe.routed.scatter : f32[T, 32] = reduce_scatter(%l0.moe.routed) {axis = 1, ranks = 2}' -- \
  "$B" dump-ir "$D/qwen3_moe" --tp 2 --rank 1 --ep-combine reduce-scatter
expect 2 "--ep-combine: 'x' is not all-reduce or reduce-scatter" -- "$B" dump-ir "$D/qwen3_moe" --tp 2 --ep-combine x
expect 2 "--ep-combine needs --tp or --ep" -- "$B" run "$D/qwen3_moe" --prompt-ids 1 --max-new-tokens 1 --ep-combine reduce-scatter
# bench of a split: the split checked, a plan's split against the one asked
# for and the context, all before a device is looked for; then the GPUs
# counted before anything compiles (tests/gpu_bench_tp.sh runs one)
expect 1 "ep 3 must divide tp 2" -- "$B" bench "$D/qwen3_moe" --tp 2 --ep 3
expect 2 "--tp: '65' is not an integer in [1, 64]" -- "$B" bench "$D/qwen3_moe" --tp 65
expect 2 "moec: --context 1024 is more than the model allows: at most 511" -- "$B" bench "$D/qwen3_moe" --tp 2 --context 1024
"$B" compile "$D/qwen3_moe" -o "$T/q_tp2.moec" --tp 2 --batch-sizes 1 >/dev/null 2>&1 && ok || bad "compile qwen3_moe --tp 2"
"$B" compile "$D/qwen3_moe" -o "$T/q.moec" --batch-sizes 1 >/dev/null 2>&1 && ok || bad "compile qwen3_moe"
expect 1 "plan $T/q_tp2.moec was compiled for tp 2, ep 1 (2 ranks); asked to run it with tp 1, ep 1: a plan runs with the split it was compiled for" -- \
  "$B" bench "$T/q_tp2.moec" --weights "$D/qwen3_moe" --tp 1
expect 1 "plan $T/q_tp2.moec was compiled for tp 2, ep 1 (2 ranks); asked to run it with tp 2, ep 2" -- \
  "$B" bench "$T/q_tp2.moec" --weights "$D/qwen3_moe" --tp 2 --ep 2
expect 1 "plan $T/q.moec was compiled unsharded (no --tp); asked to run it with tp 2: compile it with --tp 2" -- \
  "$B" bench "$T/q.moec" --weights "$D/qwen3_moe" --tp 2
expect 2 "moec: --context 1024 is more than the model allows: at most 511" -- \
  "$B" bench "$T/q_tp2.moec" --weights "$D/qwen3_moe" --context 1024
if ! command -v nvidia-smi >/dev/null 2>&1; then
  expect 1 "no CUDA device: no NVIDIA driver or GPU was found (" -- "$B" bench "$D/qwen3_moe" --tp 2
  expect 1 "no CUDA device: no NVIDIA driver or GPU was found (" -- "$B" bench "$D/qwen3_moe" --tp 1 --ep 1
  expect 1 "no CUDA device: no NVIDIA driver or GPU was found (" -- "$B" bench "$T/q_tp2.moec" --weights "$D/qwen3_moe"
fi
for m in deepseek_v2 qwen2_moe; do
  want=$("$B" run "$D/$m" --prompt-ids 3,1,4,1,5 --max-new-tokens 6 --ignore-eos --backend cpu)
  for split in "--tp 1" "--tp 2" "--tp 4" "--ep 2" "--tp 4 --ep 4" "--tp 4 --ep 2" \
    "--tp 2 --ep 2 --ep-combine reduce-scatter" "--ep 4 --ep-combine reduce-scatter"; do
    # shellcheck disable=SC2086
    got=$("$B" run "$D/$m" --prompt-ids 3,1,4,1,5 --max-new-tokens 6 --ignore-eos --backend cpu $split 2>&1)
    [ "$got" = "$want" ] && ok || bad "$m $split: run printed '$got', want '$want'"
  done
done
if ! command -v nvidia-smi >/dev/null 2>&1; then
  expect 1 "no CUDA device" -- "$B" run "$D/qwen3_moe" --prompt-ids 1 --max-new-tokens 1 --backend cuda --tp 2
fi
# the done lines agree but for their timings
untimed() { sed 's/,"ttft_ms":[^,}]*//; s/,"itl_ms":[^,}]*//'; }
printf '{"id":"a","prompt_ids":[3,1,4],"max_new_tokens":3,"ignore_eos":true}\n' >"$T/req"
want=$("$B" serve "$D/qwen2_moe" --backend cpu --stdin <"$T/req" 2>/dev/null | tail -1 | untimed)
got=$("$B" serve "$D/qwen2_moe" --backend cpu --stdin --tp 2 --ep 2 <"$T/req" 2>/dev/null | tail -1 | untimed)
[ -n "$want" ] && [ "$got" = "$want" ] && ok || bad "serve --tp 2 --ep 2 replied '$got', want '$want'"
expect 1 "ep 3 must divide tp 2" -- "$B" serve "$D/qwen2_moe" --backend cpu --stdin --tp 2 --ep 3

# Output that never reaches stdout (a full disk) is a failure, not exit 0.
if [ -w /dev/full ]; then
  out=$("$B" run "$D/qwen3_moe" --prompt-ids 1,2 --max-new-tokens 2 --backend cpu 2>&1 >/dev/full); rc=$?
  [ $rc = 1 ] && [ "$out" = "moec: cannot write stdout: No space left on device" ] && ok ||
    bad "run >/dev/full: exit $rc: $out"
  out=$("$B" --help 2>&1 >/dev/full); rc=$?
  [ $rc = 1 ] && [[ "$out" == "moec: cannot write stdout: "* ]] && ok || bad "--help >/dev/full: exit $rc: $out"
fi

# Bad invocations.
expect 1 "nonexistent/config.json" -- "$B" dump-ir "$T/nonexistent"
expect 2 "missing MODEL_DIR" -- "$B" dump-ir
expect 2 "unknown option --frob" -- "$B" dump-ir "$D/qwen3_moe" --frob
expect 2 "missing --prompt-ids" -- "$B" run "$D/qwen3_moe" --max-new-tokens 2
expect 2 "missing --max-new-tokens" -- "$B" run "$D/qwen3_moe" --prompt-ids 1,2
expect 2 "bad token id at 'x'" -- "$B" run "$D/qwen3_moe" --prompt-ids 1,x --max-new-tokens 2
expect 2 "bad token id at ''" -- "$B" run "$D/qwen3_moe" --prompt-ids 1, --max-new-tokens 2
expect 2 "token id 256 is outside the vocabulary (vocab_size 256)" -- "$B" run "$D/qwen3_moe" --prompt-ids 1,256 --max-new-tokens 2
expect 2 "--max-new-tokens: '0' is not an integer from 1 to 16777216" -- "$B" run "$D/qwen3_moe" --prompt-ids 1 --max-new-tokens 0
# past the bounds: the bound named, not a claim that the value is below 1
expect 2 "--max-new-tokens: '2147483648' is not an integer from 1 to 16777216" -- \
  "$B" run "$D/qwen3_moe" --prompt-ids 1 --max-new-tokens 2147483648
expect 2 "--max-seq-len: '67108865' is not an integer from 1 to 67108864" -- \
  "$B" run "$D/qwen3_moe" --prompt-ids 1 --max-new-tokens 1 --max-seq-len 67108865
expect 2 "--warmup: '16777217' is not an integer from 0 to 16777216" -- "$B" bench "$D/qwen3_moe" --warmup 16777217
expect 2 "--arch: '90' is not a GPU arch like sm_90" -- "$B" run "$D/qwen3_moe" --prompt-ids 1 --max-new-tokens 1 --arch 90
for f in --batch-sizes --context --steps --warmup --json --arch --weights --profile; do expect 0 "$f" -- "$B" bench --help; done
for f in --single-stream --eager; do expect 0 "$f" -- "$B" run --help; done
# bench of a plan file wants --weights; --weights wants a plan file
: >"$T/some.moec"
expect 2 "some.moec is a plan file: --weights MODEL_DIR" -- "$B" bench "$T/some.moec"
expect 2 "--weights goes with a plan file" -- "$B" bench "$D/qwen3_moe" --weights "$D/qwen3_moe"
# the stream and graph flags change nothing on the CPU: the same ids
expect 0 "$("$B" run "$D/qwen3_moe" --prompt-ids 1,2,3 --max-new-tokens 3 --backend cpu)" -- \
  "$B" run "$D/qwen3_moe" --prompt-ids 1,2,3 --max-new-tokens 3 --backend cpu --single-stream --eager
expect 2 "--batch-sizes: '0' is not 1 to 16 sizes >= 1" -- "$B" bench "$D/qwen3_moe" --batch-sizes 0
expect 2 "--steps: 'x' is not an integer from 1 to 16777216" -- "$B" bench "$D/qwen3_moe" --steps x
# bench checks its context before it looks for a device: the default fits
# the model (max_position_embeddings 512: context 511), a longer one names
# --context; make demo's sample model benches with the defaults.
expect 2 "moec: --context 1024 is more than the model allows: at most 511 (its max_position_embeddings 512, less the token each step decodes)" -- \
  "$B" bench "$D/qwen3_moe" --context 1024
expect 2 "moec: --context 512 is more than the model allows: at most 511" -- "$B" bench "$D/qwen3_moe" --context 512
"$MOEC_BUILD_DIR/moec-sample" "$S/samples/configs/deepseek_v3_tiny.json" "$T/sample" >/dev/null && ok || bad "moec-sample failed"
if ! command -v nvidia-smi >/dev/null 2>&1; then
  expect 1 "no CUDA device: no NVIDIA driver or GPU was found (" -- "$B" bench "$T/sample"
  expect 1 "no CUDA device: no NVIDIA driver or GPU was found (" -- "$B" bench "$D/qwen3_moe" --context 511
fi
expect 2 "--backend: 'tpu' is not cpu, cuda or auto" -- "$B" run "$D/qwen3_moe" --prompt-ids 1 --max-new-tokens 1 --backend tpu
expect 2 "--max-seq-len 2 is too short" -- "$B" run "$D/qwen3_moe" --prompt-ids 1,2 --max-new-tokens 4 --max-seq-len 2
# prompt + new tokens past the model's limit name the flag to change
expect 2 "moec: --max-seq-len 100000 exceeds the model's max_position_embeddings 512" -- \
  "$B" run "$D/qwen3_moe" --prompt-ids 1 --max-new-tokens 1 --max-seq-len 100000
expect 2 "moec: 2 prompt tokens and --max-new-tokens 100000 need 100001 positions, more than the model's max_position_embeddings 512: --max-new-tokens can be at most 511" -- \
  "$B" run "$D/qwen3_moe" --prompt-ids 1,2 --max-new-tokens 100000
expect 2 "--max-new-tokens 512 need 513 positions" -- "$B" run "$D/qwen3_moe" --prompt-ids 1,2 --max-new-tokens 512
n=$("$B" run "$D/qwen3_moe" --prompt-ids 1,2 --max-new-tokens 511 --ignore-eos --backend cpu | wc -w)
[ "$n" = 511 ] && ok || bad "--max-new-tokens 511 after 2 prompt tokens (512 positions) printed $n ids"
expect 2 "moec: the prompt's 513 tokens exceed the model's max_position_embeddings 512" -- \
  "$B" run "$D/qwen3_moe" --prompt-ids "$(seq -s, 513 | sed 's/[0-9]*/1/g')" --max-new-tokens 1
if ! command -v nvidia-smi >/dev/null 2>&1; then
  expect 1 "no CUDA device: no NVIDIA driver or GPU was found (" -- "$B" run "$D/qwen3_moe" --prompt-ids 1 --max-new-tokens 1 --backend cuda
fi
# Non-finite logits are an error naming the step and position, not ids:
# every weight NaN fails on the prompt; with token 59's embedding row NaN,
# [1,2] generates 59 and fails feeding it back.
NAN_MODEL=$MOEC_BUILD_DIR/tests/nan_model
"$NAN_MODEL" "$D/deepseek_v3" "$T/nan" && "$NAN_MODEL" "$D/deepseek_v3" "$T/nan59" model.embed_tokens.weight 59 &&
  ok || bad "nan_model failed"
expect 1 "moec: error (numeric error): " -- "$B" run "$T/nan" --prompt-ids 1,2,3 --max-new-tokens 3 --backend cpu
expect 1 ": step 0, position 0: the logits hold a NaN or an infinity (a NaN in the checkpoint, or an overflow)" -- \
  "$B" run "$T/nan" --prompt-ids 1,2,3 --max-new-tokens 3 --backend cpu
out=$("$B" run "$T/nan" --prompt-ids 1,2,3 --max-new-tokens 3 --backend cpu 2>/dev/null)
[ -z "$out" ] && ok || bad "a NaN model printed ids: $out"
expect 1 ": step 1, position 2: the logits hold a NaN or an infinity" -- \
  "$B" run "$T/nan59" --prompt-ids 1,2 --max-new-tokens 4 --ignore-eos --backend cpu
out=$("$B" run "$T/nan59" --prompt-ids 1,2 --max-new-tokens 4 --ignore-eos --backend cpu 2>/dev/null)
[ "$out" = 59 ] && ok || bad "NaN at token 59: printed '$out', want '59' (the last id before the error)"

# --logits-out: a path that cannot be written fails before the weights load
# (the model's weights missing here, so a late open would fail on them
# first); one of the files the run reads is refused, never emptied.
mkdir -p "$T/lo" && cp "$D/qwen3_moe/config.json" "$T/lo/"
expect 1 "moec: cannot write $T/nonexistent/l.bin: No such file or directory" -- \
  "$B" run "$T/lo" --prompt-ids 1 --max-new-tokens 1 --backend cpu --logits-out "$T/nonexistent/l.bin"
expect 0 "loads; a run that fails before row 0 leaves FILE as" -- "$B" run --help
# a run that fails before its first row leaves an existing file as it was
# and makes no new one
echo old >"$T/old.bin"
expect 1 "no *.safetensors in $T/lo" -- \
  "$B" run "$T/lo" --prompt-ids 1 --max-new-tokens 1 --backend cpu --logits-out "$T/old.bin"
expect 1 "no *.safetensors in $T/lo" -- \
  "$B" run "$T/lo" --prompt-ids 1 --max-new-tokens 1 --backend cpu --logits-out "$T/new.bin"
[ "$(cat "$T/old.bin")" = old ] && [ ! -e "$T/new.bin" ] && ok ||
  bad "a failed run changed $T/old.bin or made $T/new.bin"
cp "$D/qwen3_moe/model.safetensors" "$T/lo/"
expect 2 "moec: --logits-out $T/lo/../lo/model.safetensors is $T/lo/model.safetensors, which the run reads" -- \
  "$B" run "$T/lo" --prompt-ids 1 --max-new-tokens 1 --backend cpu --logits-out "$T/lo/../lo/model.safetensors"
expect 2 "moec: --logits-out $T/lo/config.json is $T/lo/config.json, which the run reads" -- \
  "$B" run "$D/qwen3_moe" --weights "$T/lo" --prompt-ids 1 --max-new-tokens 1 --backend cpu --logits-out "$T/lo/config.json"
cmp -s "$T/lo/model.safetensors" "$D/qwen3_moe/model.safetensors" && cmp -s "$T/lo/config.json" "$D/qwen3_moe/config.json" &&
  ok || bad "a refused --logits-out changed the checkpoint"

# A model directory whose weights are missing: the error names the tensor.
mkdir -p "$T/noweights" && cp "$D/qwen3_moe/config.json" "$T/noweights/"
expect 1 "no *.safetensors" -- "$B" run "$T/noweights" --prompt-ids 1 --max-new-tokens 1

# fp8 block-scaled checkpoints: fused where their scale blocks allow, run on
# the CPU, compiled for the GPU (whose kernels read the fp8 weights); the
# plan checks its checkpoint, scales included; moec-sample --fp8 writes one.
FP8=$D/deepseek_v3_fp8
expect 0 "weight %l0.attn.qkv_a_proj : f8e4m3[448, 320] = concat(0" -- "$B" dump-ir "$FP8" --after fuse_qkv_a
expect 0 "32 weights (69 checkpoint tensors)" -- "$B" dump-ir "$FP8" --summary
ids=$("$B" run "$FP8" --prompt-ids 0,64,128 --max-new-tokens 3 --backend cpu)
[ "$(echo "$ids" | wc -w)" = 3 ] && ok || bad "run of the fp8 model printed '$ids'"
expect 0 "moec compile: wrote $T/fp8.moec" -- "$B" compile "$FP8" -o "$T/fp8.moec" --batch-sizes 1,8
# split over ranks only along its 128 x 128 blocks: its 2 heads of 64 rows
# of q_b are refused at tp 2, naming the block a rank's box would cut
expect 1 "weight %l0.attn.q_b_proj is block-scaled fp8 (blocks of 128 x 128): rank 0's rows 0..64 of \"model.layers.0.self_attn.q_b_proj.weight\" (128 rows) end neither on a block boundary nor at the tensor's end (tp 2, ep 1)" -- \
  "$B" run "$FP8" --prompt-ids 1 --max-new-tokens 1 --backend cpu --tp 2
expect 1 "weight %l0.attn.q_b_proj is block-scaled fp8 (blocks of 128 x 128)" -- \
  "$B" compile "$FP8" -o "$T/fp8tp.moec" --tp 2
[ ! -e "$T/fp8tp.moec" ] && ok || bad "a refused fp8 split wrote a plan"
# a model whose heads and intermediates fill blocks splits: the same ids, the
# rank's boxes of codes and scales in its IR
F8TP=$D/deepseek_v3_fp8_tp
whole=$("$B" run "$F8TP" --prompt-ids 0,64,128 --max-new-tokens 4 --ignore-eos --backend cpu)
split=$("$B" run "$F8TP" --prompt-ids 0,64,128 --max-new-tokens 4 --ignore-eos --backend cpu --tp 2 --ep 2)
[ -n "$whole" ] && [ "$whole" = "$split" ] && ok || bad "fp8 at tp 2 ep 2 printed '$split', unsharded '$whole'"
expect 0 'weight %l0.attn.q_b_proj : f8e4m3[384, 256] = "model.layers.0.self_attn.q_b_proj.weight"[384:768, :], block_scale[128, 128] = "model.layers.0.self_attn.q_b_proj.weight_scale_inv"[3:6, :]' -- \
  "$B" dump-ir "$F8TP" --tp 2 --rank 1
[ "$(head -c 8 "$T/fp8.moec" 2>/dev/null)" = MOECPLAN ] && ok || bad "the fp8 compile wrote no plan"
expect 1 "plan $T/fp8.moec was compiled for another config" -- \
  "$B" run "$T/fp8.moec" --weights "$D/deepseek_v3" --prompt-ids 1 --max-new-tokens 1
SAMPLE=$MOEC_BUILD_DIR/moec-sample
qc() { python3 -c "import json,sys;print(json.load(open(sys.argv[1])).get('quantization_config'))" "$1"; }
expect 0 "--fp8" -- "$SAMPLE" --help
expect 0 "wrote 69 tensors" -- "$SAMPLE" --fp8 "$S/tests/data/configs/deepseek_v3_fp8.json" "$T/fp8s"
expect 0 "{'quant_method': 'fp8', 'fmt': 'e4m3', 'activation_scheme': 'dynamic', 'weight_block_size': [128, 128]}" -- qc "$T/fp8s/config.json"
expect 0 "weight %l1.moe.experts.down : f8e4m3[4, 320, 128]" -- "$B" dump-ir "$T/fp8s"
expect 0 "'modules_to_not_convert': ['lm_head', 'model.layers.1.mlp.gate', 'model.layers.0.self_attn.o_proj']" -- \
  bash -c "'$SAMPLE' --fp8 '$S/tests/data/configs/qwen3_moe_fp8.json' '$T/fp8q' && python3 -c \"import json;print(json.load(open('$T/fp8q/config.json'))['quantization_config'])\""
expect 0 "wrote 41 tensors" -- "$SAMPLE" "$S/tests/data/configs/deepseek_v3_fp8.json" "$T/bf16s"
expect 0 "None" -- qc "$T/bf16s/config.json"
# config and checkpoint that disagree on quantization: the tensor is named
cp "$T/fp8s/config.json" "$T/bf16s/config.json"
expect 1 "tensor 'model.layers.0.self_attn.q_a_proj.weight' in $T/bf16s/model.safetensors has dtype BF16, expected F8_E4M3" -- \
  "$B" run "$T/bf16s" --prompt-ids 1 --max-new-tokens 1 --backend cpu
cp "$S/tests/data/configs/deepseek_v3_fp8.json" "$T/fp8s/config.json"
expect 1 "has dtype F8_E4M3, expected BF16 (an fp8 tensor, but the config does not quantize this weight" -- \
  "$B" run "$T/fp8s" --prompt-ids 1 --max-new-tokens 1 --backend cpu

finish test_cli
