#!/usr/bin/env bash
# `make gpu-check`: on a node with an NVIDIA GPU, run the GPU tests (tests/integration/test_gpu.py: placement,
# NCCL, every precision under every backend, several ranks per GPU, exact breakdown) and the GPU
# benchmark (benchmarks/gpu_throughput.py: ResNet-50 against a bare loop, ranks per GPU). Extra
# arguments go to the benchmark, e.g. `make gpu-check ARGS="--repeats 5"`.
set -euo pipefail
PY="${VENV:-.venv}/bin/python"
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "[gpu-check] no NVIDIA GPU is visible here; run make gpu-check on a GPU node" >&2
  exit 2
fi
nvidia-smi -L
"$PY" -c 'import torch; assert torch.cuda.is_available(), "this torch has no CUDA: set TORCH_SPEC to a CUDA build and rerun make setup"'
"$PY" -m pytest -q -ra -m gpu tests/integration/test_gpu.py
"$PY" benchmarks/gpu_throughput.py "$@"
