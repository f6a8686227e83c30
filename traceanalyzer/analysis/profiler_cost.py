"""The profiler's own host cost per step, estimated from the trace, so host-side impacts can be stated unprofiled.

A profiler slows the host by a roughly fixed time per event it records: Kineto per CPU op and CUDA API call it
records, nsys per CUDA API call it traces. On a host-bound step that time is GPU idle time the unprofiled run does
not have, so the launch gaps CUDA graphs would remove are the profiled ones minus it.

Measured on one H200 (``examples/impact_ab.py``, fixtures/truth/impacts/, docs/METHOD_IMPACTS.md): the same eager
decode timed unprofiled and under each profiler in one process, (profiled − unprofiled step) / recorded host events
per step, over the cases whose unprofiled step is itself host-bound (dense 8 and 16 layers, MoE 4 and 8 layers):

* Kineto (CPU + CUDA activities; events as the trace holds them, ``cpu_op`` ranges + CUDA API calls,
  ``what_if_range.host_event_counts``): 3.00 (MoE 4 layers), 3.02 (MoE 8), 3.99 (dense 8), 4.67 (dense 16) µs;
* nsys ``-t cuda`` (events: the CUDA API calls of the export): 2.13 (MoE 4), 6.66 (MoE 8), 7.44 (dense 16) µs per
  call (the dense 8-layer case's host ran slower unprofiled than profiled: no figure).

These are in-sample: the validation cases of docs/METHOD_IMPACTS.md are the runs they were measured on.

Kineto with Python stacks and nsys with NVTX were measured too, on the small dense decode only, whose host ran in
two speeds within the run (1.75 and 3.4 ms rounds of the same unprofiled step): no per-event figure could be told
apart from that, so they take the figures above.
"""

from __future__ import annotations

import numpy as np

from ..trace import Trace
from .results import DeviceSummary
from .what_if_range import HostEvents, host_event_counts

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
