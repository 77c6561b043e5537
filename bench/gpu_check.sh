#!/usr/bin/env bash
# pgspec on CUDA at production size (issues 12 and 41), as one script for one GPU session (15 minutes of an H200):
#
# - the fused float64 log-prob oracle (conformance/check/logprob_fused.py): its agreement with the torch oracle on
#   the GPU's compiled kernels, and its time beside TRL's kernel at 256 x 32768, V = 151936
#   (bench/logprob_oracle_cost.py; issue 41's goal: oracle / kernel <= 1);
# - `pgspec check` of TRL's chunked log-prob kernel and of the log-prob step of Liger's fused linear loss at
#   V = 151936 (conformance/check/logprob.py, the fused oracle now), Liger's fused linear losses from hidden states
#   (loss.grpo with and without its KL term, loss.gspo, loss.sapo, loss.vespo with the sampler's log-probs;
#   conformance/check/head_loss.py), triton_grpo_loss on the head's logits, and both Liger kernels on every loss
#   type through the vocabulary-of-two construction (adapters/liger/construct.py), each in float32 and bfloat16
#   (one step for both: one evaluation of the oracle);
# - `pgspec run --device cuda` of the golden corpus for the built-in backend and for Liger.
#
#   bash bench/gpu_check.sh [full]            on one CUDA GPU
#   bash bench/gpu_check.sh --dry-run         on a CPU, every row at tiny sizes (bench/gpu_check_dry.py: rows whose
#                                             framework is not installed run a stand-in kernel); `small` is the same
#   bash bench/gpu_check.sh --list [--dry-run]  the rows and their commands, nothing run
#
# Each row's time on an H200, estimated from bench/gpu_check_results.md (a step's process start, its inputs at
# 256 x 32768 and the judge add about 10-15 s to the adapter's and the oracle's times), and its limit:
#
#   row                                       estimate  limit   basis
#   fused-oracle-agree-8x4096                   25 s     120    torch oracle 1.3 s per 32k positions, compile
#   fused-oracle-cost-256x32768                 50 s     200    TRL 19 s; fused oracle unmeasured (8 float64
#                                                                [n, V, H] products, about 19 s at the fp64 peak)
#   fused-oracle-{tiles,split,16x32}-32x32768   45 s     150    an eighth of the cost row's oracle, twice each
#   trl-logprob-64x32768                        30 s     150    TRL 12 s per dtype at 64 rows
#   liger-logprob-64x32768                      60 s     200    chunk_forward 20-26 s per dtype at 64 rows
#   liger-fused-vocab-*-8x32768 (5 rows)        75 s     120    fused loss 3-4 s per dtype at 8 rows
#   liger-triton-vocab-* (4 rows)              100 s     150    12 s adapter, 5 s oracle
#   torch-grpo, liger-fused-grpo, liger-triton-grpo (256 x 32768)  90 s  150  fifth/second runs
#   liger-{triton,fused}-<9 loss types> (18 rows, 16 x 32768)  130 s  90  about 1/16 of the 256-row times
#   run-torch-cuda, run-liger-cuda             120 s     300    `pgspec run` takes 11 s on a CPU without properties
#   total                                    about 725 s (12 min): with the machine's start, one 15-minute session
#
# Sizes: BT (the loss.grpo rows), BT_TYPES (the other loss types), LPS_TRL, LPS_LIGER (the log-prob checks),
# LPS_VOCAB (the losses from hidden states), TRITON_VS (triton_grpo_loss's logits), COST (the oracle's time),
# AGREE (its agreement), TILES (its tile comparison), all overridable; e.g. LPS_LIGER=256x32768 ONLY=liger-logprob LIMIT_BIG=590 for Liger's
# log-prob step at full size alone in a session.
#
# Needs torch with CUDA, trl 1.16.0 and liger-kernel 0.8.5 (with triton) importable, and pgspec.  Every step has its
# own time limit; results go to $OUT (default /tmp/pgspec-gpu): one JSON per check step, runs/ for `pgspec run`,
# NAME.txt for the bench steps, log.txt, and a table printed at the end.
set -uo pipefail
MODE=full LIST=0
for a in "$@"; do
    case "$a" in
        full) MODE=full ;;
        small|--dry-run) MODE=dry ;;
        --list) LIST=1 ;;
        *) echo "usage: bash bench/gpu_check.sh [full|--dry-run] [--list]" >&2; exit 2 ;;
    esac
