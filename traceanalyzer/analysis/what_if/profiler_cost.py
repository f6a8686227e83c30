"""The profiler's own host cost per step, estimated from the trace, so host-side impacts can be stated unprofiled.

A profiler slows the host by a roughly fixed time per event it records: Kineto per CPU op and CUDA API call it
records, nsys per CUDA API call it traces. On a host-bound step that time is GPU idle time the unprofiled run does
not have, so the launch gaps CUDA graphs would remove are the profiled ones minus it.

The per-event constants are the smallest, median and largest of the costs measured on the device, each the same
eager decode timed unprofiled and under the profiler, (profiled − unprofiled step) / recorded host events per step:
the measurements, and what they do not cover (Kineto with stacks, nsys with NVTX), are in docs/METHOD_IMPACTS.md
("The profiler's own cost").
"""

from __future__ import annotations

import numpy as np

from ...model.trace import Trace
from ..results import DeviceSummary
from .range import HostEvents, host_event_counts

#: (low, point, high) host ns a profiler adds per recorded host event: the smallest, median and largest measured
KINETO_NS_PER_EVENT = (3_000, 3_500, 4_670)
NSYS_NS_PER_EVENT = (2_130, 6_660, 7_440)


def ns_per_event(trace: Trace) -> tuple[int, int, int]:
    """The (low, point, high) per-event cost of the profiler that made ``trace``."""
    return NSYS_NS_PER_EVENT if trace.format.startswith("nsys") else KINETO_NS_PER_EVENT


def host_events_per_step(trace: Trace, dev: DeviceSummary, known: HostEvents | None = None) -> int:
    """Median per step of the host events the profiler recorded on the device's rank (0 without steps):
    ``known``, the counts its analysis made (``DeviceState.host_events``), else counted now."""
    if known is not None:
        counts = np.asarray(known[1])
    else:
        try:
            counts = host_event_counts(trace, dev.rank, dev.per_step)[1]
        except ValueError:  # the rank's call starts were let go after its analysis: nothing to count
            return 0
    counts = counts[counts > 0] if (counts > 0).any() else counts  # a step cut by the capture's end counts none
    return int(np.median(counts)) if len(counts) else 0


def profiler_host_ns(trace: Trace, events: int) -> tuple[int, int, int]:
    """(low, point, high) host time per step the profiler added on a rank of ``trace`` that records ``events``
    host events per step (:func:`host_events_per_step`)."""
    low, point, high = ns_per_event(trace)
    return events * low, events * point, events * high
