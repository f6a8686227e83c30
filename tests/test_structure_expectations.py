"""The tool's step / layer / run structure against tests/data/structure_expectations.toml.

The expectations were written from the traces themselves (timeline, kernel sequence, idle gaps, ranges, rank metadata),
not from traceanalyzer's output; tests/data/STRUCTURE_EXPECTATIONS.md gives the evidence. Each case is checked in four
aspects (steps, layers, source, runs) through the accessors below, which are the one place to adapt when the Summary's
field names change. Cases the tool does not meet yet are listed in KNOWN_MISSES (not in the TOML) as non-strict xfails.
"""

from __future__ import annotations

import functools
import lzma
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from traceanalyzer.loaders import expand_paths

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data"
FIXTURES = REPO / "fixtures"
EXPECTATIONS = REPO / "tests" / "data" / "structure_expectations.toml"
CASES: list[dict[str, Any]] = tomllib.loads(EXPECTATIONS.read_text())["case"]
ASPECTS = ("steps", "layers", "source", "runs")
STEP_SOURCES = {"profiler_step", "nvtx", "idle_gaps", "kernel_period", "none"}
LAYER_SOURCES = {"nvtx", "collective_period", "kernel_period", "none"}
TRACE_SUFFIXES = (".json", ".json.gz", ".sqlite", ".sqlite.xz")

# (case id, aspect) → why the tool misses it today. Remove entries as detection improves (the xfails are not strict,
# so a fixed case shows as XPASS). An aspect named "*" covers all four.
KNOWN_MISSES: dict[tuple[str, str], str] = {}


# ---- accessors: the only code that reads the Summary -------------------------------------------------------------

def device_steps(device: Any) -> int:
    """Complete steps the tool found on one device (0 when the whole window stands in for one: source none)."""
    return 0 if device.step_source == "none" else int(device.steps)


def device_period_ms(device: Any) -> float | None:
    """Median step duration (ms) on one device, None without steps."""
    return None if device.step_ns_median is None else device.step_ns_median / 1e6


def device_layers_per_step(device: Any) -> int:
    """Layers per step on one device (median over steps); 0 when no layers or no steps."""
    table = device.per_layer
    if device_steps(device) == 0 or len(table) == 0 or device.layer_source == "none":
        return 0
    in_step = table[table["step"] >= 0]
    if len(in_step) == 0:
        return 0
    return int(np.median(in_step.groupby("step").size().to_numpy()))


def device_step_source(device: Any) -> str | None:
    """The step evidence in the expectations' vocabulary, or None where the tool's label does not say which."""
    raw = str(device.step_source)
    label = "nvtx" if raw.startswith("nvtx") else raw
    return label if label in STEP_SOURCES else None


def device_layer_source(device: Any) -> str | None:
    """The layer evidence in the expectations' vocabulary, or None where the tool's label does not say which."""
    raw = str(device.layer_source)
    label = "nvtx" if raw.startswith("nvtx") else raw
    return label if label in LAYER_SOURCES else None


def tool_runs(summary: Any, files: list[Path]) -> list[list[int]]:
    """The tool's partition of the input files into runs (indices into ``files``).

    Read from ``summary.runs`` (objects with ``paths``, dicts with ``paths``, or lists of trace paths) when the tool
    reports runs; a tool without run identity analyses everything it was given as one job.
    """
    runs = getattr(summary, "runs", None)
    index = {str(f): i for i, f in enumerate(files)}
    if not runs:
        return [sorted(index.values())]
    out = []
    for run in runs:
        paths = run.get("paths", run) if isinstance(run, dict) else getattr(run, "paths", run)
        out.append(sorted(index[str(p)] for p in paths))
    return out


def tool_ranks_missing(summary: Any) -> int | None:
    """Ranks of the stated world size the tool says are missing (0 when it says none are); None if it cannot say."""
    value = getattr(summary, "ranks_missing", None)
    if value is None:
        for warning in summary.warnings:
            m = re.search(r"(\d+) (?:of \d+ )?ranks? (?:are |is )?missing", str(warning))
            if m:
                return int(m.group(1))
        return None
    return int(value)


# ---- cases -------------------------------------------------------------------------------------------------------

def _resolve(ref: str) -> Path:
    kind, _, rest = ref.partition(":")
    roots = {"shared": SHARED, "fixtures": FIXTURES}
    assert kind in roots and rest, f"input {ref!r}: expected 'shared:<path>' or 'fixtures:<path>'"
    return roots[kind] / rest


def _uses_shared(case: dict[str, Any]) -> bool:
    return any(ref.startswith("shared:") for ref in case["inputs"])


def _files(case: dict[str, Any]) -> list[Path]:
    return expand_paths([_resolve(ref) for ref in case["inputs"]])


@functools.lru_cache(maxsize=1)
def _unpacked_dir() -> Path:
    folder = Path(tempfile.mkdtemp(prefix="ta_structure_"))
    import atexit

    atexit.register(shutil.rmtree, folder, True)
    return folder


