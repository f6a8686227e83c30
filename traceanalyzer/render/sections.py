"""Report sections as plain template data (strings and small dicts) built from the result objects.

The template escapes every string; nothing here produces HTML.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from ..model.communication import NON_NCCL_ALLREDUCE_PATHS
from .figures import column, durations_ns, layer_totals
from .formatting import (
    bucket_color,
    bucket_sort_key,
    device_label,
    display_name,
    display_names,
    fmt_bytes,
    fmt_gbps,
    fmt_ns,
    fmt_pct,
    issue_only_text,
    outside_steps_text,
    pct_of,
    range_text,
    runs_lines,
    step_source_text,
)

if TYPE_CHECKING:
    from ..analysis.results import CrossRankSummary, DeviceSummary, Summary
    from ..analysis.what_if.simulate import WhatIfResult

MAX_TABLE_ROWS = 200  # rows shown at once; the next ones sit behind a "more rows" expander
MAX_EXPANDED_ROWS = 2000  # rows behind the expander at most (the page stays light); `export` has them all
#: The same for the tables that grow with devices × layers or ranks × matched instances (per-layer, matched
#: collectives): a row of theirs is wide, and the export and the Perfetto trace have every one.
WIDE_EXPANDED_ROWS = 200
TOP_KERNELS_PER_BUCKET = 10

DEFINITIONS: tuple[tuple[str, str], ...] = (
    ("span", "first kernel/memory-op start to last end on the device."),
    ("busy", "union of all GPU activity (kernels and memory operations); idle = span − busy."),
    ("bucket time", "union of the bucket's kernels. The exclusive split assigns each busy nanosecond to one "
                    "bucket so that the parts add up to busy."),
    ("comm", "union of the communication bucket's intervals (collectives and peer transfers)."),
    ("hidden comm", "comm ∩ union of the non-communication kernels on the same device: overlapped with compute."),
    ("exposed comm", "comm − hidden: the device runs collectives and no compute kernel. This is the SM-idle time "
                     "during collectives, reported per collective instance, per step and per layer."),
    ("overlap %", "hidden / comm."),
    ("steps", "from ProfilerStep annotations (Kineto) or a chosen NVTX range, else detected from the repeating "
              "kernel sequence. Per-step figures (step median, exposed comm per step) are medians over the "
              "steps, which resist a warm-up or profiler-flush step."),
    ("layers", "from NVTX ranges matching the layer pattern, else from the period of collectives within a step."),
    ("cross-rank wait", "the same collective instance matched across ranks: its transfer time ≈ the shortest "
                        "rank's duration; the rest is wait/skew. The rank that arrives last is the straggler."),
    ("algbw / busbw", "per collective: message bytes / transfer time (GB/s = 10⁹ B/s); busbw = algbw × NCCL's bus "
                      "factor (all-reduce 2(n−1)/n, all-gather and reduce-scatter (n−1)/n), against the GPU's vendor "
                      "scale-up link peak where it is known."),
    ("cost if communication were free", "the step-time reduction to expect: exposed transfer time when the GPU is "
                                        "the bottleneck; when the step is launch-bound, the host time of the "
                                        "collective calls (each call whole, plus the CPU work slowed right after "
                                        "it) that the GPU waited for. NCCL's own issue range alone is shown "
                                        "beside it when much smaller."),
)


def device_title(d: DeviceSummary) -> str:
    """Heading of one device: rank, GPU index and model."""
    return device_label(d.rank, d.device, d.name, with_name=True)


# -- header and headline ---------------------------------------------------------------------------------
def header(summary: Summary) -> dict[str, Any]:
    """Files (base names only), formats and versions, GPUs, ranks and the profiled window."""
    files = []
    for t in summary.traces:
        window = t.window_ns[1] - t.window_ns[0] if t.window_ns else None
        files.append({
            "name": Path(t.path).name, "format": t.format,
            "versions": ", ".join(f"{k} {v}" for k, v in (("tool", t.tool_version), ("schema", t.schema_version))
                                  if v) or "—",
            "ranks": ", ".join(str(r) for r in t.ranks if r is not None and r >= 0) or "—",
            "gpus": gpu_text(t.devices),
            "window": fmt_ns(window),
        })
    names = sorted({d.name for d in summary.devices if d.name})
    ranks = sorted({d.rank for d in summary.devices if d.rank is not None and d.rank >= 0})
    return {"files": files, "rows": _folded_inputs(summary), "names": _names_text([f["name"] for f in files]),
            "gpu_models": ", ".join(names) or "unknown", "n_devices": len(summary.devices),
            "ranks": ", ".join(map(str, ranks)) or "—"}


def _names_text(names: list[str]) -> str:
    """The input names, ``first … last (N files)`` beyond three."""
    return ", ".join(names) if len(names) <= 3 else f"{names[0]} … {names[-1]} ({len(names)} files)"


def _folded_inputs(summary: Summary) -> list[dict[str, str]]:
    """The inputs table: files of one format, versions and GPU models (the rank files of one job) in one row, with
    their ranks and GPUs together and the range of their windows."""
    groups: dict[tuple[Any, ...], list[Any]] = {}
    for t in summary.traces:
        models = tuple(sorted({str(d.get("name") or "") for d in t.devices}))
        groups.setdefault((t.format, t.tool_version, t.schema_version, models), []).append(t)
    rows = []
    for (fmt, tool, schema, _), traces in groups.items():
        windows = sorted(w[1] - w[0] for w in (t.window_ns for t in traces) if w)
        ranks = sorted({r for t in traces for r in t.ranks if r is not None and r >= 0})
        rows.append({
            "name": _names_text([Path(t.path).name for t in traces]), "format": fmt,
            "versions": ", ".join(f"{k} {v}" for k, v in (("tool", tool), ("schema", schema)) if v) or "—",
            "ranks": _id_ranges(ranks) or "—", "gpus": gpu_text([d for t in traces for d in t.devices]),
            "window": "—" if not windows else fmt_ns(windows[0]) if windows[0] == windows[-1] else
            f"{fmt_ns(windows[0])} – {fmt_ns(windows[-1])}"})
    return rows


def gpu_text(devices: Sequence[dict[str, Any]]) -> str:
    """The GPUs of one input, each model named once: ``8 × NVIDIA H200 (GPU 0–7)``, ``NVIDIA H200 (GPU 1)``."""
    by_model: dict[str, list[int]] = {}
    for d in devices:
        by_model.setdefault(str(d.get("name") or "unknown model"), []).append(int(d.get("device", -1)))
    parts = []
    for model, ids in by_model.items():
        count = f"{len(ids)} × " if len(ids) > 1 else ""
        parts.append(f"{count}{model} (GPU {_id_ranges(sorted(set(ids)))})")
    return "; ".join(parts) or "—"


def _id_ranges(ids: list[int]) -> str:
    """``0–3, 6`` for [0, 1, 2, 3, 6]."""
    out: list[str] = []
    start = prev = None
    for i in [*ids, None]:
        if start is not None and (i is None or prev is None or i != prev + 1):
            out.append(str(start) if start == prev else f"{start}–{prev}")
            start = None
        if i is not None and start is None:
            start = i
        prev = i
    return ", ".join(out)


def _step_ns(summary: Summary) -> float | None:
    medians = [d.step_ns_median for d in summary.devices if d.step_ns_median]
    return float(np.median(medians)) if medians else None


def headline(summary: Summary) -> list[dict[str, str]]:
    """The few numbers a reader needs first, pooled over devices."""
    devices = summary.devices
    step = _step_ns(summary)
    cards: list[dict[str, str]] = []
    if step:
        n_steps = max((d.steps for d in devices), default=0)
        plural = "" if n_steps == 1 else "s"
        cards.append({"label": "median step", "value": fmt_ns(step), "sub": f"{n_steps} step{plural} profiled"})
    per_step = [d.comm_exposed_per_step_ns for d in devices if d.comm_exposed_per_step_ns is not None and d.comm_ns]
    if per_step:
        worst = max(per_step)
        cards.append({"label": "exposed comm per step (worst device)", "value": fmt_ns(worst),
                      "sub": f"{fmt_pct(pct_of(worst, step))} of the step" if step else "SM idle during collectives"})
    comm = sum(d.comm_ns for d in devices)
    if comm:
        hidden = sum(d.comm_hidden_ns for d in devices)
        busy = sum(d.busy_ns for d in devices)
        cards.append({"label": "communication hidden under compute", "value": fmt_pct(pct_of(hidden, comm)),
                      "sub": f"comm is {fmt_pct(pct_of(comm, busy))} of busy time"})
    saving = summary.what_if.comm_free_step_saving_ns
    if not comm:
        cards.append({"label": "communication", "value": "none", "sub": "no collective or peer copy ran"})
    elif saving is not None:
        sub = [f"{fmt_pct(pct_of(saving, step))} of the step"] if step else []
        sub += [f"basis: {summary.what_if.basis}", range_text(summary.what_if), issue_only_text(summary.what_if)]
        cards.append({"label": "step saving if comm were free", "value": fmt_ns(saving),
                      "sub": " · ".join(part for part in sub if part)})
    span = sum(d.span_ns for d in devices)
    window_pct = fmt_pct(pct_of(sum(d.busy_ns for d in devices), span))
    in_steps = [d.in_steps for d in devices if d.step_source != "none" and d.in_steps.get("window_ns")]
    if in_steps and len(in_steps) == len(devices):
        busy = sum(int(x["busy_ns"]) for x in in_steps)
        cards.append({"label": "GPU busy in the steps", "value": fmt_pct(pct_of(busy, sum(int(x["window_ns"])
                                                                                         for x in in_steps))),
                      "sub": f"all devices; whole window (warm-up and gaps between steps included): {window_pct}"})
    elif span:
        cards.append({"label": "GPU busy", "value": window_pct, "sub": "of the profiled span, all devices (no steps "
                      "found: whole window)"})
    cr = summary.cross_rank
    if cr is not None and cr.straggler_rank is not None:
        cards.append({"label": "straggler", "value": f"rank {cr.straggler_rank}",
                      "sub": f"{cr.collectives_matched} collectives matched"})
    return cards


def _evidence_text(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, tuple)) and len(value) > 8:
        return ", ".join(map(str, value[:8])) + f", … ({len(value)} items)"
    text = str(value)
    return text if len(text) <= 200 else text[:199] + "…"


def findings(summary: Summary) -> list[dict[str, Any]]:
    """Findings, largest impact per step first (unquantified ones last)."""
    step = _step_ns(summary)
    ordered = sorted(summary.findings, key=lambda f: (f.impact_ns_per_step is None, -(f.impact_ns_per_step or 0)))
    rows = []
    for f in ordered:
        pct = f.impact_pct_of_step if f.impact_pct_of_step is not None else pct_of(f.impact_ns_per_step, step)
        rows.append({"id": f.id, "title": f.title, "severity": f.severity, "recommendation": f.recommendation,
                     "impact": f"{fmt_ns(f.impact_ns_per_step)}/step" if f.impact_ns_per_step is not None
                     else "not quantified", "pct": fmt_pct(pct),
                     "evidence": [(str(k), _evidence_text(v)) for k, v in f.evidence.items()]})
    return rows


def not_applicable(summary: Summary) -> dict[str, str]:
    """What does not apply to these traces, said instead of drawing an empty chart: ``comm`` (no device
    communicates), ``steps`` (no device has two steps), ``ranks`` (one rank); ``""`` where it applies."""
    devices = summary.devices
    out = {"comm": "", "steps": "", "ranks": ""}
    if not any(d.comm_ns for d in devices):
        out["comm"] = ("No communication kernels or peer copies in these traces: hidden vs exposed communication, "
                       "per-layer and per-collective exposure, cross-rank wait and the what-if do not apply.")
    if not any(d.steps >= 2 for d in devices):
        if all(d.step_source == "none" for d in devices):
            found = "No steps found (the whole profiled window stands in for one)"
        else:
            found = f"One step found (sources: {', '.join(sorted({d.step_source for d in devices}))})"
        out["steps"] = f"{found}: a step-by-step chart needs two or more; the table above has the figures."
    if len({d.rank for d in devices}) < 2:
        out["ranks"] = "One rank: cross-rank wait, skew and straggler need two or more ranks."
    return out


# -- tables --------------------------------------------------------------------------------------------------
def device_rows(summary: Summary) -> dict[str, Any]:
    """The per-device numbers table (without the communication columns when no device communicates)."""
    comm = any(d.comm_ns for d in summary.devices)
    comm_cols = ["comm", "hidden", "exposed", "overlap"] if comm else []
    cols = ["device", "span", "busy", "idle", *comm_cols, "steps", "step median",
            *(["exposed/step"] if comm else []), "busy % in steps", "busy % window", "steps from", "layers/step",
            *(["comm streams"] if comm else [])]
    rows = []
    for d in summary.devices:
        comm_cells = [fmt_ns(d.comm_ns), fmt_ns(d.comm_hidden_ns), fmt_ns(d.comm_exposed_ns), fmt_pct(d.overlap_pct)]
        rows.append([device_title(d), fmt_ns(d.span_ns), fmt_ns(d.busy_ns), fmt_ns(d.idle_ns),
                     *(comm_cells if comm else []), str(d.steps), fmt_ns(d.step_ns_median),
                     *([fmt_ns(d.comm_exposed_per_step_ns)] if comm else []),
                     fmt_pct(d.in_steps.get("busy_pct")) if d.step_source != "none" else "—",
                     fmt_pct(pct_of(d.busy_ns, d.span_ns)), step_source_text(d),
                     f"{d.layers_per_step} ({d.layer_source})" if d.layers_per_step else "none",
                     *([", ".join(map(str, d.comm_streams)) or "—"] if comm else [])])
    numeric = [False] + [True] * (len(cols) - 1 - 2 - (1 if comm else 0)) + [False] * (2 + (1 if comm else 0))
    return {"columns": cols, "rows": rows, "numeric": numeric, "omitted": 0}


_NS_COLUMN = re.compile(r"_ns(_r\d+)?$")  # integer-ns columns, per-rank ones included (wait_ns_r0)


def _header(col: str) -> str:
    """``comm_exposed_ns`` → ``comm exposed``, ``wait_ns_r1`` → ``wait r1`` (cells carry their unit); others
    unchanged."""
    m = _NS_COLUMN.search(col)
    if m is None:
        return col
    return (col[: m.start()] + (m.group(1) or "")).replace("_", " ")


def _cell(value: Any, col: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    unknown_marker = isinstance(value, (int, np.integer)) and value == -1
    if unknown_marker and (_NS_COLUMN.search(col) or col.endswith("rank")):  # -1 = not known (schema)
        return "—"
    if _NS_COLUMN.search(col) and isinstance(value, (int, float, np.integer, np.floating)):
        return fmt_ns(value)
    if isinstance(value, (float, np.floating)):
        number = float(value)
        return f"{number:,.0f}" if abs(number) >= 1e5 else f"{number:.4g}"
    return str(value)


def frame_table(df: pd.DataFrame, columns: Sequence[str] | None = None, *,
                max_rows: int = MAX_TABLE_ROWS, expanded: int = MAX_EXPANDED_ROWS) -> dict[str, Any]:
    """Any DataFrame as a table: ``*_ns`` columns shown in ms (header says so), at most ``max_rows`` rows shown
    and ``expanded`` more behind the expander; the number of rows left out after those."""
    cols = [c for c in (columns or list(df.columns)) if c in df.columns]
    frame = df[cols].head(max_rows + expanded)
    if "name" in cols:
        frame = frame.assign(name=display_names(frame["name"].tolist()))
    heads = [_header(c) for c in cols]
    numeric = [pd.api.types.is_numeric_dtype(df[c]) for c in cols]
    rows = [[_cell(v, c) for v, c in zip(rec, cols, strict=True)] for rec in frame.itertuples(index=False)]
    return {"columns": heads, "rows": rows[:max_rows], "more": rows[max_rows:], "numeric": numeric,
            "omitted": max(len(df) - max_rows - expanded, 0)}


def layer_rows(devices: Sequence[DeviceSummary]) -> dict[str, Any] | None:
    """Per-layer communication of every device (summed over steps) as one table."""
    frames = []
    for d in devices:
        totals = layer_totals(d.per_layer)
        if len(totals):
            frames.append(totals.assign(device=device_label(d.rank, d.device)))
    if not frames:
        return None
    df = pd.concat(frames, ignore_index=True)
    return frame_table(df, ["device", "layer", "name", "occurrences", "comm_ns", "comm_exposed_ns", "compute_ns",
                            "exposed_median_ns"], expanded=WIDE_EXPANDED_ROWS)


def collective_rows(devices: Sequence[DeviceSummary], cross: CrossRankSummary | None = None) -> dict[str, Any] | None:
    """Collectives grouped by name and message size per device: count, total, exposed, mean and p99 duration,
    transfer and wait (cross-rank), algbw and busbw against the link's peak where it is known."""
    from ..analysis.collectives import with_transfer
    from ..model.communication import link_peak_gbps

    rows, peaks, sized = [], set(), False
    for d in devices:
        if not len(d.collectives) or "name" not in d.collectives.columns:
            continue
        sized = sized or bool((d.collectives["bytes"] > 0).any()) if "bytes" in d.collectives else sized
        peak = link_peak_gbps(d.name)
        df = with_transfer(d.collectives, d.rank, cross, peak)
        if peak:
            peaks.add(f"{d.name}: {peak:g} GB/s")
        for (name, size), g in df.groupby([df["name"].astype(str), "bytes"], sort=True):
            du = g["duration_ns"].to_numpy(dtype=float)
            ex = float(np.nansum(g["exposed_ns"].to_numpy(dtype=float)))
            busbw = g["busbw_gbps"].to_numpy(dtype=float)
            bw_pct = g["busbw_pct_of_peak"].to_numpy(dtype=float)
            rows.append([device_label(d.rank, d.device), display_name(str(name)), str(len(g)),
                         fmt_bytes(size), fmt_ns(du.sum()), fmt_ns(ex), fmt_pct(pct_of(ex, du.sum())),
                         fmt_ns(du.mean()), fmt_ns(np.percentile(du, 99)),
                         fmt_ns(g["transfer_ns"].mean()) if g["matched"].any() else "—",
                         fmt_ns(g["wait_ns"].mean()) if g["matched"].any() else "—",
                         fmt_gbps(_nanmedian(g["algbw_gbps"].to_numpy(dtype=float))), fmt_gbps(_nanmedian(busbw)),
                         fmt_pct(_nanmedian(bw_pct), 0)])
    if not rows:
        return None
    cols = ["device", "collective", "count", "size", "total", "exposed", "exposed %", "mean", "p99", "transfer",
            "wait", "algbw", "busbw", "busbw % of link peak"]
    note = ("link peak (vendor, per GPU, one direction): " + "; ".join(sorted(peaks))) if peaks else \
        "link peak unknown for these GPUs"
    if not sized:
        note += ("; message sizes not recorded, so size, algbw and busbw cannot be computed (nsys profile -t cuda,nvtx "
                 "records NCCL's NVTX payloads; torch.profiler(record_shapes=True) records record_param_comms)")
    return {"columns": cols, "rows": rows, "numeric": [False, False] + [True] * 12, "omitted": 0, "note": note}


