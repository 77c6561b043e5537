"""kl: per-token KL-penalty estimators between the current and the reference policy (spec/kl.md).

Every estimator is a function of the reference log-ratio

    x = l^ref - l = log(pi_ref / pi_theta)        (the token sampled from pi_theta)

so that, with r = pi_ref / pi_theta = e^x (Schulman 2020): k1 = -x, k2 = x^2 / 2,
k3 = r - 1 - log r = e^x - 1 - x, abs = |x|.  k1 and k3 are unbiased for KL(pi_theta || pi_ref);
k2, k3 and abs are non-negative at every token, k1 only in expectation.

The plain per-element functions below (``log_ratio``, ``clamp_log_ratio``, ``k1``, ``k2``, ``k3``,
``k_abs``, ``clamp_value``, ``clamped_estimate``, ``straight_through``, ``ratio_weight``,
``importance_weighted_k3``) are what the ``loss.*`` recipes compose; the registered formulas only
iterate them over the unmasked tokens.
"""

from __future__ import annotations

from ._ad import Var, absolute, clip, exp, expm1_minus_x, is_var, sg, value_of
from ._common import LOGPROBS, MASK, OLD_LOGPROBS, REF_LOGPROBS, per_token, require, token_output
from ._registry import Param, formula

SCHULMAN_KL = "Schulman 2020, Approximating KL Divergence, http://joschu.net/blog/kl-approx.html"
DEEPSEEK_V32 = "DeepSeek-AI 2025, DeepSeek-V3.2, arXiv:2512.02556, section 3.1 Eq. 7 (unbiased KL estimate)"
GRPO = "Shao et al. 2024, DeepSeekMath (GRPO), arXiv:2402.03300, Eq. 4 (k3 as the GRPO KL term)"
VERL_KL = "verl 0.9.1 verl/trainer/ppo/core_algos.py kl_penalty / kl_penalty_forward"
NEMO_KL = ("NeMo-RL 7ea279ab nemo_rl/algorithms/utils.py calculate_kl "
           "(kl_input_clamp_value=20, kl_output_clamp_value=10)")
ORLHF_KL = "OpenRLHF 0.11.2 openrlhf/models/utils.py compute_approx_kl"
SLIME_KL = "slime 624b824a slime/utils/ppo_utils.py compute_approx_kl"
TRL_KL = "trl 1.16.0 GRPOTrainer._compute_loss (k3 term, use_bias_correction_kl)"


# Per-element primitives ------------------------------------------------------------------------

def log_ratio(logprob, ref_logprob):
    """x = l^ref - l = log(pi_ref / pi_theta): the log-ratio every estimator here is a function of.

    Frameworks that write lambda = l - l^ref (verl, OpenRLHF, slime, AReaL, SkyRL) have lambda = -x.
    """
    return ref_logprob - logprob


def clamp_log_ratio(x, lo, hi):
    """Input clamp clip(x, lo, hi), applied to x before the estimator (before exp in k3).

    Either bound may be None (no bound on that side).  The derivative is 1 on the closed interval
    [lo, hi] and 0 outside (torch.clamp), so a clamped token carries no gradient through x.
    """
    if lo is None and hi is None:
        return x
    return clip(x, lo, hi)


def clamp_value(y, lo, hi):
    """Output clamp clip(y, lo, hi), applied to the estimator's value (after the IS weight, if any).

    Either bound may be None; derivative 1 on the closed interval [lo, hi], 0 outside.
    """
    if lo is None and hi is None:
        return y
    return clip(y, lo, hi)


def k1(x):
    """k1 = -log r = -x = l - l^ref: unbiased for KL(pi_theta || pi_ref), signed, high variance."""
    return -x


def k2(x):
    """k2 = (log r)^2 / 2 = x^2 / 2: biased, low variance, >= 0; its gradient is the k3+ gradient."""
    return x * x / 2


def k3(x):
    """k3 = (r - 1) - log r = e^x - 1 - x: unbiased, low variance, >= 0.

    Computed as expm1_minus_x(x), exact to working precision even for tiny |x| (where e^x - 1 - x
    would cancel catastrophically).
    """
    return expm1_minus_x(x)


def k_abs(x):
    """abs = |log r| = |x|; derivative sign(x), 0 at x = 0 (torch.abs)."""
    return absolute(x)


ESTIMATORS = {"k1": k1, "k2": k2, "k3": k3, "abs": k_abs}


def clamped_estimate(k, x, log_ratio_min=None, log_ratio_max=None, output_min=None, output_max=None):
    """clip(k(clip(x, log_ratio_min, log_ratio_max)), output_min, output_max) for an estimator k."""
    return clamp_value(k(clamp_log_ratio(x, log_ratio_min, log_ratio_max)), output_min, output_max)


