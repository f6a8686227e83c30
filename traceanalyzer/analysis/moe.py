"""MoE layers: where each MoE layer's time goes, per (rank, device), and how it spreads across ranks (docs/MOE.md).

**Stage of a kernel** (``buckets.MOE_STAGES``), first that applies:

1. *name*: the matching rule's ``moe_stage`` (``rules/default.toml``; expert-GEMM buckets are ``expert``), and the
   eager expert GEMMs the context pass moved to ``moe_gemm``;
2. *position*, for all-to-all kernels that name no stage: an expert-parallel library's notify / layout kernel
   (rule ``comm.expert_parallel``) takes the stage of the next named dispatch or combine on its stream in the same
   MoE layer; any other all-to-all (NCCL ``all_to_all(v)``) is ``dispatch`` when it starts before the layer's
   first expert kernel, else ``combine``;
3. *range*: kernels launched in a range named like a stage (``router`` / ``gate``, ``dispatch``, ``combine`` /
   ``unpermute``, ``shared_expert``) take that stage; then, in a range named like an MoE block (``moe``,
   ``expert``): top-k and softmax kernels are the ``router``, sorts and scans ``dispatch``, a dense GEMM before the
   block's first router kernel the router's gate GEMM (unless a range shows the router: the gate GEMM is inside
   it), one after it a ``shared_expert`` GEMM; any other kernel
   by its place in the layer: after the last router kernel and before the first expert kernel ``dispatch``
   (permutation: gathers, counts), between the first and last expert kernel ``expert`` (activation, scaling),
   after the last expert kernel ``combine`` (weighting, scatter-add), else ``moe_other`` (a norm before the
   routing). Communication kernels take a stage only by name, position or a dispatch / combine range.

Ranges only apply inside MoE layers, which hold a kernel staged by name.

**MoE layer**: a layer of the device (``analysis.layers``: one row of ``per_layer``) holding a staged kernel; a
device without layers has one MoE block per step (``layer`` −1, ``layer_source`` ``step``), and so do staged
kernels outside every layer. Per layer: ``moe_ns`` = union of its staged kernels; ``<stage>_ns`` = union of each
stage; ``<stage>_exclusive_ns`` = the MoE time split by ``MOE_STAGE_PRECEDENCE`` (experts claim first,
communication last), so the exclusive parts add up to ``moe_ns``; ``expert_<precision>_ns`` = union of the expert
GEMMs (MoE GEMM buckets) of each precision; ``<dispatch|combine>_comm_ns`` = union of that stage's communication
kernels, ``…_exposed_ns`` = the part of it with no compute kernel running anywhere on the device (the exposed
communication of ``analysis.device``), hidden = comm − exposed; ``permute_ns`` / ``unpermute_ns`` = union of the
dispatch / combine stage's other (compute) kernels: the token permutation and un-permutation.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from ..classify.context import MOE_RANGE, SHARED_EXPERT_RANGE, range_instances
from ..classify.rules import PRECISIONS, RuleSet
from ..model.buckets import MOE_BUCKETS, MOE_STAGE_PRECEDENCE, MOE_STAGES
from .activity import DeviceActivity
from .numeric import intervals as iv
from .numeric.frames import array_of, frame
from .structure.layers import Layers

#: Stages named by ranges, checked in this order (a kernel in a ``combine`` range inside a ``dispatcher`` one is
#: combine). Annotation and module names, never op names: ``aten::permute`` names no stage.
STAGE_RANGES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("shared_expert", SHARED_EXPERT_RANGE),
    ("router", re.compile(r"router|moe_?gate|gating", re.IGNORECASE)),  # a bare "gate" is the SwiGLU's too
    ("combine", re.compile(r"combine|unpermut", re.IGNORECASE)),
    ("dispatch", re.compile(r"dispatch|token_permut", re.IGNORECASE)),
)
_COMM_RANGE_STAGES = ("dispatch", "combine")
EAGER_EXPERT_RULE = "context.moe_range"  # classify.context: dense GEMMs of an eager expert loop
EP_LIBRARY_RULE = "comm.expert_parallel"  # an expert-parallel library's kernel that names neither stage
STAGE_SOURCES = ("name", "position", "range")
COMM_STAGES = ("dispatch", "combine")

LAYER_COLUMNS = ["step", "layer", "start_ns", "end_ns", "kernels", "moe_ns",
                 *[f"{s}_ns" for s in MOE_STAGES], *[f"{s}_exclusive_ns" for s in MOE_STAGES],
                 "expert_gemm_ns", *[f"expert_{p}_ns" for p in PRECISIONS],
                 *[f"{s}_{m}_ns" for s in COMM_STAGES for m in ("comm", "exposed")], "permute_ns", "unpermute_ns"]


@dataclass
class DeviceMoe:
    """The MoE layers of one (rank, device): one row per (step, layer) in ``layers`` (``LAYER_COLUMNS``)."""

    rank: int
    device: int
    trace: str
    layer_source: str  # the device's layer source (analysis.layers), or "step": one MoE block per step
    stage_sources: dict[str, int]  # kernels staged by name / position / range
    layers: pd.DataFrame
    steps: int  # step windows of the device
    comm_streams: list[int] = field(default_factory=list)  # streams of the dispatch / combine communication kernels
    expert_streams: list[int] = field(default_factory=list)  # streams of the expert-stage kernels
    # per kernel of the device (its activity's start order), the index of its stage in MOE_STAGES, -1: none;
    # the export's kernel rows read it, never in JSON
    kernel_stage: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int8), repr=False, compare=False)

    def stage_names(self) -> list[str | None]:
        """:attr:`kernel_stage` as stage names (None: not MoE work)."""
        names: list[str | None] = [*MOE_STAGES, None]
        return [names[i] for i in self.kernel_stage.tolist()]

    def per_step(self) -> pd.DataFrame:
        """The layers' numbers summed per step (``step`` and the ``*_ns`` columns; ``layers`` counts them)."""
        cols = [c for c in LAYER_COLUMNS if c.endswith("_ns") and c not in ("start_ns", "end_ns")]
        if not len(self.layers):
            return pd.DataFrame(columns=["step", "layers", *cols])
        out = self.layers.groupby("step", sort=True)[cols].sum()
        out.insert(0, "layers", self.layers.groupby("step", sort=True).size())
        return out.reset_index()

    def step_median(self) -> dict[str, int]:
        """The representative step's per-step sums (``*_ns``, ``layers``): the step holding MoE work whose MoE time
        is the median (the lower middle one of an even count), so its stage parts add up to its MoE time."""
        per = self.per_step()
        if not len(per):
            return {}
        moe = per["moe_ns"].to_numpy(np.int64)
        row = int(np.argsort(moe, kind="stable")[(len(moe) - 1) // 2])
        return {c: int(per[c].iloc[row]) for c in per.columns if c != "step"}

    def to_json(self) -> dict[str, Any]:
        from .results import _records

        return {"rank": self.rank, "device": self.device, "trace": self.trace, "layer_source": self.layer_source,
                "stage_sources": self.stage_sources, "steps": self.steps, "comm_streams": self.comm_streams,
                "expert_streams": self.expert_streams, "per_step_median": self.step_median(),
                "layers": _records(self.layers)}


@dataclass
class MoeSummary:
    """Every device's MoE layers and, across the ranks of the first run, the expert-load spread per layer."""

    devices: list[DeviceMoe]
    # per (step ordinal, layer) matched across ranks: ranks, hot_rank, expert_max_ns, expert_median_ns, extra_ns,
    # and the wait in dispatch / combine of the other ranks (their comm time over the least rank's)
    imbalance: pd.DataFrame = field(default_factory=pd.DataFrame)
    ranks: list[int] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        from .results import _records

        return {"stages": list(MOE_STAGES), "exclusive_precedence": list(MOE_STAGE_PRECEDENCE),
                "devices": [d.to_json() for d in self.devices], "ranks": self.ranks,
                "imbalance": _records(self.imbalance)}


def stage_of_rules(rules: RuleSet) -> dict[str, str]:
    """Rule id → MoE stage, for the rules that name one (and the context pass's eager expert GEMMs)."""
    out = {r.id: r.moe_stage for r in rules.rules if r.moe_stage}
    out.setdefault(EAGER_EXPERT_RULE, "expert")
    return out


def _ids(act: DeviceActivity, column: str) -> np.ndarray:
    return act.kernels[column].astype(np.int64)


def _lookup(act: DeviceActivity, column: str, mapping: dict[str, int], default: int = -1) -> np.ndarray:
    """Per kernel, ``mapping`` of the string at its ``column`` id (``default`` where the string is not a key)."""
    strings = act.trace.strings
    ids = _ids(act, column)
    table = np.full(len(strings) + 1, default, dtype=np.int64)
    for text, value in mapping.items():
        i = strings.get(text)
        if i >= 0:
            table[i] = value
    return table[np.where(ids >= 0, ids, len(strings))]


def _instances(act: DeviceActivity, steps: pd.DataFrame, layers: Layers) -> tuple[np.ndarray, np.ndarray,
                                                                                   np.ndarray, str]:
    """Per kernel, the step ordinal (-1: none) and the MoE block it may belong to: the (step, layer) instance
    id, and the layer number (-1: the step's block outside layers)."""
    start = act.kernels["start_ns"]
    step = iv.window_index(start, array_of(steps, "start_ns", np.int64), array_of(steps, "end_ns", np.int64)) \
        if len(steps) else np.full(len(start), -1, dtype=np.int64)
    row = np.asarray(layers.kernel_row, dtype=np.int64) if len(layers.table) else np.full(len(start), -1)
    number = layers.kernel_layer() if len(layers.table) else np.full(len(start), -1, dtype=np.int64)
    # a layer row is its own instance; outside layers, the step's block: ids past the layer rows
    inst = np.where(row >= 0, row, np.where(step >= 0, len(layers.table) + step, -1))
    source = layers.source if len(layers.table) else "step"
    return step, inst, np.where(row >= 0, number, -1), source


def kernel_stages(act: DeviceActivity, inst: np.ndarray, rules: RuleSet) -> tuple[np.ndarray, dict[str, int]]:
    """Per kernel, the index of its stage in ``MOE_STAGES`` (-1: not MoE work) and how many were staged by each
    source (module doc)."""
    code = {s: i for i, s in enumerate(MOE_STAGES)}
    stage = _lookup(act, "rule_id", {rid: code[s] for rid, s in stage_of_rules(rules).items()})
    stage = np.where(inst >= 0, stage, -1)
    counts = {"name": int((stage >= 0).sum()), "position": 0, "range": 0}
    if counts["name"] == 0:
        return stage, counts
    moe_inst = np.zeros(int(inst.max()) + 1, dtype=bool)
    moe_inst[inst[stage >= 0]] = True
    in_moe = (inst >= 0) & moe_inst[np.maximum(inst, 0)]
    comm = act.kernel_is_comm
    a2a = comm & (_lookup(act, "subbucket_id", {"all_to_all": 1}, 0) == 1)
    before = _position_stages(act, inst, stage, a2a & in_moe & (stage < 0), code)
    counts["position"] = int(((before >= 0) & (stage < 0)).sum())
    stage = before
    ranged = _range_stages(act, inst, stage, in_moe & (stage < 0), comm, code)
    counts["range"] = int(((ranged >= 0) & (stage < 0)).sum())
    return ranged, counts


def _position_stages(act: DeviceActivity, inst: np.ndarray, stage: np.ndarray, todo: np.ndarray,
                     code: dict[str, int]) -> np.ndarray:
    """Stages of the all-to-all kernels ``todo`` (module doc, 2): the stage of the next named dispatch / combine on
    the same stream in the same MoE layer (one search over those kernels sorted by layer, stream and start), else
    dispatch before the layer's first expert kernel and combine after it."""
    out = stage.copy()
    if not todo.any():
        return out
    start, stream = act.kernels["start_ns"].astype(np.int64), act.kernels["stream"].astype(np.int64)
    rows = np.flatnonzero(todo)
    named = np.flatnonzero(np.isin(stage, [code["dispatch"], code["combine"]]))
    order = named[np.lexsort((start[named], stream[named], inst[named]))]
    keys = np.stack([inst[order], stream[order], start[order]], axis=1)
    want = np.stack([inst[rows], stream[rows], start[rows]], axis=1)
    # first named kernel at or after (layer, stream, start), compared as tuples
    pos = _tuple_searchsorted(keys, want)
    found = pos < len(order)
    at = order[np.minimum(pos, max(len(order) - 1, 0))] if len(order) else np.zeros(len(rows), dtype=np.int64)
    found &= (inst[at] == inst[rows]) & (stream[at] == stream[rows]) if len(order) else False
    first = np.full(int(inst.max()) + 1, np.iinfo(np.int64).max, dtype=np.int64)
    expert = stage == code["expert"]
    np.minimum.at(first, inst[expert], start[expert])
    positional = np.where(start[rows] < first[inst[rows]], code["dispatch"], code["combine"])
    library = _lookup(act, "rule_id", {EP_LIBRARY_RULE: 1}, 0)[rows] == 1  # notify / layout of an EP library
    out[rows] = np.where(found & library, stage[at], positional)
    return out


def _tuple_searchsorted(keys: np.ndarray, want: np.ndarray) -> np.ndarray:
    """For each row of ``want``, the first row of ``keys`` (sorted lexicographically) not less than it."""
    if not len(keys):
        return np.zeros(len(want), dtype=np.int64)
    # ranks of the leading columns make one int64 key: (layer, stream) pairs are few
    lead = np.concatenate([keys[:, :2], want[:, :2]])
    _, code = np.unique(lead, axis=0, return_inverse=True)
    code = code.ravel().astype(np.int64)
    span = np.int64(max(int(keys[:, 2].max()), int(want[:, 2].max())) - min(int(keys[:, 2].min()),
                                                                          int(want[:, 2].min())) + 1)
    base = min(int(keys[:, 2].min()), int(want[:, 2].min()))
    flat_keys = code[:len(keys)] * span + (keys[:, 2] - base)
    flat_want = code[len(keys):] * span + (want[:, 2] - base)
    return np.searchsorted(flat_keys, flat_want, side="left")


def _range_stages(act: DeviceActivity, inst: np.ndarray, stage: np.ndarray, todo: np.ndarray, comm: np.ndarray,
                  code: dict[str, int]) -> np.ndarray:
    """Stages from the ranges the kernels ``todo`` were launched in (module doc, 3)."""
    out = stage.copy()
    if not todo.any():
        return out
    rows = np.flatnonzero(todo)
    k = act.kernels
    start, device = k["start_ns"][rows], np.full(len(rows), act.device, dtype=np.int64)
    launch = np.asarray(act.launch_row, dtype=np.int64)[rows]
    left = np.ones(len(rows), dtype=bool)
    router_range = np.zeros(int(inst.max()) + 1, dtype=bool)  # MoE layers whose router a range shows
    for name, pattern in STAGE_RANGES:
        allowed = left & (~comm[rows] if name not in _COMM_RANGE_STAGES else True)
        if not allowed.any():
            continue
        hit = allowed & (range_instances(act.trace, pattern, start, device, launch) >= 0)
        out[rows[hit]] = code[name]
        left &= ~hit
        if name == "router":
            router_range[inst[rows[hit]]] = True
    block = left & ~comm[rows]
    if not block.any():
        return out
    moe_block = range_instances(act.trace, MOE_RANGE, start, device, launch)
    block &= moe_block >= 0
    sub = _lookup(act, "subbucket_id", {"topk": 1, "softmax": 1, "sort": 2, "scan": 2}, 0)[rows]
    gemm = _lookup(act, "bucket_id", {"gemm": 1}, 0)[rows] == 1
    out[rows[block & (sub == 1)]] = code["router"]
    out[rows[block & (sub == 2)]] = code["dispatch"]
    dense = block & gemm
    if dense.any():
        # a dense GEMM before the MoE layer's first router kernel is the gate, one after it a shared expert; where
        # a range shows the router, its gate GEMM is inside it and the block's other dense GEMMs are shared experts
        router = out == code["router"]
        first = np.full(int(inst.max()) + 1, np.iinfo(np.int64).max, dtype=np.int64)
        np.minimum.at(first, inst[router], k["start_ns"][router].astype(np.int64))
        gate = dense & (start < first[inst[rows]]) & ~router_range[inst[rows]]
        out[rows[gate]] = code["router"]
        out[rows[dense & ~gate]] = code["shared_expert"]
    rest = block & (out[rows] < 0)
    out[rows[rest]] = _phase(k["start_ns"], inst, out, rows[rest], code)
    return out


def _phase(start: np.ndarray, inst: np.ndarray, stage: np.ndarray, rows: np.ndarray,
           code: dict[str, int]) -> np.ndarray:
    """Stages of the other kernels ``rows`` of MoE blocks from where they run in their layer's sequence (module
    doc): between the last router and the first expert kernel ``dispatch``, from the first to the last expert
    kernel ``expert``, after the last expert kernel ``combine``, before or amid the routing ``moe_other``."""
    n = int(inst.max()) + 1
    big, small = np.iinfo(np.int64).max, np.iinfo(np.int64).min
    bounds = {}
    for name, fn, init in (("router", np.maximum, small), ("expert", np.minimum, big), ("expert_last", np.maximum,
                                                                                          small)):
        mine = stage == code["expert" if name == "expert_last" else name]
        b = np.full(n, init, dtype=np.int64)
        fn.at(b, inst[mine], start[mine].astype(np.int64))
        bounds[name] = b
    t, i = start[rows].astype(np.int64), inst[rows]
    last_router, first_expert, last_expert = bounds["router"][i], bounds["expert"][i], bounds["expert_last"][i]
    out = np.full(len(rows), code["moe_other"], dtype=np.int64)
    has_router, has_expert = last_router > small, first_expert < big
    out[has_router & has_expert & (t > last_router) & (t < first_expert)] = code["dispatch"]
    out[has_expert & (t > first_expert) & (t < last_expert)] = code["expert"]
    out[has_expert & (t > last_expert)] = code["combine"]
    return out


def _any_named(act: DeviceActivity, rules: RuleSet) -> bool:
    """Whether a kernel of the device is MoE work by its rule (checked on the distinct rule ids only)."""
    strings = act.trace.strings
    ids = {strings.get(r) for r in stage_of_rules(rules)} - {-1}
    return bool(ids) and bool(np.isin(np.unique(act.kernels["rule_id"]), list(ids)).any())


def _group_lengths(starts: np.ndarray, ends: np.ndarray, groups: np.ndarray, n: int) -> np.ndarray:
    """Length of the union of each group 0..n-1."""
    if not len(starts):
        return np.zeros(n, dtype=np.int64)
    us, ue, g = iv.group_union(starts, ends, groups)
    return np.bincount(g, weights=ue - us, minlength=n).astype(np.int64)[:n]


def device_moe(act: DeviceActivity, steps: pd.DataFrame, layers: Layers, rules: RuleSet) -> DeviceMoe | None:
    """The MoE layers of the device (module doc); None when no kernel is MoE work."""
    if len(act.kernels) == 0 or "rule_id" not in act.kernels or not _any_named(act, rules):
        return None
    step, inst, number, source = _instances(act, steps, layers)
    stage, counts = kernel_stages(act, inst, rules)
    moe = np.flatnonzero(stage >= 0)
    if not len(moe):
        return None
    k = act.kernels
    s, e = k["start_ns"][moe].astype(np.int64), k["end_ns"][moe].astype(np.int64)
    ids, local = np.unique(inst[moe], return_inverse=True)
    local = local.ravel().astype(np.int64)
    n, st = len(ids), stage[moe]
    cols: dict[str, Any] = {}
    first = np.full(n, -1, dtype=np.int64)
    first[local[::-1]] = np.arange(len(moe))[::-1]  # the first kernel of each instance
    cols["step"] = _step_numbers(steps, step[moe][first])
    cols["layer"] = number[moe][first]
    lo = np.full(n, np.iinfo(np.int64).max, dtype=np.int64)
    hi = np.full(n, np.iinfo(np.int64).min, dtype=np.int64)
    np.minimum.at(lo, local, s)
    np.maximum.at(hi, local, e)
    cols["start_ns"], cols["end_ns"] = lo, hi
    cols["kernels"] = np.bincount(local, minlength=n)
    cols["moe_ns"] = _group_lengths(s, e, local, n)
    for i, name in enumerate(MOE_STAGES):
        mine = st == i
        cols[f"{name}_ns"] = _group_lengths(s[mine], e[mine], local[mine], n)
    claimed = np.zeros(n, dtype=np.int64)
    for j, name in enumerate(MOE_STAGE_PRECEDENCE):
        upto = np.isin(st, [MOE_STAGES.index(p) for p in MOE_STAGE_PRECEDENCE[:j + 1]])
        now = _group_lengths(s[upto], e[upto], local[upto], n)
        cols[f"{name}_exclusive_ns"] = now - claimed
        claimed = now
    bucket = _lookup(act, "bucket_id", {b: 1 for b in MOE_BUCKETS}, 0)[moe] == 1
    precision = _lookup(act, "precision_id", {p: i for i, p in enumerate(PRECISIONS)},
                        PRECISIONS.index("unknown"))[moe]
    gemm = bucket & (st == MOE_STAGES.index("expert"))
    cols["expert_gemm_ns"] = _group_lengths(s[gemm], e[gemm], local[gemm], n)
    for i, p in enumerate(PRECISIONS):
        mine = gemm & (precision == i)
        cols[f"expert_{p}_ns"] = _group_lengths(s[mine], e[mine], local[mine], n)
    comm = act.kernel_is_comm[moe]
    compute = act.compute
    for name in COMM_STAGES:
        mine = comm & (st == MOE_STAGES.index(name))
        cols[f"{name}_comm_ns"] = _group_lengths(s[mine], e[mine], local[mine], n)
        exposed = np.zeros(n, dtype=np.int64)
        if mine.any():
            us, ue, g = iv.group_union(s[mine], e[mine], local[mine])
            hidden = iv.measure_within(compute, us, ue)
            exposed = np.bincount(g, weights=(ue - us) - hidden, minlength=n).astype(np.int64)[:n]
        cols[f"{name}_exposed_ns"] = exposed
        work = ~comm & (st == MOE_STAGES.index(name))
        cols["permute_ns" if name == "dispatch" else "unpermute_ns"] = _group_lengths(s[work], e[work], local[work], n)
    table = frame(cols, LAYER_COLUMNS).sort_values(["start_ns"], kind="stable").reset_index(drop=True)
    stream = k["stream"][moe].astype(np.int64)
    ep = comm & np.isin(st, [MOE_STAGES.index(c) for c in COMM_STAGES])
    return DeviceMoe(rank=act.rank, device=act.device, trace=str(act.trace.path), layer_source=source,
                     stage_sources=counts, layers=table, steps=len(steps),
                     comm_streams=[int(x) for x in np.unique(stream[ep])],
                     expert_streams=[int(x) for x in np.unique(stream[st == MOE_STAGES.index("expert")])],
                     kernel_stage=stage.astype(np.int8))


def _step_numbers(steps: pd.DataFrame, ordinal: np.ndarray) -> np.ndarray:
    """The ``step`` number of each step ordinal (-1 stays -1)."""
    if not len(steps) or "step" not in steps:
        return ordinal.astype(np.int64)
    numbers = array_of(steps, "step", np.int64)
    return np.where(ordinal >= 0, numbers[np.maximum(ordinal, 0)], -1)


IMBALANCE_COLUMNS = ["step_ordinal", "layer", "ranks", "hot_rank", "expert_max_ns", "expert_median_ns",
                     "expert_min_ns", "extra_ns", "dispatch_wait_ns", "combine_wait_ns"]


def moe_summary(devices: list[DeviceMoe], run_ranks: set[int] | None = None) -> MoeSummary | None:
    """The devices' MoE layers and the expert-load spread across the ranks (``run_ranks``: those of the first run;
    one device per rank, the first). Per (step ordinal, layer) present on ≥ 2 ranks: the rank with the most expert
    time (``hot_rank``), its excess over the median rank (``extra_ns``), and the other ranks' summed wait in
    dispatch and combine (each rank's comm time of the stage minus the least rank's: ``…_wait_ns``)."""
    if not devices:
        return None
    per_rank: dict[int, DeviceMoe] = {}
    for d in devices:
        if (run_ranks is None or d.rank in run_ranks) and d.rank not in per_rank:
            per_rank[d.rank] = d
    rows = []
    for rank, d in per_rank.items():
        t = d.layers
        if not len(t):
            continue
        ordinal = pd.factorize(t["step"], sort=True)[0]
        rows.append(pd.DataFrame({"rank": rank, "step_ordinal": ordinal, "layer": t["layer"].to_numpy(),
                                  "expert": t["expert_ns"].to_numpy(), "dispatch": t["dispatch_comm_ns"].to_numpy(),
                                  "combine": t["combine_comm_ns"].to_numpy()}))
    imbalance = pd.DataFrame(columns=IMBALANCE_COLUMNS)
    if len(rows) >= 2:
        # a layer number repeats in a step of a device without layers (-1) only once: key (ordinal, layer)
        long = pd.concat(rows, ignore_index=True).drop_duplicates(["rank", "step_ordinal", "layer"])
        out = []
        for (o, layer), g in long.groupby(["step_ordinal", "layer"], sort=True):
            if len(g) < 2:
                continue
            expert = g["expert"].to_numpy(np.int64)
            hot = int(np.argmax(expert))
            others = np.arange(len(g)) != hot
            waits = {s: int((g[s].to_numpy(np.int64)[others] - g[s].to_numpy(np.int64).min()).sum())
                     for s in COMM_STAGES}
            median = int(np.median(expert))
            out.append({"step_ordinal": int(o), "layer": int(layer), "ranks": len(g),
                        "hot_rank": int(g["rank"].to_numpy()[hot]), "expert_max_ns": int(expert[hot]),
                        "expert_median_ns": median, "expert_min_ns": int(expert.min()),
                        "extra_ns": int(expert[hot]) - median,
                        "dispatch_wait_ns": waits["dispatch"], "combine_wait_ns": waits["combine"]})
        if out:
            imbalance = pd.DataFrame(out, columns=IMBALANCE_COLUMNS)
    return MoeSummary(devices=devices, imbalance=imbalance, ranks=sorted(per_rank))