def _nanmedian(values: np.ndarray) -> float | None:
    ok = values[~np.isnan(values)]
    return float(np.median(ok)) if len(ok) else None


def gap_rows(devices: Sequence[DeviceSummary]) -> dict[str, Any] | None:
    """Statistics of SM-idle segments during collectives per device."""
    rows = []
    for d in devices:
        df = d.comm_idle_gaps_ns
        if not len(df):
            continue
        dur = durations_ns(df)
        rows.append([device_label(d.rank, d.device), str(len(dur)), fmt_ns(dur.sum()),
                     fmt_ns(np.percentile(dur, 50)), fmt_ns(np.percentile(dur, 90)), fmt_ns(dur.max())])
    if not rows:
        return None
    return {"columns": ["device", "segments", "total", "p50", "p90", "max"], "rows": rows,
            "numeric": [False] + [True] * 5, "omitted": 0}


def cross_rank(cr: CrossRankSummary | None) -> dict[str, Any] | None:
    """Cross-rank facts and the wait-by-rank table."""
    if cr is None:
        return None
    table = {"columns": ["rank", "wait/skew", "straggler"],
             "rows": [[str(r), fmt_ns(ns), "yes" if r == cr.straggler_rank else ""]
                      for r, ns in sorted(cr.wait_ns_by_rank.items())],
             "numeric": [False, True, False], "omitted": 0}
    return {"matched": cr.collectives_matched, "transfer_per_step": fmt_ns(cr.transfer_ns_per_step),
            "straggler": "—" if cr.straggler_rank is None else f"rank {cr.straggler_rank}",
            "method": cr.match_method or "—", "table": table,
            "per_collective": _matched_table(cr.per_collective)}


