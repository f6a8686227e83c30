"""Kernels of two runs matched by role, and collectives and findings compared, for ``diff``.

**Kernel roles.** Each side's kernels inside step windows are grouped by normalized name (TAXONOMY decision 15)
with bucket and sub-bucket, counted and timed per device-step. Groups are matched in three passes, each on what
the previous left:

1. ``name``: the same normalized name and bucket.
2. ``role``: the same *role key* — the function name without template arguments and parameters, tile shapes
   (``128x256x64``), digits and case folded away — plus bucket, sub-bucket and the launch geometry (grid and
   block, when the trace records them and both sides have them; otherwise not compared). A re-tiled GEMM
   (``…_128x128x64_…`` → ``…_256x128x64_…``) or a template change matches here.
3. ``bucket``: within one bucket and sub-bucket (not the catch-all ``other``), the remaining groups are paired
   greedily (largest time first) when they launch as often per step (within ``COUNT_TOLERANCE``) and take
   comparable time (within ``TIME_RATIO``): a library upgrade that renames a GEMM (cuBLAS ``sm90_xmma_gemm_…`` →
   ``nvjet_…``) keeps its role, its launches per step and roughly its time.

What is left is listed as ``added`` or ``removed``. ``kernel_overlap`` is the share of both sides' kernel time
(per step) that found a partner: a low value means the two runs are different workloads.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pandas as pd

from ..device import DeviceKey, DeviceState, device_key
from ..numeric import intervals as iv
from ..results import DeviceSummary, Finding

COUNT_TOLERANCE = 0.10  # launches per step within ±10 % pair two renamed kernels of one bucket
TIME_RATIO = 8.0  # ... and their times per step within this factor of each other
CATCH_ALL = "other"  # the catch-all bucket: launch counts say nothing about identity there, no pass 3
KERNEL_COLUMNS = ["match", "bucket", "subbucket", "before_name", "after_name", "before_count", "after_count",
                  "before_ns", "after_ns", "delta_ns"]
_SHAPE = re.compile(r"\d+(?:x\d+)+")
_DIGITS = re.compile(r"\d+")
_SEPARATORS = re.compile(r"[_\s]+")


def role_key(name: str) -> str:
    """The role of a kernel name: its function name without template arguments, parameters, tile shapes and
    numbers, lower-cased (``sm90_xmma_gemm_bf16_128x256x64_tn`` → ``smxmma_gemm_bf_tn``)."""
    from ...classify.normalize import head, normalize_name

    text = head(normalize_name(name)) or name
    text = _SHAPE.sub("", text)
    text = _DIGITS.sub("", text)
    return _SEPARATORS.sub("_", text).strip("_").lower()


GROUP_COLUMNS = ["name", "bucket", "subbucket", "grid", "block", "count", "ns"]
Group = dict[str, Any]


def _group_rows(columns: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Rows grouped by equal values in all ``columns`` (integer arrays of one length): each row's group, numbered in
    order of first appearance, and each group's first row."""
    group = np.zeros(len(columns[0]), dtype=np.int64)
    for column in columns:  # one pair of codes at a time, renumbered, so the combined code never overflows
        codes, uniques = pd.factorize(column, sort=False)
        group = pd.factorize(group * len(uniques) + codes, sort=False)[0]
    first = np.searchsorted(np.maximum.accumulate(group), np.arange(group.max() + 1 if len(group) else 0))
    return group, first


