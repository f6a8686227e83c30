"""The HTML report: escaping, section order, plotly inlining, CSP, atomic writes, timeline downsampling."""

from __future__ import annotations

import base64
import hashlib
import html
import json
import re
from pathlib import Path

import numpy as np
import pytest
from _report_data import HOSTILE, STEP_NS, make_summary, make_traces

from traceanalyzer.commands.report import default_output
from traceanalyzer.render import html as ta_html
from traceanalyzer.render import timeline
from traceanalyzer.render.html import json_for_script, render_html

SECTIONS = ["inputs", "headline", "breakdown", "timeline", "exposed", "gaps", "crossrank", "critical", "kernels",
            "metrics", "method"]
JSON_BLOCK = re.compile(r'<script type="application/json" id="([^"]+)">(.*?)</script>', re.S)
SCRIPT = re.compile(r"<script([^>]*)>(.*?)</script>", re.S)


@pytest.fixture(scope="module")
def hostile_page() -> str:
    traces = make_traces(hostile=True)
    return render_html(make_summary(traces, hostile=True), traces, cdn=True)


@pytest.fixture(scope="module")
def page() -> str:
    traces = make_traces()
    return render_html(make_summary(traces), traces)


def test_json_for_script_escapes_and_round_trips() -> None:
    raw = json.dumps({"k": "</script><img src=x onerror=alert(1)> & \u2028\u2029"})
    safe = json_for_script(raw)
    assert not set("<>&\u2028\u2029") & set(safe)
    assert json.loads(safe) == json.loads(raw)


def test_hostile_names_never_reach_markup(hostile_page: str) -> None:
    markup = JSON_BLOCK.sub("", hostile_page)
    lowered = markup.lower()
    assert "<img" not in lowered and "onerror=alert" not in lowered.replace("onerror=alert(1)&gt;", "")
    assert "alert(1)</script>" not in markup and "alert(2)" not in markup.replace("alert(2)&lt;", "")
    assert html.escape(HOSTILE[0]) in markup  # shown, as text
    scripts = [attrs for attrs, _ in SCRIPT.findall(hostile_page)]
    assert len(scripts) == len(JSON_BLOCK.findall(hostile_page)) + 2  # data blocks + plotly CDN + boot script


def test_hostile_names_survive_inside_figure_json(hostile_page: str) -> None:
    blocks = JSON_BLOCK.findall(hostile_page)
    assert blocks
    for _, body in blocks:
        assert "<" not in body and ">" not in body and "&" not in body.replace("\\u0026", "")
    decoded = " ".join(html.unescape(json.dumps(json.loads(body))) for _, body in blocks)
    assert HOSTILE[2].replace("/", "\\/") in decoded or HOSTILE[2] in html.unescape(
        " ".join(json.dumps(json.loads(b), ensure_ascii=False) for _, b in blocks))


def test_sections_in_order_and_findings_by_impact(page: str) -> None:
    positions = [page.index(f'<section id="{s}">') for s in SECTIONS]
    assert positions == sorted(positions)
    assert page.index("All-reduce blocks compute") < page.index("Launch gaps")
    assert "2.000 µs/step · 20.0 % of step" in page


