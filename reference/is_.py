"""is: train/inference mismatch importance-sampling corrections (spec/is.md).

The module is named ``is_`` because ``is`` is a Python keyword; the family and its IDs are ``is``.

Every weight here is built from two log-probs taken at sampling time,

    x_{i,t} = l^old_{i,t} - l^mu_{i,t} = log(pi_old / mu)        (sampled from mu, the engine)

the trainer's (``old_logprobs``) and the inference engine's (``sampler_logprobs``).  Neither
carries a gradient, so no formula here has a differentiable input: when a ``loss.*`` recipe
multiplies a surrogate by one of these weights, the weight is a constant, sg[w].

Levels (the log-weight u before exp):  token u_{i,t} = x_{i,t};  sequence u_i = sum_t m x
(the product of the token ratios);  geometric u_i = (1/L_i) sum_t m x (their geometric mean).
Modes:  truncate (TIS) w = clip(rho, C_min, C_max) with a missing bound open;  mask (MIS, IcePop)
w = rho * 1[C_min <= rho <= C_max], survivors keep their raw weight.

The plain per-element functions below (``mismatch_log_ratio``, ``clamp_log_weight``,
``in_band``, ``truncate_weight``, ``mask_weight``, ``token_log_weight``,
``sequence_log_weight``, ``geometric_log_weight``, ``divergence``, ``reduce_statistic``) are what
the ``loss.*`` recipes compose; the registered formulas only iterate them over unmasked tokens.
"""

from __future__ import annotations

from mpmath import mp, mpf

from ._ad import clip, exp, total
from ._common import MASK, OLD_LOGPROBS, SAMPLER_LOGPROBS, positions, require, seq_output, token_output
from ._registry import Output, Param, formula
from .kl import k1, k2, k3

TIS = ("Yao, Liu, Zhang, Dong, Shang, Gao 2025, Your Efficient RL Framework Secretly Brings You "
       "Off-Policy RL Training (TIS), https://fengyao.notion.site/off-policy-rl")
ICEPOP = "Ling Team 2025, Every Step Evolves (Ring-1T, IcePop), arXiv:2510.18855, section 2.3.2 Eq. 1-3"
MISMATCH = ("Liu, Li et al. 2025, When Speed Kills Stability: Demystifying RL Collapse from the "
            "Training-Inference Mismatch (sequence-level and geometric IS/MIS), "
            "https://richardli.xyz/post/rl-collapse-training-inference")
SCHULMAN = "Schulman 2020, Approximating KL Divergence, http://joschu.net/blog/kl-approx.html"
TRL_IS = ("trl 1.16.0 GRPOTrainer._generate_and_score_completions: vllm_importance_sampling_mode "
          "{token,sequence}_{truncate,mask}, vllm_importance_sampling_clip_min/_clip_max")
VERL_IS = ("verl 0.9.1 verl/trainer/ppo/rollout_corr_helper.py compute_rollout_correction_weights "
           "(rollout_is token/sequence, threshold U or 'L_U', log-ratio clamp +-20)")
VERL_RS = ("verl 0.9.1 verl/trainer/ppo/rollout_corr_helper.py compute_rollout_rejection_mask "
           "(token_k1..k3, seq_sum_k1..k3, seq_mean_k1..k3, seq_max_k2/k3)")
AREAL_RS = ("AReaL 1.0.4 areal/utils/functional/functional.py apply_rejection_sampling, "
            "areal/api/cli_args.py RejectionSamplingConfig")
NEMO_IS = ("NeMo-RL 7ea279ab nemo_rl/algorithms/loss/loss_functions.py ClippedPGLossFn "
           "(truncated_importance_sampling_type tis / icepop)")
NEMO_2269 = "NeMo-RL PR #2269 (open) is_correction_level = sequence_mean (geometric IS weight)"
SLIME_IS = ("slime 624b824a slime/backends/megatron_utils/loss.py vanilla_tis_function, icepop_function; "
            "examples/train_infer_mismatch_helper/mis.py compute_mis_weights_with_cp (token/sequence/geometric, +-20)")
