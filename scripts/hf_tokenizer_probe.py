#!/usr/bin/env python3
"""hf_tokenizer_probe.py — what transformers makes of the tokenizer files
moec reads beside tokenizer.json, where they add to it or disagree with it.

  python3 scripts/hf_tokenizer_probe.py [OUT_DIR]

Builds variants of tests/data/tokenizers/qwen2 in a temporary folder (an
added_tokens_decoder in tokenizer_config.json that agrees with
tokenizer.json's added_tokens, names a new token, moves a token's id or
changes its special or lstrip flag; a special_tokens_map.json whose
eos_token or additional_special_tokens differ from tokenizer_config.json's;
additional_special_tokens with split_special_tokens; an added_tokens.json;
a tokenizer.json "version" other than "1.0", or none; a config without
special tokens, the class's defaults), and of tests/data/tokenizers/
deepseek_v3 (as published, and without special tokens), loads each with
AutoTokenizer, and prints (and writes OUT_DIR/tokenizer_probe.json) what it
encodes a text to, what skip_special_tokens drops, its length and its
special tokens, or the error it raises. Needs transformers (the GPU
machine has it); the answers decide what runtime/tokenizer_load.c honours
and what it refuses by name.
"""
import copy
import json
import os
import sys
import tempfile

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data",
                        "tokenizers")
TEXTS = {"qwen2": "a<|new|>b <tool_call>c<|im_end|>d<|endoftext|>",
         "deepseek_v3": "a<｜User｜>b <think>c<｜end▁of▁sentence｜>d<｜▁pad▁｜>"}


def entry(tok):
    return {k: tok[k] for k in ("content", "single_word", "lstrip", "rstrip", "normalized",
                                "special")}


def variants(tj, cfg):
    added = {str(t["id"]): entry(t) for t in tj["added_tokens"]}
    out = {"plain": ({}, {}, None)}
    out["decoder_agrees"] = ({"added_tokens_decoder": added}, {}, None)
    new = dict(added)
    new["708"] = dict(entry(tj["added_tokens"][0]), content="<|new|>")
    out["decoder_new_token"] = ({"added_tokens_decoder": new}, {}, None)
    moved = {k: v for k, v in added.items() if v["content"] != "<|im_end|>"}
    moved["750"] = dict(entry(tj["added_tokens"][2]))
    out["decoder_moved_id"] = ({"added_tokens_decoder": moved}, {}, None)
    flag = copy.deepcopy(added)
    for v in flag.values():
        if v["content"] == "<tool_call>":
            v["special"] = True
    out["decoder_special_flag"] = ({"added_tokens_decoder": flag}, {}, None)
    strip = copy.deepcopy(added)
    for v in strip.values():
        if v["content"] == "<tool_call>":
            v["lstrip"] = True
    out["decoder_lstrip"] = ({"added_tokens_decoder": strip}, {}, None)
    out["map_eos_differs"] = ({}, {"eos_token": "<|endoftext|>"}, None)
    out["map_eos_only"] = ({"eos_token": None}, {"eos_token": "<|endoftext|>"}, None)
    out["map_additional"] = ({}, {"additional_special_tokens": ["<tool_call>"]}, None)
    out["config_additional"] = ({"additional_special_tokens": ["<tool_call>"]}, {}, None)
    out["map_eos_object"] = ({}, {"eos_token": {"content": "<|endoftext|>", "lstrip": False,
                                                "rstrip": False, "normalized": False,
                                                "single_word": False}}, None)
    out["split_config_additional"] = ({"additional_special_tokens": ["<tool_call>"],
                                       "split_special_tokens": True}, {}, None)
    unspecial = copy.deepcopy(added)
    for v in unspecial.values():
        if v["content"] == "<|endoftext|>":
            v["special"] = False
    out["decoder_unspecial"] = ({"added_tokens_decoder": unspecial, "pad_token": None}, {},
                                None)
    out["added_tokens_json"] = ({}, {"@added_tokens.json": {"<|new|>": 708}}, None)
    out["version_2"] = ({}, {}, {"version": "2.0"})
    out["version_missing"] = ({}, {}, {"version": None})
    # the class's own defaults where the config names no special token
    out["class_defaults"] = ({"@drop": ["bos_token", "eos_token", "pad_token", "unk_token"]}, {},
                             None)
    return out


