#!/usr/bin/env python3
"""make_tokenizers.py — builds the tokenizer fixtures of tests/test_tokenizer.c.

Trains small byte-level BPE tokenizers with the Python `tokenizers` package
(pip install tokenizers) on tests/data/tokenizers/corpus.txt (nothing is
downloaded), writes each one's tokenizer.json (+ tokenizer_config.json) in
the pre-tokenizer, normalizer, post-processor and decoder configuration of a
published model family, and writes goldens.json: what `tokenizers` itself
encodes every test text to and decodes every id list to. moec's tokenizer
(runtime/tokenizer*.c) must reproduce the goldens exactly.

  python3 scripts/make_tokenizers.py          # rewrites tests/data/tokenizers/

The fixtures:
  qwen2        Qwen2 / Qwen2.5 / Qwen3: NFC, the Split regex, ByteLevel without
               regex, ByteLevel post-processor and decoder, <|im_start|> and
               friends after the vocab; merges as [a, b] lists.
  deepseek_v3  DeepSeek-V3 / R1 / V3.2: three Split regexes, ByteLevel with
               trim_offsets, <｜begin▁of▁sentence｜> at id 0; merges as
               "a b" strings; a BOS template after ByteLevel in the
               post-processor, as the published file has; tokenizer_config.json
               of LlamaTokenizerFast with add_bos_token.
  deepseek_v2  DeepSeek-V2 (the deepseek-llm tokenizer): five Split regexes,
               Digits, ByteLevel, a TemplateProcessing post-processor.
  flags        GPT-2 style ByteLevel(add_prefix_space, use_regex), NFC,
               ignore_merges, added tokens with every flag (lstrip, rstrip,
               single_word, normalized), a BOS/EOS template.
  splits       every Split behaviour, invert, String patterns, Digits,
               anchors and \\s \\w \\h as Oniguruma reads them, a Sequence
               post-processor.
  unk, unk_fused, no_unk
               a hand-made vocab lacking most characters: unk_token per
               character, fused, or (without one) the characters dropped.
  bytes256     one token per byte, ids 0-255 (for the tiny test models).

Test texts include strings absent from the corpus, 100 seeded random texts
and invalid UTF-8: moec
replaces every maximal invalid subpart with U+FFFD before encoding, the same
as Python's bytes.decode("utf-8", "replace") (and Rust's from_utf8_lossy), so
the golden of an invalid input is the encoding of its replaced text.
"""
import binascii
import json
import os
import random
import sys

try:
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers, trainers
except ImportError:
    sys.exit("make_tokenizers.py needs the tokenizers package: pip install tokenizers")

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "tokenizers")

# The Split regexes as the published tokenizer.json files hold them (after
# JSON unescaping). Qwen's has the escapes \r \n; DeepSeek-V3's has literal
# CR and LF characters in its classes.
QWEN_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
           r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
DSV3_RES = [
    "\\p{N}{1,3}",
    "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
    "| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
]
DSV2_RES = [
    "[\r\n]",
    "\\s?[A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af"
    "\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5"
    "\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba"
    "\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45"
    "\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe"
    "\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc"
    "\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139"
    "\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3"
    "\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06"
    "\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3"
    "\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df"
    "\U0001e900-\U0001e943]+",
    "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+",
    "\\s+$",
    "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+",
]


def split(regex, behavior="Isolated", invert=False, string=None):
    pattern = {"String": string} if string is not None else {"Regex": regex}
    return {"type": "Split", "pattern": pattern, "behavior": behavior, "invert": invert}


def byte_level(add_prefix_space=False, trim_offsets=False, use_regex=False):
    return {"type": "ByteLevel", "add_prefix_space": add_prefix_space,
            "trim_offsets": trim_offsets, "use_regex": use_regex}


