#!/usr/bin/env bash
# test_valgrind.sh — `moec run`, `moec dump-ir` and `moec serve --stdin` of
# tiny models (DeepSeek-V3.2's sparse attention and fp8 split over ranks among
# them) under valgrind, their error paths (NaN logits included) too:
# no leak, no invalid access. Skips (loudly) without valgrind.
set -u
B=${MOEC_BUILD_DIR:?}/moec
D=${MOEC_SOURCE_DIR:?}/tests/data
if ! command -v valgrind >/dev/null; then
  echo "SKIP: valgrind is not installed (run scripts/install_deps.sh)"; exit 0
fi
fail=0 runs=0
# run RC CMD...: CMD exits RC under valgrind with no error and no leak.
run() {
  local want=$1; shift
  runs=$((runs + 1))
  valgrind -q --leak-check=full --show-leak-kinds=all --errors-for-leak-kinds=all \
    --error-exitcode=99 "$@" >/dev/null 2>"$T/vg"
  local rc=$?
  if [ "$rc" = "$want" ]; then
    echo "clean: $*"
  else
    echo "FAIL: valgrind exit $rc (want $want): $*"; cat "$T/vg"; fail=$((fail + 1))
  fi
}
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
run 0 "$B" run "$D/deepseek_v2" --prompt-ids 0,17,42 --max-new-tokens 3 --ignore-eos --logits-out "$T/l.bin"
run 0 "$B" run "$D/qwen2_moe" --prompt-ids 11,95 --max-new-tokens 2 --ignore-eos
run 0 "$B" dump-ir "$D/deepseek_v3"
run 2 "$B" run "$D/qwen3_moe" --prompt-ids 1,999 --max-new-tokens 1
run 2 "$B" run "$D/qwen3_moe" --prompt-ids 1 --max-new-tokens 1 --max-seq-len 100000
# Non-finite logits (token 59's embedding row NaN): [1,2] generates 59, then
# fails; the service fails that request, a sampled one with 59 in its prompt
# and one whose repetition penalty overflows, and finishes the other.
"${MOEC_BUILD_DIR:?}/tests/nan_model" "$D/deepseek_v3" "$T/nan59" model.embed_tokens.weight 59
run 1 "$B" run "$T/nan59" --prompt-ids 1,2 --max-new-tokens 3 --ignore-eos --backend cpu
printf '%s\n' '{"id":"nan","prompt_ids":[1,2],"max_new_tokens":3,"ignore_eos":true}' \
  '{"id":"ok","prompt_ids":[3,250,7],"max_new_tokens":3,"ignore_eos":true}' \
  '{"id":"s","prompt_ids":[1,59],"max_new_tokens":2,"temperature":0.8,"logprobs":true}' \
  '{"id":"pen","prompt_ids":[3,250,7,11,40,90,120,200],"max_new_tokens":2,"repetition_penalty":1e-45}' \
  >"$T/nan-requests"
run 0 "$B" serve "$T/nan59" --stdin --backend cpu <"$T/nan-requests"
# The service: requests served together (one in two prefill chunks), one
# waiting for a sequence, one sampled with log probabilities, a bad one, a
# cancel line, a stats line, a line cut off by the end of input. (Many
# connections, cancels and disconnects: test_serve_load.sh.)
{
  echo '{"id":"a","prompt_ids":[0,17,42,99,5,200,31],"max_new_tokens":3,"ignore_eos":true}'
  echo "{\"id\":2,\"prompt_ids\":[$(seq -s, 1 70)],\"max_new_tokens\":2}"
  echo '{"id":"wait","prompt_ids":[1],"max_new_tokens":1}'
  echo '{"id":"s","prompt_ids":[0,17,42,99,5,200],"max_new_tokens":4,"temperature":1.1,"top_p":0.9,"seed":5,"logprobs":true,"top_logprobs":2,"repetition_penalty":1.2}'
  echo '{"id":"bad","prompt_ids":[1,"x"],"max_new_tokens":1}'
  echo '{"id":"a","cancel":true}'
  echo '{"stats":true}'
  echo 'not json'
  printf '%s' '{"id":"cut","prompt_ids":[1],"max_new_tokens":1'
} >"$T/requests"
run 0 "$B" serve "$D/deepseek_v2" --stdin --backend cpu --max-seqs 2 <"$T/requests"
# fp8: dequantizing loads, the fused IR, a checkpoint missing a scale
run 0 "$B" run "$D/deepseek_v3_fp8" --prompt-ids 0,64,128 --max-new-tokens 2 --ignore-eos --backend cpu
run 0 "$B" dump-ir "$D/qwen3_moe_fp8" --after all -o "$T/passes"
mkdir -p "$T/noscale" && cp "$D/qwen3_moe_fp8/config.json" "$T/noscale/" &&
  python3 -c "import json,struct,sys
d=open(sys.argv[1],'rb').read(); n=struct.unpack('<Q',d[:8])[0]; h=json.loads(d[8:8+n])
h.pop('model.layers.1.mlp.experts.3.up_proj.weight_scale_inv')
t=json.dumps(h).encode(); t+=b' '*(-len(t)%8)
open(sys.argv[2],'wb').write(struct.pack('<Q',len(t))+t+d[8+n:])" "$D/qwen3_moe_fp8/model.safetensors" "$T/noscale/model.safetensors"
run 1 "$B" run "$T/noscale" --prompt-ids 1 --max-new-tokens 1 --backend cpu
# fp8 split over ranks: each rank's boxes of codes and scales; a split that
# would cut a block refused
run 0 "$B" run "$D/qwen3_moe_fp8_tp" --prompt-ids 5,101,33 --max-new-tokens 2 --ignore-eos \
  --backend cpu --tp 4 --ep 2
run 1 "$B" run "$D/deepseek_v3_fp8_tp" --prompt-ids 1 --max-new-tokens 1 --backend cpu --tp 4
# DeepSeek-V3.2: past index_topk (8), so the indexer selects; every pass
run 0 "$B" run "$D/deepseek_v32" --prompt-ids 0,64,128,7,19,222,45,8,91,33,150,201 \
  --max-new-tokens 3 --ignore-eos --backend cpu
run 0 "$B" dump-ir "$D/deepseek_v32" --after all -o "$T/v32passes"
echo "test_valgrind: $((runs - fail)) passed, $fail failed"
[ "$fail" = 0 ]
