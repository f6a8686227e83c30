"""Step windows: Kineto GPU step annotations that cover only part of a step, and well-known NVTX step ranges."""

from __future__ import annotations

from traceanalyzer.analysis.activity import gather
from traceanalyzer.analysis.steps import step_windows
from traceanalyzer.testing.synth import make_trace


def test_partial_gpu_step_annotation_is_widened_to_the_projected_step():
    # the CPU step launches kernels at 50..130; Kineto's GPU annotation covers only the last 10 ns (a sliver)
    t = make_trace(
        kernels=[(50, 80, 0, 7, "gemm", "gemm", None, 1), (100, 130, 0, 7, "gemm", "gemm", None, 2)],
        api_calls=[(10, 12, 1), (20, 22, 2)],
        ranges=[(0, 40, "profiler_step", "ProfilerStep#3"), (120, 130, "gpu_user_annotation", "ProfilerStep#3", 0)])
    steps = step_windows(gather(t, 0, 0))
    assert steps[["step", "start_ns", "end_ns", "source"]].values.tolist() == [[3, 50, 130, "profiler_step"]]


def test_whole_gpu_step_annotation_is_kept():
    t = make_trace(
        kernels=[(50, 80, 0, 7, "gemm", "gemm", None, 1)], api_calls=[(10, 12, 1)],
        ranges=[(0, 40, "profiler_step", "ProfilerStep#3"), (49, 81, "gpu_user_annotation", "ProfilerStep#3", 0)])
    steps = step_windows(gather(t, 0, 0))
    assert steps[["step", "start_ns", "end_ns"]].values.tolist() == [[3, 49, 81]]
