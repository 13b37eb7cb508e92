#!/usr/bin/env bash
# GPU check + benchmark of Fp8GemmAct (X quantized to float8 + cuBLASLt fp8 GEMM with fused epilogues); run from the repo
# root on a CUDA machine with plugins/build/ort-include and plugins/build/trt-include carried (the headers
# `deployfuse plugins build` fetches). onnxruntime-gpu staged into ORT_SITE (default /tmp/site) adds the ORT CUDA EP check.
#   bash bench/fp8_gemm_gpu.sh            # build, checks, timings, compute-sanitizer (it prints the build's and the whole run's seconds)
#   bash bench/fp8_gemm_gpu.sh --dry-run  # no GPU: the checks through the CPU kernel (ORT CPU EP), no CUDA build
# Builds plugins/build/gpu for sm_90, then bench/fp8_gemm_gpu.py (checks against the float64 reference of the same
# quantization, every heuristic candidate, CUDA-graph capture, ORT CUDA EP, timings against torch fp16 addmm and
# torch._scaled_mm, full and fast accumulation, the quantize pass alone); compute-sanitizer memcheck over the small
# checks when installed. Logs go to $OUT (default /tmp).
set -euo pipefail
export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
OUT=${OUT:-/tmp}
if [ "${1:-}" = "--dry-run" ]; then
  exec python3 bench/fp8_gemm_gpu.py --dry-run
fi
start=$(date +%s)  # the whole run's (gpu_build's own is local to it)
source bench/gpu_build.sh
gpu_build deployfuse_ops_cuda deployfuse_ort
SITE=${ORT_SITE:-/tmp/site}
[ -d "$SITE" ] && export PYTHONPATH=$SITE:$PYTHONPATH
ORT=()
if python3 -c "import onnxruntime as o, sys; sys.exit('CUDAExecutionProvider' not in o.get_available_providers())" 2>/dev/null; then
  ORT=(--ort "$BUILD/libdeployfuse_ort.so")
else
  echo "onnxruntime has no CUDAExecutionProvider here (stage onnxruntime-gpu into $SITE): ORT CUDA EP check skipped"
fi
status=0
python3 bench/fp8_gemm_gpu.py "$BUILD/libdeployfuse_ops_cuda.so" "${ORT[@]}" 2>&1 | tee "$OUT/fp8_gemm_gpu.log" || status=1
if command -v compute-sanitizer > /dev/null; then
  compute-sanitizer --tool memcheck --error-exitcode 9 python3 bench/fp8_gemm_gpu.py "$BUILD/libdeployfuse_ops_cuda.so" --check-only --small \
    > "$OUT/fp8_sanitize.log" 2>&1 && echo "compute-sanitizer memcheck, small checks: clean" \
    || { echo "compute-sanitizer: rc $?"; status=1; tail -30 "$OUT/fp8_sanitize.log"; }
else
  echo "compute-sanitizer not installed: memcheck skipped"
fi
echo "whole run $(( $(date +%s) - start )) s"
exit $status
