#!/usr/bin/env bash
# One device call of native checks, from the repo root of a CUDA machine with onnxruntime-gpu staged
# into /tmp/site and plugins/build/{ort,trt}-include carried:
#   every op through the C ABI and ONNX Runtime's CUDA EP (bench/gpu_ops.sh), GemmAct's candidates,
#   CUDA-graph capture, TensorRT plugin driver and memcheck (bench/gemm_gpu.sh), then memcheck over
#   every op's small cases (bench/gpu_sanitize.sh). Logs under $OUT/ops and $OUT/gemm.
set -uo pipefail
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
base=${OUT:-/tmp/gpu_session}
mkdir -p "$base/ops" "$base/gemm"
start=$(date +%s)
OUT=$base/ops bash bench/gpu_ops.sh > "$base/ops/run.log" 2>&1
echo "== gpu_ops.sh rc $? ($(( $(date +%s) - start )) s)"; grep -vE "^check ok" "$base/ops/run.log" | tail -n 40
OUT=$base/gemm bash bench/gemm_gpu.sh > "$base/gemm/run.log" 2>&1
echo "== gemm_gpu.sh rc $? ($(( $(date +%s) - start )) s)"; grep -iE "fail|error|mismatch|clean|rc |passed|ok:" "$base/gemm/run.log" | tail -n 30
rm -f "$base/gemm/cmake.log" "$base/gemm/ninja.log"
MAX_SIZE=2000000 OUT=$base/ops timeout 240 bash bench/gpu_sanitize.sh > "$base/ops/sanitize.log" 2>&1
echo "== gpu_sanitize.sh rc $? ($(( $(date +%s) - start )) s)"; tail -n 8 "$base/ops/sanitize.log"
