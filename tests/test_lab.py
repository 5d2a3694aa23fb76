"""`make lab` starts JupyterLab on notebooks/, runs a kernel, and leaves nothing running.

The server is started as `make lab` starts it (`-o setup` skips the venv step), with a free
port, a token and no browser, in its own session. The test talks to it through the REST
API only (urllib; the first request retried until the server accepts connections, which on a
loaded machine may come after it prints its URL): the notebooks are listed, a kernel is started
and answers on its heartbeat port, then /api/shutdown stops everything. Every process seen under `make` (the
server, the kernel) must be gone or a zombie afterwards. Every wait is bounded; the
`finally` kills whatever is left, by process group and by pid.
"""

import http.client
import json
import os
import secrets
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stat(pid):
    """(state, ppid, start time) of a live or zombie process, None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = text[text.rindex(")") + 2:].split()  # fields 3.. of proc(5); comm may hold spaces
    return fields[0], int(fields[1]), int(fields[19])


def _cmdline(pid):
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except (FileNotFoundError, ProcessLookupError):
        return "<gone>"


def _descendants(root):
    """{pid: start time} of every process below `root`, from /proc."""
    children = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (st := _stat(int(entry.name))):
            children.setdefault(st[1], []).append((int(entry.name), st[2]))
    found, todo = {}, [root]
    while todo:
        for pid, start in children.get(todo.pop(), []):
            found[pid] = start
            todo.append(pid)
    return found


def _running(pid, start):
    """True while the process that had this pid and start time is alive (not a zombie)."""
    st = _stat(pid)
    return st is not None and st[2] == start and st[0] != "Z"


def _wait(ready, seconds, what, context):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if ready():
            return
        time.sleep(0.1)
    pytest.fail(f"timed out after {seconds} s waiting for {what}\n{context()}")


def _answered(call, seconds, what, context):
    """``call()``'s result, retried while the server refuses or drops the connection: a server that has
    printed its URL may not accept connections yet on a loaded machine. A deadline, not a timing check."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            return call()
        except (ConnectionError, urllib.error.URLError) as err:  # (RemoteDisconnected is a ConnectionError)
            if isinstance(err, urllib.error.HTTPError):  # the server answered: an answer, not a refusal
                raise
            if time.monotonic() >= deadline:
                pytest.fail(f"no answer from {what} within {seconds} s ({err})\n{context()}")
            time.sleep(0.2)


def test_answered_retries_a_refused_connection_until_it_answers():
    refusals = [urllib.error.URLError(ConnectionRefusedError(111, "Connection refused")),
                ConnectionResetError(104, "Connection reset by peer"), http.client.RemoteDisconnected("closed")]

    def call():
        if refusals:
            raise refusals.pop(0)
        return 200, {"content": []}

    assert _answered(call, 60, "the test server", str) == (200, {"content": []}) and not refusals


def _can_connect(ip, port):
    try:
        socket.create_connection((ip, port), timeout=1).close()
        return True
    except OSError:
        return False


def test_make_lab_lists_notebooks_runs_a_kernel_and_cleans_up(tmp_path):
    port, token = _free_port(), secrets.token_hex(16)
    base = f"http://127.0.0.1:{port}"
    flags = f"--no-browser --ip=127.0.0.1 --port={port} --port-retries=0 --IdentityProvider.token={token}"
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    env.update(JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"), IPYTHONDIR=str(tmp_path / "ipython"))
    log_path = tmp_path / "lab.log"

    def api(path, method="GET", body=None):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(base + path, data=data, method=method,
                                     headers={"Authorization": f"token {token}"})
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read() or b"null")

    def context():
        code = make.poll()
        state = "still running" if code is None else f"exited with {code}"
        return f"make lab {state}; its output:\n{log_path.read_text()[-4000:]}"

    with open(log_path, "w") as log:
        make = subprocess.Popen(["make", "--no-print-directory", "-o", "setup", "lab", f"LAB_FLAGS={flags}"],
                                cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    seen = {}  # pid -> start time of every process seen under make
    try:
        def started():
            out = log_path.read_text()
            assert make.poll() is None, f"make lab stopped before serving\n{context()}"
            return "is running at" in out and f"127.0.0.1:{port}/lab" in out
        _wait(started, 120, "the server's 'is running at ... 127.0.0.1:PORT/lab' line", context)

        status, listing = _answered(lambda: api("/api/contents/"), 60, "GET /api/contents/", context)
        assert status == 200, f"GET /api/contents/ answered {status}: {listing}"
        shown = {item["name"] for item in listing["content"] if item["type"] == "notebook"}
        expected = {p.name for p in (ROOT / "notebooks").glob("*.ipynb")}
        assert expected, "no notebooks/*.ipynb in the repository to look for"
        assert expected <= shown, \
            f"/api/contents/ lacks notebooks {sorted(expected - shown)}; shows {sorted(shown)}"

        status, kernel = api("/api/kernels", "POST", {})
        assert status == 201, f"POST /api/kernels answered {status}: {kernel}"
        status, listed = api("/api/kernels")
        assert kernel["id"] in {k["id"] for k in listed}, \
            f"new kernel {kernel['id']} not in /api/kernels: {listed}"

        def kernel_pid():
            seen.update(_descendants(make.pid))
            return next((p for p in seen if f"kernel-{kernel['id']}.json" in _cmdline(p)), None)
        _wait(kernel_pid, 30, f"the process of kernel {kernel['id']}", context)
        pid = kernel_pid()
        conn_file = _cmdline(pid).split(" -f ")[1].split()[0]
        conn = json.loads(Path(conn_file).read_text())

        def kernel_alive():
            assert _running(pid, seen[pid]), f"kernel process {pid} died\n{context()}"
            return _can_connect(conn["ip"], conn["hb_port"])
        _wait(kernel_alive, 30, f"kernel {pid} to listen on its heartbeat port {conn['hb_port']}", context)
        seen.update(_descendants(make.pid))

        status, _ = api("/api/shutdown", "POST")
        assert status == 200, f"POST /api/shutdown answered {status}"
        try:
            code = make.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail(f"make lab still running 30 s after /api/shutdown\n{context()}")
        assert code == 0, f"make lab exited with {code} after /api/shutdown\n{context()}"

        def left():
            return {p: _cmdline(p) for p, start in seen.items() if _running(p, start)}
        _wait(lambda: not left(), 15, "the server's processes to end", lambda: f"still running: {left()}")
        assert len(seen) >= 2, f"expected the server and a kernel under make, saw {seen}"
    finally:
        seen.update(_descendants(make.pid))
        try:
            os.killpg(make.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        for p, start in seen.items():  # the kernel runs in a session of its own
            if _running(p, start):
                os.kill(p, signal.SIGKILL)
        make.wait(timeout=10)
