"""Speed of the critical path and one replay against ``summary`` (issue 31; docs/METHOD_WHATIF_SIM.md).

    python benchmarks/bench_whatif.py kineto [--copies 1 2 8] [--runs 3]
    python benchmarks/bench_whatif.py ranks [--n 2 4 8 16] [--runs 3]

``kineto``: HTA's df_index_resolver trace replicated N× (``gen_kineto_big.py``; 8 copies are the 377 MB trace of
benchmarks/README.md). ``ranks``: the real 2-rank CUDA-graph decode replicated to N rank files (``gen_ranks.py``).
Per size: the summary (``pipeline.summary_run``, as the ``summary`` command runs it) and, on its result, the graph,
the traced replay with every step's critical path and one replay with ``--comm free`` (``simulate``); best of
``--runs``. Prints a Markdown table; the ratio is (graph + paths + replay) / summary.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _time(paths: list[str], runs: int) -> tuple[float, float, int, int]:
    from traceanalyzer.analysis.what_if.dep_graph import build_graph
    from traceanalyzer.analysis.what_if.simulate import Change, simulate
    from traceanalyzer.pipeline import summarize as pipeline

    best_s = best_w = float("inf")
    nodes = edges = 0
    for _ in range(runs):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t0 = time.perf_counter()
            run = pipeline.summary_run(paths)
            t1 = time.perf_counter()
            graph = build_graph(run.traces, run.summary.devices, run.summary.cross_rank,
                                {key: state.activity for key, state in run.summary.states.items()})
            simulate(graph, [Change("comm", "free")])
            t2 = time.perf_counter()
        best_s, best_w = min(best_s, t1 - t0), min(best_w, t2 - t1)
        nodes, edges = len(graph), len(graph.src)
    return best_s, best_w, nodes, edges


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["kineto", "ranks"])
    parser.add_argument("--copies", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--n", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    print("| input | nodes | edges | summary s | graph + paths + one replay s | ratio |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        if args.mode == "kineto":
            import gen_kineto_big

            for copies in args.copies:
                out = Path(tmp) / f"kineto_x{copies}.json"
                gen_kineto_big.main([str(out), "--copies", str(copies)])
                s, w, n, e = _time([str(out)], args.runs)
                print(f"| Kineto × {copies} ({out.stat().st_size / 1e6:.0f} MB) | {n} | {e} | {s:.2f} | {w:.2f} | "
                      f"{w / s:.2f} |")
                out.unlink()
        else:
            import gen_ranks

            for n_ranks in args.n:
                files = gen_ranks.replicate(Path(tmp) / f"r{n_ranks}", n_ranks)
                s, w, n, e = _time([str(f) for f in files], args.runs)
                print(f"| {n_ranks} ranks | {n} | {e} | {s:.2f} | {w:.2f} | {w / s:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
