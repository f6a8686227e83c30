"""Share a list of independent work items between this process and one forked helper (two cores, one file).

Used by the Kineto loader to decode a big trace's event batches. Both processes take the next unclaimed item
from a counter in shared memory until none is left, so the split balances itself whatever else either side is
doing (this process may first do the work queued with :func:`meanwhile`, such as importing the analysis
modules). The helper inherits the parent's memory (the mapped file included) through ``fork``, sends its results
back pickled through a pipe and exits.

Whatever goes wrong on the helper's side (no ``fork``, an exception, a crash, a result that does not pickle)
ends the same way: the parent computes the items the helper did not deliver, in order, so results and errors
are those of a serial run.
"""

from __future__ import annotations

import mmap
import multiprocessing
import os
import pickle
import signal
import struct
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, BinaryIO, TypeVar

T = TypeVar("T")
PROCESSES_ENV = "TRACEANALYZER_DECODE_PROCESSES"  # "1": never fork a helper; "2": always (where fork exists)
_FIRST: list[Callable[[], object]] = []  # see meanwhile()


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


@contextmanager
def meanwhile(*work: Callable[[], object]) -> Iterator[None]:
    """Inside the block, the first :func:`share` that forks a helper runs ``work`` in this process first, once,
    while the helper already takes items (e.g. importing what is needed after loading). Without a helper the
    work is not run here: whatever needs it does it later anyway."""
    _FIRST[:] = work
    try:
        yield
    finally:
        _FIRST.clear()


class _Counter:
    """The next unclaimed item, in anonymous shared memory (inherited by the forked helper), under a lock."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.memory = mmap.mmap(-1, 8)
        self.lock = multiprocessing.get_context("fork").Lock()

    def claim(self) -> int | None:
        with self.lock:
            (item,) = struct.unpack_from("q", self.memory, 0)
            if item >= self.count:
                return None
            struct.pack_into("q", self.memory, 0, item + 1)
            return item

    def close_claims(self) -> None:
        with self.lock:
            struct.pack_into("q", self.memory, 0, self.count)


def share(count: int, work: Callable[[int], T], *, done: Callable[[int], None] | None = None,
          min_items: int = 2) -> list[T]:
    """``[work(0), …, work(count - 1)]``, items computed by this process and a forked helper side by side.

    ``done(n)`` is called in this process after each of its items ``n - 1`` (items before it are claimed too).
    ``work`` must not print or report progress (the helper's output is discarded); its results must pickle.
    With fewer than ``min_items`` items, or when :func:`helper_allowed` says no, everything runs here.
    """
    if count < max(min_items, 2) or not helper_allowed():
        return _serial(count, work, done)
    try:  # shared memory, a semaphore and fork may each be missing or refused: then all of it runs here
        counter = _Counter(count)
        read_fd, write_fd = os.pipe()
    except (OSError, ImportError, ValueError):
        return _serial(count, work, done)
    parent = os.getpid()
    try:
        pid = os.fork()
    except OSError:
        os.close(read_fd)
        os.close(write_fd)
        return _serial(count, work, done)
    if pid == 0:  # the helper: take items until none is left, send them, leave without the parent's exit handlers
        status = 1
        try:
            _die_with(parent)
            os.close(read_fd)
            theirs: dict[int, T] = {}
            try:
                while (item := counter.claim()) is not None:
                    theirs[item] = work(item)
            except Exception:  # the parent recomputes what is missing and reports the error itself
                counter.close_claims()
            with os.fdopen(write_fd, "wb") as out:
                pickle.dump(theirs, out, protocol=pickle.HIGHEST_PROTOCOL)
            status = 0
        finally:
            os._exit(status)
    os.close(write_fd)
    results: dict[int, T] = {}
    failure: tuple[int, Exception] | None = None
    with os.fdopen(read_fd, "rb") as src:
        try:
            for first in _FIRST:
                first()
            _FIRST.clear()
            while (item := counter.claim()) is not None:
                try:
                    results[item] = work(item)
                except Exception as exc:  # re-raised below, after the items before it
                    failure = (item, exc)
                    counter.close_claims()
                    break
                if done:
                    done(item + 1)
            results.update(_receive(src))
        except BaseException:
            os.kill(pid, signal.SIGKILL)
            raise
        finally:
            os.waitpid(pid, 0)
    for item in range(failure[0] if failure else count):  # what the helper did not deliver, in order
        if item not in results:
            results[item] = work(item)
    if failure:
        raise failure[1]
    return [results[item] for item in range(count)]


def _die_with(parent: int) -> None:
    """In the helper: be killed when ``parent`` dies (Linux ``PR_SET_PDEATHSIG``), so a loader process that is
    terminated (``--jobs`` workers on an error or Ctrl-C) never leaves its helper behind holding the terminal."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the parent's own error paths still kill the helper
        return
    if os.getppid() != parent:  # the parent died before the request took effect
        os._exit(1)


def _serial(count: int, work: Callable[[int], T], done: Callable[[int], None] | None) -> list[T]:
    out = []
    for item in range(count):
        out.append(work(item))
        if done:
            done(item + 1)
    return out


def _receive(src: BinaryIO) -> dict[int, Any]:
    """The helper's pickled results (empty when it sent none: exception, crash, unpicklable result)."""
    try:
        received = pickle.load(src)
    except (EOFError, pickle.UnpicklingError, OSError, AttributeError, ImportError, IndexError, TypeError):
        return {}
    return received if isinstance(received, dict) else {}
