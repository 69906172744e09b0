#!/usr/bin/env bash
# One short GPU check (well under 8 minutes on an H100/H200): probe and micro-benchmarks, a
# generation sweep and a training sweep of a ~1B-parameter model (random weights, bf16), the
# fit when scipy is present, and the profile written to $OUT (or ./reports/).
#
# Needs torch (CUDA), transformers, click, rich, pandas, psutil, nvidia-ml-py. pydantic is
# not on every GPU image: put its wheels in .whl/ (see docs/gpu.md) and they
# are installed into a private folder first. plotly is not needed: render the report from
# the returned profile afterwards (throughputlab report PROFILE -o report.html).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT_DIR="${OUT:-./reports}"
mkdir -p "$OUT_DIR"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/tl-site .whl/*.whl
  export PYTHONPATH="/tmp/tl-site:${PYTHONPATH:-}"
fi
export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
MODEL="${MODEL:-llama3.2-1b}"
GPU=$(python3 -c "import torch; n=torch.cuda.get_device_name(0); print(''.join(c if c.isalnum() else '-' for c in n).strip('-').lower())")
STAMP=$(date +%Y%m%d)
PROFILE="$OUT_DIR/${GPU}-${MODEL}-${STAMP}.json"
LOG="$OUT_DIR/validate-${GPU}-${STAMP}.log"
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv || true
  python3 -m throughputlab hardware --device cuda
  # Generation: 1 -> 512 sequences; prompt 512, 128 new tokens. Training: seq 2048, micro-batch 1 -> auto until OOM/flat.
  timeout 330 python3 -m throughputlab bench --model "$MODEL" --device cuda --dtype bfloat16 \
      --concurrency 1,2,4,8,16,32,64,128,256,512 --prompt-len 512 --output-len 128 \
      --batch-sizes auto --auto-cap 64 --seq-len 2048 --repeats 1 --rounds 3 --warmup 1 --force -o "$PROFILE" \
    || echo "bench exited with $? (partial profile kept in $PROFILE)"
  python3 -m throughputlab export "$PROFILE" --what generation -o "$OUT_DIR/${GPU}-${MODEL}-${STAMP}-generation.csv" || true
  if python3 -c "import scipy" 2>/dev/null; then
    python3 -m throughputlab fit "$PROFILE" || echo "fit failed with $?"
  fi
} 2>&1 | tee "$LOG"
echo "profile: $PROFILE"