def llama_variants(tj, cfg):
    """DeepSeek's LlamaTokenizerFast fixture: as published, and without its
    special tokens (the class's defaults, <s> </s> <unk>, are not tokens)."""
    bos = {"type": "TemplateProcessing",
           "single": [{"SpecialToken": {"id": "<｜begin▁of▁sentence｜>", "type_id": 0}},
                      {"Sequence": {"id": "A", "type_id": 0}}],
           "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
           "special_tokens": {"<｜begin▁of▁sentence｜>": {"id": "<｜begin▁of▁sentence｜>", "ids": [0],
                                                         "tokens": ["<｜begin▁of▁sentence｜>"]}}}
    return {"plain": ({}, {}, None),
            "class_defaults": ({"@drop": ["bos_token", "eos_token", "pad_token", "unk_token"],
                                "add_bos_token": False}, {}, None),
            # does add_bos_token / add_eos_token rebuild tokenizer.json's post-processor?
            "add_bos_false": ({"add_bos_token": False}, {}, None),
            "add_eos_true": ({"add_eos_token": True}, {}, None),
            "template_bos": ({}, {}, {"post_processor": bos}),
            "template_bos_add_bos_false": ({"add_bos_token": False}, {}, {"post_processor": bos}),
            "no_flags": ({"@drop": ["add_bos_token", "add_eos_token"]}, {}, None),
            "post_null": ({}, {}, {"post_processor": "@null"}),
            "post_null_add_eos": ({"add_eos_token": True}, {}, {"post_processor": "@null"})}


def probe(path, text):
    from transformers import AutoTokenizer

    try:
        t = AutoTokenizer.from_pretrained(path)
    except Exception as e:  # the error is the answer
        return {"error": f"{type(e).__name__}: {str(e)[:400]}"}
    ids = t.encode(text, add_special_tokens=True)
    return {
        "class": type(t).__name__,
        "len": len(t),
        "ids": ids,
        "tokens": t.convert_ids_to_tokens(ids),
        "skip_special": t.decode(ids, skip_special_tokens=True),
        "eos": [t.eos_token, t.eos_token_id],
        "bos": [t.bos_token, t.bos_token_id],
        "all_special": t.all_special_tokens,
        "added_vocab": sorted(t.get_added_vocab().items(), key=lambda kv: kv[1]),
    }


def main():
    import transformers

    res = {"transformers": transformers.__version__, "texts": TEXTS}
    with tempfile.TemporaryDirectory() as tmp:
        for fixture, make in ("qwen2", variants), ("deepseek_v3", llama_variants):
            run_fixture(fixture, make, tmp, res)
    if len(sys.argv) > 1:
        os.makedirs(sys.argv[1], exist_ok=True)
        with open(os.path.join(sys.argv[1], "tokenizer_probe.json"), "w") as f:
            json.dump(res, f, indent=1, ensure_ascii=False)


def run_fixture(fixture, make, tmp, res):
    src = os.path.join(FIXTURES, fixture)
    with open(os.path.join(src, "tokenizer.json")) as f:
        tj = json.load(f)
    with open(os.path.join(src, "tokenizer_config.json")) as f:
        cfg = json.load(f)
    for vname, (cfg_add, stm, tj_over) in make(tj, cfg).items():
        name = f"{fixture}/{vname}"
        d = os.path.join(tmp, fixture, vname)
        os.makedirs(d)
        t2 = dict(tj)
        for key, value in (tj_over or {}).items():  # None: the key left out; "@null": null
            t2.pop(key, None)
            if value is not None:
                t2[key] = None if value == "@null" else value
        with open(os.path.join(d, "tokenizer.json"), "w") as f:
            json.dump(t2, f)
        c2 = dict(cfg)
        c2.update(cfg_add)
        for key in c2.pop("@drop", []):
            c2.pop(key, None)
        with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
            json.dump(c2, f)
        for body, fname in (stm.pop("@added_tokens.json", None), "added_tokens.json"), \
                (stm, "special_tokens_map.json"):
            if body:
                with open(os.path.join(d, fname), "w") as f:
                    json.dump(body, f)
        res[name] = probe(d, TEXTS[fixture])
        print(name, json.dumps(res[name], ensure_ascii=False))


if __name__ == "__main__":
    main()
