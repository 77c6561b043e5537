#!/usr/bin/env bash
# Create the Python 3.12 environment of the fast_llm adapter's worker: the CPU build of torch 2.13.0
# and what Fast-LLM's loss files and the pgspec worker import.  pgspec itself runs in its usual 3.11
# environment and passes --python VENV/bin/python (adapters/fast_llm/README.md).
# Usage: ci/install-fast_llm.sh VENV [PYTHON3.12]
#
# Not needed for the other way to run Fast-LLM: on Python 3.11, in pgspec's own environment (its CPU
# torch; Fast-LLM's loss path needs numpy and pyyaml besides), with
# PGSPEC_FAST_LLM_COMPAT=pep695, which imports the checkout through pgspec's line-preserving PEP 695
# rewrite (adapters/fast_llm/pep695.py).  The recorded pages were made that way, on machines without a
# CPU torch for 3.12 (adapters/fast_llm/README.md, "Recording the pages").
#
# PyPI's Linux torch is the CUDA build (4.7 GB with its nvidia-* packages); constraints.txt pins the
# version (2.13.0), which the CUDA build also satisfies, so the recipe names the CPU build itself:
# torch==2.13.0+cpu, a version only the PyTorch CPU index has (TORCH_CPU_INDEX), or a wheel file of it
# (TORCH_WHEEL=path/to/torch-2.13.0+cpu-cp312-cp312-manylinux_2_28_x86_64.whl).  torch goes in first and
# alone; the other packages then find it installed.  Before it ends, the script fails if the
# environment holds a CUDA torch or any nvidia-* / triton package.
set -euo pipefail
VENV="${1:?usage: $0 VENV [PYTHON3.12]}"
# python3.12 on the PATH if it runs (a pyenv shim of a version not selected does not), else pyenv's 3.12.1
PY312="${2:-$(python3.12 -c 'import sys; print(sys.executable)' 2>/dev/null || echo "$HOME/.pyenv/versions/3.12.1/bin/python")}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
export PIP_CONSTRAINT="$ROOT/constraints.txt"   # also reaches pip's isolated build environments
TORCH_CPU_INDEX="${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}"
"$PY312" -c 'import sys; assert sys.version_info[:2] == (3, 12), sys.version' \
  || { echo "$0: $PY312 is not a Python 3.12 (Fast-LLM needs >= 3.12; torch 2.13.0+cpu is built for 3.12)" >&2; exit 2; }
"$PY312" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install -q -c "$PIP_CONSTRAINT")
if [ -n "${TORCH_WHEEL:-}" ]; then
  case "$(basename "$TORCH_WHEEL")" in
    torch-2.13.0+cpu-cp312-*.whl) ;;
    *) echo "$0: TORCH_WHEEL must be torch-2.13.0+cpu-cp312-*.whl (the CPU build for Python 3.12), got $TORCH_WHEEL" >&2; exit 2 ;;
  esac
  "${PIP[@]}" "$TORCH_WHEEL"
else
  "${PIP[@]}" --only-binary torch --index-url "$TORCH_CPU_INDEX" "torch==2.13.0+cpu" \
    || { echo "$0: torch==2.13.0+cpu for Python 3.12 could not be installed from $TORCH_CPU_INDEX" \
              "(unreachable?); set TORCH_CPU_INDEX to a mirror of it, or TORCH_WHEEL to the wheel file" >&2; exit 1; }
fi
"${PIP[@]}" numpy pyyaml packaging requests mpmath jsonschema rich "hypothesis>=6.100"
"$VENV/bin/python" - <<'PY'
import sys
from importlib.metadata import distributions

import torch

assert sys.version_info >= (3, 12), sys.version
assert torch.__version__ == "2.13.0+cpu" and torch.version.cuda is None, (torch.__version__, torch.version.cuda)
cuda = sorted(d.metadata["Name"] for d in distributions()
              if d.metadata["Name"].lower().startswith(("nvidia-", "nvidia_", "triton", "cuda-")))
assert not cuda, f"CUDA packages in the Fast-LLM environment: {cuda}"
print("python", sys.version.split()[0], "torch", torch.__version__, "(CPU build, no nvidia-* package)")
PY
