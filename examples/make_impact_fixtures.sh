#!/usr/bin/env bash
# The measured A/B cases of docs/METHOD_IMPACTS.md on one GPU with examples/impact_ab.py: per case one plain process
# (alternating unprofiled rounds, then a Kineto trace of A and of B) and one process under nsys (A, then B, each
# its own capture range: <case>_a.sqlite, <case>_b.sqlite); profcost also under nsys -t cuda,nvtx with NVTX ranges.
#
#   DEST=/tmp/impacts examples/make_impact_fixtures.sh     # then copy $DEST/* into fixtures/ (see fixtures/README.md)
#
# nsys needs libdw.so.1 and libelf.so.1: unpack the Debian packages libdw1 and libelf1 into .nsysdeps/ (dpkg -x).
set -uo pipefail
cd "$(dirname "$0")/.."
. examples/device_env.sh  # PY, NSYS, the environment and nsys's libraries
DEST=${DEST:-build/impacts}
CASES=${CASES:-"graph_dense_b8_l8 graph_dense_b8_l16 graph_dense_b64_l8_big graph_moe_b4_l8 graph_moe_b32_l4
norm_eager_big norm_graph_big norm_prefill_big sync_graph_small sync_eager_big profcost"}
TMP=$(mktemp -d)
mkdir -p "$DEST/kineto" "$DEST/nsys" "$DEST/truth"
export_pair() {  # $1 = report stem, $2 = output stem: <stem>.1 → _a, <stem>.2 → _b
  local v i=1
  for v in a b; do
    [ -f "$1.$i.nsys-rep" ] && "$NSYS" export --type sqlite --force-overwrite true -o "$2_$v.sqlite" "$1.$i.nsys-rep" \
      >/dev/null && $PY examples/redact_nsys.py "$2_$v.sqlite" >/dev/null
    i=$((i + 1))
  done
}
for c in $CASES; do
  echo "== $c $(date -u +%T)"
  timeout 150 $PY examples/impact_ab.py --case "$c" --out "$DEST/truth/$c.json" --kineto-dir "$DEST/kineto/$c"
  timeout 150 "$NSYS" profile -s none --cpuctxsw=none -t cuda --cuda-graph-trace=node -c cudaProfilerApi \
    --capture-range-end=repeat --force-overwrite true -o "$TMP/$c" \
    $PY examples/impact_ab.py --case "$c" --nsys-range --out "$DEST/truth/$c.nsys_cuda.json" >/dev/null
  export_pair "$TMP/$c" "$DEST/nsys/$c" &
done
# the profiler's own cost with NVTX ranges: unprofiled with the ranges, and nsys -t cuda,nvtx
echo "== profcost --nvtx $(date -u +%T)"
timeout 150 $PY examples/impact_ab.py --case profcost --nvtx --out "$DEST/truth/profcost_nvtx.json"
timeout 150 "$NSYS" profile -s none --cpuctxsw=none -t cuda,nvtx -c cudaProfilerApi --capture-range-end=repeat \
  --force-overwrite true -o "$TMP/profcost_nvtx" \
  $PY examples/impact_ab.py --case profcost --nvtx --nsys-range --out "$DEST/truth/profcost_nvtx.nsys_cuda_nvtx.json" \
  >/dev/null
export_pair "$TMP/profcost_nvtx" "$DEST/nsys/profcost_nvtx"
wait
ls -laR "$DEST"
