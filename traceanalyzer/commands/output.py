"""Writing a result (HTML report, JSON) to the path the user named: the one place every command writes files.

* ``-`` (or a path that is this process's standard output, such as ``/dev/stdout``) writes to stdout.
* A regular file is replaced atomically: the text goes to a temporary file in the same folder (named
  ``.NAME.PID.XXXX.tmp``), is flushed to disk and renamed over the target, so readers see the old file or the new
  one, never half of one. The temporary file is removed on every error, on Ctrl-C and on SIGTERM/SIGHUP; one left
  by a killed run (SIGKILL) is removed by the next write to the same target. A symlink is written through (its
  target replaced, the link kept); an existing file keeps its permission bits.
* A character device or a FIFO (``/dev/null``, a terminal, a named pipe with a reader) is written in place, never
  replaced. Other special files, directories and any input trace are refused.
* Every failure (no space, file too large, permission, read-only file system) is an :class:`OutputError`:
  exit code 2 and ``cannot write FILE: <reason>``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import signal
import stat
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from ..model.errors import OutputError
from ..model.trace import PathLike

STDOUT = "-"
_SPECIAL_ROOTS = ("/dev/", "/proc/")
SQLITE_SIDECARS = ("-journal", "-wal", "-shm")  # SQLite's files beside a database being built at a temporary path
_TMP_NAME = re.compile(r"^\.(?P<name>.+)\.(?P<pid>\d+)\.[A-Za-z0-9_]+\.tmp(-journal|-wal|-shm)?$")


def is_stdout(target: PathLike | None) -> bool:
    """Whether writing to ``target`` means writing to this process's standard output."""
    if target is None:
        return False
    if str(target) == STDOUT:
        return True
    try:
        st, out = os.stat(target), os.fstat(sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        return False
    same = (st.st_dev, st.st_ino) == (out.st_dev, out.st_ino)
    return same and (not stat.S_ISREG(st.st_mode) or str(Path(target).absolute()).startswith(_SPECIAL_ROOTS))


def check_output(target: PathLike, inputs: Sequence[PathLike] = ()) -> None:
    """Refuse a target that cannot be written before any work is done (see :func:`write_output`)."""
    _plan(Path(target), inputs)


def write_output(data: str | bytes, target: PathLike, *, inputs: Sequence[PathLike] = ()) -> str:
    """Write ``data`` (text is UTF-8 encoded) to ``target``; returns how to name what was written.

    ``inputs`` are the files and directories the result was made from: none of them (nor a trace file inside an
    input directory) may be overwritten. Raises :class:`OutputError` (exit 2) when the target cannot be written.
    """
    payload = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    if is_stdout(target):
        _write_stdout(payload)
        return "<stdout>"
    path = Path(target)
    how = _plan(path, inputs)
    if how == "in_place":
        _write_in_place(path, payload)
    else:
        _write_atomic(path, payload)
    return str(path)


def write_built(target: PathLike, build: Callable[[Path], None], *, inputs: Sequence[PathLike] = (),
                exclusive: bool = False) -> str:
    """A file that ``build`` writes at a path it is given (a SQLite database), with :func:`write_output`'s
    refusals and atomic replacement: ``build`` fills an empty temporary file beside ``target``, which then replaces
    it. Standard output and special files are refused (a database needs a regular file). ``exclusive``: the file
    is linked into place only where none is, else :class:`FileExistsError` (the temporary file removed)."""
    path = Path(target)
    if _plan(path, inputs) != "atomic":
        raise OutputError(path, "not a regular file (a database cannot go to stdout, a device or a FIFO)",
                          "give it a file name, e.g. -o analysis.db")
    _replace_with(path, lambda tmp: build(Path(tmp)), make_folder=False, exclusive=exclusive)
    return str(path)


def _plan(path: Path, inputs: Sequence[PathLike]) -> str:
    """``"stdout"``, ``"in_place"`` or ``"atomic"`` for ``path``; :class:`OutputError` when it must be refused."""
    if is_stdout(path):
        return "stdout"
    try:
        st = os.stat(path)
    except FileNotFoundError:
        if str(path.absolute()).startswith(_SPECIAL_ROOTS):
            raise OutputError(path, "not a regular file path (/dev and /proc hold devices, not reports)") from None
        return "atomic"
    except OSError as exc:
        raise OutputError(path, _reason(exc)) from None
    if stat.S_ISDIR(st.st_mode):
        raise OutputError(path, "is a directory", "give the output a file name, e.g. -o reports/run.html")
    if _is_input(st, inputs):
        raise OutputError(path, "it is one of the input traces; refusing to overwrite it",
                          "choose another output file")
    if stat.S_ISCHR(st.st_mode) or stat.S_ISFIFO(st.st_mode):
        return "in_place"
    if not stat.S_ISREG(st.st_mode):
        raise OutputError(path, "not a regular file (a socket or block device)")
    if str(path.absolute()).startswith(_SPECIAL_ROOTS):
        return "in_place"  # e.g. /dev/stderr redirected to a file: write through it, never replace the link
    return "atomic"


def _is_input(st: os.stat_result, inputs: Sequence[PathLike]) -> bool:
    key = (st.st_dev, st.st_ino)
    for raw in inputs:
        try:
            own = os.stat(raw)
        except OSError:
            continue
        if (own.st_dev, own.st_ino) == key:
            return True
        if stat.S_ISDIR(own.st_mode):
            with contextlib.suppress(OSError), os.scandir(raw) as entries:
                for entry in entries:
                    inner = entry.stat()
                    if (inner.st_dev, inner.st_ino) == key:
                        return True
    return False


def _reason(exc: OSError) -> str:
    text = exc.strerror or str(exc) or type(exc).__name__
    return text[:1].lower() + text[1:]


def _write_stdout(payload: bytes) -> None:
    out = sys.stdout
    try:
        out.flush()
        buffer = getattr(out, "buffer", None)
        if buffer is not None:
            buffer.write(payload)
            buffer.flush()
        else:  # a text-only stream (tests capturing output)
            out.write(payload.decode("utf-8"))
            out.flush()
    except BrokenPipeError:
        raise
    except OSError as exc:
        raise OutputError("<stdout>", _reason(exc)) from None


def _write_in_place(path: Path, payload: bytes) -> None:
    """Write into an existing device, FIFO or stream path without creating, truncating or replacing it."""
    try:
        st = os.stat(path)
        fifo = stat.S_ISFIFO(st.st_mode)
        flags = os.O_WRONLY | (os.O_NONBLOCK if fifo else 0) | (os.O_APPEND if stat.S_ISREG(st.st_mode) else 0)
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ENXIO:
            raise OutputError(path, "no process is reading this FIFO") from None
        raise OutputError(path, _reason(exc)) from None
    try:
        if fifo:
            os.set_blocking(fd, True)
        view = memoryview(payload)
        while view:
            view = view[os.write(fd, view):]
    except BrokenPipeError:
        raise
    except OSError as exc:
        raise OutputError(path, _reason(exc)) from None
    finally:
        os.close(fd)


def _write_atomic(path: Path, payload: bytes) -> None:
    def fill(tmp: str) -> None:
        with open(tmp, "wb") as fh:
            fh.write(payload)
            fh.flush()
            os.fsync(fh.fileno())

    _replace_with(path, fill, make_folder=True)


def _replace_with(path: Path, fill: Callable[[str], None], *, make_folder: bool, exclusive: bool = False) -> None:
    """Replace ``path`` (through a symlink: its target, keeping the link) by a temporary file beside it that
    ``fill`` writes; the file keeps the old one's permissions; the temporary file never survives an error or a
    signal. ``make_folder`` creates missing folders, else a missing folder is an error."""
    real = Path(os.path.realpath(path))
    folder = real.parent
    try:
        if make_folder:
            folder.mkdir(parents=True, exist_ok=True)
        elif not folder.is_dir():
            raise FileNotFoundError(errno.ENOENT, f"directory {folder} does not exist")
        _remove_stale_temporaries(folder, real.name)
        mode = stat.S_IMODE(os.stat(real).st_mode) if real.exists() else 0o666 & ~_umask()
    except OSError as exc:
        raise OutputError(path, _reason(exc)) from None
    with _signals_raise():
        tmp: str | None = None
        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{real.name}.{os.getpid()}.", suffix=".tmp", dir=folder)
            os.close(fd)
            fill(tmp)
            os.chmod(tmp, mode)
            if exclusive and _linked(tmp, real):  # FileExistsError where a file appeared meanwhile
                pass  # the temporary name goes in ``finally``
            else:
                os.replace(tmp, real)
                tmp = None
        except FileExistsError:
            raise
        except OSError as exc:
            raise OutputError(path, _reason(exc)) from None
        finally:
            if tmp is not None:
                for leftover in (tmp, *(tmp + s for s in SQLITE_SIDECARS)):
                    with contextlib.suppress(OSError):
                        os.unlink(leftover)


def _linked(tmp: str, real: Path) -> bool:
    """Link ``tmp`` at ``real`` only where no file is (FileExistsError otherwise); False on a file system without
    hard links (the caller renames instead)."""
    try:
        os.link(tmp, real)
    except FileExistsError:
        raise
    except OSError as exc:
        if exc.errno in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK, errno.ENOSYS):
            return False
        raise
    return True


