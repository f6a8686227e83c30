"""Rank files for scale benchmarks and tests: real ranks replicated, one-kernel ranks, many kernel names.

    python benchmarks/gen_ranks.py replicate OUT_DIR N [--source DIR/decode_serial_graphs]
    python benchmarks/gen_ranks.py tiny OUT_DIR N

``replicate``: rank ``r`` is source rank ``r % len(sources)`` with ``distributedInfo.rank`` = r and ``world_size``
(and the default process group) = N; everything else (times, ids) is unchanged, so every copy of a source rank
has the same collectives, as ranks of one job do. ``tiny``: N Kineto files of one kernel (an all-reduce) each.
Outputs go to ``OUT_DIR`` (use /tmp; never commit them).
"""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path

DEFAULT_SOURCE = Path(__file__).resolve().parents[2] / "shared" / "data" / "h200" / "kineto" / \
    "decode_serial_graphs"


def replicate(out: Path, n: int, source: Path = DEFAULT_SOURCE) -> list[Path]:
    """``n`` rank files in ``out`` made from ``source``_rank*.json.gz (see the module doc)."""
    sources = sorted(source.parent.glob(f"{source.name}_rank*.json.gz"))
    if not sources:
        raise FileNotFoundError(f"no {source}_rank*.json.gz")
    return replicate_files(out, n, sources)


def replicate_files(out: Path, n: int, sources: list[Path]) -> list[Path]:
    """``n`` rank files in ``out`` made from the rank files ``sources`` (gzipped Kineto JSON, in rank order)."""
    heads: list[tuple[dict, bytes]] = []
    for src in sources:
        doc = json.loads(gzip.decompress(src.read_bytes()))
        events = json.dumps(doc.pop("traceEvents")).encode()
        heads.append((doc, events))
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for r in range(n):
        doc, events = heads[r % len(heads)]
        info = dict(doc.get("distributedInfo") or {})
        info.update(rank=r, world_size=n)
        if info.get("pg_config"):
            info["pg_config"] = [dict(info["pg_config"][0], pg_size=n, ranks=list(range(n)))]
        head = json.dumps({**doc, "distributedInfo": info}).encode()
        path = out / f"rank{r:05d}.json"
        path.write_bytes(head[:-1] + b', "traceEvents": ' + events + b"}")
        paths.append(path)
    return paths


def tiny(out: Path, n: int) -> list[Path]:
    """``n`` one-kernel Kineto rank files: an all-reduce of 100 µs, rank ``r`` starting ``r`` µs late."""
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for r in range(n):
        doc = {
            "schemaVersion": 1,
            "deviceProperties": [{"id": 0, "name": "NVIDIA H200", "numSms": 132}],
            "distributedInfo": {"backend": "nccl", "rank": r, "world_size": n},
            "traceEvents": [
                {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "pid": 0,
                 "tid": 7, "ts": 1000.0 + r, "dur": 100.0 - r % 50,
                 "args": {"device": 0, "stream": 7, "correlation": 1, "External id": 1}},
            ],
        }
        path = out / f"rank{r:05d}.json"
        path.write_text(json.dumps(doc))
        paths.append(path)
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["replicate", "tiny"])
    parser.add_argument("out", type=Path)
    parser.add_argument("n", type=int)
    parser.add_argument("--source", type=Path, default=DEFAULT_SOURCE)
    args = parser.parse_args()
    paths = replicate(args.out, args.n, args.source) if args.what == "replicate" else tiny(args.out, args.n)
    print(f"{len(paths)} files in {args.out}")


if __name__ == "__main__":
    main()
