"""Progress reporting on stderr, only when stderr is a terminal (never in tests, pipes or CI)."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

from ..loaders import ProgressFn


@contextmanager
def progress_bar(label: str, *, enabled: bool | None = None, delay_s: float = 1.0) -> Iterator[ProgressFn]:
    """Yield a ``progress(done, total)`` callback drawing a rich bar once work lasts longer than ``delay_s``."""
    if enabled is None:
        enabled = sys.stderr.isatty()
    if not enabled:
        yield lambda done, total: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    started = time.monotonic()
    bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                   TimeElapsedColumn(), console=Console(stderr=True), transient=True)
    task = bar.add_task(label, total=1)
    shown = False

    def update(done: int, total: int) -> None:
        nonlocal shown
        if not shown and time.monotonic() - started >= delay_s:
            bar.start()
            shown = True
        bar.update(task, completed=done, total=max(total, 1))

    try:
        yield update
    finally:
        if shown:
            bar.stop()
