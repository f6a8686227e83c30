"""A big nsys export grown along time from a real one, and `summary` measured beside a plain sqlite3 fetch.

    python benchmarks/grow_nsys.py grow OUT.sqlite [--times 400] [--source fixtures/nsys/tp2_prefill_serial.sqlite]
    python benchmarks/grow_nsys.py measure OUT.sqlite [--rounds 3] [--nsys-ai /tmp/nsysai-venv/bin/nsys-ai]

``grow`` copies the export and appends ``times - 1`` copies of every activity table (kernels, runtime API, memcpy,
memset, synchronization, CUDA events, NVTX), each copy shifted by one capture span (plus 1 ms) with correlation
ids offset by the largest one + 1, so every launch still finds its kernel. Build it in /tmp; never commit it.

``measure`` runs, in turn per round (a shared machine's load hits every command alike): ``traceanalyzer summary
--json``; the **fetch**, a plain sqlite3 read of the kernel, runtime-launch and NVTX columns a summary needs into
numpy arrays (the floor: no analysis at all); and ``nsys-ai diagnose`` when given (the peer anchor). Wall time,
CPU time and peak RSS of each child come from ``os.wait4``.
"""

from __future__ import annotations

import argparse
import shutil
import sqlite3
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from run_bench import measure_once

SOURCE = Path(__file__).resolve().parents[1] / "fixtures" / "nsys" / "tp2_prefill_serial.sqlite"
ACTIVITY = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_MEMCPY",
            "CUPTI_ACTIVITY_KIND_MEMSET", "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", "CUPTI_ACTIVITY_KIND_CUDA_EVENT",
            "NVTX_EVENTS")
TA = str(Path(sys.executable).with_name("traceanalyzer"))

# The floor: what a summary must read, as typed arrays, in chunks (kernels; runtime rows that launched a kernel;
# NVTX ranges), names left as ids.
FETCH = r"""
import sqlite3, sys
import numpy as np
con = sqlite3.connect(f"file:{sys.argv[1]}?mode=ro", uri=True)
def fetch(sql, ncols):
    cur = con.execute(sql)
    parts = []
    while rows := cur.fetchmany(200_000):
        parts.append(np.array(rows, dtype=np.int64).reshape(-1, ncols))
    return np.concatenate(parts) if parts else np.zeros((0, ncols), np.int64)
k = fetch('SELECT start, "end", deviceId, streamId, correlationId, globalPid, demangledName, shortName, gridX, gridY,'
          ' gridZ, blockX, blockY, blockZ FROM CUPTI_ACTIVITY_KIND_KERNEL', 14)
r = fetch('SELECT r.start, r."end", r.globalTid, r.correlationId, r.nameId FROM CUPTI_ACTIVITY_KIND_RUNTIME r'
          ' WHERE r.correlationId IN (SELECT correlationId FROM CUPTI_ACTIVITY_KIND_KERNEL)', 5)
n = fetch('SELECT start, IFNULL("end", start), IFNULL(globalTid, 0), IFNULL(textId, -1), eventType FROM NVTX_EVENTS', 5)
names = con.execute("SELECT id, value FROM StringIds").fetchall()
print(len(k), len(r), len(n), len(names))
"""


def grow(out: Path, times: int, source: Path = SOURCE) -> Path:
    """``out``: ``source`` with its activity tables repeated ``times`` times along time (see the module doc)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, out)
    con = sqlite3.connect(out)
    tables = [t for (t,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'") if t in ACTIVITY]
    bounds = [con.execute(f'SELECT MIN(start), MAX(IFNULL("end", start)) FROM "{t}"').fetchone() for t in tables
              if {"start", "end"} <= set(_columns(con, t))]
    lo = min(b[0] for b in bounds if b[0] is not None)
    hi = max(b[1] for b in bounds if b[1] is not None)
    span = hi - lo + 1_000_000
    corr = max((con.execute(f'SELECT MAX(correlationId) FROM "{t}"').fetchone()[0] or 0) for t in tables
               if "correlationId" in _columns(con, t)) + 1
    for t in tables:
        cols = _columns(con, t)
        rows = con.execute(f'SELECT MAX(rowid) FROM "{t}"').fetchone()[0] or 0

        def shifted(c: str) -> str:
            if c in ("start", "end", "timestamp"):
                return f'"{c}" + :shift'
            if c == "correlationId":
                return f'"{c}" + :corr'
            return f'"{c}"'

        sql = (f'INSERT INTO "{t}" ({", ".join(f"[{c}]" for c in cols)}) SELECT {", ".join(map(shifted, cols))} '
               f'FROM "{t}" WHERE rowid <= {rows}')
        for i in range(1, times):
            con.execute(sql, {"shift": i * span, "corr": i * corr})
        con.commit()
    con.close()
    return out


def _columns(con: sqlite3.Connection, table: str) -> list[str]:
    return [row[1] for row in con.execute(f'PRAGMA table_info("{table}")')]


def measure(path: Path, rounds: int, nsys_ai: str | None, other: str | None = None) -> None:
    commands = {"traceanalyzer summary --json": [TA, "summary", "--json", str(path)],
                "fetch (sqlite3 → numpy)": [sys.executable, "-c", FETCH, str(path)]}
    if other:  # another build's console script (e.g. an older checkout's venv), measured in the same rounds
        commands[f"{other} summary --json"] = [other, "summary", "--json", str(path)]
    if nsys_ai:
        commands["nsys-ai diagnose"] = [nsys_ai, "diagnose", str(path)]
    results: dict[str, list[tuple[float, float, float]]] = {k: [] for k in commands}
    for _ in range(rounds):
        for label, cmd in commands.items():
            run = measure_once(label, cmd)
            results[label].append((run.wall_s, run.cpu_s, run.peak_rss_mb) if run.returncode == 0 else
                                  (float("nan"),) * 3)
    print(f"\n{path.name}: {path.stat().st_size / 1e6:.0f} MB")
    print("| command | wall s | CPU s | peak RSS MB |\n|---|---|---|---|")
    for label, runs in results.items():
        print(f"| {label} | " + " | ".join(", ".join(f"{r[i]:g}" for r in runs) for i in range(3)) + " |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["grow", "measure"])
    parser.add_argument("path", type=Path)
    parser.add_argument("--times", type=int, default=400)
    parser.add_argument("--source", type=Path, default=SOURCE)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--nsys-ai", help="path of an nsys-ai 0.3.0 executable (own venv)")
    parser.add_argument("--other", help="path of another build's traceanalyzer executable, measured alongside")
    args = parser.parse_args()
    if args.what == "grow":
        grow(args.path, args.times, args.source)
        print(f"{args.path}: {args.path.stat().st_size / 1e6:.0f} MB")
    else:
        measure(args.path, args.rounds, args.nsys_ai, args.other)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
