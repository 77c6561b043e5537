#!/usr/bin/env bash
# Create a venv with AReaL 1.0.4 on CPU torch for the pgspec areal adapter.
# Usage: ci/install-areal.sh VENV_DIR
# AReaL 1.0.4 pins torch<2.11 and a very large dependency list (openhands, litellm, swanlab, ...),
# so it is installed with --no-deps, then the packages its import chain actually needs
# (shared/research/install_probe.md: areal/__init__ imports areal.infra -> ray, aiohttp, uvloop,
# flask, openai, ...).  Its loss functions work with torch 2.13.0 (verified by the adapter's run).
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
"$PY" -m pip install "${PIP_ARGS[@]}" --no-deps areal==1.0.4
"$PY" -m pip install "${PIP_ARGS[@]}" numpy uvloop pyyaml hydra-core==1.4.0.dev1 omegaconf==2.4.0.dev2 \
    "transformers>=5.0.0,<=5.3.0" aiohttp httpx colorlog tenacity flask torchdata lark ray numba pillow \
    orjson einops aiofiles openai
# pgspec itself (editable) and its own dependencies
"$PY" -m pip install "${PIP_ARGS[@]}" --no-deps -e "$ROOT"
"$PY" -m pip install "${PIP_ARGS[@]}" numpy mpmath jsonschema rich pytest "hypothesis>=6.100"

"$PY" - <<'PY'
import torch, importlib.metadata as md
assert torch.__version__.startswith("2.13.0"), torch.__version__
assert not torch.version.cuda, f"a CUDA torch got in: {torch.version.cuda}"
from areal.utils.functional import ppo_actor_loss_fn, sapo_loss_fn, apply_rejection_sampling  # noqa: F401
from areal.utils.data import KLEstimator, Normalization  # noqa: F401
print("areal", md.version("areal"), "on torch", torch.__version__)
PY