def kernel_groups(devices: list[DeviceSummary], states: Mapping[DeviceKey, DeviceState]) -> pd.DataFrame:
    """Per (normalized name, bucket, sub-bucket, grid, block): launches and time per device-step, counting the
    kernels that start inside the devices' step windows (columns ``GROUP_COLUMNS``); a device without its
    working state in ``states`` (its activity) counts none."""
    from ...classify.normalize import normalize_name

    totals: dict[tuple[Any, ...], list[float]] = {}
    steps = 0
    for dev in devices:
        state = states.get(device_key(dev))
        act = state.activity if state is not None else None
        if act is None or not len(dev.per_step) or not len(act.kernels):
            continue
        steps += len(dev.per_step)
        k, trace = act.kernels, act.trace
        inside = iv.window_of(k["start_ns"], dev.per_step["start_ns"].to_numpy(np.int64),
                              dev.per_step["end_ns"].to_numpy(np.int64)) >= 0
        none = np.full(int(inside.sum()), -1, dtype=np.int64)
        columns = [k[c][inside] if c in k else none for c in ("name_id", "bucket_id", "subbucket_id", "grid",
                                                               "block")]
        group, first = _group_rows(columns)
        sizes = np.bincount(group).tolist()
        times = np.bincount(group, weights=(k["end_ns"] - k["start_ns"])[inside]).tolist()
        names, buckets, subs = trace.names(np.concatenate([c[first] for c in columns[:3]])).reshape(3, -1)
        grids, blocks = (c[first].tolist() for c in columns[3:])
        for name, bucket, sub, grid, block, size, total in zip(names, buckets, subs, grids, blocks, sizes, times,
                                                               strict=True):
            key = (normalize_name(str(name)), str(bucket), "" if sub is None else str(sub), grid, block)
            acc = totals.setdefault(key, [0.0, 0.0])
            acc[0] += size
            acc[1] += total
    rows = [(*key, n / steps, t / steps) for key, (n, t) in totals.items()]
    return pd.DataFrame(rows, columns=GROUP_COLUMNS)


def _collapse(groups: list[Group], key: Callable[[Group], tuple[Any, ...]]) -> dict[tuple[Any, ...], Group]:
    """Groups merged by ``key``: summed count and time, other fields from the largest member (members kept)."""
    out: dict[tuple[Any, ...], Group] = {}
    for g in sorted(groups, key=lambda g: -g["ns"]):
        merged = out.get(key(g))
        if merged is None:
            out[key(g)] = {**g, "members": [g]}
        else:
            merged["count"] += g["count"]
            merged["ns"] += g["ns"]
            merged["members"].append(g)
    return out


def _row(match: str, b: Group | None, a: Group | None) -> dict[str, Any]:
    ref = b if b is not None else a
    assert ref is not None
    return {"match": match, "bucket": ref["bucket"], "subbucket": ref["subbucket"],
            "before_name": b["name"] if b else None, "after_name": a["name"] if a else None,
            "before_count": b["count"] if b else 0.0, "after_count": a["count"] if a else 0.0,
            "before_ns": b["ns"] if b else 0.0, "after_ns": a["ns"] if a else 0.0}


def _pass(before: list[Group], after: list[Group], key: Callable[[Group], tuple[Any, ...]], match: str,
          rows: list[dict[str, Any]]) -> tuple[list[Group], list[Group]]:
    """Match groups with equal ``key`` (appending rows); returns the groups left on each side."""
    b, a = _collapse(before, key), _collapse(after, key)
    left_b: list[Group] = []
    for k, group in b.items():
        if k in a:
            rows.append(_row(match, group, a[k]))
        else:
            left_b += group["members"]
    return left_b, [g for k, group in a.items() if k not in b for g in group["members"]]


def _pair_by_count(before: list[Group], after: list[Group], rows: list[dict[str, Any]]) -> None:
    """Pass 3: within a bucket and sub-bucket, pair role groups launched as often per step (largest first);
    the rest are ``removed`` / ``added``."""
    def role(g: Group) -> tuple[Any, ...]:
        return g["role"], g["bucket"], g["subbucket"]

    def alike(g: Group, h: Group) -> bool:
        return ((g["bucket"], g["subbucket"]) == (h["bucket"], h["subbucket"]) and g["bucket"] != CATCH_ALL
                and abs(g["count"] - h["count"]) <= COUNT_TOLERANCE * max(g["count"], h["count"])
                and max(g["ns"], h["ns"]) <= TIME_RATIO * min(g["ns"], h["ns"]))

    free = list(_collapse(after, role).values())
    for group in _collapse(before, role).values():
        partner = next((g for g in free if alike(g, group)), None)
        if partner is None:
            rows.append(_row("removed", group, None))
        else:
            free.remove(partner)
            rows.append(_row("bucket", group, partner))
    rows += [_row("added", None, g) for g in free]


