"""The library surface: every CLI command is one call of a function here."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from .errors import EmptyTraceError
from .loaders import ProgressFn, detect_format, expand_paths, load_one
from .loaders.limits import Window, parse_window
from .trace import Trace

PathLike = str | Path


def load(path: PathLike, *, rules: PathLike | None = None, classify: bool = True,
         tables: frozenset[str] | None = None, progress: ProgressFn | None = None,
         window: str | Window | None = None) -> Trace:
    """Load one trace file (nsys SQLite export or Kineto JSON/.json.gz) into a normalized :class:`Trace`.

    With ``classify`` (default) the kernel table gets bucket/sub-bucket/precision/rule columns from the
    default rules, extended by the user rules file ``rules`` when given, then the context pass (expert GEMMs inside
    ``moe``/``experts`` ranges → moe_gemm; SendRecv inside ``all_to_all`` ranges → sub-bucket all_to_all).
    ``tables`` limits the optional tables read (as ``loaders.load_one``; default all). ``window``
    (``"START:END"`` seconds from the capture start, ``loaders.limits``) keeps the activity starting inside it.
    """
    trace = load_one(path, progress=progress, tables=tables, window=parse_window(window))
    return classified(trace, rules) if classify else trace


def classified(trace: Trace, rules: PathLike | None = None) -> Trace:
    """Kernel/memop bucket columns from the rules (user ``rules`` first), then the context pass."""
    from .classify import classified as classify_columns

    return classify_columns(trace, rules)


def load_many(paths: Sequence[PathLike], *, rules: PathLike | None = None, classify: bool = True,
              jobs: int = 1, progress: ProgressFn | None = None, window: str | Window | None = None) -> list[Trace]:
    """Load several files or directories of rank traces; one Trace per file, in path order.

    ``jobs > 1`` loads files in that many worker processes; ``window`` as :func:`load`.
    """
    win = parse_window(window)
    skipped: list[str] = []
    files = expand_paths(list(paths), skipped)
    traces = load_files(files, rules=rules, classify=classify, jobs=jobs, progress=progress, window=win)
    if skipped and traces:  # said once, with the first trace's warnings (summary JSON, terminal, report)
        traces[0] = replace(traces[0], warnings=[*traces[0].warnings, *skipped])
    return assign_ranks_across_files(traces)


def load_files(files: Sequence[PathLike], *, rules: PathLike | None = None, classify: bool = True, jobs: int = 1,
               tables: frozenset[str] | None = None, progress: ProgressFn | None = None,
               window: Window | None = None) -> list[Trace]:
    """One Trace per file, in file order, ranks as the files give them; ``jobs > 1`` loads in that many worker
    processes. ``tables`` limits the optional tables read (as ``loaders.load_one``)."""
    if jobs > 1 and len(files) > 1:
        from .parallel import map_files

        return map_files(files, rules=rules, classify=classify, jobs=jobs, tables=tables, progress=progress,
                         window=window)
    return [load(f, rules=rules, classify=classify, tables=tables, progress=progress, window=window) for f in files]


def assign_ranks_across_files(traces: list[Trace]) -> list[Trace]:
    """Give one-rank files distinct ranks when their own ranks collide (e.g. one nsys export per rank, each of
    whose single process got rank 0, or Kineto files without ``distributedInfo``): file order decides, with a
    warning. Files with distinct ranks are returned unchanged, and so are files whose ranks torch.distributed
    stated (``distributedInfo``): colliding stated ranks are rank files of different runs, which the summary
    tells apart."""
    ranks = [sorted(set(t.ranks)) for t in traces]
    flat = [r for rs in ranks for r in rs]
    if len(traces) < 2 or (len(flat) == len(set(flat)) and -1 not in flat):
        return traces
    if any(len(rs) != 1 for rs in ranks):
        return traces  # several processes per file: keep the loaders' ranks (they came from the file itself)
    if -1 not in flat and all(t.capabilities.get("has_distributed_info") for t in traces):
        return traces  # ranks stated by torch.distributed: a collision means several runs (analysis.runs)
    out: list[Trace] = []
    for new_rank, trace in enumerate(traces):
        renumbered = trace
        for name, table in trace.tables.items():
            if "rank" in table and len(table):
                renumbered = renumbered.with_table(name, table.with_columns(
                    rank=np.full(len(table), new_rank, dtype=np.int32)))
        note = f"rank {new_rank} assigned from file order (the files' own ranks collide: {flat})"
        out.append(replace(renumbered, devices=[replace(d, rank=new_rank) for d in trace.devices],
                           warnings=[*trace.warnings, note]))
    return out


def require_kernels(traces: Sequence[Trace], paths: Sequence[PathLike]) -> None:
    """Raise EmptyTraceError (naming the file, and a missing nsys kernel table) when no trace has kernels."""
    if any(len(t.kernels) for t in traces):
        return
    where = traces[0].path if len(traces) == 1 else ", ".join(str(p) for p in paths)
    raise EmptyTraceError(where, "no kernel activity in the trace", _empty_hint(list(traces)))


def _empty_hint(traces: list[Trace]) -> str:
    if any(t.format == "nsys-sqlite" and not t.capabilities.get("has_kernel_table", True) for t in traces):
        return "the export has no kernel table: profile with -t cuda (and --cuda-graph-trace=node for CUDA graphs)"
    return "profile with CUDA activity enabled (nsys -t cuda; torch.profiler with ProfilerActivity.CUDA)"


def info(path: PathLike) -> dict[str, Any]:
    """What a trace file holds (format, versions, devices, raw activity counts) — the ``info`` JSON contract."""
    # counts and devices need no optional table: an nsys export is read without them (GPU metrics can be huge)
    trace = load_one(path, tables=frozenset() if detect_format(path) == "nsys-sqlite" else None)
    if trace.raw_counts.get("kernels", 0) == 0 and trace.format == "nsys-sqlite" \
            and not trace.capabilities.get("has_kernel_table", True):
        problem = "export has no kernel table (CUPTI_ACTIVITY_KIND_KERNEL)"
        if graphs := trace.raw_counts.get("graph_launches", 0):
            problem += f"; its {graphs} CUDA graph launches were traced at graph level, kernels not itemised"
        raise EmptyTraceError(path, problem, "profile with -t cuda; for CUDA graphs add --cuda-graph-trace=node")
    counts = {key: int(trace.raw_counts.get(key, 0))
              for key in ("kernels", "memcpy", "memset", "nvtx_ranges", "gpu_metrics_samples")}
    return {
        "format": trace.format,
        "tool_version": trace.tool_version,
        "schema_version": trace.schema_version,
        "devices": [{"device": d.device, "name": d.name, "rank": d.rank} for d in trace.devices],
        "counts": counts,
        "ranks": sorted({d.rank for d in trace.devices if d.rank is not None}),
        "capabilities": trace.capabilities,
        "warnings": list(trace.warnings),
    }


__all__ = ["detect_format", "info", "load", "load_many"]
