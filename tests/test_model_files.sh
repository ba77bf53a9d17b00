#!/usr/bin/env bash
# test_model_files.sh — the files moec reads from a model folder, as a user
# meets them: a FIFO (or a directory) in place of config.json,
# generation_config.json, the safetensors index or a plan is refused at once
# by name, never waited on; a key written twice and an integer out of range
# in config.json are refused with the file's own value; generation_config.json's
# eos ids (a list) stop `moec run` and `moec serve` at any of them; moec-sample
# names the bad input and leaves nothing behind, says the size and refuses
# what the disk cannot hold, and a stopped run leaves no partial model.
set -u
B=${MOEC_BUILD_DIR:?}
S=${MOEC_SOURCE_DIR:?}
D=$S/tests/data
T=$(mktemp -d)
BG_PID=
cleanup() {
  [ -n "$BG_PID" ] && kill -KILL "$BG_PID" 2>/dev/null
  rm -rf "$T"
}
trap cleanup EXIT
# shellcheck source=tests/lib.sh
source "$S/tests/lib.sh"
EXPECT_TIMEOUT=20 # a command that waits on a FIFO times out


# model NAME DIR: DIR holds a copy of tests/data/NAME's config.json and a
# link to its weights.
model() {
  mkdir -p "$2" && cp "$D/$1/config.json" "$2/" && ln -s "$D/$1/model.safetensors" "$2/"
}

RUN=(--prompt-ids 1,2 --max-new-tokens 1 --backend cpu)

# ---- FIFOs and directories in place of files --------------------------------
mkdir "$T/f1" && mkfifo "$T/f1/config.json" && ln -s "$D/qwen3_moe/model.safetensors" "$T/f1/"
expect 1 "$T/f1/config.json is not a regular file (it is a FIFO)" -- "$B/moec" run "$T/f1" "${RUN[@]}"
expect 1 "$T/f1/config.json is not a regular file (it is a FIFO)" -- "$B/moec" dump-ir "$T/f1"
mkdir "$T/f2" && mkdir "$T/f2/config.json"
expect 1 "$T/f2/config.json is not a regular file (it is a directory)" -- "$B/moec" dump-ir "$T/f2"
model qwen3_moe "$T/f3" && mkfifo "$T/f3/generation_config.json"
expect 1 "$T/f3/generation_config.json is not a regular file (it is a FIFO)" -- "$B/moec" run "$T/f3" "${RUN[@]}"
model qwen3_moe "$T/f4" && rm "$T/f4/model.safetensors" && mkfifo "$T/f4/model.safetensors.index.json"
expect 1 "$T/f4/model.safetensors.index.json is not a regular file (it is a FIFO)" -- "$B/moec" run "$T/f4" "${RUN[@]}"
model qwen3_moe "$T/f5" && rm "$T/f5/model.safetensors" && mkfifo "$T/f5/model.safetensors"
expect 1 "$T/f5/model.safetensors is not a regular file (it is a FIFO)" -- "$B/moec" run "$T/f5" "${RUN[@]}"
# moec compile hashes the config: a FIFO there is refused too (before any NVRTC work)
model qwen3_moe "$T/f6" && mkfifo "$T/f6/generation_config.json"
expect 1 "generation_config.json is not a regular file (it is a FIFO)" -- "$B/moec" compile "$T/f6" -o "$T/f6.moec"

# ---- config.json as Python reads it -------------------------------------------
mkdir "$T/dup"
sed 's/^{/{\n  "hidden_size": 32,/' "$D/qwen3_moe/config.json" >"$T/dup/config.json"
expect 1 "$T/dup/config.json: key \"hidden_size\" appears twice" -- "$B/moec" dump-ir "$T/dup"
mkdir "$T/big"
sed 's/"hidden_size": *[0-9]*/"hidden_size": 1e30/' "$D/qwen3_moe/config.json" >"$T/big/config.json"
expect 1 "$T/big/config.json: field \"hidden_size\" = 1e+30 is out of range (must be in [1, 16777216])" -- \
  "$B/moec" dump-ir "$T/big"
