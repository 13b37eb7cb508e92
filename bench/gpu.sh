#!/usr/bin/env bash
# Everything deployfuse measures on a GPU, from the repo root of a CUDA machine:
#   bash bench/gpu.sh [MODELS] [DTYPES]      e.g. bash bench/gpu.sh bert,vit fp16
# Needs onnxruntime-gpu importable (on the device tool's H200: stage it with
# ../shared/tools/gpu-stage, run each .gpu/pK/stage.sh, then this script adds /tmp/site).
# Results: $OUT (or bench/results) / h200.json and the kernel log.
set -euo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH="/tmp/site:$PWD:${PYTHONPATH:-}"
results="${OUT:-bench/results}"
mkdir -p "$results"
python3 -c "import onnxruntime as o; assert 'CUDAExecutionProvider' in o.get_available_providers(), o.get_available_providers(); print('onnxruntime', o.__version__)"
if [ "${SKIP_OPS:-0}" != 1 ]; then bash bench/gpu_ops.sh; fi
python3 bench/gpu_models.py ${PROFILE:+--profile "$PROFILE"} --models "${1:-bert,vit,gpt2,resnet50}" --dtypes "${2:-fp16,fp32}" --out "$results/h200_$(echo ${1:-all}_${2:-all} | tr , -).json"
