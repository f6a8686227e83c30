"""Terminal renderers: plain text when not a TTY, trace strings printed literally, the expected rows."""

from __future__ import annotations

import io
from dataclasses import dataclass

from _report_data import make_summary, make_traces

from traceanalyzer.render.terminal import make_console, print_classification, print_info, print_summary


def _capture(fn, *args) -> str:  # type: ignore[no-untyped-def]
    buf = io.StringIO()
    if len(args) > 2:  # print_info(path, result, console, err_console)
        fn(args[0], args[1], make_console(buf), args[3])
    else:
        fn(*args, console=make_console(buf))
    return buf.getvalue()


def test_summary_plain_text_with_all_parts() -> None:
    traces = make_traces()
    out = _capture(print_summary, make_summary(traces))
    assert "\x1b[" not in out  # no colour codes off a terminal
    assert "2 device(s): NVIDIA H200" in out and "rank 1 · GPU 1" in out
    row = next(line for line in out.splitlines() if line.strip().startswith("rank 0 · GPU 0"))
    for cell in ("28.00 µs", "24.00 µs", "9.000 µs", "3.000 µs", "6.000 µs", "33.3 %", "10.00 µs", "2.000 µs"):
        assert cell in row
    assert out.index("All-reduce blocks compute") < out.index("Launch gaps")
    assert "If communication were free: 2.000 µs per step (basis: gpu_transfer)" in out
    assert "waited for (straggler): rank 1" in out
    assert "wait over the whole window: rank 0: 1.500 µs" in out  # no per-step waits: labelled as a total
    assert "12.00 µs 50 %" in out  # gemm exclusive time and share of busy


def test_trace_strings_are_not_rich_markup() -> None:
    traces = make_traces(hostile=True)
    summary = make_summary(traces, hostile=True)
    summary.findings[0].title = "[bold red]boom[/bold red] <script>alert(1)</script>"
    out = _capture(print_summary, summary)
    assert "[bold red]boom[/bold red] <script>alert(1)</script>" in out


def test_info_lists_devices_and_counts() -> None:
    result = {"format": "kineto-json", "tool_version": "2.11.0", "schema_version": None, "ranks": [0],
              "devices": [{"device": 0, "name": "NVIDIA H200", "rank": 0}],
              "counts": {"kernels": 12345, "memcpy": 2, "memset": 0, "nvtx_ranges": 7, "gpu_metrics_samples": 0},
              "warnings": ["clock [unknown]"]}
    err = io.StringIO()
    out = _capture(print_info, "/some/dir/run_rank0.json.gz", result, None, make_console(err))
    assert out.startswith("run_rank0.json.gz: kineto-json")
    assert "/some/dir" not in out
    assert "12,345" in out and "NVIDIA H200" in out
    assert "warning" not in out and err.getvalue() == "warning: clock [unknown]\n"  # stdout: only the result


@dataclass
class _Result:
    name: str
    bucket: str

    def to_dict(self) -> dict[str, str]:
        return {"name": self.name, "bucket": self.bucket, "subbucket": "allreduce", "precision": "bf16",
                "confidence": "high", "rule": "nccl"}


def test_classification_rows_in_input_order() -> None:
    out = _capture(print_classification, [_Result("ncclDevKernel_AllReduce", "communication"),
                                          _Result("[x] gemm", "gemm")])
    assert out.index("ncclDevKernel_AllReduce") < out.index("[x] gemm")
    assert "communication" in out and "allreduce" in out


def test_summary_warnings_go_to_stderr() -> None:
    summary = make_summary(make_traces())
    summary.warnings = ["r0.json: clock skew"]
    out, err = io.StringIO(), io.StringIO()
    print_summary(summary, console=make_console(out), err_console=make_console(err))
    assert "warning" not in out.getvalue() and err.getvalue() == "warning: r0.json: clock skew\n"


def test_narrow_terminals_never_split_a_number_from_its_unit(monkeypatch) -> None:
    import re

    summary = make_summary(make_traces())
    cells = ("28.00 µs", "24.00 µs", "9.000 µs", "3.000 µs", "6.000 µs", "33.3 %", "10.00 µs", "2.000 µs",
             "12.00 µs 50 %")
    for width in (80, 90, 100):
        monkeypatch.setenv("COLUMNS", str(width))
        out = _capture(print_summary, summary)
        lines = out.splitlines()
        assert max(len(line.rstrip()) for line in lines) <= width
        for cell in cells:
            assert cell in out, (width, cell)
        assert not [line for line in lines if re.match(r"\s+(µs|ms|ns|s|%)\b", line)]  # no unit on a line of its own
        if width == 80:  # columns split into tables that fit
            assert re.search(r"^Per device .*\(1/\d\)$", out, re.M) and re.search(r"^Per device .*\(2/\d\)$", out, re.M)


def test_no_communication_says_what_does_not_apply() -> None:
    from dataclasses import replace

    summary = make_summary(make_traces())
    summary.devices = [replace(d, comm_ns=0, comm_hidden_ns=0, comm_exposed_ns=0, overlap_pct=None)
                       for d in summary.devices]
    summary.cross_rank = None
    out = _capture(print_summary, summary)
    assert "No communication kernels or peer copies" in out
    assert "exposed" not in out.split("Busy time")[0].split("Per device")[1]  # no exposed/hidden columns
    assert "If communication were free" not in out
