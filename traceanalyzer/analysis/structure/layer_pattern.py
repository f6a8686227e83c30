"""The default and the check of ``--layer-pattern`` (the regex of range names that mark layers).

Kept apart from :mod:`.layers` (which re-exports both) so that the CLI can read the default without importing
pandas at start-up.
"""

from __future__ import annotations

import re

from ...model.errors import BadInputError

# NVTX / record_function ranges that mark layers: the whole name is a layer name with its number (layer_3,
# layer3, Layer 3, layers.3, model.layers.3, decoder/layer_3) — not any name that contains "layer1" (TensorRT and
# ResNet op paths such as "/layer1/layer1.0/conv1/Conv + Relu" are ops inside a stage, not layers)
DEFAULT_LAYER_PATTERN = r"(?i)^(?:[\w.]*[./])?layers?[ _.]?\d+$"


def check_layer_pattern(pattern: str | None) -> None:
    """Raise BadInputError (exit 2) for a layer pattern that is not a regular expression, or that repeats an
    unbounded repetition (``(a+)+``: exponential backtracking; ``classify.prefilter.backtracking_hazard``)."""
    if pattern:
        from ...classify.prefilter import backtracking_hazard

        try:
            compiled = re.compile(pattern)
        except (re.error, RecursionError, OverflowError) as exc:
            raise BadInputError(None, f"--layer-pattern {pattern!r} is not a valid regular expression ({exc})") \
                from None
        nested = backtracking_hazard(compiled.pattern, compiled.flags)
        if nested:
            raise BadInputError(None, f"--layer-pattern {pattern!r} has {nested}, whose backtracking can take "
                                "exponential time on a long range name", "repeat a plain group instead")
