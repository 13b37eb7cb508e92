#!/usr/bin/env bash
# GPU check + benchmark of the deployfuse CUDA kernels; run from the repo root on a CUDA machine
# with plugins/build/ort-include carried (ORT headers; `deployfuse plugins build` fetches them).
#   bash bench/gpu_ops.sh      -> builds plugins/build/gpu, checks every op, prints the tables
set -euo pipefail
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
cmake -S plugins -B plugins/build/gpu -G Ninja -DDEPLOYFUSE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DONNXRUNTIME_INCLUDE_DIR="$PWD/plugins/build/ort-include" -DCMAKE_BUILD_TYPE=Release > /dev/null
ninja -C plugins/build/gpu > /dev/null
PYTHONPATH=$PWD python3 bench/ops_gpu.py plugins/build/gpu/libdeployfuse_ops_cuda.so 2>&1 | tee "${OUT:-/tmp}/ops_gpu.log"
