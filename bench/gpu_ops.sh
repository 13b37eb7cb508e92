#!/usr/bin/env bash
# GPU check + benchmark of the deployfuse CUDA kernels; run from the repo root on a CUDA machine
# with plugins/build/ort-include and plugins/build/trt-include carried (the ORT and TensorRT
# headers `deployfuse plugins build` fetches; the checks' C ABI runs each op's TensorRT adapter).
#   bash bench/gpu_ops.sh      -> builds plugins/build/gpu, checks every registered op, prints the tables
#   bash bench/gpu_ops.sh --only FusedMHA   -> the same for FusedMHA alone (arguments go to bench/ops_gpu.py)
set -euo pipefail
export PYTHONUNBUFFERED=1
source bench/gpu_build.sh
gpu_build
# The ORT CUDA EP check runs when `import onnxruntime` finds the CUDA provider (onnxruntime-gpu
# staged, e.g. into /tmp/site on PYTHONPATH).
ORT=()
if python3 -c "import onnxruntime as o, sys; sys.exit('CUDAExecutionProvider' not in o.get_available_providers())" 2>/dev/null; then
  ORT=(--ort "$BUILD/libdeployfuse_ort.so")
else
  echo "onnxruntime has no CUDAExecutionProvider here: ORT CUDA EP check skipped"
fi
PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} python3 bench/ops_gpu.py "$BUILD/libdeployfuse_ops_cuda.so" "${ORT[@]}" "$@" 2>&1 | tee "${OUT:-/tmp}/ops_gpu.log"