def template(single, specials):
    """A TemplateProcessing of one sequence: `single` lists special token
    names and "$A"; specials maps each name to its id."""
    def piece(p):
        if p == "$A":
            return {"Sequence": {"id": "A", "type_id": 0}}
        return {"SpecialToken": {"id": p, "type_id": 0}}
    return {"type": "TemplateProcessing", "single": [piece(p) for p in single],
            "pair": [piece(p) for p in single] + [{"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {k: {"id": k, "ids": [v], "tokens": [k]} for k, v in specials.items()}}


def corpus_lines():
    with open(os.path.join(ROOT, "corpus.txt"), encoding="utf-8", newline="") as f:
        text = f.read()
    return text.splitlines(keepends=True)


def train(pre_tokenizer, normalizer, vocab_size, specials):
    """A BPE trained on the corpus with this pre-tokenizer and normalizer
    (JSON form): the tokenizer JSON `tokenizers` writes, as a dict."""
    tok = Tokenizer(models.BPE())
    shell = json.loads(tok.to_str())
    shell["pre_tokenizer"] = pre_tokenizer
    shell["normalizer"] = normalizer
    shell["decoder"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                        "use_regex": True}
    tok = Tokenizer.from_str(json.dumps(shell))
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=list(specials))
    tok.train_from_iterator(corpus_lines(), trainer)
    return tok


def finish(tok, post_processor, decoder, model_fields, legacy_merges):
    """The tokenizer JSON with the published post-processor, decoder and
    model fields; merges as "a b" strings when legacy_merges."""
    obj = json.loads(tok.to_str())
    obj["post_processor"] = post_processor
    obj["decoder"] = decoder
    obj["model"].update(model_fields)
    if legacy_merges:
        assert all(" " not in a and " " not in b for a, b in obj["model"]["merges"])
        obj["model"]["merges"] = [a + " " + b for a, b in obj["model"]["merges"]]
    return obj


def write_json(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, indent=1)
        f.write("\n")


# ---- the fixtures -------------------------------------------------------------

QWEN_MODEL = {"dropout": None, "unk_token": None, "continuing_subword_prefix": "",
              "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False,
              "ignore_merges": False}
DS_MODEL = {"dropout": None, "unk_token": None, "continuing_subword_prefix": None,
            "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False}


def make_qwen2():
    pre = {"type": "Sequence", "pretokenizers": [split(QWEN_RE), byte_level()]}
    tok = train(pre, {"type": "NFC"}, 700, [])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in
                            ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>"]])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in
                    ["<tool_call>", "</tool_call>", "<think>", "</think>"]])
    obj = finish(tok, byte_level(), byte_level(), QWEN_MODEL, legacy_merges=False)
    config = {"tokenizer_class": "Qwen2Tokenizer", "bos_token": None, "eos_token": "<|im_end|>",
              "pad_token": "<|endoftext|>", "add_prefix_space": False, "errors": "replace",
              "model_max_length": 131072, "clean_up_tokenization_spaces": False}
    return obj, config


def make_deepseek_v3():
    bos, eos, pad = "<\uff5cbegin\u2581of\u2581sentence\uff5c>", "<\uff5cend\u2581of\u2581sentence\uff5c>", \
        "<\uff5c\u2581pad\u2581\uff5c>"
    pre = {"type": "Sequence",
           "pretokenizers": [split(r) for r in DSV3_RES] + [byte_level(trim_offsets=True)]}
    tok = train(pre, {"type": "Sequence", "normalizers": []}, 700, [bos, eos, pad])
    tok.add_special_tokens([AddedToken("<\uff5cplace\u2581holder\u2581no\u2581%d\uff5c>" % i, special=True,
                                       normalized=True) for i in range(3)])
    tok.add_tokens([AddedToken(t, special=False, normalized=True) for t in
                    ["<\uff5cUser\uff5c>", "<\uff5cAssistant\uff5c>", "<think>", "</think>"]])
    # the BOS template in tokenizer.json, as the published file has it: what
    # adds the BOS (transformers 5.17's LlamaTokenizerFast no longer rebuilds
    # the post-processor from add_bos_token; scripts/hf_tokenizer_probe.py)
    post = {"type": "Sequence", "processors": [
        byte_level(add_prefix_space=True, use_regex=True),
        template([bos, "$A"], {bos: tok.token_to_id(bos)})]}
    obj = finish(tok, post, byte_level(add_prefix_space=True, trim_offsets=True, use_regex=True),
                 DS_MODEL, legacy_merges=True)
    added = lambda c: {"__type": "AddedToken", "content": c, "lstrip": False, "normalized": True,
                       "rstrip": False, "single_word": False}
    config = {"tokenizer_class": "LlamaTokenizerFast", "add_bos_token": True, "add_eos_token": False,
              "bos_token": added(bos), "eos_token": added(eos), "pad_token": added(eos),
              "unk_token": None, "legacy": True, "model_max_length": 131072,
              "clean_up_tokenization_spaces": False}
    return obj, config


def make_deepseek_v2():
    bos, eos = "<\uff5cbegin\u2581of\u2581sentence\uff5c>", "<\uff5cend\u2581of\u2581sentence\uff5c>"
    pre = {"type": "Sequence", "pretokenizers": [split(r) for r in DSV2_RES] +
           [{"type": "Digits", "individual_digits": True}, byte_level(trim_offsets=True)]}
    tok = train(pre, {"type": "Sequence", "normalizers": []}, 700, [bos, eos])
    tok.add_special_tokens([AddedToken("<|EOT|>", special=True, normalized=False)])
    obj = finish(tok, template([bos, "$A"], {bos: 0}),
                 byte_level(add_prefix_space=True, trim_offsets=True, use_regex=True), DS_MODEL,
                 legacy_merges=True)
    return obj, None


def make_flags():
    pre = byte_level(add_prefix_space=True, trim_offsets=True, use_regex=True)
    tok = train(pre, {"type": "NFC"}, 600, ["<s>", "</s>"])
    tok.add_special_tokens([
        AddedToken("<mask>", lstrip=True, special=True, normalized=False),
        AddedToken("[R]", rstrip=True, special=True, normalized=False),
        AddedToken("<both>", lstrip=True, rstrip=True, special=True, normalized=False),
    ])
    tok.add_tokens([
        AddedToken("word", single_word=True, normalized=False),
        AddedToken("cafe\u0301", normalized=True),      # matched in NFC text: "café"
        AddedToken("e\u0301t\u00e9", normalized=False),  # matched only as written
        AddedToken("ok ok", single_word=True, lstrip=True, rstrip=True, normalized=True),
    ])
    model = dict(DS_MODEL, ignore_merges=True)
    obj = finish(tok, template(["<s>", "$A", "</s>"], {"<s>": 0, "</s>": 1}), byte_level(), model,
                 legacy_merges=False)
    return obj, None


def make_splits():
    pre = {"type": "Sequence", "pretokenizers": [
        split(None, "MergedWithNext", string="-"),
        split("x+", "MergedWithPrevious"),
        split("[,;]+", "Removed"),
        split("q+", "Contiguous", invert=True),
        split("k.k|^y|y$", "Isolated"),
        split("z|(?<=z)", "MergedWithNext"),
        split("\\w\\h", "Removed"),
        split("\\s+", "MergedWithNext", invert=True),
        {"type": "Digits", "individual_digits": False},
        byte_level(add_prefix_space=True, use_regex=True),
    ]}
    tok = train(pre, {"type": "Sequence", "normalizers": [{"type": "NFC"}]}, 500, ["<bos>"])
    post = {"type": "Sequence", "processors": [byte_level(), template(["<bos>", "$A"], {"<bos>": 0})]}
    obj = finish(tok, post, byte_level(), DS_MODEL, legacy_merges=True)
    return obj, None


def make_small(unk_token, fuse_unk):
    """A hand-made BPE whose vocab lacks most characters: they become
    unk_token (one per character, or fused runs), or vanish without one."""
    vocab = {"<unk>": 0, "a": 1, "b": 2, "c": 3, "\u0120": 4, "ab": 5, "abc": 6, "\u0120a": 7,
             "\u00e4": 8, "\u00b8": 9}
    model = dict(DS_MODEL, type="BPE", unk_token=unk_token, fuse_unk=fuse_unk, vocab=vocab,
                 merges=[["a", "b"], ["ab", "c"], ["\u0120", "a"]])
    obj = {"version": "1.0", "truncation": None, "padding": None,
           "added_tokens": [{"id": 0, "content": "<unk>", "single_word": False, "lstrip": False,
                             "rstrip": False, "normalized": False, "special": True}],
           "normalizer": None, "pre_tokenizer": byte_level(use_regex=True), "post_processor": None,
           "decoder": byte_level(), "model": model}
    return obj, None


def make_bytes256():
    """Every byte its own token, its id the byte's value, no merges: ids that
    fit the tiny test models' vocab of 256 (moec run --prompt's test)."""
    chars = bytes_to_chars()
    model = dict(DS_MODEL, type="BPE", vocab={chars[b]: b for b in range(256)}, merges=[])
    obj = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
           "normalizer": None, "pre_tokenizer": byte_level(use_regex=True), "post_processor": None,
           "decoder": byte_level(), "model": model}
    return obj, None


