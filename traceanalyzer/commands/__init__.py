"""The commands the CLI and the ``ta.*`` facade run: report, export, diff, and their output and progress helpers."""
