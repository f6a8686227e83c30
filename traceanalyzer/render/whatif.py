"""The ``whatif`` command's terminal text: the critical path of the median step, what limits it, the no-change
replay's error and each change's simulated effect with its assumptions (results only; no analysis here)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..units import fmt_brief_ns, fmt_pct

if TYPE_CHECKING:
    from ..analysis.whatif_sim import StepPath, WhatIfResult


def _parts(values: dict[str, int], total: int, label: str = "") -> str:
    items = sorted(((k, v) for k, v in values.items() if v > 0), key=lambda kv: -kv[1])
    return " · ".join(f"{label}{k} {fmt_brief_ns(v)} ({fmt_pct(100.0 * v / total, 0) if total else '—'})"
                      for k, v in items)


def median_path(result: WhatIfResult) -> StepPath | None:
    """The critical path of the run step whose traced length is the median."""
    if not result.paths:
        return None
    lengths = np.array([p.step_ns for p in result.paths])
    return result.paths[int(np.argsort(lengths, kind="stable")[len(lengths) // 2])]


def whatif_lines(result: WhatIfResult) -> list[str]:
    """Plain lines for the terminal."""
    lines: list[str] = []
    path = median_path(result)
    if path is not None:
        lines.append(f"Critical path, median step (rank {path.rank}, step {path.step}, {fmt_brief_ns(path.step_ns)}):")
        lines.append("  by kind:   " + _parts(path.by_category, path.step_ns))
        lines.append("  by bucket: " + _parts(path.by_bucket, path.step_ns))
        lines.append("  by rank:   " + _parts(path.by_rank, path.step_ns, "rank "))
        lines.append("  by edge:   " + _parts(path.by_edge, path.step_ns))
        lines.append(f"What limits the step: {path.limiter()}")
    err = result.no_change_error_pct
    lines.append(f"No-change replay: every traced step within {fmt_pct(err, 2)} ({len(result.steps)} steps; "
                 f"{result.graph['nodes']} nodes, {result.graph['edges']} edges)")
    if result.changes:
        lines.append("Changes: " + "; ".join(result.changes))
        pct = 100.0 * result.change_ns / result.baseline_step_ns if result.change_ns is not None and \
            result.baseline_step_ns else None
        if result.baseline_step_ns != result.traced_step_ns:
            lines.append(f"Baseline (traced {fmt_brief_ns(result.traced_step_ns)}, without the profiler's host cost): "
                         f"{fmt_brief_ns(result.baseline_step_ns)}")
        lines.append(f"Simulated step: {fmt_brief_ns(result.baseline_step_ns)} → "
                     f"{fmt_brief_ns(result.simulated_step_ns)}"
                     f" ({'+' if (result.change_ns or 0) > 0 else ''}{fmt_brief_ns(result.change_ns)}, "
                     f"{fmt_pct(pct)}; median over steps)"
                     + (f"; step to step {fmt_brief_ns(result.change_period_ns)}"
                        if result.change_period_ns is not None else ""))
        if result.simulated_paths:
            sim = result.simulated_paths[len(result.simulated_paths) // 2]
            lines.append(f"After the change the step is limited by: {sim.limiter()}")
    lines.append("Assumptions:")
    lines += [f"  - {a}" for a in result.assumptions]
    lines += [f"  note: {n}" for n in result.graph.get("notes", [])]
    return lines
