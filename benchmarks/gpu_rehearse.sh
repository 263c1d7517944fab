#!/bin/bash
# The rehearsal of configs/hca2.py:paper (1c) on one GPU, as recorded in BENCHMARKS.md:
# a format-true PASCAL-Context / NYUD-v2 copy at FRACTION of the real split sizes
# (scripts/make_fake_datasets.py, caches included), then scripts/rehearse.py at the
# paper's shapes in bf16 with per-block remat and device augmentation. Figures go to
# $OUT (rehearsal.json, rehearse.log, smi.csv: GPU utilisation and memory each second).
# AUTOTUNE=0 (the default here) compiles without XLA's GPU autotuning (cuBLAS / cuDNN
# heuristics, no Triton GEMM search): at the default level a Swin-T chunk program took
# 270 s to compile on an H200. Usage, from the repository root on the GPU host:
#   OUT=/tmp/out FRACTION=0.02 STEPS=6 LIMIT=480 bash benchmarks/gpu_rehearse.sh
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; FRACTION=${FRACTION:-0.02}; STEPS=${STEPS:-6}; LIMIT=${LIMIT:-480}
AUTOTUNE=${AUTOTUNE:-0}
mkdir -p "$OUT"
if [ "$AUTOTUNE" = 0 ]; then
  export XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_autotune_level=0 --xla_gpu_enable_triton_gemm=false"
fi
echo "XLA_FLAGS=${XLA_FLAGS:-}"
if [ -d .whl ]; then  # wheels the host lacks (grain, ml_collections, ...), carried along
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit 1
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import jax, flax, orbax.checkpoint, grain; print('jax', jax.__version__, 'flax', flax.__version__, jax.devices())" || exit 1
nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader -l 1 \
  > "$OUT/smi.csv" 2>/dev/null &
SMI=$!
t0=$(date +%s)
python3 scripts/make_fake_datasets.py --out=/tmp/fake --datasets=pascal,nyud \
  --fraction="$FRACTION" --cache --quiet || exit 1
echo "data written and cached in $(( $(date +%s) - t0 )) s" | tee "$OUT/data.log"
# The run's timing rows as they come: a command cut at its limit still returns them.
( while sleep 5; do cp /tmp/rehearsal/workdir/timing.jsonl "$OUT/" 2>/dev/null; done ) &
COPY=$!
timeout "$LIMIT" python3 scripts/rehearse.py \
  --config=configs/hca2.py:paper,scenario=pascal_st_nyud_mt_1c \
  --data_dir=/tmp/fake --out=/tmp/rehearsal --steps="$STEPS" --no_feed \
  --config.model.dtype=bfloat16 --config.model.remat=True --config.data.augment=device \
  2>&1 | tee "$OUT/rehearse.log"
echo "rehearsal exit $? after $(( $(date +%s) - t0 )) s"
kill $SMI $COPY 2>/dev/null
cp /tmp/rehearsal/rehearsal.json "$OUT/" 2>/dev/null
cp /tmp/rehearsal/workdir/results.md /tmp/rehearsal/workdir/timing.jsonl "$OUT/" 2>/dev/null
nvidia-smi --query-gpu=memory.used --format=csv,noheader