done
ONLY="${ONLY:-}"          # e.g. ONLY="liger-triton trl-logprob": run only the steps whose name starts with one of these
OUT="${OUT:-/tmp/pgspec-gpu}"
HERE="$(cd "$(dirname "$0")" && pwd)"
PY="${PYTHON:-python3}"
PY_TRL="${PYTHON_TRL:-$PY}"          # a Python with trl (the same one on the GPU machine)
if [ "$MODE" = full ]; then
    DEV=cuda V=151936 HID=() LIMIT="${LIMIT:-150}" LIMIT_BIG="${LIMIT_BIG:-200}"
    BT="${BT:-256x32768}" BT_TYPES="${BT_TYPES:-16x32768}" LPS_TRL="${LPS_TRL:-64x32768}"
    LPS_LIGER="${LPS_LIGER:-64x32768}" LPS_VOCAB="${LPS_VOCAB:-8x32768}" COST="${COST:-256x32768}"
    AGREE="${AGREE:-8x4096}" TILES="${TILES:-32x32768}" RUN=()
else
    DEV=cpu V=300 HID=(--hidden 16) LIMIT=600 LIMIT_BIG=600 BT=2x16 BT_TYPES=2x16 LPS_TRL=2x16 LPS_LIGER=2x16
    LPS_VOCAB=2x16 COST=2x16 AGREE=2x16 TILES=2x16 TRITON_VS=2x16
    RUN=(--formulas "kl.k3,loss.grpo" --no-properties)    # `pgspec run`'s path on two formulas
fi
if [ $LIST = 0 ]; then
    mkdir -p "$OUT/runs"
    STEPS="$OUT/steps.tsv"
    : > "$STEPS"
fi
log() { echo "$*" | tee -a "$OUT/log.txt"; }
step() {  # name limit kind (check, run or bench) args...
    local name="$1" limit="$2" kind="$3" py="$PY"; shift 3
    case "$name" in trl-*|fused-oracle-cost-*) py="$PY_TRL";; esac
    if [ -n "$ONLY" ]; then
        local want=0 p
        for p in $ONLY; do case "$name" in "$p"*) want=1;; esac; done
        [ $want = 1 ] || return 0
    fi
    case "$kind" in
        check) set -- "$@" --json "$OUT/$name.json" ;;
        run) set -- "$@" --report "json:$OUT/runs/$name.json" ;;
    esac
    if [ $LIST = 1 ]; then echo "$name: $kind $*"; return 0; fi
    if [ "$MODE" = dry ]; then { printf '%s\t' "$name" "${TRITON_INTERPRET:-0}" "$kind" "$@"; echo; } >> "$STEPS"; return 0; fi
    log "== $name: $kind $*"
    local t0 rc
    t0=$(date +%s.%N)
    if [ "$kind" = bench ]; then
        timeout "$limit" "$py" "$HERE/$1" "${@:2}" > "$OUT/$name.txt" 2>&1
        rc=$?
        cat "$OUT/$name.txt" >> "$OUT/log.txt"
    else
        timeout "$limit" "$py" -m pgspec.conformance.cli "$kind" "$@" >>"$OUT/log.txt" 2>&1
        rc=$?
    fi
    log "   rc=$rc wall=$(python3 -c "import sys; print(round(float(sys.argv[1]) - float(sys.argv[2]), 1))" "$(date +%s.%N)" "$t0") s"
    tail -3 "$OUT/log.txt" | grep -v "^==" | sed 's/^/   /'
}
if [ $LIST = 0 ]; then
    { nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
      "$PY" -c "import importlib, importlib.util as u
print(*[f'{m} ' + (getattr(importlib.import_module(m), '__version__', '?') if u.find_spec(m) else 'absent') for m in ('torch', 'trl', 'liger_kernel', 'triton')], sep=', ')
import torch; print('cuda', torch.cuda.is_available())"
    } 2>&1 | tee -a "$OUT/log.txt"
fi
# the dry run: Triton's CPU interpreter for the Triton rows and the fused oracle (where triton is importable)
DRY_ENV=()
if [ "$MODE" = dry ] && [ $LIST = 0 ] && "$PY" -c "import triton" 2>/dev/null; then
    DRY_ENV=(TRITON_INTERPRET=1 PGSPEC_LOGPROB_ORACLE=fused)
