#!/usr/bin/env bash
# Install skyrl-train 0.3.1 for the pgspec `skyrl` adapter into a new virtual environment.
#
#   bash ci/install-skyrl.sh VENV         # then: VENV/bin/pgspec run --adapter skyrl
#
# Every skyrl-train release declares Requires-Python ==3.12.* and its dependency list includes
# flash-attn (an sdist that cannot build on CPU), so skyrl-train is installed with --no-deps
# --ignore-requires-python (its modules run on 3.11), plus the few packages that
# skyrl_train.utils.ppo_utils imports. ray must be 2.51.x: with ray 2.60,
# `from ray.util.placement_group import PlacementGroupSchedulingStrategy` fails at import
# (research install_probe.md).
set -euo pipefail
venv=${1:?usage: bash ci/install-skyrl.sh VENV}
root=$(cd "$(dirname "$0")/.." && pwd)
export PIP_CONSTRAINT="$root/constraints.txt"   # keeps torch on 2.13.0, build environments included
python3 -m venv "$venv"
pip=("$venv/bin/python" -m pip install -c "$PIP_CONSTRAINT")
"${pip[@]}" torch==2.13.0
"${pip[@]}" --no-deps --ignore-requires-python skyrl-train==0.3.1
"${pip[@]}" ray==2.51.1 loguru omegaconf numpy jaxtyping
"${pip[@]}" numpy "mpmath>=1.3,<2" "jsonschema>=4.18" "rich>=13" pytest "hypothesis>=6.100"
"${pip[@]}" --no-deps -e "$root"
"$venv/bin/python" - <<'PY'
import torch
from pgspec.adapters.skyrl import make_adapter
assert torch.__version__.startswith("2.13.0"), torch.__version__
ok, why = make_adapter().available()
assert ok, why
print("skyrl adapter ready:", make_adapter().version, "torch", torch.__version__)
PY