def _matched_table(per: pd.DataFrame, max_rows: int = 50) -> dict[str, Any] | None:
    """Matched collective instances with the most wait first: kind, step, transfer, per-rank duration and wait."""
    if not len(per):
        return None
    waits = [c for c in per.columns if c.startswith("wait_ns_r")]
    durations = [c for c in per.columns if c.startswith("duration_ns_r")]
    if waits:
        per = per.assign(_wait=per[waits].sum(axis=1)).sort_values("_wait", ascending=False, kind="stable")
    cols = ["kind", "step", "step_ordinal", "seq", "transfer_ns", *durations, *waits, "arrival_skew_ns",
            "last_arrival_rank", "least_wait_rank"]
    return frame_table(per, cols, max_rows=max_rows, expanded=WIDE_EXPANDED_ROWS - max_rows)


def top_kernel_groups(devices: Sequence[DeviceSummary]) -> list[dict[str, Any]]:
    """Per device, per bucket: the heaviest kernels (name, rule, count, total, mean, p50, p99)."""
    wanted = ["name", "subbucket", "rule", "precision", "count", "total_ns", "window_total_ns", "mean_ns", "p50_ns",
              "p99_ns"]
    out = []
    for d in devices:
        stepped = d.step_source != "none" and len(d.top_kernels_in_steps)
        df = d.top_kernels_in_steps if stepped else d.top_kernels
        if not len(df) or "bucket" not in df.columns:
            continue
        total = column(df, "total_ns")
        groups = []
        for bucket in sorted({str(b) for b in df["bucket"]}, key=bucket_sort_key):
            part = df[df["bucket"].astype(str) == bucket]
            if total:
                part = part.sort_values(total, ascending=False, kind="stable")
            groups.append({"bucket": bucket, "color": bucket_color(bucket),
                           "table": frame_table(part, wanted, max_rows=TOP_KERNELS_PER_BUCKET)})
        where = f"kernels inside the {d.steps} steps (window_total: the whole window)" if stepped \
            else "whole window"
        out.append({"device": f"{device_title(d)} — {where}", "groups": groups})
    return out


