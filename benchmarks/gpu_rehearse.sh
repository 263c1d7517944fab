#!/bin/bash
# The rehearsal of configs/hca2.py:paper (1c) on one GPU, as recorded in BENCHMARKS.md:
# a format-true PASCAL-Context / NYUD-v2 copy at FRACTION of the real split sizes
# (scripts/make_fake_datasets.py, caches included), then scripts/rehearse.py at the
# paper's shapes in bf16 with per-block remat and device augmentation. Figures go to
# $OUT (rehearsal.json, rehearse.log). Usage, from the repository root on the GPU host:
#   OUT=/tmp/out FRACTION=0.05 STEPS=6 bash benchmarks/gpu_rehearse.sh
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; FRACTION=${FRACTION:-0.05}; STEPS=${STEPS:-6}
mkdir -p "$OUT"
if [ -d .whl ]; then  # wheels the host lacks (grain, ml_collections, ...), carried along
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit 1
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import jax, flax, orbax.checkpoint, grain; print('jax', jax.__version__, 'flax', flax.__version__, jax.devices())" || exit 1
t0=$(date +%s)
python3 scripts/make_fake_datasets.py --out=/tmp/fake --datasets=pascal,nyud \
  --fraction="$FRACTION" --cache --quiet || exit 1
echo "data written and cached in $(( $(date +%s) - t0 )) s"
python3 scripts/rehearse.py --config=configs/hca2.py:paper,scenario=pascal_st_nyud_mt_1c \
  --data_dir=/tmp/fake --out=/tmp/rehearsal --steps="$STEPS" \
  --config.model.dtype=bfloat16 --config.model.remat=True --config.data.augment=device \
  2>&1 | tee "$OUT/rehearse.log"
cp /tmp/rehearsal/rehearsal.json /tmp/rehearsal/workdir/results.md /tmp/rehearsal/workdir/timing.jsonl "$OUT/" 2>/dev/null
nvidia-smi --query-gpu=memory.used --format=csv,noheader
