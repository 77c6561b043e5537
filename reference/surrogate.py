"""surrogate: per-token and per-sequence policy-gradient loss terms (spec/surrogate.md).

Every output here is a LOSS, the negated objective of the defining paper (spec/conventions.md).
With the token ratio r = exp(l - l_old) and the advantage A:

    pg          -A r                          (or -A l, the REINFORCE form)
    ppo_clip    max(-A r, -A clip(r, 1-eps_low, 1+eps_high))
    dual_clip   ppo_clip, and for A < 0 at most -c A
    trl_delta   max(-A min(r, delta), -A clip(r, 1-eps_low, 1+eps_high))   (TRL / Liger `delta`)
    gspo        ppo_clip of the sequence ratio s_i = exp(mean_t (l - l_old)), one term per sequence
    gmpo        -A_i exp(mean_t of the sign-aware log-space clipped log-ratio), one term per sequence
    cispo       -sg[w] A l, with w = clip(r, 1-eps_low, 1+eps_high) or min(r, eps_high)
    sapo        -A (4/tau) sigma(tau (r - 1)), tau by the sign of A
    vespo       -sg[phi_i] A_i l, phi_i = w^k e^{lambda (1 - w)} of the clamped sequence ratio w

The plain per-element functions below (``token_ratio``, ``pg_loss``, ``pg_logprob_loss``,
``ppo_clip_loss``, ``dual_clip_loss``, ``trl_delta_loss``, ``gmpo_clipped_log_ratio``,
``cispo_weight``, ``cispo_loss``, ``sapo_tau``, ``sapo_gate``, ``vespo_log_weight``,
``vespo_phi``) are what the ``loss.*`` recipes compose; each registered formula only iterates them
over the unmasked tokens of the batch.  They accept ``_ad.Var`` or plain ``mpf`` operands.
"""

from __future__ import annotations

from mpmath import mp, mpf

from ._ad import Var, clip, exp, expm1, maximum, minimum, sg, total, value_of
from ._common import (
    ADV_SEQ, ADV_SEQ_OR_TOKEN, LOGPROBS, MASK, OLD_LOGPROBS, log_ratio_clamp_param, per_token,
    positions, require, seq_output, token_adv, token_output,
)
from ._registry import Input, Output, Param, formula
from .agg import DOCUMENT_IDS
from .ratio import clamp_log_ratio, sequence_geometric_ratio

# Defining papers ---------------------------------------------------------------------------
WILLIAMS = "Williams 1992, Simple statistical gradient-following algorithms for connectionist RL (REINFORCE), Machine Learning 8:229-256"
PPO = "Schulman et al. 2017, Proximal Policy Optimization Algorithms, arXiv:1707.06347"
DAPO = "Yu et al. 2025, DAPO, arXiv:2503.14476, section 4.1 (clip-higher: eps_low=0.2, eps_high=0.28)"
DUAL = "Ye et al. 2020, Mastering Complex Control in MOBA Games with Deep RL (dual-clip PPO), arXiv:1912.09729"
INTELLECT2 = "Prime Intellect 2025, INTELLECT-2 technical report (two-sided GRPO clipping, delta=4), arXiv:2505.07291 section 4.1"
GSPO = "Zheng et al. 2025, Group Sequence Policy Optimization, arXiv:2507.18071 v2, Eq. 5-7, section 5.1"
GMPO = "Zhao et al. 2025, Geometric-Mean Policy Optimization, arXiv:2507.20673, Eq. 4 and Algorithm 1"
CISPO = "MiniMax 2025, MiniMax-M1 (CISPO), arXiv:2506.13585, section 3.1 Eq. 4-5"
SCALERL = "Khatri et al. 2025, The Art of Scaling RL Compute for LLMs (ScaleRL), arXiv:2510.13786, section 3.2 Eq. 4 (absolute cap)"
SAPO = "Gao et al. 2025, Soft Adaptive Policy Optimization (SAPO), arXiv:2511.20347, section 3 and 5.1"
VESPO = "VESPO: Variational Sequence-Level Soft Policy Optimization, arXiv:2602.10693 (as implemented in trl PR #5199)"

# Framework sources (versions as read in the research catalog) -------------------------------
TRL_LOSS = "trl 1.16.0 trl/trainer/grpo_trainer.py GRPOTrainer._compute_loss"
LIGER_LOSS = "liger-kernel 0.8.5 liger_kernel/chunked_loss/grpo_loss.py LigerFusedLinearGRPOFunction.ppo_loss_fn"
VERL = "verl 0.9.1 verl/trainer/ppo/core_algos.py"
NEMO = "NeMo-RL 7ea279ab nemo_rl/algorithms/loss/loss_functions.py ClippedPGLossFn"
SLIME = "slime main slime/utils/ppo_utils.py"
ORLHF = "OpenRLHF 0.11.2 openrlhf/models/loss.py PolicyLoss"
AREAL = "AReaL 1.0.4 areal/utils/functional/functional.py"
SKYRL = "skyrl-train 0.3.1 PolicyLossRegistry"

