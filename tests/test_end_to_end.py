"""End to end on every shipped fixture, as a user runs it: ``info --json``, ``summary --json`` (the contracts in
ARCHITECTURE.md and the invariants of the definitions), ``report`` and the Python API."""

from __future__ import annotations

import contextlib
import io
import json
import lzma
import re
import shutil
from functools import cache
from pathlib import Path

import pytest

import traceanalyzer as ta
from traceanalyzer.analysis.results import Summary
from traceanalyzer.cli import main

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "fixtures"
# the two-rank capture folders (one file per rank; not ab/, nor the one-GPU graph_replay/)
KINETO_DIRS = sorted(p for p in (FIXTURES / "kineto").iterdir() if p.is_dir() and len(list(p.glob("*.json.gz"))) == 2)
NSYS_SERIAL = FIXTURES / "nsys" / "tp2_prefill_serial.sqlite"
NSYS_OVERLAP_XZ = FIXTURES / "nsys" / "tp2_prefill_overlap.sqlite.xz"
BUCKETS = {"moe_fp4_gemm", "moe_gemm", "gemm", "attention", "communication", "memory", "other"}


@cache
def _unpacked_overlap() -> Path:
    import atexit
    import tempfile

    folder = tempfile.mkdtemp(prefix="ta_e2e_")
    atexit.register(shutil.rmtree, folder, True)
    target = Path(folder) / "tp2_prefill_overlap.sqlite"
    with lzma.open(NSYS_OVERLAP_XZ) as src, open(target, "wb") as dst:
        shutil.copyfileobj(src, dst)
    return target


def _path(name: str) -> Path:
    if name == "nsys/tp2_prefill_overlap":
        return _unpacked_overlap()
    if name == "nsys/tp2_prefill_serial":
        return NSYS_SERIAL
    return FIXTURES / name


TRACE_SETS = [f"kineto/{p.name}" for p in KINETO_DIRS] + ["nsys/tp2_prefill_serial", "nsys/tp2_prefill_overlap"]


@cache
def _cli_json(*argv: str) -> dict:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    assert code == 0, err.getvalue()
    return json.loads(out.getvalue())


def _summary_json(name: str) -> dict:
    return _cli_json("summary", "--json", str(_path(name)))


@cache
def _summary(name: str) -> Summary:
    return ta.summary([str(_path(name))])


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# -- info --------------------------------------------------------------------------------------------------------
INFO_FILES = [f"{d}/{f.name}" for d in TRACE_SETS if d.startswith("kineto")
              for f in sorted(_path(d).iterdir())] + ["nsys/tp2_prefill_serial", "nsys/tp2_prefill_overlap"]


@pytest.mark.parametrize("name", INFO_FILES)
def test_info_json_contract(name: str) -> None:
    info = _cli_json("info", "--json", str(_path(name)))
    assert info["format"] in ("nsys-sqlite", "kineto-json")
    assert info["format"] == ("nsys-sqlite" if name.startswith("nsys") else "kineto-json")
    assert isinstance(info["tool_version"], str | None) and isinstance(info["schema_version"], str | None)
    assert info["devices"] and all(_is_int(d["device"]) and isinstance(d["name"], str | None)
                                   and (d["rank"] is None or _is_int(d["rank"])) for d in info["devices"])
    assert set(info["counts"]) >= {"kernels", "memcpy", "memset", "nvtx_ranges", "gpu_metrics_samples"}
    assert all(_is_int(v) and v >= 0 for v in info["counts"].values())
    assert info["counts"]["kernels"] > 0
    if name.startswith("nsys"):  # both ranks in one export
        assert sorted(d["rank"] for d in info["devices"]) == [0, 1]


# -- summary: contract -------------------------------------------------------------------------------------------
DEVICE_INTS = ("rank", "device", "span_ns", "busy_ns", "idle_ns", "comm_ns", "comm_hidden_ns", "comm_exposed_ns",
               "steps")


@pytest.mark.parametrize("name", TRACE_SETS)
def test_summary_json_contract(name: str) -> None:
    s = _summary_json(name)
    assert isinstance(s["traces"], list) and s["traces"]
    assert len(s["devices"]) == 2
    for d in s["devices"]:
        assert all(_is_int(d[k]) for k in DEVICE_INTS), {k: d[k] for k in DEVICE_INTS}
        assert isinstance(d["name"], str | None)
        assert set(d["bucket_ns"]) <= BUCKETS and all(_is_int(v) for v in d["bucket_ns"].values())
        assert d["overlap_pct"] is None or isinstance(d["overlap_pct"], float)
        assert all(d[k] is None or _is_int(d[k]) for k in ("step_ns_median", "comm_exposed_per_step_ns"))
    cross = s["cross_rank"]
    assert cross is None or isinstance(cross, dict)
    if cross is not None:
        assert _is_int(cross["collectives_matched"]) and cross["collectives_matched"] > 0
        assert all(_is_int(v) for v in cross["wait_ns_by_rank"].values())
        assert set(cross["wait_ns_by_rank"]) == {"0", "1"}
        assert cross["transfer_ns_per_step"] is None or _is_int(cross["transfer_ns_per_step"])
        assert cross["straggler_rank"] is None or _is_int(cross["straggler_rank"])
    w = s["what_if"]
    assert w["basis"] in {"gpu_transfer", "host_launch", "mixed"}
    assert w["comm_free_step_saving_ns"] is None or _is_int(w["comm_free_step_saving_ns"])
    assert isinstance(s["findings"], list)
    for f in s["findings"]:
        assert isinstance(f["id"], str) and isinstance(f["title"], str) and f["title"]
        assert f["impact_ns_per_step"] is None or _is_int(f["impact_ns_per_step"])
        assert isinstance(f["evidence"], dict)