OPENRLHF_IS = "OpenRLHF 0.11.2 openrlhf/models/utils.py IS correction (tis = token clip, icepop = token mask)"


# Per-element primitives ------------------------------------------------------------------------

def mismatch_log_ratio(old_logprob, sampler_logprob):
    """x = l^old - l^mu = log(pi_old / mu): the train/inference mismatch log-ratio of one token."""
    return old_logprob - sampler_logprob


def clamp_log_weight(u, c):
    """clip(u, -c, c) when a clamp c is set (verl and slime use c = 20), else u unchanged."""
    return u if c is None else clip(u, -c, c)


def in_band(value, lo, hi):
    """1[lo <= value <= hi]: the closed band; a bound that is None is open (-inf or +inf)."""
    return (lo is None or value >= lo) and (hi is None or value <= hi)


def truncate_weight(rho, c_min, c_max):
    """TIS: clip(rho, C_min, C_max) = min(max(rho, C_min), C_max); a bound that is None is open."""
    if c_min is None and c_max is None:
        return rho
    return clip(rho, c_min, c_max)


def mask_weight(rho, c_min, c_max):
    """MIS / IcePop: rho * 1[C_min <= rho <= C_max]; a surviving weight keeps its raw value."""
    return rho if in_band(rho, c_min, c_max) else mpf(0)


def token_log_weight(old_row, sampler_row, t):
    """Token level: u_{i,t} = l^old_{i,t} - l^mu_{i,t}."""
    return mismatch_log_ratio(old_row[t], sampler_row[t])


def sequence_log_weight(old_row, sampler_row, ts):
    """Sequence level: u_i = sum_{t in ts} (l^old - l^mu), the log of the product of token ratios.

    An empty sequence (ts empty) has u_i = 0.
    """
    return total(mismatch_log_ratio(old_row[t], sampler_row[t]) for t in ts)


def geometric_log_weight(old_row, sampler_row, ts):
    """Geometric level: u_i = (1/L_i) sum_{t in ts} (l^old - l^mu), L_i = len(ts); 0 when L_i = 0."""
    if not ts:
        return mpf(0)
    return sequence_log_weight(old_row, sampler_row, ts) / len(ts)


def divergence(estimator, u):
    """Schulman's estimator of u = log r (r = p/q, samples from q), estimating KL(q || p):

    k1 = -u,  k2 = u^2 / 2,  k3 = e^u - 1 - u (computed without cancellation).
    """
    return {"k1": k1, "k2": k2, "k3": k3}[estimator](u)


def reduce_statistic(level, values):
    """The per-sequence statistic of is.reject: seq_sum = sum, seq_mean = sum / L (0 when L = 0),
    seq_max = max (0 when L = 0)."""
    if level == "seq_sum":
        return total(values)
    if not values:
        return mpf(0)
    if level == "seq_mean":
        return total(values) / len(values)
    if level == "seq_max":
        return max(values)
    raise AssertionError(level)


# Parameter declarations ------------------------------------------------------------------------

def _clamp_param():
    return Param(
        "log_ratio_clamp", None, lo=0, lo_open=True, nullable=True,
        doc="if set to c, the level's log-weight (token log-ratio, its sum or its mean) is clamped "
            "to [-c, c] before exp (verl and slime MIS: 20; null: no clamp)",
    )


def _truncate_params():
    return (
        Param("c_min", None, lo=0, nullable=True,
              doc="lower bound C_min of the weight (two-sided TIS; TRL vllm_importance_sampling_clip_min, "
                  "NeMo-RL truncated_importance_sampling_ratio_min, slime --tis-clip-low); null: no lower bound"),
        Param("c_max", 2.0, lo=0, lo_open=True, nullable=True,
              doc="upper bound C_max of the weight (the TIS cap C; the blog prescribes none, 2.0 is the "
                  "verl DAPO recipe's value); null: no upper bound (both null: the untruncated weight rho, "
                  "NeMo-RL use_importance_sampling_correction / PR #2269)"),
        _clamp_param(),
    )


