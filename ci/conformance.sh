#!/usr/bin/env bash
# Framework conformance: install each framework into its own virtual environment, run the pgspec
# suite against it, write docs/conformance/<adapter>.md and the combined docs/conformance/matrix.md.
# Exits non-zero if any run has an unexpected failure, error or stale deviation.
#
#   bash ci/conformance.sh              # all adapters
#   bash ci/conformance.sh trl verl     # some
#
# liger-triton is Liger's Triton kernel (triton_grpo_loss) on CPU under Triton's interpreter
# (TRITON_INTERPRET=1), run from liger's environment (installed with --triton), float32, on the corpus
# without its scale-* cases (LIGER_TRITON_CASES: the interpreter runs one Python step per kernel program,
# so a 32k-token case alone takes minutes); its report is docs/conformance/liger-triton.md.
#
# After each framework's run, its upstream findings (findings/<adapter>/*.py: one standalone script per declared
# bug, the framework and torch only; findings/README.md) run in the same environment through findings/run.py,
# which adds their status to docs/conformance/<adapter>.md. A script that says FIXED (the framework now agrees
# with the spec) or cannot run makes this script exit non-zero, with the line saying which.
#
# PGSPEC_VENV_PATTERN (default ".ci-venvs/%s") places each framework's environment;
# PGSPEC_SKIP_INSTALL=1 reuses environments that already exist there.
#
# pgspec itself (the torch run, the isolated runs and the matrix) runs from its own environment,
# $venvs/pgspec, which this script makes (README's install command, with the torch extra); it needs
# nothing installed beforehand but python3.
set -uo pipefail
cd "$(dirname "$0")/.."
export PIP_CONSTRAINT="$PWD/constraints.txt"   # no CUDA build of torch, even in build environments
out=docs/conformance
json_dir=${PGSPEC_JSON_DIR:-$(mktemp -d)}   # the runs' JSON reports (the matrix is made from them)
venvs=${PGSPEC_VENVS:-.ci-venvs}
mkdir -p "$out" "$venvs"
main=$venvs/pgspec
if [ "${PGSPEC_SKIP_INSTALL:-0}" = 1 ] && [ -x "$main/bin/pgspec" ]; then
  echo "reusing $main"
else
  python3 -m venv "$main" && "$main/bin/pip" install -q -c constraints.txt -e ".[torch]" || {
    echo "ci/conformance.sh: installing pgspec into $main failed" >&2
    exit 2
  }
