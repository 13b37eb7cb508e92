#!/usr/bin/env bash
# A/B of the CUDA kernels in one run on a CUDA machine: this tree's plugins against another
# revision's, both built here for sm_90 (plugins/build/ort-include and trt-include carried).
#   git archive REV plugins deployfuse | tar -x -C OLD_DIR     (on the machine with the repo; REV at
#                                                               or after f276172: the generic df_run)
#   bash bench/gpu_ops_ab.sh OLD_DIR                 -> full check + benchmark of this tree,
#                                                       then the old kernels' times on the same shapes
set -euo pipefail
export PYTHONUNBUFFERED=1
old="$1"
mkdir -p "$old/plugins/build" && cp -r plugins/build/ort-include plugins/build/trt-include "$old/plugins/build/"
build() {
  cmake -S "$1/plugins" -B "$1/plugins/build/gpu" -G Ninja -DDEPLOYFUSE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DONNXRUNTIME_INCLUDE_DIR="$PWD/plugins/build/ort-include" -DTENSORRT_INCLUDE_DIR="$PWD/plugins/build/trt-include" \
    -DCMAKE_BUILD_TYPE=Release > /dev/null && ninja -C "$1/plugins/build/gpu" > /dev/null
}
build . & build "$old" & wait
PYTHONPATH=$PWD python3 bench/ops_gpu.py plugins/build/gpu/libdeployfuse_ops_cuda.so 2>&1 | grep -v "^check ok" | tee "${OUT:-/tmp}/ops_ab_new.log"
PYTHONPATH=$PWD python3 bench/ops_gpu.py "$old/plugins/build/gpu/libdeployfuse_ops_cuda.so" --time-only 2>&1 | tee "${OUT:-/tmp}/ops_ab_old.log"