FIXTURES = [("qwen2", make_qwen2), ("deepseek_v3", make_deepseek_v3),
            ("deepseek_v2", make_deepseek_v2), ("flags", make_flags), ("splits", make_splits),
            ("unk", lambda: make_small("<unk>", False)), ("unk_fused", lambda: make_small("<unk>", True)),
            ("no_unk", lambda: make_small(None, False)), ("bytes256", make_bytes256)]

# ---- the test texts -------------------------------------------------------------

TEXTS = [
    "", " ", "Hello, world!", "hello world", " Hello", "Hello ", "  two leading", "trailing two  ",
    "The quick brown fox jumps over the lazy dog.",
    "Tokenizers never saw this sentence: zyzzyva quokka fjord!",
    "I'm sure they'll say it's fine, don't you think? We've seen it. 'S 'RE 'Ll \u017fs '\u017f x'\u212a",
    "a\nb", "a\n\nb", "a\r\nb", "\r\n", "\n\n\n", "a \n b", "x  \n y  ", "\t\tx", "tab\there",
    " " * 40, "\n" * 17, "a" * 300, "ab " * 50,
    "nbsp\u00a0x \u00a0 y", "ideographic\u3000space", "mongolian\u180evowel", "x \u180e y\u180e\u180e\n\u180e", "nel\u0085x", "ls\u2028ps\u2029",
    "zero\u200bwidth\u200d\u200cjoin",
    "0", "12", "123", "1234567", "3.14159", "1,000,000", "\u0663\u0664\u0665 \u00bd \u00b2 \u2167 \u2460",
    "12abc345def", "v2.0-rc1",
    "\u4eba\u5de5\u667a\u80fd\u6b63\u5728\u6539\u53d8\u4e16\u754c\u3002",
    "\u6771\u4eac\u306f\u65e5\u672c\u306e\u9996\u90fd\u3067\u3059\u3002\u30ab\u30bf\u30ab\u30ca\u30fc",
    "\ud55c\uad6d\uc5b4 \ubb38\uc7a5", "\u1100\u1161\u11a8 jamo",
    "\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440!", "\u03b3\u03b5\u03b9\u03ac \u03c3\u03bf\u03c5",
    "\u0645\u0631\u062d\u0628\u0627 \u05e9\u05dc\u05d5\u05dd",
    "\U0001f600 \U0001f44d\U0001f3fd \U0001f1fa\U0001f1f8 \U0001f469\u200d\U0001f4bb \u2764\ufe0f\U0001f680",
    "e\u0301 a\u0308 caf\u00e9 cafe\u0301 \u1e0b\u0323 \u212b \u2126 \ufb01",
    "def f(x):\n    return x ** 2  # comment\n", "if (a->b && c[i] != '\\0') { return -1; }",
    "https://example.com/path?q=1&x=2#frag", "\uff21\uff22\uff23 \uff11\uff12\uff13\uff01",
    "a-b-c x-y", "axxbxxc, d;e,,f", "qqaqqbq", "kak yak k\nk yy y\ny", "k\nkk", "k\rkk", "1a 2b Fz _e \u0301c",
    "a\u0000b", "e\u0301\u0000\u00e9\u0000",
    # added and special tokens
    "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n",
    "<|im_end|><|im_start|><|endoftext|>", "<|im_sta", "x<think>y</think>z", "  <tool_call>  ",
    "<\uff5cbegin\u2581of\u2581sentence\uff5c><\uff5cUser\uff5c>Hi<\uff5cAssistant\uff5c>",
    "<\uff5cplace\u2581holder\u2581no\u25811\uff5c> <\uff5c\u2581pad\u2581\uff5c><|EOT|>",
    "a <mask> b", "a   <mask>", "[R]   x", "x <both>   y", "<both>",
    "word", "a word b", "words", "sword", "word_x", "_word", "word.", "\u00e9word",
    "caf\u00e9", "cafe\u0301", "caf\u00e9s", "e\u0301t\u00e9", "\u00e9t\u00e9",
    "ok ok", "x ok ok y", "xok ok", "  ok ok  ",
    "<s></s>",
]
INVALID = [
    b"\xff", b"abc\xe4\xb8", b"\xe4\xb8abc", b"\xed\xa0\x80", b"\xc0\xaf", b"\xf4\x90\x80\x80",
    b"\xe2\x82 x", b"ok\x80\x80ok", b"\xf0\x9f\x98", b"\xf0\x9f\x98\x80\xf0", b"<|im_end|>\xfe",
]


