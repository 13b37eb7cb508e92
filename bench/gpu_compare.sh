#!/usr/bin/env bash
# `deployfuse compare` on a GPU: the README's tiny BERT exported for ort-cuda, compared on
# PyTorch (CUDA) against ONNX Runtime's CUDA EP and CPU EP. Needs onnxruntime-gpu (see bench/gpu.sh).
set -euo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH="/tmp/site:$PWD:${PYTHONPATH:-}"
out="${OUT:-/tmp}"
python3 -m deployfuse export examples.tiny_bert:build -o "$out/tiny_bert_cuda.onnx" --target ort-cuda -q
python3 -m deployfuse compare examples.tiny_bert:build "$out/tiny_bert_cuda.onnx" \
  --backends torch,ort-cuda,ort-cpu --torch-device cuda --iterations 50 --json "$out/compare_cuda.json"
