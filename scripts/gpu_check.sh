#!/usr/bin/env bash
# Proves ONNX Runtime's GPU path on a host with an NVIDIA GPU (it passed on an H100 with
# onnxruntime-gpu 1.31.1 and no TensorFlow, whose tests then skip: benchmarks/results/gpu.md):
#   1. the GPU tests (tests/gpu: one device copy of the weights for every session, deltas in
#      place on GPU lanes, native-engine GPU lanes for the wire format and for arrays, placement
#      on vs off, buffers released after the last session) and the
#      CPU tests of the same mechanisms;
#   2. benchmarks/bench_gpu.py, which writes benchmarks/results/gpu.{json,md} naming the GPU.
# Needs an environment with the gpu extra (onnxruntime-gpu and PyTorch with CUDA):
#   SP_EXTRAS=gpu,server,dev bash scripts/setup.sh
# Exits 2, saying why, where ONNX Runtime cannot use a GPU. Arguments go to bench_gpu.py
# (e.g. --seconds 5). SERVING_PROCESSOR_PYTHON: the interpreter (default .venv/bin/python).
set -euo pipefail
cd "$(dirname "$0")/.."
py=${SERVING_PROCESSOR_PYTHON:-$PWD/.venv/bin/python}

if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
fi
why=$("$py" -c "from processor.engine.onnx.param_buffers import why_no_gpu; print(why_no_gpu())")
if [ -n "$why" ]; then
    echo "gpu_check: no GPU for ONNX Runtime here: $why" >&2
    echo "gpu_check: on a GPU host: SP_EXTRAS=gpu,server,dev bash scripts/setup.sh" >&2
    exit 2
fi
"$py" -m pytest -q -rs -p no:cacheprovider tests/gpu \
    tests/integration/engine/test_ort_param_buffers.py tests/integration/engine/test_ort_split_graph.py
"$py" -m benchmarks.bench_gpu "$@"
echo "gpu_check: passed; results in benchmarks/results/gpu.md"
