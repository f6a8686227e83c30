"""The replay what-if against every measured truth case (docs/METHOD_WHATIF_SIM.md, tests/test_whatif_sim.py).

    python3 examples/whatif_table.py [--markdown]

Each row: a trace, the change replayed (``ta.whatif``), the measured change of the unprofiled step (negative =
faster; how each was measured: fixtures/README.md, docs/METHOD_WHAT_IF.md, docs/METHOD_IMPACTS.md) and the
simulated one, step to step (the timed step includes the host work between GPU windows), with the window change
beside it. Rows on ../shared/data are left out when it is absent. Nothing here feeds the product.
"""

from __future__ import annotations

import json
import lzma
import shutil
import statistics
import sys
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "fixtures"
SHARED = ROOT.parent / "shared" / "data"
#: The eager add + RMSNorm's nine kernels (fixtures/truth/rmsnorm_fusion_h200.json names them), as one regex: runs
#: of two or more of them back to back on a stream are the decomposed norm.
NORM_CHAIN = (r"CUDAFunctor_add|direct_copy_kernel|pow_tensor_scalar|MeanOps|CUDAFunctorOnSelf_add|rsqrt_kernel|"
              r"BinaryFunctor<float|bfloat16_copy_kernel|BinaryFunctor<c10::BFloat16")


@dataclass
class Case:
    kind: str  # comm | graphs | fuse
    name: str
    paths: list[Path]
    measured_ms: float  # negative: faster
    change: dict[str, Any]
    bound: float = 0.25
    measured_after_ms: float | None = None  # the unprofiled step with the change, where measured
    measured_before_ms: float | None = None  # the unprofiled step without it


def _med(path: Path) -> float:
    return float(json.loads(path.read_text())["step_ms_median"])


def _fixture_comm(mode: str) -> tuple[float, float, float]:
    """(measured change, step with, step without), slowest rank, ms."""
    t = FIX / "truth"
    w = [_med(t / f"{mode}_rank{r}.json") for r in (0, 1)]
    wo = [_med(t / f"{mode}_nocomm_rank{r}.json") for r in (0, 1)]
    return -(max(w) - max(wo)), max(w), max(wo)


def _ab_comm(run: str) -> tuple[float, float, float]:
    if run.startswith("tp1_"):
        ranks = [json.loads((FIX / "truth" / "ab" / "tp1" / f"{run[4:]}_rank0.json").read_text())["rounds"]]
    else:
        ranks = [json.loads((FIX / "truth" / "ab" / f"{run}_rank{r}.json").read_text())["rounds"] for r in (0, 1)]

    def slowest(key: str) -> float:
        return max(statistics.median([t for rd in rr for t in rd[key]]) for rr in ranks)

    return -(slowest("comm_step_ms") - slowest("nocomm_step_ms")), slowest("comm_step_ms"), slowest("nocomm_step_ms")


def _shared_comm(stem: str, nocomm: str) -> tuple[float, float, float]:
    k = SHARED / "h200" / "kineto"
    w = [_med(k / f"{stem}_rank{r}.truth.json") for r in (0, 1)]
    wo = [_med(k / f"truth_{nocomm}_nocomm_rank{r}.json") for r in (0, 1)]
    return -(max(w) - max(wo)), max(w), max(wo)


def _impact(case: str) -> tuple[float, float, float]:
    d = json.loads((FIX / "truth" / "impacts" / f"{case}.json").read_text())
    return float(d["change_ms"]), float(d["a_step_ms_median"]), float(d["b_step_ms_median"])


def _case(kind: str, name: str, paths: list[Path], truth: tuple[float, float, float], change: dict[str, Any],
          bound: float = 0.25) -> Case:
    return Case(kind, name, paths, truth[0], change, bound, measured_after_ms=truth[2], measured_before_ms=truth[1])


