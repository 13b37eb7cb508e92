#!/usr/bin/env bash
# FP8 end to end on the H200 (issue 19), from the repo root of a CUDA machine with plugins/build/{ort,trt}-include
# carried and onnxruntime-gpu (+ torchao) staged in /tmp/site (../shared/tools/gpu-stage onnxruntime-gpu polygraphy torchao):
#   bash bench/gpu_quant.sh MODELS [bench/gpu_quant.py options]      e.g. bash bench/gpu_quant.sh bert --skip torchao
# Builds plugins/build/gpu for sm_90 (bench/gpu_build.sh), checks Fp8GemmAct and Fp8Mlp against their float64
# references through its C ABI and ONNX Runtime's CUDA EP (bench/fp8_gemm_gpu.py --check-only, until it passes on that build), then runs
# bench/gpu_quant.py at batches 8 and 64, torch.compile in reduce-overhead mode (the faster of the two modes for fp16
# and torchao in bench/results/h200_quant*.json), CUPTI kernel classes per row (--gpu-time). Results: $OUT (default /tmp).
set -euo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH="/tmp/site:$PWD:${PYTHONPATH:-}"
OUT=${OUT:-/tmp}
models=${1:?usage: bash bench/gpu_quant.sh MODELS [gpu_quant.py options]}
shift
source bench/gpu_build.sh
gpu_build deployfuse_ops_cuda deployfuse_ort  # incremental: ninja does nothing when nothing changed
# Checked again after either library changed (the C ABI the checks and the tuner drive is in libdeployfuse_ops_cuda.so alone);
# a failed check is run again next time, not skipped.
if [ ! "$BUILD/fp8_checked" -nt "$BUILD/libdeployfuse_ort.so" ] || [ ! "$BUILD/fp8_checked" -nt "$BUILD/libdeployfuse_ops_cuda.so" ]; then
  python3 bench/fp8_gemm_gpu.py "$BUILD/libdeployfuse_ops_cuda.so" --ort "$BUILD/libdeployfuse_ort.so" --check-only 2>&1 | tee "$OUT/fp8_gemm_checks.log"
  touch "$BUILD/fp8_checked"
fi
python3 bench/gpu_quant.py --models "$models" --batches 8,64 --compile-modes reduce-overhead --gpu-time \
  --ort-library "$BUILD/libdeployfuse_ort.so" --out "$OUT" "$@"
