#!/usr/bin/env bash
# Make fixtures/kineto/structure/<shape>/rank0.json.gz and fixtures/nsys/structure_<shape>.sqlite on one GPU with
# examples/structure_shapes.py: no NVTX ranges, no ProfilerStep, warm-up outside the capture.
#
#   DEST=/tmp/structure examples/make_structure_fixtures.sh     # then copy $DEST/* into fixtures/
#
# The committed ones were made on a lent one-H200 machine (torch 2.11.0+cu130, Triton 3.6.0, nsys 2025.3.1);
# nsys needs libdw.so.1 and libelf.so.1: unpack the Debian packages libdw1 and libelf1 into .nsysdeps/ (dpkg -x).
set -uo pipefail
cd "$(dirname "$0")/.."
. examples/device_env.sh  # PY, NSYS, the environment and nsys's libraries
DEST=${DEST:-build/structure}
BIG="--hidden 4096 --heads 32 --ffn 14336 --batch 64 --kv-len 2048"
# shape name : structure_shapes.py options
SHAPES=("decode:--shape decode $BIG --passes 12"
        "decode_launchbound:--shape decode --passes 12"
        "decode_sampled_nogap:--shape decode $BIG --passes 12 --sample --no-sync --gap-ms 0"
        "serve:--shape serve $BIG --passes 6 --prefill-tokens 8192"
        "train:--shape train --batch 1024 --layers 6 --passes 6"
        # issue 25's shapes (2026-12-02); each also writes rank0.truth.json beside its Kineto trace
        "cbatch:--shape cbatch --passes 24 --gap-ms 1 --chunk 256"
        "compile:--shape compile --sample --passes 12 --gap-ms 3"
        "hf_generate:--shape hf_generate --layers 4 --hidden 1024 --heads 16 --ffn 2816 --batch 2 --prompt-len 64 --passes 6 --with-stack"
        "moe:--shape moe --batch 4 --sample --gap-ms 0 --passes 30"
        "graph:--shape graph --sample --passes 20 --gap-ms 1"
        "train_ranges:--shape train_ranges --batch 1024 --layers 6 --passes 5 --captured-warmup 2")
# Kineto keeps fewer passes where 30 would pass the 1 MB a trace may take (tests/test_fixtures.py)
declare -A KINETO_EXTRA=([moe]="--passes 14")
# nsys options beyond the common ones
declare -A NSYS_EXTRA=([graph]="--cuda-graph-trace=node")
ONLY=${ONLY:-}  # e.g. ONLY="cbatch moe": just those shapes
TMP=$(mktemp -d)
mkdir -p "$DEST/kineto/structure" "$DEST/nsys"
for entry in "${SHAPES[@]}"; do
  name=${entry%%:*}; opts=${entry#*:}
  [ -n "$ONLY" ] && [[ " $ONLY " != *" $name "* ]] && continue
  mkdir -p "$DEST/kineto/structure/$name"
  echo "== $name (Kineto)"
  timeout 200 $PY examples/structure_shapes.py $opts ${KINETO_EXTRA[$name]:-} \
    --kineto "$DEST/kineto/structure/$name/rank0.json.gz" --facts "$DEST/kineto/structure/$name/rank0.truth.json"
  echo "== $name (nsys)"
  timeout 200 "$NSYS" profile -s none --cpuctxsw=none -t cuda,nvtx ${NSYS_EXTRA[$name]:-} -c cudaProfilerApi \
    --force-overwrite true -o "$TMP/$name" $PY examples/structure_shapes.py $opts --cuda-profiler-range \
    --facts "$DEST/nsys/structure_$name.truth.json"
  "$NSYS" export --type sqlite --force-overwrite true -o "$DEST/nsys/structure_$name.sqlite" "$TMP/$name.nsys-rep" \
    && $PY examples/redact_nsys.py "$DEST/nsys/structure_$name.sqlite"
done
ls -laR "$DEST"
