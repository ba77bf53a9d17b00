#!/usr/bin/env python3
"""test_http_load.py — `moec serve --http` under 100 concurrent streaming
clients, with the standard library alone (http.client, sockets, threads), on
the CPU backend, loopback only, bounded in count and time.

First each of 100 prompts is answered whole (greedy, its own max_tokens).
Then, while two clients stall (one sent half its headers, one half its body,
neither reads) and a third streams a long answer it never reads, the 100
stream the same requests at once: every stream is complete and correct
(status, content type, one id, chunks of the right object and model,
finish_reason on the last choice chunk, the usage chunk, data: [DONE] last)
and its text, finish reason and token count are those of the whole answer.
The stalled clients are still connected at the end, so nothing waited for
them to time out. A client that goes away mid-stream has its request
cancelled (the metrics count it, nothing is left running), and the service
then answers as before and stops cleanly on SIGTERM."""
import http.client
import json
import shutil
import socket
import sys
import tempfile
import threading
import time

from http_lib import make_model, start_server, stop_server

CLIENTS = 100
failures = []


def fail(msg):
    failures.append(msg)
    print("FAIL:", msg[:2000], flush=True)


def post(port, body, timeout=120):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    c.request("POST", "/v1/completions", body=json.dumps(body),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, data


def metrics(port):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    c.close()
    return {l.split(" ")[0]: float(l.split(" ")[1]) for l in text.splitlines()
            if l and not l.startswith("#")}


def read_stream(resp):
    """The data lines of an SSE answer, read as they come."""
    events = []
    pending = b""
    while True:
        line = resp.readline()
        if not line:
            break
        if line == b"\n":
            if pending:
                events.append(pending.decode())
            pending = b""
            continue
        if not line.startswith(b"data: "):
            raise ValueError("not an SSE data line: %r" % line)
        pending += line[6:].rstrip(b"\n")
        if pending == b"[DONE]":
            events.append("[DONE]")
            pending = b""
    return events


def check_stream(i, status, ctype, events, ref, model):
    where = "client %d" % i
    if status != 200 or not ctype.startswith("text/event-stream"):
        return fail("%s: status %s, content type %s" % (where, status, ctype))
    if not events or events[-1] != "[DONE]" or events.count("[DONE]") != 1:
        return fail("%s: the stream does not end with one [DONE]: %r" % (where, events[-3:]))
    chunks = [json.loads(e) for e in events[:-1]]
    if len({c["id"] for c in chunks}) != 1 or not chunks[0]["id"].startswith("cmpl-"):
        return fail("%s: ids %r" % (where, {c["id"] for c in chunks}))
    if any(c["object"] != "text_completion" or c["model"] != model for c in chunks):
        return fail("%s: a chunk of the wrong object or model" % where)
    usage, choices = chunks[-1], chunks[:-1]
    if usage["choices"] != [] or usage["usage"] != ref["usage"]:
        return fail("%s: usage chunk %r, want %r" % (where, usage, ref["usage"]))
    finishes = [c["choices"][0]["finish_reason"] for c in choices]
    if finishes[-1] != ref["choices"][0]["finish_reason"] or any(finishes[:-1]):
        return fail("%s: finish reasons %r" % (where, finishes))
    text = "".join(c["choices"][0]["text"] for c in choices)
    if text != ref["choices"][0]["text"]:
        return fail("%s: streamed %r, the whole answer is %r" % (where, text,
                                                                  ref["choices"][0]["text"]))
    return True


def main():
    tmp = tempfile.mkdtemp()
    try:
        model = tmp + "/tiny-v2"
        make_model(model)
        server, port, log = start_server(model, "--max-connections", "256", "--max-seqs", "16",
                                         "--http-timeout", "600")
        try:
            run(port, log)
        finally:
            rc = stop_server(server)
            if rc != 0:
                fail("the server exited %s on SIGTERM: %s" % (rc, "".join(log)))
    finally:
        shutil.rmtree(tmp)
    print("test_http_load: %d failures" % len(failures))
    return 1 if failures else 0


def run(port, log):
    bodies = [{"model": "tiny-v2", "prompt": "Request %d: the quick brown fox %s" % (i, "x" * (i % 7)),
               "max_tokens": 8 + (i * 7) % 33, "temperature": 0} for i in range(CLIENTS)]
    refs = []
    for b in bodies:
        status, data = post(port, b)
        if status != 200:
            return fail("whole answer: %s %s" % (status, data))
        refs.append(json.loads(data))
    if len({r["choices"][0]["text"] for r in refs}) < CLIENTS // 2:
        fail("the prompts give too few different answers to test with")

    # the stalled clients: half the headers, half a body, a stream never read
    stalled = []
    for raw in (b"POST /v1/compl",
                b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: 400\r\n\r\n{\"model\": "):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(raw)
        stalled.append(s)
    slow = socket.create_connection(("127.0.0.1", port))
    slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    body = json.dumps({"model": "tiny-v2", "prompt": "slow", "max_tokens": 3000,
                       "ignore_eos": True, "stream": True}).encode()
    slow.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
                 % (len(body), body))

    results = [None] * CLIENTS
    go = threading.Barrier(CLIENTS)

    def client(i):
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
            body = dict(bodies[i], stream=True, stream_options={"include_usage": True})
            go.wait()
            c.request("POST", "/v1/completions", body=json.dumps(body),
                      headers={"Content-Type": "application/json"})
            r = c.getresponse()
            results[i] = (r.status, r.getheader("Content-Type", ""), read_stream(r))
            c.close()
        except Exception as e:  # reported below, with the others
            results[i] = (None, "", ["%s: %s" % (type(e).__name__, e)])

    threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    good = 0
    for i in range(CLIENTS):
        if results[i] is None:
            fail("client %d never finished" % i)
        elif check_stream(i, *results[i], refs[i], "tiny-v2"):
            good += 1
    print("%d of %d streams complete and equal to the whole answers" % (good, CLIENTS))

    for s in stalled:  # still connected: the others did not wait for them to time out
        s.setblocking(False)
        try:
            s.recv(1, socket.MSG_PEEK)
            fail("a stalled client was answered or closed while the others streamed")
        except BlockingIOError:
            pass
        s.close()

    m0 = metrics(port)
    slow.close()
    # a client that goes away mid-stream
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("POST", "/v1/completions", body=json.dumps(
        {"model": "tiny-v2", "prompt": "leaving", "max_tokens": 8000, "ignore_eos": True,
         "stream": True}))
    r = c.getresponse()
    first = r.readline()
    if not first.startswith(b"data: {"):
        fail("the leaving client's first line: %r" % first)
    c.sock.shutdown(socket.SHUT_RDWR)
    c.close()
    # all at one moment: the leaving request cancelled, nothing running or
    # waiting, no cache block held (polling running == 0 alone once read a
    # transient 0 with the request still running a moment later)
    def settled(m):
        gone = m["moec_requests_cancelled_total"] - m0["moec_requests_cancelled_total"]
        return (gone >= 1 and m["moec_requests_running"] == 0 and m["moec_requests_waiting"] == 0
                and m["moec_kv_blocks_used"] == 0)
    deadline = time.time() + 30
    m1 = metrics(port)
    while not settled(m1) and time.time() < deadline:
        time.sleep(0.05)
        m1 = metrics(port)
    if not settled(m1):
        gone = m1["moec_requests_cancelled_total"] - m0["moec_requests_cancelled_total"]
        fail("after the clients left (30 s): %r cancelled, %r" % (gone, m1))

    status, data = post(port, bodies[3])
    if status != 200 or json.loads(data)["choices"] != refs[3]["choices"]:
        fail("after the load: %s %s" % (status, data))


if __name__ == "__main__":
    sys.exit(main())