model qwen3_moe "$T/eosbad"
echo '{"eos_token_id": [1, 256]}' >"$T/eosbad/generation_config.json"
expect 1 "$T/eosbad/generation_config.json: field \"eos_token_id[1]\" = 256 is not a token id (vocab_size is 256)" -- \
  "$B/moec" run "$T/eosbad" "${RUN[@]}"

# ---- every eos id stops generation ----------------------------------------------
# deepseek_v2 continues [116] with 64, 1, ... (eos_token_id 1 in config.json).
# generation_config.json's list replaces it: generation runs past 1 and stops
# at the second id of the list, the first id not yet generated.
m=deepseek_v2
read -r -a seq <<<"$("$B/moec" run "$D/$m" --prompt-ids 116 --max-new-tokens 8 --ignore-eos --backend cpu)"
[ "${seq[0]:-}" = 64 ] && [ "${seq[1]:-}" = 1 ] && ok || bad "[116] no longer continues 64, 1: ${seq[*]}"
k=2
while [ "$k" -lt 8 ] && [[ " ${seq[*]:0:$k} " == *" ${seq[$k]} "* ]]; do k=$((k + 1)); done
stop=${seq[$k]}
want="${seq[*]:0:$((k + 1))}"
other=255
[[ " ${seq[*]} " == *" $other "* ]] && other=254
model $m "$T/eos"
echo "{\"eos_token_id\": [$other, $stop]}" >"$T/eos/generation_config.json"
out=$("$B/moec" run "$T/eos" --prompt-ids 116 --max-new-tokens 8 --backend cpu 2>&1)
[ "$out" = "$want" ] && ok || bad "moec run with eos [$other, $stop]: '$out', want '$want'"
echo '{"id":"e","prompt_ids":[116],"max_new_tokens":8}' |
  "$B/moec" serve "$T/eos" --stdin --backend cpu >"$T/serve.out" 2>"$T/serve.err"
grep -qF "{\"id\":\"e\",\"done\":true,\"tokens\":[${want// /,}],\"finish\":\"eos\"," "$T/serve.out" && ok ||
  bad "moec serve with eos [$other, $stop]: $(cat "$T/serve.out" "$T/serve.err")"
grep -qF "eos $other, $stop;" "$T/serve.err" && ok || bad "moec serve startup line: $(cat "$T/serve.err")"
# without the generation config, config.json's eos 1 stops it after 64, 1
rm "$T/eos/generation_config.json"
out=$("$B/moec" run "$T/eos" --prompt-ids 116 --max-new-tokens 8 --backend cpu 2>&1)
[ "$out" = "64 1" ] && ok || bad "moec run with config.json's eos: '$out', want '64 1'"

# ---- moec-sample ------------------------------------------------------------------
SAMPLE=$B/moec-sample
cfg=$S/samples/configs/qwen3_moe_tiny.json
# A bad config: the input is named, nothing is created.
sed 's/^{/{\n  "hidden_size": 32,/' "$cfg" >"$T/dup.json"
expect 1 "$T/dup.json: key \"hidden_size\" appears twice" -- "$SAMPLE" "$T/dup.json" "$T/s1"
[ ! -e "$T/s1" ] && ok || bad "moec-sample left $T/s1 after a bad config"
mkfifo "$T/fifo.json"
expect 1 "$T/fifo.json is not a regular file (it is a FIFO)" -- "$SAMPLE" "$T/fifo.json" "$T/s2"
[ ! -e "$T/s2" ] && ok || bad "moec-sample left $T/s2 after a FIFO config"
# A model larger than any disk: its size said, refused before a byte is written.
python3 - "$cfg" "$T/huge.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c.update(vocab_size=1 << 20, hidden_size=1 << 16, num_experts=128, moe_intermediate_size=1 << 16,
         num_hidden_layers=32)
