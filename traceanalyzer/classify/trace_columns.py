"""Classification columns for a Trace: computed once per unique name, spread to rows with numpy."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..model.trace import StringPool, Trace
from .engine import KernelClass, classify_many, classify_one
from .rules import RuleSet, rule_set

MEMOP_SUBBUCKETS: dict[str, str] = {
    "HtoD": "memcpy_htod", "DtoH": "memcpy_dtoh", "DtoD": "memcpy_dtod", "HtoH": "memcpy_htoh",
    "PtoP": "memcpy_p2p",
}


def _kernel_name_ids(trace: Trace) -> np.ndarray:
    """Full (demangled) name id per kernel; nsys shortName only where the full name is missing."""
    k = trace.kernels
    name_ids = k["name_id"].astype(np.int32, copy=False)
    if "short_name_id" in k:
        name_ids = np.where(name_ids >= 0, name_ids, k["short_name_id"].astype(np.int32, copy=False))
    return name_ids


def _codes(strings: StringPool, values: list[str]) -> np.ndarray:
    return np.fromiter((strings.intern(v) for v in values), dtype=np.int32, count=len(values))


#: Strings a trace's pool may still gain after classification (``refine_with_context`` interns four).
_POOL_HEADROOM = 64


def _per_row(strings: StringPool, codes: dict[str, np.ndarray], inverse: np.ndarray) -> dict[str, np.ndarray]:
    """Class columns per row from per-class codes: int16 while the pool's ids (and the few it may still gain)
    fit, else int32 (a class column is compared and looked up, never summed)."""
    small = len(strings) + _POOL_HEADROOM <= np.iinfo(np.int16).max
    return {k: (v.astype(np.int16) if small and v.dtype == np.int32 else v)[inverse] for k, v in codes.items()}


def _unique_ids(ids: np.ndarray, pool_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Distinct string ids (``-1`` allowed) and each row's index into them, in O(rows + pool) without a sort."""
    present = np.zeros(pool_size + 1, dtype=bool)
    shifted = ids.astype(np.int64) + 1
    present[shifted] = True
    slot = np.cumsum(present) - 1
    return np.flatnonzero(present) - 1, slot[shifted]


def classify_name_ids(strings: StringPool, ids: np.ndarray, rules: RuleSet) -> dict[str, np.ndarray]:
    """Per-row class columns for string-pool name ids (each distinct id classified once)."""
    unique_ids, inverse = _unique_ids(ids, len(strings))
    classes: list[KernelClass] = classify_many([strings[int(i)] if i >= 0 else "" for i in unique_ids], rules)
    return _per_row(strings, {
        "bucket_id": _codes(strings, [c.bucket for c in classes]),
        "subbucket_id": _codes(strings, [c.subbucket for c in classes]),
        "precision_id": _codes(strings, [c.precision for c in classes]),
        "rule_id": _codes(strings, [c.rule for c in classes]),
        "confidence_low": np.array([c.confidence == "low" for c in classes], dtype=bool),
    }, inverse)


def _memop_columns(trace: Trace, rules: RuleSet) -> dict[str, np.ndarray]:
    """bucket/sub-bucket of memcpy and memset rows: peer copies are communication (decision 10)."""
    m = trace.memops
    strings = trace.strings
    n = len(m)
    if n == 0:
        return {"bucket_id": np.zeros(0, np.int32), "subbucket_id": np.zeros(0, np.int32)}
    kind = m["kind_id"].astype(np.int64)
    copy_kind = m["copy_kind_id"].astype(np.int64)
    peer = (m["src_device"] >= 0) & (m["dst_device"] >= 0) & (m["src_device"] != m["dst_device"])
    key = (kind + 1) * (len(strings) + 2) + (copy_kind + 1)
    key = np.where(peer, -1 - (kind + 1), key)  # a cross-device copy is peer-to-peer whatever its kind
    unique_keys, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    buckets: list[str] = []
    subs: list[str] = []
    for row in first:
        kind_text = strings[int(kind[row])] if kind[row] >= 0 else ""
        copy_text = strings[int(copy_kind[row])] if copy_kind[row] >= 0 else ""
        if peer[row] or copy_text == "PtoP":
            bucket, sub = "communication", "memcpy_p2p"
        elif kind_text == "memset":
            bucket, sub = "memory", "memset"
        elif kind_text == "memcpy":
            bucket, sub = "memory", MEMOP_SUBBUCKETS.get(copy_text, "memcpy")
        else:  # kind unknown: fall back to the activity's name
            name_id = int(m["name_id"][row])
            cls = classify_one(strings[name_id] if name_id >= 0 else "Memcpy", rules)
            bucket, sub = (cls.bucket, cls.subbucket) if cls.bucket in ("memory", "communication") \
                else ("memory", "memcpy")
        buckets.append(bucket)
        subs.append(sub)
    del unique_keys
    return _per_row(strings, {"bucket_id": _codes(strings, buckets), "subbucket_id": _codes(strings, subs)},
                    inverse)


def classify_trace(trace: Trace, rules: Path | str | None = None) -> Trace:
    """The trace with class columns added to ``kernels`` and ``memops`` (string-pool ids: int16 while the pool
    has under 32,704 strings, else int32).

    kernels: ``bucket_id``, ``subbucket_id``, ``precision_id``, ``rule_id`` and ``confidence_low``;
    memops: ``bucket_id`` (communication for peer copies, else memory) and ``subbucket_id``.
    """
    ruleset = rule_set(rules)
    kernel_cols = classify_name_ids(trace.strings, _kernel_name_ids(trace), ruleset)
    out = trace.with_table("kernels", trace.kernels.with_columns(**kernel_cols))
    return out.with_table("memops", out.memops.with_columns(**_memop_columns(out, ruleset)))
