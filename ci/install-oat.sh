#!/usr/bin/env bash
# Create a virtual environment at $1 with OAT (oat-llm 0.2.4) on the CPU build of torch, and pgspec in it.
# Usage: ci/install-oat.sh /tmp/venv-oat
#
# oat-llm 0.2.4 declares Requires-Python <3.11 and depends on vllm==0.8.4, deepspeed==0.16.8,
# flash-attn==2.7.4.post1 (CUDA builds) and transformers==4.51.3: it is installed with --no-deps and
# --ignore-requires-python, and the adapter loads oat/algorithms/ppo.py from it with stand-ins for the
# modules its loss never uses (adapters/oat/README.md). The dependencies added are tyro (oat/args.py,
# for PPOArgs, the learner's real configuration class) and tqdm (imported by ppo.py).
set -euo pipefail
VENV="${1:?usage: $0 VENV_DIR}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
export PIP_CONSTRAINT="$ROOT/constraints.txt"   # also reaches pip's isolated build environments
python3 -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip
# the CPU wheel of torch (never a CUDA build on a CPU machine)
"$VENV/bin/pip" install -q -c "$ROOT/constraints.txt" torch==2.13.0
"$VENV/bin/pip" install -q -c "$ROOT/constraints.txt" --no-deps --ignore-requires-python oat-llm==0.2.4
"$VENV/bin/pip" install -q -c "$ROOT/constraints.txt" tyro tqdm
"$VENV/bin/pip" install -q --no-deps -e "$ROOT"
"$VENV/bin/pip" install -q -c "$ROOT/constraints.txt" numpy mpmath jsonschema rich pytest "hypothesis>=6.100"
"$VENV/bin/python" -c "import pgspec.adapters.oat as a; print('oat-llm', a.framework_version()); print(a.make_adapter().available())"
