"""Load rank files in worker processes (``--jobs N``): one Trace per file, in the order given.

Each worker loads (and classifies) one file and sends the Trace back pickled. Errors travel back as plain data
and are re-raised in the parent as the same error class, naming the file, so the CLI prints its usual one line.
On any error, Ctrl-C included, the workers are terminated before the error reaches the caller.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

from ..loaders import ProgressFn, load_one
from ..loaders.limits import Window
from ..model import errors
from ..model.trace import PathLike, Trace

MAX_FILES_PER_TASK = 32  # files loaded by one worker task at most
TASKS_PER_WORKER = 16  # runs of files per worker at least, where there are files enough


def map_files(files: Sequence[PathLike], *, rules: PathLike | None = None, classify: bool = True, jobs: int = 2,
              tables: frozenset[str] | None = None, progress: ProgressFn | None = None,
              window: Window | None = None, on_loaded: Callable[[Trace], None] | None = None) -> list[Trace]:
    """Load ``files`` with up to ``jobs`` worker processes; Traces come back in ``files`` order. ``tables`` limits
    the optional tables read and ``window`` the activity kept (as ``loaders.load_one``). ``on_loaded`` is called
    here with each Trace as it arrives (in completion order), so this process works while the workers load.

    A file that cannot be used raises its ``BadInputError`` (subclass kept) in the caller, naming that file, as
    soon as it is found. On any error, Ctrl-C included, the files not yet started are cancelled and the workers
    terminated before this returns (none is left holding the terminal or a pipe).
    """
    paths = [Path(f) for f in files]
    workers = max(1, min(jobs, len(paths), os.cpu_count() or 1))
    if not paths:
        return []
    out: list[Trace | None] = [None] * len(paths)
    # files go to the workers in runs of consecutive ones (fewer tasks for many small files), small enough that
    # every worker gets many runs
    size = max(1, min(MAX_FILES_PER_TASK, len(paths) // (workers * TASKS_PER_WORKER)))
    pool = ProcessPoolExecutor(max_workers=workers, initializer=_ignore_interrupts)
    try:
        futures: dict[Future[Any], int] = {
            pool.submit(_load_run_in_worker, [str(p) for p in paths[i:i + size]],
                        None if rules is None else str(rules), classify, tables, window): i
            for i in range(0, len(paths), size)
        }
        # each run as it completes (a bad file stops the rest at once); one waiter for all futures, not one per
        # future per completion, so the parent's cost stays linear in the number of files
        done = 0
        for fut in as_completed(futures):
            first = futures[fut]
            try:
                results = fut.result()
            except BrokenProcessPool:
                also = min(size, len(paths) - first) - 1
                where = f"{paths[first]}" + (f" (or one of the {also} files after it)" if also else "")
                raise RuntimeError(f"{where}: a worker process died while loading it (out of memory, or "
                                   "killed); rerun with -j 1 to see the error") from None
            loaded = [_unwrap(result, paths[i]) for i, result in enumerate(results, start=first)]
            out[first:first + len(loaded)] = loaded
            if on_loaded is not None:
                for trace in loaded:
                    on_loaded(trace)
            done += len(results)
            if progress is not None:
                progress(done, len(paths))
    except BaseException:  # bad input, Ctrl-C, a dead worker: no worker may outlive this call
        stop_workers(pool)
        raise
    pool.shutdown(wait=True)
    return [t for t in out if t is not None]


def stop_workers(pool: ProcessPoolExecutor) -> None:
    """Cancel what has not started, terminate the workers and wait for them (none survives the caller)."""
    processes = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for proc in processes:
        if proc.is_alive():
            proc.terminate()
    for proc in processes:
        proc.join(timeout=5)
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=5)
    pool.shutdown(wait=True)


def _ignore_interrupts() -> None:
    """Worker initializer: Ctrl-C reaches the whole process group; only the parent handles it (and stops the
    workers), so workers print no tracebacks of their own."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def load_file(path: PathLike, *, rules: PathLike | None = None, classify: bool = True,
              tables: frozenset[str] | None = None, progress: ProgressFn | None = None,
              window: Window | None = None) -> Trace:
    """One file loaded (``tables``, ``window`` as ``loaders.load_one``) and, with ``classify``, classified (``rules``
    first): the one "load one file and classify it" of ``ta.load``, the worker processes and the Dask workers."""
    trace = load_one(path, progress=progress, tables=tables, window=window)
    if not classify:
        return trace
    from ..classify import classified

    return classified(trace, rules)


def _load_in_worker(path: str, rules: str | None, classify: bool,
                    tables: frozenset[str] | None, window: Window | None = None) -> tuple[str, Any]:
    """Worker side: ``("ok", trace)`` or ``("error", details)`` — exceptions never cross the process boundary."""
    try:
        return "ok", load_file(path, rules=rules, classify=classify, tables=tables, window=window)
    except errors.BadInputError as exc:
        return "bad_input", (type(exc).__name__, exc.path, exc.problem, exc.hint)
    except Exception as exc:  # an internal failure: reported in the parent with the file name
        return "internal", (type(exc).__name__, str(exc))


def _load_run_in_worker(paths: list[str], rules: str | None, classify: bool,
                        tables: frozenset[str] | None, window: Window | None = None) -> list[tuple[str, Any]]:
    """Worker side of a run of files: :func:`_load_in_worker` of each, up to and including the first failure; a
    kernel name the run's files share is classified once (``classify.engine.classes_shared``)."""
    from ..classify.engine import classes_shared

    results = []
    with classes_shared():
        for path in paths:
            results.append(_load_in_worker(path, rules, classify, tables, window))
            if results[-1][0] != "ok":
                break
    return results


def _unwrap(result: tuple[str, Any], path: Path) -> Trace:
    kind, payload = result
    if kind == "ok":
        trace: Trace = payload
        return trace
    if kind == "bad_input":
        name, where, problem, hint = payload
        cls = getattr(errors, name, errors.BadInputError)
        if not (isinstance(cls, type) and issubclass(cls, errors.BadInputError)):
            cls = errors.BadInputError
        raise cls(where or path, problem, hint)
    name, message = payload
    raise RuntimeError(f"{path}: {name}: {message}")
