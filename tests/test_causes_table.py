"""The known-causes table (rules/causes.toml) as data: every entry has evidence, conditions, settings and sources,
and docs/FINDINGS.md lists each with its sources."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from traceanalyzer.findings.causes import CONDITIONS, EVIDENCE, conditions_hold, load_causes, parse_causes

DOCS = Path(__file__).resolve().parents[1] / "docs" / "FINDINGS.md"


def test_every_entry_is_complete() -> None:
    causes = load_causes()
    assert len(causes) >= 6
    assert len({c.id for c in causes}) == len(causes)
    for c in causes:
        assert c.evidence and all(t in EVIDENCE for t in c.evidence), c.id
        assert c.when and all(k in CONDITIONS for k in c.when), c.id
        assert c.settings and all(v.strip() for v in c.settings.values()), c.id
        assert c.alternative.strip(), c.id
        assert c.sources and all(s.startswith("https://") for s in c.sources), c.id


def test_docs_list_every_entry_with_its_sources() -> None:
    text = DOCS.read_text(encoding="utf-8")
    for c in load_causes():
        assert f"`cause_{c.id}`" in text, c.id
        for source in c.sources:
            assert source in text, (c.id, source)


@pytest.mark.parametrize("entry", [
    'id = "x"\ntitle = "t"\nevidence = []\nsources = ["https://a"]',
    'id = "x"\ntitle = "t"\nevidence = ["no_such_token"]\nsources = ["https://a"]',
    'id = "x"\ntitle = "t"\nevidence = ["nccl_allreduce"]\nsources = []',
    'id = "x"\ntitle = "t"\nevidence = ["nccl_allreduce"]\nsources = ["https://a"]\n[cause.when]\ncolour = 1',
])
def test_incomplete_entries_are_refused(entry: str) -> None:
    with pytest.raises(ValueError):
        parse_causes("[[cause]]\n" + entry)


def _platform(**kw: object) -> SimpleNamespace:
    base = {"architecture": "sm120", "interconnect": "pcie", "world_size": 8, "frameworks": [{"name": "SGLang"}]}
    base.update(kw)
    return SimpleNamespace(**base)


def test_conditions_unknown_facts_keep_a_cause_silent() -> None:
    gated = {"not_architectures": ["sm90", "sm100"], "world_size_min": 2, "frameworks": ["SGLang"]}
    assert conditions_hold(gated, _platform())
    assert not conditions_hold(gated, _platform(architecture="sm100"))
    assert not conditions_hold(gated, _platform(architecture=None))  # unknown: no advice that may not apply
    assert not conditions_hold(gated, _platform(world_size=None))
    assert not conditions_hold(gated, _platform(frameworks=[{"name": "FBGEMM / TorchRec"}]))
    assert not conditions_hold({"link": ["pcie"]}, _platform(interconnect="unknown"))
    assert not conditions_hold({"world_size_max": 8}, _platform(world_size=16))
    assert not conditions_hold({"link": ["pcie"]}, None)
