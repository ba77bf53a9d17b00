"""http_lib.py — what the HTTP API's Python tests share: the model folder
(tests/http_lib.sh's http_model), and `moec serve --http 0` started on it
and stopped."""
import os
import re
import signal
import subprocess
import sys
import threading
import time

B = os.environ["MOEC_BUILD_DIR"]
S = os.environ["MOEC_SOURCE_DIR"]


def make_model(path):
    """The tiny deepseek_v2 with the byte tokenizer and a ChatML template."""
    subprocess.run(["bash", "-c", 'source "$1/tests/http_lib.sh" && http_model "$2"', "_", S,
                    path], check=True)


def start_server(model, *args):
    """moec serve MODEL --backend cpu --http 0 ARGS: (process, port, its stderr
    lines, gathered as they come). Exits the test when it does not start."""
    p = subprocess.Popen([B + "/moec", "serve", model, "--backend", "cpu", "--http", "0", *args],
                         stderr=subprocess.PIPE, text=True)
    lines, port = [], None
    deadline = time.time() + 30
    while port is None and time.time() < deadline:
        line = p.stderr.readline()
        if not line:
            break
        lines.append(line)
        m = re.search(r"HTTP API of model .* on 127\.0\.0\.1:(\d+)", line)
        if m:
            port = int(m.group(1))
    if port is None:
        p.kill()
        sys.exit("the server did not start: " + "".join(lines))
    threading.Thread(target=lambda: lines.extend(p.stderr), daemon=True).start()
    return p, port, lines


def stop_server(p):
    """SIGTERM; its exit code, or a string when it had to be killed."""
    p.send_signal(signal.SIGTERM)
    try:
        return p.wait(60)
    except subprocess.TimeoutExpired:
        p.kill()
        return "none (killed after 60 s)"
