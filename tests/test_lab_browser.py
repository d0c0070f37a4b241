"""Stepping through a notebook is a use of its own: JupyterLab started as `make lab` starts it (headless, a free port,
the venv's kernel, the notebook's tiny preset), notebook 04 opened in headless Chromium and run to its stack picker, a
stack picked and the button pressed; the picked stack's gated row and the frame comparer's slider must appear, and
the button must be disabled while the stack runs.

Chromium is driven over its DevTools protocol (websocket-client, which JupyterLab's server brings). Skipped, saying
why, where Chromium (`make chromium`) or JupyterLab (`pip install .[lab]`, what `make lab` installs) is missing.
Slow (a notebook run in a browser): `make test-all`.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from wmbook.paths import REPO_ROOT

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _missing() -> str | None:
    if CHROMIUM is None:
        return "Debian's `chromium` is not installed (`make chromium`)"
    for mod, what in (("jupyterlab", "JupyterLab (`pip install .[lab]`, as `make lab` does)"),
                      ("websocket", "websocket-client (JupyterLab's server brings it)")):
        try:
            __import__(mod)
        except ImportError:
            return f"{what} is not installed"
    return None


pytestmark = [pytest.mark.slow, pytest.mark.skipif(_missing() is not None, reason=str(_missing()))]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(pred, timeout: float, what: str, poll: float = 1.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = pred()
        if got:
            return got
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


class DevTools:
    """The smallest DevTools-protocol client: evaluate JavaScript in the page."""

    def __init__(self, port: int):
        import urllib.request

        import websocket

        def page():
            try:
                tabs = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/json", timeout=5).read())
            except OSError:
                return None
            return next((t for t in tabs if t.get("type") == "page"), None)

        self.ws = websocket.create_connection(_wait(page, 60, "Chromium's DevTools")["webSocketDebuggerUrl"],
                                              timeout=120)
        self.n = 0

    def js(self, expr: str):
        self.n += 1
        self.ws.send(json.dumps({"id": self.n, "method": "Runtime.evaluate",
                                 "params": {"expression": expr, "awaitPromise": True, "returnByValue": True}}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self.n:
                res = msg.get("result", {})
                if "exceptionDetails" in res:
                    raise AssertionError(f"page script failed: {res['exceptionDetails']}")
                return res.get("result", {}).get("value")


def _notebook(folder: Path) -> Path:
    """Notebook 04 with a short ladder (bf16 only; no other section), so the picker is reached in about a minute."""
    import nbformat

    nb = nbformat.read(REPO_ROOT / "notebooks" / "04_compile_autocast.ipynb", as_version=4)
    cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    cell.source += '\nsections = "ladder"\nladder = "bf16"\nwarmup = 1\nrepeats = 2\ne2e_repeats = 1\n'
    out = folder / "04_compile_autocast.ipynb"
    nbformat.write(nb, out)
    return out


def test_stack_picker_in_jupyterlab(tmp_path):
    nb = _notebook(tmp_path)
    jupyter = tmp_path / "jupyter"
    subprocess.run([sys.executable, "-m", "ipykernel", "install", "--prefix", str(jupyter), "--name", "python3"],
                   check=True, capture_output=True)
    env = dict(os.environ, JUPYTER_PATH=str(jupyter / "share" / "jupyter"), JUPYTER_CONFIG_DIR=str(tmp_path / "cfg"),
               JUPYTER_RUNTIME_DIR=str(tmp_path / "rt"), WMBOOK_RESULTS=str(tmp_path / "results.csv"))
    env.pop("WMBOOK_HEADLESS", None)
    port, token, dt_port = _free_port(), "wmbook-test", _free_port()
    lab = subprocess.Popen([sys.executable, "-m", "jupyter", "lab", "--no-browser", f"--port={port}",
                            f"--ServerApp.token={token}", f"--notebook-dir={tmp_path}", "--allow-root",
                            "--LabApp.expose_app_in_browser=True"], env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    browser = None
    try:
        import urllib.request

        def up():
            try:
                return urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status?token={token}", timeout=3).status
            except OSError:
                return None

        _wait(up, 120, "JupyterLab to start")
        browser = subprocess.Popen([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                                    "--disable-dev-shm-usage", f"--remote-debugging-port={dt_port}",
                                    "--window-size=1400,1000",
                                    f"http://127.0.0.1:{port}/lab/tree/{nb.name}?token={token}"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        page = DevTools(dt_port)
        _wait(lambda: page.js("!!(window.jupyterapp && document.querySelector('.jp-Notebook .jp-Cell'))"), 120,
              "the notebook to open")
        _wait(lambda: page.js("(() => { const w = jupyterapp.shell.currentWidget; return !!(w && w.sessionContext "
                              "&& w.sessionContext.session && w.sessionContext.session.kernel && "
                              "w.sessionContext.session.kernel.connectionStatus === 'connected'); })()"), 120,
              "the kernel")
        page.js("(jupyterapp.commands.execute('notebook:run-all-cells'), true)")  # not awaited: it runs for minutes
        button = ("[...document.querySelectorAll('.jp-OutputArea button')]"
                  ".find(b => /apply, gate, time/.test(b.textContent))")
        _wait(lambda: page.js(f"!!({button})"), 600, "the stack picker", poll=2)
        chose = page.js("(() => { const s = document.querySelector('.widget-select-multiple select'); "
                        "const o = [...s.options].find(o => o.textContent.trim() === 'bf16'); o.selected = true; "
                        "s.dispatchEvent(new Event('change', {bubbles: true})); return o.textContent; })()")
        assert chose.strip() == "bf16"
        time.sleep(1)  # the selection reaches the kernel before the click
        page.js(f"{button}.click()")
        busy = _wait(lambda: page.js("[...document.querySelectorAll('.jp-OutputArea button')].some(b => b.disabled)"),
                     30, "the button to be disabled while the stack runs", poll=0.2)
        assert busy
        caption = "The picked stack"
        _wait(lambda: page.js(f"document.body.innerText.includes('{caption}')"), 600, "the picked stack's row", poll=2)
        row = page.js("(() => { const t = [...document.querySelectorAll('table')].find(t => "
                      f"t.innerText.includes('{caption}')); return t ? t.innerText : ''; }})()")
        assert "bf16" in row and "pass" in row, row  # the gated row of the picked stack
        slider = _wait(lambda: page.js("[...document.querySelectorAll('.widget-slider, .widget-hslider')].some("
                                       "s => s.innerText.includes('frame'))"), 300, "the frame slider", poll=2)
        assert slider
        assert _wait(lambda: page.js(f"!{button}.disabled"), 60, "the button to be enabled again")
    finally:
        for p in (browser, lab):
            if p is not None:
                p.terminate()
                try:
                    p.wait(20)
                except subprocess.TimeoutExpired:
                    p.kill()
