"""Load rank files in worker processes (``--jobs N``): one Trace per file, in the order given.

Each worker loads (and classifies) one file and sends the Trace back pickled. Errors travel back as plain data
and are re-raised in the parent as the same error class, naming the file, so the CLI prints its usual one line.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ProcessPoolExecutor, wait
from pathlib import Path
from typing import Any

from . import errors
from .loaders import ProgressFn, load_one
from .loaders.limits import Window
from .trace import Trace

PathLike = str | Path


def map_files(files: Sequence[PathLike], *, rules: PathLike | None = None, classify: bool = True, jobs: int = 2,
              tables: frozenset[str] | None = None, progress: ProgressFn | None = None,
              window: Window | None = None) -> list[Trace]:
    """Load ``files`` with up to ``jobs`` worker processes; Traces come back in ``files`` order. ``tables`` limits
    the optional tables read and ``window`` the activity kept (as ``loaders.load_one``).

    A file that cannot be used raises its ``BadInputError`` (subclass kept) in the caller, naming that file; the
    files not yet started are cancelled.
    """
    paths = [Path(f) for f in files]
    workers = max(1, min(jobs, len(paths), os.cpu_count() or 1))
    if not paths:
        return []
    out: list[Trace | None] = [None] * len(paths)
    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures: dict[Future[Any], int] = {
            pool.submit(_load_in_worker, str(p), None if rules is None else str(rules), classify, tables, window): i
            for i, p in enumerate(paths)
        }
        pending = set(futures)
        while pending:
            done, pending = wait(pending, return_when=FIRST_EXCEPTION)
            for fut in done:
                i = futures[fut]
                out[i] = _unwrap(fut.result(), paths[i], pool)
            if progress is not None:
                progress(len(paths) - len(pending), len(paths))
    return [t for t in out if t is not None]


def load_file(path: PathLike, *, rules: PathLike | None = None, classify: bool = True,
              tables: frozenset[str] | None = None, progress: ProgressFn | None = None,
              window: Window | None = None) -> Trace:
    """One file loaded (``tables``, ``window`` as ``loaders.load_one``) and, with ``classify``, classified (``rules``
    first)."""
    trace = load_one(path, progress=progress, tables=tables, window=window)
    if not classify:
        return trace
    from .classify import classified

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


def _unwrap(result: tuple[str, Any], path: Path, pool: ProcessPoolExecutor) -> Trace:
    kind, payload = result
    if kind == "ok":
        trace: Trace = payload
        return trace
    pool.shutdown(wait=False, cancel_futures=True)
    if kind == "bad_input":
        name, where, problem, hint = payload
        cls = getattr(errors, name, errors.BadInputError)
        if not (isinstance(cls, type) and issubclass(cls, errors.BadInputError)):
            cls = errors.BadInputError
        raise cls(where or path, problem, hint)
    name, message = payload
    raise RuntimeError(f"{path}: {name}: {message}")
