#!/usr/bin/env bash
# Regenerate the project's fixtures/ from real runs of examples/moe_tp.py on NGPU GPUs (default 2).
#
#   DEST=/tmp/fixtures examples/make_fixtures.sh      # then copy $DEST/* into fixtures/
#
# Writes, under $DEST:
#   kineto/tp${NGPU}_<mode>/rank<N>.json.gz   PyTorch-profiler traces, 4 layers, 3 profiled steps
#   truth/<mode>[_nocomm]_rank<N>.json        no-profiler step times with / without the all-reduces
#   kineto/ab/tp${NGPU}_<mode>_<tag>/, truth/ab/  validation runs (tags a–f below): profiled, then timed with /
#                                             without the all-reduces in alternating rounds in the same processes
#   nsys/tp${NGPU}_<mode>.sqlite              nsys exports (both ranks in one file), redacted
#   versions.txt, run.log
# PARTS (default "profiled truth ab nsys") picks the stages; AB_TAGS (default abcdef) the validation variants.
# The one-GPU validation runs (fixtures/kineto/ab/tp1_*) came from
#   NGPU=1 PARTS=ab AB_TAGS=cdef DEST=/tmp/fx examples/make_fixtures.sh   (truths moved to truth/ab/tp1/)
# The committed fixtures were made on a lent 2×H200 machine with exactly:
#   export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
#   DEST=/tmp/fixtures timeout 520 bash examples/make_fixtures.sh > /tmp/mf.log 2>&1
#   tar czf $OUT/fixtures.tgz -C /tmp fixtures
# and, back here, `xz -9` on nsys/tp2_prefill_overlap.sqlite (2.4 MB: exports over 2 MB ship compressed).
# nsys needs libdw.so.1 and libelf.so.1; where the machine lacks them, unpack the Debian packages
# libdw1 and libelf1 into .nsysdeps/ (dpkg -x) and this script puts them on LD_LIBRARY_PATH for nsys.
set -uo pipefail
cd "$(dirname "$0")/.."

export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
NGPU=${NGPU:-2}
PY=${PYTHON:-python3}
DEST=${DEST:-build/fixtures}
NSYS=${NSYS:-$(command -v nsys || echo /opt/nvidia/nsight-compute/2025.3.1/host/target-linux-x64/nsys)}
NSYS_MODES=${NSYS_MODES:-prefill_serial prefill_overlap}
MODES=${MODES:-prefill_serial prefill_overlap decode_eager decode_graphs}
LAYERS=4
PARTS=${PARTS:-profiled truth ab nsys}  # which of the stages below to run
EXTRA=${EXTRA:-}  # extra moe_tp.py options, e.g. smaller sizes for a CPU dry run
RUN="$PY -m torch.distributed.run --nproc-per-node $NGPU examples/moe_tp.py $EXTRA"
TMP=$(mktemp -d)
mkdir -p "$DEST/kineto" "$DEST/truth" "$DEST/nsys"
exec > >(tee -a "$DEST/run.log") 2>&1

{
  echo "date_utc: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader
  $PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', \
'.'.join(map(str, torch.cuda.nccl.version())), 'gpus', torch.cuda.device_count())"
  $PY -c "import nvtx; print('nvtx package', nvtx.__version__)" 2>/dev/null || echo "nvtx package: absent (torch.cuda.nvtx used)"
  "$NSYS" --version 2>/dev/null || echo "nsys: absent"
  nvidia-smi topo -m
} > "$DEST/versions.txt" 2>&1
cat "$DEST/versions.txt"

if [[ " $PARTS " == *" profiled "* ]]; then
  echo "== profiled runs (Kineto)"
  timeout 300 $RUN --mode $MODES --layers $LAYERS --warmup 3 --steps 3 --outdir "$TMP/kineto"
  for mode in $MODES; do
    mkdir -p "$DEST/kineto/tp${NGPU}_$mode"
    for ((r = 0; r < NGPU; r++)); do
      mv "$TMP/kineto/${mode}_rank$r.json.gz" "$DEST/kineto/tp${NGPU}_$mode/rank$r.json.gz"
    done
  done
