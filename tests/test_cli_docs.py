"""docs/CLI.md is generated from --help and current; every command and option is documented."""

from __future__ import annotations

import click
import pytest

from traceanalyzer._docgen import DOC, command_names, main, render
from traceanalyzer.cli import cli


def test_cli_reference_is_current() -> None:
    assert DOC.read_text(encoding="utf-8") == render(), "run: python -m traceanalyzer._docgen"
    assert main(["--check"]) == 0


def test_every_command_has_a_section() -> None:
    text = DOC.read_text(encoding="utf-8")
    names = command_names()
    assert set(names) == {"info", "classify", "summary", "report", "export", "diff", "whatif"}
    for name in names:
        assert f"\n## traceanalyzer {name}\n" in text
        assert f"Usage: traceanalyzer {name} [OPTIONS]" in text


@pytest.mark.parametrize("name", command_names())
def test_every_command_and_option_explains_itself(name: str) -> None:
    command = cli.get_command(click.Context(cli), name)
    assert command is not None and command.help and command.short_help
    for param in command.params:
        if isinstance(param, click.Option):
            assert param.help, f"{name} {param.opts} has no help text"


def test_check_mode_reports_a_stale_reference(monkeypatch: pytest.MonkeyPatch, tmp_path, capsys) -> None:
    import traceanalyzer._docgen as docgen

    stale = tmp_path / "CLI.md"
    stale.write_text("old\n", encoding="utf-8")
    monkeypatch.setattr(docgen, "DOC", stale)
    assert docgen.main(["--check"]) == 1 and "out of date" in capsys.readouterr().err