def test_plotly_inlined_once_and_scripts_allowed_by_hash(page: str) -> None:
    from traceanalyzer.render.html import PLOTLY_BUNDLE

    bundle = (Path(ta_html.__file__).parents[1] / "templates" / PLOTLY_BUNDLE).read_text(encoding="utf-8")
    assert bundle.startswith("/**\n* plotly.js (basic - minified) v")  # plotly's own partial bundle
    assert page.count(bundle[:2000]) == 1
    assert "<script src=" not in page
    csp = html.unescape(re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', page).group(1))
    assert "default-src 'none'" in csp and "connect-src 'none'" in csp
    for attrs, body in SCRIPT.findall(page):
        if "application/json" in attrs:
            continue
        digest = base64.b64encode(hashlib.sha256(body.encode()).digest()).decode()
        assert f"'sha256-{digest}'" in csp


def test_cdn_page_is_small_and_references_cdn(hostile_page: str, page: str) -> None:
    from plotly.offline import get_plotlyjs

    sri = "sha256-" + base64.b64encode(hashlib.sha256(get_plotlyjs().encode()).digest()).decode()
    assert re.search(r'<script src="https://cdn\.plot\.ly/plotly-[\d.]+\.min\.js" integrity="'
                     + re.escape(sri) + '" crossorigin="anonymous"', hostile_page)
    assert len(hostile_page.encode()) < 150_000
    assert 1_200_000 < len(page.encode()) < 2_000_000  # the basic bundle inlined (1.19 MB) and the page


def test_figures_cover_the_sections(page: str) -> None:
    ids = [i for i, _ in JSON_BLOCK.findall(page)]
    # breakdown, comm, steps, 2 timelines, layers, collectives, gap histogram, cross-rank, GPU metrics
    assert len(ids) == 10
    for fig_id in ids:
        assert f'data-figure="{fig_id.removesuffix("-data")}"' in page


def test_power_and_metrics_and_notes(page: str) -> None:
    assert "power_log.csv" in page and "301.5" in page
    assert "SMs Active [Throughput %]" in page
    assert "mean: comm_exposed" in page and "<td class=\"num\">3.5</td>" in page
    assert "synthetic data" in page
    assert "profiler_step" in page


@pytest.mark.parametrize(("given", "expected"), [
    (["x/prefill_rank0.json.gz"], "reports/prefill_rank0.html"),
    (["a/tp2.sqlite", "b.sqlite"], "reports/tp2.html"),
    (["runs/step.pt.trace.json"], "reports/step.html"),
    (["runs/h200_kineto"], "reports/h200_kineto.html"),
])
def test_default_output(given: list[str], expected: str) -> None:
    assert default_output(given) == Path(expected)


def test_downsample_caps_rectangles_and_keeps_every_kernel() -> None:
    n = 100_000
    rng = np.random.default_rng(0)
    start = np.cumsum(rng.integers(100, 300, n)).astype(np.int64)
    end = start + rng.integers(20, 90, n)
    stream = rng.integers(0, 3, n).astype(np.int64)
    bucket = np.array(["gemm", "communication"], dtype=object)[(np.arange(n) // 50) % 2]
    name = np.array([f"k{i}" for i in range(n)], dtype=object)
    rects = timeline.downsample(start, end, stream, bucket, name, window_ns=int(end.max() - start.min()))
    assert 0 < len(rects) <= timeline.MAX_RECTS
    assert rects.count.sum() == n
    assert rects.start_ns.min() == start.min() and rects.end_ns.max() == end.max()
    assert set(rects.bucket) == {"gemm", "communication"}


def test_downsample_keeps_long_kernels_and_small_inputs_intact() -> None:
    start = np.array([0, 10, 20, 1000], dtype=np.int64)
    end = np.array([5, 15, 900, 2000], dtype=np.int64)
    stream = np.zeros(4, dtype=np.int64)
    bucket = np.array(["gemm", "gemm", "gemm", "other"], dtype=object)
    name = np.array(["a", "b", "long", "c"], dtype=object)
    rects = timeline.downsample(start, end, stream, bucket, name, window_ns=2000, width_px=100)
    # a and b (5 ns each, pixel = 20 ns) merge; the long gemm and the other-bucket kernel stay alone
    assert rects.count.tolist() == [2, 1, 1]
    assert rects.name[0].startswith("2 kernels")
    assert rects.name[1:].tolist() == ["long", "c"]


def test_downsample_merges_across_buckets_only_as_last_resort() -> None:
    n = 20_000
    start = np.arange(n, dtype=np.int64) * 10
    end = start + 5
    bucket = np.array(["gemm", "other"], dtype=object)[np.arange(n) % 2]
    rects = timeline.downsample(start, end, np.zeros(n, np.int64), bucket, bucket.copy(),
                                window_ns=int(end[-1]), max_rects=100)
    assert len(rects) <= 100 and rects.count.sum() == n


def test_timeline_uses_median_step_and_marks_exposed_comm() -> None:
    traces = make_traces()
    summary = make_summary(traces)
    dev = summary.devices[0]
    dev.per_step = dev.per_step.assign(end_ns=dev.per_step["start_ns"] + [STEP_NS, STEP_NS - 10, STEP_NS - 5])
    window = timeline.representative_window(dev)
    assert window.start_ns == 2 * STEP_NS and "step 2" in window.label
    fig, facts = timeline.timeline_figure(traces[0], dev, escape=html.escape)
    assert facts["kernels"] == 4 and facts["streams"] == 2
    exposed = [t for t in fig.data if t.name.startswith("exposed comm")]
    assert len(exposed) == 1 and np.allclose(exposed[0].x, [0.002])
    comm = next(t for t in fig.data if t.name == "communication")
    assert np.allclose(comm.base, [0.004]) and np.allclose(comm.x, [0.003])


# -- end to end through the real pipeline (the project's own GPU fixtures) -----------------------------------
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
KINETO_PAIR = FIXTURES / "kineto" / "tp2_prefill_overlap"
NSYS_FILE = FIXTURES / "nsys" / "tp2_prefill_serial.sqlite"


def _need(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"{path.name} fixture is absent")
    return path


def test_report_of_kineto_rank_pair(tmp_path: Path) -> None:
    from traceanalyzer.commands.report import report

    written, summary = report([_need(KINETO_PAIR)], output=tmp_path / "out" / "pair.html")
    assert written == tmp_path / "out" / "pair.html"
    assert [d.rank for d in summary.devices] == [0, 1]
    page = written.read_text(encoding="utf-8")
    assert page.count("Timeline of a representative step") == 1
    assert page.count('<h3>rank 0 · GPU 0') == 1 and page.count('<h3>rank 1 · GPU 1') == 1
    assert str(FIXTURES) not in page and str(tmp_path) not in page  # base names only, no directories
    data_bytes = len(page.encode()) - len(ta_html._plotly_js().encode())
    assert data_bytes < 1_000_000  # the report's own part stays small
    assert [p.name for p in written.parent.iterdir()] == ["pair.html"]


def test_report_shows_the_critical_path_of_the_median_step(tmp_path: Path) -> None:
    """The report's critical-path section is ``whatif``'s: the same median step, limiter and splits (which add
    up to the step), drawn with few rectangles."""
    import traceanalyzer as ta
    from traceanalyzer.commands.report import report
    from traceanalyzer.render.whatif import median_path

    written, _ = report([_need(KINETO_PAIR)], output=tmp_path / "pair.html")
    page = written.read_text(encoding="utf-8")
    section = page[page.index('<section id="critical">'):page.index('<section id="kernels">')]
    path = median_path(ta.whatif(str(KINETO_PAIR)))
    assert path is not None and sum(path.by_category.values()) == path.step_ns
    assert f"Median step: rank {path.rank}, step {path.step}," in section
    assert f"What limits it: {html.escape(path.limiter())}." in section
    assert "No-change replay: every traced step within 0.00 %" in section
    for title in ("By kind", "By bucket", "By rank", "By edge"):
        assert f"<h3>{title}</h3>" in section
    assert 0 < section.count("<rect") <= 2 * 1100 and section.count("<rect") <= len(path.segments)


def test_critical_path_drawing_is_bounded_by_pixels_not_stretches() -> None:
    from traceanalyzer.analysis.what_if.replay import PathSegment
    from traceanalyzer.analysis.what_if.simulate import StepPath
    from traceanalyzer.render.whatif import _path_rects

    kinds = [("compute", "gemm"), ("launch", "idle"), ("compute", "attention"), ("host_gap", "host")]
    segments = [PathSegment(i * 10, i * 10 + 10, *kinds[i % 4], rank=i // 50_000, edge="node", node=i)
                for i in range(100_000)]
    path = StepPath(rank=0, step=0, ordinal=0, step_ns=1_000_000, by_category={}, by_bucket={}, by_rank={},
                    by_edge={}, segments=segments)
    rects = _path_rects(path, 1010 / 1_000_000)
    assert len(rects) <= 2 * 1010 + 2  # 100,000 stretches of 0.01 px: about one rectangle per pixel
    assert sum(sum(r.parts.values()) for r in rects) == 1_000_000  # nothing lost
    assert {r.rank for r in rects} == {0, 1}


def test_report_library_writes_only_where_told(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import traceanalyzer as ta

    monkeypatch.chdir(tmp_path)
    page, summary = ta.report(_need(NSYS_FILE), cdn=True)  # no output: the HTML, nothing written
    assert isinstance(page, str) and page.startswith("<!DOCTYPE html>") and len(page) < 1_000_000
    assert list(tmp_path.iterdir()) == []
    assert len(summary.devices) == 2 and summary.traces[0].format == "nsys-sqlite"


def test_report_cli_defaults_to_reports_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    from traceanalyzer.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["report", str(_need(NSYS_FILE)), "--cdn"]) == 0
    assert "report written: reports/tp2_prefill_serial.html" in capsys.readouterr().err
    assert (tmp_path / "reports" / "tp2_prefill_serial.html").stat().st_size < 1_000_000


def test_report_cli_prints_summary_and_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from traceanalyzer.cli import main

    out = tmp_path / "cli.html"
    assert main(["report", str(_need(KINETO_PAIR)), "-o", str(out), "--cdn"]) == 0
    captured = capsys.readouterr()
    assert "Per device" in captured.out and "rank 1 · GPU 1" in captured.out
    assert f"report written: {out}" in captured.err
    assert out.exists()


def test_bad_input_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from traceanalyzer.cli import main

    bad = tmp_path / "empty.json"
    bad.write_text("")
    out = tmp_path / "never.html"
    assert main(["report", str(bad), "-o", str(out)]) == 2
    assert capsys.readouterr().err.startswith(f"Error: {bad}: ")
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["empty.json"]


def test_collective_points_are_binned_beyond_the_cap() -> None:
    from traceanalyzer.render.figures import binned_max

    values = np.arange(10_000, dtype=float)
    x, y, per = binned_max(values, max_points=4000)
    assert per == 3 and len(x) == 3334 and x[1] == 3 and y[0] == 2 and y[-1] == 9999
    x, y, per = binned_max(values[:10], max_points=4000)
    assert per == 1 and np.array_equal(y, values[:10])


def test_method_notes_report_busy_time_outside_steps() -> None:
    from traceanalyzer.render.sections import method_notes

    traces = make_traces()
    summary = make_summary(traces)
    assert method_notes(summary)["excluded"] == []
    summary.devices[0].per_step = summary.devices[0].per_step.assign(busy_ns=7000)
    notes = method_notes(summary)
    assert notes["excluded"] == ["rank 0 · GPU 0: 3.000 µs (12.5 % of busy time) lies outside the 3 steps "
                                 "(warm-up, profiler flush); per-step figures leave it out, window totals include it."]
    assert notes["precedence"] is None and notes["sources"][0]["steps"].startswith("profiler_step, ")


def test_page_without_traces_or_optional_parts() -> None:
    traces = make_traces()
    summary = make_summary(traces)
    summary.cross_rank, summary.power, summary.gpu_metrics, summary.findings = None, None, None, []
    page = render_html(summary, (), cdn=True)
    assert "No timeline: the traces were not available to the renderer." in page
    assert "No cross-rank comparison: no collective matched across ranks." in page
    assert "No findings." in page
    assert "No GPU metric samples in the trace and no power log given (--gpu-log)." in page
    assert "No critical path: the report was made without the traces themselves" in page


def test_single_gpu_without_communication_says_what_does_not_apply() -> None:
    """One GPU, one step, no collective: no empty hidden-vs-exposed chart and no one-point step chart; the page
    says why instead."""
    from dataclasses import replace

    traces = make_traces()[:1]
    summary = make_summary(traces)
    dev = replace(summary.devices[0], comm_ns=0, comm_hidden_ns=0, comm_exposed_ns=0, overlap_pct=None, steps=1,
                  per_step=summary.devices[0].per_step.head(1), collectives=summary.devices[0].collectives.head(0),
                  comm_idle_gaps_ns=summary.devices[0].comm_idle_gaps_ns.head(0))
    summary.devices, summary.cross_rank, summary.findings = [dev], None, []
    page = render_html(summary, traces, cdn=True)
    assert "No communication kernels or peer copies in these traces" in page
    assert "One step found (sources: profiler_step): a step-by-step chart needs two or more" in page
    dev.step_source = "none"
    assert "No steps found (the whole profiled window stands in for one)" in render_html(summary, traces, cdn=True)
    assert "One rank: cross-rank wait, skew and straggler need two or more ranks." in page
    assert "Step by step" not in page and "exposed (SM idle)" not in page
    assert ">none<" in page  # the headline says there is no communication instead of "0 ns exposed"
    assert "<th class=\"num\">exposed</th>" not in page  # the device table drops the communication columns
    full = render_html(make_summary(make_traces()), make_traces(), cdn=True)
    assert "Step by step: duration and exposed communication" in full and "exposed (SM idle)" in full
    assert "<th class=\"num\">exposed</th>" in full


def test_more_rows_expand_and_name_colours_stay_apart() -> None:
    import pandas as pd

    from traceanalyzer.render.formatting import BUCKET_COLORS, EXPOSED_COLOR, HIDDEN_COLOR, RANK_COLORS
    from traceanalyzer.render.sections import MAX_EXPANDED_ROWS, MAX_TABLE_ROWS, frame_table

    df = pd.DataFrame({"name": [f"k{i}" for i in range(MAX_TABLE_ROWS + 15)], "total_ns": range(MAX_TABLE_ROWS + 15)})
    table = frame_table(df)
    assert len(table["rows"]) == MAX_TABLE_ROWS and len(table["more"]) == 15 and table["omitted"] == 0
    assert table["more"][-1] == [f"k{MAX_TABLE_ROWS + 14}", "214 ns"]
    huge = frame_table(pd.DataFrame({"x": range(MAX_TABLE_ROWS + MAX_EXPANDED_ROWS + 7)}))
    assert huge["omitted"] == 7
    traces = make_traces()
    summary = make_summary(traces)
    top = summary.devices[0].top_kernels
    summary.devices[0].top_kernels = pd.concat([top.head(1)] * 15, ignore_index=True).assign(
        name=[f"gemm_{i}" for i in range(15)])  # 15 gemm kernels: 10 shown, 5 behind the expander
    page = render_html(summary, traces, cdn=True)
    assert '<details class="more"><summary>5 more rows</summary>' in page and "gemm_14" in page
    reds = {EXPOSED_COLOR, HIDDEN_COLOR, BUCKET_COLORS["communication"]}
    assert not reds & set(RANK_COLORS)


def test_mangled_names_are_shown_demangled_and_long_durations_in_seconds() -> None:
    from traceanalyzer.render.sections import findings, top_kernel_groups

    mangled = "_ZN7cutlass13device_kernelIN4cute5tupleIJiiEEEEEvNT_6ParamsE"
    traces = make_traces()
    summary = make_summary(traces)
    summary.devices[0].top_kernels = summary.devices[0].top_kernels.assign(name=[mangled, "ncclKernel"])
    summary.findings[0].impact_ns_per_step = 3_139_821_000
    names = [row[0] for g in top_kernel_groups(summary.devices)[0]["groups"] for row in g["table"]["rows"]]
    assert names[0].startswith("cutlass::device_kernel<cute::tuple<int, int>") and mangled not in names
    assert findings(summary)[0]["impact"] == "3.140 s/step"
    page = render_html(summary, traces, cdn=True)
    assert "cutlass::device_kernel&lt;cute::tuple" in page and mangled not in page


def test_layer_totals_leave_out_layers_outside_the_steps() -> None:
    import pandas as pd

    from traceanalyzer.render.figures import layer_totals

    rows = pd.DataFrame({"step": [-1, 0, 1], "layer": [0, 0, 0], "name": "layer_0",
                         "comm_ns": [75_000_000, 1_000, 1_000], "comm_exposed_ns": [75_000_000, 900, 700],
                         "compute_ns": [0, 10, 10]})
    totals = layer_totals(rows)
    assert totals["occurrences"].tolist() == [2] and totals["comm_exposed_ns"].tolist() == [1_600]
