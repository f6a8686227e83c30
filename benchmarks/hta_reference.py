"""Reference numbers and timings from HolisticTraceAnalysis itself (run inside HTA's own venv).

Usage (HTA 0.5.0 in its own venv, outside the repo):

    python3 -m venv /work/hta-venv
    /work/hta-venv/bin/pip install HolisticTraceAnalysis==0.5.0 "pandas==2.2.*" "numpy<2.3"
    /work/hta-venv/bin/python benchmarks/hta_reference.py TRACE_OR_DIR...        # one set of rank files
    /work/hta-venv/bin/python benchmarks/hta_reference.py --hta-test-data DIR    # every set under HTA's tests/data

Prints JSON: per rank ``kernel_us, idle_us, compute_us, non_compute_us, overlap_pct`` (HTA's own columns
``kernel_time(us)``, ``idle_time(us)``, ... and ``comp_comm_overlap_pctg``), plus wall times of the three
calls (TraceAnalysis construction, get_temporal_breakdown, get_comm_comp_overlap) and this process's peak RSS.
This file imports only HTA, pandas and the standard library, never traceanalyzer.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import resource
import sys
import time
import warnings
from pathlib import Path
from typing import Any

# The sets of HTA's tests/data: name -> files relative to tests/data (ranks are read from the files by HTA).
HTA_TEST_SETS: dict[str, list[str]] = {
    "trace_filter": ["trace_filter/sampled_rank-0.json.gz", "trace_filter/sampled_rank-1.json.gz"],
    "trace_diff_control": ["trace_diff/control/control.json.gz"],
    "trace_diff_test": ["trace_diff/test/test.json.gz"],
    "df_index_resolver": ["df_index_resolver/df_index_resolver.json.gz"],
    "nccl_parser_config": ["nccl_parser_config/nccl_data.json.gz"],
    "negative_queue_length_values_check": ["negative_queue_length_values_check/rank0.json.gz"],
    "ns_resolution_trace": ["ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"],
    "amd_trace": ["amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz"],
    "critical_path_alexnet": ["critical_path/alexnet/benchmark_result_2869224_1695835535_trace.json.gz"],
    "critical_path_simple_add": ["critical_path/simple_add/benchmark_result_493459_1694039959_trace.json.gz"],
    "critical_path_event_sync": ["critical_path/cuda_event_sync_multi_stream/event_sync_trace.json.gz"],
}


def _files(paths: list[str]) -> list[str]:
    out: list[str] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            out += sorted(str(q) for q in p.iterdir() if q.name.endswith((".json", ".json.gz")))
        else:
            out.append(str(p))
    return out


def _num(x: Any) -> float | int | None:
    """JSON-safe number (NaN -> None, numpy scalars -> Python)."""
    v = float(x)
    if math.isnan(v):
        return None
    return int(v) if v.is_integer() else v


def run_hta(paths: list[str]) -> dict[str, Any]:
    """Run HTA's temporal breakdown and comm/comp overlap on one set of rank files."""
    from hta.common.trace_file import create_rank_to_trace_dict
    from hta.trace_analysis import TraceAnalysis

    files = _files(paths)
    ok, rank_files = create_rank_to_trace_dict(files)
    if not ok:
        raise SystemExit(f"HTA could not map ranks to files: {files}")
    t0 = time.perf_counter()
    analysis = TraceAnalysis(trace_files=rank_files)
    t1 = time.perf_counter()
    breakdown = analysis.get_temporal_breakdown(visualize=False)
    t2 = time.perf_counter()
    overlap = analysis.get_comm_comp_overlap(visualize=False)
    t3 = time.perf_counter()
    overlap_by_rank = {int(r): v for r, v in zip(overlap["rank"], overlap["comp_comm_overlap_pctg"], strict=True)}
    ranks = []
    for row in breakdown.to_dict("records"):
        rank = int(row["rank"])
        ranks.append({
            "rank": rank,
            "file": Path(rank_files[rank]).name,
            "kernel_us": _num(row["kernel_time(us)"]),
            "idle_us": _num(row["idle_time(us)"]),
            "compute_us": _num(row["compute_time(us)"]),
            "non_compute_us": _num(row["non_compute_time(us)"]),
            "idle_pct": _num(row["idle_time_pctg"]),
            "compute_pct": _num(row["compute_time_pctg"]),
            "overlap_pct": _num(overlap_by_rank.get(rank, float("nan"))),
        })
    return {
        "ranks": ranks,
        "seconds": {"load": round(t1 - t0, 3), "temporal_breakdown": round(t2 - t1, 3),
                    "comm_comp_overlap": round(t3 - t2, 3), "total": round(t3 - t0, 3)},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", nargs="*", help="rank trace files or a directory of them (one set)")
    parser.add_argument("--hta-test-data", type=Path, help="HTA's tests/data folder: run every known set")
    parser.add_argument("-o", "--output", type=Path, help="write the JSON here instead of stdout")
    args = parser.parse_args(argv)
    logging.disable(logging.WARNING)  # HTA logs a warning per parsed file
    warnings.simplefilter("ignore", FutureWarning)  # pandas 2.2 deprecations inside HTA
    warnings.simplefilter("ignore", RuntimeWarning)  # 0/0 overlap of ranks without NCCL kernels (NaN)
    import hta
    import pandas as pd

    env = {"hta_version": getattr(hta, "__version__", None) or _dist_version("HolisticTraceAnalysis"),
           "pandas": pd.__version__, "python": sys.version.split()[0]}
    if args.hta_test_data:
        payload: dict[str, Any] = {"made_by": env, "sets": {}}
        for name, rel in HTA_TEST_SETS.items():
            files = [str(args.hta_test_data / r) for r in rel]
            if all(Path(f).exists() for f in files):
                payload["sets"][name] = {"files": rel, **run_hta(files)}
    elif args.traces:
        payload = {"made_by": env, **run_hta(args.traces)}
    else:
        parser.error("give trace files or --hta-test-data")
    payload["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    text = json.dumps(payload, indent=2)
    if args.output:
        args.output.write_text(text + "\n")
    else:
        print(text)
    return 0


def _dist_version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


if __name__ == "__main__":
    sys.exit(main())