OLD_LOGPROBS_OPTIONAL = Input(
    "old_logprobs", (("B", "T"),), optional=True,
    doc="trainer's log-probs at sampling time; omitted: the on-policy ratio exp(l - sg[l])",
)
SAMPLER_LOGPROBS_OPTIONAL = Input(
    "sampler_logprobs", (("B", "T"),), optional=True,
    doc="inference engine's log-probs at sampling time; omitted: no train/inference IS factor",
)


def _eps_low(default, doc):
    return Param("eps_low", default, lo=0, hi=1, doc=doc)


def _eps_high(default, doc):
    return Param("eps_high", default, lo=0, doc=doc)


# Per-element functions ----------------------------------------------------------------------

def token_ratio(l, l_old, log_ratio_clamp=None):
    """r = exp(clip(l - l_old, -c, c)) (no clip when c is None); l_old None means sg[l] (on-policy)."""
    if l_old is None:
        l_old = sg(l)
    return exp(clamp_log_ratio(l - l_old, log_ratio_clamp))


def pg_loss(r, a):
    """Vanilla policy-gradient loss in ratio form, -A r (the negated CPI surrogate r A)."""
    return r * -a  # operand order: Var first (mpf * Var first tries to convert the Var)


def pg_logprob_loss(l, a):
    """Vanilla policy-gradient loss in REINFORCE form, -A l (value contains l; gradient -A)."""
    return l * -a


def ppo_clip_loss(r, a, eps_low, eps_high):
    """PPO clip loss -min(r A, clip(r, 1-eps_low, 1+eps_high) A) = max(-A r, -A clip(r, ...))."""
    return maximum(r * -a, clip(r, 1 - eps_low, 1 + eps_high) * -a)


def dual_clip_loss(r, a, eps_low, eps_high, c):
    """Dual-clip PPO loss: ppo_clip_loss, and for A < 0 min(ppo_clip_loss, -c A)."""
    loss = ppo_clip_loss(r, a, eps_low, eps_high)
    return minimum(loss, -c * a) if a < 0 else loss


def trl_delta_loss(r, a, eps_low, eps_high, delta):
    """TRL/Liger `delta` loss: -min(clip(r, -inf, delta) A, clip(r, 1-eps_low, 1+eps_high) A).

    The cap is an upper clamp of the unclipped branch's ratio (torch.clamp(max=delta): derivative 1
    at r = delta); the clipped branch uses the uncapped ratio.
    """
    return maximum(clip(r, None, delta) * -a, clip(r, 1 - eps_low, 1 + eps_high) * -a)


def gmpo_clipped_log_ratio(d, a, eps_low, eps_high):
    """GMPO's sign-aware log-space clip of a token log-ratio d = l - l_old:
    min(d, clip(d, -eps_low, eps_high)) if A > 0, else max(d, clip(d, -eps_low, eps_high)).

    For eps_low = eps_high = delta this is sgn(A) min(sgn(A) d, clip(sgn(A) d, -delta, delta)) with
    sgn(0) = -1 (paper Eq. 4, Algorithm 1).
    """
    clipped = clip(d, -eps_low, eps_high)
    return minimum(d, clipped) if a > 0 else maximum(d, clipped)


def cispo_weight(r, cap_form, eps_low, eps_high):
    """CISPO's truncated IS weight (a value; the loss stops its gradient):
    relative: clip(r, 1 - eps_low, 1 + eps_high) (no lower bound when eps_low is None);
    absolute: min(r, eps_high).
    """
    if cap_form == "absolute":
        return clip(r, None, eps_high)
    return clip(r, None if eps_low is None else 1 - eps_low, 1 + eps_high)


def cispo_loss(w, a, l):
    """CISPO loss -sg[w] A l: value -w A l, gradient -w A with respect to l."""
    return l * (-sg(w) * a)


def sapo_tau(a, tau_pos, tau_neg):
    """SAPO's temperature: tau_pos if A > 0, else tau_neg (A = 0 takes tau_neg)."""
    return tau_pos if a > 0 else tau_neg


def _sigmoid(x):
    if x >= 0:
        return 1 / (1 + mp.exp(-x))
    e = mp.exp(x)
    return e / (1 + e)


