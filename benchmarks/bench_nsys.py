"""Time the nsys loader against a raw-sqlite3 floor: wall time and peak RSS, each run in a fresh process.

    python benchmarks/bench_nsys.py EXPORT.sqlite [--runs 3]
    python benchmarks/bench_nsys.py ../shared/data/h200/nsys/tp2_decode_eager_gpumetrics.sqlite.xz  # unpacked to /tmp
    python benchmarks/bench_nsys.py --synthetic 2000000 [--out /tmp/synth_2M.sqlite]         # generated export

Modes (each a fresh interpreter, peak RSS from its own rusage):

* ``floor``: plain sqlite3 — kernel columns + demangled/short names (StringIds joined in SQL) and every GPU_METRICS
  row (timestamp, typeId, metricId, value) fetched into numpy; what any loader has to pay at least.
* ``info``: the ``traceanalyzer info FILE --json`` command.
* ``summary``: the ``traceanalyzer summary FILE --json`` command (load, classify, every analysis, findings).
* ``load``: ``traceanalyzer.loaders.load_one(FILE)`` — every table (kernels, memops, NVTX, API calls, graph launches,
  GPU metrics) normalized, no classification.
"""

from __future__ import annotations

import argparse
import json
import lzma
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

_FLOOR = r"""
import sqlite3, sys
import numpy as np
conn = sqlite3.connect(f"file:{sys.argv[1]}?mode=ro&immutable=1", uri=True)
conn.text_factory = lambda b: b.decode("utf-8", "replace")
tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
rows = conn.execute('SELECT k.start, k."end", k.globalPid, k.deviceId, k.streamId, k.correlationId, d.value, s.value '
                    "FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds d ON d.id = k.demangledName "
                    "JOIN StringIds s ON s.id = k.shortName").fetchall()
ints = np.array([r[:6] for r in rows], dtype=np.int64).reshape(-1, 6)
names = np.array([r[6] for r in rows], dtype=object), np.array([r[7] for r in rows], dtype=object)
del rows
n = 0
if "GPU_METRICS" in tables:
    dt = np.dtype([("t", "i8"), ("type", "i8"), ("metric", "i4"), ("value", "f8")])
    n = conn.execute("SELECT COUNT(*) FROM GPU_METRICS").fetchone()[0]
    metrics = np.fromiter(conn.execute("SELECT timestamp, typeId, metricId, value FROM GPU_METRICS"), dt, count=n)
print({"kernels": len(ints), "gpu_metrics": n})
"""
_LOAD = r"""
import sys
from traceanalyzer.loaders import load_one
trace = load_one(sys.argv[1])
print({name: len(t) for name, t in trace.tables.items()})
"""


def measure(cmd: list[str]) -> dict[str, object]:
    """Wall time and peak RSS of one command (its own rusage via wait4)."""
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    out = proc.stdout.read().decode() if proc.stdout else ""
    if os.waitstatus_to_exitcode(status) != 0:
        err = proc.stderr.read().decode() if proc.stderr else ""
        raise SystemExit(f"{' '.join(cmd[:3])}… failed: {err.strip()[-500:]}")
    return {"wall_s": round(wall, 2), "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
            "peak_rss_mb": round(usage.ru_maxrss / 1024, 1), "out": out.strip()[-200:]}


def commands(path: Path) -> dict[str, list[str]]:
    exe = Path(sys.executable)
    cli = exe.parent / "traceanalyzer"
    info = [str(cli)] if cli.exists() else [sys.executable, "-m", "traceanalyzer.cli"]
    return {"floor": [sys.executable, "-c", _FLOOR, str(path)],
            "info": [*info, "info", str(path), "--json"],
            "summary": [*info, "summary", str(path), "--json"],
            "load": [sys.executable, "-c", _LOAD, str(path)]}


