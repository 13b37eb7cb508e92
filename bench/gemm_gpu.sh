#!/usr/bin/env bash
# GPU check + benchmark of GemmAct (cuBLASLt GEMM with fused epilogues); run from the repo root on
# a CUDA machine with plugins/build/ort-include and plugins/build/trt-include carried (the headers
# `deployfuse plugins build` fetches).
#   bash bench/gemm_gpu.sh [SRC]   SRC: the source tree to build and check (default: this checkout)
# Builds SRC/plugins/build/gpu for sm_90, then: bench/gemm_gpu.py (checks against the float64
# reference, every heuristic candidate, CUDA-graph capture, timings against torch and an ORT-style
# separate bias kernel); the TensorRT plugin through plugins/tests/trt_driver (IPluginV3 life cycle
# with enqueue, workspace from getWorkspaceSize); compute-sanitizer memcheck over the small checks
# and the plugin enqueues. Logs go to $OUT (default /tmp).
set -euo pipefail
export PYTHONUNBUFFERED=1
ROOT=$PWD
SRC=${1:-$PWD}
OUT=${OUT:-/tmp}
BUILD=$SRC/plugins/build/gpu
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
start=$(date +%s)
cmake -S "$SRC/plugins" -B "$BUILD" -G Ninja -DDEPLOYFUSE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release \
  -DONNXRUNTIME_INCLUDE_DIR="$ROOT/plugins/build/ort-include" -DTENSORRT_INCLUDE_DIR="$ROOT/plugins/build/trt-include" > "$OUT/cmake.log"
ninja -C "$BUILD" deployfuse_ops_cuda deployfuse_trt trt_driver > "$OUT/ninja.log"
echo "built in $(( $(date +%s) - start )) s"
# cuBLASLt is dlopened by soname: outside a torch process (the plugin driver) its wheel's lib folder must be on the path
CUBLAS_LIB=$(python3 -c "import importlib.util, pathlib; s = importlib.util.find_spec('nvidia'); print(':'.join(sorted({str(p.parent) for r in s.submodule_search_locations for p in pathlib.Path(r).glob('*/lib/libcublasLt.so.*')})))")
export LD_LIBRARY_PATH=$CUBLAS_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
cd "$SRC"
PYTHONPATH=$SRC python3 bench/gemm_gpu.py "$BUILD/libdeployfuse_ops_cuda.so" 2>&1 | tee "$OUT/gemm_gpu.log"
rm -rf /tmp/gemm_trt && mkdir -p /tmp/gemm_trt
python3 plugins/tests/trt_driver_check.py "$BUILD/trt_driver" "$BUILD/libdeployfuse_trt.so" --only GemmAct --work /tmp/gemm_trt 2>&1 | tee "$OUT/gemm_trt.log"
if command -v compute-sanitizer > /dev/null; then
  compute-sanitizer --tool memcheck --error-exitcode 9 "$BUILD/trt_driver" "$BUILD/libdeployfuse_trt.so" /tmp/gemm_trt/manifest.txt > "$OUT/sanitize_trt.log" 2>&1 \
    && echo "compute-sanitizer memcheck, TensorRT plugin enqueues: clean" || { echo "compute-sanitizer (plugin): rc $?"; tail -30 "$OUT/sanitize_trt.log"; }
  PYTHONPATH=$SRC compute-sanitizer --tool memcheck --error-exitcode 9 python3 bench/gemm_gpu.py "$BUILD/libdeployfuse_ops_cuda.so" --check-only --small \
    > "$OUT/sanitize_capi.log" 2>&1 && echo "compute-sanitizer memcheck, C ABI small checks: clean" || { echo "compute-sanitizer (C ABI): rc $?"; tail -30 "$OUT/sanitize_capi.log"; }
fi
