"""Docs generated from code stay current."""

from __future__ import annotations

from conftest import REPO

from traceanalyzer.model.schema import schema_markdown


def test_schema_doc_is_generated_from_the_schema():
    assert (REPO / "docs" / "SCHEMA.md").read_text() == schema_markdown() + "\n", (
        "regenerate: python -c 'from traceanalyzer.model.schema import schema_markdown; "
        "open(\"docs/SCHEMA.md\",\"w\").write(schema_markdown()+\"\\n\")'")
