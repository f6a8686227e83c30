"""A diff costs no more than the two summaries: ``ta.diff(before, after)`` against ``ta.summary(before)`` +
``ta.summary(after)``, best of ``--runs`` (wall and CPU time, this process plus its helpers), interleaved round
by round, in one process.

``TRACEANALYZER_DECODE_PROCESSES`` (``1``: never, ``2``: always) governs the Kineto loader's decode helper in both
timings alike.

    python benchmarks/bench_diff.py [--runs 3] [BEFORE AFTER]

Without arguments it times the fixture pairs and, when ``../shared/data`` is there, the real pairs of
docs/DIFF.md. Prints one JSON line per pair.
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from collections.abc import Callable
from pathlib import Path

import traceanalyzer as ta
from traceanalyzer.commands.diff import diff

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


def _cost(fn: Callable[[], object]) -> tuple[float, float]:
    """(wall s, CPU s of this process and its waited-for children) of one call."""
    def cpu() -> float:
        own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime

    wall, used = time.perf_counter(), cpu()
    fn()
    return time.perf_counter() - wall, cpu() - used


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", type=Path)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    pairs = [("given", [args.paths[0]], [args.paths[1]])] if len(args.paths) == 2 else _pairs()
    for name, before, after in pairs:
        both: list[tuple[float, float]] = []
        diffed: list[tuple[float, float]] = []
        for _ in range(args.runs):  # interleaved, so drift of the machine hits both alike
            both.append(_cost(lambda b=before, a=after: (ta.summary(b), ta.summary(a))))
            diffed.append(_cost(lambda b=before, a=after: diff(b, a)))
        sw, sc = min(w for w, _ in both), min(c for _, c in both)
        dw, dc = min(w for w, _ in diffed), min(c for _, c in diffed)
        print(json.dumps({"pair": name, "summaries_wall_s": round(sw, 3), "diff_wall_s": round(dw, 3),
                          "wall_ratio": round(dw / sw, 3), "summaries_cpu_s": round(sc, 3),
                          "diff_cpu_s": round(dc, 3), "cpu_ratio": round(dc / sc, 3)}))


if __name__ == "__main__":
    main()