fi
interp() { [ "$DEV" = cpu ] && "$PY" -c "import triton" 2>/dev/null && export TRITON_INTERPRET=1; return 0; }
no_interp() { [ "$DEV" = cpu ] && unset TRITON_INTERPRET; return 0; }
LIGER_FUSED=pgspec.adapters.liger:make_fused_adapter
LIGER_TRITON=pgspec.adapters.liger:make_triton_adapter
BOTH=(--dtype bfloat16,float32)

# 1. the fused oracle (issue 41): agreement with the torch oracle on the compiled kernels, then its time beside TRL's
interp
step "fused-oracle-agree-$AGREE" "$LIMIT" bench logprob_oracle_cost.py --shape "$AGREE" --vocab "$V" "${HID[@]}" \
    --device "$DEV" --oracle fused --compare --repeat 1
step "fused-oracle-cost-$COST" "$LIMIT_BIG" bench logprob_oracle_cost.py --shape "$COST" --vocab "$V" "${HID[@]}" \
    --device "$DEV" --oracle fused --adapter trl --dtype bfloat16 --repeat 1
# its tiles on a smaller batch, for the next tuning: the defaults, and the gradient and its scales in sweeps of their
# own (ptxas spills registers in the single sweep at every tile shape tried, not in the gradient alone)
step "fused-oracle-tiles-$TILES" "$LIMIT" bench logprob_oracle_cost.py --shape "$TILES" --vocab "$V" "${HID[@]}" \
    --device "$DEV" --oracle fused --repeat 2
step "fused-oracle-split-$TILES" "$LIMIT" bench logprob_oracle_cost.py --shape "$TILES" --vocab "$V" "${HID[@]}" \
    --device "$DEV" --oracle fused --split --repeat 2
# and 16 positions by 32 columns, where ptxas spills least (16 bytes; bench/gpu_check_results.md), W read twice as often
step "fused-oracle-16x32-$TILES" "$LIMIT" bench logprob_oracle_cost.py --shape "$TILES" --vocab "$V" "${HID[@]}" \
    --device "$DEV" --oracle fused --block-m 16 --block-v 32 --repeat 2

# 2. the log-prob checks at V (both dtypes in one step: one evaluation of the oracle)
step "trl-logprob-$LPS_TRL" "$LIMIT" check --formula logprob.token --vocab "$V" "${HID[@]}" --shape "$LPS_TRL" \
    --adapter trl "${BOTH[@]}" --device "$DEV"
step "liger-logprob-$LPS_LIGER" "$LIMIT_BIG" check --formula logprob.token --vocab "$V" "${HID[@]}" --shape "$LPS_LIGER" \
    --adapter "$LIGER_FUSED" "${BOTH[@]}" --device "$DEV"

# 3. LigerFusedLinearGRPOLoss whole at V (conformance/check/head_loss.py): without and with its KL term (k3,
# beta = 0.04: ref_per_token_logps), the sequence-level GSPO and SAPO, and VESPO with the sampler's log-probs folded
# into phi (vllm_is_ratio; float32 judges phi)
no_interp
for row in "grpo loss.grpo --param beta=0" "kl-grpo loss.grpo --param beta=0.04" "gspo loss.gspo" "sapo loss.sapo" \
           "vespo-sampler loss.vespo --sampler"; do
    set -- $row
    name="$1"; shift
    step "liger-fused-vocab-$name-$LPS_VOCAB" "$LIMIT" check --formula "$@" --vocab "$V" "${HID[@]}" --shape "$LPS_VOCAB" \
        --adapter "$LIGER_FUSED" "${BOTH[@]}" --device "$DEV"
done

# 4. triton_grpo_loss on the logits of the linear head at V.  They must fit: the call holds the logits and their
# gradient, two [B, T+1, V] tensors, 74 GiB at V = 151936 for 4 x 32768 tokens in bfloat16 and 2 x 32768 in float32
# (sized for an H200's 140 GiB; TRITON_VS sets both); without the KL term and with it (k3, beta = 0.04)
interp
for d in float32 bfloat16; do
    if [ "$MODE" = dry ]; then vs=2x16; elif [ $d = bfloat16 ]; then vs=4x32768; else vs=2x32768; fi
    vs="${TRITON_VS:-$vs}"
    step "liger-triton-vocab-grpo-$d" "$LIMIT" check --formula loss.grpo --param beta=0 --vocab "$V" "${HID[@]}" \
        --shape "$vs" --adapter "$LIGER_TRITON" --dtype "$d" --device "$DEV"
    step "liger-triton-vocab-kl-grpo-$d" "$LIMIT" check --formula loss.grpo --param beta=0.04 --vocab "$V" "${HID[@]}" \
        --shape "$vs" --adapter "$LIGER_TRITON" --dtype "$d" --device "$DEV"
