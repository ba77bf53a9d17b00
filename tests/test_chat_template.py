#!/usr/bin/env python3
"""test_chat_template.py — `moec chat-template` against jinja2, byte for byte.

Every template of tests/data/chat_templates/ (the DeepSeek and Qwen chat
templates as their tokenizer_config.json files publish them) renders many
conversations two ways: with jinja2 in the environment transformers'
apply_chat_template builds (ImmutableSandboxedEnvironment, trim_blocks,
lstrip_blocks, loop controls, raise_exception, strftime_now, transformers'
tojson; the template gets messages, tools, documents, add_generation_prompt,
bos_token, eos_token and, when given, enable_thinking or the request's
other variables), and with `moec chat-template` on a model folder holding the
template. The texts must be equal; where jinja2 raises, moec must fail too.

The conversations: fixed ones (a system prompt or none, one turn or many,
assistant turns with <think>...</think> or reasoning_content, empty content,
CJK, emoji, combining marks, quotes, braces and Jinja syntax inside content,
tool calls and tool results, several system messages, a prefilled assistant
turn) and seeded random ones, each with add_generation_prompt both ways and,
for the templates that read it, enable_thinking unset, 0 and 1 (DeepSeek's
`thinking` likewise). Needs jinja2 (Debian: python3-jinja2).
"""
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile

try:
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError:
    print("FAIL: python3 cannot import jinja2: run scripts/install_deps.sh (Debian: python3-jinja2)")
    sys.exit(1)

SRC = os.environ.get("MOEC_SOURCE_DIR", os.path.join(os.path.dirname(__file__), ".."))
BUILD = os.environ.get("MOEC_BUILD_DIR", os.path.join(SRC, "build"))
MOEC = os.path.join(BUILD, "moec")
TEMPLATES = os.path.join(SRC, "tests", "data", "chat_templates")
TOKENIZERS = os.path.join(SRC, "tests", "data", "tokenizers")


# ---- transformers' environment ---------------------------------------------------------

class AssistantTracker(jinja2.ext.Extension):
    """transformers' {% generation %} tag, which renders its body as is."""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def strftime_now(fmt):
    import datetime
    return datetime.datetime.now().strftime(fmt)


ENV = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                    extensions=[AssistantTracker, jinja2.ext.loopcontrols])
ENV.filters["tojson"] = tojson
ENV.globals["raise_exception"] = raise_exception
ENV.globals["strftime_now"] = strftime_now


# ---- the model folders ------------------------------------------------------------------

DS_BOS, DS_EOS = "<\uff5cbegin\u2581of\u2581sentence\uff5c>", "<\uff5cend\u2581of\u2581sentence\uff5c>"


def family(name):
    return "deepseek" if name.startswith("deepseek") else "qwen"