def _mask_params():
    return (
        Param("c_min", 0.5, lo=0, nullable=True,
              doc="lower bound C_min of the kept band (IcePop alpha = 0.5); null: no lower bound"),
        Param("c_max", 5.0, lo=0, lo_open=True, nullable=True,
              doc="upper bound C_max of the kept band (IcePop beta = 5); null: no upper bound"),
        _clamp_param(),
    )


def _check_bounds(fid, lo_name, lo, hi_name, hi, untruncated_ok=False):
    """Both bounds null is the untruncated weight for the truncate modes (untruncated_ok); a mask
    with no band would keep everything, so a mask needs at least one bound."""
    require(untruncated_ok or lo is not None or hi is not None,
            f"{fid}: at least one of the parameters {lo_name!r} and {hi_name!r} must be set, got both null "
            f"(the untruncated weight is the truncate mode with both bounds null)")
    require(lo is None or hi is None or lo <= hi,
            f"{fid}: parameter {lo_name!r} must be <= {hi_name!r}, got {lo_name}={mp.nstr(lo, 15)} "
            f"and {hi_name}={mp.nstr(hi, 15)}")


INPUTS = (OLD_LOGPROBS, SAMPLER_LOGPROBS, MASK)
WEIGHT = token_output("weight", "w_{i,t}, the IS weight of token t (the sequence weight broadcast at "
                                "sequence and geometric level; 0 where the mask mode drops it)")
KEEP = Output("keep", ("B", "T"), kind="bool",
              doc="1[C_min <= rho <= C_max] at the token (broadcast from the sequence at sequence and "
                  "geometric level) (null where the mask is false)")
RATIO = token_output("ratio", "rho_{i,t} = exp(clip(l^old - l^mu, -c, c)), before truncation or masking")
SEQ_RATIO = seq_output("seq_ratio", "rho_i = exp(clip(u_i, -c, c)), the sequence weight before truncation or "
                                    "masking (1 for an empty sequence)")
SEQ_WEIGHT = seq_output("seq_weight", "w_i, the truncated or masked sequence weight")
SEQ_KEEP = Output("seq_keep", ("B",), kind="bool", doc="1[C_min <= rho_i <= C_max]")


def _broadcast(mask, seq_values):
    """[[seq_values[i] if m else None for t] for i]: a per-sequence value at every unmasked token."""
    return [[seq_values[i] if m else None for m in row] for i, row in enumerate(mask)]


def _sequence_ratios(level_log_weight, old_logprobs, sampler_logprobs, mask, c):
    return [
        exp(clamp_log_weight(level_log_weight(old_logprobs[i], sampler_logprobs[i], positions(row)), c))
        for i, row in enumerate(mask)
    ]


def _token_ratios(old_logprobs, sampler_logprobs, mask, c):
    return [
        [exp(clamp_log_weight(token_log_weight(old_logprobs[i], sampler_logprobs[i], t), c)) if m else None
         for t, m in enumerate(row)]
        for i, row in enumerate(mask)
    ]


def _map(nested, fn):
    return [[None if v is None else fn(v) for v in row] for row in nested]


# Token level -----------------------------------------------------------------------------------

