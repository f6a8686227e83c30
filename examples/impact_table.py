"""Print docs/METHOD_IMPACTS.md's validation table: per A/B case (fixtures/truth/impacts/) and capture of its variant A
(Kineto, nsys), the measured unprofiled step-time change (B − A, same process, alternating rounds), the finding the
tool makes and its predicted change with range and confidence. Run from the repository root:

  python3 examples/impact_table.py
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import traceanalyzer as ta
from traceanalyzer.pipeline.summarize import summarize

ROOT = Path(__file__).resolve().parents[1]
FINDING = {"graph": "host_bound_no_cuda_graphs", "norm": "norm_not_fused", "sync": "idle_gaps_host_cause"}


def captures(case: str) -> list[tuple[str, Path]]:
    return [("Kineto", ROOT / "fixtures" / "kineto" / "impacts" / case / "a" / "rank0.json.gz"),
            ("nsys", ROOT / "fixtures" / "nsys" / f"impact_{case}_a.sqlite")]


def main() -> None:
    warnings.filterwarnings("ignore")
    print("| case | capture | measured change, ms/step (per-round range) | finding | predicted, ms/step | range | "
          "confidence | error |")
    print("|---|---|---|---|---|---|---|---|")
    for path in sorted((ROOT / "fixtures" / "truth" / "impacts").glob("*.json")):
        if "nsys" in path.name or path.stem.startswith("profcost"):
            continue
        truth = json.loads(path.read_text())
        measured = truth["change_ms"]
        rounds = truth["change_ms_per_round"]
        finding = FINDING[truth["config"]["kind"]]
        for fmt, capture in captures(path.stem):
            found = [f for f in summarize([ta.load(capture)]).findings if f.id == finding]
            cells = [path.stem, fmt, f"{measured:+.2f} ({min(rounds):+.2f} … {max(rounds):+.2f})"]
            if not found or "predicted_change_ns" not in found[0].evidence:
                print("| " + " | ".join([*cells, f"none (`{finding}` silent)", "0", "—", "—", "miss"]) + " |")
                continue
            ev = found[0].evidence
            pred = ev["predicted_change_ns"] / 1e6
            low, high = (-x / 1e6 for x in ev["range_ns"])
            err = (pred - measured) / abs(measured) * 100
            print("| " + " | ".join([*cells, f"`{finding}`", f"{pred:+.2f}", f"{high:+.2f} … {low:+.2f}",
                                     ev["confidence"], f"{err:+.0f} %"]) + " |")


if __name__ == "__main__":
    main()
