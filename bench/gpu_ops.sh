#!/usr/bin/env bash
# GPU check + benchmark of the deployfuse CUDA kernels; run from the repo root on a CUDA machine
# with plugins/build/ort-include and plugins/build/trt-include carried (the ORT and TensorRT
# headers `deployfuse plugins build` fetches; the checks' C ABI runs each op's TensorRT adapter).
#   bash bench/gpu_ops.sh      -> builds plugins/build/gpu, checks every registered op, prints the tables
set -euo pipefail
export PYTHONUNBUFFERED=1
for headers in plugins/build/ort-include/onnxruntime_cxx_api.h plugins/build/trt-include/NvInferRuntime.h; do
  [ -f "$headers" ] || { echo "gpu_ops.sh: $headers missing: run 'deployfuse plugins build --cuda on' where they can be fetched, and carry plugins/build/{ort,trt}-include" >&2; exit 2; }
done
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
cmake -S plugins -B plugins/build/gpu -G Ninja -DDEPLOYFUSE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DONNXRUNTIME_INCLUDE_DIR="$PWD/plugins/build/ort-include" -DTENSORRT_INCLUDE_DIR="$PWD/plugins/build/trt-include" \
  -DCMAKE_BUILD_TYPE=Release > /dev/null
ninja -C plugins/build/gpu > /dev/null
# The ORT CUDA EP check runs when `import onnxruntime` finds the CUDA provider (onnxruntime-gpu
# staged, e.g. into /tmp/site on PYTHONPATH).
ORT=()
if python3 -c "import onnxruntime as o, sys; sys.exit('CUDAExecutionProvider' not in o.get_available_providers())" 2>/dev/null; then
  ORT=(--ort plugins/build/gpu/libdeployfuse_ort.so)
else
  echo "onnxruntime has no CUDAExecutionProvider here: ORT CUDA EP check skipped"
fi
PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} python3 bench/ops_gpu.py plugins/build/gpu/libdeployfuse_ops_cuda.so "${ORT[@]}" 2>&1 | tee "${OUT:-/tmp}/ops_gpu.log"
