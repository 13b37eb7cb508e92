#!/usr/bin/env bash
# Everything deployfuse measures on a GPU, from the repo root of a CUDA machine:
#   bash bench/gpu.sh [BATCHES] [MODELS] [DTYPES]     e.g. bash bench/gpu.sh headline bert,vit fp16
# BATCHES: headline (8; 32 for ResNet-50), rest, all, or sizes such as 1,64,128.
# Needs onnxruntime-gpu importable (on the device tool's H200: stage it with
# ../shared/tools/gpu-stage, run each .gpu/pK/stage.sh, then this script adds /tmp/site).
# Results: $OUT (or bench/results/run) / h200.json and h200.profile.json, merged over re-runs in
# $BENCH_WORKDIR (default /tmp/deployfuse_bench, which also holds the ONNX files); then
# `python bench/report_h200.py RUN.json ...` makes bench/results/h200.{json,md}.
# MAX_AUTOTUNE=bert:8,resnet50:32 adds torch.compile max-autotune to those rows (minutes each).
# GPU_OPS=1 runs bench/gpu_ops.sh first. BENCH_SRC=DIR imports deployfuse from DIR (e.g. a `git archive`
# of the commit to measure, so edits in progress in the working tree stay out).
set -euo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH="/tmp/site:${BENCH_SRC:+$(realpath "$BENCH_SRC"):}$PWD:${PYTHONPATH:-}"
results="${OUT:-bench/results/run}"
mkdir -p "$results"
python3 -c "import onnxruntime as o, torch; assert 'CUDAExecutionProvider' in o.get_available_providers(), o.get_available_providers(); print('onnxruntime', o.__version__, 'torch', torch.__version__, torch.cuda.get_device_name())"
if [ "${GPU_OPS:-0}" = 1 ]; then bash bench/gpu_ops.sh; fi
python3 bench/gpu_models.py --batches "${1:-headline}" --models "${2:-bert,vit,gpt2,resnet50}" --dtypes "${3:-fp16,fp32}" \
  --max-autotune "${MAX_AUTOTUNE:-none}" --prepare-jobs "${PREPARE_JOBS:-8}" --workdir "${BENCH_WORKDIR:-/tmp/deployfuse_bench}" --out "$results"
