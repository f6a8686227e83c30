# %% [markdown]
# # A tour of traceanalyzer on the shipped fixtures
#
# The fixtures are real traces of `examples/moe_tp.py`, a 4-layer tensor-parallel MoE transformer on 2×H200
# (see `fixtures/README.md`). This file is a notebook in `# %%` cell format (VS Code, Jupyter with jupytext,
# or plain `python examples/notebook_tour.py`). It uses the library API: `ta.info`, `ta.load`, `trace.df`,
# then `ta.summary` (numbers and findings), `ta.report` (the HTML file), `ta.export` (a SQLite database) and
# `ta.diff` (two runs compared).

# %%
from __future__ import annotations

import json
import sqlite3
import tempfile
from pathlib import Path

import pandas as pd

import traceanalyzer as ta

ROOT = Path(__file__).resolve().parents[1] if "__file__" in globals() else Path.cwd()
FIXTURES = ROOT / "fixtures"
MODES = ["prefill_serial", "prefill_overlap", "decode_eager", "decode_graphs"]
pd.set_option("display.width", 160)
pd.set_option("display.max_colwidth", 70)

# %% [markdown]
# ## What is in a file: `ta.info`

# %%
serial_rank0 = FIXTURES / "kineto" / "tp2_prefill_serial" / "rank0.json.gz"
about = ta.info(serial_rank0)
print(about["format"], "|", about["tool_version"])
print("devices:", about["devices"])
print("counts:", about["counts"])

# %% [markdown]
# ## Kernels as a DataFrame, grouped by bucket
#
# `ta.load` classifies every kernel (bucket / sub-bucket / precision); `trace.df("kernels")` is a pandas
# DataFrame with one row per kernel and integer-nanosecond times. Sums below are plain sums of kernel
# durations (not unions of intervals), over the 3 profiled steps.

# %%
trace = ta.load(serial_rank0)
kernels = trace.df("kernels")
kernels["dur_us"] = (kernels["end_ns"] - kernels["start_ns"]) / 1e3
by_bucket = (
    kernels.groupby("bucket", observed=True)["dur_us"]
    .agg(kernels="count", total_us="sum", mean_us="mean")
    .sort_values("total_us", ascending=False)
)
by_bucket["share_%"] = 100 * by_bucket["total_us"] / by_bucket["total_us"].sum()
print(by_bucket.round(1))

# %% [markdown]
# ## The heaviest kernels in each bucket

# %%
kernels["kernel"] = kernels["name"].astype(str).str.slice(0, 60)
top = (
    kernels.groupby(["bucket", "subbucket", "kernel"], observed=True)["dur_us"]
    .agg(count="count", total_us="sum")
    .reset_index()
    .sort_values("total_us", ascending=False)
    .groupby("bucket", observed=True)
    .head(2)
)
print(top.round(1).to_string(index=False))

# %% [markdown]
# ## Steps and layers from the annotations
#
# The workload marks `ProfilerStep#N` (via `prof.step()`) and `layer_N` / `attention` / `moe` /
# `allreduce` ranges. `user_annotation` rows are the host-side ranges (properly nested);
# `gpu_user_annotation` rows are Kineto's GPU-side extent of a range, which spans only the kernels launched
# directly inside it, not inside nested ranges: meaningful for the leaf ranges (`attention`, `moe`,
# `nccl:all_reduce`), short for `layer_N`, whose kernels are mostly launched inside those leaves.

# %%
ranges = trace.df("ranges")
ranges["dur_us"] = (ranges["end_ns"] - ranges["start_ns"]) / 1e3
steps = ranges[ranges["kind"] == "profiler_step"][["name", "dur_us"]]
print(steps.round(1).to_string(index=False))
annotated = ranges[ranges["kind"].isin(["user_annotation", "gpu_user_annotation"])
                   & ~ranges["name"].astype(str).str.startswith("ProfilerStep")]
per_name = annotated.pivot_table(index="name", columns="kind", values="dur_us", aggfunc="mean", observed=True)
print(per_name.round(1).sort_index())

# %% [markdown]
# ## Four schedules side by side
#
# Kernel time per step by bucket for each mode (rank 0), next to the step times measured without the
# profiler, with and without the all-reduces (`fixtures/truth`): their difference is what communication
# really costs per step.