PHASE_ORDER = ("all", "comm_exposed", "comm_hidden", "idle")


def _phase_key(phase: str) -> tuple[int, int, str]:
    if phase in PHASE_ORDER:
        return (0, PHASE_ORDER.index(phase), phase)
    return (1, *bucket_sort_key(phase))


def gpu_metric_rows(df: pd.DataFrame | None) -> dict[str, Any] | None:
    """GPU metric means (nsys GPU_METRICS) per device and metric, one column per phase (what the GPU ran)."""
    if df is None or not len(df):
        return None
    if not {"device", "metric", "phase", "mean"} <= set(df.columns):
        return frame_table(df)
    phases = sorted({str(p) for p in df["phase"]}, key=_phase_key)
    keys = ["trace", "device", "metric"] if "trace" in df.columns and df["trace"].nunique() > 1 else \
        ["device", "metric"]
    table = df.assign(phase=df["phase"].astype(str)).pivot_table(index=keys, columns="phase", values="mean",
                                                                   aggfunc="first", sort=True)
    rows = []
    for index, values in table.iterrows():
        head = [str(v) if k != "trace" else Path(str(v)).name
                for k, v in zip(keys, index if isinstance(index, tuple) else (index,), strict=True)]
        rows.append(head + [_cell(values.get(p), p) for p in phases])
    return {"columns": keys + [f"mean: {p}" for p in phases], "rows": rows,
            "numeric": [k == "device" for k in keys] + [True] * len(phases), "omitted": 0}


