#!/usr/bin/env bash
# Framework conformance: install each framework into its own virtual environment, run the pgspec
# suite against it, write docs/conformance/<adapter>.md and the combined docs/conformance/matrix.md.
# Exits non-zero if any run has an unexpected failure, error or stale deviation.
#
#   bash ci/conformance.sh              # all adapters
#   bash ci/conformance.sh trl verl     # some
#
# PGSPEC_VENV_PATTERN (default ".ci-venvs/%s") places each framework's environment;
# PGSPEC_SKIP_INSTALL=1 reuses environments that already exist there.
#
# Run it from an environment where pgspec is installed (README: install command).
set -uo pipefail
cd "$(dirname "$0")/.."
export PIP_CONSTRAINT="$PWD/constraints.txt"   # no CUDA build of torch, even in build environments
out=docs/conformance
json_dir=${PGSPEC_JSON_DIR:-$(mktemp -d)}   # the runs' JSON reports (the matrix is made from them)
venvs=${PGSPEC_VENVS:-.ci-venvs}
mkdir -p "$out" "$venvs"
adapters=("$@")
[ ${#adapters[@]} -gt 0 ] || adapters=(torch trl liger verl openrlhf skyrl areal)
# adapters run from the main environment through the process-isolated mode (--python)
isolated=" areal "
status=0
for name in "${adapters[@]}"; do
  echo "=== $name"
  reports=(--report "md:$out/$name.md" --report "json:$json_dir/$name.json")
  if [ "$name" = torch ]; then
    pgspec run --adapter torch "${reports[@]}" || status=1
    continue
  fi
  venv=$(printf "${PGSPEC_VENV_PATTERN:-$venvs/%s}" "$name")
  start=$(date +%s)
  if [ "${PGSPEC_SKIP_INSTALL:-0}" = 1 ] && [ -x "$venv/bin/python" ]; then
    echo "reusing $venv"
  elif ! bash "ci/install-$name.sh" "$venv"; then
    echo "ci/conformance.sh: installing $name failed" >&2
    status=1
    continue
  fi
  echo "installed $name in $(( $(date +%s) - start )) s"
  if [[ "$isolated" == *" $name "* ]]; then
    pgspec run --adapter "$name" --python "$venv/bin/python" "${reports[@]}" || status=1
  else
    "$venv/bin/pgspec" run --adapter "$name" "${reports[@]}" || status=1
  fi
  if [ "$name" = trl ]; then
    # TRL's fused LM head (its chunked log-prob kernel) against the float64 oracle, at a CPU's size
    "$venv/bin/pgspec" check --adapter trl --formula logprob.token --vocab 2000 --shape 2x64 || status=1
  fi
done
python -m pgspec.conformance.matrix "$json_dir"/*.json --out "$out/matrix.md" || status=1
exit $status
