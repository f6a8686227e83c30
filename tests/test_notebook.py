"""What notebooks see: a compact HTML view of a Summary, typed entry points, helpful errors, JSON's names."""

from __future__ import annotations

import inspect
import json
import sys
import typing
from pathlib import Path

import pytest
from _report_data import make_summary, make_traces

import traceanalyzer as ta
from traceanalyzer.render.notebook import html_table

REPO = Path(__file__).resolve().parents[1]
KINETO_DIR = REPO / "fixtures" / "kineto" / "tp2_prefill_serial"


def test_summary_repr_html_is_compact_and_escaped() -> None:
    summary = make_summary(make_traces(hostile=True), hostile=True)
    summary.findings[0].title = "<script>alert(1)</script>"
    page = summary._repr_html_()
    assert page.startswith("<div>") and len(page) < 6000
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert "devices (.devices)" in page and "findings (.findings)" in page
    assert "28.00 µs" in page and "2.000 µs per step" in page  # span and the what-if, with units
    assert "DeviceSummary(" not in page and "per_step=" not in repr(summary)


def test_html_table_is_reusable_for_other_results() -> None:
    table = html_table(["metric", "before", "after"], [["step", "1 ms", "2 ms"]] * 20, numeric=[False, True, True],
                       caption="diff", max_rows=3)
    assert table.count("<tr>") == 1 + 3 + 1 and "… 17 more" in table and "<caption" in table


def test_entry_points_have_typed_signatures() -> None:
    for fn in (ta.summary, ta.report, ta.export):
        params = inspect.signature(fn).parameters.values()
        assert not [p for p in params if p.kind is inspect.Parameter.VAR_KEYWORD], fn.__name__
        hints = typing.get_type_hints(fn, globalns=vars(sys.modules[fn.__module__]) | {
            "Summary": object, "ExportResult": object, "PerfettoResult": object, "ProgressFn": object})
        assert "return" in hints and hints["return"] is not typing.Any
    assert "step_range" in inspect.signature(ta.summary).parameters
    assert {"output", "cdn"} <= set(inspect.signature(ta.report).parameters)


def test_module_imports_do_not_replace_the_functions() -> None:
    import importlib

    importlib.import_module("traceanalyzer.commands.report")
    importlib.import_module("traceanalyzer.commands.export")
    assert callable(ta.report) and callable(ta.export) and ta.report.__module__ == "traceanalyzer.api"


def test_df_of_a_missing_table_lists_the_tables() -> None:
    trace = make_traces()[0]
    with pytest.raises(KeyError, match="no table 'nope'; tables: kernels, memops, ranges"):
        trace.df("nope")


def test_device_attributes_use_the_json_names() -> None:
    summary = ta.summary([KINETO_DIR])
    payload = json.loads(json.dumps(summary.to_json()))
    for dev, js in zip(summary.devices, payload["devices"], strict=True):
        assert dev.kernels == js["kernels"] and dev.memops == js["memops"] and dev.layers == js["layers"]
        assert list(dev.window_ns) == js["window_ns"] and dev.warnings == js["warnings"]
        assert dev.layers == len(dev.per_layer)
    assert summary.warnings == payload["warnings"]
    assert [list(t.window_ns) for t in summary.traces] == [t["window_ns"] for t in payload["traces"]]


def test_top_kernels_keep_the_raw_name_and_show_the_demangled_one() -> None:
    summary = ta.summary([KINETO_DIR])
    top = summary.devices[0].top_kernels
    mangled = top[top["name"].astype(str).str.startswith("_ZN7cutlass")]
    assert len(mangled) == 1
    assert mangled["display_name"].iloc[0].startswith("cutlass::device_kernel<at::cuda::detail::enable_3x_kernel")
    plain = top[~top["name"].astype(str).str.startswith("_Z")]
    assert (plain["display_name"] == plain["name"]).all()
