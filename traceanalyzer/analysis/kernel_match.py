"""Kernels of two runs matched by role, and collectives and findings compared, for ``diff``.

**Kernel roles.** Each side's kernels inside step windows are grouped by normalized name (TAXONOMY decision 15)
with bucket and sub-bucket, counted and timed per device-step. Groups are matched in three passes, each on what
the previous left:

1. ``name``: the same normalized name and bucket.
2. ``role``: the same *role key* — the function name without template arguments and parameters, tile shapes
   (``128x256x64``), digits and case folded away — plus bucket, sub-bucket and the launch geometry (grid and
   block, when the trace records them and both sides have them; otherwise not compared). A re-tiled GEMM
   (``…_128x128x64_…`` → ``…_256x128x64_…``) or a template change matches here.
3. ``bucket``: within one bucket and sub-bucket, the remaining groups are paired greedily (largest time first)
   when they launch as often per step (within ``COUNT_TOLERANCE``): a library upgrade that renames a GEMM
   (cuBLAS ``sm90_xmma_gemm_…`` → ``nvjet_…``) keeps its role and its launches per step.

What is left is listed as ``added`` or ``removed``. ``kernel_overlap`` is the share of both sides' kernel time
(per step) that found a partner: a low value means the two runs are different workloads.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pandas as pd

from . import intervals as iv
from .results import DeviceSummary, Finding

COUNT_TOLERANCE = 0.10  # launches per step within ±10 % pair two renamed kernels of one bucket
KERNEL_COLUMNS = ["match", "bucket", "subbucket", "before_name", "after_name", "before_count", "after_count",
                  "before_ns", "after_ns", "delta_ns"]
_SHAPE = re.compile(r"\d+(?:x\d+)+")
_DIGITS = re.compile(r"\d+")
_SEPARATORS = re.compile(r"[_\s]+")


def role_key(name: str) -> str:
    """The role of a kernel name: its function name without template arguments, parameters, tile shapes and
    numbers, lower-cased (``sm90_xmma_gemm_bf16_128x256x64_tn`` → ``smxmma_gemm_bf_tn``)."""
    from ..classify.normalize import head, normalize_name

    text = head(normalize_name(name)) or name
    text = _SHAPE.sub("", text)
    text = _DIGITS.sub("", text)
    return _SEPARATORS.sub("_", text).strip("_").lower()


def kernel_groups(devices: list[DeviceSummary]) -> pd.DataFrame:
    """Per (normalized name, bucket, sub-bucket, grid, block): launches and time per device-step, counting the
    kernels that start inside the devices' step windows."""
    from ..classify.normalize import normalize_name

    frames, steps = [], 0
    for dev in devices:
        act = dev.activity
        if act is None or not len(dev.per_step) or not len(act.kernels):
            continue
        steps += len(dev.per_step)
        k = act.kernels
        win = iv.window_of(k["start_ns"], dev.per_step["start_ns"].to_numpy(np.int64),
                           dev.per_step["end_ns"].to_numpy(np.int64))
        inside = win >= 0
        trace = act.trace
        frame = pd.DataFrame({
            "name_id": k["name_id"][inside],
            "bucket": act.kernel_bucket[inside],
            "subbucket": trace.names(k["subbucket_id"][inside]) if "subbucket_id" in k else None,
            "grid": k["grid"][inside] if "grid" in k else -1, "block": k["block"][inside] if "block" in k else -1,
            "dur": (k["end_ns"] - k["start_ns"])[inside]})
        by = frame.groupby(["name_id", "bucket", "subbucket", "grid", "block"], dropna=False, sort=False)["dur"]
        agg = by.agg(["size", "sum"]).reset_index()
        agg["name"] = [normalize_name(n) for n in trace.names(agg["name_id"].to_numpy())]
        frames.append(agg.drop(columns="name_id"))
    if not frames:
        return pd.DataFrame(columns=["name", "bucket", "subbucket", "grid", "block", "count", "ns"])
    all_rows = pd.concat(frames, ignore_index=True)
    grouped = all_rows.groupby(["name", "bucket", "subbucket", "grid", "block"], dropna=False, sort=False)
    out = grouped[["size", "sum"]].sum().reset_index()
    out["count"] = out["size"] / steps
    out["ns"] = out["sum"] / steps
    out["subbucket"] = out["subbucket"].fillna("").astype(str)
    return out.drop(columns=["size", "sum"])