json.dump(c, open(sys.argv[2], "w"))
PY
expect 1 "moec-sample: writing 12196 tensors, 102.39 TB, to $T/s3/model.safetensors" -- "$SAMPLE" "$T/huge.json" "$T/s3"
expect 1 "free, but the model needs 102.39 TB" -- "$SAMPLE" "$T/huge.json" "$T/s3"
[ ! -e "$T/s3" ] && ok || bad "moec-sample left $T/s3 after refusing the size"
mkdir "$T/s4"
expect 1 "free, but the model needs 102.39 TB" -- "$SAMPLE" "$T/huge.json" "$T/s4"
[ -d "$T/s4" ] && [ -z "$(ls -A "$T/s4")" ] && ok || bad "moec-sample: $T/s4 (made before) is gone or not empty"
# A good run: the size said, the two files and nothing else.
expect 0 "moec-sample: writing 79 tensors, 388.6 kB, to $T/s5/model.safetensors" -- "$SAMPLE" "$cfg" "$T/s5"
[ "$(ls -A "$T/s5" | tr '\n' ' ')" = "config.json model.safetensors " ] && ok ||
  bad "moec-sample wrote $(ls -A "$T/s5")"
cmp -s "$cfg" "$T/s5/config.json" && ok || bad "moec-sample: config.json is not a copy of the input"
expect 0 "" -- "$B/moec" run "$T/s5" "${RUN[@]}"
# an OUT_DIR that is a file is named, not a temporary file in it
: >"$T/afile"
expect 1 "moec-sample: OUT_DIR $T/afile is not a directory" -- "$SAMPLE" "$cfg" "$T/afile"
[ ! -s "$T/afile" ] && ok || bad "moec-sample wrote into the file $T/afile"
# --seed takes 0 to 2^64 - 1 in decimal: an empty, negative or larger value
# is refused, not read as another seed
for v in "" -1 18446744073709551616 5x " 5"; do
  expect 2 "moec-sample: --seed: '$v' is not an integer from 0 to 18446744073709551615" -- \
    "$SAMPLE" "$cfg" "$T/seed" --seed "$v"
done
expect 2 "moec-sample: --seed needs a value" -- "$SAMPLE" "$cfg" "$T/seed" --seed
[ ! -e "$T/seed" ] && ok || bad "a refused --seed made $T/seed"
"$SAMPLE" "$cfg" "$T/seed0" --seed 0 2>/dev/null && "$SAMPLE" "$cfg" "$T/seedmax" --seed 18446744073709551615 2>/dev/null &&
  ! cmp -s "$T/seed0/model.safetensors" "$T/seedmax/model.safetensors" && ok || bad "--seed 0 and 2^64 - 1 wrote the same weights"

# A stopped run leaves no partial model.safetensors: SIGTERM removes the
# temporary file and the folder; SIGKILL cannot, but the model is never
# there under its real name. (A 635 MB model: seconds to write.)
python3 - "$cfg" "$T/mid.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c.update(vocab_size=256, hidden_size=2048, num_experts=8, moe_intermediate_size=2048,
         num_hidden_layers=4, intermediate_size=2048)
json.dump(c, open(sys.argv[2], "w"))
PY
# stop_while_writing SIGNAL DIR [OPTION...]: starts moec-sample into DIR and
# sends SIGNAL once its temporary file exists (a failure when it never does,
# or when the run ends before the signal).
stop_while_writing() {
  "$SAMPLE" "$T/mid.json" "$2" "${@:3}" 2>"$T/stop.err" &
  BG_PID=$!
  local i seen=0 rc
  for i in $(seq 200); do
    compgen -G "$2/model.safetensors.tmp.*" >/dev/null && seen=1 && break
    sleep 0.05
  done
  kill -"$1" "$BG_PID"
  wait "$BG_PID" 2>/dev/null
  rc=$?
  BG_PID=
  [ "$seen" = 1 ] && [ "$rc" -gt 128 ] && ok ||
    bad "moec-sample stopped by SIG$1: temporary file seen $seen, exit $rc ($(cat "$T/stop.err"))"
}
stop_while_writing TERM "$T/s6"
[ ! -e "$T/s6" ] && ok || bad "SIGTERM left $(ls -A "$T/s6" 2>&1) ($(cat "$T/stop.err"))"
# --fp8: the config is CONFIG_JSON's own text with the quantization_config
# last (printed again, attention_dropout 0.0 became 0, which transformers
# refuses for a float field)
"$SAMPLE" "$cfg" "$T/f8" --fp8 >/dev/null 2>&1 &&
  grep -qF '"attention_dropout": 0.0,' "$T/f8/config.json" &&
  [ "$(tail -2 "$T/f8/config.json")" = '  "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
}' ] && ok || bad "--fp8 config: $(tail -3 "$T/f8/config.json" 2>&1)"
# --fp8: the quantized config it writes under $TMPDIR goes too; SIGHUP
mkdir -p "$T/tmpdir"
TMPDIR=$T/tmpdir stop_while_writing HUP "$T/s8" --fp8
[ ! -e "$T/s8" ] && [ -z "$(ls -A "$T/tmpdir")" ] && ok ||
  bad "SIGHUP of --fp8 left $(ls -A "$T/s8" "$T/tmpdir" 2>&1)"
