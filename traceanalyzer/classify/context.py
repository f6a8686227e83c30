"""Optional context pass (decisions 3 and 6): re-bucket kernels from the ranges that launched them.

* cuBLAS/dense GEMMs launched inside an NVTX / user-annotation range named like an MoE block
  (``experts``, ``moe``) by an eager per-expert loop become ``moe_gemm`` — only in range instances
  that hold no grouped MoE kernel already (there the dense GEMM is the router or a shared expert), and never
  in a range named like a shared expert (``shared_experts``).
* NCCL ``SendRecv`` kernels under an ``all_to_all`` range get the sub-bucket ``all_to_all``.

A kernel is "inside" a range when its GPU start lies in a GPU-side annotation of its device
(Kineto ``gpu_user_annotation``), or when the host call that launched it (joined by correlation id)
lies in a CPU range of the same process and thread. Everything is vectorized; the only Python loop
is over devices / threads.
"""

from __future__ import annotations

import re

import numpy as np

from ..model.trace import Trace

#: A range of an MoE block: its name says MoE or experts and names no other part of a model (HF module classes carry
#: the family's name: ``Qwen2MoeAttention``, ``Qwen2MoeDecoderLayer`` are no MoE blocks, ``Qwen2MoeSparseMoeBlock``
#: and ``MixtralExperts`` are).
MOE_RANGE = re.compile(r"^(?!.*(attention|attn|decoder|model|norm|causal_?lm|embedding|rotary))(?=.*(expert|moe))",
                       re.IGNORECASE)
#: A shared expert's range: its dense GEMMs are no eager expert loop (they run beside the routed experts).
SHARED_EXPERT_RANGE = re.compile(r"shared_?experts?", re.IGNORECASE)
ALL_TO_ALL_RANGE = re.compile(r"all_?to_?all|alltoall", re.IGNORECASE)
_GPU_KINDS = ("gpu_user_annotation",)
#: Of the Python frames a profiler records (``with_stack``), only the modules name a part of the model: a frame
#: ``path.py(12): fn`` is named after its file and function (``modeling_qwen2_moe.py``, ``_must_dispatch_in_python``).
_MODULE_FRAME = re.compile(r"^nn\.Module: ")
_CPU_KINDS = ("nvtx", "user_annotation", "cpu_op", "python_function")


def _ids_matching(trace: Trace, ids: np.ndarray, pattern: re.Pattern[str]) -> np.ndarray:
    """Boolean mask of rows whose string id's text matches ``pattern`` (-1: none): each distinct id of the rows
    tested once (not the whole string pool), spread back by position."""
    if not len(ids):
        return np.zeros(0, dtype=bool)
    distinct, inverse = np.unique(ids, return_inverse=True)
    values = trace.strings.values
    hit = np.array([i >= 0 and bool(pattern.search(values[i])) for i in distinct.tolist()], dtype=bool)
    return hit[inverse.ravel()]


def _instances(points: np.ndarray, point_group: np.ndarray, starts: np.ndarray, ends: np.ndarray,
               range_group: np.ndarray) -> np.ndarray:
    """Id of the (merged) range instance containing each point of the same group, ``-1`` if none."""
    out = np.full(len(points), -1, dtype=np.int64)
    next_id = 0
    for g in np.unique(range_group):
        sel = range_group == g
        order = np.argsort(starts[sel], kind="stable")
        s, e = starts[sel][order], ends[sel][order]
        reach = np.maximum.accumulate(e)
        new = np.ones(len(s), dtype=bool)
        new[1:] = s[1:] >= reach[:-1]
        label = np.cumsum(new) - 1 + next_id
        next_id = int(label[-1]) + 1 if len(label) else next_id
        where = np.flatnonzero(point_group == g)
        t = points[where]
        idx = np.searchsorted(s, t, side="right") - 1
        ok = idx >= 0
        inside = np.zeros(len(t), dtype=bool)
        inside[ok] = t[ok] < reach[idx[ok]]
        out[where[inside]] = label[idx[inside]]
    return out


