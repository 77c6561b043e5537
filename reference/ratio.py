"""ratio: importance ratios between the current and the old policy (spec/ratio.md)."""

from __future__ import annotations

from ._ad import clip, exp, sg, total
from ._common import (
    LOGPROBS, MASK, OLD_LOGPROBS, log_ratio_clamp_param, per_token, positions, seq_output,
    token_output,
)
from ._registry import Param, formula

GSPO = "Zheng et al. 2025, Group Sequence Policy Optimization, arXiv:2507.18071"
PPO = "Schulman et al. 2017, Proximal Policy Optimization Algorithms, arXiv:1707.06347"


def clamp_log_ratio(d, c):
    """clip(d, -c, c) when a clamp c is set, else d."""
    return d if c is None else clip(d, -c, c)


@formula(
    "ratio.token",
    title="Token importance ratio r = exp(l - l_old), optional log-ratio clamp",
    inputs=(LOGPROBS, OLD_LOGPROBS, MASK),
    params=(log_ratio_clamp_param(),),
    outputs=(token_output("ratio", "r_{i,t}"),),
    differentiable=("logprobs",),
    grad_of="ratio",
    references=(
        PPO,
        "verl 0.9.1 verl/trainer/ppo/core_algos.py compute_policy_loss_vanilla: clamp(-20, 20)",
        "Liger-Kernel fork PR #4 (MotifTechnologies/Liger-Kernel; not in liger-kernel 0.8.5, which has no clamp): log_ratio_clamp_value=20",
    ),
)
def token_ratio(logprobs, old_logprobs, mask, *, log_ratio_clamp):
    """ratio.token:  r_{i,t} = exp(clip(l_{i,t} - l^old_{i,t}, -c, c))   (no clip when c is null)."""
    return {
        "ratio": per_token(
            mask, lambda i, t: exp(clamp_log_ratio(logprobs[i][t] - old_logprobs[i][t], log_ratio_clamp))
        )
    }


@formula(
    "ratio.sequence_product",
    title="Sequence importance ratio exp(sum_t (l - l_old)), the product of token ratios",
    inputs=(LOGPROBS, OLD_LOGPROBS, MASK),
    params=(log_ratio_clamp_param(doc="if set to c, the summed log-ratio is clamped to [-c, c] before exp (null: no clamp)"),),
    outputs=(seq_output("ratio", "rho_i = prod_t r_{i,t}"),),
    differentiable=("logprobs",),
    grad_of="ratio",
    references=(
        "Liu, Li et al. 2025, When Speed Kills Stability (sequence-level IS)",
        "trl 1.16.0 GRPOTrainer vllm_importance_sampling_mode=sequence_truncate",
    ),
)
def sequence_product_ratio(logprobs, old_logprobs, mask, *, log_ratio_clamp):
    """ratio.sequence_product:  rho_i = exp(clip(sum_t m_{i,t} (l_{i,t} - l^old_{i,t}), -c, c)).

    An empty sequence (no unmasked token) has rho_i = exp(0) = 1.
    """
    ratios = []
    for i, row in enumerate(mask):
        log_sum = total(logprobs[i][t] - old_logprobs[i][t] for t in positions(row))
        ratios.append(exp(clamp_log_ratio(log_sum, log_ratio_clamp)))
    return {"ratio": ratios}


def clamped_mean_log_ratio(l_row, old_row, ts, log_ratio_clamp):
    """(1/L) sum_{t in ts} clip(l_t - l^old_t, -c, c) (no clip when c is None), L = len(ts); 0 when empty.

    The per-token clamp placement of Liger-Kernel fork PR #4: each token's log-ratio is clamped
    before the sequence mean, so a clamped token contributes the constant +-c and no gradient.
    """
    if not ts:
        return 0
    return total(clamp_log_ratio(l_row[t] - old_row[t], log_ratio_clamp) for t in ts) / len(ts)


@formula(
    "ratio.sequence_geometric",
    title="GSPO sequence ratio s_i = exp(mean_t (l - l_old)), optional cap on the log",
    inputs=(LOGPROBS, OLD_LOGPROBS, MASK),
    params=(
        Param("log_ratio_max", None, nullable=True,
              doc="placement 'on the mean': if set to c, log s_i (the mean) is capped from above at c before exp "
                  "(verl uses 10; null: no cap)"),
        log_ratio_clamp_param(doc="placement 'per token, before the mean': if set to c, each token log-ratio "
                                  "l - l_old is clamped to [-c, c] before the mean (Liger-Kernel fork PR #4 "
                                  "log_ratio_clamp_value=20; null: no clamp)"),
    ),
    outputs=(seq_output("ratio", "s_i, the geometric mean of the token ratios"),),
    differentiable=("logprobs",),
    grad_of="ratio",
    references=(GSPO + " Eq. 7",
                "Liger-Kernel fork PR #4 (log_ratio_clamp_value=20 clamps each token's l - l_old before the sequence mean)"),
)
def sequence_geometric_ratio(logprobs, old_logprobs, mask, *, log_ratio_max, log_ratio_clamp=None):
    """ratio.sequence_geometric:  s_i = exp(min((1/L_i) sum_t m_{i,t} clip(l_{i,t} - l^old_{i,t}, -k, k), c)),
    L_i = sum_t m_{i,t};  c = log_ratio_max (cap on the mean), k = log_ratio_clamp (per-token clamp
    before the mean); either null means no bound.

    An empty sequence (L_i = 0) has s_i = 1 (its mean log-ratio is defined as 0).
    """
    ratios = []
    for i, row in enumerate(mask):
        ts = positions(row)
        if not ts:
            ratios.append(exp(0))
            continue
        mean_log = clamped_mean_log_ratio(logprobs[i], old_logprobs[i], ts, log_ratio_clamp)
        ratios.append(exp(clip(mean_log, None, log_ratio_max)))
    return {"ratio": ratios}


@formula(
    "ratio.gspo_token",
    title="GSPO-token ratio s_{i,t} = sg[s_i] * exp(l_{i,t} - sg[l_{i,t}])",
    inputs=(LOGPROBS, OLD_LOGPROBS, MASK),
    params=(
        Param("log_ratio_max", None, nullable=True,
              doc="if set to c, log s_{i,t} is capped from above at c before exp (verl uses 10; null: no cap)"),
    ),
    outputs=(token_output("ratio", "s_{i,t}: the value of s_i, the gradient of a token ratio"),),
    differentiable=("logprobs",),
    grad_of="ratio",
    stop_gradients=("s_i", "l_{i,t} inside the exponent's subtrahend"),
    references=(GSPO + " Eq. 13-14", "verl 0.9.1 core_algos.compute_policy_loss_gspo"),
)
def gspo_token_ratio(logprobs, old_logprobs, mask, *, log_ratio_max):
    """ratio.gspo_token:  s_{i,t} = exp(min(sg[log s_i] + l_{i,t} - sg[l_{i,t}], c)),
    log s_i = (1/L_i) sum_t m_{i,t} (l_{i,t} - l^old_{i,t}).

    Its value is s_i at every token of sequence i; d s_{i,t} / d l_{i,t} = s_{i,t} and it has no
    derivative with respect to any other token.
    """
    out = []
    for i, row in enumerate(mask):
        ts = positions(row)
        log_s = sg(total(logprobs[i][t] - old_logprobs[i][t] for t in ts) / len(ts)) if ts else 0
        out.append([
            exp(clip(log_s + (logprobs[i][t] - sg(logprobs[i][t])), None, log_ratio_max)) if m else None
            for t, m in enumerate(row)
        ])
    return {"ratio": out}
