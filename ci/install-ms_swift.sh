#!/usr/bin/env bash
# Create a virtual environment at $1 with ms-swift 4.6.0 on the CPU build of torch, and pgspec in it.
# Usage: ci/install-ms_swift.sh /tmp/venv-ms_swift
#
# ms-swift's own requirements install as they are (none is a CUDA build under the constraints; vllm,
# deepspeed and flash-attn are optional extras it does not require); msgspec is added: 4.6.0 imports it
# (swift/rlhf_trainers/utils.py) without declaring it (adapters/ms_swift/README.md, "Install").
set -euo pipefail
VENV="${1:?usage: $0 VENV_DIR}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
export PIP_CONSTRAINT="$ROOT/constraints.txt"   # also reaches pip's isolated build environments
python3 -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip
"$VENV/bin/pip" install -q -c "$ROOT/constraints.txt" torch==2.13.0
"$VENV/bin/pip" install -q -c "$ROOT/constraints.txt" ms-swift==4.6.0 msgspec
"$VENV/bin/pip" install -q --no-deps -e "$ROOT"
"$VENV/bin/pip" install -q -c "$ROOT/constraints.txt" numpy mpmath jsonschema rich pytest "hypothesis>=6.100"
"$VENV/bin/python" -c "import pgspec.adapters.ms_swift as a; ad = a.make_adapter(); print(ad.version); print(ad.available())"
