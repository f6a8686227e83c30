"""Classifying N kernel rows costs about the same as classifying their unique names.

    python benchmarks/bench_classify.py [--rows 1000000] [--runs 3]

Names: the researched real names in ``tests/data/kernel_names_extra.csv`` (plus extra synthetic variants with
``--unique``). Each run starts with empty normalisation caches, so both timings include every regex.
Prints one JSON line per measurement.
"""

from __future__ import annotations

import argparse
import csv
import json
import time
from pathlib import Path

import numpy as np

from traceanalyzer.classify import classify_names, classify_trace
from traceanalyzer.classify.normalize import normalize_name
from traceanalyzer.model.trace import StringPool, Table, Trace

NAMES_CSV = Path(__file__).resolve().parents[1] / "tests" / "data" / "kernel_names_extra.csv"


def _names(unique: int) -> list[str]:
    real = [row["name"] for row in csv.DictReader(NAMES_CSV.open(encoding="utf-8"))]
    out = list(real)
    i = 0
    while len(out) < unique:  # template-argument variants, as distinct instantiations look in real traces
        out.append(f"{real[i % len(real)]}<{i}>")
        i += 1
    return out[:unique]


def _trace(names: list[str], rows: int, seed: int = 0) -> Trace:
    strings = StringPool(names)
    ids = np.random.default_rng(seed).integers(0, len(names), rows).astype(np.int32)
    starts = np.arange(rows, dtype=np.int64) * 1000
    kernels = Table.from_columns("kernels", rows, start_ns=starts, end_ns=starts + 500, device=0, name_id=ids)
    return Trace("bench", "kineto-json", strings, {"kernels": kernels})


def _best(fn, runs: int) -> float:
    times = []
    for _ in range(runs):
        normalize_name.cache_clear()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--unique", type=int, nargs="*", default=[240, 2000])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    for unique in args.unique:
        names = _names(unique)
        trace = _trace(names, args.rows)
        t_names = _best(lambda names=names: classify_names(names), args.runs)
        t_rows = _best(lambda trace=trace: classify_trace(trace), args.runs)
        print(json.dumps({"rows": args.rows, "unique_names": len(names), "classify_unique_names_s": round(t_names, 4),
                          "classify_trace_rows_s": round(t_rows, 4),
                          "per_row_overhead_ns": round((t_rows - t_names) / args.rows * 1e9, 1)}))


if __name__ == "__main__":
    main()