def _remove_stale_temporaries(folder: Path, name: str) -> None:
    """Temporary files of earlier writes to ``name`` whose process is gone (killed mid-write)."""
    prefix = f".{name}."
    with contextlib.suppress(OSError), os.scandir(folder) as entries:
        for entry in entries:
            m = _TMP_NAME.match(entry.name)
            if not (entry.name.startswith(prefix) and m and m.group("name") == name):
                continue
            if not _alive(int(m.group("pid"))):
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


class _Terminated(BaseException):
    """SIGTERM/SIGHUP arrived while a file was being written (raised so the temporary file is removed)."""


@contextlib.contextmanager
def _signals_raise() -> Iterator[None]:
    """While writing, SIGTERM and SIGHUP raise (so ``finally`` cleans up), then end the process as they would."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []

    def handler(signum: int, _frame: object) -> None:
        received.append(signum)
        raise _Terminated

    wanted = [s for s in (getattr(signal, "SIGTERM", None), getattr(signal, "SIGHUP", None)) if s is not None]
    previous = {s: signal.signal(s, handler) for s in wanted}
    try:
        yield
    except _Terminated:
        pass
    finally:
        for s, old in previous.items():
            signal.signal(s, old)
    if received:  # the temporary file is gone: now die of the signal as the default action would
        os.kill(os.getpid(), received[0])
        raise SystemExit(128 + received[0])