def _range_instance(trace: Trace, pattern: re.Pattern[str], rows: np.ndarray) -> np.ndarray:
    """For the kernels ``rows`` (indexes), the id of a matching range instance that contains each (``-1`` if none).
    Only ids of the same call compare: a GPU-side instance and a CPU one never share an id."""
    k, api = trace.kernels, trace.api_calls
    if len(rows) == 0 or len(trace.ranges) == 0:
        return np.full(len(rows), -1, dtype=np.int64)
    launch = np.full(len(rows), -1, dtype=np.int64)
    if len(api):
        correlation = k["correlation"][rows]
        row = launch_rows(api["pid"], api["correlation"], k["pid"][rows], correlation)
        launch = np.where(correlation >= 0, row, -1)
    return range_instances(trace, pattern, k["start_ns"][rows], k["device"][rows], launch)


def range_instances(trace: Trace, pattern: re.Pattern[str], gpu_start: np.ndarray, device: np.ndarray,
                    launch_row: np.ndarray) -> np.ndarray:
    """For kernels given by their GPU start, device and launching call (row of ``api_calls``, -1: none), the id
    of a range instance whose name matches ``pattern`` and that holds each (``-1`` if none): a GPU-side
    annotation of the device open at the kernel's start, else a CPU range of the launching thread open when the
    launch call started (of the Python frames, only ``nn.Module`` ones). Overlapping ranges of one device or thread
    are one instance."""
    r = trace.ranges
    result = np.full(len(gpu_start), -1, dtype=np.int64)
    if len(gpu_start) == 0 or len(r) == 0:
        return result
    named = _ids_matching(trace, r["name_id"], pattern) & (r["end_ns"] >= r["start_ns"])
    frames = _kind_in(trace, r["kind_id"], ("python_function",))
    if frames.any():
        named &= ~frames | _ids_matching(trace, r["name_id"], _MODULE_FRAME)
    gpu = named & _kind_in(trace, r["kind_id"], _GPU_KINDS) & (r["device"] >= 0)
    if gpu.any():
        result = _instances(np.asarray(gpu_start, dtype=np.int64), np.asarray(device).astype(np.int64),
                            r["start_ns"][gpu], r["end_ns"][gpu], r["device"][gpu].astype(np.int64))
    cpu = named & _kind_in(trace, r["kind_id"], _CPU_KINDS)
    api = trace.api_calls
    if cpu.any() and len(api):
        linked = launch_row >= 0
        row = np.maximum(launch_row, 0)
        # an unlinked kernel's group matches no thread (a thread key can be -1: pid 0, tid -1)
        launch_group = np.where(linked, _thread_of(api["pid"][row], api["tid"][row]), _NO_THREAD)
        cpu_ids = _instances(api["start_ns"][row], launch_group, r["start_ns"][cpu], r["end_ns"][cpu],
                             _thread_of(r["pid"][cpu], r["tid"][cpu]))
        offset = int(result.max()) + 1
        result = np.where((result < 0) & (cpu_ids >= 0) & linked, cpu_ids + offset, result)
    return result


def _kind_in(trace: Trace, kind_id: np.ndarray, kinds: tuple[str, ...]) -> np.ndarray:
    """Whether each row's kind (a string id) is one of ``kinds``: compared by id, no string per row."""
    return np.isin(kind_id, [i for i in map(trace.strings.get, kinds) if i >= 0])