def sapo_gate(log_r, tau):
    """SAPO soft gate f(r) = sigma(tau (r - 1)) 4 / tau at r = exp(log_r), as one node of log_r.

    Takes the log-ratio so that it is exact everywhere: its derivative
    df/dlog_r = 4 sigma(x) sigma(-x) r, x = tau (r - 1), is evaluated cancellation-free
    (sigma(-x), not 1 - sigma(x)) and with enough extra precision that x = tau (e^{log_r} - 1) is
    exact to working precision even for log_r = 200 (x ~ 10^87), where the derivative is
    about e^{-10^87}.  df/dr at r = 1 is 1; f(1) = 2 / tau.
    """
    z = value_of(log_r)
    extra = 24 + (int(z * mpf("1.4426950408889634")) if z > 0 else 0)  # bits of x above 1
    with mp.workprec(mp.prec + extra):
        x = tau * expm1(z)      # mp.expm1(z) bit for bit (reference/_ad.py), without its context switches
        p, q = _sigmoid(x), _sigmoid(-x)
        value = 4 * p / tau
        r = mp.exp(z)
        slope = 4 * p * q * r
        # The derivative as usually computed (autograd through torch.sigmoid) is 4 s (1 - s) r with s
        # the rounded sigmoid: 1 - s then carries an absolute error of about u p, which dominates
        # once the gate saturates (q = 1 - p < u).  First-order error, in units of u:
        # 4 r p (1 + q (D + 4)), D = tau (r + |r - 1|) + |x| the error of x = tau (r - 1).
        dscale = 4 * r * p * (1 + q * (tau * (r + abs(r - 1)) + abs(x) + 4))
    value, slope, dscale = +value, +slope, +dscale  # round to the working precision
    if isinstance(log_r, Var):
        return Var(value, ((log_r, slope),), dscale=(dscale,))
    return value


def vespo_log_weight(log_ratios, log_is=(), *, log_ratio_clamp, min_weight, max_log_weight):
    """VESPO's clamped log sequence weight (a value):
    clip(sum_t clip(d_t, -c, c) + sum_t clip(log rho_t, log w_min, W), log w_min, W)
    with d_t = l - l_old and log rho_t = l_old - l_mu over the sequence's unmasked tokens.
    """
    lo = mp.log(min_weight)
    s = total([clamp_log_ratio(sg(d), log_ratio_clamp) for d in log_ratios] +
              [clip(sg(x), lo, max_log_weight) for x in log_is])
    return clip(s, lo, max_log_weight)


def vespo_phi(log_w, a, *, k_pos, lambda_pos, k_neg, lambda_neg, lambda_min):
    """VESPO's sequence weight phi = exp(lambda + k log w - lambda w) = w^k e^{lambda (1 - w)}:
    (k, lambda) = (k_pos, lambda_pos) if A >= 0 else (k_neg, lambda_neg), lambda floored at
    lambda_min.  phi(w = 1) = 1.  Evaluated as exp(k log w - lambda expm1(log w)) with enough extra
    precision that lambda w is exact to working precision however large w is.
    """
    k, lam = (k_pos, lambda_pos) if a >= 0 else (k_neg, lambda_neg)
    lam = max(lam, lambda_min)
    z = value_of(log_w)
    extra = 24 + (int(z * mpf("1.4426950408889634")) if z > 0 else 0)
    with mp.workprec(mp.prec + extra):
        phi = mp.exp(k * z - lam * expm1(z))
        slope = phi * (k - lam * mp.exp(z))  # d phi / d log w
    phi, slope = +phi, +slope
    if isinstance(log_w, Var):
        # one node: its error as usually written is |phi| (1 + |k log w| + |lambda w|) (the
        # exponent's terms are each rounded), and the error of log w propagates through slope
        w = mp.exp(z)
        # as usually written, exp(lambda + k log w - lambda w): exp turns the absolute error of its
        # argument into relative error, and the argument rounds k log w, lambda w (w itself rounded)
        # and both partial sums; written w^k e^{lambda (1 - w)} it carries w's rounding k times (k)
        arg1 = lam + k * z
        rounding = 1 + abs(k * z) + abs(arg1) + abs(arg1 - lam * w) + 2 * abs(lam * w) + abs(k)
        return Var(phi, ((log_w, slope),), rounding=abs(phi) * rounding)
    return phi


# Registered formulas ---------------------------------------------------------------------------

def _clamp_param():
    return log_ratio_clamp_param(doc="if set to c, the token log-ratio l - l_old is clamped to [-c, c] before exp (null: no clamp)")


