#!/usr/bin/env bash
# The .nsys-rep plumbing (traceanalyzer/loaders/nsys_rep.py) against the real nsys, on the GPU machine: profile a
# tiny NVTX-annotated workload to a report, then let as_export() run `nsys export --type sqlite` once and reuse it.
# Run from the repository root: bash examples/nsys_rep_device.sh OUT_DIR
set -u
source examples/device_env.sh
OUT=${1:-/tmp/nsys_rep_check}
mkdir -p "$OUT"
"$NSYS" --version
"$NSYS" profile -s none --cpuctxsw=none -t cuda,nvtx -o "$OUT/tiny" --force-overwrite true "$PY" examples/tiny_nsys_rep.py
TRACEANALYZER_NSYS=$NSYS "$PY" - "$OUT/tiny.nsys-rep" <<'PY'
import os, sqlite3, sys, time
from traceanalyzer.loaders import nsys_rep
rep = sys.argv[1]
t0 = time.time(); e = nsys_rep.as_export(rep); t1 = time.time()
m = os.stat(e).st_mtime
e2 = nsys_rep.as_export(rep)
db = sqlite3.connect(e)
n = db.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
nv = db.execute("SELECT count(*) FROM NVTX_EVENTS").fetchone()[0]
print(f"export {e} in {t1 - t0:.1f}s; reused {e2 == e and os.stat(e).st_mtime == m}; kernels {n}, nvtx {nv}")
PY