def straight_through(value, x):
    """sg[value] + k2(x) - sg[k2(x)]: the value of ``value``, the gradient of k2(x) (verl's ``+``)."""
    g = k2(x)
    return sg(value) + (g - sg(g))


def ratio_weight(logprob, old_logprob):
    """w = pi_theta / pi_old = exp(l - l^old): the importance weight of DeepSeek-V3.2 Eq. 7.

    It is differentiated (no stop-gradient): the estimator (pi_theta/pi_old) * k3 has an unbiased
    gradient only because d w / d l = w (spec/kl.md#kl.k3_unbiased).
    """
    return exp(logprob - old_logprob)


def importance_weighted_k3(logprob, old_logprob, ref_logprob, log_ratio_min=None, log_ratio_max=None,
                           sg_ratio_where_clamped=True):
    """w * k3(clip(x, lo, hi)) with w = exp(l - l^old) differentiated and x = l^ref - l.

    Its derivative with respect to l is, exactly,

        d/dl [w k3(x)]        = w k3(x) - w (e^x - 1) = -w x            (x inside [lo, hi])
        d/dl [w k3(clip(x))]  = w k3(clip(x)), or 0 if sg_ratio_where_clamped   (x outside)

    Applied term by term, the chain rule would add the two paths (through w and through x) at the
    leaf: w k3(x) + (-w (e^x - 1)), two numbers of size w e^x whose sum is -w x, so every digit
    would be lost at x = 200.  This node therefore carries the closed-form derivative of the product,
    with l as its only operand (l^old and l^ref are constants).
    """
    l = value_of(logprob)
    w = ratio_weight(l, value_of(old_logprob))
    x = log_ratio(l, value_of(ref_logprob))
    x_clamped = clamp_log_ratio(x, log_ratio_min, log_ratio_max)
    k = k3(x_clamped)
    y = w * k
    if not is_var(logprob):
        return y
    # The rounding error of the formula as usually written, w = exp(l - l_old) times
    # k3 = exp(x) - 1 - x with x = l_ref - l (for the tolerance model; see _ad.error_scales).
    e_w = abs(w) * (1 + abs(l - value_of(old_logprob)))
    e_k = abs(exp(x_clamped)) + abs(exp(x_clamped) - 1) + abs(k) + abs(exp(x_clamped) - 1) * abs(x_clamped)
    rounding = abs(y) + abs(k) * e_w + abs(w) * e_k
    if x_clamped == x:
        # the derivative as the chain rule usually forms it, w k3(x) - w (e^x - 1): the error of each
        # path's product (w's, k3's, and e^x - 1 from a rounded e^x of an x that errs by |x|) and
        # of their difference, which cancels to -w x (_ad.error_scales: a fused node's dscale)
        e_x1 = abs(exp(x)) * (2 + abs(x)) + abs(exp(x) - 1)
        dscale = abs(k) * e_w + abs(w) * e_k + abs(w) * e_x1 + abs(exp(x) - 1) * e_w + abs(w * x)
        return Var(y, ((logprob, -(w * x)),), rounding=rounding, dscale=(dscale,))
    if sg_ratio_where_clamped:
        return Var(y, (), source=Var(y, (), rounding=rounding))  # sg[w] k3(constant): no derivative
    return Var(y, ((logprob, y),), rounding=rounding)


# Registered formulas ---------------------------------------------------------------------------

def _clamp_params(estimator):
    return (
        Param("log_ratio_min", None, nullable=True,
              doc="input clamp: lower bound on x = l_ref - l before the estimator "
                  "(verl k3: -20; NeMo-RL: -kl_input_clamp_value = -20; null: no bound)"),
        Param("log_ratio_max", None, nullable=True,
              doc="input clamp: upper bound on x = l_ref - l before the estimator "
                  "(verl k3: 20; NeMo-RL: 20; OpenRLHF k3: 10; null: no bound)"),
        Param("output_min", None, nullable=True,
              doc=f"output clamp: lower bound on the {estimator} value "
                  "(verl k3, NeMo-RL, OpenRLHF: -10; null: no bound)"),
        Param("output_max", None, nullable=True,
              doc=f"output clamp: upper bound on the {estimator} value "
                  "(verl k3, NeMo-RL, OpenRLHF: 10; null: no bound)"),
    )


