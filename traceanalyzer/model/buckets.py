"""The bucket vocabulary, declared once: names, display order, exclusive precedence and colours.

Every other module (classification rules, the per-device exclusive split, renderers, CLI help) reads these; see
docs/CLASSIFY.md for what each bucket holds.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Bucket:
    """One kernel bucket: its name, display colour, place in the exclusive split (0 claims first) and whether its
    kernels are matrix multiplies."""

    name: str
    color: str
    precedence: int
    gemm: bool = False
    moe: bool = False  # expert GEMMs of MoE layers


#: In display order (tables, charts, legends); unknown buckets sort after these.
BUCKET_TABLE: tuple[Bucket, ...] = (
    Bucket("moe_fp4_gemm", "#7b3fb5", 0, gemm=True, moe=True),
    Bucket("moe_gemm", "#b07fe0", 1, gemm=True, moe=True),
    Bucket("gemm", "#2f6fbf", 2, gemm=True),
    Bucket("attention", "#2a9d8f", 3),
    Bucket("communication", "#e4572e", 6),
    Bucket("memory", "#e9c46a", 5),
    Bucket("other", "#9aa5b1", 4),
)

#: Bucket names in display order; a rule's ``bucket`` must be one of these.
BUCKETS: tuple[str, ...] = tuple(b.name for b in BUCKET_TABLE)

#: Order used to split busy time into exclusive bucket time (parts add up to busy): where kernels of
#: several buckets overlap, the earliest bucket here gets the time. Compute first; communication last,
#: so that communication counts only when nothing else runs (its exclusive time = exposed comm).
EXCLUSIVE_PRECEDENCE: tuple[str, ...] = tuple(b.name for b in sorted(BUCKET_TABLE, key=lambda b: b.precedence))

#: The buckets of matrix multiplies (dense and MoE).
GEMM_BUCKETS: tuple[str, ...] = tuple(b.name for b in BUCKET_TABLE if b.gemm)

#: The buckets of MoE expert GEMMs (their kernels are the ``expert`` stage of an MoE layer unless a rule says).
MOE_BUCKETS: tuple[str, ...] = tuple(b.name for b in BUCKET_TABLE if b.moe)

#: One colour per bucket, the same in every chart and in the terminal.
BUCKET_COLORS: dict[str, str] = {b.name: b.color for b in BUCKET_TABLE}


@dataclass(frozen=True)
class MoeStage:
    """One part of an MoE layer's time (docs/MOE.md): its name, display colour and place in the layer's exclusive
    split (0 claims first)."""

    name: str
    color: str
    precedence: int


#: The parts of an MoE layer, in display order (the order a layer's work runs in). A rule's ``moe_stage`` must be
#: one of these. Expert and shared-expert GEMMs claim overlapped time first, communication (dispatch, combine)
#: last, so the exclusive dispatch / combine time of a layer is the part no other MoE work hides.
MOE_STAGE_TABLE: tuple[MoeStage, ...] = (
    MoeStage("router", "#f4a261", 2),
    MoeStage("dispatch", "#2a9d8f", 4),
    MoeStage("expert", "#7b3fb5", 0),
    MoeStage("shared_expert", "#2f6fbf", 1),
    MoeStage("combine", "#e76f51", 5),
    MoeStage("moe_other", "#9aa5b1", 3),
)

#: MoE stage names in display order.
MOE_STAGES: tuple[str, ...] = tuple(s.name for s in MOE_STAGE_TABLE)

#: Order in which a layer's stages claim time where their kernels overlap (the exclusive split adds up to the
#: layer's MoE time).
MOE_STAGE_PRECEDENCE: tuple[str, ...] = tuple(s.name for s in sorted(MOE_STAGE_TABLE, key=lambda s: s.precedence))

#: One colour per MoE stage (terminal and charts).
MOE_STAGE_COLORS: dict[str, str] = {s.name: s.color for s in MOE_STAGE_TABLE}
