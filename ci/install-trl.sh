#!/usr/bin/env bash
# Create a virtual environment at $1 with TRL 1.16.0 on the CPU build of torch, and pgspec in it.
# Usage: ci/install-trl.sh /tmp/venv-trl
set -euo pipefail
VENV="${1:?usage: $0 VENV_DIR}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
export PIP_CONSTRAINT="$ROOT/constraints.txt"   # also reaches pip's isolated build environments
python3 -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip
# the CPU wheel of torch (never a CUDA build on a CPU machine: the constraints pin the version the
# machine's pip finds as a CPU wheel)
"$VENV/bin/pip" install -q -c "$ROOT/constraints.txt" torch==2.13.0
"$VENV/bin/pip" install -q -c "$ROOT/constraints.txt" trl==1.16.0
"$VENV/bin/pip" install -q --no-deps -e "$ROOT"
"$VENV/bin/pip" install -q -c "$ROOT/constraints.txt" numpy mpmath jsonschema rich pytest "hypothesis>=6.100"
"$VENV/bin/python" -c "import trl, pgspec.adapters.trl as a; print('trl', trl.__version__); print(a.make_adapter().available())"
