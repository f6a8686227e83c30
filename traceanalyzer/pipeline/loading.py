"""The library surface: every CLI command is one call of a function here."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from ..loaders import ProgressFn, detect_format, expand_paths, load_one
from ..loaders.limits import Window, parse_window
from ..model.errors import EmptyTraceError
from ..model.trace import PathLike, Trace


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
    from .workers import load_file

    return load_file(path, rules=rules, classify=classify, tables=tables, progress=progress,
                     window=parse_window(window))


def classified(trace: Trace, rules: PathLike | None = None) -> Trace:
    """Kernel/memop bucket columns from the rules (user ``rules`` first), then the context pass."""
    from ..classify import classified as classify_columns

    return classify_columns(trace, rules)


def load_many(paths: Sequence[PathLike], *, rules: PathLike | None = None, classify: bool = True,
              jobs: int = 1, progress: ProgressFn | None = None, window: str | Window | None = None,
              tables: frozenset[str] | None = None, on_loaded: Callable[[Trace], None] | None = None) -> list[Trace]:
    """Load several files or directories of rank traces; one Trace per file, in path order.

    ``jobs > 1`` loads files in that many worker processes; ``window`` and ``tables`` as :func:`load`;
    ``on_loaded`` as :func:`load_files`.
    """
    win = parse_window(window)
    skipped: list[str] = []
    files = expand_paths(list(paths), skipped)
    traces = load_files(files, rules=rules, classify=classify, jobs=jobs, progress=progress, window=win,
                        tables=tables, on_loaded=on_loaded)
    if skipped and traces:  # said once, with the first trace's warnings (summary JSON, terminal, report)
        traces[0] = replace(traces[0], warnings=[*traces[0].warnings, *skipped])
    return assign_ranks_across_files(traces)


def load_files(files: Sequence[PathLike], *, rules: PathLike | None = None, classify: bool = True, jobs: int = 1,
               tables: frozenset[str] | None = None, progress: ProgressFn | None = None,
               window: Window | None = None, on_loaded: Callable[[Trace], None] | None = None) -> list[Trace]:
    """One Trace per file, in file order, ranks as the files give them; ``jobs > 1`` loads in that many worker
    processes. ``tables`` limits the optional tables read (as ``loaders.load_one``). With worker processes,
    ``on_loaded`` is called with each Trace as it arrives, while the others load (not without them)."""
    if jobs > 1 and len(files) > 1:
        from .workers import map_files

        return map_files(files, rules=rules, classify=classify, jobs=jobs, tables=tables, progress=progress,
                         window=window, on_loaded=on_loaded)
    return [load(f, rules=rules, classify=classify, tables=tables, progress=progress, window=window) for f in files]


def assign_ranks_across_files(traces: list[Trace]) -> list[Trace]:
    """Give one-rank files distinct ranks when their own ranks collide (e.g. one nsys export per rank, each of
    whose single process got rank 0, or Kineto files without ``distributedInfo``): file order decides, with a
    warning. Files with distinct ranks are returned unchanged, and so are files whose ranks torch.distributed
    stated (``distributedInfo``): colliding stated ranks are rank files of different runs, which the summary
    tells apart."""
    plan = rank_plan([rank_facts(t) for t in traces])
    if plan is None:
        return traces
    return [renumbered(t, new_rank, note) for t, (new_rank, note) in zip(traces, plan, strict=True)]


def rank_facts(trace: Trace) -> tuple[list[int], bool]:
    """What :func:`rank_plan` reads of a trace: its distinct ranks, and whether torch.distributed stated them."""
    return sorted(set(trace.ranks)), bool(trace.capabilities.get("has_distributed_info"))


def rank_plan(facts: list[tuple[list[int], bool]]) -> list[tuple[int, str]] | None:
    """(new rank, warning) per file when the files' ranks must be renumbered (:func:`assign_ranks_across_files`),
    else None."""
    ranks = [rs for rs, _ in facts]
    flat = [r for rs in ranks for r in rs]
    if len(facts) < 2 or (len(flat) == len(set(flat)) and -1 not in flat):
        return None
    if any(len(rs) != 1 for rs in ranks):
        return None  # several processes per file: keep the loaders' ranks (they came from the file itself)
    if -1 not in flat and all(stated for _, stated in facts):
        return None  # ranks stated by torch.distributed: a collision means several runs (analysis.runs)
    return [(new_rank, f"rank {new_rank} assigned from file order (the files' own ranks collide: {flat})")
            for new_rank in range(len(facts))]


def renumbered(trace: Trace, new_rank: int, note: str) -> Trace:
    """The trace with every table's rank (and its devices') set to ``new_rank``, and ``note`` as a warning."""
    out = trace
    for name, table in trace.tables.items():
        if "rank" in table and len(table):
            out = out.with_table(name, table.with_columns(rank=np.full(len(table), new_rank, dtype=np.int32)))
    return replace(out, devices=[replace(d, rank=new_rank) for d in trace.devices], warnings=[*trace.warnings, note])


def require_kernels(traces: Sequence[Trace], paths: Sequence[PathLike]) -> None:
    """Raise EmptyTraceError (naming the file, and a missing nsys kernel table) when no trace has kernels."""
    if any(len(t.kernels) for t in traces):
        return
    where = traces[0].path if len(traces) == 1 else ", ".join(str(p) for p in paths)
    raise empty_trace_error(where, any(lacks_kernel_table(t) for t in traces))


def empty_trace_error(where: PathLike, no_kernel_table: bool) -> EmptyTraceError:
    """The error for inputs without kernel activity; ``no_kernel_table``: an nsys export without its table."""
    hint = ("the export has no kernel table: profile with -t cuda (and --cuda-graph-trace=node for CUDA graphs)"
            if no_kernel_table else
            "profile with CUDA activity enabled (nsys -t cuda; torch.profiler with ProfilerActivity.CUDA)")
    return EmptyTraceError(where, "no kernel activity in the trace", hint)


def lacks_kernel_table(trace: Trace) -> bool:
    """An nsys export without its kernel table (captured without -t cuda)."""
    return trace.format == "nsys-sqlite" and not trace.capabilities.get("has_kernel_table", True)


NO_KERNEL_TABLE_HINT = "profile with -t cuda; for CUDA graphs add --cuda-graph-trace=node"
INFO_COUNTS = ("kernels", "memcpy", "memset", "nvtx_ranges", "gpu_metrics_samples")


def info(path: PathLike) -> dict[str, Any]:
    """What a trace file holds (format, versions, devices, raw activity counts) — the ``info`` JSON contract.

    A directory of rank traces is described as a whole: counts summed, devices and ranks of every file, one
    entry per file under ``files``. An nsys export without a kernel table is described too (``counts.kernels``
    0, its CUDA graph launches, a hint in ``hints``): only the analyses need kernels.
    """
    if Path(path).is_dir():
        return _info_of_files(path, [_info_one(f) | {"path": str(f)} for f in expand_paths([path])])
    return _info_one(path)


def _info_one(path: PathLike) -> dict[str, Any]:
    from ..loaders.nsys_rep import as_export

    path = as_export(path)  # an .nsys-rep: its SQLite export
    # counts and devices need no optional table: an nsys export is read without them (GPU metrics can be huge)
    trace = load_one(path, tables=frozenset() if detect_format(path) == "nsys-sqlite" else None)
    counts = {key: int(trace.raw_counts.get(key, 0)) for key in INFO_COUNTS}
    hints: list[str] = []
    graphs = int(trace.raw_counts.get("graph_launches", 0))
    if trace.format == "nsys-sqlite" and not trace.capabilities.get("has_kernel_table", True):
        graphs = graphs or _graph_launch_calls(path)
        problem = "no kernel table (CUPTI_ACTIVITY_KIND_KERNEL)"
        if graphs:
            problem += f": its {graphs} CUDA graph launches were traced at graph level, kernels not itemised"
        hints.append(f"{problem}; {NO_KERNEL_TABLE_HINT}")
    return {
        "format": trace.format,
        "tool_version": trace.tool_version,
        "schema_version": trace.schema_version,
        "devices": [{"device": d.device, "name": d.name, "rank": d.rank} for d in trace.devices],
        "counts": counts,
        "graph_launches": graphs,
        "ranks": sorted({d.rank for d in trace.devices if d.rank is not None}),
        "capabilities": trace.capabilities,
        "hints": hints,
        "warnings": list(trace.warnings),
    }


def _graph_launch_calls(path: PathLike) -> int:
    """cudaGraphLaunch calls in an nsys export's runtime API table (what ran when kernels were not itemised)."""
    trace = load_one(path, tables=frozenset({"api_calls"}))
    names = trace.strings.values
    ids = np.unique(trace.api_calls["name_id"])
    launch = [int(i) for i in ids if i >= 0 and names[int(i)].startswith("cudaGraphLaunch")]
    return int(np.isin(trace.api_calls["name_id"], launch).sum()) if launch else 0