stop_while_writing KILL "$T/s7"
[ -e "$T/s7" ] && [ ! -e "$T/s7/model.safetensors" ] && [ ! -e "$T/s7/config.json" ] && ok ||
  bad "SIGKILL left $(ls -A "$T/s7" 2>&1) ($(cat "$T/stop.err"))"

# ---- routers saved in F32 (transformers 5 keeps DeepSeek's mlp.gate and
# V3.2's indexer.weights_proj in F32) -----------------------------------------
# widen32 SRC DST PERTURB: DST/model.safetensors is SRC's with every BF16
# tensor of those modules written as F32 (the same values); PERTURB=1 also
# sets the low bit of the first such tensor's first value (no bf16 value).
widen32() {
  mkdir -p "$2" && cp "$D/$1/config.json" "$2/" &&
    python3 - "$D/$1/model.safetensors" "$2/model.safetensors" "$3" <<'PY'
import json, struct, sys
src, dst, perturb = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
raw = open(src, "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
head = json.loads(raw[8:8 + n])
body = raw[8 + n:]
out, blobs, off, first = {}, [], 0, True
for name, t in head.items():
    if name == "__metadata__":
        out[name] = t
        continue
    a, b = t["data_offsets"]
    data = body[a:b]
    if t["dtype"] == "BF16" and (name.endswith(".mlp.gate.weight") or
                                 name.endswith(".indexer.weights_proj.weight")):
        h = struct.unpack("<%dH" % (len(data) // 2), data)
        w = [x << 16 for x in h]
        if perturb and first:
            w[0] |= 1
            first = False
        data = struct.pack("<%dI" % len(w), *w)
        t = dict(t, dtype="F32")
    out[name] = dict(t, data_offsets=[off, off + len(data)])
    blobs.append(data)
    off += len(data)
hj = json.dumps(out).encode()
hj += b" " * (-len(hj) % 8)
with open(dst, "wb") as f:
    f.write(struct.pack("<Q", len(hj)) + hj + b"".join(blobs))
PY
}
for m in deepseek_v3 deepseek_v32; do
  model "$m" "$T/$m-bf" && widen32 "$m" "$T/$m-f32" 0 && widen32 "$m" "$T/$m-f32x" 1 ||
    bad "writing $m's F32 routers"
  "$B/moec" run "$T/$m-bf" "${RUN[@]}" --max-new-tokens 2 --logits-out "$T/$m-bf.bin" \
    >"$T/$m-bf.out" 2>&1 &&
    "$B/moec" run "$T/$m-f32" "${RUN[@]}" --max-new-tokens 2 --logits-out "$T/$m-f32.bin" \
      >"$T/$m-f32.out" 2>&1 && cmp -s "$T/$m-bf.bin" "$T/$m-f32.bin" &&
    cmp -s "$T/$m-bf.out" "$T/$m-f32.out" && ok ||
    bad "$m with F32 routers: not the bf16 run's logits ($(tail -2 "$T/$m-f32.out"))"
  expect 1 "(F32) holds values bf16 does not represent (element 0 of the weight" -- \
    "$B/moec" run "$T/$m-f32x" "${RUN[@]}"
done

finish test_model_files
