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


#: In display order (tables, charts, legends); unknown buckets sort after these.
BUCKET_TABLE: tuple[Bucket, ...] = (
    Bucket("moe_fp4_gemm", "#7b3fb5", 0, gemm=True),
    Bucket("moe_gemm", "#b07fe0", 1, gemm=True),
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

#: One colour per bucket, the same in every chart and in the terminal.
BUCKET_COLORS: dict[str, str] = {b.name: b.color for b in BUCKET_TABLE}