# Random texts (seeded) of pieces every fixture treats specially: what a
# differential fuzz against tokenizers found bugs with, kept as goldens.
FUZZ_PIECES = [
    " ", "  ", "\n", "\r\n", "\t", "\r", " \n", "\n\n", "  \n  ", "\u2028", "\x0b", "$", ".",
    "\\", "a", "ab", "the", " quick", "x", "z", "q", "k", "y", "-", ",", ";", "'s", "'S", "1", "123",
    "4567", "\u00e9", "e\u0301", "\u0301", "\u4e2d", "\u65e5\u672c", "\u30ab", "\ud55c",
    "\U0001f600", "\u200d", "\u180e", "\u00a0", "\u3000", "!", "?", "(", ")", "[", "<", ">", "_",
    "word", "ok ok", "caf\u00e9", "<|im_start|>", "<|im_end|>", "<think>", "<mask>", "[R]",
    "<both>", "<s>", "<\uff5cbegin\u2581of\u2581sentence\uff5c>", "<|EOT|>", "\u00bd", "\u2167",
]
FUZZ_INVALID = [b"\xff", b"\xe4\xb8", b"\xed\xa0\x80", b"\xc0", b"\x80"]


def fuzz_texts(count):
    rng = random.Random(17)
    texts = []
    for _ in range(count):
        parts = []
        for _ in range(rng.randint(1, 12)):
            if rng.random() < 0.05:
                parts.append(rng.choice(FUZZ_INVALID))
            else:
                parts.append(rng.choice(FUZZ_PIECES).encode() * rng.choice([1, 1, 1, 2, 3]))
        texts.append(b"".join(parts))
    return texts