POWER_COLUMNS = {"gpu": "GPU", "name": "model", "samples": "samples", "power_mean_w": "power mean (W)",
                 "power_max_w": "power max (W)", "power_limit_w": "limit (W)",
                 "power_mean_pct_of_limit": "mean % of limit", "sm_clock_mhz_mean": "SM clock mean (MHz)",
                 "util_pct_mean": "utilization mean (%)", "temp_c_mean": "temperature mean (°C)"}


def power_rows(power: dict[str, Any] | None) -> dict[str, Any] | None:
    """The aligned nvidia-smi log: one row per GPU (power mean/max vs limit, SM clock, utilisation)."""
    if not power:
        return None
    gpus = power.get("gpus", [])
    keys = [k for k in POWER_COLUMNS if any(k in g for g in gpus)]
    rows = [[_cell(g.get(k), k) for k in keys] for g in gpus]
    return {"log": str(power.get("log", "")), "timezone": str(power.get("assumed_timezone", "")),
            "matched": bool(power.get("matched", True)), "reason": str(power.get("reason", "")),
            "table": {"columns": [POWER_COLUMNS[k] for k in keys], "rows": rows, "numeric": [k != "name" for k in keys],
                      "omitted": 0}}


def method_notes(summary: Summary) -> dict[str, Any]:
    """Definitions, how steps/layers were found, exclusive-bucket precedence, exclusions and warnings."""
    sources = [{"device": device_label(d.rank, d.device),
                "steps": "; ".join(t for t in (step_source_text(d), outside_steps_text(d)) if t),
                "evidence": ", ".join(f"{k}: {v}" for k, v in d.step_evidence.items()),
                "layers": f"{d.layers_per_step} per step ({d.layer_source})" if d.layers_per_step else "none",
                "serialized": d.comm_serialized_with_compute} for d in summary.devices]
    warnings = list(summary.warnings)
    for t in summary.traces:
        warnings += [f"{Path(t.path).name}: {w}" for w in t.warnings]
    precedence = next(
        (d.figures.exclusive_precedence for d in summary.devices
         if d.figures is not None and d.figures.exclusive_precedence), None)
    excluded = _outside_steps(summary)
    return {"definitions": DEFINITIONS, "sources": sources,
            "precedence": " > ".join(map(str, precedence)) if precedence else None,
            "excluded": excluded, "warnings": list(dict.fromkeys(warnings)),
            "runs": [line.strip() for line in runs_lines(summary)]}


