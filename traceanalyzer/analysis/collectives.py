"""One row per communication instance (kernel or peer-to-peer copy) of a device, with its exposed time.

``hidden_ns`` of an instance is the time inside it when a compute kernel ran on the same device
(``compute_beside_ns``, same number); ``exposed_ns = duration_ns − hidden_ns`` is the SM-idle time during it.
Instances that run concurrently each count their own exposure, so per-instance sums can exceed the device's
``comm_exposed_ns`` (a union).

``kind`` comes from the classifier's sub-bucket when it names a collective, else from the kernel name;
``ordinal`` numbers the instances of one kind in start order (0-based) for cross-rank matching. ``seq``, ``bytes``,
``dtype`` and ``group_size`` come from the trace's ``collectives`` table when the kernel links to it: by External
id (kernel, then its launching API call), else by correlation id.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..model.communication import OTHER, PEER_COPY, bus_factors, kind_of
from .activity import DeviceActivity
from .numeric import intervals as iv
from .numeric.frames import array_of, frame
from .results import CrossRankSummary

COLUMNS = ["start_ns", "end_ns", "duration_ns", "name", "kind", "subbucket", "stream", "step", "layer", "ordinal",
           "seq", "bytes", "dtype", "group_size", "exposed_ns", "hidden_ns", "compute_beside_ns", "correlation",
           "external_id", "source"]


def _kinds(pool: list[str], sub_ids: np.ndarray, name_ids: np.ndarray) -> np.ndarray:
    """``kind_of`` per row, evaluated once per distinct (subbucket, name) pair."""
    if len(name_ids) == 0:
        return np.empty(0, dtype=object)
    sub, name = np.asarray(sub_ids, dtype=np.int64), np.asarray(name_ids, dtype=np.int64)
    # one int64 per (subbucket, name) pair of string ids (each ≥ -1 and below 2^31)
    _, first, inverse = np.unique(((sub + 1) << 32) | (name + 1), return_index=True, return_inverse=True)
    kinds = np.array([kind_of(pool[s] if s >= 0 else None, pool[n] if n >= 0 else None)
                      for s, n in zip(sub[first].tolist(), name[first].tolist(), strict=True)], dtype=object)
    return kinds[inverse.ravel()]


def _lookup(keys: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """Index of each query in ``keys`` (first match), -1 when absent or negative."""
    out = np.full(len(queries), -1, dtype=np.int64)
    valid = np.flatnonzero(keys >= 0)
    if len(valid) == 0 or len(queries) == 0:
        return out
    order = valid[np.argsort(keys[valid], kind="stable")]
    sorted_keys = keys[order]
    pos = np.minimum(np.searchsorted(sorted_keys, queries), len(order) - 1)
    hit = (sorted_keys[pos] == queries) & (queries >= 0)
    out[hit] = order[pos[hit]]
    return out


def link_collectives(act: DeviceActivity, rows: np.ndarray) -> np.ndarray:
    """Row of ``trace.collectives`` for each kernel index in ``rows``, -1 when it cannot be linked."""
    coll = act.trace.collectives
    if len(coll) == 0 or len(rows) == 0:
        return np.full(len(rows), -1, dtype=np.int64)
    mine = np.isin(coll["pid"], act.pids) | (len(np.unique(coll["pid"])) == 1)
    ext_keys = np.where(mine, coll["external_id"], -1)
    corr_keys = np.where(mine, coll["correlation"], -1)
    k = act.kernels
    found = _lookup(ext_keys, k["external_id"][rows])
    api = act.trace.api_calls
    api_ext = np.where(act.launch_row[rows] >= 0,
                       api["external_id"][np.maximum(act.launch_row[rows], 0)] if len(api) else -1, -1)
    found = np.where(found >= 0, found, _lookup(ext_keys, api_ext))
    return np.where(found >= 0, found, _lookup(corr_keys, k["correlation"][rows]))


def _kernel_part(act: DeviceActivity, kernel_layer: np.ndarray) -> dict[str, np.ndarray]:
    k, pool = act.kernels, act.trace.strings.values
    rows = np.flatnonzero(act.kernel_is_comm)
    sub_ids = k["subbucket_id"][rows] if "subbucket_id" in k else np.full(len(rows), -1, dtype=np.int32)
    linked = link_collectives(act, rows)
    coll = act.trace.collectives

    def from_coll(column: str) -> np.ndarray:
        return np.where(linked >= 0, coll[column][np.maximum(linked, 0)] if len(coll) else -1, -1)

    return {"start_ns": k["start_ns"][rows], "end_ns": k["end_ns"][rows], "name_id": k["name_id"][rows],
            "sub_id": sub_ids, "kind": _kinds(pool, sub_ids, k["name_id"][rows]), "stream": k["stream"][rows],
            "layer": kernel_layer[rows], "seq": from_coll("seq"), "bytes": from_coll("bytes"),
            "dtype_id": from_coll("dtype_id"), "group_size": from_coll("group_size"),
            "correlation": k["correlation"][rows], "external_id": k["external_id"][rows],
            "source": np.full(len(rows), "kernel", dtype=object)}


def _memop_part(act: DeviceActivity, memop_layer: np.ndarray) -> dict[str, np.ndarray]:
    m = act.memops
    rows = np.flatnonzero(act.memop_is_comm)
    n = len(rows)
    sub_ids = m["subbucket_id"][rows] if "subbucket_id" in m else np.full(n, -1, dtype=np.int32)
    minus = np.full(n, -1, dtype=np.int64)
    return {"start_ns": m["start_ns"][rows], "end_ns": m["end_ns"][rows], "name_id": m["name_id"][rows],
            "sub_id": sub_ids, "kind": np.full(n, PEER_COPY, dtype=object), "stream": m["stream"][rows],
            "layer": memop_layer[rows], "seq": minus, "bytes": m["bytes"][rows], "dtype_id": minus,
            "group_size": minus, "correlation": m["correlation"][rows], "external_id": minus,
            "source": np.full(n, "memcpy", dtype=object)}


def collective_instances(act: DeviceActivity, steps: pd.DataFrame, kernel_layer: np.ndarray | None = None,
                         memop_layer: np.ndarray | None = None) -> pd.DataFrame:
    """Every communication instance of the device, in start order (columns: ``COLUMNS``).

    ``kernel_layer`` / ``memop_layer`` give the layer index of each kernel / memop of ``act`` (-1: none).
    """
    k_layer = np.full(len(act.kernels), -1, dtype=np.int64) if kernel_layer is None else kernel_layer
    m_layer = np.full(len(act.memops), -1, dtype=np.int64) if memop_layer is None else memop_layer
    parts = [_kernel_part(act, k_layer), _memop_part(act, m_layer)]
    cols = {key: np.concatenate([p[key] for p in parts]) for key in parts[0]}
    order = np.lexsort((cols["stream"], cols["start_ns"]))
    cols = {key: v[order] for key, v in cols.items()}
    start, end = cols["start_ns"].astype(np.int64), cols["end_ns"].astype(np.int64)
    hidden = iv.measure_within(act.compute, start, end)
    names = act.trace.names(cols["name_id"])
    # ordinal: the instance's place among those of its kind, in start order
    kind_code = pd.factorize(cols["kind"])[0]
    by_kind = np.argsort(kind_code, kind="stable")
    sorted_codes = kind_code[by_kind]
    first = np.flatnonzero(np.concatenate(([True], sorted_codes[1:] != sorted_codes[:-1]))) if len(by_kind) \
        else by_kind
    ordinal = np.empty(len(by_kind), dtype=np.int64)
    ordinal[by_kind] = np.arange(len(by_kind)) - np.repeat(first, np.diff(np.concatenate((first, [len(by_kind)]))))
    return frame({
        "start_ns": start, "end_ns": end, "duration_ns": end - start, "name": names,
        "kind": cols["kind"], "subbucket": act.trace.names(cols["sub_id"]), "stream": cols["stream"],
        "step": iv.window_ids(start, array_of(steps, "start_ns"), array_of(steps, "end_ns"), array_of(steps, "step")),
        "layer": cols["layer"].astype(np.int64), "ordinal": ordinal, "seq": cols["seq"].astype(np.int64),
        "bytes": cols["bytes"].astype(np.int64), "dtype": act.trace.names(cols["dtype_id"]),
        "group_size": cols["group_size"].astype(np.int64), "exposed_ns": (end - start) - hidden,
        "hidden_ns": hidden, "compute_beside_ns": hidden, "correlation": cols["correlation"].astype(np.int64),
        "external_id": cols["external_id"].astype(np.int64), "source": cols["source"],
    }, COLUMNS)


def with_transfer(collectives: pd.DataFrame, rank: int, cross: CrossRankSummary | None,
                  link_peak_gbps: float | None = None) -> pd.DataFrame:
    """A device's collective instances with the cross-rank split and bandwidths added.

    ``transfer_ns`` / ``wait_ns`` come from the matched instance of ``cross`` (``CrossRankSummary.rank_matches``,
    joined on this rank's start); unmatched instances (one rank, peer copies) keep transfer = duration and
    wait = 0, with ``matched`` False. ``algbw_gbps`` = bytes / transfer and ``busbw_gbps`` = algbw × the bus factor
    of the kind and group size (:func:`traceanalyzer.model.communication.bus_factors`); both NaN when the message
    size is
    unknown. ``busbw_pct_of_peak`` compares busbw with ``link_peak_gbps``.
    """
    c = collectives.reset_index(drop=True)
    missing = {"bytes": -1, "group_size": -1, "kind": OTHER, "exposed_ns": np.nan}  # frames built by hand
    c = c.assign(**{k: v for k, v in missing.items() if k not in c.columns})
    if "duration_ns" not in c.columns:
        c = c.assign(duration_ns=c["end_ns"] - c["start_ns"])
    transfer = array_of(c, "duration_ns", np.int64).copy()
    wait = np.zeros(len(c), dtype=np.int64)
    matched = np.zeros(len(c), dtype=bool)
    found = cross.rank_matches(rank) if cross is not None else None
    if found is not None and len(c):
        matched, m_transfer, m_wait = found.lookup(array_of(c, "start_ns", np.int64))
        transfer[matched] = m_transfer[matched]
        wait[matched] = m_wait[matched]
    nbytes = array_of(c, "bytes", np.float64)
    factor = bus_factors(c["kind"].astype(str).to_numpy(), array_of(c, "group_size", np.int64),
                         len(cross.ranks) if cross is not None else 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        algbw = np.where((nbytes > 0) & (transfer > 0), nbytes / np.maximum(transfer, 1), np.nan)  # B/ns = GB/s
    busbw = algbw * factor
    pct = busbw / link_peak_gbps * 100 if link_peak_gbps else np.full(len(c), np.nan)
    return c.assign(transfer_ns=transfer, wait_ns=wait, matched=matched, algbw_gbps=algbw, busbw_gbps=busbw,
                    link_peak_gbps=link_peak_gbps if link_peak_gbps else np.nan, busbw_pct_of_peak=pct)
