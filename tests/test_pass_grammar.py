"""The pass grammar (analysis/structure/pass_grammar.py) on kernel-name sequences whose passes are known by
construction."""

from __future__ import annotations

import numpy as np
import pytest

from traceanalyzer.analysis.structure import pass_grammar as pg

LAYER = [10, 11, 12, 13, 14, 15, 16]  # one decoder layer: 7 kernels, 7 names
EMBED, LM_HEAD, ARGMAX, SETUP = 1, 2, 3, 4


def _pass(layers: int, *, head: bool = True, layer: list[int] = LAYER) -> list[int]:
    return ([EMBED] if head else []) + layer * layers + ([LM_HEAD, ARGMAX] if head else [])


def _seq(parts: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    names = np.array([x for p in parts for x in p], dtype=np.int64)
    return names, np.zeros(len(names), dtype=np.int64)


def _starts(parts: list[list[int]]) -> list[int]:
    return np.cumsum([0] + [len(p) for p in parts[:-1]]).tolist()


def test_decode_passes_are_cut_at_their_once_per_pass_work():
    parts = [_pass(4) for _ in range(10)]
    names, gap = _seq(parts)
    found = pg.find_passes(names, gap)
    assert found is not None and found.passes == 10 and found.count == 10
    assert found.cuts.tolist() == [*_starts(parts), len(names)]


def test_host_hiccups_inside_layers_are_no_boundaries():
    parts = [_pass(4) for _ in range(10)]
    names, gap = _seq(parts)
    rng = np.random.default_rng(0)
    gap[rng.choice(np.flatnonzero(np.isin(names, LAYER[1:])), 8, replace=False)] = 10_000_000  # GC pauses
    gap[_starts(parts)[1:]] = 1_000  # the scheduler's gap before each pass, far shorter than the hiccups
    found = pg.find_passes(names, gap)
    assert found is not None and found.cuts.tolist() == [*_starts(parts), len(names)]


def test_one_prefill_is_one_pass_not_layer_sized_steps():
    # a prefill of 36 layers of two alternating types (sliding and full attention differ in one kernel)
    sliding, full = LAYER, [*LAYER[:3], 99, *LAYER[4:]]
    names, gap = _seq([[EMBED], (sliding + full) * 18, [LM_HEAD, ARGMAX]])
    assert pg.find_passes(names, gap) is None
    assert pg.one_pass(names) == (0, len(names))


def test_layers_without_once_per_pass_work_are_not_passes():
    names, gap = _seq([LAYER * 96])
    assert pg.find_passes(names, gap) is None
    assert pg.one_pass(names) is None  # a stretch of layers with nothing around it: no whole pass is seen


def test_a_marker_twice_per_unit_marks_no_pass():
    # two different halves per repeating unit, a marker name in each half at uneven spacing
    unit = [50, 20, 21, 22, 51, 30, 31, 32, 33, 34, 35, 36, 37]
    names, gap = _seq([unit * 12])
    names[np.flatnonzero(names == 51)] = 50  # name 50 now occurs twice per unit
    found = pg.find_passes(names, gap)
    assert found is None or found.count == 12


def test_a_request_of_many_passes_gives_its_passes():
    parts = []
    for _ in range(3):  # 3 generate calls, each with setup kernels once, then 10 passes
        parts += [[SETUP, 5, 6]] + [_pass(4) for _ in range(10)]
    names, gap = _seq(parts)
    found = pg.find_passes(names, gap)
    assert found is not None and found.count == 30 and 29 <= found.passes <= 30


def test_forward_and_backward_chunks_are_not_two_passes():
    backward = [60, 61, 62, 63, 64, 65, 66]
    names, gap = _seq([[EMBED], LAYER * 4, [LM_HEAD], backward * 4, [ARGMAX], [EMBED], LAYER * 4, [LM_HEAD],
                       backward * 4, [ARGMAX]])
    found = pg.find_passes(names, gap)
    assert found is None or found.passes == 2  # two training iterations (fwd + bwd each), never four halves


def test_passes_in_one_range_need_visible_layers():
    # five model calls, each with a vision encoder (24 layers) and a text encoder (12 layers of another block)
    text = [70, 71, 72, 73, 74]
    call = [EMBED, *LAYER * 24, 8, *text * 12, LM_HEAD]
    names, gap = _seq([call] * 5)
    found = pg.passes_within(names, gap)
    assert found is not None and found.passes == 5
    # chunks whose repeats are not visible as layer blocks are not split
    varied = np.array([EMBED, 20, 21, 22, 23, 24, LM_HEAD] * 4, dtype=np.int64)
    assert pg.passes_within(varied, np.zeros(len(varied), dtype=np.int64)) is None


@pytest.mark.parametrize("seed", range(5))
def test_serving_passes_of_different_sizes(seed: int):
    # a prefill (another attention kernel, other GEMM tiles) then decode passes: the skeleton is the same
    rng = np.random.default_rng(seed)
    prefill_layer = [10, 11, 40, 13, 41, 15, 16]
    parts = [_pass(8, layer=prefill_layer)] + [_pass(8) for _ in range(int(rng.integers(4, 12)))]
    names, gap = _seq(parts)
    found = pg.find_passes(names, gap)
    assert found is not None and found.cuts.tolist() == [*_starts(parts), len(names)]


def test_tandem_blocks_fit_their_pass():
    names, _ = _seq([_pass(4) for _ in range(10)])
    blocks = pg.tandem_blocks(names)
    assert {p for _, _, p in blocks} >= {7}
    cover = pg.cover_of(blocks, len(names), len(names) / 10)  # a pass of 31 kernels: the 7-kernel layer fits
    assert cover[1:29].all() and not cover[0]


def test_outermost_phase_ranges_match_the_pairwise_definition():
    from traceanalyzer.analysis.structure.steps import _outermost

    rng = np.random.default_rng(1)
    for _ in range(300):
        n = int(rng.integers(1, 12))
        start = rng.integers(0, 20, n)
        end = start + rng.integers(0, 10, n)
        pairwise = ~np.array([bool(((start < a) & (end >= b)).any() | ((start <= a) & (end > b)).any())
                              for a, b in zip(start, end, strict=True)])
        assert (_outermost(start, end) == pairwise).all()