def make_folder(root, name, template):
    """A model folder of the fixture tokenizer of the template's family, with
    the template as tokenizer_config.json's chat_template (a string, or, for
    every other template, the "default" entry of a list, as some configs
    publish it)."""
    d = os.path.join(root, name)
    os.makedirs(d)
    fam = family(name)
    fixture = os.path.join(TOKENIZERS, "deepseek_v3" if fam == "deepseek" else "qwen2")
    shutil.copy(os.path.join(fixture, "tokenizer.json"), d)
    with open(os.path.join(fixture, "tokenizer_config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    if len(name) % 2:
        cfg["chat_template"] = [{"name": "tool_use", "template": "{{ 'not this one' }}"},
                                {"name": "default", "template": template}]
    else:
        cfg["chat_template"] = template
    with open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, ensure_ascii=False, indent=1)
    bos = cfg.get("bos_token")
    eos = cfg.get("eos_token")
    strip = lambda t: t["content"] if isinstance(t, dict) else t
    return d, strip(bos), strip(eos)


# ---- conversations ------------------------------------------------------------------------

PIECES = [
    "Hello", "What is 2+2?", " leading and trailing spaces ", "\n\nnewlines\n", "",
    "中文：你好，世界！", "日本語のテキスト", "emoji \U0001F600\U0001F680 and ZWJ \U0001F468\u200d\U0001F469",
    "e\u0301 combining, Ωmega, \u00e9t\u00e9", "{{ not_a_variable }} {% if x %} {# c #}", "quotes ' \" \\ backslash",
    "braces { } [ ] < > & %", "<think>reasoning</think>answer", "<think>\nstep 1\nstep 2\n</think>\n\nfinal",
    "</think>only an end", "<tool_response>\n{\"ok\": true}\n</tool_response>", "tab\there\r\nCRLF",
    "\u00a0nbsp\u3000ideographic space", "a" * 300, "<\uff5cUser\uff5c> inside", "<|im_end|> inside",
]


def fixed_conversations(fam):
    call_args = '{"city": "Paris"}'
    tool_call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": call_args}}
    tool_call_dict = {"id": "call_2", "type": "function",
                      "function": {"name": "get_time", "arguments": {"tz": "UTC", "n": 3, "f": 1.5}}}
    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "a city"}},
                       "required": ["city"]}}}]
    convs = [
        [{"role": "user", "content": "Hello"}],
        [{"role": "system", "content": "You are helpful."}, {"role": "user", "content": "Hi!"}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Q1"},
         {"role": "assistant", "content": "A1"}, {"role": "user", "content": "Q2"}],
        [{"role": "user", "content": "Q1"}, {"role": "assistant", "content": "<think>\nI think\n</think>\n\nA1"},
         {"role": "user", "content": "Q2"}, {"role": "assistant", "content": "<think>more</think>A2"}],
        [{"role": "user", "content": "Q"},
         {"role": "assistant", "content": "A", "reasoning_content": "because"}],
        [{"role": "user", "content": ""}, {"role": "assistant", "content": ""}],
        [{"role": "system", "content": "S1"}, {"role": "system", "content": "S2"}, {"role": "user", "content": "U"}],
        [{"role": "user", "content": PIECES[5]}, {"role": "assistant", "content": PIECES[7]},
         {"role": "user", "content": PIECES[8]}],
        [{"role": "user", "content": PIECES[9]}, {"role": "assistant", "content": PIECES[10]},
         {"role": "user", "content": PIECES[11]}],
        [{"role": "user", "content": "Weather?"},
         {"role": "assistant", "content": None, "tool_calls": [tool_call]},
         {"role": "tool", "content": "{\"temp\": 20}", "name": "get_weather"},
         {"role": "assistant", "content": "It is 20."}],
        [{"role": "user", "content": "Two tools"},
         {"role": "assistant", "content": "Calling.", "tool_calls": [tool_call, tool_call]},
         {"role": "tool", "content": "r1", "name": "get_weather"}, {"role": "tool", "content": "r2", "name": "get_weather"},
         {"role": "user", "content": "thanks"}],
        [{"role": "user", "content": "Time?"},
         {"role": "assistant", "content": "", "tool_calls": [tool_call_dict]},
         {"role": "tool", "content": "12:00", "name": "get_time"}],
        [{"role": "user", "content": "Prefill"}, {"role": "assistant", "content": "Sure, here", "prefix": True}],
        [{"role": "user", "content": PIECES[15]}, {"role": "assistant", "content": "ok"}],
        [{"role": "user", "content": [{"type": "text", "text": "parts"}]}],
        [],
        {"messages": [{"role": "user", "content": "with tools"}], "tools": tools},
        {"messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "weather?"},
                      {"role": "assistant", "content": None, "tool_calls": [tool_call]},
                      {"role": "tool", "content": "sunny"}], "tools": tools},
        {"messages": [{"role": "user", "content": "think?"}], "thinking": True},
        {"messages": [{"role": "user", "content": "U"}, {"role": "assistant", "content": "<think>x</think>A"},
                      {"role": "user", "content": "U2"}], "thinking": False},
    ]
    return convs