@formula(
    "is.token.truncate",
    title="Token TIS weight w = clip(exp(l_old - l_mu), C_min, C_max), one-sided by default",
    inputs=INPUTS,
    params=_truncate_params(),
    outputs=(WEIGHT, RATIO),
    references=(TIS, TRL_IS + " (token_truncate)", VERL_IS, NEMO_IS, SLIME_IS, OPENRLHF_IS),
)
def token_truncate(old_logprobs, sampler_logprobs, mask, *, c_min, c_max, log_ratio_clamp):
    """is.token.truncate:  rho_{i,t} = exp(clip(l^old_{i,t} - l^mu_{i,t}, -c, c)),
    w_{i,t} = clip(rho_{i,t}, C_min, C_max)   (a null bound is open; no clip when c is null)."""
    _check_bounds("is.token.truncate", "c_min", c_min, "c_max", c_max, untruncated_ok=True)
    rho = _token_ratios(old_logprobs, sampler_logprobs, mask, log_ratio_clamp)
    return {"weight": _map(rho, lambda r: truncate_weight(r, c_min, c_max)), "ratio": rho}


@formula(
    "is.token.mask",
    title="Token MIS / IcePop weight w = rho * 1[C_min <= rho <= C_max], rho = exp(l_old - l_mu)",
    inputs=INPUTS,
    params=_mask_params(),
    outputs=(WEIGHT, KEEP, RATIO),
    references=(ICEPOP, TRL_IS + " (token_mask)", VERL_IS + " ('L_U' threshold)", NEMO_IS, SLIME_IS, OPENRLHF_IS),
)
def token_mask(old_logprobs, sampler_logprobs, mask, *, c_min, c_max, log_ratio_clamp):
    """is.token.mask:  rho_{i,t} = exp(clip(l^old_{i,t} - l^mu_{i,t}, -c, c)),
    k_{i,t} = 1[C_min <= rho_{i,t} <= C_max],  w_{i,t} = rho_{i,t} k_{i,t}."""
    _check_bounds("is.token.mask", "c_min", c_min, "c_max", c_max)
    rho = _token_ratios(old_logprobs, sampler_logprobs, mask, log_ratio_clamp)
    return {
        "weight": _map(rho, lambda r: mask_weight(r, c_min, c_max)),
        "keep": _map(rho, lambda r: in_band(r, c_min, c_max)),
        "ratio": rho,
    }


# Sequence level (product of token ratios) ------------------------------------------------------

@formula(
    "is.sequence.truncate",
    title="Sequence TIS weight w_i = clip(exp(sum_t (l_old - l_mu)), C_min, C_max), broadcast to tokens",
    inputs=INPUTS,
    params=_truncate_params(),
    outputs=(WEIGHT, SEQ_WEIGHT, SEQ_RATIO),
    references=(MISMATCH, TRL_IS + " (sequence_truncate)", VERL_IS + " (rollout_is=sequence)", SLIME_IS),
)
def sequence_truncate(old_logprobs, sampler_logprobs, mask, *, c_min, c_max, log_ratio_clamp):
    """is.sequence.truncate:  rho_i = exp(clip(sum_t m_{i,t} (l^old_{i,t} - l^mu_{i,t}), -c, c)),
    w_i = clip(rho_i, C_min, C_max),  w_{i,t} = w_i at every unmasked token of sequence i."""
    _check_bounds("is.sequence.truncate", "c_min", c_min, "c_max", c_max, untruncated_ok=True)
    rho = _sequence_ratios(sequence_log_weight, old_logprobs, sampler_logprobs, mask, log_ratio_clamp)
    w = [truncate_weight(r, c_min, c_max) for r in rho]
    return {"weight": _broadcast(mask, w), "seq_weight": w, "seq_ratio": rho}


