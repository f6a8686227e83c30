"""The Dask engine against the local one (issue 14): wall time, the driver's peak memory and each worker's.

    python benchmarks/bench_dask.py --n 8 32 64 128 256 [--source .../h200/kineto/decode_serial] [--workers 2]

Inputs: real rank traces replicated to N ranks (``gen_ranks.replicate``, into ``--workdir``; never committed).
For each N, in turn:

* local: ``traceanalyzer summary -j W --json DIR`` as a child process (under GNU time); wall time, CPU and peak
  RSS (the largest of the command and its loader workers);
* dask: a fresh ``dask scheduler`` and ``dask worker --nworkers W --nthreads 1`` (the same cores), then
  ``traceanalyzer summary --engine dask --scheduler ADDR --json DIR`` as a child: wall, CPU and peak RSS of the
  driver (GNU time); each worker's peak RSS read on the worker after the run (``VmHWM``), and the scheduler's.

Both JSON outputs are compared byte for byte. Prints a Markdown table (and ``--json`` writes the rows).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gen_ranks import DEFAULT_SOURCE, replicate

BIN = Path(sys.executable).parent
SOURCE = DEFAULT_SOURCE.with_name("decode_serial")


def _run(cmd: list[str]) -> tuple[float, float, float, bytes]:
    """(wall s, CPU s, peak RSS MB, stdout) of a child process, started through GNU time: a child forked from
    this (big) process would report this process's peak as its own (Linux keeps the pre-exec high-water mark)."""
    with tempfile.TemporaryFile() as out, tempfile.NamedTemporaryFile("r") as stats:
        start = time.perf_counter()
        proc = subprocess.run(["/usr/bin/time", "-o", stats.name, "-f", "%U %S %M", *cmd], stdout=out,
                              stderr=subprocess.DEVNULL, check=False)
        wall = time.perf_counter() - start
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed with {proc.returncode}")
        user, system, peak_kb = stats.read().split()[-3:]
        out.seek(0)
        return wall, float(user) + float(system), int(peak_kb) / 1024, out.read()


@contextmanager
def _cluster(workers: int, tmp: Path) -> Iterator[str]:
    """A fresh scheduler and ``workers`` single-threaded worker processes (dask's own CLI)."""
    scheduler_file = tmp / "scheduler.json"
    scheduler_file.unlink(missing_ok=True)
    # workers as docs/SCALE.md advises: without dask's statistical profiler (~50 % more CPU on our stacks)
    env = {**os.environ, "DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED": "False"}
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL, "start_new_session": True, "env": env}
    procs = [subprocess.Popen([str(BIN / "dask"), "scheduler", "--host", "127.0.0.1", "--port", "0",
                               "--no-dashboard", "--scheduler-file", str(scheduler_file)], **quiet)]  # type: ignore[call-overload]
    try:
        while not scheduler_file.exists():
            time.sleep(0.1)
        address = json.loads(scheduler_file.read_text())["address"]
        procs.append(subprocess.Popen([str(BIN / "dask"), "worker", address, "--nworkers", str(workers),
                                       "--nthreads", "1", "--no-dashboard"], **quiet))  # type: ignore[call-overload]
        from distributed import Client

        with Client(address) as client:
            client.wait_for_workers(workers, timeout=120)
        yield address
    finally:
        for proc in reversed(procs):
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait()


def _peaks(address: str) -> tuple[list[float], float, float]:
    """(each worker's peak RSS MB, the scheduler's, the workers' CPU seconds since they started)."""
    from distributed import Client

    def peak() -> float:  # VmHWM: this process's own high-water mark (not its parent's, as ru_maxrss can be)
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def cpu() -> float:
        import resource

        used = resource.getrusage(resource.RUSAGE_SELF)
        return used.ru_utime + used.ru_stime

    with Client(address) as client:
        return sorted(client.run(peak).values()), client.run_on_scheduler(peak), sum(client.run(cpu).values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", required=True)
    parser.add_argument("--source", type=Path, default=SOURCE, help="rank files SOURCE_rank*.json.gz")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/ta-dask"))
    parser.add_argument("--json", type=Path, help="write the rows here too")
    args = parser.parse_args()
    ta = str(BIN / "traceanalyzer")
    rows = []
    for n in args.n:
        directory = args.workdir / f"{args.source.name}{n}"
        if not (directory / "done").is_file():
            replicate(directory, n, args.source)
            (directory / "done").write_text("")
        local = _run([ta, "summary", "-j", str(args.workers), "--json", str(directory)])
        with _cluster(args.workers, args.workdir) as address:
            dask = _run([ta, "summary", "--engine", "dask", "--scheduler", address, "--json", str(directory)])
            workers, scheduler, workers_cpu = _peaks(address)
        row = {"ranks": n, "local_wall_s": round(local[0], 2), "local_cpu_s": round(local[1], 2),
               "local_peak_mb": round(local[2], 1), "dask_wall_s": round(dask[0], 2),
               "dask_driver_cpu_s": round(dask[1], 2), "dask_workers_cpu_s": round(workers_cpu, 2),
               "dask_driver_peak_mb": round(dask[2], 1),
               "dask_worker_peak_mb": [round(w, 1) for w in workers], "scheduler_peak_mb": round(scheduler, 1),
               "same_json": local[3] == dask[3], "load_avg": round(os.getloadavg()[0], 2)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    print("| ranks | local wall s | local peak MB | dask wall s | wall ratio | driver peak MB | driver / local "
          "| worker peaks MB | scheduler MB | same JSON |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['ranks']} | {r['local_wall_s']} | {r['local_peak_mb']} | {r['dask_wall_s']} | "
              f"{r['dask_wall_s'] / r['local_wall_s']:.2f} | {r['dask_driver_peak_mb']} | "
              f"{r['dask_driver_peak_mb'] / r['local_peak_mb']:.2f} | "
              f"{', '.join(map(str, r['dask_worker_peak_mb']))} | {r['scheduler_peak_mb']} | {r['same_json']} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
