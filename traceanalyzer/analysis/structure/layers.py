"""Layers of one (rank, device): which kernels belong to which layer instance, and per-layer comm/compute.

Sources, first that applies:

* ``nvtx:<pattern>``: NVTX / user-annotation ranges whose name matches the regex (default: a whole name that is a
  layer name and number, ``layer_3``, ``layers.3``, ``model.layers.3``; reported as ``nvtx:layer ranges``). A
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
  tail after the last collective (e.g. the LM head) belongs to no layer. No layers when the collectives run
  back to back without compute between them in more than 10% of the gaps (DDP gradient buckets), or when a step
  holds fewer than two periods (one collective per step).
* ``kernel_period`` (devices without communication kernels): identical layers with no collective and no name —
  the smallest block of kernel names (≥ 3 kernels, ≥ 3 distinct names) repeated back to back ≥ 3 times
  (:func:`.step_detect.repeat_unit`) in the step with the median kernel count; each step is cut into the
  blocks of its own longest repeating stretch. Kernels before and after that stretch (embedding, LM head,
  optimizer) belong to no layer.
* ``none``.

Per layer: ``compute_ns`` = union of its non-communication kernels; ``comm_ns`` = union of its communication
kernels; ``comm_exposed_ns`` = that comm time during which no compute kernel ran anywhere on the device.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..activity import LAUNCH_COLUMNS, MEMORY, DeviceActivity
from ..numeric import intervals as iv
from ..numeric.frames import array_of, empty_frame

# the layer-pattern default and its check belong to layers; kept in a pandas-free module for the CLI's start-up
from .layer_pattern import DEFAULT_LAYER_PATTERN as DEFAULT_LAYER_PATTERN
from .layer_pattern import check_layer_pattern as check_layer_pattern
from .step_detect import MIN_LAYER_REPEATS, longest_repeat, repeat_unit
from .steps import project_to_gpu, ranges_named

LAYER_COLUMNS = ["step", "layer", "name", "start_ns", "end_ns", "duration_ns", "comm_ns", "comm_exposed_ns",
                 "compute_ns"]
MAX_COLLECTIVES_PER_LAYER = 16
MIN_SIGNATURE_MATCH = 0.9
SAME_PART = 0.75  # share of kernel positions (or names) two layers of one model have in common
_DIGITS = re.compile(r"(\d+)(?!.*\d)")
_HASH_MULT = np.uint64(0x9E3779B97F4A7C15)


@dataclass
class Layers:
    """Per-layer table, the table row of each kernel (-1: none) and how layers were found."""

    table: pd.DataFrame
    kernel_row: np.ndarray  # int32 or int64
    source: str

    def layer_at(self, times: np.ndarray) -> np.ndarray:
        """Layer index of the GPU window holding each time (latest-starting one), -1 when none."""
        times = np.asarray(times, dtype=np.int64)
        if len(self.table) == 0:
            return np.full(len(times), -1, dtype=np.int64)
        row = iv.window_of(times, array_of(self.table, "start_ns", np.int64), array_of(self.table, "end_ns", np.int64))
        return np.where(row >= 0, array_of(self.table, "layer", np.int64)[np.maximum(row, 0)], -1)

    def kernel_layer(self) -> np.ndarray:
        """Layer index (the ``layer`` column) of each kernel, -1 when it belongs to none."""
        layers = array_of(self.table, "layer") if len(self.table) else np.empty(0, dtype=np.int64)
        return np.where(self.kernel_row >= 0, layers[np.maximum(self.kernel_row, 0)] if len(layers) else -1, -1)


def _empty(act: DeviceActivity) -> Layers:
    table = empty_frame(LAYER_COLUMNS)
    return Layers(table, np.full(len(act.kernels), -1, dtype=np.int64), "none")


def _layer_index(names: np.ndarray) -> np.ndarray:
    distinct, inverse = np.unique(names.astype(str), return_inverse=True)
    numbers = np.array([int(m.group(1)) if (m := _DIGITS.search(n)) else -1 for n in distinct], dtype=np.int64)
    return numbers[inverse.ravel()]


def _from_ranges(act: DeviceActivity, pattern: str) -> tuple[pd.DataFrame, np.ndarray] | None:
    if len(act.trace.ranges) == 0:
        return None
    ranges = ranges_named(act, pattern=re.compile(pattern), kinds=("nvtx", "user_annotation",
                                                                   "gpu_user_annotation"))
    if len(ranges) == 0:
        return None
    if (ranges["device"] < 0).any():  # Kineto records a range on both sides: keep the CPU one (launch order)
        ranges = ranges[ranges["device"] < 0].reset_index(drop=True)
    k = act.kernels
    cpu = (ranges["device"] < 0).to_numpy()
    rs, re_ = array_of(ranges, "start_ns"), array_of(ranges, "end_ns")
    gs, ge, ok = rs.copy(), re_.copy(), ~cpu
    if cpu.any():
        gs[cpu], ge[cpu], ok[cpu] = project_to_gpu(act, rs[cpu], re_[cpu], array_of(ranges, "pid")[cpu],
                                                   array_of(ranges, "tid")[cpu])
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
    names = array_of(ranges, "name")[keep]
    table = pd.DataFrame({"layer": _layer_index(names), "name": names, "start_ns": gs[keep], "end_ns": ge[keep]})
    return table, row


def _signatures(act: DeviceActivity, axis: np.ndarray, comm_rows: np.ndarray, comm_step: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray]:
    """Order-free hash of the compute kernels between collective i−1 and i (of the same step) on ``axis``, and
    how many kernels that are neither communication nor memory ran there."""
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
    computing = np.bincount(nxt[act.kernel_bucket[compute] != MEMORY], minlength=len(comm_rows))
    return sig, computing


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
    """The order the program issued work, when ≥ 95% of kernels (and of collectives) link to their launch: the
    rank of each kernel by (host launch time, GPU start) — kernels of one CUDA-graph launch share a launch time
    and keep their GPU order — which stays regular when streams interleave on the GPU; else GPU start times.
    Unlinked kernels get -1."""
    linked = act.launch_ns >= 0
    comm_linked = linked[act.kernel_is_comm]
    if len(comm_linked) and comm_linked.mean() >= 0.95 and linked.mean() >= 0.95:
        order = np.lexsort((act.kernels["start_ns"], act.launch_ns))
        axis = np.empty(len(order), dtype=np.int64)
        axis[order] = np.arange(len(order))
        return np.where(linked, axis, -1)
    return act.kernels["start_ns"]


def _segments(act: DeviceActivity, axis: np.ndarray, comm_rows: np.ndarray) -> list[np.ndarray]:
    """The kernel names issued before each collective since the previous one of its step (on the order axis)."""
    seq = np.flatnonzero(axis >= 0)
    seq = seq[np.argsort(axis[seq], kind="stable")]
    at = np.searchsorted(axis[seq], axis[comm_rows])
    begin = np.r_[0, at[:-1] + 1]  # a step's first segment holds what came before it too (its prologue)
    names = np.asarray(act.kernels["name_id"])[seq]
    return [names[b:e] for b, e in zip(begin.tolist(), at.tolist(), strict=True)]


def _layers_in_period(segments: list[np.ndarray], local: np.ndarray, step_of: np.ndarray, p: int) -> int:
    """Layers in one period of ``p`` collectives: the largest ``m`` dividing ``p`` whose ``m`` parts (``p / m``
    collectives each) repeat the same kernels at ≥ ``SAME_PART`` of positions in ≥ ``MIN_SIGNATURE_MATCH`` of
    the periods (layer types that alternate, e.g. sliding and full attention, make a period of two layers)."""
    for m in range(p, 1, -1):
        if p % m:
            continue
        d = p // m
        ok = total = 0
        for i in range(p, len(segments) - p + 1, p):  # whole periods after a step's first
            if step_of[i] != step_of[i + p - 1] or local[i] < p:
                continue
            parts = [np.concatenate(segments[i + j * d:i + (j + 1) * d]) for j in range(m)]
            total += 1
            ok += all(len(x) == len(parts[0]) and len(x) and float(np.mean(x == parts[0])) >= SAME_PART
                      for x in parts[1:])
        if total and ok >= MIN_SIGNATURE_MATCH * total:
            return m
    return 1


def _leading_collectives(segments: list[np.ndarray], local: np.ndarray, step_of: np.ndarray, p: int) -> int:
    """Collectives at the start of each step that belong to no layer (an all-reduce right after the embedding):
    the smallest ``o`` < ``p`` whose segment holds the names of the same phase one layer later, in most steps."""
    firsts = np.flatnonzero(local == 0)
    for o in range(p):
        held = []
        for f in firsts.tolist():
            a, b = f + o, f + o + p
            if b < len(segments) and step_of[b] == step_of[f]:
                later = set(segments[b].tolist())
                held.append(len(later & set(segments[a].tolist())) >= SAME_PART * max(len(later), 1))
        if not held or np.mean(held) >= 0.5:
            return o
    return 0


def _from_collective_period(act: DeviceActivity, steps: pd.DataFrame) -> tuple[pd.DataFrame, np.ndarray] | None:
    k = act.kernels
    axis = _order_axis(act)
    ws, we = array_of(steps, "start_ns"), array_of(steps, "end_ns")
    kernel_step = iv.window_of(k["start_ns"], ws, we)
    comm_rows = np.flatnonzero(act.kernel_is_comm & (kernel_step >= 0) & (axis >= 0))
    comm_rows = comm_rows[np.argsort(axis[comm_rows], kind="stable")]
    comm_step = kernel_step[comm_rows]
    if len(comm_rows) < 2:
        return None
    first_of_step = np.concatenate(([True], comm_step[1:] != comm_step[:-1]))
    group_start = np.flatnonzero(first_of_step)
    local = np.arange(len(comm_rows)) - np.repeat(group_start, np.diff(np.concatenate((group_start, [len(comm_rows)]))))
    sig, computing = _signatures(act, axis, comm_rows, comm_step)
    if (local >= 1).any() and np.mean(computing[local >= 1] > 0) < MIN_SIGNATURE_MATCH:
        return None  # collectives back to back (DDP gradient buckets), not layers of compute and collectives
    p = _period(sig, local, comm_step)
    if p is None:
        return None
    segments = _segments(act, axis, comm_rows)
    p = p // _layers_in_period(segments, local, comm_step, p)
    offset = _leading_collectives(segments, local, comm_step, p)
    per_step = np.bincount(comm_step[local >= offset]) // p
    if np.median(per_step[per_step > 0]) < 2:
        return None  # one layer's worth of collectives per step: no repeating layer
    layer = np.where(local >= offset, (local - offset) // p, -1)
    in_layer = np.flatnonzero(layer >= 0)
    nxt_differs = np.r_[(layer[in_layer][1:] != layer[in_layer][:-1])
                        | (comm_step[in_layer][1:] != comm_step[in_layer][:-1]), True]
    idx_last = in_layer[nxt_differs]
    idx_first = in_layer[np.r_[True, nxt_differs[:-1]]]
    lay_step, lay_num = comm_step[idx_last], layer[idx_last]
    # windows on the order axis: after the previous collective of the step (the previous layer's last, or a
    # collective before the first layer: after the embedding) up to and including this layer's last collective
    step_first = np.full(len(ws), np.iinfo(np.int64).max, dtype=np.int64)
    in_step = (kernel_step >= 0) & (axis >= 0)
    np.minimum.at(step_first, kernel_step[in_step], axis[in_step])
    a_end = axis[comm_rows[idx_last]] + 1
    prev = np.maximum(idx_first - 1, 0)
    after_prev = (idx_first > 0) & (comm_step[prev] == comm_step[idx_first])
    a_start = np.where(after_prev, axis[comm_rows[prev]] + 1, step_first[lay_step])
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
                       steps: pd.DataFrame, numbers: bool = True) -> pd.DataFrame:
    """The per-layer table (``LAYER_COLUMNS``); without ``numbers``, without the time columns ``comm_ns``,
    ``comm_exposed_ns`` and ``compute_ns``."""
    start, end = array_of(table, "start_ns", np.int64), array_of(table, "end_ns", np.int64)
    step_row = iv.window_of(start, array_of(steps, "start_ns"), array_of(steps, "end_ns"))
    step_ids = array_of(steps, "step")
    out = {"step": np.where(step_row >= 0, step_ids[np.maximum(step_row, 0)] if len(step_ids) else -1, -1),
           "layer": array_of(table, "layer", np.int64), "name": array_of(table, "name"), "start_ns": start,
           "end_ns": end, "duration_ns": end - start}
    if not numbers:
        return pd.DataFrame(out)
    k, n = act.kernels, len(table)
    s, e = k["start_ns"], k["end_ns"]
    comm_sel = (row >= 0) & act.kernel_is_comm
    ps, pe, g = iv.group_union(s[comm_sel], e[comm_sel], row[comm_sel])
    out["comm_ns"] = np.bincount(g, weights=pe - ps, minlength=n).astype(np.int64)
    exposed_piece = (pe - ps) - iv.measure_within(act.compute, ps, pe)
    out["comm_exposed_ns"] = np.bincount(g, weights=exposed_piece, minlength=n).astype(np.int64)
    compute_sel = (row >= 0) & ~act.kernel_is_comm
    cs, ce, cg = iv.group_union(s[compute_sel], e[compute_sel], row[compute_sel])
    out["compute_ns"] = np.bincount(cg, weights=ce - cs, minlength=n).astype(np.int64)
    return pd.DataFrame(out, columns=LAYER_COLUMNS)


_INDUCTOR_INDEX = re.compile(r"^(triton_[a-z]+_fused_\w*?)_\d+$")


def kernel_roles(act: DeviceActivity) -> np.ndarray:
    """A role id per kernel: its name id, except that Inductor's generated Triton kernels, which are named by their
    fused ops plus a running index (``triton_red_fused_add_mean_mul_pow_rsqrt_3``), share one role per op
    pattern: torch.compile gives each layer's copy of the same fusion its own index."""
    ids = np.asarray(act.kernels["name_id"]).astype(np.int64)
    distinct, inverse = np.unique(ids, return_inverse=True)
    texts = [str(t) for t in act.trace.names(distinct)] if len(distinct) else []
    roles = [_INDUCTOR_INDEX.sub(r"\1", t) for t in texts]
    if roles == texts:
        return ids
    _, role_of = np.unique(np.array(roles, dtype=object), return_inverse=True)
    return (role_of.ravel()[inverse.ravel()]).astype(np.int64)


