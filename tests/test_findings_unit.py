"""Finding rules on small synthetic traces with hand-computable answers, run through ``summarize`` like real ones.

Used where no real trace shows the case: a one-shot-sized NCCL all-reduce that is slow, a host synchronization
inside a step, warm-up activity outside the step windows, and the options (thresholds, disabled rules).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from traceanalyzer.analysis.summary import SummaryOptions
from traceanalyzer.findings import FindingOptions, FindingThresholds, run_findings
from traceanalyzer.findings.context import kinds_text
from traceanalyzer.pipeline.summarize import summarize
from traceanalyzer.testing.synth import make_trace

ROOT = Path(__file__).resolve().parents[1]
US = 1_000
AR = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"


def _steps(n: int, length: int, first: int = 0, device: int = 0) -> list[tuple]:
    return [(first + i * length, first + (i + 1) * length, "gpu_user_annotation", f"ProfilerStep#{i}", device)
            for i in range(n)]


def _allreduce_rank(rank: int, ar_ns: int, nbytes: int = 256 * 1024, warmup: int = 0):
    """Two 1 ms steps of gemm | all-reduce | gemm | all-reduce | gemm on stream 7 (serialized), plus ``warmup``
    all-reduces before the first step."""
    kernels, colls = [], []
    eid = 0

    def allreduce(start: int) -> None:
        nonlocal eid
        eid += 1
        kernels.append((start, start + ar_ns, 0, 7, AR, "communication", "allreduce", eid, eid))
        colls.append((eid, "allreduce", nbytes, eid, 2))

    for w in range(warmup):
        allreduce(-1000 * US + w * 100 * US)
    for step in range(2):
        t0 = step * 1000 * US
        kernels.append((t0, t0 + 400 * US, 0, 7, "nvjet_gemm", "gemm", "dense"))
        allreduce(t0 + 400 * US)
        kernels.append((t0 + 400 * US + ar_ns, t0 + 900 * US, 0, 7, "nvjet_gemm", "gemm", "dense"))
        allreduce(t0 + 900 * US)
        kernels.append((t0 + 900 * US + ar_ns, t0 + 1000 * US, 0, 7, "nvjet_gemm", "gemm", "dense"))
    return make_trace(kernels, ranges=_steps(2, 1000 * US), collectives=colls, rank=rank, path=f"rank{rank}.json",
                      device_names={0: "NVIDIA H200"})


def _ids(summary) -> list[str]:
    return [f.id for f in summary.findings]


def test_slow_small_nccl_allreduce_fires_with_one_shot_model():
    summary = summarize([_allreduce_rank(r, 60 * US) for r in (0, 1)])
    found = next(f for f in summary.findings if f.id == "nccl_small_messages")
    one_shot = 8 * US + 256 * 1024 / 450.0  # latency + bytes / link peak (ns)
    assert found.impact_ns_per_step == int(2 * (60 * US - one_shot))  # two all-reduces per step
    assert found.evidence["messages_per_step"] == {"allreduce": 2}
    assert "2 all-reduces per step of small messages (median 256 KiB" in found.title


def test_fast_small_allreduce_and_large_messages_do_not_fire():
    fast = summarize([_allreduce_rank(r, 9 * US) for r in (0, 1)])
    assert "nccl_small_messages" not in _ids(fast)
    large = summarize([_allreduce_rank(r, 60 * US, nbytes=64 << 20) for r in (0, 1)])
    assert "nccl_small_messages" not in _ids(large)


def test_warm_up_collectives_outside_steps_are_not_counted():
    summary = summarize([_allreduce_rank(r, 60 * US, warmup=5) for r in (0, 1)])
    serial = next(f for f in summary.findings if f.id == "comm_serialized_with_compute")
    assert serial.evidence["collectives_per_step"] == {"allreduce": 2}
    assert serial.title.startswith("2 all-reduces per step (ncclDevKernel_AllReduce_Sum_bf16_RING_LL)")
    exposed = next(f for f in summary.findings if f.id == "exposed_communication")
    assert exposed.impact_ns_per_step == 120 * US


def test_thresholds_and_disabled_rules_are_options():
    summary = summarize([_allreduce_rank(r, 60 * US) for r in (0, 1)], SummaryOptions(findings=False))
    traces = [_allreduce_rank(r, 60 * US) for r in (0, 1)]
    assert "exposed_communication" in [f.id for f in run_findings(traces, summary)]  # 12% ≥ 5%
    strict = FindingOptions(thresholds=FindingThresholds(exposed_comm_min_pct=20.0),
                            disabled=frozenset({"nccl_small_messages"}))
    ids = [f.id for f in run_findings(traces, summary, strict)]
    assert "exposed_communication" not in ids and "nccl_small_messages" not in ids


def _sync_trace(gap_start: int, steps: list[tuple]):
    kernels = [(gap_start - 1000, gap_start, 0, 7, "k", "gemm", "dense", 1),
               (gap_start + 3_000_000, gap_start + 3_001_000, 0, 7, "k", "gemm", "dense", 2),
               (10_000_000, 10_001_000, 0, 7, "k", "gemm", "dense", 3)]
    return make_trace(kernels, ranges=steps, api_calls=[(gap_start + 500, gap_start + 2_900_000, 99,
                                                         "cudaStreamSynchronize")])


def test_idle_gap_with_host_sync_inside_a_step_is_attributed():
    trace = _sync_trace(1_000, _steps(1, 10_001_000))
    found = next(f for f in summarize(trace).findings if f.id == "idle_gaps_host_cause")
    assert found.impact_ns_per_step == 3_000_000
    assert found.evidence["host_calls"] == {"cudaStreamSynchronize": 1}


def test_idle_gap_outside_the_steps_is_not_counted():
    trace = _sync_trace(1_000, _steps(1, 1_000, first=10_000_000))  # the gap is before the only step
    assert "idle_gaps_host_cause" not in _ids(summarize(trace))


def test_kinds_text_is_plural_aware():
    assert kinds_text({"allreduce": 16}) == "16 all-reduces"
    assert kinds_text({"allreduce": 1, "sendrecv": 2}) == "2 send/recv + 1 all-reduce"


def test_summary_options_carry_thresholds_and_disabled_rules():
    traces = [_allreduce_rank(r, 60 * US) for r in (0, 1)]
    opts = SummaryOptions(extra={"finding_thresholds": FindingThresholds(exposed_comm_min_pct=20.0),
                                 "disabled_findings": ["nccl_small_messages"]})
    ids = _ids(summarize(traces, opts))
    assert "exposed_communication" not in ids and "nccl_small_messages" not in ids
    assert "comm_serialized_with_compute" in ids


def test_summary_options_read_extra_into_typed_fields_and_refuse_unknown_keys():
    import pytest

    from traceanalyzer.model.errors import BadInputError

    opts = SummaryOptions(extra={"disabled_findings": ["gpu_idle"], "gpu_log_utc_offset_s": 3600})
    assert opts.disabled_findings == {"gpu_idle"} and opts.gpu_log_utc_offset_s == 3600
    assert SummaryOptions(disabled_findings=frozenset({"gpu_idle"})).disabled_findings == opts.disabled_findings
    with pytest.raises(BadInputError, match="unknown extra option 'gpu_log_tzz'"):
        SummaryOptions(extra={"gpu_log_tzz": "Asia/Kolkata"})  # a typo was ignored before


def test_every_rule_is_registered_and_documented():
    from traceanalyzer.findings import RULE_IDS, _registry

    assert tuple(_registry()) == RULE_IDS and len(set(RULE_IDS)) == len(RULE_IDS)
    doc = (ROOT / "docs" / "FINDINGS.md").read_text(encoding="utf-8")
    rules = doc[doc.index("## Rules"):].split("\n## ")[0]
    assert re.findall(r"^### `(\w+)`", rules, flags=re.M) == list(RULE_IDS)  # a section per rule, in run order
    assert all(f"`{name}`" in doc for name in FindingThresholds.__dataclass_fields__)


def _finding_ids_spelled(path: Path) -> list[str]:
    """``Finding(id=<string literal>)`` calls in a module: ids not taken from ``findings/rule_ids.py``."""
    return [f"{path.name}:{node.lineno}" for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("Finding")
            and any(k.arg == "id" and isinstance(k.value, ast.Constant) for k in node.keywords)]


def test_rule_ids_are_spelled_once_in_the_package():
    from traceanalyzer.findings import RULE_IDS

    package = ROOT / "traceanalyzer"
    assert [hit for p in sorted(package.rglob("*.py")) for hit in _finding_ids_spelled(p)] == []
    again = []
    for path in sorted((package / "findings").glob("*.py")):
        if path.name == "rule_ids.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        exported = {id(c) for node in tree.body if isinstance(node, ast.Assign) and
                    "__all__" in [getattr(t, "id", None) for t in node.targets]
                    for c in ast.walk(node.value)}  # __all__ names the rule functions, not the ids
        again += [f"{path.name}:{n.lineno}" for n in ast.walk(tree) if isinstance(n, ast.Constant)
                  and n.value in RULE_IDS and id(n) not in exported]
    assert again == [], f"rule ids spelled outside traceanalyzer/findings/rule_ids.py: {again}"


def _looked_up_ids(tree: ast.AST) -> list[tuple[int, str]]:
    """String constants a test compares with finding ids: ``f.id == "x"``, ``f["id"] == "x"``, ``"x" in ids`` /
    ``in _ids(…)`` / ``in [f.id …]``, ``{"x", …} <= {f.id …}``, ``_found(summary, "x")``."""
    def strings(node: ast.AST) -> list[str]:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return [node.value]
        return [e.value for e in getattr(node, "elts", []) if isinstance(e, ast.Constant)]

    def about_ids(node: ast.AST) -> bool:
        if isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp)):
            return about_ids(node.elt)
        return (isinstance(node, ast.Attribute) and node.attr == "id") or \
            (isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and node.slice.value == "id") or \
            (isinstance(node, ast.Name) and ast.unparse(node) == "ids") or \
            (isinstance(node, ast.Call) and ast.unparse(node.func) == "_ids")

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and len(node.comparators) == 1:
            left, right = node.left, node.comparators[0]
            for value, other in ((left, right), (right, left)):
                if about_ids(other) and not about_ids(value):
                    found += [(node.lineno, s) for s in strings(value)]
        elif isinstance(node, ast.Call) and ast.unparse(node.func) == "_found" and len(node.args) > 1:
            found += [(node.lineno, s) for s in strings(node.args[1])]
    return found


def test_tests_look_up_registered_rule_ids():
    """A misspelled id in a test would make ``assert "x" not in ids`` pass for the wrong reason."""
    from traceanalyzer.findings import RULE_IDS

    tests = [p for p in sorted((ROOT / "tests").glob("test_*.py")) if p.name != "test_diff.py"]  # made-up ids
    looked_up = {f"{p.name}:{line}": value for p in tests
                 for line, value in _looked_up_ids(ast.parse(p.read_text(encoding="utf-8")))}
    assert len(looked_up) >= 20  # the scan sees the tests' lookups
    assert {k: v for k, v in looked_up.items() if v not in RULE_IDS} == {}
