#!/usr/bin/env bash
# test_tokenizer_cli.sh — `moec tokenize` and `moec run --prompt` as a user
# meets them: encodings and decodings of the fixtures match the goldens of
# Hugging Face tokenizers (tests/data/tokenizers/goldens.json), run --prompt
# prints the text of the ids run --prompt-ids prints, and every bad
# invocation fails with its exit code and message.
set -u
B=${MOEC_BUILD_DIR:?}/moec
S=${MOEC_SOURCE_DIR:?}
D=$S/tests/data/tokenizers
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
# shellcheck source=tests/lib.sh
source "$S/tests/lib.sh"


for f in --decode --no-special-tokens --skip-special-tokens --help; do expect 0 "$f" -- "$B" tokenize --help; done
expect 0 "tokenize MODEL_DIR" -- "$B" --help
expect 0 "--prompt TEXT" -- "$B" run --help

# Every golden of two fixtures through the command line: text bytes on
# stdin to ids, ids to text bytes.
if out=$(python3 - "$B" "$D" <<'PY'
import json, subprocess, sys
moec, d = sys.argv[1], sys.argv[2]
goldens = json.load(open(d + "/goldens.json"))
g, texts = goldens["tokenizers"], goldens["texts"]
bad = n = 0
for name in ("qwen2", "deepseek_v3"):
    for c in g[name]["encode"]:
        args = [moec, "tokenize", d + "/" + name] + ([] if c["add_special"] else ["--no-special-tokens"])
        r = subprocess.run(args, input=bytes.fromhex(texts[c["text"]]), capture_output=True)
        n += 1
        if r.returncode or r.stdout.decode() != ",".join(map(str, c["ids"])) + "\n":
            bad += 1
            print("encode %s %s: got %r" % (name, texts[c["text"]], r.stdout + r.stderr))
    for c in g[name]["decode"]:
        args = [moec, "tokenize", d + "/" + name, "--decode"] + (["--skip-special-tokens"] if c["skip_special"] else [])
        r = subprocess.run(args, input=" ".join(map(str, c["ids"])).encode(), capture_output=True)
        n += 1
        if r.returncode or r.stdout != bytes.fromhex(c["text"]):
            bad += 1
            print("decode %s %s: got %r" % (name, c["ids"][:20], r.stdout + r.stderr))
print("%d of %d goldens through the CLI differ" % (bad, n))
sys.exit(1 if bad or n < 800 else 0)
PY
); then ok; else bad "$out"; fi

# The BOS of the post-processor's template, and nothing else, with the special tokens.
[ "$(printf 'Hi' | "$B" tokenize "$D/deepseek_v3" | cut -d, -f1)" = 0 ] && ok || bad "deepseek_v3: no BOS first"
[ "$(printf '' | "$B" tokenize "$D/qwen2")" = "" ] && ok || bad "qwen2: empty text gave ids"
[ "$(echo '701,39,702' | "$B" tokenize "$D/qwen2" --decode --skip-special-tokens)" = "H" ] && ok ||
  bad "--skip-special-tokens kept <|im_start|>"

# ids or text that never reach stdout (a full disk): exit 1, said
if [ -w /dev/full ]; then
  out=$(printf 'Hi' | "$B" tokenize "$D/qwen2" 2>&1 >/dev/full); rc=$?
  [ $rc = 1 ] && [ "$out" = "moec: cannot write stdout: No space left on device" ] && ok ||
    bad "tokenize >/dev/full: exit $rc: $out"
  out=$(echo 39 | "$B" tokenize "$D/qwen2" --decode 2>&1 >/dev/full); rc=$?
  [ $rc = 1 ] && [ "$out" = "moec: cannot write stdout: No space left on device" ] && ok ||
    bad "tokenize --decode >/dev/full: exit $rc: $out"
fi

