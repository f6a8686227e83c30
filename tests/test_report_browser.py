"""The HTML report in a real headless Chromium, driven over the Chrome DevTools Protocol.

Checks: no JavaScript error or CSP violation, the plots render, no network request leaves the page, and hostile
kernel/NVTX/file names execute nothing. Skips when no Chromium binary (or websocket-client) is installed:
Debian ``apt-get install chromium``; ``pip install websocket-client`` (the ``test`` extra).
"""

from __future__ import annotations

import gzip
import itertools
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _report_data import HOSTILE, make_summary, make_traces

from traceanalyzer.commands.output import write_output
from traceanalyzer.render.html import render_html

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")
_INSTRUMENT = """
window.__executed = [];
window.alert = function (m) { window.__executed.push(String(m)); };
"""
_PROBE = """JSON.stringify({
  plots: document.querySelectorAll('.js-plotly-plot').length,
  svgs: document.querySelectorAll('.main-svg').length,
  plotErrors: document.querySelectorAll('.plot-error').length,
  images: document.querySelectorAll('img').length,
  foreignScripts: Array.from(document.scripts).filter(s => s.type !== 'application/json').length,
  executed: window.__executed,
  title: document.title,
  bodyText: document.body.innerText
})"""


def _chromium() -> str:
    found = shutil.which(os.environ.get("CHROMIUM", "")) or next((p for p in map(shutil.which, BROWSERS) if p), None)
    if not found:
        pytest.skip("no Chromium binary found (apt-get install chromium, or set CHROMIUM=/path/to/chrome)")
    return found


class DevTools:
    """A minimal CDP client: one page target, events collected while waiting for replies."""

    def __init__(self, ws_url: str) -> None:
        websocket = pytest.importorskip("websocket", reason="websocket-client is not installed (test extra)")
        self.ws = websocket.create_connection(ws_url, timeout=30, suppress_origin=True)
        self.ids = itertools.count(1)
        self.events: list[dict[str, Any]] = []
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]

    def call(self, method: str, session: bool = False, **params: Any) -> dict[str, Any]:
        msg_id = next(self.ids)
        msg: dict[str, Any] = {"id": msg_id, "method": method, "params": params}
        if session:
            msg["sessionId"] = self.session
        self.ws.send(json.dumps(msg))
        while True:
            reply = json.loads(self.ws.recv())
            if reply.get("id") == msg_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_for(self, method: str, timeout_s: float = 30) -> None:
        deadline = time.monotonic() + timeout_s
        while not any(e.get("method") == method for e in self.events):
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {method} within {timeout_s} s")
            self.events.append(json.loads(self.ws.recv()))

    def drain(self, seconds: float) -> None:
        self.ws.settimeout(0.2)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            try:
                self.events.append(json.loads(self.ws.recv()))
            except Exception:  # timeout: nothing more arrived
                continue
        self.ws.settimeout(30)


