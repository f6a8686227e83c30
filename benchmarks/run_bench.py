"""Side-by-side benchmark (issue 7): traceanalyzer vs HolisticTraceAnalysis 0.5.0, nsys vs a plain sqlite3 floor,
and cost growth with trace size. Every measured command runs as its own child process; wall time is taken around
it and peak RSS from ``os.wait4`` (that child's own ``ru_maxrss``).

    .venv/bin/python benchmarks/run_bench.py                  # full run (~379 MB Kineto trace, HTA takes ~1 min)
    .venv/bin/python benchmarks/run_bench.py --quick          # 1× Kineto data, growth 1×/2×, nsys included
    .venv/bin/python benchmarks/run_bench.py --only kineto,growth --json /tmp/bench.json

HTA runs in its own venv (``--hta-python``, default /work/hta-venv/bin/python; see benchmarks/hta_reference.py).
Large generated inputs go to ``--workdir`` (default /tmp/ta-bench) and are reused; never commit them.
"""

from __future__ import annotations

import argparse
import json
import lzma
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SHARED = HERE.parents[1] / "shared" / "data"
NSYS_XZ = SHARED / "h200" / "nsys" / "tp2_decode_eager_gpumetrics.sqlite.xz"
GENERATOR = HERE / "gen_kineto_big.py"
TA = [sys.executable, "-m", "traceanalyzer.cli"]
TARGET_SPEEDUP, TARGET_MEMORY, TARGET_NSYS = 12.0, 0.4, 2.0

# The floor for the nsys export: fetch kernel columns with their names and every GPU_METRICS sample into numpy.
NSYS_FLOOR = r"""
import sqlite3, sys
import numpy as np
con = sqlite3.connect(f"file:{sys.argv[1]}?mode=ro", uri=True)
rows = con.execute(
    "SELECT k.start, k.end, k.deviceId, k.streamId, k.correlationId, k.globalPid, d.value, s.value "
    "FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds d ON d.id = k.demangledName "
    "JOIN StringIds s ON s.id = k.shortName").fetchall()
cols = list(zip(*rows))
kernels = {n: np.array(c, dtype=np.int64) for n, c in zip(("start", "end", "device", "stream", "corr", "gpid"), cols)}
names = np.array(cols[6], dtype=object)
n = con.execute("SELECT count(*) FROM GPU_METRICS").fetchone()[0]
metrics = np.fromiter(con.execute("SELECT timestamp, typeId, metricId, value FROM GPU_METRICS"),
                      dtype=[("t", "i8"), ("type", "i8"), ("metric", "i8"), ("value", "f8")], count=n)
metric_names = dict(con.execute("SELECT metricId, metricName FROM TARGET_INFO_GPU_METRICS"))
print(len(kernels["start"]), len(names), len(metrics), len(metric_names))
"""


@dataclass
class Run:
    """One child process: what ran, how long, how much memory, and its stdout."""

    label: str
    wall_s: float
    cpu_s: float
    peak_rss_mb: float
    returncode: int
    stdout: str
    stderr_tail: str


REPEAT = 1  # set from --repeat: each command runs this many times, the fastest run is kept


def _best(runs: list[Run]) -> Run:
    return min(runs, key=lambda r: (r.returncode != 0, r.wall_s))


def measure(label: str, cmd: list[str]) -> Run:
    """Best (lowest wall time) of ``REPEAT`` runs of :func:`measure_once`."""
    return _best([measure_once(label, cmd) for _ in range(REPEAT)])


