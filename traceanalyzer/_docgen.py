"""Generate docs/CLI.md from the commands' ``--help`` texts: ``python -m traceanalyzer._docgen [--check]``.

The reference is only ever generated; tests/test_cli_docs.py fails when it is out of date.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from .cli import cli

WIDTH = 100
DOC = Path(__file__).resolve().parents[1] / "docs" / "CLI.md"
HEADER = """# traceanalyzer command-line reference

Generated from `--help` by `python -m traceanalyzer._docgen`; do not edit by hand (a test checks it is current).
Every command is one call of the library function of the same name (`traceanalyzer.pipeline.loading`, `pipeline`,
`report`); definitions of the numbers are in ARCHITECTURE.md, the step and layer rules in COMMUNICATION.md.
"""


def _help(command: click.Command, name: str, parent: click.Context | None = None) -> str:
    ctx = click.Context(command, info_name=name, parent=parent, terminal_width=WIDTH, max_content_width=WIDTH)
    return command.get_help(ctx).rstrip() + "\n"


def command_names() -> list[str]:
    """The subcommands of ``traceanalyzer``, in the order ``--help`` lists them."""
    ctx = click.Context(cli, info_name="traceanalyzer")
    return list(cli.list_commands(ctx))


def render() -> str:
    """docs/CLI.md: the top-level help, then one section per command."""
    parent = click.Context(cli, info_name="traceanalyzer", terminal_width=WIDTH, max_content_width=WIDTH,
                           **cli.context_settings)
    parts = [HEADER, "## traceanalyzer\n", "```\n" + cli.get_help(parent).rstrip() + "\n```\n"]
    for name in command_names():
        command = cli.get_command(parent, name)
        assert command is not None
        parts += [f"## traceanalyzer {name}\n", "```\n" + _help(command, name, parent) + "```\n"]
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    """Write docs/CLI.md, or with ``--check`` exit 1 when it differs from the generated text."""
    args = sys.argv[1:] if argv is None else argv
    text = render()
    if "--check" in args:
        current = DOC.read_text(encoding="utf-8") if DOC.exists() else ""
        if current != text:
            print(f"{DOC} is out of date: run python -m traceanalyzer._docgen", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
