"""A diff costs no more than the two summaries: wall time of ``ta.diff(before, after)`` against
``ta.summary(before)`` + ``ta.summary(after)``, best of ``--runs``, in one process (caches warm after run 1).

    python benchmarks/bench_diff.py [--runs 3] [BEFORE AFTER]

Without arguments it times the fixture pairs and, when ``../shared/data`` is there, the real pairs of
docs/DIFF.md. Prints one JSON line per pair.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import traceanalyzer as ta
from traceanalyzer.diff import diff

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data"
K = SHARED / "h200" / "kineto"


def _pairs() -> list[tuple[str, list[Path], list[Path]]]:
    fix = REPO / "fixtures"
    pairs = [("self", [fix / "kineto/tp2_prefill_serial"], [fix / "kineto/tp2_prefill_serial"]),
             ("nsys_vs_kineto", [fix / "nsys/tp2_prefill_serial.sqlite"], [fix / "kineto/tp2_prefill_serial"]),
             ("ab_decode_nocomm", [fix / "kineto/ab/tp2_decode_eager_c"],
              [fix / "kineto/ab/tp2_decode_eager_c_nocomm"])]
    if SHARED.is_dir():
        ranks = [[K / f"{run}_rank{r}.json.gz" for r in (0, 1)]
                 for run in ("nop2p_prefill_serial", "prefill_serial", "prefill_overlap")]
        nsys = SHARED / "nsys-public"
        hta = SHARED / "hta/tests/data/trace_diff"
        pairs += [("nop2p_vs_nvlink", ranks[0], ranks[1]), ("serial_vs_overlap", ranks[1], ranks[2]),
                  ("nsysai_mfu", [nsys / "nsysai_mfu_2xh100_before_2026.2.1.sqlite"],
                   [nsys / "nsysai_mfu_2xh100_after_2026.2.1.sqlite"]),
                  ("hta_control_vs_test", [hta / "control"], [hta / "test"])]
    return pairs


def _best(fn, runs: int) -> float:  # type: ignore[no-untyped-def]
    best = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", type=Path)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    pairs = [("given", [args.paths[0]], [args.paths[1]])] if len(args.paths) == 2 else _pairs()
    for name, before, after in pairs:
        summaries = _best(lambda b=before, a=after: (ta.summary(b), ta.summary(a)), args.runs)
        diffed = _best(lambda b=before, a=after: diff(b, a), args.runs)
        print(json.dumps({"pair": name, "summary_before_plus_after_s": round(summaries, 3),
                          "diff_s": round(diffed, 3), "ratio": round(diffed / summaries, 3)}))


if __name__ == "__main__":
    main()
