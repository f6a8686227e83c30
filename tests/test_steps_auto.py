"""Step windows: Kineto GPU step annotations that cover only part of a step, and well-known NVTX step ranges."""

from __future__ import annotations

from traceanalyzer.analysis.activity import gather
from traceanalyzer.analysis.structure.steps import step_windows
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
    # the annotation is wider than the projected kernel (50..80) and inside the device span (40..100)
    t = make_trace(
        kernels=[(40, 45, 0, 7, "gemm", "gemm"), (50, 80, 0, 7, "gemm", "gemm", None, 1),
                 (95, 100, 0, 7, "gemm", "gemm")],
        api_calls=[(10, 12, 1)],
        ranges=[(0, 40, "profiler_step", "ProfilerStep#3"), (48, 85, "gpu_user_annotation", "ProfilerStep#3", 0)])
    steps = step_windows(gather(t, 0, 0))
    assert steps[["step", "start_ns", "end_ns"]].values.tolist() == [[3, 48, 85]]


def test_step_windows_stay_inside_the_device_span():
    # Kineto's µs-float GPU annotation can start 1 ns before the first kernel (seen in HTA's MI250 trace)
    t = make_trace(kernels=[(50, 80, 0, 7, "gemm", "gemm"), (90, 95, 0, 7, "gemm", "gemm")],
                   ranges=[(49, 96, "gpu_user_annotation", "ProfilerStep#3", 0)])
    assert step_windows(gather(t, 0, 0))[["start_ns", "end_ns"]].values.tolist() == [[50, 95]]


def _warmup_then_two_steps(step_names: list[str], extra_ranges: list[tuple] = ()) -> object:
    """A warm-up kernel (not in any step) then two steps of two kernels, each step inside a named CPU range."""
    kernels = [(0, 50, 0, 7, "warmup", "gemm", None, 1),
               (1000, 1100, 0, 7, "gemm", "gemm", None, 2), (1150, 1200, 0, 7, "gemm", "gemm", None, 3),
               (2000, 2100, 0, 7, "gemm", "gemm", None, 4), (2150, 2200, 0, 7, "gemm", "gemm", None, 5)]
    api = [(0, 1, 1), (900, 901, 2), (910, 911, 3), (1900, 1901, 4), (1910, 1911, 5)]
    ranges = [(890, 950, "nvtx", step_names[0]), (1890, 1950, "nvtx", step_names[1]), *extra_ranges]
    return make_trace(kernels=kernels, api_calls=api, ranges=ranges)


def _steps(trace, step_range=None) -> list[list]:
    return step_windows(gather(trace, 0, 0), step_range)[["step", "start_ns", "end_ns", "source"]].values.tolist()


def test_well_known_nvtx_step_range_is_used_without_step_range():
    assert _steps(_warmup_then_two_steps(["step", "step"])) == [[0, 1000, 1200, "nvtx:step"],
                                                               [1, 2000, 2200, "nvtx:step"]]


def test_numbered_step_names_keep_their_numbers():
    got = _steps(_warmup_then_two_steps(["train_step_5", "train_step_6"]))
    assert [(s[0], s[3]) for s in got] == [(5, "nvtx:train_step"), (6, "nvtx:train_step")]


def test_outermost_step_family_wins():
    outer = [(880, 960, "nvtx", "train_step"), (1880, 1960, "nvtx", "train_step")]
    got = _steps(_warmup_then_two_steps(["iteration", "iteration"], outer))
    assert {s[3] for s in got} == {"nvtx:train_step"} and len(got) == 2


def test_names_that_only_contain_step_are_not_steps():
    got = _steps(_warmup_then_two_steps(["stepper", "forward_step_fn"]))
    assert not any(str(s[3]).startswith("nvtx:") for s in got)


def test_explicit_step_range_and_profiler_steps_take_precedence():
    t = _warmup_then_two_steps(["step", "step"], [(880, 960, "nvtx", "mine"), (1880, 1960, "nvtx", "mine")])
    assert {s[3] for s in _steps(t, "mine")} == {"nvtx:mine"}
    t = _warmup_then_two_steps(["step", "step"], [(880, 960, "profiler_step", "ProfilerStep#7"),
                                                  (1880, 1960, "profiler_step", "ProfilerStep#8")])
    assert [(s[0], s[3]) for s in _steps(t)] == [(7, "profiler_step"), (8, "profiler_step")]
