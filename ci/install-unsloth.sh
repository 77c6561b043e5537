#!/usr/bin/env bash
# Create a virtual environment at $1 with Unsloth (unsloth and unsloth-zoo 2026.10.9) on the CPU build of
# torch, and pgspec in it.  Usage: ci/install-unsloth.sh /tmp/venv-unsloth
#
# Both packages are installed with --no-deps: their requirements pull triton, xformers, bitsandbytes,
# torchao, cut_cross_entropy and torchvision (GPU kernels and CUDA-only wheels).  The loss module
# (unsloth_zoo.rl_replacements) imports with transformers, datasets and psutil only
# (adapters/unsloth/README.md, "Install").
set -euo pipefail
VENV="${1:?usage: $0 VENV_DIR}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
export PIP_CONSTRAINT="$ROOT/constraints.txt"   # also reaches pip's isolated build environments
python3 -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip
"$VENV/bin/pip" install -q -c "$ROOT/constraints.txt" torch==2.13.0
"$VENV/bin/pip" install -q -c "$ROOT/constraints.txt" --no-deps unsloth-zoo==2026.10.9 unsloth==2026.10.9
# the minimal dependencies of unsloth_zoo.rl_replacements' imports (within unsloth-zoo's own bounds)
"$VENV/bin/pip" install -q -c "$ROOT/constraints.txt" "transformers==5.17.0" "datasets==4.8.5" psutil
"$VENV/bin/pip" install -q --no-deps -e "$ROOT"
"$VENV/bin/pip" install -q -c "$ROOT/constraints.txt" numpy mpmath jsonschema rich pytest "hypothesis>=6.100"
"$VENV/bin/python" -c "import pgspec.adapters.unsloth as a; ad = a.make_adapter(); print(ad.version); print(ad.available())"