def _outside_steps(summary: Summary) -> list[str]:
    """Busy time outside the step windows, which per-step figures leave out (window totals keep it)."""
    notes = []
    for d in summary.devices:
        if not len(d.per_step) or "busy_ns" not in d.per_step.columns or not d.busy_ns:
            continue
        outside = d.busy_ns - int(d.per_step["busy_ns"].sum())
        if outside > 0:
            notes.append(f"{device_label(d.rank, d.device)}: {fmt_ns(outside)} "
                         f"({fmt_pct(pct_of(outside, d.busy_ns))} of busy time) lies outside the {d.steps} steps "
                         "(warm-up, profiler flush); per-step figures leave it out, window totals include it.")
    return notes


def platform_lines(summary: Summary) -> list[str]:
    """The platform as the trace records it, and the communication paths in use and missing (plain text; the
    HTML escapes it)."""
    p = summary.platform
    if p is None:
        return []
    gpu = p.gpu_model or "GPU model unknown"
    cc = f"compute capability {p.compute_capability} ({p.architecture})" if p.compute_capability else \
        "compute capability unknown"
    link = {"nvlink": "NVLink", "pcie": "PCIe, no NVLink", "unknown": "interconnect unknown",
            "none": "one GPU"}.get(p.interconnect, p.interconnect)
    why = f" — {'; '.join(p.interconnect_evidence)}" if p.interconnect_evidence else ""
    lines = [f"Platform: {p.gpu_count} × {gpu}, {cc}, world size {p.world_size or 'unknown'}, {link}{why}"]
    if p.comm:
        used = []
        for path, use in p.comm.items():
            text = path.replace("_", " ")
            if path == "nccl" and use.algorithms:
                total = sum(use.algorithms.values())
                text += " (" + ", ".join(f"{k} {100 * v / total:.0f}%" for k, v in
                                         sorted(use.algorithms.items(), key=lambda kv: -kv[1])) + " by kernel name)"
            used.append(f"{text}: {use.kernels} kernels")
        missing = [m.replace("_", " ") for m in NON_NCCL_ALLREDUCE_PATHS if m not in p.comm]
        lines.append("Communication paths: " + "; ".join(used) +
                     (f"; none of: {', '.join(missing)}" if missing else ""))
    if p.frameworks:
        lines.append("Kernel families: " + ", ".join(f["name"] for f in p.frameworks))
    unknown = [u for u in p.unknown if u["what"] != "framework version and launch settings"]
    for u in unknown:
        lines.append(f"Unknown: {u['what']} — {u['how_to_capture']}")
    return lines