@formula(
    "surrogate.pg",
    title="Vanilla policy gradient: -A r (ratio form) or -A l (REINFORCE form)",
    inputs=(LOGPROBS, OLD_LOGPROBS_OPTIONAL, MASK, ADV_SEQ_OR_TOKEN),
    params=(
        Param("form", "ratio", kind="choice", choices=("ratio", "logprob"),
              doc="ratio: loss -A r with r = exp(l - l_old) (r = exp(l - sg[l]) when old_logprobs is omitted); "
                  "logprob: loss -A l (REINFORCE, verl `gpg`, NeMo-RL disable_ppo_ratio); same gradient on-policy"),
        _clamp_param(),
    ),
    outputs=(token_output("loss", "per-token loss -A r or -A l"),),
    differentiable=("logprobs",),
    grad_of="loss",
    stop_gradients=("l in the on-policy ratio exp(l - sg[l]) when form=ratio and old_logprobs is omitted",),
    references=(
        WILLIAMS, PPO + " Eq. 6 (L^CPI = r A)",
        VERL + " compute_policy_loss_gpg (-A l), compute_policy_loss_kl_cov (-A r outside its top-k)",
        NEMO + " disable_ppo_ratio (-A l), force_on_policy_ratio (exp(l - sg[l]))",
        TRL_LOSS + " (old_per_token_logps None => sg[l])",
    ),
)
def pg(logprobs, old_logprobs, mask, advantages, *, form, log_ratio_clamp):
    """surrogate.pg:  form=ratio:   loss_{i,t} = -A_{i,t} r_{i,t},  r = exp(clip(l - l_old, -c, c))
                                     (l_old = sg[l] when old_logprobs is omitted);
                      form=logprob: loss_{i,t} = -A_{i,t} l_{i,t}.
    """
    if form == "logprob":
        require(old_logprobs is None,
                "surrogate.pg: input 'old_logprobs' is not read by form='logprob' (loss -A*l); omit it or use form='ratio'")
        require(log_ratio_clamp is None,
                "surrogate.pg: parameter 'log_ratio_clamp' has no meaning for form='logprob' (no ratio); it must be null")
        return {"loss": per_token(mask, lambda i, t: pg_logprob_loss(logprobs[i][t], token_adv(advantages, i, t)))}
    old = (lambda i, t: None) if old_logprobs is None else (lambda i, t: old_logprobs[i][t])
    return {"loss": per_token(mask, lambda i, t: pg_loss(
        token_ratio(logprobs[i][t], old(i, t), log_ratio_clamp), token_adv(advantages, i, t)))}


@formula(
    "surrogate.ppo_clip",
    title="PPO clipped surrogate with eps_low / eps_high (clip-higher)",
    inputs=(LOGPROBS, OLD_LOGPROBS, MASK, ADV_SEQ_OR_TOKEN),
    params=(
        _eps_low(0.2, "lower clip range: the ratio is clipped below at 1 - eps_low"),
        _eps_high(0.2, "upper clip range: the ratio is clipped above at 1 + eps_high (DAPO clip-higher: 0.28)"),
        _clamp_param(),
    ),
    outputs=(token_output("loss", "per-token loss -min(r A, clip(r, 1-eps_low, 1+eps_high) A)"),),
    differentiable=("logprobs",),
    grad_of="loss",
    references=(
        PPO + " Eq. 7", DAPO, TRL_LOSS + " (epsilon, epsilon_high)", LIGER_LOSS,
        VERL + " compute_policy_loss_vanilla (clip_ratio_low/high; log-ratio clamp +-20; dual clip always on)",
        NEMO + " (ratio_clip_min/max)", SLIME + " compute_policy_loss (eps_clip, eps_clip_high)",
        ORLHF + " (clip_eps_low/high; log-ratio clamp +-20)", AREAL + " ppo_actor_loss_fn (eps_clip, eps_clip_higher)",
    ),
)
def ppo_clip(logprobs, old_logprobs, mask, advantages, *, eps_low, eps_high, log_ratio_clamp):
    """surrogate.ppo_clip:  loss_{i,t} = max(-A_{i,t} r_{i,t}, -A_{i,t} clip(r_{i,t}, 1 - eps_low, 1 + eps_high)),
    r = exp(clip(l - l_old, -c, c)).
    """
    return {"loss": per_token(mask, lambda i, t: ppo_clip_loss(
        token_ratio(logprobs[i][t], old_logprobs[i][t], log_ratio_clamp), token_adv(advantages, i, t),
        eps_low, eps_high))}


@formula(
    "surrogate.dual_clip",
    title="Dual-clip PPO: the PPO clip loss, bounded by -c A where A < 0",
    inputs=(LOGPROBS, OLD_LOGPROBS, MASK, ADV_SEQ_OR_TOKEN),
    params=(
        _eps_low(0.2, "lower clip range: the ratio is clipped below at 1 - eps_low"),
        _eps_high(0.2, "upper clip range: the ratio is clipped above at 1 + eps_high"),
        Param("c", 3.0, lo=1, lo_open=True, doc="dual-clip constant c > 1: for A < 0 the loss is at most -c A = c |A|"),
        _clamp_param(),
    ),
    outputs=(token_output("loss", "per-token dual-clip loss"),),
    differentiable=("logprobs",),
    grad_of="loss",
    references=(
        DUAL, PPO + " Eq. 7",
        VERL + " compute_policy_loss_vanilla (clip_ratio_c=3.0, always on; log-ratio clamp +-20)",
        NEMO + " (ratio_clip_c, default None)", SLIME + " compute_policy_loss (eps_clip_c)",
        ORLHF + " (dual_clip)", AREAL + " ppo_actor_loss_fn (c_clip)", SKYRL + " dual_clip (clip_ratio_c=3.0)",
    ),
)
def dual_clip(logprobs, old_logprobs, mask, advantages, *, eps_low, eps_high, c, log_ratio_clamp):
    """surrogate.dual_clip:  loss_{i,t} = L^clip_{i,t} if A_{i,t} >= 0, else min(L^clip_{i,t}, -c A_{i,t}),
    L^clip = max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high)).
    """
    return {"loss": per_token(mask, lambda i, t: dual_clip_loss(
        token_ratio(logprobs[i][t], old_logprobs[i][t], log_ratio_clamp), token_adv(advantages, i, t),
        eps_low, eps_high, c))}


