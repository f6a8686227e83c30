"""Time the Kineto loader on a big trace: wall time and peak RSS, each run in a fresh process.

    python benchmarks/gen_kineto_big.py /tmp/big.json
    python benchmarks/bench_kineto.py /tmp/big.json [--runs 3] [--classify] [--baseline]

``--baseline`` also times plain ``json.loads`` of the same bytes (what dict-based loaders pay).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

_CHILD = r"""
import json, resource, sys, time
import traceanalyzer as ta
path, classify, baseline = sys.argv[1], sys.argv[2] == "1", sys.argv[3] == "1"
t0 = time.perf_counter()
if baseline:
    with open(path, "rb") as fh:
        n = len(json.loads(fh.read())["traceEvents"])
    out = {"events": n}
else:
    trace = ta.load(path, classify=classify)
    out = {"kernels": len(trace.kernels), "ranges": len(trace.ranges), "api_calls": len(trace.api_calls),
           "time_path": trace.capabilities.get("timestamp_conversion")}
out["wall_s"] = round(time.perf_counter() - t0, 3)
usage = resource.getrusage(resource.RUSAGE_SELF)
out["cpu_s"] = round(usage.ru_utime + usage.ru_stime, 3)  # includes interpreter start-up and imports
out["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
print(json.dumps(out))
"""


def run_once(path: Path, *, classify: bool, baseline: bool) -> dict[str, object]:
    """One measurement in a fresh interpreter (so peak RSS is this load's alone)."""
    done = subprocess.run([sys.executable, "-c", _CHILD, str(path), str(int(classify)), str(int(baseline))],
                          check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", type=Path)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--classify", action="store_true", help="time ta.load with classification too")
    parser.add_argument("--baseline", action="store_true", help="also time json.loads of the same file")
    opts = parser.parse_args(argv)
    size_mb = opts.trace.stat().st_size / 1e6
    results = [run_once(opts.trace, classify=opts.classify, baseline=False) for _ in range(opts.runs)]
    for r in results:
        print(f"ta.load  {size_mb:7.1f} MB  wall {r['wall_s']:6.2f} s  cpu {r['cpu_s']:6.2f} s  "
              f"peak RSS {r['peak_rss_mb']:7.1f} MB  {r}")
    best = min(float(r["wall_s"]) for r in results)  # type: ignore[arg-type]
    print(f"best of {opts.runs}: {best:.2f} s ({size_mb / best:.0f} MB/s)")
    if opts.baseline:
        r = run_once(opts.trace, classify=False, baseline=True)
        print(f"json.loads {size_mb:7.1f} MB  wall {r['wall_s']:6.2f} s  cpu {r['cpu_s']:6.2f} s  "
              f"peak RSS {r['peak_rss_mb']:7.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
