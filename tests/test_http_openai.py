#!/usr/bin/env python3
"""test_http_openai.py — `moec serve --http` as the `openai` Python client
(PyPI) meets it, on the CPU backend, loopback only: models listed and
retrieved; a greedy completion (the same text as the raw HTTP answer, with
its usage), streamed (chunks that join to it, the usage chunk last); stop
strings matched across token boundaries and never sent, whole and streamed;
chat completions, whole and streamed (the role first), equal to the
completion of the prompt the ChatML template renders; log probabilities of
both; seeded sampling repeated; and the errors as the client raises them
(404 model_not_found, 400 naming the field).

Needs the openai package: in the python3 running this, or in $MOEC_PYTHON
(run again with it). Without either it exits 77, which ctest counts as a
skip, saying why."""
import os
import sys

try:
    import openai
except ImportError:
    alt = os.environ.get("MOEC_PYTHON")
    if alt and not os.environ.get("MOEC_PYTHON_TRIED"):
        os.environ["MOEC_PYTHON_TRIED"] = "1"
        os.execv(alt, [alt] + sys.argv)
    print("SKIP: the openai package is not installed for %s%s; `pip install openai`, or set "
          "MOEC_PYTHON to a python that has it" %
          (sys.executable, " nor for MOEC_PYTHON=" + alt if alt else ""))
    sys.exit(77)

import http.client
import json
import shutil
import tempfile

from http_lib import make_model, start_server, stop_server

MODEL = "tiny-v2"
failures = []


def check(ok, msg):
    if not ok:
        failures.append(msg)
        print("FAIL:", msg[:2000], flush=True)
    return ok


def raises(call, kind, **want):
    """call() raises openai's kind with these attributes."""
    try:
        call()
    except kind as e:
        got = {k: getattr(e, k, None) for k in want}
        return check(got == want, "%s: %r, want %r (%s)" % (kind.__name__, got, want, e))
    except Exception as e:
        return check(False, "raised %s: %s, want %s" % (type(e).__name__, e, kind.__name__))
    return check(False, "no %s raised" % kind.__name__)