@formula(
    "surrogate.trl_delta",
    title="TRL/Liger two-sided clipping: the unclipped branch's ratio capped at delta",
    inputs=(LOGPROBS, OLD_LOGPROBS, MASK, ADV_SEQ_OR_TOKEN),
    params=(
        _eps_low(0.2, "lower clip range (TRL `epsilon`): the clipped branch's ratio is clipped below at 1 - eps_low"),
        _eps_high(0.2, "upper clip range (TRL `epsilon_high`, None => epsilon): clipped above at 1 + eps_high"),
        Param("delta", 4.0, lo=0, lo_open=True,
              doc="cap on the unclipped branch's ratio, min(r, delta) (TRL/Liger `delta`; INTELLECT-2: 4); recommended > 1 + eps_high"),
    ),
    outputs=(token_output("loss", "per-token loss -min(min(r, delta) A, clip(r, 1-eps_low, 1+eps_high) A)"),),
    differentiable=("logprobs",),
    grad_of="loss",
    references=(INTELLECT2, TRL_LOSS + " (delta; trl PR #3434)", LIGER_LOSS + " (delta > 0)",
                "liger-kernel 0.8.5 liger_kernel/ops/grpo_loss.py (delta=None => disabled)"),
)
def trl_delta(logprobs, old_logprobs, mask, advantages, *, eps_low, eps_high, delta):
    """surrogate.trl_delta:  loss_{i,t} = max(-A_{i,t} clip(r_{i,t}, -inf, delta), -A_{i,t} clip(r_{i,t}, 1 - eps_low, 1 + eps_high)),
    r = exp(l - l_old) (unclamped, as TRL).
    """
    return {"loss": per_token(mask, lambda i, t: trl_delta_loss(
        token_ratio(logprobs[i][t], old_logprobs[i][t]), token_adv(advantages, i, t), eps_low, eps_high, delta))}


@formula(
    "surrogate.gspo",
    title="GSPO: PPO clip of the sequence geometric ratio, one loss per sequence",
    inputs=(LOGPROBS, OLD_LOGPROBS, MASK, ADV_SEQ),
    params=(
        _eps_low(3e-4, "left clip range: s_i is clipped below at 1 - eps_low (paper v2 section 5.1: 3e-4)"),
        _eps_high(4e-4, "right clip range: s_i is clipped above at 1 + eps_high (paper v2 section 5.1: 4e-4)"),
        Param("log_ratio_max", None, nullable=True,
              doc="placement 'on the mean': if set to c, log s_i is capped from above at c before exp (verl 10; null: no cap)"),
        log_ratio_clamp_param(doc="placement 'per token, before the mean': if set to k, each token log-ratio "
                                  "l - l_old is clamped to [-k, k] before the sequence mean (Liger-Kernel fork PR #4: "
                                  "20; null: no clamp)"),
    ),
    outputs=(seq_output("loss", "per-sequence loss -min(s_i A_i, clip(s_i, 1-eps_low, 1+eps_high) A_i); 0 for an empty sequence"),),
    differentiable=("logprobs",),
    grad_of="loss",
    references=(
        GSPO, TRL_LOSS + " importance_sampling_level='sequence'", LIGER_LOSS + " importance_sampling_level='sequence'",
        VERL + " compute_policy_loss_gspo (GSPO-token form, log s <= 10)", NEMO + " sequence_level_importance_ratios",
        SLIME + " (advantage_estimator gspo)", ORLHF + " policy_loss_type gspo",
        "Fast-LLM main fast_llm/layers/language_model/loss/policy_gradient.py LanguageModelGSPOLoss (segment-mean advantage)",
        "Liger-Kernel fork PR #4 (log_ratio_clamp_value=20 before the sequence mean)",
    ),
)
def gspo(logprobs, old_logprobs, mask, advantages, *, eps_low, eps_high, log_ratio_max, log_ratio_clamp):
    """surrogate.gspo:  loss_i = max(-A_i s_i, -A_i clip(s_i, 1 - eps_low, 1 + eps_high)),
    s_i = exp(min((1/L_i) sum_t m_{i,t} clip(l_{i,t} - l^old_{i,t}, -k, k), c))  (ratio.sequence_geometric;
    c = log_ratio_max, k = log_ratio_clamp);  loss_i = 0 for an empty sequence (L_i = 0).
    """
    s = sequence_geometric_ratio(logprobs, old_logprobs, mask, log_ratio_max=log_ratio_max,
                                 log_ratio_clamp=log_ratio_clamp)["ratio"]
    return {"loss": [ppo_clip_loss(s[i], advantages[i], eps_low, eps_high) if any(row) else mpf(0)
                     for i, row in enumerate(mask)]}


