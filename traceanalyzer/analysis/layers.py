"""Layers of one (rank, device): which kernels belong to which layer instance, and per-layer comm/compute.

Sources, first that applies:

* ``nvtx:<pattern>``: NVTX / user-annotation ranges whose name matches the regex (default ``layer_?\\d+``). A
  kernel belongs to the innermost such CPU range open when its launching API call started (GPU-side
  ``gpu_user_annotation`` ranges, used only when no CPU range matches: open when the kernel started); the
  layer's GPU window is the projection of the range (first start to last end of its kernels). Ranges that
  launched nothing on the device are dropped.
* ``collective_period``: within each step, the communication kernels in issue order (host launch time when
  ≥ 95% of kernels link to their launch — the others then belong to no layer — else GPU start) are cut into
  layers of ``p`` collectives, ``p`` being the smallest period of the "compute between collectives" signature
  (the multiset of kernel names issued between two consecutive collectives) that matches at least 90% of the
  step's segments after the first (a model with 2 all-reduces per layer gives ``p = 2``). Layer ``j`` of a step
  holds the kernels issued after layer ``j−1``'s last collective (from the step's first kernel for ``j = 0``) up
  to and including its own last collective; its GPU window is [first start, last end] of those kernels. The
  tail after the last collective (e.g. the LM head) belongs to no layer.
* ``none``.

Per layer: ``compute_ns`` = union of its non-communication kernels; ``comm_ns`` = union of its communication
kernels; ``comm_exposed_ns`` = that comm time during which no compute kernel ran anywhere on the device.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from . import intervals as iv
from .activity import DeviceActivity

# the layer-pattern default and its check belong to layers; kept in a pandas-free module for the CLI's start-up
from .layer_pattern import DEFAULT_LAYER_PATTERN as DEFAULT_LAYER_PATTERN
from .layer_pattern import check_layer_pattern as check_layer_pattern
from .steps import project_to_gpu, ranges_named

LAYER_COLUMNS = ["step", "layer", "name", "start_ns", "end_ns", "duration_ns", "comm_ns", "comm_exposed_ns",
                 "compute_ns"]
MAX_COLLECTIVES_PER_LAYER = 16
MIN_SIGNATURE_MATCH = 0.9
_DIGITS = re.compile(r"(\d+)(?!.*\d)")
_HASH_MULT = np.uint64(0x9E3779B97F4A7C15)


@dataclass
class Layers:
    """Per-layer table, the table row of each kernel (-1: none) and how layers were found."""

    table: pd.DataFrame
    kernel_row: np.ndarray
    source: str

    def layer_at(self, times: np.ndarray) -> np.ndarray:
        """Layer index of the GPU window holding each time (latest-starting one), -1 when none."""
        times = np.asarray(times, dtype=np.int64)
        if len(self.table) == 0:
            return np.full(len(times), -1, dtype=np.int64)
        row = iv.window_of(times, self.table["start_ns"].to_numpy(np.int64), self.table["end_ns"].to_numpy(np.int64))
        return np.where(row >= 0, self.table["layer"].to_numpy(np.int64)[np.maximum(row, 0)], -1)

    def kernel_layer(self) -> np.ndarray:
        """Layer index (the ``layer`` column) of each kernel, -1 when it belongs to none."""
        layers = self.table["layer"].to_numpy() if len(self.table) else np.empty(0, dtype=np.int64)
        return np.where(self.kernel_row >= 0, layers[np.maximum(self.kernel_row, 0)] if len(layers) else -1, -1)


def _empty(act: DeviceActivity) -> Layers:
    return Layers(pd.DataFrame(columns=LAYER_COLUMNS), np.full(len(act.kernels), -1, dtype=np.int64), "none")


def _layer_index(names: np.ndarray) -> np.ndarray:
    distinct, inverse = np.unique(names.astype(str), return_inverse=True)
    numbers = np.array([int(m.group(1)) if (m := _DIGITS.search(n)) else -1 for n in distinct], dtype=np.int64)
    return numbers[inverse.ravel()]


def _from_ranges(act: DeviceActivity, pattern: str) -> tuple[pd.DataFrame, np.ndarray] | None:
    ranges = ranges_named(act, pattern=re.compile(pattern), kinds=("nvtx", "user_annotation",
                                                                   "gpu_user_annotation"))
    if len(ranges) == 0:
        return None
    if (ranges["device"] < 0).any():  # Kineto records a range on both sides: keep the CPU one (launch order)
        ranges = ranges[ranges["device"] < 0].reset_index(drop=True)
    k = act.kernels
    cpu = (ranges["device"] < 0).to_numpy()
    rs, re_ = ranges["start_ns"].to_numpy(), ranges["end_ns"].to_numpy()
    gs, ge, ok = rs.copy(), re_.copy(), ~cpu
    if cpu.any():
        gs[cpu], ge[cpu], ok[cpu] = project_to_gpu(act, rs[cpu], re_[cpu], ranges["pid"].to_numpy()[cpu],
                                                   ranges["tid"].to_numpy()[cpu])
    # kernel → range: by launch time among CPU ranges, by GPU start among GPU-side ranges
    row = np.full(len(k), -1, dtype=np.int64)
    cpu_rows = np.flatnonzero(cpu)
    if len(cpu_rows):
        hit = iv.window_of(act.launch_ns, rs[cpu_rows], re_[cpu_rows])
        row = np.where((hit >= 0) & (act.launch_ns >= 0), cpu_rows[np.maximum(hit, 0)], row)
    gpu_rows = np.flatnonzero(~cpu)
    if len(gpu_rows):
        hit = iv.window_of(k["start_ns"], rs[gpu_rows], re_[gpu_rows])
        row = np.where((row < 0) & (hit >= 0), gpu_rows[np.maximum(hit, 0)], row)
    keep = ok & np.isin(np.arange(len(ranges)), row)
    if not keep.any():
        return None
    new_index = np.cumsum(keep) - 1
    row = np.where(row >= 0, np.where(keep[np.maximum(row, 0)], new_index[np.maximum(row, 0)], -1), -1)
    names = ranges["name"].to_numpy()[keep]
    table = pd.DataFrame({"layer": _layer_index(names), "name": names, "start_ns": gs[keep], "end_ns": ge[keep]})
    return table, row


def _signatures(act: DeviceActivity, axis: np.ndarray, comm_rows: np.ndarray, comm_step: np.ndarray) -> np.ndarray:
    """Order-free hash of the compute kernels between collective i−1 and i (of the same step) on ``axis``."""
    k = act.kernels
    comm_at = axis[comm_rows]
    compute = np.flatnonzero(~act.kernel_is_comm & (axis >= 0))
    nxt = np.searchsorted(comm_at, axis[compute], side="right")
    valid = nxt < len(comm_rows)
    compute, nxt = compute[valid], nxt[valid]
    prev_ok = (nxt == 0) | (comm_step[np.maximum(nxt - 1, 0)] == comm_step[nxt])
    compute, nxt = compute[prev_ok], nxt[prev_ok]
    h = (k["name_id"][compute].astype(np.uint64) + np.uint64(1)) * _HASH_MULT
    h ^= h >> np.uint64(29)
    sig = np.zeros(len(comm_rows), dtype=np.uint64)
    np.add.at(sig, nxt, h)
    return sig


def _period(sig: np.ndarray, local: np.ndarray, step_of: np.ndarray) -> int | None:
    """Smallest p with sig[i] == sig[i+p] (same step, i ≥ 1 within the step) for ≥ 90% of comparable i."""
    for p in range(1, MAX_COLLECTIVES_PER_LAYER + 1):
        if len(sig) <= p:
            return None
        same_step = step_of[p:] == step_of[:-p]
        comparable = same_step & (local[:-p] >= 1)
        if comparable.sum() == 0:
            continue
        if np.mean(sig[:-p][comparable] == sig[p:][comparable]) >= MIN_SIGNATURE_MATCH:
            return p
    return None


def _order_axis(act: DeviceActivity) -> np.ndarray:
    """Host launch times when ≥ 95% of kernels (and of collectives) link to their launch — the order the
    program issued work, which stays regular when streams interleave on the GPU — else GPU start times."""
    linked = act.launch_ns >= 0
    comm_linked = linked[act.kernel_is_comm]
    if len(comm_linked) and comm_linked.mean() >= 0.95 and linked.mean() >= 0.95:
        return act.launch_ns
    return act.kernels["start_ns"]


def _from_collective_period(act: DeviceActivity, steps: pd.DataFrame) -> tuple[pd.DataFrame, np.ndarray] | None:
    k = act.kernels
    axis = _order_axis(act)
    ws, we = steps["start_ns"].to_numpy(), steps["end_ns"].to_numpy()
    kernel_step = iv.window_of(k["start_ns"], ws, we)
    comm_rows = np.flatnonzero(act.kernel_is_comm & (kernel_step >= 0) & (axis >= 0))
    comm_rows = comm_rows[np.argsort(axis[comm_rows], kind="stable")]
    comm_step = kernel_step[comm_rows]
    if len(comm_rows) < 2:
        return None
    first_of_step = np.r_[True, comm_step[1:] != comm_step[:-1]]
    group_start = np.flatnonzero(first_of_step)
    local = np.arange(len(comm_rows)) - np.repeat(group_start, np.diff(np.r_[group_start, len(comm_rows)]))
    p = _period(_signatures(act, axis, comm_rows, comm_step), local, comm_step)
    if p is None:
        return None
    layer = local // p
    last_of_layer = np.r_[(layer[1:] != layer[:-1]) | (comm_step[1:] != comm_step[:-1]), True]
    idx_last = np.flatnonzero(last_of_layer)
    lay_step, lay_num = comm_step[idx_last], layer[idx_last]
    # windows on the order axis: after the previous layer's last collective up to and including this layer's
    step_first = np.full(len(ws), np.iinfo(np.int64).max, dtype=np.int64)
    in_step = (kernel_step >= 0) & (axis >= 0)
    np.minimum.at(step_first, kernel_step[in_step], axis[in_step])
    a_end = axis[comm_rows[idx_last]] + 1
    a_start = np.where(lay_num == 0, step_first[lay_step], np.r_[np.iinfo(np.int64).min, a_end[:-1]])
    row = iv.window_of(np.where(axis >= 0, axis, np.iinfo(np.int64).min), a_start, a_end)
    row = np.where(kernel_step >= 0, row, -1)
    g_start = np.full(len(idx_last), np.iinfo(np.int64).max, dtype=np.int64)
    g_end = np.full(len(idx_last), np.iinfo(np.int64).min, dtype=np.int64)
    np.minimum.at(g_start, row[row >= 0], k["start_ns"][row >= 0])
    np.maximum.at(g_end, row[row >= 0], k["end_ns"][row >= 0])
    table = pd.DataFrame({"layer": lay_num.astype(np.int64), "name": [f"layer_{j}" for j in lay_num.tolist()],
                          "start_ns": g_start, "end_ns": g_end})
    return table, row


def _per_layer_numbers(act: DeviceActivity, table: pd.DataFrame, row: np.ndarray,
                       steps: pd.DataFrame) -> pd.DataFrame:
    k, n = act.kernels, len(table)
    s, e = k["start_ns"], k["end_ns"]

    def union_len(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        ps, pe, g = iv.group_union(s[mask], e[mask], row[mask])
        return ps, pe, g

    comm_sel = (row >= 0) & act.kernel_is_comm
    ps, pe, g = union_len(comm_sel)
    comm_ns = np.bincount(g, weights=pe - ps, minlength=n).astype(np.int64)
    exposed_piece = (pe - ps) - iv.measure_within(act.compute, ps, pe)
    exposed = np.bincount(g, weights=exposed_piece, minlength=n).astype(np.int64)
    cs, ce, cg = union_len((row >= 0) & ~act.kernel_is_comm)
    compute_ns = np.bincount(cg, weights=ce - cs, minlength=n).astype(np.int64)
    start, end = table["start_ns"].to_numpy(np.int64), table["end_ns"].to_numpy(np.int64)
    step_row = iv.window_of(start, steps["start_ns"].to_numpy(), steps["end_ns"].to_numpy())
    step_ids = steps["step"].to_numpy()
    out = pd.DataFrame({
        "step": np.where(step_row >= 0, step_ids[np.maximum(step_row, 0)] if len(step_ids) else -1, -1),
        "layer": table["layer"].to_numpy(np.int64), "name": table["name"].to_numpy(), "start_ns": start,
        "end_ns": end, "duration_ns": end - start, "comm_ns": comm_ns, "comm_exposed_ns": exposed,
        "compute_ns": compute_ns}, columns=LAYER_COLUMNS)
    return out


def layer_table(act: DeviceActivity, steps: pd.DataFrame, layer_pattern: str | None) -> Layers:
    """Layers of the device (see the module doc); ``layer_pattern`` None skips the range source."""
    if len(act.kernels) == 0:
        return _empty(act)
    found, source = None, "none"
    if layer_pattern:
        found = _from_ranges(act, layer_pattern)
        source = f"nvtx:{layer_pattern}"
    if found is None:
        found = _from_collective_period(act, steps)
        source = "collective_period"
    if found is None:
        return _empty(act)
    table, row = found
    order = np.argsort(table["start_ns"].to_numpy(), kind="stable")
    rank_of = np.empty(len(order), dtype=np.int64)
    rank_of[order] = np.arange(len(order))
    table = table.iloc[order].reset_index(drop=True)
    row = np.where(row >= 0, rank_of[np.maximum(row, 0)], -1)
    return Layers(_per_layer_numbers(act, table, row, steps), row, source)