def bytes_to_chars():
    """GPT-2's byte -> character table of the ByteLevel pre-tokenizer."""
    bs = list(range(0x21, 0x7f)) + list(range(0xa1, 0xad)) + list(range(0xae, 0x100))
    rest = [b for b in range(256) if b not in bs]
    table = {b: chr(b) for b in bs}
    table.update({b: chr(0x100 + i) for i, b in enumerate(rest)})
    return table


def decode_cases(tok, mixed):
    """Id lists to decode beyond the encodings: ids spread over the whole
    table, ids that cut UTF-8 sequences apart or form invalid ones, ids with
    no token, and a long mixed list."""
    size = tok.get_vocab_size(with_added_tokens=True)
    vocab = tok.get_vocab(with_added_tokens=True)
    chars = bytes_to_chars()

    cases = [[i] for i in range(0, size, max(1, size // 40))]
    for bs in [b"\xe4\xb8\x80", b"\xe4\xb8", b"\xe4a", b"\xff\xfe", b"\xf0\x9f\x98\x80",
               b"\xf0\x9f\x98", b"\xed\xa0\x80", b"\xc3\xa9\xa9", b"ab\xf4\x90",
               b"\xe2\x82\xac\xe2\x82", b"\xe4\xb8\xb8"]:
        if all(chars[b] in vocab for b in bs):
            cases.append([vocab[chars[b]] for b in bs])
    cases += [[size + 5], [size + 100000, 1, 2], mixed]
    return cases


def goldens(tok, texts, n_fuzz):
    """What tok encodes each text to (by index into texts; the last n_fuzz
    with add_special_tokens only) and decodes id lists to."""
    enc, dec, all_ids = [], [], []
    for k, raw in enumerate(texts):
        text = raw.decode("utf-8", "replace")
        for add in (True, False) if k < len(texts) - n_fuzz else (True,):
            ids = tok.encode(text, add_special_tokens=add).ids
            enc.append({"text": k, "add_special": add, "ids": ids})
            if add and k < len(texts) - n_fuzz:
                all_ids.append(ids)
    mixed = [i for ids in all_ids for i in ids][:200]
    for ids in all_ids + decode_cases(tok, mixed):
        for skip in (False, True):
            dec.append({"ids": ids, "skip_special": skip,
                        "text": tok.decode(ids, skip_special_tokens=skip).encode("utf-8").hex()})
    return {"encode": enc, "decode": dec}


def main():
    fuzz = fuzz_texts(100)
    texts = [t.encode("utf-8") for t in TEXTS] + INVALID + fuzz
    out = {"generator": "scripts/make_tokenizers.py",
           "tokenizers_version": __import__("tokenizers").__version__,
           "texts": [t.hex() for t in texts], "tokenizers": {}}
    for name, make in FIXTURES:
        obj, config = make()
        d = os.path.join(ROOT, name)
        os.makedirs(d, exist_ok=True)
        write_json(os.path.join(d, "tokenizer.json"), obj)
        cfg_path = os.path.join(d, "tokenizer_config.json")
        if config is not None:
            write_json(cfg_path, config)
        elif os.path.exists(cfg_path):
            os.remove(cfg_path)
        tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
        out["tokenizers"][name] = goldens(tok, texts, len(fuzz))
        print("%s: %d tokens, %d merges" % (name, tok.get_vocab_size(), len(obj["model"]["merges"])))
    with open(os.path.join(ROOT, "goldens.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()