def write_synthetic(path: Path, n_kernels: int, *, n_names: int = 400, n_processes: int = 2, seed: int = 0) -> Path:
    """An export in the 2026 schema with ``n_kernels`` kernels over ``n_processes`` ranks (one GPU each), streamed
    in chunks so memory stays small. Kept out of git: write it under /tmp."""
    from traceanalyzer.testing.synth_nsys import DDL, global_pid

    path.unlink(missing_ok=True)
    rng = np.random.default_rng(seed)
    conn = sqlite3.connect(path)
    for table in ("StringIds", "CUPTI_ACTIVITY_KIND_KERNEL", "TARGET_INFO_GPU"):
        conn.execute(f"CREATE TABLE {table} ({DDL[table]})")
    names = [f"void kernel_{i}<float, {i % 7}>(Params<{i}>)" for i in range(n_names)]
    conn.executemany("INSERT INTO StringIds VALUES (?, ?)",
                     [(i, s) for i, s in enumerate(names + [n.split("(")[0].split("<")[0][5:] for n in names])])
    conn.executemany("INSERT INTO TARGET_INFO_GPU (vmId, id, name, smCount, cuDevice) VALUES (?, ?, ?, ?, ?)",
                     [(1 << 48, d, "NVIDIA H200", 132, d) for d in range(n_processes)])
    chunk = 200_000
    cols = ('start, "end", deviceId, contextId, streamId, correlationId, globalPid, demangledName, shortName, '
            "registersPerThread, gridX, gridY, gridZ, blockX, blockY, blockZ, staticSharedMemory, dynamicSharedMemory, "
            "localMemoryPerThread, localMemoryTotal, gridId, tensorSizeMinusOneElements")
    for lo in range(0, n_kernels, chunk):
        k = min(chunk, n_kernels - lo)
        idx = np.arange(lo, lo + k)
        dev = idx % n_processes
        start = (idx // n_processes) * 5_000 + rng.integers(0, 1_000, k)
        dur = rng.integers(1_000, 4_000, k)
        name = rng.integers(0, n_names, k)
        rows = zip(start.tolist(), (start + dur).tolist(), dev.tolist(), [1] * k, [7] * k, idx.tolist(),
                   [global_pid(1000 + d) for d in dev.tolist()], name.tolist(), (name + n_names).tolist(),
                   [32] * k, [128] * k, [1] * k, [1] * k, [256] * k, [1] * k, [1] * k, [0] * k, [0] * k, [0] * k,
                   [0] * k, idx.tolist(), [""] * k, strict=True)
        conn.executemany(f"INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL ({cols}) VALUES ({','.join('?' * 22)})", rows)
    conn.commit()
    conn.close()
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("export", nargs="?", type=Path, help="nsys .sqlite export (or .sqlite.xz)")
    parser.add_argument("--synthetic", type=int, default=0, help="generate an export with this many kernels")
    parser.add_argument("--out", type=Path, default=None, help="where to write the synthetic/unpacked export")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--modes", default="floor,info,load")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench_nsys_"))
    try:
        if args.synthetic:
            started = time.perf_counter()
            path = write_synthetic(args.out or tmp / f"synth_{args.synthetic}.sqlite", args.synthetic)
            print(f"generated {path} ({path.stat().st_size / 1e6:.0f} MB) in {time.perf_counter() - started:.1f}s")
        elif args.export is not None and args.export.suffix == ".xz":
            path = args.out or tmp / args.export.stem
            with lzma.open(args.export) as src, open(path, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
        elif args.export is not None:
            path = args.export
        else:
            parser.error("give an export or --synthetic N")
        results = {}
        for mode in args.modes.split(","):
            runs = [measure(commands(path)[mode]) for _ in range(args.runs)]
            results[mode] = {key: statistics.median(float(r[key]) for r in runs)  # type: ignore[arg-type]
                             for key in ("wall_s", "cpu_s", "peak_rss_mb")}
            results[mode]["runs_wall_s"] = [r["wall_s"] for r in runs]  # type: ignore[assignment]
            row = results[mode]
            print(f"{mode:>6}: wall {row['wall_s']:7.2f} s  cpu {row['cpu_s']:7.2f} s  peak RSS "
                  f"{row['peak_rss_mb']:8.1f} MB", flush=True)
        for mode in ("load", "summary"):
            if "floor" in results and mode in results:
                f, ld = results["floor"], results[mode]
                print(f"{mode}/floor: wall {ld['wall_s'] / f['wall_s']:.2f}x, cpu {ld['cpu_s'] / f['cpu_s']:.2f}x, "
                      f"peak RSS {ld['peak_rss_mb'] / f['peak_rss_mb']:.2f}x")
        print(json.dumps({"export": str(path), "size_mb": round(path.stat().st_size / 1e6, 1), **results}))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
