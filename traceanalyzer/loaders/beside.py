"""Run one piece of work in a forked helper process while this process does another (two cores, one file).

Used by the Kineto loader to decode the second half of a big trace's event batches. The helper inherits the
parent's memory (the mapped file included) through ``fork``, sends its result back pickled through a pipe and
exits. Whatever goes wrong on the helper's side (no ``fork``, an exception, a crash, a result that does not
pickle) ends the same way: the parent runs that work itself, so results and errors are those of a serial run.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import signal
from collections.abc import Callable
from typing import Any, BinaryIO, TypeVar

A = TypeVar("A")
B = TypeVar("B")
PROCESSES_ENV = "TRACEANALYZER_DECODE_PROCESSES"  # "1": never fork a helper; "2": always (where fork exists)


def helper_allowed() -> bool:
    """``fork`` exists and, unless forced by ``TRACEANALYZER_DECODE_PROCESSES=2``: not disabled (``=1``), not
    already inside a ``--jobs`` worker, and a CPU looks free (1-minute load average below the usable CPUs - 0.5:
    on a machine whose cores are all busy a helper only adds work)."""
    setting = os.environ.get(PROCESSES_ENV, "").strip()
    if not hasattr(os, "fork") or setting == "1":
        return False
    if setting == "2":
        return True
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = 0.0
    return cpus >= 2 and load < cpus - 0.5 and not multiprocessing.current_process().daemon


def run_beside(here: Callable[[], A], there: Callable[[], B]) -> tuple[A, B]:
    """``(here(), there())``, with ``there`` computed in a forked helper while ``here`` runs in this process.

    ``there`` must not print or report progress (the helper's output is discarded); its result must pickle.
    """
    if not helper_allowed():
        return here(), there()
    read_fd, write_fd = os.pipe()
    try:
        pid = os.fork()
    except OSError:
        os.close(read_fd)
        os.close(write_fd)
        return here(), there()
    if pid == 0:  # the helper: compute, send, leave without running the parent's exit handlers
        status = 1
        try:
            os.close(read_fd)
            result = there()
            with os.fdopen(write_fd, "wb") as out:
                pickle.dump(result, out, protocol=pickle.HIGHEST_PROTOCOL)
            status = 0
        finally:
            os._exit(status)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as src:
        try:
            mine = here()
            theirs = _receive(src)
        except BaseException:
            os.kill(pid, signal.SIGKILL)
            raise
        finally:
            os.waitpid(pid, 0)
    return mine, (there() if theirs is _FAILED else theirs)


_FAILED: Any = object()


def _receive(src: BinaryIO) -> Any:
    """The helper's pickled result, or ``_FAILED`` when it sent none (exception, crash, unpicklable result)."""
    try:
        return pickle.load(src)
    except (EOFError, pickle.UnpicklingError, OSError, AttributeError, ImportError, IndexError, TypeError):
        return _FAILED