def _readable(path: Path) -> Path:
    """The path itself, or an unpacked copy of a .xz export (the tool reads no .xz)."""
    if path.suffix != ".xz":
        return path
    target = _unpacked_dir() / path.stem
    if not target.exists():
        with lzma.open(path) as src, open(target, "wb") as dst:
            shutil.copyfileobj(src, dst)
    return target


@functools.lru_cache(maxsize=1)
def _analysed(case_id: str) -> tuple[Any, list[Path]]:
    """(Summary, analysed file paths) of a case; one case is kept at a time (parameters run case by case)."""
    import traceanalyzer as ta

    case = next(c for c in CASES if c["id"] == case_id)
    files = [_readable(p) for p in _files(case)]
    return ta.summary([str(f) for f in files], findings=False), files


def _param(case: dict[str, Any], aspect: str) -> Any:
    marks = []
    if case.get("slow"):
        marks += [pytest.mark.slow, pytest.mark.skipif(not os.environ.get("TRACEANALYZER_SLOW"),
                                                       reason="a large unpacked capture: set TRACEANALYZER_SLOW=1")]
    reason = KNOWN_MISSES.get((case["id"], aspect)) or KNOWN_MISSES.get((case["id"], "*"))
    if reason:
        marks.append(pytest.mark.xfail(strict=False, reason=reason))
    return pytest.param(case, aspect, marks=marks, id=f"{case['id']}-{aspect}")


PARAMS = [_param(c, a) for c in CASES if not c.get("expect_error")
          for a in (ASPECTS if "steps" in c or "steps_by_rank" in c else ("runs",))]  # several runs: runs only


# ---- the expectations file itself --------------------------------------------------------------------------------

def test_cases_are_well_formed():
    ids = [c["id"] for c in CASES]
    assert len(ids) == len(set(ids)), "case ids must be unique"
    for case in CASES:
        where = case["id"]
        assert isinstance(case["inputs"], list) and case["inputs"], where
        assert all(isinstance(r, str) and r.partition(":")[0] in ("shared", "fixtures") for r in case["inputs"]), where
        runs = case["runs"]
        assert isinstance(runs, list) and all(isinstance(r, list) and r for r in runs), where
        flat = [i for r in runs for i in r]
        assert sorted(flat) == list(range(len(flat))), f"{where}: runs must partition the input files"
        notes = case.get("notes") or case.get("layers", {}).get("notes")
        assert isinstance(notes, str) and notes.strip(), f"{where}: notes say what was seen"
        if "world_size" in case:
            assert case["world_size"] >= 1 and 0 <= case.get("ranks_missing", 0) < case["world_size"] * len(runs)
        if case.get("expect_error"):
            continue
        if len(runs) == 1:
            assert "steps" in case and "layers" in case, f"{where}: one run needs [case.steps] and [case.layers]"
        for steps in [case.get("steps"), *list(case.get("steps_by_rank", {}).values())]:
            if steps is None:
                continue
            assert 0 <= steps["count_min"] <= steps["count_max"], where
            assert steps["source"] in STEP_SOURCES, where
            assert (steps["count_max"] == 0) == (steps["source"] == "none") or steps["count_min"] == 0, where
            if "period_ms" in steps:
                assert steps["period_ms"] > 0 and 0 < steps["period_tol_pct"] <= 50, where
        if "layers" in case:
            layers = case["layers"]
            assert layers["per_step"] >= 0 and layers.get("per_step_max", layers["per_step"]) >= layers["per_step"]
            assert layers["source"] in LAYER_SOURCES, where
            assert (layers["per_step"] == 0 and "per_step_max" not in layers) == (layers["source"] == "none"), where


def test_evidence_page_has_every_case():
    page = (EXPECTATIONS.parent / "STRUCTURE_EXPECTATIONS.md").read_text()
    missing = [c["id"] for c in CASES if f"### `{c['id']}`" not in page]
    assert not missing, f"tests/data/STRUCTURE_EXPECTATIONS.md lacks {missing}"


def test_fixture_inputs_exist_and_runs_index_them():
    for case in CASES:
        if _uses_shared(case):
            continue
        files = _files(case)
        assert sum(len(r) for r in case["runs"]) == len(files), case["id"]


def test_shared_inputs_exist_and_runs_index_them(shared_data: Path):
    for case in CASES:
        if _uses_shared(case):
            files = _files(case)
            assert sum(len(r) for r in case["runs"]) == len(files), case["id"]


def _trace_files(root: Path) -> set[Path]:
    """Every trace file under ``root`` (sidecars such as truth files, expect.json and PROVENANCE notes excluded)."""
    found = set()
    for p in root.rglob("*"):
        name = p.name.lower()
        if not p.is_file() or not name.endswith(TRACE_SUFFIXES) or name.startswith(".") or name.startswith("truth_"):
            continue
        if name.endswith(".truth.json") or name == "expect.json" or "truth" in p.relative_to(root).parts:
            continue
        found.add(p.resolve())
    return found