# Bad invocations.
expect 2 "missing MODEL_DIR" -- "$B" tokenize
expect 2 "unknown option --bogus" -- "$B" tokenize "$D/qwen2" --bogus
expect 2 "unexpected argument extra" -- "$B" tokenize "$D/qwen2" extra
expect 2 "--skip-special-tokens is for --decode" -- "$B" tokenize "$D/qwen2" --skip-special-tokens
expect 2 "--no-special-tokens is for encoding, not --decode" -- "$B" tokenize "$D/qwen2" --decode --no-special-tokens
expect 1 "cannot open $T/none/tokenizer.json: No such file or directory" -- "$B" tokenize "$T/none"
mkdir -p "$T/unigram"
echo '{"model":{"type":"Unigram","vocab":[["a",0.0]]},"decoder":{"type":"ByteLevel"}}' >"$T/unigram/tokenizer.json"
expect 1 "model.type: 'Unigram' is not supported (moec supports BPE)" -- "$B" tokenize "$T/unigram"
out=$(echo '1,x' | "$B" tokenize "$D/qwen2" --decode 2>&1); rc=$?
[ $rc = 2 ] && [[ "$out" == *"bad token id at 'x'"* ]] && ok || bad "decode of 1,x: exit $rc: $out"
out=$(printf '1\0002' | "$B" tokenize "$D/qwen2" --decode 2>&1); rc=$?
[ $rc = 2 ] && [ "$out" = "moec: tokenize --decode: a NUL byte in the ids (byte 1)" ] && ok ||
  bad "decode of 1 NUL 2: exit $rc: $out"
out=$(echo '1 -3' | "$B" tokenize "$D/qwen2" --decode 2>&1); rc=$?
[ $rc = 1 ] && [[ "$out" == *"cannot decode the negative id -3"* ]] && ok || bad "decode of -3: exit $rc: $out"

# run --prompt on a tiny model with a one-token-per-byte tokenizer (ids
# 0-255, its vocab): the text it prints is the decode of the ids that
# run --prompt-ids prints for the same prompt.
M=$T/model
mkdir -p "$M" && cp "$S/tests/data/qwen3_moe/"* "$M/" && cp "$D/bytes256/tokenizer.json" "$M/"
ids=$(printf 'hi there' | "$B" tokenize "$M")
[ "$ids" = "104,105,32,116,104,101,114,101" ] && ok || bad "bytes256 encodes 'hi there' as $ids"
want=$("$B" run "$M" --prompt-ids "$ids" --max-new-tokens 5 --ignore-eos --backend cpu | tr ' ' ',' |
  "$B" tokenize "$M" --decode --skip-special-tokens)
got=$("$B" run "$M" --prompt "hi there" --max-new-tokens 5 --ignore-eos --backend cpu); rc=$?
[ $rc = 0 ] && [ "$got" = "$want" ] && [ -n "$got" ] && ok || bad "run --prompt printed '$got' (exit $rc), want '$want'"
expect 2 "--prompt-ids, --prompt and --chat are exclusive" -- "$B" run "$M" --prompt hi --prompt-ids 1 --max-new-tokens 1
expect 2 "missing --prompt-ids, --prompt or --chat" -- "$B" run "$M" --max-new-tokens 1
# a tokenizer whose ids pass the model's vocabulary: the flag named
mkdir -p "$T/wide" && cp "$S/tests/data/qwen3_moe/"* "$D/qwen2/tokenizer.json" "$T/wide/"
expect 2 "moec: --prompt: the tokenizer's id 319 is outside the model's vocabulary (vocab_size 256)" -- \
  "$B" run "$T/wide" --prompt "world" --max-new-tokens 1 --backend cpu
expect 2 "--prompt: the text encodes to no tokens" -- "$B" run "$M" --prompt "" --max-new-tokens 1
expect 1 "qwen3_moe/tokenizer.json: No such file or directory" -- \
  "$B" run "$S/tests/data/qwen3_moe" --prompt hi --max-new-tokens 1 --backend cpu

finish test_tokenizer_cli