def _collapse(frame: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Groups of ``frame`` by ``keys``: summed count and time; other columns from the largest member."""
    grouped = frame.sort_values("ns", ascending=False, kind="stable").groupby(keys, dropna=False, sort=False)
    out = grouped[["count", "ns"]].sum()
    for column in ("name", "subbucket", "role", "grid", "block"):
        if column not in keys and column in frame:
            out[column] = grouped[column].first()
    return out.reset_index()


def _rows(match: str, b: pd.DataFrame, a: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({"match": match, "bucket": b["bucket"].to_numpy(), "subbucket": b["subbucket"].to_numpy(),
                         "before_name": b["name"].to_numpy(), "after_name": a["name"].to_numpy(),
                         "before_count": b["count"].to_numpy(), "after_count": a["count"].to_numpy(),
                         "before_ns": b["ns"].to_numpy(), "after_ns": a["ns"].to_numpy()})


def _side_of(joined: pd.DataFrame, suffix: str) -> pd.DataFrame:
    """One side's columns of a merged frame, suffix removed (keys kept as they are)."""
    mine = {c: c[: -len(suffix)] for c in joined.columns if c.endswith(suffix)}
    other = [c for c in joined.columns if c.endswith(("_a", "_b")) and c not in mine]
    return joined.drop(columns=other).rename(columns=mine)


def _pair(before: pd.DataFrame, after: pd.DataFrame, keys: list[str], match: str
          ) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Match groups with equal ``keys``; returns (matched rows, unmatched before, unmatched after)."""
    b = _collapse(before, keys)
    a = _collapse(after, keys)
    joined = b.merge(a, on=keys, how="inner", suffixes=("_b", "_a"))
    matched = _rows(match, _side_of(joined, "_b"), _side_of(joined, "_a"))
    hit = pd.MultiIndex.from_frame(joined[keys])
    left_b = before[~pd.MultiIndex.from_frame(before[keys]).isin(hit)]
    left_a = after[~pd.MultiIndex.from_frame(after[keys]).isin(hit)]
    return matched, left_b, left_a


def _pair_by_count(before: pd.DataFrame, after: pd.DataFrame) -> tuple[pd.DataFrame, list[int], list[int]]:
    """Pass 3: within a bucket and sub-bucket, pair role groups launched as often per step (largest first)."""
    rows: list[dict[str, Any]] = []
    used_b: list[int] = []
    used_a: list[int] = []
    for (bucket, sub), group_b in before.groupby(["bucket", "subbucket"], sort=False):
        group_a = after[(after["bucket"] == bucket) & (after["subbucket"] == sub)]
        free = list(group_a.sort_values("ns", ascending=False, kind="stable").index)
        for i, row in group_b.sort_values("ns", ascending=False, kind="stable").iterrows():
            for j in free:
                other = group_a.loc[j]
                if abs(other["count"] - row["count"]) <= COUNT_TOLERANCE * max(row["count"], other["count"]):
                    rows.append({"match": "bucket", "bucket": bucket, "subbucket": sub, "before_name": row["name"],
                                 "after_name": other["name"], "before_count": row["count"],
                                 "after_count": other["count"], "before_ns": row["ns"], "after_ns": other["ns"]})
                    used_b.append(i)
                    used_a.append(j)
                    free.remove(j)
                    break
    return pd.DataFrame(rows), used_b, used_a


def match_kernels(before: pd.DataFrame, after: pd.DataFrame) -> pd.DataFrame:
    """The kernel table of ``diff`` (columns ``KERNEL_COLUMNS``), largest absolute change first."""
    b, a = before.copy(), after.copy()
    for side in (b, a):
        side["role"] = [role_key(n) for n in side["name"]]
    parts = []
    matched, b, a = _pair(b, a, ["name", "bucket"], "name")
    parts.append(matched)
    b, a = _geometry_blind(b, a)
    matched, b, a = _pair(b, a, ["role", "bucket", "subbucket", "grid", "block"], "role")
    parts.append(matched)
    b, a = _collapse(b, ["role", "bucket", "subbucket"]), _collapse(a, ["role", "bucket", "subbucket"])
    by_count, used_b, used_a = _pair_by_count(b, a)
    parts.append(by_count)
    b, a = b.drop(index=used_b), a.drop(index=used_a)
    parts += [_unmatched(b, "removed"), _unmatched(a, "added")]
    parts = [p for p in parts if len(p)]
    out = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=KERNEL_COLUMNS[:-1])
    out["delta_ns"] = out["after_ns"].astype(float) - out["before_ns"].astype(float)
    order = out["delta_ns"].abs().sort_values(ascending=False, kind="stable").index
    return out.loc[order, KERNEL_COLUMNS].reset_index(drop=True)


def _unmatched(groups: pd.DataFrame, match: str) -> pd.DataFrame:
    """Rows for groups found on one side only (``removed``: before only, ``added``: after only)."""
    groups = groups.reset_index(drop=True)
    none = groups.assign(name=None, count=0.0, ns=0.0)
    return _rows(match, groups, none) if match == "removed" else _rows(match, none, groups)


def _geometry_blind(b: pd.DataFrame, a: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Launch geometry takes part in role matching only when both sides record it (nsys and Kineto both do, but
    an older export may not): otherwise grid and block are set to -1 on both sides."""
    known_b = bool(((b["grid"] >= 0) & (b["block"] >= 0)).any()) if len(b) else False
    known_a = bool(((a["grid"] >= 0) & (a["block"] >= 0)).any()) if len(a) else False
    if known_b and known_a:
        return b, a
    return b.assign(grid=-1, block=-1), a.assign(grid=-1, block=-1)


def kernel_overlap(kernels: pd.DataFrame) -> float | None:
    """Share of both sides' kernel time per step in matched groups (0–1); None without kernels."""
    total = float(kernels["before_ns"].sum() + kernels["after_ns"].sum())
    if total <= 0:
        return None
    matched = kernels[~kernels["match"].isin(["added", "removed"])]
    return float(matched["before_ns"].sum() + matched["after_ns"].sum()) / total


def collective_table(devices: list[DeviceSummary], cross_per: pd.DataFrame | None) -> pd.DataFrame:
    """Per collective kind, per device-step: instances, bytes and time; transfer time and median bus bandwidth
    from the cross-rank match when there is one (else the devices' own durations)."""
    frames, steps = [], 0
    for dev in devices:
        c = dev.collectives
        if not len(dev.per_step):
            continue
        steps += len(dev.per_step)
        if len(c):
            inside = c[c["step"] >= 0]
            frames.append(pd.DataFrame({"kind": inside["kind"].astype(str).to_numpy(),
                                        "bytes": inside["bytes"].clip(lower=0).to_numpy(np.int64),
                                        "duration_ns": inside["duration_ns"].to_numpy(np.int64)}))
    columns = ["kind", "count", "bytes", "duration_ns", "transfer_ns", "busbw_gbps"]
    if not frames or steps == 0:
        return pd.DataFrame(columns=columns)
    rows = pd.concat(frames, ignore_index=True).groupby("kind")
    out = pd.DataFrame({"count": rows.size() / steps, "bytes": rows["bytes"].sum() / steps,
                        "duration_ns": rows["duration_ns"].sum() / steps})
    out["transfer_ns"] = np.nan
    out["busbw_gbps"] = np.nan
    if cross_per is not None and len(cross_per):
        stepped = cross_per[cross_per["step"] >= 0]
        n_steps = max(int(stepped["step"].nunique()), 1)
        by = stepped.groupby(stepped["kind"].astype(str))
        out["transfer_ns"] = (by["transfer_ns"].sum() / n_steps).reindex(out.index)
        out["busbw_gbps"] = by["busbw_gbps"].median().reindex(out.index)
    return out.reset_index()[columns]


def compare_collectives(before: pd.DataFrame, after: pd.DataFrame) -> pd.DataFrame:
    """Side-by-side collective table per kind (``before_*`` / ``after_*`` columns), largest time change first."""
    b = before.set_index("kind").add_prefix("before_")
    a = after.set_index("kind").add_prefix("after_")
    out = b.join(a, how="outer")
    for col in ("count", "bytes", "duration_ns"):
        out[[f"before_{col}", f"after_{col}"]] = out[[f"before_{col}", f"after_{col}"]].fillna(0.0)
    out["delta_duration_ns"] = out["after_duration_ns"] - out["before_duration_ns"]
    order = out["delta_duration_ns"].abs().sort_values(ascending=False, kind="stable").index
    return out.loc[order].reset_index()


def compare_findings(before: list[Finding], after: list[Finding]) -> list[dict[str, Any]]:
    """Findings by id: ``resolved`` (before only), ``new`` (after only) or ``persists`` with both impacts (the
    largest instance of the id on each side); largest absolute impact change first."""
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
        status = "persists" if fb and fa else "resolved" if fb else "new"
        rows.append({"id": fid, "status": status, "title_before": fb.title if fb else None,
                     "title_after": fa.title if fa else None, "before_impact_ns": ib, "after_impact_ns": ia,
                     "delta_impact_ns": (ia or 0) - (ib or 0)})
    return sorted(rows, key=lambda r: -abs(r["delta_impact_ns"]))