done

# 5. the loss arithmetic at production token counts (the vocabulary-of-two construction): loss.grpo at BT through
# the built-in backend and both Liger kernels, then the other loss types at BT_TYPES: Dr.GRPO (divided by K N,
# K = 3000), DAPO and CISPO (w = min(r, 1.2)) with the batch-pooled token mean, GSPO (sequence level), SAPO, LUSPO
# (triton_grpo_loss's declared bug with padded rows shows here, deviations-triton.toml), VESPO, and GRPO with its
# KL term (k3, beta = 0.04: Liger's default; and k3_unbiased: use_bias_correction_kl=True)
no_interp
step torch-grpo "$LIMIT" check --formula loss.grpo --param beta=0 --shape "$BT" --adapter torch "${BOTH[@]}" --device "$DEV"
step liger-fused-grpo "$LIMIT" check --formula loss.grpo --param beta=0 --shape "$BT" --adapter "$LIGER_FUSED" "${BOTH[@]}" \
    --device "$DEV"
interp
step liger-triton-grpo "$LIMIT" check --formula loss.grpo --param beta=0 --shape "$BT" --adapter "$LIGER_TRITON" \
    "${BOTH[@]}" --device "$DEV"
loss_rows() {  # kernel (triton or fused)
    local k="$1" a="pgspec.adapters.liger:make_$1_adapter" row name
    for row in "drgrpo loss.dr_grpo" "dapo loss.dapo --param aggregation=token_mean" \
               "cispo loss.cispo --param aggregation=token_mean" "gspo loss.gspo" "sapo loss.sapo" \
               "luspo loss.luspo" "vespo loss.vespo" "kl-grpo loss.grpo" \
               "kl-unbiased-grpo loss.grpo --param kl_estimator=k3_unbiased"; do
        set -- $row
        name="$1"; shift
        step "liger-$k-$name" 90 check --formula "$@" --shape "$BT_TYPES" --adapter "$a" "${BOTH[@]}" --device "$DEV"
    done
}
loss_rows triton
no_interp
loss_rows fused

# 6. the golden corpus on the device (`pgspec run --device cuda`): the built-in backend (every dtype, with the
# property checks) and Liger's chunked loss functions
step run-torch-cuda 300 run --adapter torch --device "$DEV" "${RUN[@]}"
step run-liger-cuda 300 run --adapter liger --device "$DEV" "${RUN[@]}"

[ $LIST = 1 ] && exit 0
status=0
if [ "$MODE" = dry ]; then
    env "${DRY_ENV[@]}" "$PY" "$HERE/gpu_check_dry.py" "$STEPS" 2>&1 | tee -a "$OUT/log.txt"
    status=${PIPESTATUS[0]}
fi
"$PY" - "$OUT" <<'PYEOF' | tee "$OUT/table.md"
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
rows = []
for p in sorted(out.glob("*.json")):
  doc = json.loads(p.read_text())
  for r in doc if isinstance(doc, list) else [doc]:     # a step with several dtypes: one result each
    size = "x".join(map(str, r["shape"])) + (f", V={r['vocab']}, H={r['hidden']}" if r.get("vocab") else "")
    worst = ", ".join(f"{o['output']} {float(o['worst_ratio']):.3g}" for o in r["outputs"])
    rows.append(f"| {r['adapter']} | {r['formula']} | {r['dtype']} | {r['device']} | {size} | {r['outcome']} | {worst} | "
                f"{r['adapter_seconds']:.2f} | {r['oracle_seconds']:.2f} |")
print("| adapter | formula | dtype | tensors on | size | outcome | worst error / bound | adapter s | oracle s |")
print("|---|---|---|---|---|---|---|---|---|")
print("\n".join(rows))
for p in sorted((out / "runs").glob("*.json")):
  doc = json.loads(p.read_text())
  print(f"\n`pgspec run` {p.stem} on {doc['device']}: {doc['summary']}")
for p in sorted(out.glob("*.txt")):
  if p.name != "log.txt":
    print(f"\n{p.stem}:\n" + "\n".join("    " + line for line in p.read_text().splitlines()[-8:]))
PYEOF
exit $status
