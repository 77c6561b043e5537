#!/usr/bin/env bash
# `pgspec check` on CUDA at production size (issue 12, item 6): Liger's fused linear GRPO loss and its
# Triton `triton_grpo_loss` (loss.grpo, and loss.dr_grpo, loss.dapo, loss.cispo, loss.gspo, loss.sapo and loss.luspo, and loss.grpo with its KL term, through the vocabulary-of-two construction of
# adapters/liger/construct.py, at B x T tokens), the log-prob step of Liger's fused linear loss
# (`LigerFusedLinearPPOBase.chunk_forward`, adapters/liger/head.py) and TRL's chunked log-prob kernel
# (`_ChunkedLogProbFunction`), both logprob.token through a linear head of exact logits at V = 151936
# (conformance/check_logprob.py), and the whole losses from hidden states and the head at V
# (`loss.grpo --vocab`, with its KL term too, `loss.gspo` and `loss.sapo --vocab`; conformance/check_head_loss.py: LigerFusedLinearGRPOLoss, and triton_grpo_loss on
# the head's logits), each in float32 and bfloat16 against the float64 oracle.
# At 256 x 32768 a log-prob step's oracle alone takes about 470 s on an H100 and 320 s on an H200.
#
#   bash bench/gpu_check.sh [SIZE]        SIZE: full (default; B = 256, T = 32768) or small (CPU dry run)
#
# Needs torch with CUDA, trl 1.16.0 and liger-kernel 0.8.5 (with triton) importable, and pgspec.
# Every step has its own time limit; results go to $OUT (default /tmp/pgspec-gpu) as one JSON per
# step plus log.txt, and a table is printed at the end.
set -uo pipefail
SIZE="${1:-full}"
ONLY="${ONLY:-}"          # e.g. ONLY="liger-triton trl-logprob-32x32768": run only the steps whose name
                          # starts with one of these prefixes (all steps when empty)
OUT="${OUT:-/tmp/pgspec-gpu}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
PY_TRL="${PYTHON_TRL:-$PY}"          # a Python with trl (the same one on the GPU machine)
if [ "$SIZE" = full ]; then
    DEV=cuda; BT=256x32768; LPS="${LPS:-8x32768 256x32768}"; V=151936; LIMIT="${LIMIT:-150}"; LIMIT_BIG="${LIMIT_BIG:-560}"
else
    DEV=cpu; BT=4x256; LPS="2x64"; V=2000; LIMIT=600; LIMIT_BIG=600
fi
log() { echo "$*" | tee -a "$OUT/log.txt"; }
step() {  # name limit args...
    local name="$1" limit="$2" py="$PY"; shift 2
    case "$name" in trl-*) py="$PY_TRL";; esac
    if [ -n "$ONLY" ]; then
        local want=0 p
        for p in $ONLY; do case "$name" in "$p"*) want=1;; esac; done
        [ $want = 1 ] || return
    fi
    log "== $name: pgspec check $*"
    local t0=$(date +%s.%N)
    timeout "$limit" "$py" -m pgspec.conformance.cli check "$@" --json "$OUT/$name.json" >>"$OUT/log.txt" 2>&1
    local rc=$?
    log "   rc=$rc wall=$(python3 -c "import sys; print(round(float(sys.argv[1]) - float(sys.argv[2]), 1))" "$(date +%s.%N)" "$t0") s"
    tail -3 "$OUT/log.txt" | grep -v "^==" | sed 's/^/   /'
}
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
  "$PY" -c "import torch, trl, liger_kernel, triton; from importlib.metadata import version as v
print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'trl', trl.__version__, 'liger-kernel', v('liger-kernel'), 'triton', triton.__version__)"
} 2>&1 | tee -a "$OUT/log.txt"

G="--formula loss.grpo --param beta=0 --shape $BT"
step torch-grpo-bf16 "$LIMIT" $G --adapter torch --dtype bfloat16 --device "$DEV"
for d in float32 bfloat16; do
    step "liger-fused-grpo-$d" "$LIMIT" $G --adapter pgspec.adapters.liger:make_fused_adapter --dtype "$d" --device "$DEV"
done
# the Triton adapter launches the kernel on the device of the case's tensors (on a CPU only under
# Triton's interpreter, which the dry run sets)
[ "$DEV" = cpu ] && export TRITON_INTERPRET=1      # the dry run: Triton's CPU interpreter
for d in float32 bfloat16; do
    step "liger-triton-grpo-$d" "$LIMIT" $G --adapter pgspec.adapters.liger:make_triton_adapter --dtype "$d" --device "$DEV"
done
# the other loss types of both kernels: Dr.GRPO (divided by K N, K = 3000), DAPO and CISPO (w = min(r, 1.2)) with the
# batch-pooled token mean (Liger's and TRL's normalizer; the per-prompt one has no Liger counterpart), GSPO (sequence
# level: Liger's importance_sampling_level='sequence'), SAPO, LUSPO (Liger's declared bug with padded rows,
# deviations*.toml, shows here), VESPO (its bfloat16 bound on phi, a sum over each row, is loose: see the README),
# and GRPO with its KL term (k3, beta = 0.04: Liger's default; and k3_unbiased: use_bias_correction_kl=True)
loss_rows() {  # kernel (triton or fused), dtype
    local k="$1" d="$2" a="pgspec.adapters.liger:make_$1_adapter" row name
    for row in "drgrpo loss.dr_grpo" "dapo loss.dapo --param aggregation=token_mean" \
               "cispo loss.cispo --param aggregation=token_mean" "gspo loss.gspo" "sapo loss.sapo" \
               "luspo loss.luspo" "vespo loss.vespo" "kl-grpo loss.grpo" \
               "kl-unbiased-grpo loss.grpo --param kl_estimator=k3_unbiased"; do
        set -- $row
        name="$1"; shift
        step "liger-$k-$name-$d" "$LIMIT" --formula "$@" --shape "$BT" --adapter "$a" --dtype "$d" --device "$DEV"
    done
}
for d in float32 bfloat16; do
    loss_rows triton "$d"
    [ "$DEV" = cpu ] && unset TRITON_INTERPRET
    loss_rows fused "$d"
    [ "$DEV" = cpu ] && export TRITON_INTERPRET=1