def _covered() -> set[Path]:
    covered = set()
    for case in CASES:
        for ref in case["inputs"]:
            path = _resolve(ref)
            if path.exists():
                covered |= {p.resolve() for p in expand_paths([path])}
    return covered


def test_every_fixture_trace_has_expectations():
    missing = sorted(str(p) for p in _trace_files(FIXTURES) - _covered())
    assert not missing, f"trace files without a case in {EXPECTATIONS.name}: {missing}"


def test_every_shared_trace_has_expectations(shared_data: Path):
    missing = sorted(str(p) for p in _trace_files(shared_data) - _covered())
    assert not missing, f"trace files without a case in {EXPECTATIONS.name}: {missing}"


# ---- the tool against them ---------------------------------------------------------------------------------------

@pytest.mark.parametrize(("case", "aspect"), PARAMS)
def test_structure_matches_expectations(case: dict[str, Any], aspect: str):
    if _uses_shared(case) and not SHARED.is_dir():
        pytest.skip("../shared/data is absent (real traces are only beside the development checkout)")
    summary, files = _analysed(case["id"])
    if aspect == "runs":
        _check_runs(case, summary, files)
        return
    devices = [d for d in summary.devices if d.busy_ns > 0]
    assert devices, f"{case['id']}: no device with kernels"
    for device in devices:
        steps = case.get("steps_by_rank", {}).get(str(device.rank), case.get("steps"))
        assert steps is not None, f"{case['id']}: no [case.steps] for rank {device.rank}"
        where = f"{case['id']} rank {device.rank} device {device.device}"
        if aspect == "steps":
            _check_steps(steps, device, where)
        elif aspect == "layers":
            _check_layers(case["layers"], device, where)
        else:
            _check_sources(steps, case["layers"], device, where)


def _check_steps(steps: dict[str, Any], device: Any, where: str) -> None:
    found = device_steps(device)
    assert steps["count_min"] <= found <= steps["count_max"], \
        f"{where}: {found} steps, expected {steps['count_min']}-{steps['count_max']}"
    period = device_period_ms(device)
    if "period_ms" in steps and found > 0:
        assert period is not None, f"{where}: steps without a period"
        tol = steps["period_ms"] * steps["period_tol_pct"] / 100
        assert abs(period - steps["period_ms"]) <= tol, \
            f"{where}: step period {period:.2f} ms, expected {steps['period_ms']} ± {steps['period_tol_pct']} %"


def _check_layers(layers: dict[str, Any], device: Any, where: str) -> None:
    found = device_layers_per_step(device)
    low, high = layers["per_step"], layers.get("per_step_max", layers["per_step"])
    assert low <= found <= high, f"{where}: {found} layers per step, expected {low}-{high}"


def _check_sources(steps: dict[str, Any], layers: dict[str, Any], device: Any, where: str) -> None:
    step_source = device_step_source(device)
    if step_source is None:
        pytest.fail(f"{where}: step source {device.step_source!r} does not say which evidence was used")
    if steps["count_min"] > 0 or step_source != "none":
        assert step_source == steps["source"] or steps["count_min"] == 0, \
            f"{where}: step source {step_source}, expected {steps['source']}"
    layer_source = device_layer_source(device)
    assert layer_source is not None, f"{where}: layer source {device.layer_source!r} is not one of {LAYER_SOURCES}"
    if layers["per_step"] > 0 and device_steps(device) > 0:
        assert layer_source == layers["source"], f"{where}: layer source {layer_source}, expected {layers['source']}"


def _check_runs(case: dict[str, Any], summary: Any, files: list[Path]) -> None:
    found = sorted(tool_runs(summary, files))
    assert found == sorted(sorted(r) for r in case["runs"]), \
        f"{case['id']}: runs {found}, expected {case['runs']} (files: {[f.name for f in files]})"
    expected, found = case.get("ranks_missing"), tool_ranks_missing(summary)
    if expected:
        assert found == expected, f"{case['id']}: tool says {found} ranks missing, expected {expected}"
    elif expected == 0:
        assert found in (None, 0), f"{case['id']}: tool says {found} ranks missing, none are"


@pytest.mark.parametrize("case", [c for c in CASES if c.get("expect_error")], ids=lambda c: c["id"])
def test_unanalysable_inputs_say_why(case: dict[str, Any]):
    import traceanalyzer as ta
    from traceanalyzer.model.errors import TraceAnalyzerError

    if _uses_shared(case) and not SHARED.is_dir():
        pytest.skip("../shared/data is absent (real traces are only beside the development checkout)")
    with pytest.raises(TraceAnalyzerError, match=case["expect_error"]):
        ta.summary([str(_readable(p)) for p in _files(case)])