def cause_rows(summary: Summary) -> list[dict[str, Any]]:
    """The known causes that fired (``cause_*`` findings): title, what to set, the alternative, the sources."""
    return [{"id": f.id, "title": f.title, "settings": f.evidence.get("settings", {}),
             "alternative": f.evidence.get("alternative", ""), "sources": f.evidence.get("sources", []),
             "explains": f.evidence.get("explains", {})}
            for f in summary.findings if f.id.startswith("cause_")]


def combined_line(summary: Summary) -> str | None:
    """"Together at most X ms/step" from the findings' shared time, never their sum."""
    c = summary.findings_combined
    if not c:
        return None
    shared = [g for g in c["groups"] if len(g["findings"]) > 1 and g["at_most_ns_per_step"] < g["sum_of_impacts_ns"]]
    words = {"sm_idle_in_collectives": "SM-idle-in-collectives", "gpu_idle": "GPU-idle", "norm_chain": "norm-chain",
             "comm_beside_compute": "compute-beside-communication"}
    note = "".join(f"; {', '.join(g['findings'])} share the same {words.get(g['time'], g['time'])} time: do not add "
                   "them" for g in shared)
    pct = f" ({c['pct_of_step']:.0f}% of the step)" if c.get("pct_of_step") is not None else ""
    return (f"Together the findings save at most {fmt_ns(c['at_most_ns_per_step'])}/step{pct}, "
            f"not the {fmt_ns(c['sum_of_impacts_ns'])} their impacts add up to{note}")


def critical_path(result: WhatIfResult | None, traces: Sequence[object]) -> dict[str, Any]:
    """The report's critical-path section: the median step's path (``render.whatif.critical_path_html``, escaped
    by construction), the no-change replay's error and what the path is, or why there is none."""
    from .whatif import critical_path_html

    body = critical_path_html(result, heading="h3") if result is not None else None
    if result is None or body is None:
        why = ("no step with GPU activity to replay" if traces else
               "the report was made without the traces themselves (the Dask engine keeps them on its workers)")
        return {"body": None, "empty": f"No critical path: {why}."}
    return {"body": body, "empty": None, "steps": len(result.steps),
            "error": fmt_pct(result.no_change_error_pct, 2), "nodes": result.graph["nodes"],
            "edges": result.graph["edges"], "notes": list(result.graph.get("notes", []))}