def _info_of_files(directory: PathLike, parts: list[dict[str, Any]]) -> dict[str, Any]:
    """One ``info`` for a directory of rank traces (one format, as :func:`expand_paths` checks)."""
    def one(key: str) -> Any:
        values = {p[key] for p in parts if p[key] is not None}
        return values.pop() if len(values) == 1 else (", ".join(sorted(map(str, values))) or None)

    devices = [d for p in parts for d in p["devices"]]
    unique = list({(d["device"], d["name"], d["rank"]): d for d in devices}.values())
    return {
        "format": parts[0]["format"], "tool_version": one("tool_version"), "schema_version": one("schema_version"),
        "devices": unique, "counts": {k: sum(p["counts"][k] for p in parts) for k in INFO_COUNTS},
        "graph_launches": sum(p["graph_launches"] for p in parts),
        "ranks": sorted({r for p in parts for r in p["ranks"]}),
        "files": [{"path": p["path"], "ranks": p["ranks"], "counts": p["counts"]} for p in parts],
        "capabilities": parts[0]["capabilities"],
        "hints": [f"{Path(p['path']).name}: {h}" for p in parts for h in p["hints"]],
        "warnings": [f"{Path(p['path']).name}: {w}" for p in parts for w in p["warnings"]],
    }


__all__ = ["detect_format", "info", "load", "load_many"]