def _check_bounds(fid, log_ratio_min, log_ratio_max, output_min, output_max):
    for lo_name, lo, hi_name, hi in (
        ("log_ratio_min", log_ratio_min, "log_ratio_max", log_ratio_max),
        ("output_min", output_min, "output_max", output_max),
    ):
        require(
            lo is None or hi is None or lo < hi,
            f"{fid}: parameter {lo_name!r} must be less than {hi_name!r}, "
            f"got {lo_name}={lo} and {hi_name}={hi}",
        )


def _estimator_formula(fid, title, estimator, references, stop_gradients=()):
    return formula(
        fid,
        title=title,
        inputs=(LOGPROBS, REF_LOGPROBS, MASK),
        params=_clamp_params(estimator),
        outputs=(token_output("kl", f"per-token {estimator} penalty"),),
        differentiable=("logprobs",),
        grad_of="kl",
        stop_gradients=stop_gradients,
        references=references,
    )


@_estimator_formula(
    "kl.k1", "k1 = l - l_ref = -log(pi_ref/pi_theta), optional input/output clamps", "k1",
    (SCHULMAN_KL, VERL_KL + " ('kl'/'k1', no clamp)", ORLHF_KL + " (k1, output clamp [-10, 10])",
     NEMO_KL, SLIME_KL + " (default kl_loss_type='k1')"),
)
def kl_k1(logprobs, ref_logprobs, mask, *, log_ratio_min, log_ratio_max, output_min, output_max):
    """kl.k1:  y_{i,t} = clip(k1(clip(x_{i,t}, a, b)), c, d),  k1(x) = -x,  x = l^ref_{i,t} - l_{i,t}."""
    _check_bounds("kl.k1", log_ratio_min, log_ratio_max, output_min, output_max)
    return {"kl": per_token(mask, lambda i, t: clamped_estimate(
        k1, log_ratio(logprobs[i][t], ref_logprobs[i][t]), log_ratio_min, log_ratio_max, output_min, output_max))}


@_estimator_formula(
    "kl.k2", "k2 = (l - l_ref)^2 / 2, optional input/output clamps", "k2",
    (SCHULMAN_KL, VERL_KL + " ('mse'/'k2', no clamp)", ORLHF_KL + " (k2, output clamp [-10, 10])",
     NEMO_KL, SLIME_KL),
)
def kl_k2(logprobs, ref_logprobs, mask, *, log_ratio_min, log_ratio_max, output_min, output_max):
    """kl.k2:  y_{i,t} = clip(k2(clip(x_{i,t}, a, b)), c, d),  k2(x) = x^2 / 2,  x = l^ref_{i,t} - l_{i,t}."""
    _check_bounds("kl.k2", log_ratio_min, log_ratio_max, output_min, output_max)
    return {"kl": per_token(mask, lambda i, t: clamped_estimate(
        k2, log_ratio(logprobs[i][t], ref_logprobs[i][t]), log_ratio_min, log_ratio_max, output_min, output_max))}


@_estimator_formula(
    "kl.k3", "k3 = e^x - 1 - x with x = l_ref - l (low_var_kl), optional input/output clamps", "k3",
    (SCHULMAN_KL, GRPO, VERL_KL + " ('low_var_kl'/'k3': x clamped to [-20, 20], value to [-10, 10])",
     NEMO_KL, ORLHF_KL + " (k3: x <= 10, value to [-10, 10])", SLIME_KL, TRL_KL + " (no clamp)",
     "Megatron-LM d98e8a64 megatron/rl/rl_utils.py calculate_grpo_loss (k3, no clamp)"),
)
def kl_k3(logprobs, ref_logprobs, mask, *, log_ratio_min, log_ratio_max, output_min, output_max):
    """kl.k3:  y_{i,t} = clip(k3(clip(x_{i,t}, a, b)), c, d),  k3(x) = e^x - 1 - x,  x = l^ref_{i,t} - l_{i,t}."""
    _check_bounds("kl.k3", log_ratio_min, log_ratio_max, output_min, output_max)
    return {"kl": per_token(mask, lambda i, t: clamped_estimate(
        k3, log_ratio(logprobs[i][t], ref_logprobs[i][t]), log_ratio_min, log_ratio_max, output_min, output_max))}


@_estimator_formula(
    "kl.abs", "abs = |l - l_ref|, optional input/output clamps", "abs",
    (SCHULMAN_KL, VERL_KL + " ('abs', no clamp)",
     "SkyRL skyrl-train 0.3.1 skyrl_train/utils/ppo_utils.py compute_approx_kl ('abs', no clamp)"),
)
def kl_abs(logprobs, ref_logprobs, mask, *, log_ratio_min, log_ratio_max, output_min, output_max):
    """kl.abs:  y_{i,t} = clip(|clip(x_{i,t}, a, b)|, c, d),  x = l^ref_{i,t} - l_{i,t}."""
    _check_bounds("kl.abs", log_ratio_min, log_ratio_max, output_min, output_max)
    return {"kl": per_token(mask, lambda i, t: clamped_estimate(
        k_abs, log_ratio(logprobs[i][t], ref_logprobs[i][t]), log_ratio_min, log_ratio_max, output_min, output_max))}