# -- summary: invariants of the definitions ----------------------------------------------------------------------
@pytest.mark.parametrize("name", TRACE_SETS)
def test_summary_invariants(name: str) -> None:
    for d in _summary(name).devices:
        assert d.busy_ns + d.idle_ns == d.span_ns
        assert sum(d.bucket_exclusive_ns.values()) == d.busy_ns
        assert d.comm_hidden_ns + d.comm_exposed_ns == d.comm_ns
        assert d.overlap_pct is None or 0.0 <= d.overlap_pct <= 100.0
        ps = d.per_step
        assert len(ps) == d.steps
        assert int(ps["duration_ns"].sum()) <= d.span_ns
        assert (ps["busy_ns"] + ps["idle_ns"] == ps["duration_ns"]).all()
        assert (ps["comm_hidden_ns"] + ps["comm_exposed_ns"] == ps["comm_ns"]).all()
        assert (ps["start_ns"].to_numpy()[1:] >= ps["end_ns"].to_numpy()[:-1]).all()  # disjoint, in order


TRUTH_STEP_MS = {  # measured without the profiler (fixtures/truth/*_rank0.json step_ms_median)
    "kineto/tp2_prefill_serial": 31.26, "kineto/tp2_prefill_overlap": 30.81,
    "nsys/tp2_prefill_serial": 31.26, "nsys/tp2_prefill_overlap": 30.81,
}


@pytest.mark.parametrize("name", sorted(TRUTH_STEP_MS))
def test_three_timed_steps_of_the_measured_length(name: str) -> None:
    """The fixtures profile 3 timed steps (ProfilerStep in Kineto, NVTX `step` in nsys, whose export also holds
    warm-up): without --step-range every device has exactly those steps, within 5% of the unprofiled step time."""
    s = _summary_json(name)
    for d in s["devices"]:
        assert d["steps"] == 3, d["step_source"]
        assert d["step_source"] in ("profiler_step", "nvtx:step")
        assert d["step_ns_median"] == pytest.approx(TRUTH_STEP_MS[name] * 1e6, rel=0.05)


@pytest.mark.parametrize("name", ["kineto/tp2_prefill_serial", "nsys/tp2_prefill_serial"])
def test_per_step_counts_match_the_model(name: str) -> None:
    """4 layers × 2 all-reduces = 8 per step on every device; findings say 8, not the warm-up's count."""
    for d in _summary(name).devices:
        per_step = d.collectives[d.collectives["step"] >= 0].groupby("step").size()
        assert per_step.tolist() == [8, 8, 8]
    for f in _summary_json(name)["findings"]:
        counts = re.findall(r"(\d+) all-reduces per step", f["title"])
        assert all(c == "8" for c in counts), f["title"]


def test_step_range_option_agrees_with_the_automatic_choice() -> None:
    auto = _summary_json("nsys/tp2_prefill_serial")
    named = _cli_json("summary", "--json", "--step-range", "step", str(NSYS_SERIAL))
    assert [d["step_ns_median"] for d in auto["devices"]] == [d["step_ns_median"] for d in named["devices"]]


# -- report ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["kineto/tp2_decode_eager", "nsys/tp2_prefill_serial"])
def test_report_is_one_self_contained_file(name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out" / "x.html"
    assert main(["report", "-o", str(out), str(_path(name))]) == 0
    _, err = capsys.readouterr()
    assert f"report written: {out}" in err
    assert [p.name for p in out.parent.iterdir()] == ["x.html"]
    page = out.read_text(encoding="utf-8")
    assert not re.search(r"<script[^>]*\bsrc=[\"']?https?://", page)
    assert "DeviceEnvironment" not in page and "NCCL_NVLS_ENABLE" not in page  # no environment text leaks


def test_report_cdn_references_plotly(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "x.html"
    assert main(["report", "--cdn", "-o", str(out), str(_path("kineto/tp2_decode_graphs"))]) == 0
    page = out.read_text(encoding="utf-8")
    assert re.search(r"<script[^>]*\bsrc=[\"']https://cdn\.plot\.ly/", page)
    assert len(page) < 1_000_000  # plotly.js (~4.5 MB) not inlined


# -- Python API --------------------------------------------------------------------------------------------------
def test_python_api_end_to_end() -> None:
    d = _path("kineto/tp2_prefill_overlap")
    one = ta.load(d / "rank0.json.gz")
    kernels = one.df("kernels")
    assert len(kernels) > 0 and "bucket" in kernels.columns
    assert set(kernels["bucket"].unique()) <= BUCKETS and "communication" in set(kernels["bucket"])
    many = ta.load_many([d])
    assert [sorted(set(t.ranks)) for t in many] == [[0], [1]]
    s = ta.summary(many)
    assert len(s.devices) == 2 and s.to_json()["devices"][0]["span_ns"] > 0
    nsys = ta.load(NSYS_SERIAL)
    assert "bucket" in nsys.df("kernels").columns and sorted(set(nsys.ranks)) == [0, 1]


def test_warnings_name_their_file_once(tmp_path: Path) -> None:
    path = tmp_path / "norank.json"  # no distributedInfo: the Kineto loader warns, naming the file itself
    path.write_text(json.dumps({"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 5,
                                                 "pid": 0, "tid": 7}]}))
    warnings = ta.summary([str(path)]).to_json()["warnings"]
    assert warnings and all(w.startswith("norank.json: ") and w.count("norank.json: ") == 1 for w in warnings)