fi

if [[ " $PARTS " == *" truth "* ]]; then
  echo "== step times without the profiler, with and without the all-reduces"
  timeout 300 $RUN --mode $MODES --layers $LAYERS --no-profile --warmup 5 --steps 30 --truth-dir "$DEST/truth"
  timeout 300 $RUN --mode $MODES --layers $LAYERS --no-profile --comm-off --warmup 5 --steps 30 \
    --truth-dir "$DEST/truth"
fi

echo "== validation runs: profiled, then --ab-rounds with / without the all-reduces in the same processes"
# tag:pin:modes:extra options. fixtures/kineto/ab/tp2_<mode>_a (CPUs not pinned), tp2_<mode>_b (--pin-cpus 4);
# c: decode_eager, the variant without all-reduces profiled too (tp2_decode_eager_c_nocomm);
# d, e, f: decode_hostsync with 16 layers like the shared decode_serial run (d also profiled without, f pinned)
AB_VARIANTS=("a:0:$MODES:" "b:4:decode_eager prefill_serial:" "c:0:decode_eager:--ab-profile-both"
             "d:0:decode_hostsync:--ab-profile-both --layers 16" "e:0:decode_hostsync:--layers 16"
             "f:4:decode_hostsync:--layers 16")
AB_TAGS=${AB_TAGS:-abcdef}  # which of them to run
[[ " $PARTS " == *" ab "* ]] || AB_TAGS=""
for variant in "${AB_VARIANTS[@]}"; do
  IFS=: read -r tag pin modes extra <<< "$variant"
  [[ "$AB_TAGS" == *"$tag"* ]] || continue
  timeout 300 $RUN --mode $modes --layers $LAYERS --warmup 3 --steps 3 --outdir "$TMP/ab_$tag" --ab-rounds 5 \
    --ab-steps 30 --pin-cpus "$pin" --truth-dir "$TMP/ab_truth_$tag" $extra
  for mode in $modes; do
    mkdir -p "$DEST/kineto/ab/tp${NGPU}_${mode}_$tag" "$DEST/truth/ab"
    for ((r = 0; r < NGPU; r++)); do
      mv "$TMP/ab_$tag/${mode}_rank$r.json.gz" "$DEST/kineto/ab/tp${NGPU}_${mode}_$tag/rank$r.json.gz"
      mv "$TMP/ab_truth_$tag/${mode}_ab_rank$r.json" "$DEST/truth/ab/${mode}_${tag}_rank$r.json"
      if [ -f "$TMP/ab_$tag/${mode}_nocomm_rank$r.json.gz" ]; then
        mkdir -p "$DEST/kineto/ab/tp${NGPU}_${mode}_${tag}_nocomm"
        mv "$TMP/ab_$tag/${mode}_nocomm_rank$r.json.gz" "$DEST/kineto/ab/tp${NGPU}_${mode}_${tag}_nocomm/rank$r.json.gz"
      fi
    done
  done
done

if [ -x "$NSYS" ] && [[ " $PARTS " == *" nsys "* ]]; then
  NSYS_ENV=()
  if [ -d .nsysdeps ]; then
    NSYS_ENV=(env "LD_LIBRARY_PATH=$PWD/.nsysdeps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}")
  fi
  for mode in $NSYS_MODES; do
    echo "== nsys: $mode"
    name="tp${NGPU}_$mode"
    timeout 300 "${NSYS_ENV[@]}" "$NSYS" profile -s none --cpuctxsw=none -t cuda,nvtx --force-overwrite true \
      -o "$TMP/$name" $RUN --mode "$mode" --layers $LAYERS --no-profile --warmup 2 --steps 3
    "${NSYS_ENV[@]}" "$NSYS" export --type sqlite --force-overwrite true -o "$DEST/nsys/$name.sqlite" \
      "$TMP/$name.nsys-rep" && $PY examples/redact_nsys.py "$DEST/nsys/$name.sqlite"
  done
fi
ls -laR "$DEST"
