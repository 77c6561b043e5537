#!/usr/bin/env bash
# Install OpenRLHF 0.11.2 for the pgspec `openrlhf` adapter into a new virtual environment.
#
#   bash ci/install-openrlhf.sh VENV      # then: VENV/bin/pgspec run --adapter openrlhf
#
# A plain `pip install openrlhf` cannot work on a CPU machine: it requires flash-attn 2.8.3, an
# sdist whose setup.py imports torch (and which is CUDA-only anyway). The adapter needs only
# openrlhf/models/loss.py and models/utils.py, which need only torch, so OpenRLHF is installed
# with --no-deps and nothing else of its dependency list (research install_probe.md).
set -euo pipefail
venv=${1:?usage: bash ci/install-openrlhf.sh VENV}
root=$(cd "$(dirname "$0")/.." && pwd)
export PIP_CONSTRAINT="$root/constraints.txt"   # keeps torch on 2.13.0, build environments included
python3 -m venv "$venv"
pip=("$venv/bin/python" -m pip install -c "$PIP_CONSTRAINT")
"${pip[@]}" torch==2.13.0
"${pip[@]}" --no-deps openrlhf==0.11.2
"${pip[@]}" numpy "mpmath>=1.3,<2" "jsonschema>=4.18" "rich>=13" pytest "hypothesis>=6.100"
"${pip[@]}" --no-deps -e "$root"
"$venv/bin/python" - <<'PY'
import torch
from pgspec.adapters.openrlhf import make_adapter
assert torch.__version__.startswith("2.13.0"), torch.__version__
ok, why = make_adapter().available()
assert ok, why
print("openrlhf adapter ready:", make_adapter().version, "torch", torch.__version__)
PY