fi
pgspec=$main/bin/pgspec
adapters=("$@")
[ ${#adapters[@]} -gt 0 ] || adapters=(torch trl liger liger-triton verl openrlhf skyrl areal oat unsloth ms_swift)
# every case ID except */scale-* (the runner's globs have no negation: no case name but scale-* starts with "sc")
LIGER_TRITON_CASES=${LIGER_TRITON_CASES:-'*/[!s]*,*/s[!c]*'}
# adapters run from the main environment through the process-isolated mode (--python)
isolated=" areal "
status=0
# findings ADAPTER PYTHON [SOURCE]: the adapter's finding scripts in that interpreter (against SOURCE, a
# git-only framework's checkout); their status goes into the adapter's page
findings() {
  [ -d "findings/$1" ] || return 0
  echo "--- findings/$1: the standalone bug scripts, in $2"
  local rc=0
  "$main/bin/python" findings/run.py "$1" --python "$2" ${3:+--source "$3"} --markdown "$out/$1.md" || rc=$?
  if [ $rc = 1 ]; then
    echo "ci/conformance.sh: a finding of $1 no longer reproduces (FIXED above): the framework now agrees with the" \
      "spec there; drop its rule, its script and its report in docs/findings.md" >&2
  elif [ $rc != 0 ]; then
    echo "ci/conformance.sh: findings/$1: a script could not run (above)" >&2
  fi
  [ $rc = 0 ] || status=1
}
for name in "${adapters[@]}"; do
  echo "=== $name"
  reports=(--report "md:$out/$name.md" --report "json:$json_dir/$name.json")
  if [ "$name" = torch ]; then
    "$pgspec" run --adapter torch "${reports[@]}" || status=1
    continue
  fi
  # liger's environment holds triton too (--triton); liger-triton runs from it
  env_name=$name install_args=()
  case "$name" in liger|liger-triton) env_name=liger install_args=(--triton) ;; esac
  venv=$(printf "${PGSPEC_VENV_PATTERN:-$venvs/%s}" "$env_name")
  start=$(date +%s)
  if [ "${PGSPEC_SKIP_INSTALL:-0}" = 1 ] && [ -x "$venv/bin/python" ]; then
    echo "reusing $venv"
  elif [ "$name" = liger-triton ] && "$venv/bin/python" -c "import triton, liger_kernel" 2>/dev/null; then
    echo "reusing $venv (installed for liger with --triton)"
  elif ! bash "ci/install-$env_name.sh" "$venv" "${install_args[@]}"; then
    echo "ci/conformance.sh: installing $name failed" >&2
    status=1
    continue
  fi
  echo "installed $name in $(( $(date +%s) - start )) s"
  if [ "$name" = liger-triton ]; then
    start=$(date +%s)
    TRITON_INTERPRET=1 "$venv/bin/pgspec" run --adapter pgspec.adapters.liger:make_triton_adapter --dtype float32 \
      --formulas "$LIGER_TRITON_CASES" --no-properties "${reports[@]}" || status=1
    # the kernel's loop over the vocabulary (blocks of 4,096) on the logits of a linear head, V = 9000
    TRITON_INTERPRET=1 "$venv/bin/pgspec" check --adapter pgspec.adapters.liger:make_triton_adapter --formula loss.grpo \
      --param beta=0 --vocab 9000 --shape 2x32 --dtype bfloat16,float32 || status=1
    # the fused float64 log-prob oracle (conformance/check/logprob_fused.py) against the torch oracle, under the
    # interpreter: triton is not in the [dev] extra, so its tests skip in the main environment and run here
    "$venv/bin/python" -m pytest tests/test_check_logprob_fused.py -q || status=1
    # and the log-prob and head-loss checks' own tests (the oracle's scales against the mpmath reference's on the
    # same composites, a correct kernel passing, wrong ones failing) with the fused oracle in place of the torch one
    TRITON_INTERPRET=1 PGSPEC_LOGPROB_ORACLE=fused "$venv/bin/python" -m pytest tests/test_check.py \
      tests/test_check_head_loss.py -q -k "logprob or vocab or head or logit" || status=1
    # bench/gpu_check.sh's rows at tiny sizes with Liger's own kernels (TRL's rows with a stand-in): about 100 s
    OUT="$(mktemp -d)" PYTHON="$venv/bin/python" bash bench/gpu_check.sh --dry-run || status=1
    # the finding scripts set TRITON_INTERPRET=1 themselves when there is no GPU
    findings liger-triton "$venv/bin/python"
    echo "liger-triton (TRITON_INTERPRET=1) ran in $(( $(date +%s) - start )) s"
  elif [[ "$isolated" == *" $name "* ]]; then
    "$pgspec" run --adapter "$name" --python "$venv/bin/python" "${reports[@]}" || status=1
  else
    "$venv/bin/pgspec" run --adapter "$name" "${reports[@]}" || status=1
  fi
  if [ "$name" = trl ]; then
    # TRL's fused LM head (its chunked log-prob kernel) against the float64 oracle, at a CPU's size
    "$venv/bin/pgspec" check --adapter trl --formula logprob.token --vocab 2000 --shape 2x64 || status=1
  elif [ "$name" = liger ]; then
    # the log-prob step of Liger's fused linear GRPO loss (chunk_forward, adapters/liger/head.py) against the
    # float64 oracle; V = 9000 spans three of its 4,096-wide vocabulary chunks
    "$venv/bin/pgspec" check --adapter pgspec.adapters.liger:make_fused_adapter --formula logprob.token \
      --vocab 9000 --shape 2x64 --dtype bfloat16,float32 || status=1
    # and LigerFusedLinearGRPOLoss whole, from hidden states and the head (conformance/check/head_loss.py)
    "$venv/bin/pgspec" check --adapter pgspec.adapters.liger:make_fused_adapter --formula loss.grpo --param beta=0 \
      --vocab 9000 --shape 2x128 --dtype bfloat16,float32 || status=1
    # the compiled default path (LigerFusedLinearGRPOLoss(compiled=True)): its run is recorded
    # (docs/conformance/liger-compiled.md), its finding script runs here, in liger's environment
    findings liger-compiled "$venv/bin/python"
  elif [ "$name" = oat ]; then
    # OAT's fused LM head (FusedLinear; use_fused_lm_head=True is OAT's default) against the float64
    # oracle; 2x300 = 600 tokens span two of its 512-token chunks
    "$venv/bin/pgspec" check --adapter oat --formula logprob.token --vocab 2000 --shape 2x300 \
      --dtype bfloat16,float32 || status=1
  fi
  [ "$name" = liger-triton ] || findings "$name" "$venv/bin/python"
done
"$main/bin/python" -m pgspec.conformance.matrix "$json_dir"/*.json --out "$out/matrix.md" || status=1
exit $status