def _as_groups(frame: pd.DataFrame) -> list[Group]:
    """The rows of a :func:`kernel_groups` frame as dicts."""
    keys = [str(c) for c in frame.columns]
    rows = zip(*(frame[c].tolist() for c in frame.columns), strict=True)
    return [dict(zip(keys, row, strict=True)) for row in rows]


def _with_roles(groups: list[Group]) -> list[Group]:
    """The groups, each given its name's ``role`` (one :func:`role_key` per distinct name)."""
    roles: dict[str, str] = {}
    for g in groups:
        name = str(g["name"])
        role = roles.get(name)
        g["role"] = roles[name] = role_key(name) if role is None else role
    return groups


def match_kernels(before: pd.DataFrame, after: pd.DataFrame) -> pd.DataFrame:
    """The kernel table of ``diff`` (columns ``KERNEL_COLUMNS``), largest absolute change first."""
    sides = [_as_groups(before), _as_groups(after)]
    b, a = sides
    geometry = all(any(g["grid"] >= 0 and g["block"] >= 0 for g in side) for side in sides)
    rows: list[dict[str, Any]] = []
    b, a = _pass(b, a, lambda g: (g["name"], g["bucket"]), "name", rows)
    b, a = _with_roles(b), _with_roles(a)  # only the groups pass 1 left need a role
    b, a = _pass(b, a, lambda g: (g["role"], g["bucket"], g["subbucket"], g["grid"] if geometry else -1,
                                  g["block"] if geometry else -1), "role", rows)
    _pair_by_count(b, a, rows)
    out = pd.DataFrame(rows, columns=KERNEL_COLUMNS[:-1])
    out["delta_ns"] = out["after_ns"].astype(float) - out["before_ns"].astype(float)
    order = np.argsort(-out["delta_ns"].abs().to_numpy(), kind="stable")
    return out.iloc[order].reset_index(drop=True)


def kernel_overlap(kernels: pd.DataFrame) -> float | None:
    """Share of both sides' kernel time per step in matched groups (0–1); None without kernels."""
    total = float(kernels["before_ns"].sum() + kernels["after_ns"].sum())
    if total <= 0:
        return None
    matched = kernels[~kernels["match"].isin(["added", "removed"])]
    return float(matched["before_ns"].sum() + matched["after_ns"].sum()) / total


def collective_table(devices: list[DeviceSummary], cross_per: pd.DataFrame | None) -> pd.DataFrame:
    """Per collective kind, per device-step: instances, bytes and time; transfer time and median bus bandwidth
    from the cross-rank match when there is one (else the devices' own durations). ``bytes`` is NaN (unknown) for a
    kind with an instance whose message size the trace does not give, never a sum that counts it as 0."""
    kinds, sizes, durations, steps = [], [], [], 0
    for dev in devices:
        c = dev.collectives
        if not len(dev.per_step):
            continue
        steps += len(dev.per_step)
        if len(c):
            inside = c["step"].to_numpy() >= 0
            kinds.append(c["kind"].astype(str).to_numpy()[inside])
            sizes.append(c["bytes"].to_numpy(np.int64)[inside])  # -1: unknown
            durations.append(c["duration_ns"].to_numpy(np.int64)[inside])
    columns = ["kind", "count", "bytes", "duration_ns", "transfer_ns", "busbw_gbps"]
    if not kinds or steps == 0:
        return pd.DataFrame(columns=columns)
    names, group = np.unique(np.concatenate(kinds), return_inverse=True)  # sorted by kind
    size = np.concatenate(sizes)
    unsized = np.bincount(group, weights=size < 0, minlength=len(names)) > 0
    out = {"kind": names, "count": np.bincount(group, minlength=len(names)) / steps,
           "bytes": np.where(unsized, np.nan, _sums(group, np.maximum(size, 0), len(names)) / steps),
           "duration_ns": _sums(group, np.concatenate(durations), len(names)) / steps,
           "transfer_ns": np.full(len(names), np.nan), "busbw_gbps": np.full(len(names), np.nan)}
    if cross_per is not None and len(cross_per):
        stepped = cross_per["step"].to_numpy() >= 0
        n_steps = max(len(np.unique(cross_per["step"].to_numpy()[stepped])), 1)
        matched = cross_per["kind"].astype(str).to_numpy()[stepped]
        row = np.searchsorted(names, matched)
        known = (row < len(names)) & (names[np.minimum(row, len(names) - 1)] == matched)
        transfer = cross_per["transfer_ns"].to_numpy(np.int64)[stepped][known]
        busbw = cross_per["busbw_gbps"].to_numpy(np.float64)[stepped][known]
        row = row[known]
        out["transfer_ns"] = np.where(np.bincount(row, minlength=len(names)) > 0,
                                      _sums(row, transfer, len(names)) / n_steps, np.nan)
        out["busbw_gbps"] = np.array([_median(busbw[row == i]) for i in range(len(names))])
    return pd.DataFrame(out, columns=columns)


