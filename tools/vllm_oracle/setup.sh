#!/usr/bin/env bash
# Creates tools/vllm_oracle/.venv with vLLM (its real v1 scheduler is the oracle).
# PyPI only; the CUDA wheel installs and imports fine on a CPU-only machine
# (no kernel is ever run: the oracle fakes the model runner).
set -euo pipefail
cd "$(dirname "$0")"
VLLM_VERSION="${VLLM_VERSION:-0.33.0}"
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/pip install --upgrade pip >/dev/null
.venv/bin/pip install "vllm==${VLLM_VERSION}"
.venv/bin/python -c "import vllm, sys; print('vllm', vllm.__version__, 'python', sys.version.split()[0])"