def launch_rows(api_pid: np.ndarray, api_correlation: np.ndarray, pid: np.ndarray, correlation: np.ndarray,
                chunk: int = 1 << 20) -> np.ndarray:
    """For each (``pid``, ``correlation``), the first API row (in table order) of that process with that
    correlation id, ``-1`` if none. The API rows are read a ``chunk`` at a time against the sorted distinct keys
    asked for: no key, sort or index array as long as the API table."""
    wanted = pid.astype(np.int64) << 32 | (correlation.astype(np.int64) & 0xFFFFFFFF)
    keys, inverse = np.unique(wanted, return_inverse=True)
    first = np.full(len(keys), -1, dtype=np.int64)
    for lo in range(0, len(api_pid) if len(keys) else 0, chunk):
        # widened first: an nsys export's ids may be int32 (schema.NARROW_IDS)
        key = api_pid[lo:lo + chunk].astype(np.int64) << 32 | \
            (api_correlation[lo:lo + chunk].astype(np.int64) & 0xFFFFFFFF)
        pos = np.minimum(np.searchsorted(keys, key), len(keys) - 1)
        hit = np.flatnonzero(keys[pos] == key)
        at, head = np.unique(pos[hit], return_index=True)  # rows increase: the first of each key in the chunk
        new = first[at] < 0
        first[at[new]] = lo + hit[head[new]]
    return first[inverse.ravel()]


_NO_THREAD = np.iinfo(np.int64).min


def _thread_of(pid: np.ndarray, tid: np.ndarray) -> np.ndarray:
    """One int64 key per (process, thread)."""
    return pid.astype(np.int64) * 1_000_003 + tid.astype(np.int64)


def refine_with_context(trace: Trace) -> Trace:
    """Re-bucket eager-loop expert GEMMs to ``moe_gemm`` and all-to-all SendRecv from enclosing ranges.

    Needs a classified trace (``classify_trace``); rows it changes get rule ``context.moe_range`` or
    ``context.all_to_all_range``.
    """
    k = trace.kernels
    if "bucket_id" not in k or len(k) == 0:
        return trace
    strings = trace.strings
    changed: dict[str, np.ndarray] = {}  # the columns a move writes, copied on the first write

    def written(column: str) -> np.ndarray:
        if column not in changed:
            changed[column] = k[column].copy()
        return changed[column]

    bucket = k["bucket_id"]
    gemm, moe_ids = strings.get("gemm"), [strings.get(b) for b in ("moe_gemm", "moe_fp4_gemm")]
    # only the kernels a range can move: GEMMs and grouped MoE kernels, then SendRecv
    rows = np.flatnonzero((bucket == gemm) | np.isin(bucket, moe_ids)) if gemm >= 0 else np.empty(0, np.int64)
    inst = _range_instance(trace, MOE_RANGE, rows)
    if (inst >= 0).any():
        has_moe = np.zeros(int(inst.max()) + 1, dtype=bool)
        moe_rows = np.isin(bucket[rows], moe_ids) & (inst >= 0)
        has_moe[inst[moe_rows]] = True
        move = (bucket[rows] == gemm) & (inst >= 0)
        move[move] = ~has_moe[inst[move]]
        if move.any():
            move[move] = _range_instance(trace, SHARED_EXPERT_RANGE, rows[move]) < 0
        # the names interned as before, moves or not (the string pool stays as it was)
        ids = {c: strings.intern(v) for c, v in (("bucket_id", "moe_gemm"), ("subbucket_id", "eager_expert_gemm"),
                                                  ("rule_id", "context.moe_range"))}
        if move.any():
            for column, value in ids.items():
                written(column)[rows[move]] = value
    sub = changed.get("subbucket_id", k["subbucket_id"])
    sendrecv = strings.get("sendrecv")
    if sendrecv >= 0 and (sub == sendrecv).any():
        rows = np.flatnonzero(sub == sendrecv)
        a2a = rows[_range_instance(trace, ALL_TO_ALL_RANGE, rows) >= 0]
        ids = {"subbucket_id": strings.intern("all_to_all"), "rule_id": strings.intern("context.all_to_all_range")}
        if len(a2a):
            for column, value in ids.items():
                written(column)[a2a] = value
    return trace.with_table("kernels", k.with_columns(**changed)) if changed else trace