def _sums(group: np.ndarray, values: np.ndarray, n: int) -> np.ndarray:
    """Exact int64 sums of ``values`` per group ``0 … n - 1``."""
    out = np.zeros(n, dtype=np.int64)
    np.add.at(out, group, values)
    return out


def _median(values: np.ndarray) -> float:
    """Median of the values that are not NaN; NaN when none is."""
    values = values[~np.isnan(values)]
    return float(np.median(values)) if len(values) else float("nan")


def compare_collectives(before: pd.DataFrame, after: pd.DataFrame) -> pd.DataFrame:
    """Side-by-side collective table per kind (``before_*`` / ``after_*`` columns), largest time change first."""
    b = before.set_index("kind").add_prefix("before_")
    a = after.set_index("kind").add_prefix("after_")
    out = b.join(a, how="outer")
    for side in ("before", "after"):  # a kind absent on a side: none of it (an unknown size stays unknown, NaN)
        absent = out[f"{side}_count"].isna()
        for col in ("count", "bytes", "duration_ns"):
            out.loc[absent, f"{side}_{col}"] = 0.0
    out["delta_duration_ns"] = out["after_duration_ns"] - out["before_duration_ns"]
    order = out["delta_duration_ns"].abs().sort_values(ascending=False, kind="stable").index
    return out.loc[order].reset_index()


def compare_findings(before: list[Finding], after: list[Finding], tolerance_ns: int = 0) -> list[dict[str, Any]]:
    """Findings by id, with both impacts (the largest instance of the id on each side): ``resolved`` (before
    only), ``new`` (after only), ``changed`` (impact moved by more than ``tolerance_ns``, the step noise) or
    ``persists``; largest absolute impact change first."""
    def largest(findings: list[Finding]) -> dict[str, Finding]:
        out: dict[str, Finding] = {}
        for f in findings:
            old = out.get(f.id)
            if old is None or (f.impact_ns_per_step or 0) > (old.impact_ns_per_step or 0):
                out[f.id] = f
        return out

    b, a = largest(before), largest(after)
    rows = []
    for fid in [*b, *[x for x in a if x not in b]]:
        fb, fa = b.get(fid), a.get(fid)
        ib = fb.impact_ns_per_step if fb else None
        ia = fa.impact_ns_per_step if fa else None
        moved = abs((ia or 0) - (ib or 0)) > tolerance_ns
        status = ("changed" if moved else "persists") if fb and fa else "resolved" if fb else "new"
        rows.append({"id": fid, "status": status, "title_before": fb.title if fb else None,
                     "title_after": fa.title if fa else None, "before_impact_ns": ib, "after_impact_ns": ia,
                     "delta_impact_ns": (ia or 0) - (ib or 0)})
    return sorted(rows, key=lambda r: -abs(r["delta_impact_ns"]))