def run(port):
    client = openai.OpenAI(base_url="http://127.0.0.1:%d/v1" % port, api_key="none",
                           max_retries=0, timeout=120)
    check([m.id for m in client.models.list()] == [MODEL], "models.list")
    check(client.models.retrieve(MODEL).id == MODEL, "models.retrieve")

    prompt = "The quick brown fox"
    c = http.client.HTTPConnection("127.0.0.1", port)
    c.request("POST", "/v1/completions", body=json.dumps(
        {"model": MODEL, "prompt": prompt, "max_tokens": 40, "temperature": 0}))
    raw = json.loads(c.getresponse().read())
    c.close()
    want = raw["choices"][0]["text"]
    check(len(want) > 20, "the greedy text is too short to test with: %r" % want)

    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=40, temperature=0)
    check(r.choices[0].text == want and r.object == "text_completion" and r.model == MODEL,
          "completion: %r, want %r" % (r.choices[0].text, want))
    check(r.usage.prompt_tokens == 19 and r.usage.completion_tokens == raw["usage"]["completion_tokens"]
          and r.usage.total_tokens == 19 + r.usage.completion_tokens, "usage %r" % r.usage)
    check(r.choices[0].finish_reason == raw["choices"][0]["finish_reason"], "finish_reason")

    chunks = list(client.completions.create(model=MODEL, prompt=prompt, max_tokens=40,
                                            temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
    check(text == want, "stream: %r, want %r" % (text, want))
    check(chunks[-1].usage is not None and chunks[-1].usage.completion_tokens ==
          r.usage.completion_tokens and not chunks[-1].choices, "stream usage %r" % chunks[-1])
    check([ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] ==
          r.choices[0].finish_reason, "stream finish_reason")

    # a stop string of three characters (three tokens or more: one a byte)
    stop = want[9:12]
    before = want[:want.find(stop)]
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=40, temperature=0,
                                  stop=["never there", stop])
    check(r.choices[0].text == before and r.choices[0].finish_reason == "stop",
          "stop %r: %r (%s), want %r" % (stop, r.choices[0].text, r.choices[0].finish_reason,
                                         before))
    chunks = list(client.completions.create(model=MODEL, prompt=prompt, max_tokens=40,
                                            temperature=0, stop=stop, stream=True))
    text = "".join(ch.choices[0].text for ch in chunks)
    check(text == before and chunks[-1].choices[0].finish_reason == "stop",
          "stop %r streamed: %r, want %r" % (stop, text, before))
    check(all(stop not in ch.choices[0].text for ch in chunks), "the stop string was sent")

    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=5, temperature=0,
                                  logprobs=2)
    lp = r.choices[0].logprobs
    check(len(lp.tokens) == 5 and len(lp.token_logprobs) == 5 and len(lp.top_logprobs) == 5
          and all(x <= 0 for x in lp.token_logprobs), "completion logprobs %r" % lp)

    a = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=1.2,
                                  top_p=0.95, seed=11)
    b = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=1.2,
                                  top_p=0.95, seed=11)
    check(a.choices[0].text == b.choices[0].text, "seed 11 twice: %r, %r" %
          (a.choices[0].text, b.choices[0].text))

    # chat: the ChatML text the template renders, completed
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a fox."}]
    rendered = "".join("<|im_start|>%s\n%s<|im_end|>\n" % (m["role"], m["content"])
                       for m in msgs) + "<|im_start|>assistant\n"
    want_chat = client.completions.create(model=MODEL, prompt=rendered, max_tokens=24,
                                          temperature=0).choices[0].text
    r = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=24, temperature=0)
    check(r.choices[0].message.role == "assistant" and r.choices[0].message.content == want_chat
          and r.object == "chat.completion" and r.usage.prompt_tokens == len(rendered.encode()),
          "chat: %r, want %r" % (r.choices[0].message, want_chat))
    chunks = list(client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=24,
                                                 temperature=0, stream=True))
    check(chunks[0].choices[0].delta.role == "assistant", "chat stream: no role first")
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks)
    check(text == want_chat, "chat stream: %r, want %r" % (text, want_chat))
    check(chunks[-1].choices[0].finish_reason in ("stop", "length"), "chat stream finish")
    stop = want_chat[4:6]
    r = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=24, temperature=0,
                                       stop=stop)
    check(r.choices[0].message.content == want_chat[:want_chat.find(stop)] and
          r.choices[0].finish_reason == "stop", "chat stop %r: %r" % (stop, r.choices[0]))
    r = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=3, temperature=0,
                                       logprobs=True, top_logprobs=2)
    content = r.choices[0].logprobs.content
    check(len(content) == 3 and all(len(t.top_logprobs) == 2 and t.logprob <= 0 for t in content),
          "chat logprobs %r" % content)

    raises(lambda: client.completions.create(model="gpt-4", prompt="a"), openai.NotFoundError,
           status_code=404, code="model_not_found", param="model")
    raises(lambda: client.completions.create(model=MODEL, prompt="a", n=2),
           openai.BadRequestError, status_code=400, param="n")
    raises(lambda: client.chat.completions.create(model=MODEL, messages=msgs, temperature=-1),
           openai.BadRequestError, status_code=400, param="temperature")
    raises(lambda: client.completions.create(model=MODEL, prompt="abc", max_tokens=20000),
           openai.BadRequestError, status_code=400, code="context_length_exceeded")


def main():
    tmp = tempfile.mkdtemp()
    try:
        model = tmp + "/" + MODEL
        make_model(model)
        server, port, log = start_server(model)
        try:
            run(port)
        finally:
            rc = stop_server(server)
            check(rc == 0, "the server exited %s on SIGTERM: %s" % (rc, "".join(log)))
    finally:
        shutil.rmtree(tmp)
    print("test_http_openai (openai %s): %d failures" % (openai.__version__, len(failures)))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
