#!/usr/bin/env bash
# Create a venv at $1 with the CPU build of torch 2.13.0, liger-kernel 0.8.5 and pgspec (editable).
# Usage: ci/install-liger.sh /tmp/venv-liger [--triton]
#   --triton  also install triton 3.9.0 (+ numpy, packaging) for the Triton path
#             (CUDA, or CPU under TRITON_INTERPRET=1); about 1 GB more.
# Needs only the package index; TORCH_WHEEL=path/to/torch-2.13.0+cpu....whl installs a local CPU wheel.
set -euo pipefail
VENV="${1:?usage: $0 VENV_DIR [--triton]}"
REPO="$(cd "$(dirname "$0")/.." && pwd)"
export PIP_CONSTRAINT="$REPO/constraints.txt"      # reaches pip's isolated build envs too: no CUDA torch
python3 -m venv "$VENV"
PIP="$VENV/bin/pip"
"$PIP" install -q --upgrade pip
if [ -n "${TORCH_WHEEL:-}" ]; then
  "$PIP" install -q -c "$PIP_CONSTRAINT" "$TORCH_WHEEL"
else
  "$PIP" install -q -c "$PIP_CONSTRAINT" torch==2.13.0
fi
# The chunked path needs only torch: --no-deps keeps triton (about 1 GB) out.
"$PIP" install -q -c "$PIP_CONSTRAINT" --no-deps liger-kernel==0.8.5
"$PIP" install -q -c "$PIP_CONSTRAINT" numpy mpmath jsonschema rich pytest "hypothesis>=6.100"
"$PIP" install -q --no-deps -e "$REPO"
if [ "${2:-}" = "--triton" ]; then
  "$PIP" install -q -c "$PIP_CONSTRAINT" triton==3.9.0 numpy packaging
fi
"$VENV/bin/python" - <<'PY'
import torch, importlib.metadata as md
assert torch.__version__.startswith("2.13.0"), torch.__version__
print("torch", torch.__version__, "liger-kernel", md.version("liger-kernel"))
from pgspec.conformance.run import runner
ok, why = runner.load_adapter("liger").available()
assert ok, why
PY
