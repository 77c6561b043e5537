#!/usr/bin/env bash
# Create the Python 3.12 environment of the fast_llm adapter's worker: the CPU build of torch 2.13.0
# and what Fast-LLM's loss files and the pgspec worker import.  pgspec itself runs in its usual 3.11
# environment and passes --python VENV/bin/python (adapters/fast_llm/README.md).
# Usage: ci/install-fast_llm.sh VENV [PYTHON3.12]
#
# torch for Python 3.12 has no CPU wheel on this machine's disk, and PyPI's default Linux torch is the
# CUDA build (several GB of nvidia-* packages): the constraints file pins the version but not the
# build, so torch comes from the PyTorch CPU index (or TORCH_WHEEL=path/to/torch-2.13.0+cpu-cp312...whl).
set -euo pipefail
VENV="${1:?usage: $0 VENV [PYTHON3.12]}"
PY312="${2:-$(command -v python3.12 || echo "$HOME/.pyenv/versions/3.12.1/bin/python")}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
export PIP_CONSTRAINT="$ROOT/constraints.txt"   # also reaches pip's isolated build environments
TORCH_CPU_INDEX="${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}"
"$PY312" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install -q -c "$PIP_CONSTRAINT")
if [ -n "${TORCH_WHEEL:-}" ]; then
  "${PIP[@]}" "$TORCH_WHEEL"
else
  "${PIP[@]}" --index-url "$TORCH_CPU_INDEX" torch==2.13.0
fi
"${PIP[@]}" numpy pyyaml packaging requests mpmath jsonschema rich "hypothesis>=6.100"
"$VENV/bin/python" - <<'PY'
import sys, torch
assert sys.version_info >= (3, 12), sys.version
assert torch.__version__.startswith("2.13.0") and torch.version.cuda is None, (torch.__version__, torch.version.cuda)
print("python", sys.version.split()[0], "torch", torch.__version__, "(CPU build)")
PY