def random_conversations(rng, n):
    roles = ["system", "user", "assistant", "tool"]
    out = []
    for _ in range(n):
        conv = []
        if rng.random() < 0.5:
            conv.append({"role": "system", "content": rng.choice(PIECES)})
        for _ in range(rng.randint(1, 6)):
            role = rng.choice(roles[1:]) if rng.random() < 0.8 else rng.choice(roles)
            text = "".join(rng.choice(PIECES) for _ in range(rng.randint(1, 3)))
            conv.append({"role": role, "content": text})
        out.append(conv)
    return out


# ---- rendering both ways --------------------------------------------------------------------

COMPILED = {}


def reference(template, request, gen, thinking, bos, eos):
    kw = {"tools": None, "documents": None}
    if isinstance(request, dict):
        kw.update({k: v for k, v in request.items()})
    else:
        kw["messages"] = request
    kw["add_generation_prompt"] = gen
    if bos is not None:
        kw["bos_token"] = bos
    if eos is not None:
        kw["eos_token"] = eos
    if thinking is not None:
        kw["enable_thinking"] = thinking
    try:
        if template not in COMPILED:
            COMPILED[template] = ENV.from_string(template)
        return True, COMPILED[template].render(**kw).encode("utf-8")
    except Exception as e:  # noqa: BLE001 - any jinja2 failure means moec must fail too
        return False, f"{type(e).__name__}: {e}".encode("utf-8")


def moec(folder, request, gen, thinking):
    args = [MOEC, "chat-template", folder]
    if not gen:
        args.append("--no-generation-prompt")
    if thinking is not None:
        args += ["--enable-thinking", "1" if thinking else "0"]
    p = subprocess.run(args, input=json.dumps(request, ensure_ascii=False).encode("utf-8"), capture_output=True)
    return p.returncode == 0, p.stdout if p.returncode == 0 else p.stderr


def main():
    names = sorted(f[:-6] for f in os.listdir(TEMPLATES) if f.endswith(".jinja"))
    if not names:
        print("FAIL: no templates in", TEMPLATES)
        return 1
    rng = random.Random(17)
    root = tempfile.mkdtemp(prefix="moec_chat_")
    runs = fails = agreed_errors = 0
    try:
        for name in names:
            with open(os.path.join(TEMPLATES, name + ".jinja"), encoding="utf-8") as f:
                template = f.read()
            folder, bos, eos = make_folder(root, name, template)
            reads_thinking = "enable_thinking" in template
            convs = fixed_conversations(family(name)) + random_conversations(rng, 25)
            t_runs = t_errs = 0
            for conv in convs:
                for gen in (True, False):
                    for thinking in ((None, False, True) if reads_thinking else (None,)):
                        want_ok, want = reference(template, conv, gen, thinking, bos, eos)
                        got_ok, got = moec(folder, conv, gen, thinking)
                        runs += 1
                        t_runs += 1
                        if want_ok and got_ok and want == got:
                            continue
                        if not want_ok and not got_ok:
                            agreed_errors += 1
                            t_errs += 1
                            continue
                        fails += 1
                        if fails <= 10:
                            print(f"FAIL: {name}, add_generation_prompt={gen}, enable_thinking={thinking}")
                            print("  conversation:", json.dumps(conv, ensure_ascii=False)[:300])
                            print("  jinja2:", "ok" if want_ok else "error", want[:600])
                            print("  moec:  ", "ok" if got_ok else "error", got[:600])
            print(f"{name}: {t_runs} renders ({t_errs} where both refuse the conversation)")
    finally:
        shutil.rmtree(root)
    print(f"test_chat_template: {runs - fails} of {runs} renders agree ({agreed_errors} both errors), "
          f"{fails} differ")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
