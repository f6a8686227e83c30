"""Nsight Systems reports (``.nsys-rep``, older ``.qdrep``) in: exported once to SQLite by ``nsys export``, the
export reused while it is newer than the report.

The export goes next to the report as ``<stem>.sqlite`` (the name ``nsys export`` itself picks), or, where that
folder cannot be written, to the cache folder (``$TRACEANALYZER_CACHE``, else ``$XDG_CACHE_HOME/traceanalyzer``,
else ``~/.cache/traceanalyzer``) as ``<stem>-<hash of the report's path>.sqlite``. The ``nsys`` used is
``$TRACEANALYZER_NSYS`` (what ``--nsys PATH`` sets), else the one on ``PATH``; without one the report is bad input
and the message gives the exact export command. One line on stderr says when an export runs.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

from ..model.errors import BadInputError

SUFFIXES = (".nsys-rep", ".qdrep")
NSYS_ENV = "TRACEANALYZER_NSYS"
CACHE_ENV = "TRACEANALYZER_CACHE"
EXPORT_TIMEOUT_S = 3600


def is_report(path: str | Path) -> bool:
    """Whether ``path`` names an Nsight Systems report (by its suffix: the report format is nsys's own)."""
    return str(path).lower().endswith(SUFFIXES)


def _stem(report: Path) -> str:
    name = report.name
    for suffix in SUFFIXES:
        if name.lower().endswith(suffix):
            return name[: -len(suffix)] or "report"
    return report.stem


def beside(report: Path) -> Path:
    """The export next to the report: ``<stem>.sqlite``."""
    return report.with_name(_stem(report) + ".sqlite")


def cache_dir() -> Path:
    """The cache folder for exports that cannot go next to their report."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "traceanalyzer"


def cached(report: Path) -> Path:
    """The export in the cache folder: ``<stem>-<12 hex digits of the report's absolute path>.sqlite``."""
    digest = hashlib.sha256(str(report.resolve()).encode("utf-8", "surrogateescape")).hexdigest()[:12]
    return cache_dir() / f"{_stem(report)}-{digest}.sqlite"


def _fresh(export: Path, report: Path) -> bool:
    try:
        return export.is_file() and export.stat().st_mtime >= report.stat().st_mtime and export.stat().st_size > 0
    except OSError:
        return False


def _writable(folder: Path) -> bool:
    return folder.is_dir() and os.access(folder, os.W_OK | os.X_OK)


def nsys_executable() -> str | None:
    """``$TRACEANALYZER_NSYS`` when set (it must be an executable file), else ``nsys`` on ``PATH``, else None."""
    given = os.environ.get(NSYS_ENV)
    if given:
        found = shutil.which(given)
        if found is None:
            raise BadInputError(given, "--nsys: not an executable file", "give the path of the nsys binary")
        return found
    return shutil.which("nsys")


def export_command(report: Path, target: Path, nsys: str = "nsys") -> list[str]:
    """The ``nsys export`` command line that writes ``target`` from ``report``."""
    return [nsys, "export", "--type", "sqlite", "--force-overwrite", "true", "--output", str(target), str(report)]


def as_export(path: str | Path) -> Path:
    """The SQLite export to read for ``path``: ``path`` itself unless it names a report; for a report, its fresh
    export (next to it or in the cache), made first with nsys when there is none. Raises BadInputError when the
    report is missing, no nsys is found (the message gives the command to run) or the export fails."""
    report = Path(path)
    if not is_report(report):
        return report
    if not report.is_file():
        raise BadInputError(report, "no such file" if not report.exists() else "is not a regular file")
    candidates = [beside(report), cached(report)]
    for export in candidates:
        if _fresh(export, report):
            return export
    target = candidates[0] if _writable(report.parent) else candidates[1]
    nsys = nsys_executable()
    if nsys is None:
        command = f"nsys export --type sqlite --output {_quote(str(beside(report)))} {_quote(str(report))}"
        raise BadInputError(report, "an Nsight Systems report: traceanalyzer reads its SQLite export",
                            f"run `{command}` (or put nsys on PATH, or pass --nsys PATH)")
    return _export(report, target, nsys)


def _quote(arg: str) -> str:
    import shlex

    return shlex.quote(arg)


def _export(report: Path, target: Path, nsys: str) -> Path:
    """Run ``nsys export`` into a temporary file beside ``target`` and rename it over ``target``."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.stem}.{os.getpid()}.tmp.sqlite")
    sys.stderr.write(f"exporting {report.name} to SQLite with {Path(nsys).name} → {target} "
                     "(once: reused while newer than the report)\n")
    sys.stderr.flush()
    try:
        done = subprocess.run(export_command(report, tmp, nsys), stdin=subprocess.DEVNULL,
                              capture_output=True, timeout=EXPORT_TIMEOUT_S, check=False)
        if done.returncode != 0 or not tmp.is_file() or tmp.stat().st_size == 0:
            lines = (done.stderr or done.stdout or b"").decode("utf-8", "replace").strip().splitlines()
            last = lines[-1] if lines else "no output"
            raise BadInputError(report, f"nsys export failed (exit {done.returncode}): {last}",
                                f"check the report with `{Path(nsys).name} stats {report.name}`")
        os.replace(tmp, target)
    except subprocess.TimeoutExpired:
        raise BadInputError(report, f"nsys export did not finish within {EXPORT_TIMEOUT_S} s") from None
    except OSError as exc:
        raise BadInputError(report, f"cannot run {nsys}: {exc.strerror or exc}") from None
    finally:
        tmp.unlink(missing_ok=True)
    return target