@pytest.fixture(scope="module")
def browser() -> Iterator[DevTools]:
    binary = _chromium()
    # Chromium may still be writing its profile as it exits: a leftover file must not fail the test
    with tempfile.TemporaryDirectory(prefix="ta-chromium-", ignore_cleanup_errors=True) as profile:
        proc = subprocess.Popen(
            [binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-extensions",
             "--disable-dev-shm-usage", f"--user-data-dir={profile}", "--remote-debugging-port=0",
             "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            port_file = Path(profile) / "DevToolsActivePort"
            deadline = time.monotonic() + 30
            while not (port_file.exists() and len(port_file.read_text().splitlines()) >= 2):
                if time.monotonic() > deadline or proc.poll() is not None:
                    pytest.fail("Chromium did not open its DevTools port")
                time.sleep(0.1)
            port, path = port_file.read_text().splitlines()[:2]
            yield DevTools(f"ws://127.0.0.1:{port}{path}")
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()


def open_report(dt: DevTools, path: Path) -> dict[str, Any]:
    """Load ``path`` in the page; return the DOM probe, errors and non-local requests seen."""
    dt.events.clear()
    for domain in ("Page", "Runtime", "Log", "Network"):
        dt.call(f"{domain}.enable", session=True)
    dt.call("Page.addScriptToEvaluateOnNewDocument", session=True, source=_INSTRUMENT)
    dt.call("Page.navigate", session=True, url=path.resolve().as_uri())
    dt.wait_for("Page.loadEventFired")
    dt.drain(0.3)  # late console messages and requests
    probe = json.loads(dt.call("Runtime.evaluate", session=True, expression=_PROBE,
                               returnByValue=True)["result"]["value"])
    errors = []
    for e in dt.events:
        method, params = e.get("method"), e.get("params", {})
        if method == "Runtime.exceptionThrown":
            errors.append(params["exceptionDetails"].get("exception", {}).get("description", str(params)))
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            errors.append(str(params.get("args")))
        elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
            errors.append(params["entry"].get("text", ""))
        elif method == "Page.javascriptDialogOpening":
            probe["executed"].append(params.get("message"))
    requests = [e["params"]["request"]["url"] for e in dt.events if e.get("method") == "Network.requestWillBeSent"]
    probe["errors"] = errors
    probe["remote_requests"] = [u for u in requests if not u.startswith(("file:", "data:", "blob:", "about:"))]
    return probe


FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "kineto"
H200_PAIR = FIXTURES / "tp2_prefill_overlap"  # real 2×H200 Kineto traces made by examples/


def _h200_pair() -> Path:
    if not H200_PAIR.is_dir():
        pytest.skip("fixtures/kineto/tp2_prefill_overlap is absent")
    return H200_PAIR


def _assert_clean(probe: dict[str, Any]) -> None:
    assert probe["errors"] == []
    assert probe["remote_requests"] == []
    assert probe["executed"] == []
    assert probe["plotErrors"] == 0
    assert probe["plots"] >= 4 and probe["svgs"] >= 4


def test_h200_report_renders_without_errors_or_network(browser: DevTools, tmp_path: Path) -> None:
    from traceanalyzer.commands.report import report

    page, _ = report([_h200_pair()], output=tmp_path / "h200.html")
    probe = open_report(browser, page)
    _assert_clean(probe)
    assert probe["plots"] >= 8  # breakdown, comm, 2 timelines, layers, collectives, SM-idle, cross-rank
    assert "Headline numbers and findings" in probe["bodyText"]


def _hostile_copy(src: Path, dst: Path) -> Path:
    """The fixture's rank traces with hostile kernel names, NVTX/annotation names and file names."""
    dst.mkdir()
    for i, trace in enumerate(sorted(src.glob("*.json.gz"))):
        doc = json.loads(gzip.decompress(trace.read_bytes()))
        for j, event in enumerate(doc["traceEvents"]):
            cat, name = event.get("cat"), str(event.get("name", ""))
            if cat == "kernel" or (cat in ("user_annotation", "gpu_user_annotation")
                                   and not name.startswith("ProfilerStep")):
                event["name"] = name + HOSTILE[j % len(HOSTILE)]
        (dst / f"{HOSTILE[1]}_rank{i}.json").write_text(json.dumps(doc), encoding="utf-8")
    return dst


def test_hostile_trace_executes_nothing(browser: DevTools, tmp_path: Path) -> None:
    from traceanalyzer.commands.report import report

    traces = _hostile_copy(_h200_pair(), tmp_path / "hostile")
    page, summary = report([traces], output=tmp_path / "hostile.html")
    assert len(summary.devices) == 2
    probe = open_report(browser, page)
    _assert_clean(probe)
    assert probe["images"] == 0  # the <img onerror> names stayed text
    assert probe["foreignScripts"] == 2  # plotly.js and the page's own boot script, nothing injected
    assert HOSTILE[1] in probe["bodyText"]  # the file names are shown, literally


def test_hostile_results_execute_nothing(browser: DevTools, tmp_path: Path) -> None:
    traces = make_traces(hostile=True)
    page = tmp_path / "results.html"
    write_output(render_html(make_summary(traces, hostile=True), traces), page)
    probe = open_report(browser, page)
    _assert_clean(probe)
    assert probe["images"] == 0
    assert probe["foreignScripts"] == 2
    assert "<script>alert(1)</script>" in probe["bodyText"]  # finding title and layer name, shown as text