def cases(tmp: Path) -> list[Case]:
    """Every measured case whose files are here."""
    out: list[Case] = []
    free = {"comm": "free"}
    for mode in ("prefill_serial", "prefill_overlap", "decode_eager", "decode_graphs"):
        out.append(_case("comm", f"fixtures {mode} (Kineto)", [FIX / "kineto" / f"tp2_{mode}"], _fixture_comm(mode),
                         free, 0.30 if mode == "prefill_overlap" else 0.25))
    out.append(_case("comm", "fixtures prefill_serial (nsys)", [FIX / "nsys" / "tp2_prefill_serial.sqlite"],
                     _fixture_comm("prefill_serial"), free))
    unpacked = tmp / "tp2_prefill_overlap.sqlite"
    with lzma.open(FIX / "nsys" / "tp2_prefill_overlap.sqlite.xz") as src, unpacked.open("wb") as dst:
        shutil.copyfileobj(src, dst)
    out.append(_case("comm", "fixtures prefill_overlap (nsys)", [unpacked], _fixture_comm("prefill_overlap"), free,
                     0.30))
    for run in ("prefill_serial_a", "prefill_serial_b", "prefill_overlap_a", "decode_graphs_a", "decode_eager_a",
                "decode_eager_b", "decode_eager_c", "decode_hostsync_d", "decode_hostsync_e", "decode_hostsync_f",
                "tp1_decode_eager_c", "tp1_decode_hostsync_d", "tp1_decode_hostsync_e", "tp1_decode_hostsync_f"):
        path = FIX / "kineto" / "ab" / (run if run.startswith("tp1_") else f"tp2_{run}")
        out.append(_case("comm", f"ab {run}", [path], _ab_comm(run), free, 0.30 if "overlap" in run else 0.25))
    if SHARED.is_dir():
        k = SHARED / "h200" / "kineto"
        for stem, nocomm in (("prefill_serial", "prefill"), ("nop2p_prefill_serial", "nop2p_prefill"),
                             ("prefill_overlap", "prefill_overlap")):
            out.append(_case("comm", f"shared {stem} (Kineto)", [k / f"{stem}_rank{r}.json.gz" for r in (0, 1)],
                             _shared_comm(stem, nocomm), free, 0.30 if "overlap" in stem else 0.25))
        for stem, nocomm in (("tp2_prefill_serial", "prefill"), ("tp2_prefill_overlap", "prefill_overlap")):
            out.append(_case("comm", f"shared {stem[4:]} (nsys)", [SHARED / "h200" / "nsys" / f"{stem}.sqlite"],
                             _shared_comm(stem[4:], nocomm), free, 0.30 if "overlap" in stem else 0.25))
    eager = [_med(FIX / "truth" / f"decode_eager_rank{r}.json") for r in (0, 1)]
    graphs = [_med(FIX / "truth" / f"decode_graphs_rank{r}.json") for r in (0, 1)]
    out.append(_case("graphs", "fixtures decode_eager → decode_graphs (Kineto)", [FIX / "kineto" / "tp2_decode_eager"],
                     (max(graphs) - max(eager), max(eager), max(graphs)), {"graphs": True}))
    for case in ("graph_dense_b64_l8_big", "graph_dense_b8_l16", "graph_dense_b8_l8", "graph_moe_b32_l4",
                 "graph_moe_b4_l8"):
        for fmt, path in (("Kineto", FIX / "kineto" / "impacts" / case / "a" / "rank0.json.gz"),
                          ("nsys", FIX / "nsys" / f"impact_{case}_a.sqlite")):
            out.append(_case("graphs", f"{case} ({fmt})", [path], _impact(case), {"graphs": True}))
    for case in ("norm_eager_big", "norm_graph_big", "norm_prefill_big"):
        for fmt, path in (("Kineto", FIX / "kineto" / "impacts" / case / "a" / "rank0.json.gz"),
                          ("nsys", FIX / "nsys" / f"impact_{case}_a.sqlite")):
            out.append(_case("fuse", f"{case} ({fmt})", [path], _impact(case), {"fuse": [NORM_CHAIN]}))
    return out


def evaluate(case: Case) -> dict[str, Any]:
    """The simulated change of one case and its error against the measured one."""
    import traceanalyzer as ta

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        w = ta.whatif([str(p) for p in case.paths], **case.change)
        u = ta.whatif([str(p) for p in case.paths], unprofiled=True, **case.change)

    def change(r: Any) -> float:
        return float(r.change_period_ns if r.change_period_ns is not None else r.change_ns or 0) / 1e6

    sim, sim_u = change(w), change(u)

    def error(x: float) -> float:
        return (x - case.measured_ms) / abs(case.measured_ms) if case.measured_ms else float("nan")

    return {"kind": case.kind, "case": case.name, "measured_ms": case.measured_ms, "simulated_ms": sim,
            "window_ms": (w.change_ns or 0) / 1e6, "traced_step_ms": (w.traced_step_ns or 0) / 1e6,
            "unprofiled_ms": sim_u, "error": error(sim), "error_unprofiled": error(sim_u), "bound": case.bound,
            "within": abs(error(sim)) <= case.bound, "within_unprofiled": abs(error(sim_u)) <= case.bound,
            "no_change_error_pct": w.no_change_error_pct,
            "simulated_after_ms": (w.traced_step_ns or 0) / 1e6 + sim, "measured_after_ms": case.measured_after_ms,
            "measured_before_ms": case.measured_before_ms}


def main(argv: list[str]) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        rows = [evaluate(c) for c in cases(Path(tmp))]
    if "--json" in argv:
        print(json.dumps(rows, indent=1))
        return 0
    print("| change | case | traced / unprofiled step | measured | simulated, step to step (window) | error | "
          "--unprofiled | error | bound | simulated after vs measured after |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    def mark(err: float, bound: float) -> str:
        return f"{err * 100:+.0f} %" + ("" if abs(err) <= bound else " ✗")

    for r in rows:
        after = r["measured_after_ms"]
        vs = f"{r['simulated_after_ms']:.2f} vs {after:.2f} ({(r['simulated_after_ms'] / after - 1) * 100:+.1f} %)"
        print(f"| {r['kind']} | {r['case']} | {r['traced_step_ms']:.2f} / {r['measured_before_ms']:.2f} | "
              f"{r['measured_ms']:+.2f} | {r['simulated_ms']:+.2f} ({r['window_ms']:+.2f}) | "
              f"{mark(r['error'], r['bound'])} | {r['unprofiled_ms']:+.2f} | "
              f"{mark(r['error_unprofiled'], r['bound'])} | ±{r['bound'] * 100:.0f} % | {vs} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
