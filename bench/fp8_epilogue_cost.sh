#!/usr/bin/env bash
# The cost of cuBLASLt's fp8 epilogues (bench/fp8_epilogue_cost.cu) on a CUDA machine, from the repo root:
#   bash bench/fp8_epilogue_cost.sh          # builds with nvcc against the cuBLASLt found on the machine, runs M = 1024 and 8192
# Output: stdout and $OUT/fp8_epilogue_cost.log (OUT default /tmp).
set -euo pipefail
OUT=${OUT:-/tmp}
lib=$(find / -name 'libcublasLt.so.13' -not -path '/proc/*' 2>/dev/null | head -1 || true)
header=$(find / -name 'cublasLt.h' -not -path '/proc/*' 2>/dev/null | head -1 || true)
[ -n "$lib" ] && [ -n "$header" ] || { echo "no cuBLASLt 13 (libcublasLt.so.13 and cublasLt.h) on this machine" >&2; exit 2; }
nvcc -O3 -std=c++17 -arch=sm_90a bench/fp8_epilogue_cost.cu -I"$(dirname "$header")" -L"$(dirname "$lib")" -l:libcublasLt.so.13 -o /tmp/fp8_epilogue_cost
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/fp8_epilogue_cost.log"
for m in 1024 8192; do LD_LIBRARY_PATH=$(dirname "$lib") /tmp/fp8_epilogue_cost "$m" | tee -a "$OUT/fp8_epilogue_cost.log"; done