@formula(
    "is.sequence.mask",
    title="Sequence MIS weight w_i = rho_i * 1[C_min <= rho_i <= C_max], rho_i = exp(sum_t (l_old - l_mu))",
    inputs=INPUTS,
    params=_mask_params(),
    outputs=(WEIGHT, KEEP, SEQ_WEIGHT, SEQ_KEEP, SEQ_RATIO),
    references=(MISMATCH, TRL_IS + " (sequence_mask, the TRL default with C_max = 3)",
                VERL_IS + " (rollout_is=sequence, 'L_U')", SLIME_IS),
)
def sequence_mask(old_logprobs, sampler_logprobs, mask, *, c_min, c_max, log_ratio_clamp):
    """is.sequence.mask:  rho_i = exp(clip(sum_t m_{i,t} (l^old_{i,t} - l^mu_{i,t}), -c, c)),
    k_i = 1[C_min <= rho_i <= C_max],  w_i = rho_i k_i,  broadcast to the unmasked tokens of i."""
    _check_bounds("is.sequence.mask", "c_min", c_min, "c_max", c_max)
    rho = _sequence_ratios(sequence_log_weight, old_logprobs, sampler_logprobs, mask, log_ratio_clamp)
    keep = [in_band(r, c_min, c_max) for r in rho]
    w = [mask_weight(r, c_min, c_max) for r in rho]
    return {"weight": _broadcast(mask, w), "keep": _broadcast(mask, keep), "seq_weight": w,
            "seq_keep": keep, "seq_ratio": rho}


# Geometric level (geometric mean of token ratios) ----------------------------------------------

@formula(
    "is.geometric.truncate",
    title="Geometric TIS weight w_i = clip(exp(mean_t (l_old - l_mu)), C_min, C_max), broadcast to tokens",
    inputs=INPUTS,
    params=_truncate_params(),
    outputs=(WEIGHT, SEQ_WEIGHT, SEQ_RATIO),
    references=(MISMATCH, NEMO_2269, SLIME_IS + " (level geometric, mode truncate/clip)",
                AREAL_RS + " (ratio metric, clamp action, sequence level)"),
)
def geometric_truncate(old_logprobs, sampler_logprobs, mask, *, c_min, c_max, log_ratio_clamp):
    """is.geometric.truncate:  rho_i = exp(clip((1/L_i) sum_t m_{i,t} (l^old_{i,t} - l^mu_{i,t}), -c, c)),
    w_i = clip(rho_i, C_min, C_max),  broadcast;  L_i = 0 gives rho_i = 1."""
    _check_bounds("is.geometric.truncate", "c_min", c_min, "c_max", c_max, untruncated_ok=True)
    rho = _sequence_ratios(geometric_log_weight, old_logprobs, sampler_logprobs, mask, log_ratio_clamp)
    w = [truncate_weight(r, c_min, c_max) for r in rho]
    return {"weight": _broadcast(mask, w), "seq_weight": w, "seq_ratio": rho}


@formula(
    "is.geometric.mask",
    title="Geometric MIS weight w_i = rho_i * 1[C_min <= rho_i <= C_max], rho_i = exp(mean_t (l_old - l_mu))",
    inputs=INPUTS,
    params=_mask_params(),
    outputs=(WEIGHT, KEEP, SEQ_WEIGHT, SEQ_KEEP, SEQ_RATIO),
    references=(MISMATCH, SLIME_IS + " (level geometric, mode mask)",
                AREAL_RS + " (ratio metric, mask action, agg mean: weight = geometric mean)",
                OPENRLHF_IS + " (seq level ratio statistic is the geometric mean)"),
)
def geometric_mask(old_logprobs, sampler_logprobs, mask, *, c_min, c_max, log_ratio_clamp):
    """is.geometric.mask:  rho_i = exp(clip((1/L_i) sum_t m_{i,t} (l^old_{i,t} - l^mu_{i,t}), -c, c)),
    k_i = 1[C_min <= rho_i <= C_max],  w_i = rho_i k_i,  broadcast;  L_i = 0 gives rho_i = 1."""
    _check_bounds("is.geometric.mask", "c_min", c_min, "c_max", c_max)
    rho = _sequence_ratios(geometric_log_weight, old_logprobs, sampler_logprobs, mask, log_ratio_clamp)
    keep = [in_band(r, c_min, c_max) for r in rho]
    w = [mask_weight(r, c_min, c_max) for r in rho]
    return {"weight": _broadcast(mask, w), "keep": _broadcast(mask, keep), "seq_weight": w,
            "seq_keep": keep, "seq_ratio": rho}


