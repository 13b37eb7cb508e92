# Sourced by the GPU scripts (gpu_ops.sh, fp8_gemm_gpu.sh, gpu_quant.sh) from the repo root of a CUDA machine:
#   source bench/gpu_build.sh; gpu_build TARGET...
# builds those targets of the deployfuse CUDA library for sm_90 into $BUILD (plugins/build/gpu), incrementally, with
# the ONNX Runtime and TensorRT headers `deployfuse plugins build` fetches (carried in plugins/build/{ort,trt}-include).
# Logs: $OUT/cmake.log, $OUT/ninja.log (OUT default /tmp). Exit 2 when the headers are missing.
BUILD=$PWD/plugins/build/gpu

gpu_build() {
  local headers start out=${OUT:-/tmp}
  for headers in plugins/build/ort-include/onnxruntime_cxx_api.h plugins/build/trt-include/NvInferRuntime.h; do
    [ -f "$headers" ] || { echo "$headers missing: run 'deployfuse plugins build --cuda on' where they can be fetched, and carry plugins/build/{ort,trt}-include" >&2; exit 2; }
  done
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
  start=$(date +%s)
  cmake -S plugins -B "$BUILD" -G Ninja -DDEPLOYFUSE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release \
    -DONNXRUNTIME_INCLUDE_DIR="$PWD/plugins/build/ort-include" -DTENSORRT_INCLUDE_DIR="$PWD/plugins/build/trt-include" > "$out/cmake.log"
  ninja -C "$BUILD" "$@" > "$out/ninja.log"
  echo "built in $(( $(date +%s) - start )) s"
}
