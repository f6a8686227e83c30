"""GPU metric samples (nsys ``GPU_METRICS``) aggregated per device, and per bucket of what the GPU was running."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..model.trace import Trace
from .numeric.intervals import union

#: Metrics the report and findings use, matched by name prefix (names carry units, e.g. "[Throughput %]").
KEY_METRICS = ("SMs Active", "SM Issue", "Tensor Active", "DRAM Read Bandwidth", "DRAM Write Bandwidth",
               "NVLink RX", "NVLink TX", "PCIe RX", "PCIe TX", "GPC Clock Frequency", "Compute Warps in Flight")


def phase_labels(trace: Trace, device: int, t: np.ndarray) -> np.ndarray:
    """What the device ran at each sample time: a bucket name, 'comm_exposed', 'comm_hidden' or 'idle'."""
    k = trace.kernels
    on_dev = k["device"] == device
    labels = np.full(len(t), "idle", dtype=object)
    if not on_dev.any() or "bucket_id" not in k:
        return labels
    buckets = trace.names(k["bucket_id"][on_dev])
    starts, ends = k["start_ns"][on_dev], k["end_ns"][on_dev]

    def inside(mask: np.ndarray) -> np.ndarray:
        s, e = union(starts[mask], ends[mask])
        i = np.searchsorted(s, t, side="right") - 1
        return (i >= 0) & (t < e[np.clip(i, 0, None)]) if len(s) else np.zeros(len(t), bool)

    is_comm = buckets == "communication"
    comm_at = inside(is_comm)
    compute_at = inside(~is_comm)
    # Label by the bucket with the most kernel time among those running (cheap proxy for the dominant one).
    for name in pd.Series(buckets[~is_comm]).value_counts().index[::-1]:
        labels[inside(buckets == name)] = name
    labels[comm_at & ~compute_at] = "comm_exposed"
    labels[comm_at & compute_at] = "comm_hidden"
    return labels


def metric_mask(trace: Trace, prefixes: tuple[str, ...]) -> np.ndarray:
    """Boolean mask of the GPU metric samples whose metric name starts with one of ``prefixes`` (names are
    matched once per distinct metric id, not per sample: captures hold millions of samples)."""
    ids = trace.gpu_metrics["metric_id"]
    uniq, inverse = np.unique(ids, return_inverse=True)
    hit = np.array([str(name).startswith(prefixes) for name in trace.names(uniq)], dtype=bool)
    return hit[inverse.ravel()] if len(uniq) else np.zeros(len(ids), dtype=bool)


def _clocks_in_mhz(agg: pd.DataFrame) -> pd.DataFrame:
    """nsys exports clock metrics named "… [MHz]" with values in Hz (observed: 'GPC Clock Frequency [MHz]' up to
    1,980,062,500 on an H200 whose SM clock is 1980 MHz): such aggregates are scaled to MHz."""
    in_hz = agg["metric"].astype(str).str.endswith("[MHz]") & (agg["max"] > 1e5)
    if in_hz.any():
        agg = agg.copy()
        agg.loc[in_hz, ["mean", "p50", "max"]] = agg.loc[in_hz, ["mean", "p50", "max"]] / 1e6
    return agg


def aggregate_gpu_metrics(trace: Trace) -> pd.DataFrame:
    """Per (device, metric, phase) mean/p50/max of the key metrics over the kernel span.

    ``phase`` is ``all`` (every sample in the span) or what the GPU ran at the sample time (see ``phase_labels``).
    Empty DataFrame when the trace has no samples.
    """
    g = trace.gpu_metrics
    if len(g) == 0 or len(trace.kernels) == 0:
        return pd.DataFrame()
    keep = metric_mask(trace, KEY_METRICS)
    frames = []
    k = trace.kernels
    for device in np.unique(g["device"][keep]):
        on_dev = k["device"] == device
        if not on_dev.any():
            continue
        lo, hi = int(k["start_ns"][on_dev].min()), int(k["end_ns"][on_dev].max())
        sel = keep & (g["device"] == device) & (g["timestamp_ns"] >= lo) & (g["timestamp_ns"] < hi)
        if not sel.any():
            continue
        df = pd.DataFrame({"device": int(device), "metric": trace.names(g["metric_id"][sel]), "value": g["value"][sel],
                           "phase": phase_labels(trace, int(device), g["timestamp_ns"][sel])})
        both = pd.concat([df.assign(phase="all"), df], ignore_index=True)
        agg = both.groupby(["device", "metric", "phase"], sort=True)["value"].agg(
            mean="mean", p50="median", max="max", samples="size").reset_index()
        frames.append(_clocks_in_mhz(agg))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
