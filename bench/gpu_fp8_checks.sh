#!/usr/bin/env bash
# One device call that checks every kernel an fp8 artefact runs on the H200 before its models are timed (bench/gpu_quant.sh),
# from the repo root of a CUDA machine with onnxruntime-gpu staged into /tmp/site and plugins/build/{ort,trt}-include carried:
#   - FusedMHA under each Hopper CTA shape and the sm_80 kernel (DEPLOYFUSE_MHA_TILE=narrow|wide|triple|sm80: each checked, whichever the
#     launcher would pick for a case), then as the launcher picks, through the C ABI and ORT's CUDA EP;
#   - FusedMHA's CTA shapes timed at BERT's, GPT-2's and ViT's attention shapes (bench/ops_gpu.py --mha-tiles), the launcher's and
#     narrow ones also with a CTA a work item (DEPLOYFUSE_MHA_PERSISTENT=0) against the persistent CTAs;
#   - Fp8GemmAct, Fp8Mlp and SkipLayerNormFp8 (bench/fp8_gemm_gpu.py --check-only), which gpu_quant.sh then skips;
#   - SkipLayerNormFp8 timed against ONNX Runtime's SkipLayerNormalization (bench/skip_layer_norm_fp8_gpu.py --time-only).
# MHA=0 leaves FusedMHA's checks and timings out (a session that changed no FusedMHA code: ~100 s of device time); TIMINGS=0 the
# timings (checks alone, before bench/gpu_quant.sh in the same call).
# Logs under $OUT (default /tmp). Exit 1 when a check failed; the timings run either way.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH="/tmp/site:$PWD:${PYTHONPATH:-}"
OUT=${OUT:-/tmp}
start=$(date +%s)
source bench/gpu_build.sh
gpu_build deployfuse_ops_cuda deployfuse_ort || exit 1
LIB=$BUILD/libdeployfuse_ops_cuda.so
status=0
if [ "${MHA:-1}" != 0 ]; then
  for tile in narrow wide triple sm80; do
    size=()  # narrow is new: every case; the others' cases up to 2M (b*sq*sk*hidden), their new YQ epilogue included
    [ "$tile" = narrow ] || size=(--max-size 2000000)
    DEPLOYFUSE_MHA_TILE=$tile python3 bench/ops_gpu.py "$LIB" --only FusedMHA --check-only "${size[@]}" > "$OUT/mha_checks_$tile.log" 2>&1 || status=1
    echo "== FusedMHA checks, $tile CTAs: $(grep -cE '^check(-yq)? +ok' "$OUT/mha_checks_$tile.log") ok; $(tail -n 1 "$OUT/mha_checks_$tile.log") ($(( $(date +%s) - start )) s)"
    grep -vE '^check ok' "$OUT/mha_checks_$tile.log" | grep -iE 'fail|error|mismatch' | head -n 10
  done
  python3 bench/ops_gpu.py "$LIB" --only FusedMHA --check-only --ort "$BUILD/libdeployfuse_ort.so" > "$OUT/mha_checks_auto.log" 2>&1 || status=1
  echo "== FusedMHA checks, the launcher's CTAs, C ABI and ORT CUDA EP: $(tail -n 1 "$OUT/mha_checks_auto.log") ($(( $(date +%s) - start )) s)"
  for tile in $([ "${TIMINGS:-1}" != 0 ] && echo auto auto-1item narrow narrow-1item wide triple sm80); do  # -1item: a CTA a work item (DEPLOYFUSE_MHA_PERSISTENT=0)
    if [ "${tile%-1item}" = auto ]; then unset DEPLOYFUSE_MHA_TILE; else export DEPLOYFUSE_MHA_TILE=${tile%-1item}; fi
    if [ "$tile" != "${tile%-1item}" ]; then export DEPLOYFUSE_MHA_PERSISTENT=0; else unset DEPLOYFUSE_MHA_PERSISTENT; fi
    python3 bench/ops_gpu.py "$LIB" --mha-tiles 2>&1 | grep '^mha-tile' | tee -a "$OUT/mha_tiles.log"
  done
  unset DEPLOYFUSE_MHA_TILE DEPLOYFUSE_MHA_PERSISTENT
  echo "== CTA shapes timed ($(( $(date +%s) - start )) s)"
fi
fp8=0
python3 bench/fp8_gemm_gpu.py "$LIB" --ort "$BUILD/libdeployfuse_ort.so" --check-only > "$OUT/fp8_gemm_checks.log" 2>&1 || fp8=$?
if [ "$fp8" -eq 0 ]; then touch "$BUILD/fp8_checked"; else status=1; fi  # the stamp bench/gpu_quant.sh reads: passed on this build
echo "== fp8 checks rc $fp8: $(grep -ciE '\bok\b' "$OUT/fp8_gemm_checks.log") ok lines ($(( $(date +%s) - start )) s)"
grep -E '^FAIL|FAILED|Error' "$OUT/fp8_gemm_checks.log" | head -n 20
grep -E 'HScale' "$OUT/fp8_gemm_checks.log" | head -n 16  # Fp8Mlp's kept 1/HScale
if [ "${TIMINGS:-1}" != 0 ]; then
  python3 bench/skip_layer_norm_fp8_gpu.py "$LIB" --ort "$BUILD/libdeployfuse_ort.so" --time-only > "$OUT/sln_vs_ort.log" 2>&1
  grep -E '^(\||sln-vs-ort)' "$OUT/sln_vs_ort.log" || tail -n 5 "$OUT/sln_vs_ort.log"
  echo "== SkipLayerNormFp8 timed ($(( $(date +%s) - start )) s)"
fi
exit $status