done
# the kernel's vocabulary loop: triton_grpo_loss on the logits of the linear head at V. They must fit: the call
# holds the logits and their gradient, two [B, T+1, V] tensors, 74 GiB at V = 151936 for 4 x 32768 tokens in
# bfloat16 and 2 x 32768 in float32 (the defaults on a GPU, sized for an H200's 140 GiB; TRITON_VS sets both)
for d in float32 bfloat16; do
    if [ "$SIZE" != full ]; then vs=2x32; elif [ $d = bfloat16 ]; then vs=4x32768; else vs=2x32768; fi
    vs="${TRITON_VS:-$vs}"
    step "liger-triton-vocab-grpo-$d" "$LIMIT" --formula loss.grpo --param beta=0 --vocab "$V" --shape "$vs" --adapter pgspec.adapters.liger:make_triton_adapter --dtype "$d" --device "$DEV"
    # with the KL term (k3, beta = 0.04): the reference log-probs as the kernel's ref_logp
    step "liger-triton-vocab-kl-grpo-$d" "$LIMIT" --formula loss.grpo --param beta=0.04 --vocab "$V" --shape "$vs" --adapter pgspec.adapters.liger:make_triton_adapter --dtype "$d" --device "$DEV"
done
unset TRITON_INTERPRET
# both dtypes in one step: the float64 oracle (most of the time at V = 151936) is evaluated once for both
for s in $LPS; do
    lim="$([ $s = 256x32768 ] && echo $LIMIT_BIG || echo $LIMIT)"
    step "trl-logprob-$s" "$lim" --formula logprob.token --vocab "$V" --shape "$s" --adapter trl --dtype bfloat16,float32 --device "$DEV"
    step "liger-logprob-$s" "$lim" --formula logprob.token --vocab "$V" --shape "$s" --adapter pgspec.adapters.liger:make_fused_adapter --dtype bfloat16,float32 --device "$DEV"
    # LigerFusedLinearGRPOLoss whole at V (conformance/check_head_loss.py): the oracle is the log-prob step's and a loss
    step "liger-fused-vocab-grpo-$s" "$lim" --formula loss.grpo --param beta=0 --vocab "$V" --shape "$s" --adapter pgspec.adapters.liger:make_fused_adapter --dtype bfloat16,float32 --device "$DEV"
    # with the KL term (k3, beta = 0.04: ref_per_token_logps, as TRL passes the reference model's log-probs)
    step "liger-fused-vocab-kl-grpo-$s" "$lim" --formula loss.grpo --param beta=0.04 --vocab "$V" --shape "$s" --adapter pgspec.adapters.liger:make_fused_adapter --dtype bfloat16,float32 --device "$DEV"
    # the sequence-level GSPO (importance_sampling_level="sequence") and SAPO, from hidden states
    step "liger-fused-vocab-gspo-$s" "$lim" --formula loss.gspo --vocab "$V" --shape "$s" --adapter pgspec.adapters.liger:make_fused_adapter --dtype bfloat16,float32 --device "$DEV"
    step "liger-fused-vocab-sapo-$s" "$lim" --formula loss.sapo --vocab "$V" --shape "$s" --adapter pgspec.adapters.liger:make_fused_adapter --dtype bfloat16,float32 --device "$DEV"
    # VESPO with the sampler's log-probs folded into phi (vllm_is_ratio, as TRL passes it under vLLM); float32 judges phi
    step "liger-fused-vocab-vespo-sampler-$s" "$lim" --formula loss.vespo --sampler --vocab "$V" --shape "$s" --adapter pgspec.adapters.liger:make_fused_adapter --dtype float32,bfloat16 --device "$DEV"
done
"$PY" - "$OUT" <<'PYEOF' | tee "$OUT/table.md"
import json, pathlib, sys
rows = []
for p in sorted(pathlib.Path(sys.argv[1]).glob("*.json")):
  doc = json.loads(p.read_text())
  for r in doc if isinstance(doc, list) else [doc]:     # a step with several dtypes: one result each
    size = "x".join(map(str, r["shape"])) + (f", V={r['vocab']}, H={r['hidden']}" if r.get("vocab") else "")
    worst = ", ".join(f"{o['output']} {float(o['worst_ratio']):.3g}" for o in r["outputs"])
    rows.append(f"| {r['adapter']} | {r['formula']} | {r['dtype']} | {r['device']} | {size} | {r['outcome']} | {worst} | "
                f"{r['adapter_seconds']:.2f} | {r['oracle_seconds']:.2f} |")
print("| adapter | formula | dtype | tensors on | size | outcome | worst error / bound | adapter s | oracle s |")
print("|---|---|---|---|---|---|---|---|---|")
print("\n".join(rows))
PYEOF