# Rejection by a divergence statistic -----------------------------------------------------------

@formula(
    "is.reject",
    title="Rejection by a k1/k2/k3 divergence statistic of (l_old, l_mu) at token or sequence level",
    inputs=INPUTS,
    params=(
        Param("estimator", "k3", kind="choice", choices=("k1", "k2", "k3"),
              doc="Schulman estimator applied to u: k1 = -u, k2 = u^2/2, k3 = e^u - 1 - u"),
        Param("direction", "mu_old", kind="choice", choices=("mu_old", "old_mu"),
              doc="which KL the estimator estimates: 'mu_old' takes u = l^old - l^mu (KL(mu || pi_old), "
                  "the tokens being sampled from mu; verl), 'old_mu' takes u = l^mu - l^old (AReaL's kl_k1/kl_k3)"),
        Param("level", "seq_mean", kind="choice", choices=("token", "seq_sum", "seq_mean", "seq_max"),
              doc="token: each token's own statistic; seq_sum / seq_mean / seq_max: the sum, mean or max over "
                  "the sequence's unmasked tokens, the decision broadcast to all of them"),
        Param("lower", None, nullable=True, doc="keep iff statistic >= lower (null: no lower bound)"),
        Param("upper", 0.01, nullable=True,
              doc="keep iff statistic <= upper (null: no upper bound); 0.01 with k3 / seq_mean is verl's "
                  "bypass_ppo_clip_k3_rs preset"),
        _clamp_param(),
    ),
    outputs=(
        Output("keep", ("B", "T"), kind="bool",
               doc="1[lower <= statistic <= upper] (the sequence decision broadcast at seq_* levels) "
                   "(null where the mask is false)"),
        token_output("token_stat", "d_{i,t}, the estimator's value at token t"),
        seq_output("seq_stat", "D_i, the sequence statistic (null at level token)"),
        Output("seq_keep", ("B",), kind="bool", doc="1[lower <= D_i <= upper] (null at level token)"),
    ),
    references=(SCHULMAN, VERL_RS, AREAL_RS, MISMATCH),
)
def reject(old_logprobs, sampler_logprobs, mask, *, estimator, direction, level, lower, upper, log_ratio_clamp):
    """is.reject:  u_{i,t} = clip(s (l^old_{i,t} - l^mu_{i,t}), -c, c) with s = +1 ('mu_old') or -1
    ('old_mu'),  d_{i,t} = k(u_{i,t}) for k in {k1, k2, k3},
    token:  keep_{i,t} = 1[lower <= d_{i,t} <= upper];
    seq_*:  D_i = sum / mean / max of d_{i,t} over the unmasked t,  keep_{i,t} = 1[lower <= D_i <= upper]."""
    _check_bounds("is.reject", "lower", lower, "upper", upper)
    sign = 1 if direction == "mu_old" else -1
    stat = [
        [divergence(estimator, clamp_log_weight(sign * token_log_weight(old_logprobs[i], sampler_logprobs[i], t),
                                                log_ratio_clamp)) if m else None
         for t, m in enumerate(row)]
        for i, row in enumerate(mask)
    ]
    if level == "token":
        return {"keep": _map(stat, lambda d: in_band(d, lower, upper)), "token_stat": stat,
                "seq_stat": [None] * len(mask), "seq_keep": [None] * len(mask)}
    seq_stat = [reduce_statistic(level, [d for d in row if d is not None]) for row in stat]
    seq_keep = [in_band(d, lower, upper) for d in seq_stat]
    return {"keep": _broadcast(mask, seq_keep), "token_stat": stat, "seq_stat": seq_stat, "seq_keep": seq_keep}
