"""Scale benchmarks (issues 14 and 16): cost against the number of ranks, many tiny rank files, many kernel names.

    python benchmarks/bench_scale.py ranks --n 16 64 256 [--rounds 2]   # real 2-rank decode replicated
    python benchmarks/bench_scale.py tiny --n 1000 10000                # one-kernel rank files
    python benchmarks/bench_scale.py names --n 200000                   # distinct kernel names, `classify`

Inputs are generated once into ``--workdir`` (default /tmp/ta-scale; never commit them) by ``gen_ranks.py``.
Each measurement is ``traceanalyzer summary -j 2 --json DIR`` (``classify --json FILE`` for names) run as a child:
wall time around it, CPU time and peak RSS from ``os.wait4``. Rounds interleave the sizes, so a neighbour's load
on the shared machine hits every size alike; the table reports every round.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_classify import _names
from gen_ranks import replicate, tiny
from run_bench import measure_once

TA = str(Path(sys.executable).with_name("traceanalyzer"))


def _inputs(what: str, sizes: list[int], workdir: Path) -> dict[int, Path]:
    out = {}
    for n in sizes:
        path = workdir / f"{what}{n}"
        if what == "names":
            path = path.with_suffix(".txt")
            if not path.is_file():
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text("\n".join(_names(n)) + "\n", encoding="utf-8")
        elif not (path / "done").is_file():
            (replicate if what == "ranks" else tiny)(path, n)
            (path / "done").write_text("")
        out[n] = path
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["ranks", "tiny", "names"])
    parser.add_argument("--n", type=int, nargs="+", required=True)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/ta-scale"))
    parser.add_argument("--json", type=Path, help="write the results here too")
    args = parser.parse_args()
    inputs = _inputs(args.what, args.n, args.workdir)
    results: dict[int, list[dict[str, float]]] = {n: [] for n in args.n}
    for _ in range(args.rounds):
        for n, path in inputs.items():
            cmd = [TA, "classify", str(path), "--json"] if args.what == "names" else \
                [TA, "summary", "-j", str(args.jobs), "--json", str(path)]
            run = measure_once(f"{args.what} {n}", cmd)
            if run.returncode != 0:
                return 1
            results[n].append({"wall_s": run.wall_s, "cpu_s": run.cpu_s, "peak_rss_mb": run.peak_rss_mb})
    print(f"| {args.what} | wall s | CPU s | peak RSS MB |\n|---|---|---|---|")
    for n, runs in results.items():
        cells = [", ".join(f"{r[k]:g}" for r in runs) for k in ("wall_s", "cpu_s", "peak_rss_mb")]
        print(f"| {n:,} | " + " | ".join(cells) + " |")
    if args.json:
        args.json.write_text(json.dumps({"what": args.what, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