def measure_once(label: str, cmd: list[str], *, cwd: Path | None = None) -> Run:
    """Run ``cmd`` as a child; wall time around it; CPU time (user + system) and peak RSS from ``wait4``."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, cwd=cwd)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        cpu = usage.ru_utime + usage.ru_stime
        run = Run(label, round(wall, 2), round(cpu, 2), round(usage.ru_maxrss / 1024, 1), proc.returncode,
                  out.read().decode(errors="replace"), err.read().decode(errors="replace")[-2000:])
    print(f"  {label:<44} {run.wall_s:8.2f} s wall {run.cpu_s:8.2f} s CPU {run.peak_rss_mb:9.1f} MB"
          + ("" if run.returncode == 0 else f"   exit {run.returncode}: {run.stderr_tail.strip()[-300:]}"),
          flush=True)
    return run


def kineto_input(workdir: Path, copies: int) -> Path:
    """The df_index_resolver trace replicated ``copies`` times (generated once, then reused)."""
    path = workdir / f"kineto_x{copies}.json"
    if not path.exists():
        if not GENERATOR.exists():
            raise SystemExit(f"{GENERATOR} is missing: it makes the replicated Kineto trace")
        subprocess.run([sys.executable, str(GENERATOR), str(path), "--copies", str(copies)], check=True)
    return path


def nsys_input(workdir: Path) -> Path:
    """The 225 MB nsys export, unpacked once into ``workdir``."""
    path = workdir / NSYS_XZ.name.removesuffix(".xz")
    if not path.exists():
        tmp = path.with_suffix(".part")
        with lzma.open(NSYS_XZ) as src, open(tmp, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        tmp.rename(path)
    return path


def _json_out(run: Run) -> Any:
    try:
        return json.loads(run.stdout)
    except json.JSONDecodeError:
        return None


def _compare_hta(ours: Any, theirs: Any) -> list[str]:
    """Per-rank differences between ``--hta-compat`` and HTA (empty when identical)."""
    if not ours or not theirs:
        return ["missing output"]
    diffs = []
    for a, b in zip(ours["ranks"], theirs["ranks"], strict=False):
        for key in ("rank", "kernel_us", "idle_us", "compute_us", "non_compute_us", "overlap_pct"):
            if a.get(key) != b.get(key):
                diffs.append(f"rank {b.get('rank')} {key}: ours {a.get(key)} vs HTA {b.get(key)}")
    return diffs


def bench_kineto(path: Path, hta_python: Path | None) -> dict[str, Any]:
    """traceanalyzer summary (default and --hta-compat) vs HTA's TraceAnalysis + breakdown + overlap.

    The three commands run in turn, ``REPEAT`` rounds: a drift of the machine's speed hits all of them alike.
    Reported: the best run of each, and per round the paired speed-up (HTA wall / ours, same round)."""
    size_mb = path.stat().st_size / 1e6
    print(f"\n[kineto] {path.name}: {size_mb:.0f} MB", flush=True)
    commands = {"summary": ("traceanalyzer summary --json", [*TA, "summary", "--json", str(path)]),
                "hta_compat": ("traceanalyzer summary --hta-compat --json",
                               [*TA, "summary", "--hta-compat", "--json", str(path)])}
    if hta_python is not None:
        commands["hta"] = ("HTA 0.5.0 TraceAnalysis+breakdown+overlap",
                           [str(hta_python), str(HERE / "hta_reference.py"), str(path)])
    rounds = [{key: measure_once(label, cmd) for key, (label, cmd) in commands.items()} for _ in range(REPEAT)]
    best = {key: _best([r[key] for r in rounds]) for key in commands}
    ours, compat = best["summary"], best["hta_compat"]
    result: dict[str, Any] = {"input": str(path), "size_mb": round(size_mb, 1), "ours": asdict(ours) | {"stdout": ""},
                              "ours_hta_compat": asdict(compat) | {"stdout": ""},
                              "rounds": [{key: {"wall_s": run.wall_s, "cpu_s": run.cpu_s} for key, run in r.items()}
                                         for r in rounds]}
    if hta_python is not None:
        hta = best["hta"]
        result["hta"] = asdict(hta) | {"stdout": ""}
        result["hta_numbers"] = _json_out(hta)
        result["hta_compat_numbers"] = _json_out(compat)
        result["hta_compat_diffs"] = _compare_hta(_json_out(compat), _json_out(hta))
        for key, run in (("summary", ours), ("hta_compat", compat)):
            if run.returncode == 0 and hta.returncode == 0:
                result[f"speedup_{key}"] = round(hta.wall_s / run.wall_s, 1)
                result[f"cpu_speedup_{key}"] = round(hta.cpu_s / run.cpu_s, 1)
                result[f"memory_ratio_{key}"] = round(run.peak_rss_mb / hta.peak_rss_mb, 2)
                paired = [r["hta"].wall_s / r[key].wall_s for r in rounds]
                result[f"paired_speedups_{key}"] = [round(x, 1) for x in paired]
        print(f"  speedup vs HTA, best vs best (wall / CPU): summary {result.get('speedup_summary')}× / "
              f"{result.get('cpu_speedup_summary')}×, --hta-compat {result.get('speedup_hta_compat')}× / "
              f"{result.get('cpu_speedup_hta_compat')}× (target ≥ {TARGET_SPEEDUP:g}×); per round (wall): summary "
              f"{result.get('paired_speedups_summary')}, --hta-compat {result.get('paired_speedups_hta_compat')}; "
              f"memory ratio: summary {result.get('memory_ratio_summary')}, --hta-compat "
              f"{result.get('memory_ratio_hta_compat')} (target ≤ {TARGET_MEMORY:g}); --hta-compat vs HTA numbers: "
              f"{'identical' if not result['hta_compat_diffs'] else result['hta_compat_diffs']}")
    return result


def bench_nsys(path: Path) -> dict[str, Any]:
    """traceanalyzer summary on the 225 MB nsys export vs the plain sqlite3 → numpy floor."""
    print(f"\n[nsys] {path.name}: {path.stat().st_size / 1e6:.0f} MB", flush=True)
    floor = measure("floor: sqlite3 kernels+names+GPU_METRICS", [sys.executable, "-c", NSYS_FLOOR, str(path)])
    ours = measure("traceanalyzer summary --json", [*TA, "summary", "--json", str(path)])
    ok = floor.returncode == 0 and ours.returncode == 0
    ratio = round(ours.wall_s / floor.wall_s, 2) if ok else None
    cpu_ratio = round(ours.cpu_s / floor.cpu_s, 2) if ok else None
    print(f"  summary / floor: {ratio}× wall, {cpu_ratio}× CPU (target ≤ {TARGET_NSYS:g}×)")
    return {"input": str(path), "floor": asdict(floor), "ours": asdict(ours) | {"stdout": ""}, "ratio": ratio,
            "cpu_ratio": cpu_ratio}


def bench_growth(workdir: Path, scales: list[int], hta_python: Path | None) -> dict[str, Any]:
    """``summary --json`` (and HTA, when given) at 1×, 2×, 4×, 8× the Kineto data: cost per copy should stay flat."""
    print("\n[growth] traceanalyzer summary --json on N copies of df_index_resolver", flush=True)
    rows = []
    for n in scales:
        path = kineto_input(workdir, n)
        row: dict[str, Any] = {"copies": n, "size_mb": round(path.stat().st_size / 1e6, 1)}
        ours = measure(f"{n}× summary --json", [*TA, "summary", "--json", str(path)])
        row |= {"wall_s": ours.wall_s, "cpu_s": ours.cpu_s, "peak_rss_mb": ours.peak_rss_mb,
                "ok": ours.returncode == 0}
        if hta_python is not None:
            hta = measure(f"{n}× HTA", [str(hta_python), str(HERE / "hta_reference.py"), str(path)])
            row |= {"hta_wall_s": hta.wall_s, "hta_cpu_s": hta.cpu_s, "hta_peak_rss_mb": hta.peak_rss_mb}
        rows.append(row)
    base = rows[0]
    print(f"\n  {'copies':>6} {'MB':>7} {'wall s':>8} {'CPU s':>7} {'×CPU':>6} {'RSS MB':>8} {'×RSS':>6}"
          + (f" {'HTA CPU s':>9} {'×HTA':>6} {'HTA MB':>8}" if hta_python else ""))
    for r in rows:
        line = (f"  {r['copies']:>6} {r['size_mb']:>7.0f} {r['wall_s']:>8.2f} {r['cpu_s']:>7.2f}"
                f" {r['cpu_s'] / base['cpu_s']:>6.2f} {r['peak_rss_mb']:>8.0f}"
                f" {r['peak_rss_mb'] / base['peak_rss_mb']:>6.2f}")
        if hta_python:
            line += (f" {r['hta_cpu_s']:>9.2f} {r['hta_cpu_s'] / base['hta_cpu_s']:>6.2f}"
                     f" {r['hta_peak_rss_mb']:>8.0f}")
        print(line)
    return {"rows": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1× Kineto data for the comparison, growth 1×/2×")
    parser.add_argument("--only", default="kineto,nsys,growth", help="comma list of: kineto, nsys, growth")
    parser.add_argument("--copies", type=int, default=None, help="Kineto copies for the comparison (default 8)")
    parser.add_argument("--scales", default=None, help="growth scales (default 1,2,4,8; --quick 1,2)")
    parser.add_argument("--hta-python", type=Path, default=Path("/work/hta-venv/bin/python"))
    parser.add_argument("--no-hta", action="store_true", help="skip HolisticTraceAnalysis")
    parser.add_argument("--hta-growth", action="store_true", help="also run HTA at every growth scale")
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "ta-bench")
    parser.add_argument("--json", type=Path, default=None, help="write all measurements here")
    parser.add_argument("--repeat", type=int, default=1, help="run each command N times, keep the fastest")
    opts = parser.parse_args(argv)
    global REPEAT
    REPEAT = max(1, opts.repeat)
    parts = {p.strip() for p in opts.only.split(",") if p.strip()}
    copies = opts.copies or (1 if opts.quick else 8)
    scales = [int(s) for s in (opts.scales or ("1,2" if opts.quick else "1,2,4,8")).split(",")]
    hta_python = None if opts.no_hta or not opts.hta_python.exists() else opts.hta_python
    if hta_python is None and not opts.no_hta:
        print(f"note: {opts.hta_python} not found, HTA is skipped (see benchmarks/hta_reference.py)")
    opts.workdir.mkdir(parents=True, exist_ok=True)
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; python {sys.version.split()[0]};"
          f" workdir {opts.workdir}")
    results: dict[str, Any] = {"quick": opts.quick}
    if "kineto" in parts:
        results["kineto"] = bench_kineto(kineto_input(opts.workdir, copies), hta_python)
    if "nsys" in parts:
        if NSYS_XZ.exists():
            results["nsys"] = bench_nsys(nsys_input(opts.workdir))
        else:
            print(f"note: {NSYS_XZ} not found, nsys benchmark skipped")
    if "growth" in parts:
        results["growth"] = bench_growth(opts.workdir, scales, hta_python if opts.hta_growth else None)
    if opts.json:
        opts.json.write_text(json.dumps(results, indent=2) + "\n")
        print(f"\nwrote {opts.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