FASTLLM_502 = ("Fast-LLM PR #502 (head 227f8bc1) fast_llm/layers/language_model/loss/grpo.py "
               "fused_gspo_loss_forward_backward (per-segment lrn_sum, adv_sum, tok_sum all-reduced over the SDP group)")


@formula(
    "surrogate.gspo_document",
    title="GSPO over packed documents (Fast-LLM): per-document clipped loss of the document's geometric-mean ratio",
    inputs=(LOGPROBS, OLD_LOGPROBS, MASK, ADV_SEQ_OR_TOKEN, DOCUMENT_IDS),
    params=(
        _eps_low(0.2, "lower clip range: R_s is clipped below at 1 - eps_low (Fast-LLM epsilon_low 0.2)"),
        _eps_high(0.2, "upper clip range: R_s is clipped above at 1 + eps_high (Fast-LLM epsilon_high 0.2)"),
    ),
    outputs=(
        Output("segment_ids", ("K",), kind="int", doc="the document id of each segment, in increasing order"),
        Output("token_count", ("K",), kind="int", doc="N_s, the unmasked tokens of document s (all rows)"),
        Output("ratio", ("K",), doc="R_s = exp((1/N_s) sum_{(i,t) in s} m (l - l_old)), the document's geometric-mean ratio"),
        Output("advantage", ("K",), doc="A_s = (1/N_s) sum_{(i,t) in s} m A_{i,t}, the document's mean advantage (stopped)"),
        Output("loss", ("K",), doc="l_s = -min(R_s A_s, clip(R_s, 1-eps_low, 1+eps_high) A_s), the clipped per-document loss"),
        Output("weighted_loss", ("K",), doc="N_s l_s, Fast-LLM's length-proportional loss_per_seg (its sum / divisor is the loss)"),
    ),
    differentiable=("logprobs",),
    grad_of="weighted_loss",
    stop_gradients=("A_s, the document's mean advantage",),
    references=(
        GSPO, FASTLLM_502,
        "Fast-LLM 7d61a1b fast_llm/layers/language_model/loss/policy_gradient.py (GSPO #517, length-proportional #544)",
    ),
)
def gspo_document(logprobs, old_logprobs, mask, advantages, document_ids, *, eps_low, eps_high):
    """surrogate.gspo_document:  for each document s (global id over all rows, unmasked tokens only),
    N_s = |s|,  R_s = exp((1/N_s) sum_{(i,t) in s} (l_{i,t} - l^old_{i,t})),
    A_s = sg[(1/N_s) sum_{(i,t) in s} A_{i,t}],
    l_s = max(-A_s R_s, -A_s clip(R_s, 1 - eps_low, 1 + eps_high)),  weighted_loss_s = N_s l_s.

    d(sum_s N_s l_s)/d l_{i,t} = -A_s R_s (unclipped side) or 0: the same at every token of s (N_s cancels).
    """
    tokens: dict[int, list[tuple[int, int]]] = {}
    for i, row in enumerate(mask):
        for t in positions(row):
            tokens.setdefault(document_ids[i][t], []).append((i, t))
    ids = sorted(tokens)
    counts, ratios, advs, losses, weighted = [], [], [], [], []
    for s in ids:
        where = tokens[s]
        n = len(where)
        r = exp(total(logprobs[i][t] - old_logprobs[i][t] for i, t in where) / n)
        a = total(value_of(token_adv(advantages, i, t)) for i, t in where) / n
        loss = ppo_clip_loss(r, a, eps_low, eps_high)
        counts.append(n)
        ratios.append(r)
        advs.append(a)
        losses.append(loss)
        weighted.append(loss * n)
    return {"segment_ids": ids, "token_count": counts, "ratio": ratios, "advantage": advs, "loss": losses,
            "weighted_loss": weighted}


