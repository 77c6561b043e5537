#!/usr/bin/env bash
# Create a venv with verl 0.9.1 on CPU torch for the pgspec verl adapter.
# Usage: ci/install-verl.sh VENV_DIR
# The minimal recipe (shared/research/install_probe.md): verl without its dependencies, then the
# eight packages its loss functions import (ray is imported by verl/__init__ unconditionally).
# Every install goes through constraints.txt (torch==2.13.0) so no CUDA torch can get in.
set -euo pipefail
VENV="${1:?usage: $0 VENV_DIR}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export PIP_CONSTRAINT="$ROOT/constraints.txt"
PIP_ARGS=(-q -c "$PIP_CONSTRAINT")

python3 -m venv "$VENV"
PY="$VENV/bin/python"
# the CPU wheel of torch (the constraints pin the version this machine's pip finds as a CPU wheel)
"$PY" -m pip install "${PIP_ARGS[@]}" torch==2.13.0
"$PY" -m pip install "${PIP_ARGS[@]}" --no-deps verl==0.9.1
"$PY" -m pip install "${PIP_ARGS[@]}" packaging numpy ray "tensordict>=0.8,<=0.10,!=0.9.0" omegaconf \
    "transformers>=5.5.3,<5.11,!=5.6.0" codetiming orjson
# pgspec itself (editable) and its own dependencies
"$PY" -m pip install "${PIP_ARGS[@]}" --no-deps -e "$ROOT"
"$PY" -m pip install "${PIP_ARGS[@]}" numpy mpmath jsonschema rich pytest "hypothesis>=6.100"
# verl's actor loss (verl/workers/utils/losses.py, the loss.* recipes) imports verl.utils.dataset
"$PY" -m pip install "${PIP_ARGS[@]}" datasets pillow

"$PY" - <<'PY'
import torch, importlib.metadata as md
assert torch.__version__.startswith("2.13.0"), torch.__version__
assert not torch.version.cuda, f"a CUDA torch got in: {torch.version.cuda}"
from verl.trainer.ppo import core_algos, rollout_corr_helper  # noqa: F401
print("verl", md.version("verl"), "on torch", torch.__version__)
PY
