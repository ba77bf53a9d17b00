#!/usr/bin/env bash
# test_fuzz_tokenizer.sh — runs the libFuzzer target fuzz_tokenizer (the
# tokenizer's loader and codec, runtime/tokenizer*.c, under ASan and UBSan)
# for a bounded time (tests/fuzz/run.sh) on a seed corpus: each small
# tokenizer of tests/data/tokenizers (tokenizer.json, then its
# tokenizer_config.json, a special_tokens_map.json and an added_tokens.json
# that agree with it, and a text, cut at "--8<--" lines as the target
# reads them), with a dictionary of every key the files use and the added
# tokens' texts. Fails if the fuzzer reports a crash, a sanitizer error, a
# leak, a timeout, or a stream that disagrees with the decode; the input
# that did it is kept in $MOEC_BUILD_DIR/fuzz-artifacts/. Without clang the
# target is not built and the test says SKIP.
set -u
. "$(dirname "$0")/fuzz/run.sh"
fuzz_begin fuzz_tokenizer
python3 - "$src/tests/data/tokenizers" "$work/corpus" "$work/dict" <<'PY' || exit 1
import json, os, sys
root, corpus, dict_path = sys.argv[1:]
cut, keys, n = "\n--8<--\n", set(), 0
for name in sorted(os.listdir(root)):
    path = os.path.join(root, name, "tokenizer.json")
    if not os.path.isfile(path):
        continue
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if len(text) > 200_000:
        continue
    tj = json.loads(text)
    cfg_path = os.path.join(root, name, "tokenizer_config.json")
    cfg = open(cfg_path, encoding="utf-8").read() if os.path.isfile(cfg_path) else ""
    added = [a["content"] for a in tj.get("added_tokens") or []]
    side = json.dumps({"additional_special_tokens": added[:1]}) if added else ""
    added_json = json.dumps({a["content"]: a["id"] for a in tj.get("added_tokens") or []})
    sample = "Hello, world! 123 " + " ".join(added) + " caf\u00e9 \u4f60\u597d"
    with open(os.path.join(corpus, f"seed{n}"), "w", encoding="utf-8") as f:
        f.write(cut.join([text, cfg, side, added_json, sample]))
    n += 1
    def walk(v):
        if isinstance(v, dict):
            for k, x in v.items():
                keys.add(k)
                walk(x)
        elif isinstance(v, list):
            for x in v:
                walk(x)
    walk(tj)
    if cfg:
        walk(json.loads(cfg))
    keys.update(added)
if n < 5:
    sys.exit(f"only {n} seed tokenizers in {root}")
keys.update(["added_tokens_decoder", "special_tokens_map", "version", "1.0", "null", "true",
             "false", cut.strip("\n")])
def quoted(k):  # libFuzzer's dictionary: printable ASCII, else \xNN
    return '"' + "".join(chr(b) if 32 <= b < 127 and b not in (34, 92) else "\\x%02X" % b
                         for b in k.encode("utf-8")) + '"'
with open(dict_path, "w", encoding="ascii") as f:
    for k in sorted(keys):
        if k and len(k) <= 64:
            f.write(quoted(k) + "\n")
PY
fuzz_run -max_len=262144 -dict="$work/dict"
