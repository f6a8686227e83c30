"""Classification and demangling time of crafted kernel names against their length (issue 30).

    python benchmarks/bench_hostile_names.py [--lengths 1000,10000,100000,1000000] [--runs 3] [--target-ms 10]

The shapes are the hostile-name shapes of ``tests/test_hostile_names.py`` (runs of spaces and dots, tabs and
ellipses, templates, DeepGEMM-like and MoE-like names, ROCm clone suffixes, repeated rule literals) plus a
demangling bomb. Each measurement starts with an empty normalisation cache; the best of ``--runs`` is kept.
Prints one JSON line per (shape, length): milliseconds for one name, then exits 1 when a name took longer than
``--target-ms`` (the goal of issue 30: 10 ms per name at any length).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from test_hostile_names import SHAPES, doubling_symbol

from traceanalyzer.classify.engine import classify_one
from traceanalyzer.classify.normalize import normalize_name
from traceanalyzer.classify.rules import rule_set


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lengths", default="1000,10000,100000,1000000")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--target-ms", type=float, default=10.0)
    args = parser.parse_args()
    over: list[str] = []
    rules = rule_set(None)
    shapes = {**SHAPES, "demangling_bomb": lambda n: doubling_symbol(max(n // 12, 1))}
    for shape, make in shapes.items():
        for n in (int(x) for x in args.lengths.split(",")):
            name = make(n)
            best = float("inf")
            for _ in range(args.runs):
                normalize_name.cache_clear()
                start = time.perf_counter()
                classify_one(name, rules)
                best = min(best, time.perf_counter() - start)
            print(json.dumps({"shape": shape, "chars": len(name), "ms": round(best * 1e3, 2)}), flush=True)
            if best * 1e3 > args.target_ms:
                over.append(f"{shape} at {len(name):,} characters: {best * 1e3:.1f} ms")
    if over:
        sys.exit(f"over the {args.target_ms:g} ms target: " + "; ".join(over))


if __name__ == "__main__":
    main()