@formula(
    "surrogate.gmpo",
    title="GMPO: -A_i times the geometric mean of the sign-aware log-space clipped token ratios",
    inputs=(LOGPROBS, OLD_LOGPROBS, MASK, ADV_SEQ),
    params=(
        Param("eps_low", 0.4, lo=0,
              doc="log-space lower bound: for A <= 0 a token log-ratio is bounded below by -eps_low (ratio e^-eps_low)"),
        _eps_high(0.4, "log-space upper bound: for A > 0 a token log-ratio is bounded above by eps_high (ratio e^eps_high)"),
    ),
    outputs=(seq_output("loss", "per-sequence loss -A_i g_i; 0 for an empty sequence"),),
    differentiable=("logprobs",),
    grad_of="loss",
    references=(
        GMPO, "callsys/GMPO 205b2bf train_zero_math_gmpo.py (critic_type_modify == 'gmpo')",
        VERL + " compute_policy_loss_geo_mean (denominator n_i + 1e-8)",
        "trl experimental trl/experimental/gmpo/gmpo_trainer.py (epsilon 0.4, log space)",
    ),
)
def gmpo(logprobs, old_logprobs, mask, advantages, *, eps_low, eps_high):
    """surrogate.gmpo:  loss_i = -A_i exp((1/L_i) sum_t m_{i,t} d~_{i,t}),
    d~ = min(d, clip(d, -eps_low, eps_high)) if A_i > 0 else max(d, clip(d, -eps_low, eps_high)),
    d = l - l_old;  loss_i = 0 for an empty sequence.
    """
    losses = []
    for i, row in enumerate(mask):
        ts = positions(row)
        if not ts:
            losses.append(mpf(0))
            continue
        a = advantages[i]
        mean = total(gmpo_clipped_log_ratio(logprobs[i][t] - old_logprobs[i][t], a, eps_low, eps_high) for t in ts) / len(ts)
        losses.append(exp(mean) * -a)
    return {"loss": losses}


@formula(
    "surrogate.cispo",
    title="CISPO: REINFORCE with a truncated, stopped IS weight, -sg[w] A l",
    inputs=(LOGPROBS, OLD_LOGPROBS, MASK, ADV_SEQ_OR_TOKEN),
    params=(
        Param("cap_form", "relative", kind="choice", choices=("relative", "absolute"),
              doc="relative: w = clip(r, 1 - eps_low, 1 + eps_high) (MiniMax-M1, verl, NeMo-RL, slime, SkyRL); "
                  "absolute: w = min(r, eps_high) (ScaleRL, TRL, Liger)"),
        Param("eps_low", None, lo=0, hi=1, nullable=True,
              doc="relative form only: lower bound 1 - eps_low (null: no lower bound, as MiniMax-M1's 'large' eps_low)"),
        Param("eps_high", 0.2, lo=0, lo_open=True,
              doc="relative: upper bound 1 + eps_high; absolute: the cap itself (TRL recommends 5.0)"),
        _clamp_param(),
    ),
    outputs=(
        token_output("loss", "per-token loss -w A l (its value contains l; compare gradients)"),
        token_output("weight", "the stopped IS weight w"),
    ),
    differentiable=("logprobs",),
    grad_of="loss",
    stop_gradients=("w_{i,t}, the truncated IS weight (the gradient is -w A)",),
    references=(
        CISPO, SCALERL, TRL_LOSS + " loss_type='cispo' (epsilon_high = absolute cap; None => 0.2)",
        LIGER_LOSS + " loss_type='cispo'", VERL + " compute_policy_loss_cispo (clip_ratio_low/high 0.2; log-ratio clamp +-20)",
        NEMO + " use_cispo (ratio_clip_min/max)", SLIME + " compute_cispo_loss",
        SKYRL + " cispo (cispo_eps_clip_low=0, cispo_eps_clip_high=5 => [1, 6])",
    ),
)
def cispo(logprobs, old_logprobs, mask, advantages, *, cap_form, eps_low, eps_high, log_ratio_clamp):
    """surrogate.cispo:  loss_{i,t} = -sg[w_{i,t}] A_{i,t} l_{i,t},
    w = clip(r, 1 - eps_low, 1 + eps_high) (relative) or min(r, eps_high) (absolute),
    r = exp(clip(l - l_old, -c, c)).
    """
    require(cap_form == "relative" or eps_low is None,
            f"surrogate.cispo: parameter 'eps_low' applies only to cap_form='relative' (absolute: w = min(r, eps_high), "
            f"no lower bound); it must be null, got {eps_low!r}")
    weights = per_token(mask, lambda i, t: cispo_weight(
        token_ratio(sg(logprobs[i][t]), old_logprobs[i][t], log_ratio_clamp), cap_form, eps_low, eps_high))
    loss = per_token(mask, lambda i, t: cispo_loss(weights[i][t], token_adv(advantages, i, t), logprobs[i][t]))
    return {"loss": loss, "weight": weights}


