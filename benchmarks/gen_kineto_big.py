"""Generate a large Kineto trace by replicating a real one N times back to back (default 8×).

    python benchmarks/gen_kineto_big.py /tmp/big.json [--copies 8] [--source PATH]

Source: HTA's ``df_index_resolver.json.gz`` (216,092 events, 53.7 MB). Each copy is shifted in time by the
source's span plus 1 ms, and gets fresh correlation ids, External ids, flow ids and ProfilerStep numbers, so
the result reads like one long run (8 copies: 1.73 M events, ~380 MB of JSON). Never commit the output.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import sys
from pathlib import Path
from typing import Any

DEFAULT_SOURCE = (Path(__file__).resolve().parents[2] / "shared" / "data" / "hta" / "tests" / "data"
                  / "df_index_resolver" / "df_index_resolver.json.gz")
_STEP = re.compile(r"^ProfilerStep#(\d+)$")


def _id_span(events: list[dict[str, Any]]) -> tuple[int, int, int]:
    """(time span in µs, largest correlation/flow id, largest External id) of the source events."""
    starts = [e["ts"] for e in events if isinstance(e.get("ts"), (int, float))]
    ends = [e["ts"] + e["dur"] for e in events if isinstance(e.get("dur"), (int, float))]
    max_corr = max([e.get("args", {}).get("correlation", 0) for e in events] +
                   [e["id"] for e in events if isinstance(e.get("id"), int)])
    max_ext = max(e.get("args", {}).get("External id", 0) for e in events)
    return int(max(ends) - min(starts)), int(max_corr), int(max_ext)


def _shift(events: list[dict[str, Any]], dt: int, dcorr: int, dext: int, dstep: int) -> None:
    """Move every event one period on (in place)."""
    for e in events:
        if isinstance(e.get("ts"), (int, float)):
            e["ts"] += dt
        if isinstance(e.get("id"), int):
            e["id"] += dcorr
        args = e.get("args")
        if isinstance(args, dict):
            if isinstance(args.get("correlation"), int) and args["correlation"] > 0:
                args["correlation"] += dcorr
            if isinstance(args.get("External id"), int) and args["External id"] > 0:
                args["External id"] += dext
        if (m := _STEP.match(e.get("name", ""))) is not None:
            e["name"] = f"ProfilerStep#{int(m.group(1)) + dstep}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", type=Path)
    parser.add_argument("--copies", type=int, default=8)
    parser.add_argument("--source", type=Path, default=DEFAULT_SOURCE)
    opts = parser.parse_args(argv)
    with gzip.open(opts.source, "rb") as fh:
        doc = json.load(fh)
    events = doc.pop("traceEvents")
    meta = [e for e in events if e.get("ph") == "M"]
    body = [e for e in events if e.get("ph") != "M"]
    span, max_corr, max_ext = _id_span(body)
    steps = sum(1 for e in body if _STEP.match(e.get("name", "")))
    with open(opts.output, "w", encoding="utf-8") as out:  # json's ", " / ": " spacing, like Kineto's own
        out.write(json.dumps(doc)[:-1] + ', "traceEvents": [\n')
        out.write(",\n".join(json.dumps(e) for e in meta))
        for copy in range(opts.copies):
            if copy:
                _shift(body, span + 1000, max_corr + 1, max_ext + 1, steps)
            out.write(",\n" + ",\n".join(json.dumps(e) for e in body))
        out.write("\n]}\n")
    n = len(meta) + opts.copies * len(body)
    print(f"wrote {opts.output}: {n:,} events, {opts.output.stat().st_size:,} bytes", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
