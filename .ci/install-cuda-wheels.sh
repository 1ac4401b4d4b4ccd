#!/usr/bin/env bash
# Installs a pinned CUDA 13.2 compiler from PyPI's wheels into a cached virtualenv, for
# `cargo check --features cuda` on a machine without a GPU, and prints the environment to
# export (eval its output). No driver, no GPU and no linking are needed for `check`/`clippy`.
#   eval "$(bash .ci/install-cuda-wheels.sh [CACHE_DIR])"
# 13.2: cudarc 0.19's `cuda-version-from-build-system` knows CUDA versions up to 13.2.
set -euo pipefail
CACHE="${1:-${OXALIGN_CUDA_CACHE:-$HOME/.cache/oxalign-cuda-13.2}}"
if [ ! -x "$CACHE/venv/bin/python" ]; then
  python3 -m venv "$CACHE/venv" >&2
fi
if ! ls -d "$CACHE"/venv/lib/python3*/site-packages/nvidia/cu13/bin/nvcc >/dev/null 2>&1; then
  "$CACHE/venv/bin/pip" install -q "nvidia-cuda-nvcc==13.2.*" "nvidia-cuda-runtime==13.2.*" \
      "nvidia-cuda-cccl==13.2.*" "nvidia-cuda-crt==13.2.*" "nvidia-nvvm==13.2.*" >&2
fi
C=$(ls -d "$CACHE"/venv/lib/python3*/site-packages/nvidia/cu13)
"$C/bin/nvcc" --version | tail -1 >&2
# CUDA_COMPUTE_CAP keeps candle-kernels' build from calling nvidia-smi.
echo "export PATH=\"$C/bin:\$PATH\" CUDA_HOME=\"$C\" CUDA_PATH=\"$C\" CUDA_COMPUTE_CAP=90"
