"""Grouping rank files into runs stays linear in the number of files and gives the plain algorithm's runs."""

from __future__ import annotations

import random

from traceanalyzer.analysis.runs import Run, Unit, group_units, incompatibility


def _reference(units: list[Unit]) -> list[Run]:
    """The grouping as first written: every member compared, ranks re-sorted on every join."""
    units = sorted(units, key=lambda u: (u.window_utc[0] if u.window_utc else 0, u.path))
    runs: list[Run] = []
    members: list[list[Unit]] = []
    for unit in units:
        why_not: list[str] = []
        for i, run in enumerate(runs):
            why = incompatibility(unit, run, members[i])
            if why is None:
                run.paths.append(unit.path)
                run.ranks = sorted({*run.ranks, *unit.ranks})
                run.world_size = run.world_size or unit.world_size
                if unit.window_utc:
                    lo, hi = run.window_utc or unit.window_utc
                    run.window_utc = (min(lo, unit.window_utc[0]), max(hi, unit.window_utc[1]))
                members[i].append(unit)
                break
            why_not.append(why)
        else:
            runs.append(Run([unit.path], list(unit.ranks), unit.world_size, unit.window_utc, why_not))
            members.append([unit])
    order = sorted(range(len(runs)), key=lambda i: -len(runs[i].ranks))
    return [runs[i] for i in order]


def _units(seed: int, n: int) -> list[Unit]:
    rng = random.Random(seed)
    mixes = [{("allreduce", 1 << 20): 16}, {("allreduce", 1 << 20): 16, ("allgather", 4096): 2},
             {("sendrecv", 512): 40}, {}]
    out = []
    for i in range(n):
        rank = rng.randrange(n // 2 + 1)
        start = rng.choice([None, 10**18, 10**18 + 5 * 10**9])
        window = None if start is None else (start, start + 10**9)
        out.append(Unit(f"r{i}.json", [rank], rng.choice([None, n, n // 2]), window, rng.choice(mixes),
                        rng.choice([None, 16.0, 18.0, 40.0])))
    return out


def test_grouping_matches_the_plain_algorithm() -> None:
    for seed in range(40):
        units = _units(seed, 60)
        got = [(r.to_json(), r.reasons) for r in group_units([Unit(**vars(u)) for u in units])]
        assert got == [(r.to_json(), r.reasons) for r in _reference(units)], seed
