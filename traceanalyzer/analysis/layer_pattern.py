"""The default and the check of ``--layer-pattern`` (the regex of range names that mark layers).

Kept apart from :mod:`.layers` (which re-exports both) so that the CLI can read the default without importing
pandas at start-up.
"""

from __future__ import annotations

import re

from ..errors import BadInputError

DEFAULT_LAYER_PATTERN = r"layer_?\d+"  # NVTX / record_function ranges that mark layers


def check_layer_pattern(pattern: str | None) -> None:
    """Raise BadInputError (exit 2) for a layer pattern that is not a regular expression."""
    if pattern:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise BadInputError(None, f"--layer-pattern {pattern!r} is not a valid regular expression ({exc})") \
                from None
