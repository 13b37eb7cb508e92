#!/usr/bin/env bash
# One device call that A/B-times a kernel switch end to end: the fp8 artefact's rows of bench/gpu_quant.py with VAR=0 and VAR=1,
# after the kernels' checks pass with VAR=1, from the repo root of a CUDA machine with onnxruntime-gpu staged into /tmp/site and
# plugins/build/{ort,trt}-include carried:
#   bash bench/gpu_env_ab.sh DEPLOYFUSE_SOME_SWITCH bert  (MODEL default bert; batches 8 and 64)
# Checks with VAR=1: FusedMHA through the C ABI and ORT's CUDA EP (bench/ops_gpu.py), SkipLayerNormFp8, and Fp8GemmAct / Fp8Mlp
# fed by it through ORT's CUDA EP (bench/fp8_gemm_gpu.py). Then the fp8 rows (export, tuning, CUDA-graph timing, kernel classes)
# once per value, each in its own process and work folder, so that the kernels read the switch afresh; the fp16 and torch rows are
# left out: the A/B compares the artefact with itself. Logs and $OUT/env_ab_VAR{0,1}.json under $OUT (default /tmp).
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH="/tmp/site:$PWD:${PYTHONPATH:-}"
OUT=${OUT:-/tmp}
var=${1:?usage: bash bench/gpu_env_ab.sh VAR [MODEL]}
model=${2:-bert}
start=$(date +%s)
source bench/gpu_build.sh
gpu_build deployfuse_ops_cuda deployfuse_ort || exit 1
LIB=$BUILD/libdeployfuse_ops_cuda.so
status=0
export "$var=1"
python3 bench/ops_gpu.py "$LIB" --only FusedMHA --check-only --ort "$BUILD/libdeployfuse_ort.so" > "$OUT/env_ab_mha_checks.log" 2>&1 || status=1
echo "== $var=1: FusedMHA checks $(grep -cE '^check(-yq)? +ok' "$OUT/env_ab_mha_checks.log") ok; $(tail -n 1 "$OUT/env_ab_mha_checks.log")"
python3 bench/fp8_gemm_gpu.py "$LIB" --ort "$BUILD/libdeployfuse_ort.so" --check-only > "$OUT/env_ab_fp8_checks.log" 2>&1 || status=1
echo "== $var=1: fp8 checks (SkipLayerNormFp8 included) $(grep -ciE '\bok\b' "$OUT/env_ab_fp8_checks.log") ok lines; $(tail -n 1 "$OUT/env_ab_fp8_checks.log") ($(( $(date +%s) - start )) s)"
grep -E '^FAIL|FAILED|Error' "$OUT/env_ab_fp8_checks.log" | head -n 10
[ "$status" -eq 0 ] || { echo "checks failed with $var=1: no timing"; exit 1; }
for value in 0 1; do
  export "$var=$value"
  python3 bench/gpu_quant.py --models "$model" --batches 8,64 --gpu-time --skip torch,torchao,fp16-onnx,ablations --runs 200 \
    --ort-library "$BUILD/libdeployfuse_ort.so" --workdir "/tmp/env_ab_$value" > "$OUT/env_ab_${var}${value}.log" 2>&1 || status=1
  cp "/tmp/env_ab_$value/h200_quant.json" "$OUT/env_ab_${var}${value}.json" 2>/dev/null
  echo "== $var=$value timed ($(( $(date +%s) - start )) s)"
done
python3 - "$OUT/env_ab_${var}0.json" "$OUT/env_ab_${var}1.json" "$var" <<'EOF'
import json, sys
off, on = (json.load(open(p)) for p in sys.argv[1:3])
for a in off:
    b = next((r for r in on if (r["model"], r["batch"], r["variant"]) == (a["model"], a["batch"], a["variant"])), None)
    if b and a.get("median_ms") and b.get("median_ms"):
        print(f"{a['model']} b{a['batch']} {a['variant']}: {sys.argv[3]}=0 {a['median_ms']:.4f} ms (GPU {a.get('gpu_ms')}), "
              f"=1 {b['median_ms']:.4f} ms (GPU {b.get('gpu_ms')}): x{b['median_ms'] / a['median_ms']:.3f}")
EOF
exit $status