@_estimator_formula(
    "kl.k3_straight_through",
    "k3+ (low_var_kl+): the value of the clamped k3, the gradient of the unclamped k2", "k3",
    (SCHULMAN_KL, VERL_KL + " ('k3+'/'low_var_kl+': backward_score - backward_score.detach() + "
     "forward_score.detach(), backward_score = 0.5 (l - l_ref)^2 unclamped)",
     "verl PR #2953 (k3 gradient bias; origin of the '+' variants)"),
    stop_gradients=("the clamped k3 value (value only, no gradient)",
                    "k2(x) in the subtracted copy (so k2 contributes gradient only)"),
)
def kl_k3_straight_through(logprobs, ref_logprobs, mask, *, log_ratio_min, log_ratio_max, output_min, output_max):
    """kl.k3_straight_through:
    y_{i,t} = sg[clip(k3(clip(x_{i,t}, a, b)), c, d)] + k2(x_{i,t}) - sg[k2(x_{i,t})],  x = l^ref - l.

    Value: the clamped k3.  Gradient: d k2(x)/d l = -x = l - l^ref, unclamped (the clamps act on the
    value only, as in verl).
    """
    _check_bounds("kl.k3_straight_through", log_ratio_min, log_ratio_max, output_min, output_max)

    def token(i, t):
        x = log_ratio(logprobs[i][t], ref_logprobs[i][t])
        return straight_through(clamped_estimate(k3, x, log_ratio_min, log_ratio_max, output_min, output_max), x)

    return {"kl": per_token(mask, token)}


@formula(
    "kl.k3_unbiased",
    title="DeepSeek-V3.2 unbiased KL: (pi_theta/pi_old) * k3, the ratio differentiated",
    inputs=(LOGPROBS, OLD_LOGPROBS, REF_LOGPROBS, MASK),
    params=_clamp_params("weighted k3 (after the ratio multiply)") + (
        Param("sg_ratio_where_clamped", True, kind="bool",
              doc="if true, the ratio pi_theta/pi_old is stop-gradiented at tokens where the input "
                  "clamp is active (x outside [log_ratio_min, log_ratio_max]), as NeMo-RL does since "
                  "PR #2958; no effect without an input clamp"),
    ),
    outputs=(token_output("kl", "per-token importance-weighted k3 penalty"),),
    differentiable=("logprobs",),
    grad_of="kl",
    stop_gradients=("the ratio exp(l - l_old), only where the input clamp is active and "
                    "sg_ratio_where_clamped is true",),
    references=(
        DEEPSEEK_V32,
        TRL_KL + " (use_bias_correction_kl=True, default in 1.16.0: k3 * coef_1, coef_1 taken before "
        "the delta clamp, not detached)",
        SLIME_KL + " (--use-unbiased-kl: importance_ratio = exp(l - l_old), not detached; "
        "low_var_kl clamps the product to [-10, 10])",
        NEMO_KL + " (importance_sampling_weights multiplied before the output clamp; detached where the "
        "input clamp is active, PR #2958)",
    ),
)
def kl_k3_unbiased(logprobs, old_logprobs, ref_logprobs, mask, *,
                   log_ratio_min, log_ratio_max, output_min, output_max, sg_ratio_where_clamped):
    """kl.k3_unbiased:
    y_{i,t} = clip(w_{i,t} * k3(clip(x_{i,t}, a, b)), c, d),  w_{i,t} = exp(l_{i,t} - l^old_{i,t}),
    x = l^ref - l; w is differentiated (sg[w] only where clip(x, a, b) != x and
    sg_ratio_where_clamped).

    Unclamped, d y / d l = w (k3(x) - (e^x - 1)) = -w x = w (l - l^ref).
    """
    _check_bounds("kl.k3_unbiased", log_ratio_min, log_ratio_max, output_min, output_max)

    def token(i, t):
        weighted = importance_weighted_k3(logprobs[i][t], old_logprobs[i][t], ref_logprobs[i][t],
                                          log_ratio_min, log_ratio_max, sg_ratio_where_clamped)
        return clamp_value(weighted, output_min, output_max)

    return {"kl": per_token(mask, token)}
