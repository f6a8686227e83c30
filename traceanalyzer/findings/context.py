"""What every finding rule sees: the traces, the summary, thresholds, and small shared helpers."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ..analysis.results import DeviceSummary, Summary
from ..trace import Trace


@dataclass(frozen=True)
class FindingThresholds:
    """When rules fire. Percentages are of the median step time of the device."""

    exposed_comm_min_pct: float = 5.0  # exposed communication worth reporting
    serialized_overlap_max_pct: float = 5.0  # "serialized": comm shares the compute stream and hides < this
    small_message_max_bytes: int = 1 << 20  # one-shot / custom all-reduce territory
    oneshot_latency_ns: int = 8_000  # fixed cost assumed for a one-shot all-reduce on NVLink
    straggler_wait_min_pct: float = 5.0  # per-step wait on a slower rank worth reporting
    host_bound_idle_min_pct: float = 30.0  # GPU idle share of the step that suggests host-bound
    host_bound_kernel_max_ns: int = 50_000  # median kernel shorter than this: launch cost matters
    long_gap_min_ns: int = 1_000_000  # idle gaps this long get their host-side cause looked up
    tensor_active_min_pct: float = 30.0  # Tensor Active below this during GEMM phases is low
    bandwidth_min_fraction: float = 0.25  # bus bandwidth below this fraction of the link peak is low
    bandwidth_min_bytes: int = 1 << 20  # only messages at least this large are bandwidth-bound
    power_min_pct_of_limit: float = 50.0  # mean power below this share of the limit is reported
    min_impact_pct: float = 1.0  # findings worth less than this share of a step are dropped


@dataclass
class FindingContext:
    """Inputs of the rules."""

    traces: list[Trace]
    summary: Summary
    thresholds: FindingThresholds

    @cached_property
    def trace_by_path(self) -> dict[str, Trace]:
        return {t.path: t for t in self.traces}

    def trace_of(self, dev: DeviceSummary) -> Trace | None:
        """The Trace a device summary was computed from."""
        return self.trace_by_path.get(dev.trace)

    @staticmethod
    def steps(dev: DeviceSummary) -> int:
        return max(int(dev.steps or 0), 1)

    @staticmethod
    def step_ns(dev: DeviceSummary) -> int:
        """Median step time, or the whole span when no steps were found."""
        return int(dev.step_ns_median) if dev.step_ns_median else int(dev.span_ns)

    def pct_of_step(self, dev: DeviceSummary, ns: float | None) -> float | None:
        step = self.step_ns(dev)
        return None if ns is None or step <= 0 else 100.0 * float(ns) / step

    def worth_reporting(self, dev: DeviceSummary, ns: float) -> bool:
        pct = self.pct_of_step(dev, ns)
        return pct is not None and pct >= self.thresholds.min_impact_pct


def kernel_mask(trace: Trace, dev: DeviceSummary) -> np.ndarray:
    """Boolean mask of the kernels of one (rank, device)."""
    k = trace.kernels
    mask = k["device"] == dev.device
    if dev.rank >= 0:
        mask &= k["rank"] == dev.rank
    return mask


def severity(pct: float | None) -> str:
    """high ≥ 10% of a step, medium ≥ 3%, low otherwise."""
    if pct is None:
        return "info"
    return "high" if pct >= 10 else "medium" if pct >= 3 else "low"


def ms(ns: float | int | None) -> str:
    """Human text for a duration in ns (for titles only; JSON keeps ns)."""
    if ns is None:
        return "n/a"
    return f"{ns / 1e6:.2f} ms" if abs(ns) >= 100_000 else f"{ns / 1e3:.1f} µs"
