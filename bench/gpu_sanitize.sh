#!/usr/bin/env bash
# compute-sanitizer memcheck and racecheck over the small check cases of every op (bench/ops_gpu.py
# --check-only --max-size), deployfuse kernels only; run after bench/gpu_ops.sh has built
# plugins/build/gpu. ONLY=FusedMHA,GroupNormAct limits the ops. Exits non-zero on the first error.
set -euo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
for tool in memcheck racecheck; do
  echo "== compute-sanitizer --tool $tool"
  compute-sanitizer --tool "$tool" --kernel-name kns=deployfuse --error-exitcode 3 \
    python3 bench/ops_gpu.py plugins/build/gpu/libdeployfuse_ops_cuda.so --check-only --max-size "${MAX_SIZE:-40000000}" ${ONLY:+--only "$ONLY"} \
    2>&1 | grep -v "^check ok" | tee "${OUT:-/tmp}/sanitize_$tool.log"
done