# %%
rows = []
for mode in MODES:
    t = ta.load(FIXTURES / "kineto" / f"tp2_{mode}" / "rank0.json.gz")
    k = t.df("kernels")
    n_steps = int((t.df("ranges")["kind"] == "profiler_step").sum())
    per_step_ms = ((k["end_ns"] - k["start_ns"]).groupby(k["bucket"], observed=True).sum() / 1e6 / n_steps)
    with_comm = json.loads((FIXTURES / "truth" / f"{mode}_rank0.json").read_text())["step_ms_median"]
    no_comm = json.loads((FIXTURES / "truth" / f"{mode}_nocomm_rank0.json").read_text())["step_ms_median"]
    rows.append({"mode": mode, **per_step_ms.round(2).to_dict(), "step_ms": round(with_comm, 2),
                 "step_ms_no_comm": round(no_comm, 2), "comm_cost_ms": round(with_comm - no_comm, 2)})
print(pd.DataFrame(rows).set_index("mode").fillna(0).to_string())

# %% [markdown]
# ## The same workload under nsys: both ranks in one file

# %%
nsys_trace = ta.load(FIXTURES / "nsys" / "tp2_prefill_serial.sqlite")
nk = nsys_trace.df("kernels")
print(nsys_trace.tool_version, [(d.device, d.rank, d.name) for d in nsys_trace.devices])
print(nk.groupby(["rank", "device", "bucket"], observed=True).size().unstack(fill_value=0))
nvtx = nsys_trace.df("ranges")
print(nvtx[nvtx["name"].astype(str).str.fullmatch(r"layer_\d+")].groupby("name", observed=True).size())

# %% [markdown]
# ## The summary: exposed communication per device, step and layer
#
# `ta.summary` takes files, directories of rank files or loaded Traces. In a notebook the Summary displays as
# a compact table (`_repr_html_`); its attributes carry the JSON's names (`summary --json`), and the
# per-step, per-layer and per-collective tables are DataFrames.

# %%
serial_dir = FIXTURES / "kineto" / "tp2_prefill_serial"
summary = ta.summary([serial_dir])
print(summary)
dev = summary.devices[0]
print(f"rank {dev.rank}: {dev.kernels} kernels, exposed comm {dev.comm_exposed_ns / 1e6:.2f} ms over "
      f"{dev.steps} steps, {dev.comm_exposed_per_step_ns / 1e6:.2f} ms/step; window {dev.window_ns}")
print(dev.per_step[["step", "duration_ns", "comm_ns", "comm_exposed_ns"]].to_string(index=False))
print(dev.per_layer.groupby("name")["comm_exposed_ns"].median().rename("exposed_ns_median").to_string())

# %% [markdown]
# ## Findings: what to change, with the impact per step and the evidence

# %%
for finding in summary.findings:
    print(f"{finding.impact_ns_per_step / 1e6:6.2f} ms/step  [{finding.id}] {finding.title}")
print("evidence of the first:", sorted(summary.findings[0].evidence))
print("if communication were free:", summary.what_if.comm_free_step_saving_ns / 1e6, "ms/step",
      f"({summary.what_if.basis})")

# %% [markdown]
# ## The HTML report and the SQLite export
#
# `ta.report` writes one self-contained HTML file (charts inlined, works offline) and returns the Summary;
# `ta.export` writes the same results to SQLite (`docs/EXPORT.md`): a ready Summary is written as it is.

# %%
with tempfile.TemporaryDirectory(prefix="traceanalyzer-tour-") as tmp:  # keep them: write to a folder of yours
    html_path, _ = ta.report([serial_dir], output=Path(tmp) / "prefill_serial.html")
    print("report:", html_path.name, f"{html_path.stat().st_size / 1e6:.1f} MB")
    exported = ta.export(summary, Path(tmp) / "analysis.db")
    print("export:", exported.path.name, exported.rows)
    with sqlite3.connect(exported.path) as db:
        per_layer = pd.read_sql_query(
            "SELECT rank, layer, sum(comm_exposed_ns) / 1e6 AS exposed_ms FROM layers GROUP BY rank, layer", db)
    print(per_layer.to_string(index=False))

# %% [markdown]
# ## Two runs compared: `ta.diff`
#
# The same eager decode with and without its all-reduces (`fixtures/kineto/ab`). The step change is split into
# compute buckets, exposed communication (wait, transfer), memory copies and idle (host-bound, other); the parts
# add up to the change exactly (`docs/DIFF.md`). In a notebook, `d` alone renders a compact HTML table.

# %%
d = ta.diff(FIXTURES / "kineto" / "ab" / "tp2_decode_eager_c", FIXTURES / "kineto" / "ab" / "tp2_decode_eager_c_nocomm")
print(d.step)
print(pd.DataFrame(d.attribution).set_index("component").div(1e6).round(3).to_string())
print(d.kernels[["match", "bucket", "before_ns", "after_ns", "delta_ns"]].head(5).to_string(index=False))