@formula(
    "surrogate.sapo",
    title="SAPO: soft sigmoid gate of the token ratio, temperature by the sign of A",
    inputs=(LOGPROBS, OLD_LOGPROBS, MASK, ADV_SEQ_OR_TOKEN),
    params=(
        Param("tau_pos", 1.0, lo=0, lo_open=True, doc="gate temperature where A > 0"),
        Param("tau_neg", 1.05, lo=0, lo_open=True, doc="gate temperature where A <= 0"),
        _clamp_param(),
    ),
    outputs=(token_output("loss", "per-token loss -A (4/tau) sigma(tau (r - 1))"),),
    differentiable=("logprobs",),
    grad_of="loss",
    references=(
        SAPO, TRL_LOSS + " loss_type='sapo' (sapo_temperature_pos/neg)", LIGER_LOSS + " sapo_loss_fn",
        VERL + " compute_policy_loss_sapo (tau_pos/tau_neg; log-ratio clamp +-20)",
        AREAL + " sapo_loss_fn", SKYRL + " sapo",
    ),
)
def sapo(logprobs, old_logprobs, mask, advantages, *, tau_pos, tau_neg, log_ratio_clamp):
    """surrogate.sapo:  loss_{i,t} = -A_{i,t} f(r_{i,t}; tau_{i,t}),  f(r; tau) = sigma(tau (r - 1)) 4 / tau,
    tau = tau_pos if A > 0 else tau_neg,  r = exp(clip(l - l_old, -c, c)).
    """
    def term(i, t):
        a = token_adv(advantages, i, t)
        log_r = clamp_log_ratio(logprobs[i][t] - old_logprobs[i][t], log_ratio_clamp)
        return sapo_gate(log_r, sapo_tau(a, tau_pos, tau_neg)) * -a

    return {"loss": per_token(mask, term)}


@formula(
    "surrogate.vespo",
    title="VESPO: REINFORCE with a stopped gamma-kernel weight of the clamped sequence ratio",
    inputs=(LOGPROBS, OLD_LOGPROBS, SAMPLER_LOGPROBS_OPTIONAL, MASK, ADV_SEQ),
    params=(
        Param("k_pos", 2.0, lo=0, doc="shape k where A >= 0 (TRL vespo_k_pos)"),
        Param("lambda_pos", 3.0, lo=0, doc="rate lambda where A >= 0 (TRL vespo_lambda_pos)"),
        Param("k_neg", 3.0, lo=0, doc="shape k where A < 0 (TRL vespo_k_neg)"),
        Param("lambda_neg", 2.0, lo=0, doc="rate lambda where A < 0 (TRL vespo_lambda_neg)"),
        Param("lambda_min", 1e-4, lo=0, doc="lambda is floored at lambda_min"),
        Param("log_ratio_clamp", 20.0, lo=0, lo_open=True, nullable=True,
              doc="token log-ratio l - l_old clamped to [-c, c] before summing (TRL: 20; null: no clamp)"),
        Param("min_weight", 1e-8, lo=0, hi=1, lo_open=True, hi_open=True,
              doc="floor of the sequence weight w and of each token IS ratio: log-space lower bound log(min_weight)"),
        Param("max_log_weight", 20.0, lo=0, lo_open=True,
              doc="upper bound of log w and of each token log IS ratio"),
    ),
    outputs=(
        token_output("loss", "per-token loss -phi_i A_i l (its value contains l; compare gradients)"),
        seq_output("phi", "the stopped sequence weight phi_i"),
    ),
    differentiable=("logprobs",),
    grad_of="loss",
    stop_gradients=("phi_i, the sequence weight (TRL computes it under no_grad; the gradient is -phi_i A_i)",),
    references=(
        VESPO, TRL_LOSS + " loss_type='vespo', GRPOTrainer.get_gamma_weights",
        "liger-kernel 0.8.5 liger_kernel/chunked_loss/grpo_loss.py get_gamma_weights",
    ),
)
def vespo(logprobs, old_logprobs, sampler_logprobs, mask, advantages, *, k_pos, lambda_pos, k_neg, lambda_neg,
          lambda_min, log_ratio_clamp, min_weight, max_log_weight):
    """surrogate.vespo:  loss_{i,t} = -sg[phi_i] A_i l_{i,t},
    phi_i = exp(lambda + k log w_i - lambda w_i),  (k, lambda) by the sign of A_i (A_i >= 0: pos),
    log w_i = clip(sum_t clip(l - l_old, -c, c) + sum_t clip(l_old - l_mu, log w_min, W), log w_min, W)
    (the second sum only when sampler_logprobs is given).
    """
    phis, losses = [], []
    for i, row in enumerate(mask):
        ts = positions(row)
        log_is = () if sampler_logprobs is None else [old_logprobs[i][t] - sampler_logprobs[i][t] for t in ts]
        log_w = vespo_log_weight([value_of(logprobs[i][t]) - old_logprobs[i][t] for t in ts], log_is,
                                 log_ratio_clamp=log_ratio_clamp, min_weight=min_weight, max_log_weight=max_log_weight)
        phi = vespo_phi(log_w, advantages[i], k_pos=k_pos, lambda_pos=lambda_pos, k_neg=k_neg,
                        lambda_neg=lambda_neg, lambda_min=lambda_min)
        phis.append(phi)
        losses.append([cispo_loss(phi, advantages[i], logprobs[i][t]) if m else None for t, m in enumerate(row)])
    return {"loss": losses, "phi": phis}