def _edge_layers(names: np.ndarray, start: int, repeats: int, period: int) -> tuple[int, int]:
    """The repeated stretch widened by the block just before and just after it when that block has the unit's kernels
    at ≥ ``SAME_PART`` of positions: the first and last layers differ where a compiler fuses across the layer
    boundary (the embedding into layer 0's norm, the last layer's add into the final norm); they still tile the pass."""
    unit = names[start:start + period]
    if start >= period and np.mean(names[start - period:start] == unit) >= SAME_PART:
        start, repeats = start - period, repeats + 1
    stop = start + repeats * period
    if stop + period <= len(names) and np.mean(names[stop:stop + period] == unit) >= SAME_PART:
        repeats += 1
    return start, repeats


def _from_kernel_period(act: DeviceActivity, steps: pd.DataFrame) -> tuple[pd.DataFrame, np.ndarray] | None:
    """Layers as repeats of one block of kernels inside each step (identical layers without collectives or
    names): the period comes from the step with the median kernel count, and every step is cut into the blocks
    of its own longest repeating stretch of that period."""
    k = act.kernels
    axis = _order_axis(act)
    ws, we = array_of(steps, "start_ns"), array_of(steps, "end_ns")
    kernel_step = iv.window_of(k["start_ns"], ws, we)
    usable = (kernel_step >= 0) & (axis >= 0)
    rows = np.flatnonzero(usable)
    rows = rows[np.lexsort((axis[rows], kernel_step[rows]))]
    bounds = np.searchsorted(kernel_step[rows], np.arange(len(ws) + 1))
    sizes = np.diff(bounds)
    if not (sizes > 0).any():
        return None
    typical = int(np.argsort(sizes)[len(sizes) // 2])
    names = kernel_roles(act)
    period = repeat_unit(names[rows[bounds[typical]:bounds[typical + 1]]])
    if period is None:
        return None
    row = np.full(len(k), -1, dtype=np.int64)
    layer_num: list[int] = []
    g_start: list[int] = []
    g_end: list[int] = []
    for i in range(len(ws)):
        seq = rows[bounds[i]:bounds[i + 1]]
        if len(seq) < MIN_LAYER_REPEATS * period:
            continue
        start, repeats = longest_repeat(names[seq], period)
        if repeats < MIN_LAYER_REPEATS:
            continue
        start, repeats = _edge_layers(names[seq], start, repeats, period)
        for j in range(repeats):
            block = seq[start + j * period:start + (j + 1) * period]
            row[block] = len(layer_num)
            layer_num.append(j)
            g_start.append(int(k["start_ns"][block].min()))
            g_end.append(int(k["end_ns"][block].max()))
    if not layer_num:
        return None
    table = pd.DataFrame({"layer": np.asarray(layer_num, dtype=np.int64),
                          "name": [f"layer_{j}" for j in layer_num],
                          "start_ns": np.asarray(g_start, dtype=np.int64), "end_ns": np.asarray(g_end, dtype=np.int64)})
    return table, row


def layer_table(act: DeviceActivity, steps: pd.DataFrame, layer_pattern: str | None, *,
                numbers: bool = True) -> Layers:
    """Layers of the device (see the module doc); ``layer_pattern`` None skips the range source; without
    ``numbers`` the table leaves out the per-layer times (``comm_ns``, ``comm_exposed_ns``, ``compute_ns``)."""
    if len(act.kernels) == 0:
        return _empty(act)
    found, source = None, "none"
    if layer_pattern:
        found = _from_ranges(act, layer_pattern)
        source = "nvtx:layer ranges" if layer_pattern == DEFAULT_LAYER_PATTERN else f"nvtx:{layer_pattern}"
    if found is None:
        found = _from_collective_period(act, steps)
        source = "collective_period"
    if found is None and not act.kernel_is_comm.any():
        found = _from_kernel_period(act, steps)
        source = "kernel_period"
    if found is None:
        return _empty(act)
    table, row = found
    del found
    act.forget(*LAUNCH_COLUMNS, "busy")  # read to find the steps and layers; not held through the unions below
    order = np.argsort(array_of(table, "start_ns"), kind="stable")
    # the row of each kernel, kept with the summary: int32 (a table of fewer than 2**31 layers)
    rank_of = np.empty(len(order), dtype=np.int32)
    rank_of[order] = np.arange(len(order))
    table = table.iloc[order].reset_index(drop=True)
    row = np.where(row >= 0, rank_of[np.maximum(row, 0)], np.int32(-1))
    return Layers(_per_layer_numbers(act, table, row, steps, numbers), row, source)
