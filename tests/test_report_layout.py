"""The report of an 8-rank tensor-parallel serving export (78 layers, 4 passes, every rank the same kernels by
construction: tests/test_structure_serving.py): at most 2 MB offline, one timeline drawn for the 8 identical ranks
with the other 7 listed, a zoom onto one layer, GPUs named once in the inputs table, and in headless Chromium no
JavaScript error and no sideways scroll at 1280 and 1400 px."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import numpy as np
import pytest
from test_report_browser import DevTools, browser, open_report  # noqa: F401 (the browser fixture)
from test_structure_serving import LAYERS, RANKS, _export

import traceanalyzer as ta

MAX_BYTES = 2_000_000


@pytest.fixture(scope="module")
def serving_report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, ta.Summary]:
    folder = tmp_path_factory.mktemp("serving_report")
    export, _ = _export(folder / "serve8.sqlite")
    return ta.report(export, output=folder / "serve8.html")


def test_size_timelines_zoom_inputs(serving_report: tuple[Path, ta.Summary]):
    page_path, summary = serving_report
    assert len(summary.devices) == RANKS
    page = page_path.read_text(encoding="utf-8")
    assert len(page.encode()) <= MAX_BYTES  # was 6.3 MB with the full plotly.js and 8 full timelines
    timeline = page[page.index('<section id="timeline">'):page.index('<section id="exposed">')]
    assert timeline.count('<div class="plot"') == 2  # one representative timeline + the layer zoom
    assert "7 more device(s) ran the same activities in the same order" in timeline
    assert all(f"rank {r} · GPU {r}" in timeline for r in range(RANKS))
    # the zoom: the layer with the most exposed communication of the drawn step — every layer has two 15 µs
    # all-reduces with nothing beside them, so the first one on ties: layer_0, which holds the embedding gather
    # before its 6 attention and 8 MoE kernels (15 kernels, 115 µs with the 500 ns gaps), drawn whole
    zoom = re.search(r"<h3>Zoom: rank 0 · GPU 0[^<]*— layer_0 of step \d+ [^<]*· 115.0 µs · exposed comm 30.00 µs",
                     timeline)
    assert zoom is not None
    assert "(15 activities, 15 rectangles)" in timeline
    inputs = page[page.index('<section id="inputs">'):page.index('<section id="headline">')]
    assert inputs.count("RTX PRO 6000") == 1 and f"{RANKS} × NVIDIA RTX PRO 6000" in inputs
    assert f"{LAYERS}" in page


def test_no_sideways_scroll_and_no_errors(browser: DevTools, serving_report: tuple[Path, ta.Summary]):  # noqa: F811
    page_path, _ = serving_report
    for width in (1280, 1400):
        browser.call("Emulation.setDeviceMetricsOverride", session=True, width=width, height=900,
                     deviceScaleFactor=1, mobile=False)
        probe = open_report(browser, page_path)
        assert probe["errors"] == [] and probe["remote_requests"] == [] and probe["plotErrors"] == 0
        overflow = json.loads(browser.call("Runtime.evaluate", session=True, returnByValue=True, expression="""
            JSON.stringify({scroll: document.documentElement.scrollWidth,
                            client: document.documentElement.clientWidth})""")["result"]["value"])
        assert overflow["scroll"] <= overflow["client"] and overflow["client"] > width - 30, (width, overflow)


def test_per_layer_chart_stays_readable(serving_report: tuple[Path, ta.Summary]):
    """78 layers × 8 ranks: one bar per layer (the median over the devices) with whiskers for their range, not 624
    grouped bars. Every layer has two 15 µs all-reduces with nothing beside them: 0.030 ms exposed on every rank."""
    page = serving_report[0].read_text(encoding="utf-8")
    figures = [json.loads(body) for body in re.findall(r'<script type="application/json" id="fig\d+-data">(.*?)'
                                                       r'</script>', page, re.S)]
    layer = [f for f in figures if f["layout"].get("xaxis", {}).get("title", {}).get("text") == "layer"]
    assert len(layer) == 1 and len(layer[0]["data"]) == 1
    bars = layer[0]["data"][0]
    assert len(bars["x"]) == LAYERS and bars["name"] == f"median of {RANKS} devices"
    assert bars["error_y"]["type"] == "data"
    y = bars["y"]  # plotly writes numbers as a typed array: {"dtype": "f8", "bdata": base64}
    values = np.frombuffer(base64.b64decode(y["bdata"]), dtype=y["dtype"]) if isinstance(y, dict) else np.array(y)
    assert np.allclose(values, 0.030)
